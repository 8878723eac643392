"""The warp-level MMA atom ``mma.sync.aligned.m16n8k16`` (sm_80+), and the same-lane conversion
of its f32 accumulator into the A operand of the next MMA.

Two adjacent 16x8 C atoms hold, in the same lanes, exactly the 16x16 elements the A operand
needs (PTX ISA fragment tables for m16n8k16): C0's (c0, c1) and (c2, c3) become a0 and a1, C1's
become a2 and a3. ``pack_operand_a`` rounds those eight f32 values to bf16/f16 (nearest even)
and packs them into four b32 words: no shuffles, no bit reinterpretation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import LayoutError
from ..frontend.proxy import as_value, emit
from ..ir.types import ScalarType, bf16, f16, f32
from ..semantics.conversions import pack2_bits, unpack2_bits
from .fragment import Fragment, ownership_of
from .layouts import MMA_SYNC_A, MMA_SYNC_B, MMA_SYNC_C, QUAD, Ownership, tiled_mma_c

A_OWNERSHIP = Ownership("quad", row_lanes=(1, 2), col_lanes=(4, 8, 16))
B_OWNERSHIP = Ownership("quad", row_lanes=(4, 8, 16), col_lanes=(1, 2))


@dataclass(frozen=True)
class MmaSyncAtom:
    """mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32: D(16x8) = A(16x16) B(16x8) + C."""

    dtype: ScalarType = bf16

    def __post_init__(self):
        if self.dtype not in (bf16, f16):
            raise LayoutError(f"MmaSyncAtom dtype expects bf16 or f16, but got {self.dtype}")

    shape = (16, 8, 16)
    arch = "sm_80"
    a_layout = MMA_SYNC_A
    b_layout = MMA_SYNC_B
    c_layout = MMA_SYNC_C

    def __str__(self):
        t = self.dtype.name
        return f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 (sm_80+, one warp)"

    @property
    def ptx_dtype(self) -> str:
        return self.dtype.name


def _pack_pairs(ops, vals, dtype):
    return [ops.pack2(vals[2 * r], vals[2 * r + 1], dtype) for r in range(len(vals) // 2)]


def pack_operand_a(atom: MmaSyncAtom, left: Fragment, right=None, k=None):
    """Same-lane C -> A conversion.

    ``pack_operand_a(atom, left, right)``: two adjacent 16x8 C atoms (columns 0-7 and 8-15).
    ``pack_operand_a(atom, acc, m, k)``: from a tiled accumulator, M repetition ``m`` (zero-based)
    and the 16-column pair ``k`` (n atoms 2k and 2k+1).
    """
    if isinstance(right, Fragment):
        for name, f in (("left", left), ("right", right)):
            if f.layout != MMA_SYNC_C:
                raise LayoutError(f"pack_operand_a {name} expects a {MMA_SYNC_C} fragment, but got {f.layout}")
        vals = list(left.values) + list(right.values)
        ops = left.ops
    else:
        m = right
        acc = left
        tiling = acc.layout.tiling
        if not tiling or tiling[0] != "mma_c":
            raise LayoutError(f"pack_operand_a expects a tiled mma.m16n8k16 accumulator, but got {acc.layout}")
        _, m_reps, n_reps, warps_m, warps_n = tiling
        if warps_n != 1:
            raise LayoutError(f"pack_operand_a: the accumulator is spread over {warps_n} N warps; the A operand of "
                              "one warp needs all 16 columns in that warp (use warps_n = 1)")
        if n_reps % 2:
            raise LayoutError(f"pack_operand_a: the accumulator has {n_reps} N atoms; they must pair up into "
                              "16-column blocks (an unpaired N atom has no partner)")
        if not isinstance(m, int) or not 0 <= m < m_reps:
            raise LayoutError(f"pack_operand_a m expects 0..{m_reps - 1}, but got {m!r}")
        if not isinstance(k, int) or not 0 <= k < n_reps // 2:
            raise LayoutError(f"pack_operand_a k expects 0..{n_reps // 2 - 1}, but got {k!r}")
        base = (m * n_reps + 2 * k) * 4
        vals = list(acc.values[base:base + 8])
        ops = acc.ops
    words = _pack_pairs(ops, vals, atom.dtype)
    return Fragment(tuple(words), A_OWNERSHIP, MMA_SYNC_A, pack=2, dtype=atom.dtype)


def mma(atom: MmaSyncAtom, a: Fragment, b: Fragment, c: Fragment) -> Fragment:
    """D = A B + C for one atom (traced: one ``mma.sync``; reference: exact products, f32 result)."""
    if a.layout != MMA_SYNC_A or a.pack != 2:
        raise LayoutError(f"mma A expects a packed {MMA_SYNC_A} fragment, but got {a.layout}")
    if b.layout != MMA_SYNC_B or b.pack != 2:
        raise LayoutError(f"mma B expects a packed {MMA_SYNC_B} fragment, but got {b.layout}")
    if c.layout != MMA_SYNC_C:
        raise LayoutError(f"mma C expects a {MMA_SYNC_C} fragment, but got {c.layout}")
    if a.traced:
        out = emit("mma_sync", (*a.values, *b.values, *c.values), dtype=atom.ptx_dtype)
        return Fragment(out, QUAD, MMA_SYNC_C)
    A = unpack_tile(a, atom.dtype.name)
    B = unpack_tile(b, atom.dtype.name)
    C = gather_tile(c)
    D = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(np.float32)
    return scatter_tile(D, MMA_SYNC_C, QUAD)


def gather_tile(f: Fragment) -> np.ndarray:
    """Reference fragment -> its logical tile (every lane's registers placed by the layout)."""
    t = f.layout.table
    out = np.zeros(f.layout.shape, dtype=np.float32)
    data = f.data if f.layout.threads > 1 else np.asarray(f.data)[None, :]
    out[t[..., 0], t[..., 1]] = data
    return out


def unpack_tile(f: Fragment, dtype: str) -> np.ndarray:
    words = np.stack([np.asarray(c, dtype=np.uint32) for c in f.values], axis=1)
    lo, hi = unpack2_bits(words, dtype)
    elems = np.empty((words.shape[0], words.shape[1] * 2), dtype=np.float32)
    elems[:, 0::2], elems[:, 1::2] = lo, hi
    t = f.layout.table
    out = np.zeros(f.layout.shape, dtype=np.float32)
    out[t[..., 0], t[..., 1]] = elems
    return out


def scatter_tile(tile: np.ndarray, layout, ownership) -> Fragment:
    """Logical tile -> reference fragment in ``layout``."""
    t = layout.table
    return Fragment(np.asarray(tile, dtype=np.float32)[t[..., 0], t[..., 1]], ownership, layout)


def operand_from_tile(tile: np.ndarray, layout, ownership, dtype: str) -> Fragment:
    """A 16-bit operand tile -> packed reference fragment (register r = elements 2r, 2r+1)."""
    t = layout.table
    elems = np.asarray(tile, dtype=np.float32)[t[..., 0], t[..., 1]]
    words = pack2_bits(elems[:, 0::2], elems[:, 1::2], dtype)
    return Fragment(words, ownership, layout, pack=2)


def accumulator(m_reps: int = 1, n_reps: int = 1, value: float = 0.0, warps_m: int = 1, warps_n: int = 1) -> Fragment:
    """A traced f32 accumulator tiled over (m_reps x n_reps) atoms, filled with ``value``."""
    layout = tiled_mma_c(m_reps, n_reps, warps_m, warps_n)
    v = as_value(float(value), f32)
    own = QUAD if warps_m == warps_n == 1 else ownership_of(layout)
    return Fragment((v,) * layout.nvalues, own, layout)
