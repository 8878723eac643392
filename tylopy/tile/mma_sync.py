"""The warp-level MMA atoms ``mma.sync.aligned.m16n8k16`` and ``m16n8k8`` (f16/bf16 -> f32, sm_80+),
``ty.mma`` on their fragments, and the same-lane conversion of an f32 accumulator into the A
operand of the next MMA.

Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 / mma.m16n8k8 with floating point
type"; g = lane >> 2, t = lane & 3; register r holds two 16-bit elements, the lower column or
k in bits 0-15):

=========  ====================  =============================================  =============
operand    tile                  element (register r, half h)                    registers
=========  ====================  =============================================  =============
A k16      16 x 16 (M x K)       row g + 8 (r & 1), col 2t + h + 8 (r >> 1)      4 b32
B k16      16 x 8  (K x N)       k 2t + h + 8 r, n g                             2 b32
A k8       16 x 8  (M x K)       row g + 8 r, col 2t + h                         2 b32
B k8       8 x 8   (K x N)       k 2t + h, n g                                   1 b32
C/D        16 x 8  f32           row g + 8 (i >> 1), col 2t + (i & 1)            4 f32
A k32 fp8  16 x 32 (M x K)       row g + 8 (r & 1), col 4t + h + 16 (r >> 1)     4 b32
B k32 fp8  32 x 8  (K x N)       k 4t + h + 16 r, n g                            2 b32
=========  ====================  =============================================  =============

The fp8 atom ``MmaSyncAtom(ty.e4m3 or ty.e5m2, "m16n8k32", b_dtype=...)`` (sm_89+) holds four
8-bit codes per register, byte h (0-3) of register r; A and B may mix e4m3 and e5m2.

``atom.a_fragment(words)`` / ``b_fragment`` / ``c_fragment`` / ``zeros()`` wrap registers in
the atom's layouts; ``ldmatrix`` (``ty.ldmatrix``) gives exactly these words from shared
memory. Two adjacent 16x8 C atoms hold, in the same lanes, the 16x16 elements of a k16 A
operand: ``pack_operand_a`` rounds them to bf16/f16 and packs them, no shuffles.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import LayoutError
from ..language.proxy import RuntimeValue, as_value, emit
from ..ir.types import ScalarType, b32, bf16, e4m3, e5m2, f16, f32
from ..semantics.conversions import pack2_bits, unpack2_bits
from .fragment import Fragment, ownership_of
from .layouts import (MMA_SYNC_A, MMA_SYNC_A_K32, MMA_SYNC_B, MMA_SYNC_B_K32, MMA_SYNC_C, QUAD, Layout, Ownership,
                      tiled_mma_c)

A_OWNERSHIP = Ownership("quad", row_lanes=(1, 2), col_lanes=(4, 8, 16))
B_OWNERSHIP = Ownership("quad", row_lanes=(4, 8, 16), col_lanes=(1, 2))


def _mma_k8_a(w, lane, i):  # element i = 2 r + h
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >> 1), 2 * t + (i & 1)


def _mma_k8_b(w, lane, i):  # (k, n)
    g, t = lane >> 2, lane & 3
    return 2 * t + (i & 1), g


MMA_SYNC_K8_A = Layout("mma.m16n8k8 A 16-bit", (16, 8), 32, 4, _mma_k8_a)
MMA_SYNC_K8_B = Layout("mma.m16n8k8 B 16-bit", (8, 8), 32, 2, _mma_k8_b)

# shape -> (M, N, K), A layout, B layout
SHAPES = {
    "m16n8k16": ((16, 8, 16), MMA_SYNC_A, MMA_SYNC_B),
    "m16n8k8": ((16, 8, 8), MMA_SYNC_K8_A, MMA_SYNC_K8_B),
    "m16n8k32": ((16, 8, 32), MMA_SYNC_A_K32, MMA_SYNC_B_K32),  # fp8 (sm_89+)
}


@dataclass(frozen=True)
class MmaSyncAtom:
    """``mma.sync.aligned.{shape}.row.col.f32.{dtype}.{dtype}.f32``: D(16x8) = A(16xK) B(Kx8) + C, one warp.

    ``dtype``: ``ty.bf16`` or ``ty.f16`` (A and B); C and D are f32. ``shape``: "m16n8k16"
    (default) or "m16n8k8". Fragments: ``a_layout``/``b_layout``/``c_layout`` and their
    ownerships; ``a_fragment(words)``, ``b_fragment(words)``, ``c_fragment(values)``, ``zeros()``.
    """

    dtype: ScalarType = bf16
    shape: str = "m16n8k16"
    b_dtype: ScalarType | None = None  # None: dtype; fp8 atoms may mix e4m3 and e5m2

    def __post_init__(self):
        if self.dtype not in (bf16, f16, e4m3, e5m2):
            raise LayoutError(f"MmaSyncAtom dtype expects ty.bf16, ty.f16, ty.e4m3 or ty.e5m2, but got {self.dtype!r}")
        if self.shape not in SHAPES:
            raise LayoutError(f"MmaSyncAtom shape expects one of {', '.join(map(repr, SHAPES))}, "
                              f"but got {self.shape!r}")
        if self.dtype.is_fp8 != (self.shape == "m16n8k32"):
            raise LayoutError(f"MmaSyncAtom with {self.dtype} expects shape "
                              f"{'m16n8k32' if self.dtype.is_fp8 else 'm16n8k16 or m16n8k8'}, but got {self.shape!r}")
        if self.b_dtype is None:
            object.__setattr__(self, "b_dtype", self.dtype)
        if self.b_dtype != self.dtype and not (self.dtype.is_fp8 and self.b_dtype in (e4m3, e5m2)):
            raise LayoutError(f"MmaSyncAtom b_dtype expects {'e4m3 or e5m2' if self.dtype.is_fp8 else self.dtype} "
                              f"with dtype {self.dtype}, but got {self.b_dtype}")

    c_layout = MMA_SYNC_C

    @property
    def arch(self) -> str:
        return "sm_89" if self.dtype.is_fp8 else "sm_80"

    @property
    def pack(self) -> int:
        """Elements per A/B register: 2 (16-bit) or 4 (fp8)."""
        return 4 if self.dtype.is_fp8 else 2
    c_ownership = QUAD

    @property
    def mnk(self) -> tuple[int, int, int]:
        return SHAPES[self.shape][0]

    @property
    def a_layout(self) -> Layout:
        return SHAPES[self.shape][1]

    @property
    def b_layout(self) -> Layout:
        return SHAPES[self.shape][2]

    @property
    def a_ownership(self) -> Ownership:
        """Lanes that share a row of A (xor 1, 2: a quad) and a column (xor 4, 8, 16); both shapes."""
        return A_OWNERSHIP

    @property
    def b_ownership(self) -> Ownership:
        """Lanes that share a row (k) of B (xor 4, 8, 16) and a column (n: xor 1, 2); both shapes."""
        return B_OWNERSHIP

    @property
    def a_words(self) -> int:
        return self.a_layout.nvalues // self.pack

    @property
    def b_words(self) -> int:
        return self.b_layout.nvalues // self.pack

    @property
    def ptx_dtype(self) -> str:
        return self.dtype.name

    def __str__(self):
        return (f"mma.sync.aligned.{self.shape}.row.col.f32.{self.dtype.name}.{self.b_dtype.name}.f32 "
                f"({self.arch}+, one warp)")

    # -- fragments ---------------------------------------------------------------------------
    def a_fragment(self, words) -> Fragment:
        """This lane's A registers (b32 words, e.g. from ``ty.ldmatrix``) as the atom's A fragment."""
        return Fragment(_words(self, "A", words, self.a_words), self.a_ownership, self.a_layout, pack=self.pack,
                        dtype=self.dtype)

    def b_fragment(self, words) -> Fragment:
        """This lane's B registers (b32 words) as the atom's B fragment."""
        return Fragment(_words(self, "B", words, self.b_words), self.b_ownership, self.b_layout, pack=self.pack,
                        dtype=self.b_dtype)

    def c_fragment(self, values) -> Fragment:
        """This lane's four f32 accumulators (c0..c3) as a C fragment."""
        vals = tuple(values)
        if len(vals) != 4:
            raise LayoutError(f"{self.shape} c_fragment expects 4 f32 values, but got {len(vals)}")
        vals = tuple(as_value(v, f32) for v in vals)
        for i, v in enumerate(vals):
            if v.type != f32:
                raise LayoutError(f"{self.shape} c_fragment value {i} expects f32, but got {v.type}")
        return Fragment(vals, self.c_ownership, self.c_layout)

    def zeros(self) -> Fragment:
        """A traced C fragment of zeros."""
        z = as_value(0.0, f32)
        return Fragment((z,) * 4, self.c_ownership, self.c_layout)


def _words(atom: MmaSyncAtom, which: str, words, count: int) -> tuple:
    ws = tuple(words) if isinstance(words, (tuple, list)) else (words,)
    if len(ws) != count:
        raise LayoutError(f"{atom.shape} {which} expects {count} b32 word(s) per lane, but got {len(ws)}")
    out = []
    for i, w in enumerate(ws):
        if not isinstance(w, RuntimeValue):
            raise LayoutError(f"{atom.shape} {which} word {i} expects a run-time b32 value, but got {w!r}")
        if w.type != b32:
            raise LayoutError(f"{atom.shape} {which} word {i} expects b32 (two packed 16-bit values), "
                              f"but got {w.type}; ty.bitcast(x, ty.b32) reinterprets an i32/u32")
        out.append(w)
    return tuple(out)


def _pack_pairs(ops, vals, dtype):
    return [ops.pack2(vals[2 * r], vals[2 * r + 1], dtype) for r in range(len(vals) // 2)]


def pack_operand_a(atom: MmaSyncAtom, left: Fragment, right=None, k=None):
    """Same-lane C -> A conversion for the m16n8k16 atom.

    ``pack_operand_a(atom, left, right)``: two adjacent 16x8 C atoms (columns 0-7 and 8-15).
    ``pack_operand_a(atom, acc, m, k)``: from a tiled accumulator, M repetition ``m`` (zero-based)
    and the 16-column pair ``k`` (n atoms 2k and 2k+1).
    """
    if atom.shape != "m16n8k16":
        raise LayoutError(f"pack_operand_a expects an m16n8k16 atom (two C atoms make one 16x16 A), "
                          f"but got {atom.shape}")
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


def _check_operand(atom: MmaSyncAtom, name: str, f, layout: Layout, pack: int):
    if not isinstance(f, Fragment):
        raise LayoutError(f"mma {name} expects a Fragment (e.g. atom.{name.lower()}_fragment(words)), "
                          f"but got {type(f).__name__} {f!r}")
    if f.layout != layout or f.pack != pack:
        packed = "a packed " if pack == 2 else "a "
        raise LayoutError(f"mma with {atom.shape} {name} expects {packed}{layout} fragment, but got {f.layout}"
                          f"{' (pack=%d)' % f.pack if f.pack != pack else ''}")
    want = atom.b_dtype if name == "B" else atom.dtype
    if pack == 4 and f.dtype is not None and f.dtype != want:
        raise LayoutError(f"mma with {atom} expects {name} of {want} codes, but it holds {f.dtype}")
    if pack == 2 and f.dtype is not None and f.dtype != atom.dtype:
        raise LayoutError(f"mma with a {atom.dtype} atom expects {name} packed as {atom.dtype}, but it holds "
                          f"{f.dtype} values; round them to {atom.dtype} (pack_operand_a(atom, ...)), or use "
                          f"ty.MmaSyncAtom(ty.{f.dtype})")


def mma(atom: MmaSyncAtom, a: Fragment, b: Fragment, c: Fragment) -> Fragment:
    """D = A B + C for one atom: one ``mma.sync`` (traced), or the reference product (CPU).

    ``a``, ``b``: packed 16-bit fragments in ``atom.a_layout``/``b_layout`` (their dtype, when
    known, must be the atom's); ``c``: an f32 fragment in ``atom.c_layout``. Returns D in the
    C layout. Every lane of the warp must execute it (warp-uniform control flow).
    """
    if not isinstance(atom, MmaSyncAtom):
        raise LayoutError(f"mma expects an MmaSyncAtom first, but got {atom!r}")
    _check_operand(atom, "A", a, atom.a_layout, atom.pack)
    _check_operand(atom, "B", b, atom.b_layout, atom.pack)
    _check_operand(atom, "C", c, atom.c_layout, 1)
    if not (a.traced == b.traced == c.traced):
        raise LayoutError("mma cannot combine traced fragments with reference ones")
    if a.traced:
        for i, v in enumerate(c.values):
            if v.type != f32:
                raise LayoutError(f"mma C expects f32 accumulators, but register {i} is {v.type}")
        if atom.dtype.is_fp8:
            from ..language.fp8 import require_fp8_target
            require_fp8_target(f"mma with {atom}")
        extra = {"b_dtype": atom.b_dtype.name} if atom.b_dtype != atom.dtype else {}
        out = emit("mma_sync", (*a.values, *b.values, *c.values), dtype=atom.ptx_dtype, shape=atom.shape, **extra)
        return Fragment(out, QUAD, MMA_SYNC_C)
    A = unpack_tile(a, atom.dtype.name)
    B = unpack_tile(b, atom.b_dtype.name)
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
    if dtype in ("e4m3", "e5m2"):
        from ..semantics.fp8 import unpack_fp8
        parts = unpack_fp8(words, 4, dtype)
        elems = np.stack(parts, axis=-1).reshape(words.shape[0], words.shape[1] * 4)
    else:
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
