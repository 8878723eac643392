"""Type rules of scalar arithmetic, comparisons, selects and conversions."""
from __future__ import annotations

from ..types import FLOAT_MAX, FP8_TYPES, ScalarType, b32, bf16, f16, f32, i1, u16
from .base import expect, same, scalar

ROUNDINGS = ("rn", "rz", "rm", "rp")


def _rounding(op: str, t, attrs):
    r = attrs.get("rounding")
    if r is not None:
        expect(r in ROUNDINGS, f"{op} rounding expects one of {', '.join(ROUNDINGS)}, but got {r!r}")
        expect(t == f32 or t.name == "f64", f"{op} with an explicit rounding expects f32 or f64 operands, but got {t}")


def _binary(op):
    def rule(ts, attrs):
        expect(len(ts) == 2, f"{op} expects 2 operands, but got {len(ts)}")
        t = scalar(op, same(op, ts))
        if op in ("and", "or", "xor"):
            expect(t.is_int or t.is_bool, f"{op} expects integer or bool operands, but got {t}")
        elif op in ("shl", "shr", "rem"):
            expect(t.is_int, f"{op} expects integer operands, but got {t}")
        else:
            expect(not t.is_bool and t.kind != "bits", f"{op} expects numeric operands, but got {t}")
            expect(not t.storage_only, f"{op} on {t} values is not supported: convert to f32 with ty.cast, "
                                       "compute, and convert back")
            if op in ("add", "sub", "mul", "div"):
                _rounding(op, t, attrs)
        expect(op in ("add", "sub", "mul", "div") or attrs.get("rounding") is None,
               f"{op} takes no rounding mode (only add, sub, mul, div, fma, sqrt and convert do)")
        return (t,)
    return rule


def _unary(op, float_only=False):
    def rule(ts, attrs):
        expect(len(ts) == 1, f"{op} expects 1 operand, but got {len(ts)}")
        t = scalar(op, ts[0])
        if float_only:
            expect(t == f32, f"{op} expects an f32 operand, but got {t}")
            if op == "sqrt":
                _rounding(op, t, attrs)
        elif op == "not":
            expect(t.is_int or t.is_bool, f"not expects an integer or bool operand, but got {t}")
        else:
            expect(t.is_float or t.kind == "int", f"{op} expects a signed or float operand, but got {t}")
            expect(not t.storage_only, f"{op} on {t} values is not supported: convert to f32 with ty.cast first")
        return (t,)
    return rule


def _const(ts, attrs):
    expect(not ts, "const takes no operands")
    t = attrs["type"]
    expect(isinstance(t, ScalarType), f"const expects a scalar type, but got {t}")
    expect(not t.is_fp8, f"const of type {t} is not supported: make an f32 constant and ty.cast it to {t}")
    v = attrs.get("value")
    if t.is_float and isinstance(v, float) and abs(v) != float("inf") and v == v:
        expect(abs(v) <= FLOAT_MAX.get(t.name, float("inf")), f"const {v!r} does not fit {t}")
    return (t,)


def _cmp(ts, attrs):
    expect(len(ts) == 2, f"cmp expects 2 operands, but got {len(ts)}")
    t = scalar("cmp", same("compare", ts))
    expect(not t.storage_only, f"comparisons of {t} values are not supported: convert to f32 with ty.cast first")
    expect(attrs["pred"] in ("lt", "le", "gt", "ge", "eq", "ne"), f"cmp pred {attrs['pred']!r}")
    return (i1,)


def _select(ts, attrs):
    expect(len(ts) == 3, "select expects (cond, a, b)")
    expect(ts[0] == i1, f"select expects an i1 condition, but got {ts[0]}")
    return (same("select", ts[1:]),)


def _fma(ts, attrs):
    expect(len(ts) == 3, "fma expects 3 operands")
    t = same("fma", ts)
    expect(t in (f32,) or getattr(t, "bits", 0) == 64 and t.is_float, f"fma expects f32 operands, but got {t}")
    _rounding("fma", t, attrs)
    return (t,)


def _convert(ts, attrs):
    src = scalar("convert", ts[0])
    dst = attrs["to"]
    expect(isinstance(dst, ScalarType) and dst.kind != "bits", f"convert expects a numeric target type, but got {dst}")
    r = attrs.get("rounding")
    if src.is_fp8 or dst.is_fp8:
        _fp8_convert(src, dst, r)
    if r is not None:
        expect(r in ROUNDINGS, f"convert rounding expects one of {', '.join(ROUNDINGS)}, but got {r!r}")
        numeric = not src.is_bool and src.kind != "bits"
        narrowing = src.is_float and dst.is_float and (dst.bits < src.bits or {src, dst} == {f16, bf16})
        expect(numeric and (narrowing or (src.is_int and dst.is_float) or (src.is_float and dst.is_int)),
               f"convert with an explicit rounding expects a float -> narrower float, int -> float or float -> int "
               f"conversion (PTX cvt.rnd), but got {src} -> {dst}, which is exact or has no rounding")
    return (dst,)


def _fp8_convert(src, dst, rounding):
    """fp8 converts to and from f16, bf16 and f32 (and f64 from it); rounding is always rn (satfinite)."""
    ok = (f16, bf16, f32, *FP8_TYPES)
    if src.is_fp8:
        expect(dst in ok or dst.name == "f64", f"convert from {src} expects a float target (f16, bf16, f32, f64, "
                                               f"e4m3, e5m2), but got {dst}; convert to f32 first")
    else:
        expect(src in ok, f"convert to {dst} expects an f16, bf16 or f32 value (cvt.rn.satfinite.{dst.name}x2.f32), "
                          f"but got {src}" + ("; cast to f32 first (f64 -> f32 rounds, then f32 -> "
                                              f"{dst} rounds again)" if src.name == "f64" else ""))
    expect(rounding in (None, "rn"), f"convert to or from {dst if dst.is_fp8 else src} expects rounding 'rn' "
                                     f"(the only mode of cvt to fp8), but got {rounding!r}")


def _pack_fp8(ts, attrs):
    n, dt = len(ts), attrs.get("dtype")
    expect(dt in FP8_TYPES, f"pack_fp8 expects dtype e4m3 or e5m2, but got {dt}")
    expect(n in (2, 4) and all(t == f32 for t in ts),
           f"pack_fp8 expects 2 or 4 f32 values, but got {', '.join(map(str, ts)) or 'none'}")
    return (u16 if n == 2 else b32,)


def _unpack_fp8(ts, attrs):
    dt = attrs.get("dtype")
    expect(dt in FP8_TYPES, f"unpack_fp8 expects dtype e4m3 or e5m2, but got {dt}")
    expect(len(ts) == 1 and ts[0] in (u16, b32),
           f"unpack_fp8 expects one u16 (2 values) or b32 (4 values) word, but got {', '.join(map(str, ts))}")
    return (f32,) * (2 if ts[0] == u16 else 4)


def _bitcast(ts, attrs):
    src = scalar("bitcast", ts[0])
    dst = attrs["to"]
    expect(isinstance(dst, ScalarType) and dst.bits == src.bits,
            f"bitcast expects a target of {src.bits} bits, but got {dst}")
    return (dst,)


def _pack2(ts, attrs):
    expect(len(ts) == 2 and all(t == f32 for t in ts), f"pack2 expects two f32 values, but got {', '.join(map(str, ts))}")
    expect(attrs["dtype"] in (f16, bf16), f"pack2 expects dtype f16 or bf16, but got {attrs['dtype']}")
    return (b32,)


def _unpack2(ts, attrs):
    expect(len(ts) == 1 and ts[0] == b32, f"unpack2 expects one b32 word, but got {', '.join(map(str, ts))}")
    expect(attrs["dtype"] in (f16, bf16), f"unpack2 expects dtype f16 or bf16, but got {attrs['dtype']}")
    return (f32, f32)




RULES = {
    "const": _const,
    **{op: _binary(op) for op in ("add", "sub", "mul", "div", "rem", "and", "or", "xor", "shl", "shr", "min", "max")},
    "neg": _unary("neg"), "abs": _unary("abs"), "not": _unary("not"),
    "exp2": _unary("exp2", float_only=True), "log2": _unary("log2", float_only=True),
    "rcp": _unary("rcp", float_only=True), "sqrt": _unary("sqrt", float_only=True),
    "rsqrt": _unary("rsqrt", float_only=True),
    "fma": _fma, "cmp": _cmp, "select": _select, "convert": _convert, "bitcast": _bitcast,
    "pack2": _pack2, "unpack2": _unpack2, "pack_fp8": _pack_fp8, "unpack_fp8": _unpack_fp8,
}
SIDE_EFFECTS: frozenset = frozenset()
