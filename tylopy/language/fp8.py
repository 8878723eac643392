"""The 8-bit float types and their packed conversions in the kernel language (sm_89+).

``ty.e4m3`` and ``ty.e5m2`` are storage and tensor-core operand types: pointers and tensors of
them load and store bytes, ``ty.cast`` converts to and from f16/bf16/f32 (round to nearest even,
saturating to the largest finite value: PTX ``cvt.rn.satfinite``), and arithmetic, comparisons
and constants go through f32. The hardware converts in pairs; ``pack_fp8x2/x4`` and
``unpack_fp8x2/x4`` are those instructions, on u16 (two codes) and b32 (four codes) words with
value 0 in the lowest byte: a b32 of four codes is what an fp8 MMA operand register holds.
docs/fp8.md has the rules; ``tylopy/semantics/fp8.py`` the bit-level semantics.
"""
from __future__ import annotations

from ..codegen.targets import family
from ..ir.types import FP8_TYPES, b32, e4m3, e5m2, f32, u16
from .builder import current_builder
from .proxy import as_value, emit, emit1

__all__ = ["e4m3", "e5m2", "pack_fp8x2", "pack_fp8x4", "unpack_fp8x2", "unpack_fp8x4"]


def require_fp8_target(what: str) -> None:
    """fp8 conversions and MMAs exist from sm_89 (Ada) on."""
    bld = current_builder()
    if family(bld.arch) < (8, 9):
        bld.error(f"{what} expects a kernel for sm_89 or newer (fp8 cvt and mma exist from Ada on), but it targets "
                  f"{bld.arch}")


def _dtype(fn: str, dtype) -> None:
    if dtype not in FP8_TYPES:
        current_builder().error(f"{fn} dtype expects ty.e4m3 or ty.e5m2, but got {dtype!r}")


def pack_fp8x2(lo, hi, dtype):
    """Round two f32 to ``dtype`` (nearest even, satfinite) and pack them into a u16; ``lo`` in bits 0-7."""
    _dtype("pack_fp8x2", dtype)
    require_fp8_target("pack_fp8x2")
    return emit1("pack_fp8", (as_value(lo, f32), as_value(hi, f32)), dtype=dtype)


def pack_fp8x4(v0, v1, v2, v3, dtype):
    """Round four f32 to ``dtype`` and pack them into a b32 (``v0`` in bits 0-7): one fp8 MMA register."""
    _dtype("pack_fp8x4", dtype)
    require_fp8_target("pack_fp8x4")
    return emit1("pack_fp8", tuple(as_value(v, f32) for v in (v0, v1, v2, v3)), dtype=dtype)


def unpack_fp8x2(word, dtype):
    """The two codes of a u16 as f32 (bits 0-7 first); exact."""
    _dtype("unpack_fp8x2", dtype)
    require_fp8_target("unpack_fp8x2")
    w = as_value(word, u16)
    if w.type != u16:
        current_builder().error(f"unpack_fp8x2 expects a u16 word of two codes, but got {w.type}",
                                hint="ty.bitcast or ty.cast a 16-bit value to ty.u16")
    return emit("unpack_fp8", (w,), dtype=dtype)


def unpack_fp8x4(word, dtype):
    """The four codes of a b32 as f32 (bits 0-7 first); exact."""
    _dtype("unpack_fp8x4", dtype)
    require_fp8_target("unpack_fp8x4")
    w = as_value(word, b32)
    if w.type != b32:
        current_builder().error(f"unpack_fp8x4 expects a b32 word of four codes, but got {w.type}",
                                hint="ty.bitcast(x, ty.b32) reinterprets an i32/u32")
    return emit("unpack_fp8", (w,), dtype=dtype)
