"""Block- and warp-wide collectives built from warp shuffles and shared memory.

``block_reduce`` and ``block_scan`` combine one value per thread over the whole block;
``warp_sort`` and ``warp_topk`` sort one value per lane over a warp. They are traced from the
kernel language (shuffles, ``ty.shared``, ``ty.syncthreads``), so the emulator runs exactly what
the GPU runs and checks their barriers and shared-memory races.

Block collectives are called by every thread of the block, outside run-time branches that some
threads skip (they contain ``syncthreads``). The block is 1-D with a multiple of 32 threads.
Each call owns a few shared words (one per warp, twice) and two barriers; partials and results
live in separate words, so a call may be repeated back to back (e.g. in a loop) without a third
barrier: a thread still reading the previous call's result never races the next call's partials.
"""
from __future__ import annotations

from ..language import lang
from ..language.builder import current_builder
from ..language.proxy import RuntimeValue, as_value
from ..language.warp import warp_reduce
from ..ir.types import ScalarType, f32, f64, i32, i64, u32, u64

OPS = ("sum", "max", "min")
_TYPES = (f32, f64, i32, u32, i64, u64)


def _threads(fn: str, threads) -> int:
    bld = current_builder()
    n = bld.threads if threads is None else threads
    if isinstance(n, RuntimeValue) or isinstance(n, bool) or not isinstance(n, int):
        bld.error(f"{fn} threads expects a compile-time int (the block size), but got {n!r}")
    if n % 32 or not 32 <= n <= 1024:
        bld.error(f"{fn} expects a block of whole warps (a multiple of 32 threads, 32..1024), but got {n} threads",
                  hint="launch the kernel with threads a multiple of 32")
    if bld.threads is not None and n != bld.threads:
        bld.error(f"{fn} threads expects the kernel's block size {bld.threads} (every thread takes part), "
                  f"but got {n}")
    return n


def _operand(fn: str, op: str, value) -> RuntimeValue:
    bld = current_builder()
    if not isinstance(op, str) or op not in OPS:
        bld.error(f"{fn} op expects one of {', '.join(map(repr, OPS))}, but got {op!r}")
    v = as_value(value)
    if not isinstance(v.type, ScalarType) or v.type not in _TYPES:
        bld.error(f"{fn} expects an f32, f64, i32, u32, i64 or u64 value, but got {v.type}",
                  hint="convert 16-bit floats to f32 with ty.cast first")
    return v


def identity(op: str, t: ScalarType):
    """The value that leaves ``op`` unchanged: 0, the lowest or the highest value of ``t``."""
    if op == "sum":
        return lang.cast(0, t)
    if t.is_float:
        return as_value(float("-inf") if op == "max" else float("inf"), t)
    lo, hi = (0, 2**t.bits - 1) if not t.is_signed else (-2**(t.bits - 1), 2**(t.bits - 1) - 1)
    return as_value(lo if op == "max" else hi, t)


def combine(op: str, a, b):
    if op == "sum":
        return a + b
    return lang.maximum(a, b) if op == "max" else lang.minimum(a, b)


def block_reduce(value, op: str = "sum", *, threads: int | None = None):
    """``op`` ("sum", "max", "min") of ``value`` over every thread of the block; every thread gets it.

    Two levels: ``ty.warp_reduce`` within each warp, the warps' results through shared memory,
    ``warp_reduce`` again by warp 0, the block's result back through shared memory. A float sum
    therefore adds in a fixed order (the butterfly of ``warp_reduce`` within a warp, then over
    the warps' partials the same way), deterministic from run to run; ``max``/``min`` ignore NaN
    like ``fmaxf``. ``threads`` defaults to the kernel's block size (a multiple of 32).
    """
    n = _threads("block_reduce", threads)
    v = _operand("block_reduce", op, value)
    t = v.type
    nwarps = n // 32
    part = warp_reduce(op, v)
    if nwarps == 1:
        return part
    scratch = lang.shared(t, nwarps + 1)  # [0, nwarps): the warps' partials; [nwarps]: the block's result
    lane = lang.lane_id()
    warp = lang.warp_idx()
    _if(lane == 0, lambda: lang.store(scratch + warp, part))
    lang.syncthreads()

    def second_level():
        mine = lang.select(lane < nwarps, lang.load(scratch + lane, mask=lane < nwarps), identity(op, t))
        total = warp_reduce(op, mine)
        _if(lane == 0, lambda: lang.store(scratch + nwarps, total))

    _if(warp == 0, second_level)
    lang.syncthreads()
    return lang.load(scratch + nwarps)


def warp_scan(value, op: str = "sum", *, exclusive: bool = False):
    """Inclusive (or exclusive) scan over the 32 lanes of a converged warp: lane i gets
    ``v0 op ... op v_i`` (``v_{i-1}``; lane 0 of an exclusive scan gets the identity: 0, or the
    lowest / highest value for max / min). Kogge-Stone with ``shfl_up`` by 1, 2, 4, 8, 16."""
    v = _operand("warp_scan", op, value)
    return _warp_scan(op, v, exclusive)


def _warp_scan(op: str, v, exclusive: bool):
    lane = lang.lane_id()
    for k in range(5):
        d = 1 << k
        v = lang.select(lane >= d, combine(op, _shuffle("up", v, d), v), v)
    if exclusive:
        v = lang.select(lane == 0, identity(op, v.type), _shuffle("up", v, 1))
    return v


def block_scan(value, op: str = "sum", *, exclusive: bool = False, total: bool = False,
               threads: int | None = None):
    """Prefix ``op`` ("sum", "max", "min") over the block in thread order.

    Thread i gets ``v0 op ... op v_i`` (inclusive), or ``v0 op ... op v_{i-1}`` with
    ``exclusive=True`` (thread 0: the identity, 0 for a sum). With ``total=True`` the result is
    ``(prefix, block_total)``, the total the same in every thread. Each warp scans its values
    (``shfl_up``), warp 0 scans the warps' totals in shared memory, and each thread combines the
    total of the warps before it with its in-warp prefix: a float sum's rounding follows that
    order (exact for integers, which wrap).
    """
    n = _threads("block_scan", threads)
    v = _operand("block_scan", op, value)
    if not isinstance(exclusive, bool) or not isinstance(total, bool):
        current_builder().error(f"block_scan exclusive and total expect compile-time bools, but got "
                                f"exclusive={exclusive!r}, total={total!r}")
    t = v.type
    nwarps = n // 32
    lane = lang.lane_id()
    inclusive = _warp_scan(op, v, False)
    in_warp = lang.select(lane == 0, identity(op, t), _shuffle("up", inclusive, 1)) if exclusive else inclusive
    if nwarps == 1:
        return (in_warp, _shuffle("idx", inclusive, 31)) if total else in_warp
    # [0, nwarps): each warp's total; [nwarps, 2 nwarps): their inclusive scan (separate words: see the module doc)
    scratch = lang.shared(t, 2 * nwarps)
    warp = lang.warp_idx()
    _if(lane == 31, lambda: lang.store(scratch + warp, inclusive))
    lang.syncthreads()

    def scan_totals():
        mine = lang.select(lane < nwarps, lang.load(scratch + lane, mask=lane < nwarps), identity(op, t))
        s = _warp_scan(op, mine, False)
        _if(lane < nwarps, lambda: lang.store(scratch + (nwarps + lane), s))

    _if(warp == 0, scan_totals)
    lang.syncthreads()
    before = lang.select(warp > 0, lang.load(scratch + (nwarps - 1 + warp), mask=warp > 0), identity(op, t))
    prefix = lang.select(warp > 0, combine(op, before, in_warp), in_warp)
    return (prefix, lang.load(scratch + (2 * nwarps - 1))) if total else prefix


def _sort_key(v):
    """An integer with the order of ``v``: floats by a total order (-NaN < -inf < ... < -0 < +0 <
    ... < +inf < +NaN; flipping the magnitude bits of negatives makes the bits sort as signed ints)."""
    t = v.type
    if not t.is_float:
        return v
    it = i32 if t == f32 else i64
    b = lang.bitcast(v, it)
    mask = 0x7FFFFFFF if t == f32 else 0x7FFFFFFFFFFFFFFF
    return b ^ ((b >> (t.bits - 1)) & mask)


def warp_sort(value, payload=None, *, descending: bool = False):
    """Sort one value per lane over a converged warp: lane i gets the i-th smallest (largest with
    ``descending=True``). ``payload`` (a value or tuple of values) moves with its key, e.g. an
    index for an argsort; then the result is ``(sorted, payloads)``. Floats sort by a total order:
    NaN after +inf (a NaN with its sign bit set before -inf), -0.0 before +0.0. A bitonic network
    of 15 compare-exchange steps over ``shfl_xor``; equal keys may change their order."""
    bld = current_builder()
    v = as_value(value)
    if not isinstance(v.type, ScalarType) or v.type not in _TYPES:
        bld.error(f"warp_sort expects an f32, f64, i32, u32, i64 or u64 value, but got {v.type}")
    if not isinstance(descending, bool):
        bld.error(f"warp_sort descending expects a compile-time bool, but got {descending!r}")
    single = payload is not None and not isinstance(payload, (tuple, list))
    pay = () if payload is None else tuple(as_value(p) for p in ((payload,) if single else payload))
    lane = lang.lane_id()
    key = _sort_key(v)
    for size in (2, 4, 8, 16, 32):
        j = size // 2
        while j >= 1:
            other_key = _shuffle("bfly", key, j)
            other_v = _shuffle("bfly", v, j)
            other_pay = tuple(_shuffle("bfly", p, j) for p in pay)
            # This lane keeps the smaller of the pair when it is the lower lane of an ascending run
            # (or the upper lane of a descending one); the last merge (size 32) is all ascending.
            ascending = (lane & size) == 0 if size < 32 else True
            lower = (lane & j) == 0
            keep_small = lower == ascending if size < 32 else lower
            if descending:
                keep_small = ~keep_small if not isinstance(keep_small, bool) else not keep_small
            take = lang.select(keep_small, other_key < key, other_key > key)
            key = lang.select(take, other_key, key)
            v = lang.select(take, other_v, v)
            pay = tuple(lang.select(take, o, p) for o, p in zip(other_pay, pay))
            j //= 2
    if payload is None:
        return v
    return v, (pay[0] if single else pay)


def warp_topk(value, k: int, payload=None):
    """The ``k`` largest values of a warp, largest first, in lanes 0..k-1 (``warp_sort`` descending);
    returns ``(values, in_topk)`` where ``in_topk`` is ``lane < k``, or ``(values, payloads,
    in_topk)`` with a payload (e.g. each value's index)."""
    bld = current_builder()
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 32:
        bld.error(f"warp_topk k expects a compile-time int in 1..32, but got {k!r}")
    out = warp_sort(value, payload, descending=True)
    inside = lang.lane_id() < k
    return (out, inside) if payload is None else (*out, inside)


def _shuffle(mode: str, v, d):
    """``shfl.sync`` of a 32- or 64-bit value (a 64-bit one moves as two 32-bit halves)."""
    t = v.type
    if t.bits == 32:
        return lang._shfl(mode, v, d)
    bits = lang.bitcast(v, u64) if t != u64 else v
    lo = lang._shfl(mode, lang.cast(bits, u32), d)
    hi = lang._shfl(mode, lang.cast(bits >> 32, u32), d)
    joined = (lang.cast(hi, u64) << 32) | lang.cast(lo, u64)
    return joined if t == u64 else lang.bitcast(joined, t)


def _if(cond, then) -> None:
    """A run-time if with no carried values (library code is not rewritten like kernel source)."""
    from ..language.tracing import if_
    if_(cond, lambda: (then(), ())[1], lambda: (), (), ())
