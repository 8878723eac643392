"""Type rules of the warp-level matrix instructions: mma.sync, ldmatrix, stmatrix.

``mma_sync`` operands: A words, B words (b32, two 16-bit values each), then the 4 f32
accumulators; attributes ``shape`` ("m16n8k16" or "m16n8k8") and ``dtype`` ("bf16" or "f16").
``ldmatrix`` (shared pointer) gives ``num`` (1, 2 or 4) b32 words; ``stmatrix`` takes a shared
pointer and ``num`` words; both have a ``trans`` bool attribute (PTX ISA, "ldmatrix",
"stmatrix"; stmatrix is sm_90+, which the frontend checks).
"""
from __future__ import annotations

from ..types import PointerType, b32, f32
from .base import expect

# (A words, B words) per shape; the f32 accumulator is 4 registers for both.
MMA_SHAPES = {"m16n8k16": (4, 2), "m16n8k8": (2, 1), "m16n8k32": (4, 2)}  # m16n8k32: fp8 (four codes a word)


def _mma_sync(ts, attrs):
    shape = attrs.get("shape", "m16n8k16")
    expect(shape in MMA_SHAPES, f"mma_sync shape expects one of {', '.join(MMA_SHAPES)}, but got {shape!r}")
    dt, bt = attrs.get("dtype"), attrs.get("b_dtype", attrs.get("dtype"))
    fp8 = ("e4m3", "e5m2")
    if shape == "m16n8k32":
        expect(dt in fp8 and bt in fp8, f"mma_sync m16n8k32 expects e4m3/e5m2 operands, but got {dt!r}/{bt!r}")
    else:
        expect(dt in ("bf16", "f16") and bt == dt, f"mma_sync dtype expects 'bf16' or 'f16', but got {dt!r}")
    na, nb = MMA_SHAPES[shape]
    expect(len(ts) == na + nb + 4, f"mma_sync {shape} expects {na} A words, {nb} B words and 4 accumulators, "
                                   f"but got {len(ts)} operands")
    expect(all(t == b32 for t in ts[:na + nb]), "mma_sync A and B expect b32 words")
    expect(all(t == f32 for t in ts[na + nb:]), "mma_sync accumulators expect f32")
    return (f32,) * 4


def _ldmatrix(ts, attrs):
    expect(len(ts) == 1 and isinstance(ts[0], PointerType) and ts[0].space == "shared",
            f"ldmatrix expects a shared pointer, but got {ts}")
    num = attrs.get("num")
    expect(num in (1, 2, 4), f"ldmatrix num expects 1, 2 or 4, but got {num!r}")
    expect(isinstance(attrs.get("trans", False), bool), f"ldmatrix trans expects a bool, but got {attrs.get('trans')!r}")
    return (b32,) * num




def _stmatrix(ts, attrs):
    num = attrs.get("num")
    expect(num in (1, 2, 4), f"stmatrix num expects 1, 2 or 4, but got {num!r}")
    expect(len(ts) == 1 + num and isinstance(ts[0], PointerType) and ts[0].space == "shared",
           f"stmatrix expects (shared pointer, {num} b32 words), but got {', '.join(map(str, ts))}")
    expect(all(t == b32 for t in ts[1:]), "stmatrix expects b32 words")
    expect(isinstance(attrs.get("trans", False), bool), f"stmatrix trans expects a bool, but got {attrs.get('trans')!r}")
    return ()


RULES = {"mma_sync": _mma_sync, "ldmatrix": _ldmatrix, "stmatrix": _stmatrix}
SIDE_EFFECTS = frozenset({"mma_sync", "ldmatrix", "stmatrix"})
