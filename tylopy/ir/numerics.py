"""Bit-exact numpy models of the conversions the kernels use (the CPU reference semantics).

``cvt.rn.bf16.f32``/``cvt.rn.bf16x2.f32``: round to nearest even; infinities and signed zeros
kept; NaN stays NaN (payload unspecified by PTX: we return the canonical quiet NaN 0x7FFF);
no saturation, no flush to zero. ``cvt.rn.f16x2.f32``: IEEE round to nearest even, overflow
to infinity, as numpy's float16 cast.
"""
from __future__ import annotations

import numpy as np


def f32_to_bf16_bits(x) -> np.ndarray:
    """float32 values to their bf16 bit patterns (uint16), round to nearest even."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint32).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, np.uint16(0x7FFF), out).astype(np.uint16)


def bf16_bits_to_f32(bits) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) << 16).astype(np.uint32).view(np.float32)


def f32_to_f16_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def f16_bits_to_f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


def round_to(x, dtype_name: str) -> np.ndarray:
    """float32 -> dtype (rounded) -> float32."""
    if dtype_name == "bf16":
        return bf16_bits_to_f32(f32_to_bf16_bits(x))
    if dtype_name == "f16":
        return f16_bits_to_f32(f32_to_f16_bits(x))
    return np.asarray(x, dtype=np.float32)


def pack2_bits(lo, hi, dtype_name: str) -> np.ndarray:
    """Two float32 arrays to packed b32 words (uint32), ``lo`` in bits 0-15."""
    conv = f32_to_bf16_bits if dtype_name == "bf16" else f32_to_f16_bits
    return conv(lo).astype(np.uint32) | (conv(hi).astype(np.uint32) << 16)


def unpack2_bits(words, dtype_name: str) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(words, dtype=np.uint32)
    back = bf16_bits_to_f32 if dtype_name == "bf16" else f16_bits_to_f32
    return back((w & 0xFFFF).astype(np.uint16)), back((w >> 16).astype(np.uint16))
