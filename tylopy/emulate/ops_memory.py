"""Pointers, loads and stores: global through fake device addresses, shared as CTA bytes.

``ptr_add`` adds ``index * sizeof(pointee)`` with the index sign-extended (LLVM's GEP); shared
pointers are 32-bit, so their arithmetic wraps at 2**32. Generic addresses of shared memory
are ``SHARED_WINDOW + offset``. A vector access must be aligned to its full width
(``ld.v4.f32`` needs 16 bytes), as the hardware requires. Masked loads read nothing in lanes
whose mask is false and give zero there.
"""
from __future__ import annotations

import numpy as np

from ..ir.types import PointerType
from .errors import MemoryAccessError, where
from .cluster import is_remote, remote_parts
from .memory import gather, scatter, shared_layout
from .compiled import handler
from .values import SHARED_WINDOW, WARP, np_dtype, signed_of


@handler("ptr_add")
def make_ptr_add(prog, op):
    pt = op.operands[0].type
    es = pt.pointee.nbytes
    shared = pt.space == "shared"
    p, i = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)
    idx_signed = signed_of(np_dtype(op.operands[1].type))

    def run(w):
        env = w.env
        off = env[i].view(idx_signed).astype(np.int64) * es
        if shared:
            env[r] = (env[p].astype(np.int64) + off).astype(np.uint32)
        else:
            env[r] = env[p] + off.astype(np.uint64)
    return False, run


@handler("ptr_cast")
def make_ptr_cast(prog, op):
    src, dst = op.operands[0].type, op.attr("to")
    p, r = prog.slot(op.operands[0]), prog.slot(op.result)
    base = np.uint64(SHARED_WINDOW)
    if src.space == dst.space or "shared" not in (src.space, dst.space):
        def run(w):
            w.env[r] = w.env[p]
    elif src.space == "shared":
        def run(w):
            w.env[r] = w.env[p].astype(np.uint64) + base
    else:
        def run(w):
            a = w.env[p]
            m = w.mask
            if m.any() and not ((a[m] >= base) & (a[m] < base + np.uint64(1 << 32))).all():
                raise MemoryAccessError(f"ptr_cast to shared at {where(op)} ({w.describe()}): the generic address "
                                        "does not point into shared memory")
            w.env[r] = (a - base).astype(np.uint32)
    return False, run


@handler("ptr_to_int")
def make_ptr_to_int(prog, op):
    p, r = prog.slot(op.operands[0]), prog.slot(op.result)
    dt = np_dtype(op.result.type)

    def run(w):
        w.env[r] = w.env[p].astype(dt)
    return False, run


@handler("shared_ptr", "dynamic_shared_ptr")
def make_shared_ptr(prog, op):
    offs, dyn, _, _ = shared_layout(prog.kir)
    off = offs[op.attr("name")] if op.opcode == "shared_ptr" else dyn
    arr = np.full(WARP, off, dtype=np.uint32)
    arr.flags.writeable = False
    prog.consts[prog.slot(op.result)] = arr
    return False, lambda w: None


def _misaligned(w, op, addrs, width, lanes, verb):
    bad = (addrs % np.asarray(width, dtype=addrs.dtype)) != 0
    if bad.any():
        k = int(np.argmax(bad))
        raise MemoryAccessError(f"misaligned {verb} at {where(op)}: lane {int(lanes[k])} of {w.describe()} "
                                f"accesses {width} bytes at address {int(addrs[k]):#x}, which is not "
                                f"{width}-byte aligned")


def _split_generic(addrs):
    base = np.uint64(SHARED_WINDOW)
    sh = (addrs >= base) & (addrs < base + np.uint64(1 << 32))
    return sh


def _remote_load(w, op, addrs, lanes, dt, vec):
    """Distributed shared memory (``mapa`` addresses): another CTA's shared memory, bounds checked."""
    ranks, offs = remote_parts(addrs)
    out = np.zeros((len(addrs), vec), dtype=dt)
    for rank in np.unique(ranks):
        sel = ranks == rank
        target = w.cta.cluster.target(w, op, int(rank), "read")
        target.smem.check(offs[sel], dt.itemsize * vec, op, w, "read", lanes[sel])
        out[sel] = gather(target.smem.buf, offs[sel], dt, vec)
    return out


def _remote_store(w, op, addrs, lanes, vals, dt):
    ranks, offs = remote_parts(addrs)
    for rank in np.unique(ranks):
        sel = ranks == rank
        target = w.cta.cluster.target(w, op, int(rank), "write")
        target.smem.check(offs[sel], dt.itemsize * vals.shape[1], op, w, "write", lanes[sel])
        scatter(target.smem.buf, offs[sel], vals[sel], dt)


def mem_load(w, op, space, addrs, lanes, dt, vec):
    """Values (len(addrs), vec) read by ``lanes`` at ``addrs`` in ``space``."""
    cta = w.cta
    who = w
    if space == "shared":
        return cta.smem.load(addrs.astype(np.int64), dt, vec, op, who, lanes)
    if space == "global":
        return cta.launch.gmem.load(addrs, dt, vec, op, who, lanes)
    rm = is_remote(addrs)
    if rm.any():
        out = np.zeros((len(addrs), vec), dtype=dt)
        out[rm] = _remote_load(w, op, addrs[rm], lanes[rm], dt, vec)
        if (~rm).any():
            out[~rm] = mem_load(w, op, space, addrs[~rm], lanes[~rm], dt, vec)
        return out
    sh = _split_generic(addrs)
    out = np.zeros((len(addrs), vec), dtype=dt)
    if sh.any():
        out[sh] = cta.smem.load((addrs[sh] - np.uint64(SHARED_WINDOW)).astype(np.int64), dt, vec, op, who, lanes[sh])
    if (~sh).any():
        out[~sh] = cta.launch.gmem.load(addrs[~sh], dt, vec, op, who, lanes[~sh])
    return out


def mem_store(w, op, space, addrs, lanes, vals, dt):
    cta = w.cta
    who = w
    if space == "generic":
        rm = is_remote(addrs)
        if rm.any():
            _remote_store(w, op, addrs[rm], lanes[rm], vals[rm], dt)
            addrs, lanes, vals = addrs[~rm], lanes[~rm], vals[~rm]
        sh = _split_generic(addrs)
        if sh.any():
            mem_store(w, op, "shared", addrs[sh] - np.uint64(SHARED_WINDOW), lanes[sh], vals[sh], dt)
        if (~sh).any():
            mem_store(w, op, "global", addrs[~sh], lanes[~sh], vals[~sh], dt)
        return
    if space == "shared":
        cta.smem.store(addrs.astype(np.int64), vals, dt, op, who, lanes)
    else:
        cta.launch.gmem.store(addrs, vals, dt, op, who, lanes)


@handler("load")
def make_load(prog, op):
    pt: PointerType = op.operands[0].type
    dt = np_dtype(pt.pointee)
    vec = op.attr("vec", 1)
    width = dt.itemsize * vec
    p = prog.slot(op.operands[0])
    m = prog.slot(op.operands[1]) if len(op.operands) == 2 else None
    res = [prog.slot(r) for r in op.results]
    space = pt.space

    def run(w):
        env = w.env
        active = w.mask if m is None else (w.mask & env[m])
        out = np.zeros((WARP, vec), dtype=dt)
        if active.any():
            lanes = np.flatnonzero(active)
            addrs = env[p][lanes]
            _misaligned(w, op, addrs, width, lanes, "load")
            out[lanes] = mem_load(w, op, space, addrs, lanes, dt, vec)
        for k, s in enumerate(res):
            env[s] = out[:, k].copy() if vec > 1 else out[:, 0]
    return False, run


@handler("store")
def make_store(prog, op):
    pt: PointerType = op.operands[0].type
    dt = np_dtype(pt.pointee)
    vec = len(op.operands) - 1
    width = dt.itemsize * vec
    p = prog.slot(op.operands[0])
    vs = [prog.slot(v) for v in op.operands[1:]]
    space = pt.space

    def run(w):
        if not w.nactive:
            return
        env = w.env
        lanes = np.flatnonzero(w.mask)
        addrs = env[p][lanes]
        _misaligned(w, op, addrs, width, lanes, "store")
        vals = np.stack([np.asarray(env[s])[lanes] for s in vs], axis=1).astype(dt, copy=False)
        mem_store(w, op, space, addrs, lanes, vals, dt)
    return False, run


@handler("debug_record")
def make_debug_record(prog, op):
    """The debug-wait record (hopper.mbarrier_wait under TYLOPY_DEBUG_WAITS): a scratch buffer of the
    launch. The emulator's waits never time out, so it is never written."""
    r = prog.slot(op.result)

    def run(w):
        w.env[r] = w.cta.launch.debug_record()
    return False, run


@handler("membar", "prefetch_tensormap")
def make_noop(prog, op):
    return False, lambda w: None
