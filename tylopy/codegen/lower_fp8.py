"""Lowerings of the fp8 conversions (sm_89+) to inline PTX: ``convert`` to and from e4m3/e5m2,
``pack_fp8`` and ``unpack_fp8``. Registered in ``llvm.LOWER``.

The hardware converts in pairs: ``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 d, a, b`` rounds two f32
into a b16 (``a`` in the upper byte) and ``cvt.rn.f16x2.{e4m3x2,e5m2x2} d, a`` widens a b16 of
two codes to two f16 (the low byte to the low half). A scalar conversion uses one lane of the
pair; f16/bf16 go through f32 (exact), f64 comes from f32 (exact). The semantics the emulator
runs are ``tylopy/semantics/fp8.py``.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.types import f16, f32
from ..ir.values import Op

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
HALF, F32 = ir.HalfType(), ir.FloatType()


def to_fp8_template(fmt: str, count: int) -> tuple[str, str]:
    """Round ``count`` (1, 2 or 4) f32 operands to fp8 codes packed into one b16/b32 result."""
    cvt = f"cvt.rn.satfinite.{fmt}x2.f32"
    if count == 1:
        return f"{cvt} $0, $1, $1;", "=h,f"
    if count == 2:
        return f"{cvt} $0, $2, $1;", "=h,f,f"
    return ("{\n\t.reg .b16 lo, hi;\n"
            f"\t{cvt} lo, $2, $1;\n\t{cvt} hi, $4, $3;\n"
            "\tmov.b32 $0, {lo, hi};\n\t}", "=r,f,f,f,f")


def from_fp8_template(fmt: str, count: int) -> tuple[str, str]:
    """Widen a b16 (count 2) or b32 (count 4) of codes to f16x2 words; count 1 gives one f16 (b16)."""
    cvt = f"cvt.rn.f16x2.{fmt}x2"
    if count == 1:
        return ("{\n\t.reg .b32 t;\n\t.reg .b16 hi;\n"
                f"\t{cvt} t, $1;\n\tmov.b32 {{$0, hi}}, t;\n\t}}", "=h,h")
    if count == 2:
        return f"{cvt} $0, $1;", "=r,h"
    return ("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, $2;\n"
            f"\t{cvt} $0, lo;\n\t{cvt} $1, hi;\n\t}}", "=r,=r,r")


def convert_fp8(L, x, src, dst, convert_scalar):
    """``x`` of type ``src`` converted to ``dst`` (one of them fp8); ``convert_scalar`` does the
    float widenings and narrowings that do not involve fp8 (llvm.py's)."""
    B = L.b
    if src == dst:
        return x
    if src.is_fp8:
        text, cons = from_fp8_template(src.name, 1)
        h = B.bitcast(L.asm(text, cons, [B.zext(x, I16)], ret=I16, side_effect=False), HALF)
        if dst == f16:
            return h
        x, src = B.fpext(h, F32), f32
        if dst.is_fp8:
            return convert_fp8(L, x, f32, dst, convert_scalar)
        return x if dst == f32 else convert_scalar(L, x, f32, dst)
    if src != f32:
        x = convert_scalar(L, x, src, f32)
    text, cons = to_fp8_template(dst.name, 1)
    return B.trunc(L.asm(text, cons, [x], ret=I16, side_effect=False), I8)


def lower_pack_fp8(L, op: Op):
    n = len(op.operands)
    text, cons = to_fp8_template(op.attr("dtype").name, n)
    L.set(op.result, L.asm(text, cons, [L.v(x) for x in op.operands], ret=I16 if n == 2 else I32,
                           side_effect=False))


def _halves(B, word):
    lo = B.fpext(B.bitcast(B.trunc(word, I16), HALF), F32)
    hi = B.fpext(B.bitcast(B.trunc(B.lshr(word, I32(16)), I16), HALF), F32)
    return [lo, hi]


def lower_unpack_fp8(L, op: Op):
    B = L.b
    n = len(op.results)
    text, cons = from_fp8_template(op.attr("dtype").name, n)
    w = L.v(op.operands[0])
    if n == 2:
        vals = _halves(B, L.asm(text, cons, [w], ret=I32, side_effect=False))
    else:
        r = L.asm(text, cons, [w], ret=ir.LiteralStructType([I32, I32]), side_effect=False)
        vals = _halves(B, B.extract_value(r, 0)) + _halves(B, B.extract_value(r, 1))
    for res, v in zip(op.results, vals):
        L.set(res, v)


LOWER_FP8 = {"pack_fp8": lower_pack_fp8, "unpack_fp8": lower_unpack_fp8}
