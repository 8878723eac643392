"""The 8-bit floats e4m3 and e5m2 (OCP FP8) and Hopper's conversions to and from them.

Values travel as their raw bits (uint8), as bf16 travels as uint16.

* e4m3 ("fn"): bias 7, 3 mantissa bits, largest finite 448, no infinities; S.1111.111 is NaN.
* e5m2: bias 15, 2 mantissa bits, largest finite 57344; S.11111.00 is infinity, S.11111.xx NaN.

Conversions, as the sm_89+ ``cvt`` instructions do them:

* to fp8 (``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32``; f16/bf16 inputs go through f32, which is
  exact, so the result is the same as ``.f16x2``): round to nearest even, once, from the exact
  input; subnormals kept; a magnitude above the largest finite value after rounding (infinity
  included) becomes the largest finite value with the input's sign (``.satfinite``); NaN
  becomes ``0x7F``; zero keeps its sign.
* from fp8 (``cvt.rn.f16x2.{e4m3x2,e5m2x2}``, then widening): every value is exact in f16.
  Every NaN code of either format, whatever its sign and payload, becomes the canonical f16 NaN
  ``0x7FFF`` (e5m2's other codes are the upper byte of an f16, infinities included), and widens
  to the canonical f32 NaN ``0x7FFFFFFF`` (measured on an H200 for all 256 codes).

The NaN encodings are the ones tests/test_fp8_conversions_gpu.py checks on the GPU for all 256
codes of both formats.
"""
from __future__ import annotations

import numpy as np

# name -> (exponent bits, mantissa bits, bias)
FORMATS = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}
MAX_FINITE = {"e4m3": 448.0, "e5m2": 57344.0}
NAN_BITS = 0x7F          # what a NaN input converts to, in both formats
F16_NAN = 0x7FFF           # every NaN code, either format, converts to these
F32_NAN = 0x7FFFFFFF


def _check(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"fp8 format expects 'e4m3' or 'e5m2', but got {fmt!r}")


def _decode_table(fmt: str) -> np.ndarray:
    """float64 value of each of the 256 codes (NaN where the code is NaN)."""
    ebits, mbits, bias = FORMATS[fmt]
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e = (codes >> mbits) & ((1 << ebits) - 1)
    m = codes & ((1 << mbits) - 1)
    mag = np.where(e == 0, m * 2.0 ** (1 - bias - mbits), (1 + m / 2.0 ** mbits) * 2.0 ** (e - bias))
    top = (1 << ebits) - 1
    if fmt == "e4m3":
        mag = np.where((e == top) & (m == (1 << mbits) - 1), np.nan, mag)
    else:
        mag = np.where(e == top, np.where(m == 0, np.inf, np.nan), mag)
    return sign * mag


_TABLES = {f: _decode_table(f) for f in FORMATS}
# the non-negative finite codes in increasing order (code i has value _POSITIVE[f][i])
_POSITIVE = {f: t[:0x80][np.isfinite(t[:0x80])] for f, t in _TABLES.items()}


def fp8_to_f64(bits, fmt: str) -> np.ndarray:
    """The exact value of each code (NaN codes give NaN)."""
    _check(fmt)
    return _TABLES[fmt][np.asarray(bits, dtype=np.uint8).astype(np.intp)]


def fp8_to_f16_bits(bits, fmt: str) -> np.ndarray:
    """cvt.rn.f16x2.{fmt}x2 on each code: the f16 bit patterns (uint16)."""
    _check(fmt)
    b = np.asarray(bits, dtype=np.uint8)
    if fmt == "e5m2":
        out = b.astype(np.uint16) << np.uint16(8)
    else:
        out = fp8_to_f64(b, fmt).astype(np.float16).view(np.uint16)
    return np.where(np.isnan(fp8_to_f64(b, fmt)), np.uint16(F16_NAN), out).astype(np.uint16)


def fp8_to_f32(bits, fmt: str) -> np.ndarray:
    """Code -> f32 as the GPU computes it (exact; every NaN the canonical 0x7FFFFFFF)."""
    b = np.asarray(bits, dtype=np.uint8)
    out = fp8_to_f16_bits(b, fmt).view(np.float16).astype(np.float32)
    return np.where(np.isnan(out), np.uint32(F32_NAN).view(np.float32), out).astype(np.float32)


def f64_to_fp8(x, fmt: str) -> np.ndarray:
    """Round exact values (f32/f16/bf16 widened to float64) to fp8 codes: nearest even, satfinite."""
    _check(fmt)
    x = np.asarray(x, dtype=np.float64)
    ebits, mbits, bias = FORMATS[fmt]
    mag = np.abs(x)
    finite = np.isfinite(mag)
    safe = np.where(finite & (mag > 0), mag, 1.0)
    exp = np.maximum(np.floor(np.log2(safe)), 1 - bias)
    quantum = 2.0 ** (exp - mbits)
    rounded = np.round(safe / quantum) * quantum           # np.round: half to even, exact in f64
    rounded = np.where(mag == 0, 0.0, rounded)
    rounded = np.minimum(np.where(finite, rounded, np.inf), MAX_FINITE[fmt])  # satfinite (inf included)
    code = np.searchsorted(_POSITIVE[fmt], rounded).astype(np.uint8)
    code = code | np.where(np.signbit(x), np.uint8(0x80), np.uint8(0))
    return np.where(np.isnan(x), np.uint8(NAN_BITS), code).astype(np.uint8)


def f32_to_fp8(x, fmt: str) -> np.ndarray:
    """cvt.rn.satfinite.{fmt}x2.f32 on each value: fp8 codes (uint8)."""
    return f64_to_fp8(np.asarray(x, dtype=np.float32).astype(np.float64), fmt)


def pack_fp8(values, fmt: str) -> np.ndarray:
    """2 or 4 f32 arrays -> words (uint16 or uint32), value 0 in the lowest byte."""
    codes = [f32_to_fp8(v, fmt).astype(np.uint32) for v in values]
    word = np.zeros_like(codes[0])
    for i, c in enumerate(codes):
        word |= c << np.uint32(8 * i)
    return word.astype(np.uint16 if len(values) == 2 else np.uint32)


def unpack_fp8(word, count: int, fmt: str) -> list:
    """A uint16 (count 2) or uint32 (count 4) word -> ``count`` f32 arrays, lowest byte first."""
    w = np.asarray(word).astype(np.uint32)
    return [fp8_to_f32(((w >> np.uint32(8 * i)) & np.uint32(0xFF)).astype(np.uint8), fmt) for i in range(count)]
