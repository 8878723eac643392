"""How IR values live in the emulator: numpy arrays over the 32 lanes of a warp.

Each IR scalar type maps to one numpy dtype. ``bf16`` has no numpy type, so its values are
their 16 raw bits (``uint16``); ``b32`` words (packed pairs of 16-bit floats) are ``uint32``.
Pointers are addresses: ``uint32`` offsets into the CTA's shared window for shared pointers,
``uint64`` fake device addresses for global and generic ones.

Rounding helpers reproduce the target's arithmetic exactly where the PTX does (RNE
conversions, one rounding for ``fma``); the two approximate MUFU ops (``ex2.approx.ftz``,
``lg2.approx.ftz``) and ``rsqrt.approx.ftz`` are computed in float64 and rounded once, which is
within the hardware's documented error (2**-22.5 relative for ex2) but not bit-identical to it.
"""
from __future__ import annotations

import numpy as np

from ..ir.types import PointerType, ScalarType, TensorMapType, Type

WARP = 32
LANES = np.arange(WARP, dtype=np.int32)

_NP = {
    "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "b32": np.uint32,
    "f16": np.float16, "bf16": np.uint16, "f32": np.float32, "f64": np.float64,
}
_SIGNED = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
_UNSIGNED = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}

SHARED_WINDOW = 0x7F00_0000_0000  # generic addresses of shared memory start here (cvta.shared)
TENSORMAP_BASE = 0x7E00_0000_0000  # fake param-space addresses of tensor-map arguments


def np_dtype(t: Type) -> np.dtype:
    """The numpy dtype that holds one lane's value of IR type ``t``."""
    if isinstance(t, ScalarType):
        return np.dtype(_NP[t.name])
    if isinstance(t, PointerType):
        return np.dtype(np.uint32 if t.space == "shared" else np.uint64)
    if isinstance(t, TensorMapType):
        return np.dtype(np.uint64)
    raise TypeError(f"the emulator has no representation for IR type {t}")


def signed_of(dt: np.dtype) -> np.dtype:
    return np.dtype(_SIGNED[dt.itemsize * 8])


def unsigned_of(dt: np.dtype) -> np.dtype:
    return np.dtype(_UNSIGNED[dt.itemsize * 8])


def splat(value, t: Type) -> np.ndarray:
    """A read-only array with ``value`` in every lane (constants, parameters)."""
    dt = np_dtype(t)
    if isinstance(t, ScalarType) and t.name == "bf16":
        arr = np.full(WARP, f32_to_bf16(np.array([value], dtype=np.float32))[0], dtype=np.uint16)
    elif isinstance(t, ScalarType) and t.is_int and not t.is_bool:
        arr = np.full(WARP, int(value) & ((1 << t.bits) - 1), dtype=unsigned_of(dt)).view(dt)
    else:
        arr = np.full(WARP, value, dtype=dt)
    arr.flags.writeable = False
    return arr


# -- 16-bit floats --------------------------------------------------------------------------------

def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """cvt.rn.bf16.f32: round to nearest even; NaN becomes the canonical 0x7FFF."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out = np.where(nan, np.uint16(0x7FFF), out)
    return out


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits to f32: exact (the upper half of the f32 word)."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_f16(x: np.ndarray) -> np.ndarray:
    """cvt.rn.f16.f32 as raw bits: round to nearest even; NaN becomes the canonical 0x7FFF."""
    out = np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out = np.where(nan, np.uint16(0x7FFF), out)
    return out


def f16_to_f32(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


def half_to_f32(bits: np.ndarray, dtype: str) -> np.ndarray:
    """16-bit float bits (``dtype`` 'bf16' or 'f16') to f32, exactly."""
    return bf16_to_f32(bits) if dtype == "bf16" else f16_to_f32(bits)


def f32_to_half(x: np.ndarray, dtype: str) -> np.ndarray:
    return f32_to_bf16(x) if dtype == "bf16" else f32_to_f16(x)


# -- f32 arithmetic that needs care ----------------------------------------------------------------

_F32_MIN_NORMAL = np.float32(2.0 ** -126)


def ftz(x: np.ndarray) -> np.ndarray:
    """Flush f32 subnormals to sign-preserving zero (the .ftz modifier)."""
    small = np.abs(x) < _F32_MIN_NORMAL
    if small.any():
        x = np.where(small, np.copysign(np.float32(0), x), x).astype(np.float32)
    return x


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fma.rn.f32 with a single rounding.

    The product of two f32 is exact in f64; the f64 sum ``s`` is rounded and TwoSum gives its
    error ``e``. Rounding ``s`` to f32 is then correct unless ``s`` sits exactly on an f32
    midpoint (midpoints are f64 numbers, so the exact sum cannot cross one): there the sign of
    ``e`` breaks the tie.
    """
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    diff = s - r64
    suspect = (diff != 0) & (e != 0) & np.isfinite(r)
    if suspect.any():
        toward = np.where(diff > 0, np.float32(np.inf), np.float32(-np.inf))
        n = np.nextafter(r, toward)
        mid = (r64 + n.astype(np.float64)) * 0.5
        fix = suspect & (s == mid) & (np.sign(e) == np.sign(diff))
        r = np.where(fix, n, r).astype(np.float32)
    return r


def ex2_approx_ftz(x: np.ndarray) -> np.ndarray:
    """ex2.approx.ftz.f32, computed as the correctly rounded 2**x (hardware: within 2**-22.5)."""
    return ftz(np.exp2(x.astype(np.float64)).astype(np.float32))


def lg2_approx_ftz(x: np.ndarray) -> np.ndarray:
    """lg2.approx.ftz.f32, computed as the correctly rounded log2 of the flushed input."""
    return np.log2(ftz(x).astype(np.float64)).astype(np.float32)


def rsqrt_approx_ftz(x: np.ndarray) -> np.ndarray:
    x = ftz(x).astype(np.float64)
    return ftz((1.0 / np.sqrt(x)).astype(np.float32))


def rcp_rn(x: np.ndarray) -> np.ndarray:
    """rcp.rn.f32: 1/x rounded once (f64 division then rounding is innocuous for f32)."""
    return (1.0 / x.astype(np.float64)).astype(np.float32)


# -- wgmma results not yet waited on -----------------------------------------------------------------

class Pending:
    """A wgmma result that belongs to a commit group the warp has not waited out yet.

    ``group`` is the warp's commit-group index the wgmma was issued into; ``op`` the wgmma.
    Only wgmma (accumulator chaining), wgmma_wait, fence_operand and region plumbing may
    touch it; any other reader is a protocol error.
    """

    __slots__ = ("value", "group", "op")

    def __init__(self, value: np.ndarray, group: int, op):
        self.value, self.group, self.op = value, group, op


def merge(cond: np.ndarray, a, b):
    """np.where over lanes that also carries the pending state of wgmma results."""
    if type(a) is Pending or type(b) is Pending:
        if a is b:
            return a
        av = a.value if type(a) is Pending else a
        bv = b.value if type(b) is Pending else b
        pend = a if type(a) is Pending else b
        if type(a) is Pending and type(b) is Pending and b.group > a.group:
            pend = b
        return Pending(np.where(cond, av, bv), pend.group, pend.op)
    return np.where(cond, a, b)
