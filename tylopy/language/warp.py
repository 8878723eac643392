"""Warp-wide votes, matches and reductions for kernels: ``ty.vote_all``, ``ty.ballot``, ``ty.warp_reduce``...

Every function here except ``activemask`` is a ``.sync`` instruction with the full member mask
``0xffffffff``: the whole warp must be converged when it executes it (all 32 lanes, or every
lane of the block's last, partial warp), which is true outside run-time branches that split a
warp. On a GPU a diverged warp makes the result undefined (or hangs); the emulator raises a
``ProtocolError`` naming the line and the inactive lanes. Semantics (bit order, matches by
bits, the reduction order) are those of ``tylopy.semantics.warp``; docs/warp-atomics-debug.md
has the whole picture.
"""
from __future__ import annotations

from ..ir.types import ScalarType, b32, f32, f64, i1, i32, i64, u32, u64
from .builder import current_builder
from .proxy import RuntimeValue, as_value, binary, emit, emit1

Value = RuntimeValue
REDUCE_OPS = ("sum", "max", "min", "and", "or", "xor")
_BUTTERFLY = (16, 8, 4, 2, 1)


def _predicate(fn: str, pred) -> Value:
    p = as_value(pred, i1)
    if p.type != i1:
        current_builder().error(f"{fn} expects an i1 predicate (a comparison such as x > 0), but got a {p.type} value",
                                hint="compare explicitly, e.g. x != 0")
    return p


def vote_all(pred) -> Value:
    """True in every lane iff ``pred`` is true in every lane of the warp (``vote.sync.all.pred``)."""
    return emit1("vote", (_predicate("vote_all", pred),), mode="all")


def vote_any(pred) -> Value:
    """True in every lane iff ``pred`` is true in at least one lane (``vote.sync.any.pred``)."""
    return emit1("vote", (_predicate("vote_any", pred),), mode="any")


def vote_uni(pred) -> Value:
    """True in every lane iff ``pred`` has the same value in every lane (``vote.sync.uni.pred``)."""
    return emit1("vote", (_predicate("vote_uni", pred),), mode="uni")


def ballot(pred) -> Value:
    """A u32 whose bit ``i`` is lane ``i``'s ``pred`` (``vote.sync.ballot.b32``), the same in every lane."""
    return emit1("vote", (_predicate("ballot", pred),), mode="ballot")


def activemask() -> Value:
    """The u32 mask of the lanes executing this instruction (``activemask.b32``; bit i = lane i).

    Not a ``.sync`` instruction: it may run in a diverged warp and tells which lanes are here.
    """
    return emit1("activemask", ())


def _match_value(fn: str, value) -> Value:
    v = as_value(value)
    t = v.type
    if t in (f32, f64):  # matched by bits, as CUDA's __match_any_sync does for floats
        return emit1("bitcast", (v,), to=u32 if t == f32 else u64)
    if t not in (i32, u32, b32, i64, u64):
        current_builder().error(f"{fn} expects a 32- or 64-bit integer or float value, but got {t}",
                                hint="convert 8- and 16-bit values with ty.cast first")
    return v


def match_any(value) -> Value:
    """The u32 mask of the lanes whose ``value`` has the same bits as this lane's (``match.any.sync``).

    Floats compare as bits: ``0.0`` and ``-0.0`` differ, a NaN matches the same NaN bits.
    """
    return emit1("match", (_match_value("match_any", value),), mode="any")


def match_all(value) -> tuple[Value, Value]:
    """(mask, all_equal): ``(0xffffffff, True)`` if every lane holds the same bits, else ``(0, False)``
    (``match.all.sync``)."""
    mask, same = emit("match", (_match_value("match_all", value),), mode="all")
    return mask, same


def _arch_number(arch: str) -> int:
    digits = "".join(ch for ch in arch[3:] if ch.isdigit())
    return int(digits) if digits else 0


def _shfl_xor_any(v: Value, d: int) -> Value:
    """shfl.bfly of a 32- or 64-bit value (64-bit values move as two 32-bit halves)."""
    t = v.type
    if t.bits == 32:
        return emit1("shfl", (v, as_value(d, i32)), mode="bfly")
    bits = v if t in (i64, u64) else emit1("bitcast", (v,), to=u64)
    ubits = bits if bits.type == u64 else emit1("bitcast", (bits,), to=u64)
    lo = emit1("convert", (ubits,), to=u32)
    hi = emit1("convert", (binary("shr", ubits, 32),), to=u32)
    lo = emit1("shfl", (lo, as_value(d, i32)), mode="bfly")
    hi = emit1("shfl", (hi, as_value(d, i32)), mode="bfly")
    joined = binary("or", binary("shl", emit1("convert", (hi,), to=u64), 32), emit1("convert", (lo,), to=u64))
    return joined if t == u64 else emit1("bitcast", (joined,), to=t)


def _combine(op: str, a: Value, b: Value) -> Value:
    opcode = {"sum": "add"}.get(op, op)
    return emit1(opcode, (a, b))


def warp_reduce(op: str, value) -> Value:
    """Reduce ``value`` over the 32 lanes of the warp; every lane gets the result.

    ``op``: ``"sum"``, ``"max"``, ``"min"`` (f32, f64, i32, u32, i64, u64) or ``"and"``, ``"or"``,
    ``"xor"`` (integers). Floats: ``max``/``min`` ignore NaN like ``fmaxf``/``fminf``; ``sum``
    adds in a fixed butterfly order that determines the rounding: for d = 16, 8, 4, 2, 1 each
    lane adds the partial result of lane ``lane ^ d`` to its own (``shfl.sync.bfly``), so lane
    0's final sum is ``((v0 + v16) + (v8 + v24)) + ...`` and every lane holds the same bits
    (``tylopy.semantics.warp.butterfly`` is the reference). 32-bit integers use
    ``redux.sync`` (sm_80 and newer; the result is the same, integer reductions being exact).
    The warp must be converged and complete (32 live lanes for the shuffles).
    """
    bld = current_builder()
    if not isinstance(op, str) or op not in REDUCE_OPS:
        got = f"a run-time {op.type} value" if isinstance(op, RuntimeValue) else repr(op)
        bld.error(f"warp_reduce op (its first argument) expects one of {', '.join(map(repr, REDUCE_OPS))}, "
                  f"but got {got}", hint="ty.warp_reduce('sum', x): the operation first, then the value")
    v = as_value(value)
    t = v.type
    bitwise_word = t == b32 and op in ("and", "or", "xor")
    if not isinstance(t, ScalarType) or (t not in (f32, f64, i32, u32, i64, u64) and not bitwise_word):
        bld.error(f"warp_reduce expects an f32, f64, i32, u32, i64 or u64 value, but got {t}",
                  hint="convert 16-bit floats to f32 with ty.cast first")
    if t.is_float and op in ("and", "or", "xor"):
        bld.error(f"warp_reduce {op!r} expects an integer value, but got {t}")
    if t in (i32, u32, b32) and _arch_number(bld.arch) >= 80:
        word = emit1("bitcast", (v,), to=u32) if t == b32 else v
        r = emit1("redux", (word,), op={"sum": "add"}.get(op, op))
        return emit1("bitcast", (r,), to=b32) if t == b32 else r
    for d in _BUTTERFLY:
        v = _combine(op, v, _shfl_xor_any(v, d))
    return v


__all__ = ["vote_all", "vote_any", "vote_uni", "ballot", "activemask", "match_any", "match_all", "warp_reduce"]
