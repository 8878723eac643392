"""Scalar, pointer and opaque types of the tylopy IR.

Types are immutable, hashable values; two types are equal when they print the same. Integer
types carry their signedness because PTX does (division, shifts, comparisons and conversions
differ); packed pairs of 16-bit floats travel as ``b32`` words, as PTX and the MMA
instructions see them.
"""
from __future__ import annotations

import math

from dataclasses import dataclass


class Type:
    """Base of every IR type."""


@dataclass(frozen=True)
class ScalarType(Type):
    name: str
    bits: int
    kind: str  # 'int', 'uint', 'float', 'bool', 'bits'

    @property
    def is_fp8(self) -> bool:
        return self.name in ("e4m3", "e5m2")

    @property
    def storage_only(self) -> bool:
        """A float type that ops take only through conversions (bf16, e4m3, e5m2): no arithmetic."""
        return self.name in ("bf16", "e4m3", "e5m2")

    def __post_init__(self):
        if self.kind not in ("int", "uint", "float", "bool", "bits"):
            raise ValueError(f"ScalarType kind expects int/uint/float/bool/bits, but got {self.kind!r}")

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint", "bits")

    @property
    def is_signed(self) -> bool:
        return self.kind == "int"

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def nbytes(self) -> int:
        return max(1, self.bits // 8)

    @property
    def range(self) -> tuple[int, int]:
        """(lowest, highest) of an integer or bool type."""
        return int_range(self)

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


i1 = ScalarType("i1", 1, "bool")
i8 = ScalarType("i8", 8, "int")
i16 = ScalarType("i16", 16, "int")
i32 = ScalarType("i32", 32, "int")
i64 = ScalarType("i64", 64, "int")
u8 = ScalarType("u8", 8, "uint")
u16 = ScalarType("u16", 16, "uint")
u32 = ScalarType("u32", 32, "uint")
u64 = ScalarType("u64", 64, "uint")
b32 = ScalarType("b32", 32, "bits")  # a packed pair of 16-bit values, as PTX's .b32
f16 = ScalarType("f16", 16, "float")
bf16 = ScalarType("bf16", 16, "float")
f32 = ScalarType("f32", 32, "float")
f64 = ScalarType("f64", 64, "float")
# The OCP 8-bit floats (sm_89+): storage and tensor-core operand types only; arithmetic on them
# goes through ty.cast to f16/f32 (docs/fp8.md). e4m3 is "fn": no infinities, one NaN per sign.
e4m3 = ScalarType("e4m3", 8, "float")
e5m2 = ScalarType("e5m2", 8, "float")
FP8_TYPES = (e4m3, e5m2)

SCALAR_TYPES = {t.name: t for t in (i1, i8, i16, i32, i64, u8, u16, u32, u64, b32, f16, bf16, f32, f64, e4m3, e5m2)}

ADDRESS_SPACES = ("generic", "global", "shared", "param")


@dataclass(frozen=True)
class PointerType(Type):
    """A pointer to ``pointee`` in one PTX state space."""

    pointee: ScalarType
    space: str = "global"

    def __post_init__(self):
        if self.space not in ADDRESS_SPACES:
            raise ValueError(f"PointerType space expects one of {ADDRESS_SPACES}, but got {self.space!r}")

    def __repr__(self) -> str:
        return f"ptr<{self.pointee}, {self.space}>"

    __str__ = __repr__


@dataclass(frozen=True)
class TensorMapType(Type):
    """An opaque 128-byte CUtensorMap passed as a grid-constant kernel parameter."""

    def __repr__(self) -> str:
        return "tensormap"

    __str__ = __repr__


tensormap = TensorMapType()


def is_scalar(t: Type) -> bool:
    return isinstance(t, ScalarType)


def is_pointer(t: Type) -> bool:
    return isinstance(t, PointerType)


def int_range(t: ScalarType) -> tuple[int, int]:
    """The values an integer (or bool) type holds: (lowest, highest)."""
    if t.is_bool:
        return 0, 1
    if t.kind == "int":
        return -(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1
    return 0, (1 << t.bits) - 1


# The largest finite value of each float type: a constant beyond it does not fit.
FLOAT_MAX = {"f16": 65504.0, "bf16": 3.3895313892515355e38, "f32": 3.4028234663852886e38,
             "f64": 1.7976931348623157e308, "e4m3": 448.0, "e5m2": 57344.0}



def float_fits(t: ScalarType, x) -> bool:
    """Whether the number ``x`` fits float type ``t``: inf and nan do, a finite value beyond the largest
    finite one does not (it would turn into inf)."""
    try:
        v = float(x)
    except OverflowError:  # an int beyond every float
        return False
    return math.isnan(v) or math.isinf(v) or abs(v) <= FLOAT_MAX.get(t.name, math.inf)
