"""Type rules of atomics (``atom``: returns the old value) and reductions (``red``: no result).

Operands: ``atomic`` (ptr, value) or, for ``cas``, (ptr, compare, value); ``reduce`` (ptr, value,
...) with ``vec`` values (2 or 4 f32 on global memory, Hopper's ``red.global.v4.f32.add``).
Attributes: ``op``; ``sem`` (relaxed, acquire, release, acq_rel; reductions take relaxed or
release); ``scope`` (cta, cluster, gpu, sys); ``packed`` ("f16x2"/"bf16x2": the b32 value holds
two 16-bit floats, added lane-wise).
"""
from __future__ import annotations

from ..types import PointerType, b32, bf16, f16, f32, f64, i32, i64, u32, u64
from .base import expect

SEMANTICS = ("relaxed", "acquire", "release", "acq_rel")
SCOPES = ("cta", "cluster", "gpu", "sys")
_INT32_64 = (i32, u32, i64, u64)
ALLOWED = {  # op -> value types
    "add": (f32, f64, f16, bf16, i32, u32, u64, b32),
    "min": _INT32_64, "max": _INT32_64,
    "and": (i32, u32, b32, i64, u64), "or": (i32, u32, b32, i64, u64), "xor": (i32, u32, b32, i64, u64),
    "exch": (i32, u32, b32, f32, i64, u64, f64), "cas": (i32, u32, b32, i64, u64),
    "inc": (u32,), "dec": (u32,),
}


def _common(what: str, ts, attrs, nvalues: int):
    expect(len(ts) >= 2 and isinstance(ts[0], PointerType), f"{what} expects (pointer, value), but got "
                                                            f"{', '.join(map(str, ts))}")
    p = ts[0]
    expect(p.space in ("global", "shared", "generic"), f"{what} expects global, shared or generic memory, "
                                                       f"but got {p.space}")
    op = attrs.get("op")
    expect(op in ALLOWED, f"{what} op expects one of {', '.join(ALLOWED)}, but got {op!r}")
    expect(len(ts) == 1 + nvalues, f"{what} {op} expects {nvalues} value operand(s), but got {len(ts) - 1}")
    for t in ts[1:]:
        expect(t == p.pointee, f"{what} {op} on {p} expects {p.pointee} values, but got {t}")
    t = p.pointee
    packed = attrs.get("packed")
    if packed is not None:
        expect(op == "add" and t == b32 and packed in ("f16x2", "bf16x2"),
               f"{what} packed expects 'f16x2' or 'bf16x2' with op add on b32 words, but got {packed!r} "
               f"with {op} on {t}")
    else:
        expect(t in ALLOWED[op] and not (op == "add" and t == b32),
               f"{what} {op} expects values of {', '.join(map(str, ALLOWED[op]))}, but got {t}")
    scope = attrs.get("scope", "gpu")
    expect(scope in SCOPES, f"{what} scope expects one of {', '.join(SCOPES)}, but got {scope!r}")
    return t


def _atomic(ts, attrs):
    op = attrs.get("op")
    expect(attrs.get("vec", 1) == 1, f"atomic expects one value per lane (vec=1), but got vec={attrs.get('vec')!r} "
                                     "(vector adds without a result are reduce ops)")
    t = _common("atomic", ts, attrs, 2 if op == "cas" else 1)
    sem = attrs.get("sem", "relaxed")
    expect(sem in SEMANTICS, f"atomic sem expects one of {', '.join(SEMANTICS)}, but got {sem!r}")
    return (t,)


def _reduce(ts, attrs):
    vec = attrs.get("vec", 1)
    expect(vec in (1, 2, 4), f"reduce vec expects 1, 2 or 4, but got {vec!r}")
    expect(attrs.get("op") not in ("cas", "exch"), f"reduce op expects an arithmetic or bitwise op, but got "
                                                   f"{attrs.get('op')!r} (use atomic for exch and cas)")
    t = _common("reduce", ts, attrs, vec)
    if vec > 1:
        expect(t == f32 and attrs.get("op") == "add" and ts[0].space == "global",
               f"reduce vec={vec} expects f32 add on global memory (red.global.v{vec}.f32.add), but got "
               f"{attrs.get('op')} on {ts[0]}")
    sem = attrs.get("sem", "relaxed")
    expect(sem in ("relaxed", "release"), f"reduce sem expects 'relaxed' or 'release', but got {sem!r}")
    return ()


RULES = {"atomic": _atomic, "reduce": _reduce}
SIDE_EFFECTS = frozenset({"atomic", "reduce"})
