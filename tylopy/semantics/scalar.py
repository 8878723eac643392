"""The scalar semantics of tylopy's ops on the CPU, bit for bit as the H200 computes them.

One numpy module for both CPU semantics: the tile library's reference mode (``Fragment`` on
lane arrays) and the emulator (``tylopy.emulate``) call these functions, so the two cannot
disagree (a test checks every scalar op on random inputs with subnormals, infinities and NaN).

* Floats: f32 ``add/sub/mul/div`` round to nearest even and keep subnormals (PTX ``.rn``
  without ``.ftz``, which is what LLVM's NVPTX backend emits); ``fma`` rounds once;
  ``min/max`` ignore a NaN operand (``fminf``/``fmaxf``) and order -0 below +0; ``exp2``/``log2``/``rsqrt`` are the
  MUFU approximations ``ex2.approx.ftz``, ``lg2.approx.ftz``, ``rsqrt.approx.ftz``, computed
  here as the correctly rounded value of the flushed input with the result flushed (the
  hardware is within 2**-22.5 relative of it, measured and documented in docs/emulator.md);
  ``rcp`` is ``rcp.rn``; ``sqrt`` is ``sqrt.rn``.
* 16-bit floats: ``cvt.rn`` conversions, round to nearest even; NaN becomes the canonical
  0x7FFF; bf16 values travel as their raw bits (uint16).
* Integers wrap; ``div`` and ``rem`` truncate toward zero; a division by zero gives all ones
  (``rem`` the dividend); shifts by the width or more give 0, or -1 for an arithmetic right
  shift of a negative value; float to int truncates and saturates, NaN gives 0.

The tensor cores' f32 accumulation is in ``tensorcore.py`` beside this file.
"""
from __future__ import annotations

import numpy as np

from ..ir.types import ScalarType, bf16, f32

_NP = {
    "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "b32": np.uint32,
    "f16": np.float16, "bf16": np.uint16, "f32": np.float32, "f64": np.float64,
    "e4m3": np.uint8, "e5m2": np.uint8,  # raw bits (fp8.py)
}
_SIGNED = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
_UNSIGNED = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


def scalar_dtype(t: ScalarType) -> np.dtype:
    """The numpy dtype that holds one value of scalar type ``t`` (bf16: its raw bits)."""
    return np.dtype(_NP[t.name])


def signed_of(dt: np.dtype) -> np.dtype:
    return np.dtype(_SIGNED[dt.itemsize * 8])


def unsigned_of(dt: np.dtype) -> np.dtype:
    return np.dtype(_UNSIGNED[dt.itemsize * 8])


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
    with np.errstate(invalid="ignore", over="ignore"):  # infinities make the TwoSum terms NaN: unused then
        return _fma_f32(a, b, c)


def _fma_f32(a, b, c):
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
    with np.errstate(divide="ignore"):  # 1/0 is inf, as rcp.rn gives
        return (1.0 / x.astype(np.float64)).astype(np.float32)



# -- integers ----------------------------------------------------------------------------------------

def _nonzero(b):
    return np.where(b == 0, np.ones_like(b), b)


def _sdiv(a, b):
    bs = _nonzero(b)
    q = np.floor_divide(a, bs)
    q = q + ((np.remainder(a, bs) != 0) & ((a < 0) ^ (bs < 0))).astype(a.dtype)
    return np.where(b == 0, np.array(-1, dtype=a.dtype), q).astype(a.dtype)


def _udiv(a, b):
    q = np.floor_divide(a, _nonzero(b))
    return np.where(b == 0, np.array(np.iinfo(a.dtype).max, dtype=a.dtype), q)


def _srem(a, b):
    return np.where(b == 0, a, np.fmod(a, _nonzero(b))).astype(a.dtype)


def _urem(a, b):
    return np.where(b == 0, a, np.remainder(a, _nonzero(b)))


def _shift(kind, bits):
    def fn(a, b):
        ub = b.view(unsigned_of(b.dtype)) if b.dtype.kind == "i" else b
        big = ub >= bits
        sh = np.minimum(ub, bits - 1).astype(a.dtype)
        if kind == "shl":
            return np.where(big, np.zeros_like(a), np.left_shift(a, sh))
        r = np.right_shift(a, sh)
        if a.dtype.kind == "i":
            return np.where(big, np.where(a < 0, np.array(-1, a.dtype), np.array(0, a.dtype)), r)
        return np.where(big, np.zeros_like(a), r)
    return fn


# -- conversions -------------------------------------------------------------------------------------

def _float_to_int(x, dt):
    info = np.iinfo(dt)
    y = np.trunc(x.astype(np.float64))
    y = np.where(np.isnan(y), 0.0, np.clip(y, float(info.min), float(info.max)))
    # float(info.max) may round up past the maximum for 64-bit types: clamp in the integer domain
    out = y.astype(np.float64)
    big = out >= float(info.max)
    res = out.astype(dt)
    return np.where(big, np.array(info.max, dtype=dt), res)


def _scalar_convert(src, dst):
    sdt, ddt = scalar_dtype(src), scalar_dtype(dst)
    if dst.is_bool:
        return lambda x: (x != 0) if src.is_float else (x & 1).astype(np.bool_)
    if src.is_float and dst.is_float:
        return lambda x: x.astype(ddt)
    if src.is_float:
        return lambda x: _float_to_int(x, ddt)
    return lambda x: x.astype(ddt)


def convert_fn(src, dst):
    """The conversion the LLVM lowering emits (bf16 goes through f32, as cvt.rn.bf16.f32 does;
    fp8 through f16/f32, as cvt.rn.f16x2.e4m3x2 and cvt.rn.satfinite.e4m3x2.f32 do)."""
    if src.is_fp8 or dst.is_fp8:
        return _fp8_convert(src, dst)
    if src == bf16:
        if dst == f32:
            return bf16_to_f32
        if dst == bf16:
            return lambda x: x
        rest = _scalar_convert(f32, dst)
        return lambda x: rest(bf16_to_f32(x))
    if dst == bf16:
        if src == f32:
            return f32_to_bf16
        first = _scalar_convert(src, f32)
        return lambda x: f32_to_bf16(first(x))
    return _scalar_convert(src, dst)


def _fp8_convert(src, dst):
    from . import fp8
    if src == dst:
        return lambda x: x
    if src.is_fp8:
        if dst.is_fp8:
            return lambda x: fp8.f32_to_fp8(fp8.fp8_to_f32(x, src.name), dst.name)
        if dst.name == "f16":
            return lambda x: fp8.fp8_to_f16_bits(x, src.name).view(np.float16)
        rest = convert_fn(f32, dst)
        return lambda x: rest(fp8.fp8_to_f32(x, src.name))
    first = convert_fn(src, f32)
    return lambda x: fp8.f32_to_fp8(first(x), dst.name)


# -- ops by opcode ---------------------------------------------------------------------------------------

def _fmin(a, b):
    """fminf, with -0 below +0: min of +0 and -0 is -0 in either order (measured on an H200)."""
    r = np.fmin(a, b)
    zeros = (a == 0) & (b == 0)
    return np.where(zeros, np.where(np.signbit(a) | np.signbit(b), -np.abs(r), r), r) if np.any(zeros) else r


def _fmax(a, b):
    """fmaxf, with +0 above -0 (max of +0 and -0 is +0 in either order, the mirror of min)."""
    r = np.fmax(a, b)
    zeros = (a == 0) & (b == 0)
    return np.where(zeros, np.where(np.signbit(a) & np.signbit(b), r, np.abs(r)), r) if np.any(zeros) else r


_FLOAT_BIN = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "rem": np.fmod,
              "min": _fmin, "max": _fmax}
_INT_BIN = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and, "or": np.bitwise_or,
            "xor": np.bitwise_xor, "min": np.minimum, "max": np.maximum}


class UnsupportedScalarOp(ValueError):
    """An op on a type it has no semantics for (the type rules normally reject it earlier)."""


def binary_fn(opcode: str, t: ScalarType):
    """The numpy function of a binary op on values of type ``t``."""
    if t.storage_only:
        raise UnsupportedScalarOp(f"{opcode} on {t} values: convert to f32 with ty.cast first")
    if t.is_float:
        return _FLOAT_BIN[opcode]
    if t.is_bool:
        return {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[opcode]
    if opcode in _INT_BIN:
        return _INT_BIN[opcode]
    if opcode in ("shl", "shr"):
        return _shift(opcode, t.bits)
    signed = t.is_signed
    return {"div": _sdiv if signed else _udiv, "rem": _srem if signed else _urem}[opcode]


def binary_f32(opcode: str, a, b) -> np.ndarray:
    """An f32 binary op on arrays (or numbers), with the GPU's rounding."""
    return binary_fn(opcode, f32)(np.asarray(a, np.float32), np.asarray(b, np.float32)).astype(np.float32)


UNARY_F32 = {"exp2": ex2_approx_ftz, "log2": lg2_approx_ftz, "rsqrt": rsqrt_approx_ftz, "rcp": rcp_rn,
             "sqrt": np.sqrt}


def unary_fn(opcode: str, t: ScalarType):
    """The numpy function of a unary op on values of type ``t``."""
    if t.storage_only:
        raise UnsupportedScalarOp(f"{opcode} on {t} values: convert to f32 with ty.cast first")
    if opcode in UNARY_F32:
        return UNARY_F32[opcode]
    if opcode == "neg":
        return np.negative
    if opcode == "abs":
        return np.abs
    return np.logical_not if t.is_bool else np.invert


def fma_fn(t: ScalarType):
    return fma_f32 if t == f32 else (lambda x, y, z: x * y + z)  # f64: not fused (documented)


CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
       "ne": np.not_equal}
