"""cp.async with its commit groups, and TMA stores with their bulk groups (PTX ISA "cp.async",
"cp.async.wait_group", "cp.async.bulk.tensor", "cp.async.bulk.wait_group").

``cp_async(dst, src[, src_bytes])`` copies ``nbytes`` (4, 8, 16) per thread from global to
shared memory; both addresses must be ``nbytes``-aligned; only the first ``src_bytes`` (0 to
nbytes) are read and the rest of the destination is zero-filled. The global bytes are read at
the issue (an out-of-bounds source is reported there); the shared bytes land later and become
the thread's at the ``cp_async_wait(n)`` that covers their group: groups are per thread,
``cp_async_commit`` closes the open one, and ``wait(n)`` completes every group but the ``n``
most recent ones.

``tma_store(map, src, coords...)`` writes (or reduces, ``reduce`` = add/min/max) the tensor
map's box from shared memory at ``src`` (128-byte aligned, in the box layout with the map's
swizzle, like a TMA load's destination) into global memory, skipping elements outside the
tensor. The box's innermost start coordinate must be a multiple of 16 bytes, and min/max reduce
only into f16, bf16 and integer tensors (else the GPU raises an illegal instruction; the emulator
reports both). Its source must be fenced for the async proxy (``fence_proxy_async``) by the threads
that wrote it. ``bulk_commit``/``bulk_wait(n, read)`` group and wait for the stores per thread.
How the copies move in time and what is checked: ``asynccopy.py``.
"""
from __future__ import annotations

import numpy as np

from .asynccopy import CpAsync, TmaStore
from .compiled import handler
from .errors import MemoryAccessError, ProtocolError, where
from .values import SHARED_WINDOW

_U8 = np.dtype(np.uint8)


def _active(w):
    return np.flatnonzero(w.mask)


def _aligned(w, op, addrs, width, lanes, what):
    bad = (addrs.astype(np.uint64) % np.uint64(width)) != 0
    if bad.any():
        k = int(np.argmax(bad))
        raise MemoryAccessError(f"misaligned cp.async at {where(op)}: lane {int(lanes[k])} of {w.describe()} gives "
                                f"the {what} address {int(addrs[k]):#x}, which is not {width}-byte aligned")


@handler("cp_async")
def make_cp_async(prog, op):
    nbytes = op.attr("nbytes")
    d, s = prog.slot(op.operands[0]), prog.slot(op.operands[1])
    sb = prog.slot(op.operands[2]) if len(op.operands) == 3 else None
    generic = op.operands[1].type.space == "generic"
    span = np.arange(nbytes, dtype=np.int64)

    def run(w):
        lanes = _active(w)
        if not len(lanes):
            return
        cta, env = w.cta, w.env
        smem = cta.smem
        dst = env[d][lanes].astype(np.int64)
        src = env[s][lanes]
        take = np.full(len(lanes), nbytes, dtype=np.int64) if sb is None else env[sb][lanes].astype(np.int64)
        if ((take < 0) | (take > nbytes)).any():
            k = int(np.argmax((take < 0) | (take > nbytes)))
            raise ProtocolError(f"cp_async at {where(op)}: lane {int(lanes[k])} of {w.describe()} gives src_bytes "
                                f"{int(take[k])}, but src_bytes expects 0..{nbytes} (more is undefined behaviour)")
        _aligned(w, op, dst, nbytes, lanes, "shared destination")
        smem.check(dst, nbytes, op, w, "write", lanes)
        data = np.zeros((len(lanes), nbytes), dtype=np.uint8)
        reading = take > 0
        if reading.any():
            _aligned(w, op, src[reading], nbytes, lanes[reading], "global source")
            if generic and ((src[reading] >= np.uint64(SHARED_WINDOW)) &
                            (src[reading] < np.uint64(SHARED_WINDOW + (1 << 32)))).any():
                raise MemoryAccessError(f"cp_async at {where(op)} ({w.describe()}): the source is a shared-memory "
                                        "address, but cp.async copies from global memory")
            for t in np.unique(take[reading]):
                sel = take == t
                data[sel, :t] = cta.launch.gmem.load(src[sel], _U8, int(t), op, w, lanes[sel])
        bi = dst[:, None] + span
        if smem.check_races:
            smem.check_write(bi.ravel(), w.wid, cta.clock[w.wid], op, w)
        rec = CpAsync(cta, w, op, lanes, bi, data, w.cp_open[lanes].copy())
        smem.mark(bi.ravel(), rec)
        cta.copies.issue(rec)
    return False, run


@handler("cp_async_commit")
def make_cp_async_commit(prog, op):
    def run(w):
        w.cp_open[w.mask] += 1
    return False, run


@handler("cp_async_wait")
def make_cp_async_wait(prog, op):
    n = op.attr("n")

    def run(w):
        lanes = _active(w)
        if len(lanes):
            w.cta.copies.cp_wait(w, n, lanes)
    return False, run


@handler("tma_store")
def make_tma_store(prog, op):
    rank, reduce = op.attr("rank"), op.attr("reduce")
    tm, sp = prog.slot(op.operands[0]), prog.slot(op.operands[1])
    cs = [prog.slot(v) for v in op.operands[2:]]

    def run(w):
        cta, env = w.cta, w.env
        smem = cta.smem
        for lane in _active(w):
            taddr, src = int(env[tm][lane]), int(env[sp][lane])
            coords = [int(env[c][lane]) for c in cs]
            info = cta.launch.tensormap(taddr, op)
            if info.rank != rank:
                raise ProtocolError(f"tma_store at {where(op)} gives {rank} coordinates, but tensor map "
                                    f"{info.name!r} has rank {info.rank}")
            if src % 128:
                raise MemoryAccessError(f"tma_store at {where(op)} ({w.describe()}): the source {smem.name(src)} is not "
                                        "128-byte aligned, as TMA requires")
            if reduce in ("min", "max") and info.spec.dtype in ("f32", "f64"):
                # f32 measured on the H200 (an illegal instruction); f64 has no min/max either in the ISA.
                raise ProtocolError(
                    f"tma_store at {where(op)} ({w.describe()}): reduce={reduce!r} on tensor map {info.name!r} of "
                    f"{info.spec.dtype}; the GPU reduces min/max only into f16, bf16 and integer tensors (it "
                    "raises an illegal instruction); reduce='add' takes f32")
            if (coords[0] * info.es) % 16:
                # Measured on the H200: such a store raises CUDA_ERROR_ILLEGAL_INSTRUCTION (docs/hopper.md).
                raise MemoryAccessError(
                    f"tma_store at {where(op)} ({w.describe()}): the box starts at innermost coordinate {coords[0]} "
                    f"({coords[0] * info.es} bytes into a row of tensor map {info.name!r}); a TMA store needs a "
                    "multiple of 16 bytes there (the GPU raises an illegal instruction)")
            smem.check(np.array([src]), info.box_bytes, op, w, "read", np.array([lane]))
            bi = info.smem_bytes(src)
            smem.check_async_read(bi, op, w, "TMA store")
            if smem.check_races:
                smem.check_raw(bi, w.wid, cta.clock[w.wid], op, w, "(its TMA store) reads")
            rec = TmaStore(cta, w, op, info, coords, bi, (int(lane), int(w.bulk_open[lane])), reduce)
            smem.mark(bi, rec, reading=True)
            cta.copies.issue(rec)
    return False, run


@handler("bulk_commit")
def make_bulk_commit(prog, op):
    def run(w):
        w.bulk_open[w.mask] += 1
    return False, run


@handler("bulk_wait")
def make_bulk_wait(prog, op):
    n = op.attr("n")

    def run(w):
        lanes = _active(w)
        if len(lanes):
            w.cta.copies.bulk_wait(w, n, lanes)
    return False, run
