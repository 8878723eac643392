"""16-bit float conversions and packing, as the kernels' ``cvt.rn`` instructions do them.

``cvt.rn.bf16.f32``/``cvt.rn.bf16x2.f32`` and ``cvt.rn.f16x2.f32``: round to nearest even;
infinities and signed zeros kept; NaN becomes the canonical quiet NaN 0x7FFF (PTX leaves the
payload unspecified); no saturation, no flush to zero; f16 overflows to infinity.
"""
from __future__ import annotations

import numpy as np

from .scalar import bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16


def f32_to_bf16_bits(x) -> np.ndarray:
    """float32 values to their bf16 bit patterns (uint16), round to nearest even."""
    return f32_to_bf16(np.asarray(x, dtype=np.float32))


def bf16_bits_to_f32(bits) -> np.ndarray:
    return bf16_to_f32(np.asarray(bits, dtype=np.uint16))


def f32_to_f16_bits(x) -> np.ndarray:
    return f32_to_f16(np.asarray(x, dtype=np.float32))


def f16_bits_to_f32(bits) -> np.ndarray:
    return f16_to_f32(np.asarray(bits, dtype=np.uint16))


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
    return conv(lo).astype(np.uint32) | (conv(hi).astype(np.uint32) << np.uint32(16))


def unpack2_bits(words, dtype_name: str) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(words, dtype=np.uint32)
    back = bf16_bits_to_f32 if dtype_name == "bf16" else f16_bits_to_f32
    return back((w & np.uint32(0xFFFF)).astype(np.uint16)), back((w >> np.uint32(16)).astype(np.uint16))
