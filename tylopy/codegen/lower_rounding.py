"""Lowerings of float ops and conversions with an explicit rounding direction (attribute ``rounding``).

``add/sub/mul/div/fma/sqrt`` become NVVM intrinsics (``llvm.nvvm.add.rz.f`` ...: PTX
``add.rz.f32``; ``sub`` is ``add(a, -b)``, which IEEE defines it to be), which LLVM never
contracts or reassociates; conversions become ``cvt.{rnd}`` inline PTX (LLVM has no
intrinsic for most of them). Ops without the attribute keep their plain lowering:
``rounding_lowerings(LOWER)`` wraps the entries of the table it is given.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.types import ScalarType, bf16, f16, f32, f64
from ..ir.values import Op
from .llvm_types import llvm_type

I16, I32 = ir.IntType(16), ir.IntType(32)
HALF = ir.HalfType()

_SUFFIX = {"f32": "f", "f64": "d"}
_INTRINSIC = {"add": "add", "sub": "add", "mul": "mul", "div": "div", "fma": "fma", "sqrt": "sqrt"}


def _arith(base):
    def lower(L, op: Op):
        mode = op.attr("rounding")
        if mode is None:
            return base(L, op)
        t = op.operands[0].type
        args = [L.v(x) for x in op.operands]
        if op.opcode == "sub":
            args[1] = L.b.fneg(args[1])
        name = f"llvm.nvvm.{_INTRINSIC[op.opcode]}.{mode}.{_SUFFIX[t.name]}"
        L.set(op.result, L.call(name, args[0].type, args))
    return lower


# PTX type names and (inline-asm constraint, LLVM register type) of each scalar type in a cvt
_PTX = {"i8": "s8", "i16": "s16", "i32": "s32", "i64": "s64", "u8": "u8", "u16": "u16", "u32": "u32",
        "u64": "u64", "f16": "f16", "bf16": "bf16", "f32": "f32", "f64": "f64"}
_REG = {8: ("h", I16), 16: ("h", I16), 32: ("r", I32), 64: ("l", ir.IntType(64))}


def _reg(t: ScalarType):
    if t == f32:
        return "f", ir.FloatType()
    if t == f64:
        return "d", ir.DoubleType()
    return _REG[t.bits]


def _to_reg(L, x, t: ScalarType):
    """A value of type ``t`` as the register the cvt reads (16-bit floats and bytes as i16)."""
    if t == f16:
        return L.b.bitcast(x, I16)
    if t.bits == 8:
        return L.b.sext(x, I16) if t.is_signed else L.b.zext(x, I16)
    return x


def _from_reg(L, r, t: ScalarType):
    if t == f16:
        return L.b.bitcast(r, HALF)
    if t.bits == 8:
        return L.b.trunc(r, llvm_type(t))
    return r


def cvt_template(src: ScalarType, dst: ScalarType, mode: str) -> tuple[str, str]:
    """``cvt.{rnd}.{dst}.{src}``; float -> int uses the integer modes (.rni, .rzi, .rmi, .rpi)."""
    rnd = mode + "i" if src.is_float and not dst.is_float else mode
    return f"cvt.{rnd}.{_PTX[dst.name]}.{_PTX[src.name]} $0, $1;", f"={_reg(dst)[0]},{_reg(src)[0]}"


def _convert(base):
    def lower(L, op: Op):
        mode = op.attr("rounding")
        src, dst = op.operands[0].type, op.attr("to")
        if mode is None or src.is_fp8 or dst.is_fp8:  # fp8 converts round to nearest only (lower_fp8)
            return base(L, op)
        src, dst = op.operands[0].type, op.attr("to")
        x = L.v(op.operands[0])
        if src == bf16 or (src == f16 and dst == bf16):  # widen exactly to f32 first (sm_80 has no cvt from them)
            x = _to_f32(L, x, src)
            src = f32
        text, cons = cvt_template(src, dst, mode)
        r = L.asm(text, cons, [_to_reg(L, x, src)], ret=_reg(dst)[1], side_effect=False)
        L.set(op.result, _from_reg(L, r, dst))
    return lower


def _to_f32(L, x, src: ScalarType):
    if src == bf16:
        return L.b.bitcast(L.b.shl(L.b.zext(x, I32), I32(16)), ir.FloatType())
    return L.b.fpext(x, ir.FloatType())


def rounding_lowerings(table: dict) -> dict:
    """Wrapped entries of the lowering ``table`` for the ops that take a ``rounding`` attribute."""
    out = {k: _arith(table[k]) for k in ("add", "sub", "mul", "div", "fma", "sqrt")}
    out["convert"] = _convert(table["convert"])
    return out
