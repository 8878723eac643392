"""Atomics (``atom``) and reductions (``red``) on global, shared and generic memory.

Each lane's update is applied in increasing lane order (warps in the order the scheduler runs
them, CTAs one after another): a lane sees the value the previous lane's update to the same
address left, and ``atom`` returns it (``tylopy.semantics.atomics.apply_in_order``). A vector
``red.global.v4.f32.add`` is four f32 adds per lane, lane after lane. f32 adds on global memory
flush subnormals (the ISA's documented behaviour), on shared memory they do not.

Shared-memory race checks: an atomic and an ordinary store or load of the same bytes by
another warp, with no barrier (or mbarrier phase) ordering them, is a race and raises a
``ProtocolError`` (atomics from different warps are not racing with each other). A later
ordinary access is checked by the ordinary race check, which sees the atomic as the last
writer. Global memory has no race check in the emulator (CTAs run one after another).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..semantics.atomics import apply_in_order, combine_fn
from .compiled import handler
from .errors import MemoryAccessError, ProtocolError, where
from .memory import gather, scatter
from .values import SHARED_WINDOW, WARP, np_dtype

ATOMIC_OPCODES = ("atomic", "reduce")


def kind_of(t, op: str, packed, space: str) -> str:
    """The arithmetic of an update (``tylopy.semantics.atomics`` kinds) in memory ``space``."""
    if packed:
        return packed
    if t.name == "f32":
        return "f32_ftz" if (op == "add" and space == "global") else "f32"
    return t.name


def _check_alignment(w, op, addrs, width: int, lanes):
    bad = (addrs % np.asarray(width, dtype=addrs.dtype)) != 0
    if bad.any():
        k = int(np.argmax(bad))
        raise MemoryAccessError(f"misaligned atomic at {where(op)}: lane {int(lanes[k])} of {w.describe()} updates "
                                f"{width} bytes at address {int(addrs[k]):#x}, which is not {width}-byte aligned")


def _clock(w) -> np.ndarray:
    """Warp ``w``'s vector clock (its components for every warp, and for asynchronous agents where kept)."""
    cta = w.cta
    return cta.clock[w.wid] if hasattr(cta, "clock") else cta.vc[w.wid]


def _shared_races(smem, bi: np.ndarray, w, op):
    """An atomic by warp ``w`` on bytes ``bi``: ordinary accesses by other warps must be ordered before it."""
    clock = _clock(w)
    prev = smem.writer_warp[bi]
    other = (prev >= 0) & (prev != w.wid)
    if other.any():
        racy = np.zeros(len(bi), dtype=bool)
        racy[other] = smem.writer_epoch[bi][other] > clock[prev[other].astype(np.int64)]
        for j in np.flatnonzero(racy):
            wop = smem.ops[int(smem.writer_op[bi[j]])]
            if wop.opcode in ATOMIC_OPCODES:
                continue  # atomics do not race with atomics
            b = int(bi[j])
            raise ProtocolError(
                f"shared-memory race at {where(op)}: {w.describe()} atomically updates {smem.name(b)}, which warp "
                f"{int(prev[j])} wrote with an ordinary store at {where(wop)} with no barrier or mbarrier ordering "
                f"that store before this atomic (use an atomic for both, or a barrier between them)")
    if smem.read_epoch is not None:
        bad = smem.read_epoch[:, bi] > clock[:smem.read_epoch.shape[0], None]
        bad[w.wid] = False
        if bad.any():
            r, j = (int(x) for x in np.argwhere(bad)[0])
            b = int(bi[j])
            rop = smem.ops[int(smem.read_op[r, b])]
            raise ProtocolError(
                f"shared-memory race at {where(op)}: {w.describe()} atomically updates {smem.name(b)}, which warp {r} "
                f"read with an ordinary load at {where(rop)} with no barrier or mbarrier ordering that read before "
                f"this atomic")


def _shared_update(w, op, offs, lanes, dt, fn, values, compare):
    smem = w.cta.smem
    nb = dt.itemsize
    smem.check(offs, nb, op, w, "atomically update", lanes)
    uniq, first = np.unique(offs, return_index=True)
    if smem.check_races:
        bi = (uniq.astype(np.int64)[:, None] + np.arange(nb, dtype=np.int64)).ravel()
        _shared_races(smem, bi, w, op)
    memory = gather(smem.buf, uniq, dt, 1)[:, 0]
    olds, new = apply_in_order(fn, offs, memory, values, compare)
    scatter(smem.buf, uniq, new[:, None], dt)
    if smem.check_races:  # the atomic is now the bytes' last writer
        smem.writer_warp[bi] = w.wid
        smem.writer_epoch[bi] = _clock(w)[w.wid]
        smem.writer_op[bi] = smem._op_index(op)
        smem.proxy_tid[bi] = -1
    return olds


def _global_update(w, op, addrs, lanes, dt, fn, values, compare):
    gmem = w.cta.launch.gmem
    uniq, first = np.unique(addrs, return_index=True)
    memory = gmem.load(uniq, dt, 1, op, w, lanes[first])[:, 0]
    olds, new = apply_in_order(fn, addrs, memory, values, compare)
    gmem.store(uniq, new[:, None], dt, op, w, lanes[first])
    return olds


@dataclass(frozen=True)
class _Atomic:
    """What an atomic op does, fixed when the op is built: the element type, the operation's name
    ("add", "cas", ...) and whether two f16/bf16 halves are packed in one word."""

    t: object
    name: str
    packed: bool

    def combine(self, space: str):
        return combine_fn(self.name, kind_of(self.t, self.name, self.packed, space))


def _update(w, op, space, atomic: _Atomic, addrs, lanes, values, compare):
    """Apply the updates (in element order) in ``space``; returns each element's old value."""
    dt = np_dtype(atomic.t)
    if space == "shared":
        return _shared_update(w, op, addrs.astype(np.int64), lanes, dt, atomic.combine("shared"), values, compare)
    if space == "global":
        return _global_update(w, op, addrs, lanes, dt, atomic.combine("global"), values, compare)
    base = np.uint64(SHARED_WINDOW)
    sh = (addrs >= base) & (addrs < base + np.uint64(1 << 32))
    olds = np.empty(len(addrs), dtype=dt)
    for part, where_ in (("shared", sh), ("global", ~sh)):
        if where_.any():
            a = addrs[where_] - base if part == "shared" else addrs[where_]
            cmp = None if compare is None else compare[where_]
            olds[where_] = _update(w, op, part, atomic, a, lanes[where_], values[where_], cmp)
    return olds


@handler("atomic", "reduce")
def make_atomic(prog, op):
    pt = op.operands[0].type
    t, space, name, packed = pt.pointee, pt.space, op.attr("op"), op.attr("packed")
    atomic = _Atomic(t, name, packed)
    dt = np_dtype(t)
    vec = op.attr("vec", 1)
    p = prog.slot(op.operands[0])
    is_cas = name == "cas"
    cmp_slot = prog.slot(op.operands[1]) if is_cas else None
    val_slots = [prog.slot(v) for v in op.operands[2 if is_cas else 1:]]
    res = prog.slot(op.result) if op.opcode == "atomic" else None
    width = dt.itemsize * vec
    lane_offsets = (np.arange(vec, dtype=np.uint64) * np.uint64(dt.itemsize))

    def run(w):
        env = w.env
        if not w.nactive:
            if res is not None:
                env[res] = np.zeros(WARP, dtype=dt)
            return
        lanes = np.flatnonzero(w.mask)
        base = env[p][lanes]
        _check_alignment(w, op, base, width, lanes)
        if vec > 1:  # lane-major: lane 0's elements, then lane 1's...
            addrs = (base.astype(np.uint64)[:, None] + lane_offsets).ravel()
            values = np.stack([np.asarray(env[s])[lanes] for s in val_slots], axis=1).astype(dt).ravel()
            elem_lanes = np.repeat(lanes, vec)
        else:
            addrs, values, elem_lanes = base, np.asarray(env[val_slots[0]])[lanes].astype(dt), lanes
        compare = np.asarray(env[cmp_slot])[lanes].astype(dt) if is_cas else None
        olds = _update(w, op, space, atomic, addrs, elem_lanes, values, compare)
        if res is not None:
            out = np.zeros(WARP, dtype=dt)
            out[lanes] = olds
            env[res] = out
    return False, run
