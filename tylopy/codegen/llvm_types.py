"""How IR types look in LLVM (NVPTX): bf16 travels as i16 (llvmlite has no bfloat
type), e4m3/e5m2 as i8."""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.types import PointerType, ScalarType, TensorMapType, Type

ADDRSPACE = {"generic": 0, "global": 1, "shared": 3, "param": 101}

_SCALAR = {
    "i1": ir.IntType(1), "i8": ir.IntType(8), "u8": ir.IntType(8), "i16": ir.IntType(16), "u16": ir.IntType(16),
    "i32": ir.IntType(32), "u32": ir.IntType(32), "b32": ir.IntType(32), "i64": ir.IntType(64), "u64": ir.IntType(64),
    "f16": ir.HalfType(), "bf16": ir.IntType(16), "f32": ir.FloatType(), "f64": ir.DoubleType(),
    "e4m3": ir.IntType(8), "e5m2": ir.IntType(8),  # fp8 travels as its bits, as bf16 does
}

TENSORMAP_ARG = ir.PointerType(ir.ArrayType(ir.IntType(8), 128))


def signed_constant(c: ir.Constant) -> int:
    """An integer constant's value read as signed: constants are built from their unsigned bits
    (``lower_const`` stores -1 as 0xFFFFFFFF), so a lowering that asks "is it -1?" or "is it
    negative?" must read the bits back this way."""
    bits = c.type.width
    value = int(c.constant) & ((1 << bits) - 1)
    return value - (1 << bits) if value >> (bits - 1) else value


def llvm_type(t: Type) -> ir.Type:
    if isinstance(t, ScalarType):
        return _SCALAR[t.name]
    if isinstance(t, PointerType):
        return ir.PointerType(addrspace=ADDRSPACE[t.space])
    if isinstance(t, TensorMapType):
        return TENSORMAP_ARG
    raise TypeError(f"no LLVM type for {t}")
