"""Oracles for the fragment tests, written from the PTX ISA (not from our code).

Every (thread, value) of every atom layout, as an independent table: the ISA's fragment tables for
mma.sync (quoted above each oracle), and for the wgmma layouts, which the ISA gives only as
figures, two oracles that must agree: the figure's per-warp description and CuTe's
``CLayout_64xN`` / ``ALayout_64x16`` evaluated as CuTe layouts. Shared by
tests/test_fragments_layouts.py, test_fragments_reductions.py and test_fragments_packing.py.

Element numbering: tylopy numbers the 16-bit elements of an operand e = 2*register + half
(register r holds elements 2r in bits 0-15 and 2r+1 in bits 16-31). PTX names the A elements
a0..a7 "low to high" in that same order (a0, a1 share the first .f16x2 register), so e == PTX's i.
"""
from __future__ import annotations

import math

import numpy as np

import tylopy as ty
from tylopy.tile import mma_sync, wgmma

# -- oracles from the PTX ISA ---------------------------------------------------------------------
#
# PTX ISA 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type". Each oracle
# below is the ISA's case analysis written out literally (per lane, per element), so that it
# shares no arithmetic shortcut with the code under test.


def isa_mma_a() -> np.ndarray:
    """Multiplicand A, .f16/.bf16: [32 lanes, 8 elements, (row, col)].

    ISA: "A vector expression containing four .f16x2 registers, with each register containing
    two .f16 / .bf16 elements from the matrix A. | a0, a1, a2, a3, a4, a5, a6, a7"

        groupID           = %laneid >> 2
        threadID_in_group = %laneid % 4
        row =      groupID            for ai where  0 <= i < 2 || 4 <= i < 6
                   groupID + 8         Otherwise
        col =  (threadID_in_group * 2) + (i & 0x1)          for ai where i <  4
               (threadID_in_group * 2) + (i & 0x1) + 8      for ai where i >= 4
    """
    t = np.zeros((32, 8, 2), dtype=np.int64)
    for laneid in range(32):
        group_id, thread_id_in_group = laneid >> 2, laneid % 4
        for i in range(8):
            row = group_id if (0 <= i < 2 or 4 <= i < 6) else group_id + 8
            col = (thread_id_in_group * 2) + (i & 0x1) if i < 4 else (thread_id_in_group * 2) + (i & 0x1) + 8
            t[laneid, i] = row, col
    return t


def isa_mma_b() -> np.ndarray:
    """Multiplicand B, .f16/.bf16: [32 lanes, 4 elements, (row = k, col = n)].

    ISA: "A vector expression containing two .f16x2 registers, with each register containing two
    .f16 / .bf16 elements from the matrix B. | b0, b1, b2, b3"

        row =  (threadID_in_group * 2) + (i & 0x1)           for bi where i <  2
               (threadID_in_group * 2) + (i & 0x1) + 8       for bi where i >= 2
        col = groupID
    """
    t = np.zeros((32, 4, 2), dtype=np.int64)
    for laneid in range(32):
        group_id, thread_id_in_group = laneid >> 2, laneid % 4
        for i in range(4):
            row = (thread_id_in_group * 2) + (i & 0x1) if i < 2 else (thread_id_in_group * 2) + (i & 0x1) + 8
            t[laneid, i] = row, group_id
    return t


def isa_mma_c() -> np.ndarray:
    """Accumulators C/D, .f32: [32 lanes, 4 values, (row, col)].

    ISA: "A vector expression containing four .f32 registers ... c0, c1, c2, c3"

        row =      groupID                               for ci where i <  2
                   groupID + 8                           for ci where i >= 2
        col =  (threadID_in_group * 2) + (i & 0x1)       for ci where i = {0,..,3}
    """
    t = np.zeros((32, 4, 2), dtype=np.int64)
    for laneid in range(32):
        group_id, thread_id_in_group = laneid >> 2, laneid % 4
        for i in range(4):
            row = group_id if i < 2 else group_id + 8
            t[laneid, i] = row, (thread_id_in_group * 2) + (i & 0x1)
    return t


def tiled_c_oracle(m_reps: int, n_reps: int, warps_m: int, warps_n: int) -> np.ndarray:
    """The ISA C atom repeated as ``tiled_mma_c`` documents its tiling (a tylopy convention, not PTX):
    value v = (m_rep * n_reps + n_rep) * 4 + i, warp w covers M block w % warps_m, N block w // warps_m."""
    c = isa_mma_c()
    out = np.zeros((32 * warps_m * warps_n, 4 * m_reps * n_reps, 2), dtype=np.int64)
    for w in range(warps_m * warps_n):
        wm, wn = w % warps_m, w // warps_m
        for mr in range(m_reps):
            for nr in range(n_reps):
                v0 = (mr * n_reps + nr) * 4
                out[32 * w:32 * w + 32, v0:v0 + 4, 0] = c[:, :, 0] + 16 * (wm * m_reps + mr)
                out[32 * w:32 * w + 32, v0:v0 + 4, 1] = c[:, :, 1] + 8 * (wn * n_reps + nr)
    return out


# PTX ISA 9.7.15.5.1.1.1 "Matrix Fragments for wgmma.mma_async.m64nNk16". The ISA gives these
# layouts only as figures:
#   Accumulator D, .f32: "A vector expression containing N/2 number of .f32 registers.
#   | d0, d1, d2, d3, ..., dX, dY, dZ, dW" -- Figure 149 "WGMMA .m64nNk16 register fragment layout
#   for accumulator matrix D": warp w of the warpgroup (%warpid % 4) holds rows 16w..16w+15 (the
#   sparse-wgmma section states the same assignment in words: "%warpid % 4 = 0 | 0-15", "= 1 |
#   16-31", ...); inside them, each 8-column block j holds d[4j..4j+3] exactly as the mma.m16n8
#   C/D figure places c0..c3 (T0: d0 d1 on row 0, d2 d3 on row 8, then d4 d5 at columns 8, 9...).
#   Multiplicand A in registers: "four .f16x2 registers ... a0, a1, a2, a3, a4, a5, a6, a7" --
#   Figure 148 "WGMMA .m64nNk16 register fragment layout for matrix A": warp w holds rows
#   16w..16w+15 placed as the mma.m16n8k16 A figure places a0..a7.
# Second, independent source: CUTLASS's cute/atom/mma_traits_sm90_gmma.hpp
#   CLayout_64xN  = Layout<Shape <Shape <  _4,_8, _4>,Shape < _2,_2, N/8>>,
#                          Stride<Stride<_128,_1,_16>,Stride<_64,_8,_512>>>;
#   ALayout_64x16 = CLayout_64x16;
# a (thread, value) -> column-major (m + 64 * n) map, evaluated below by CuTe's rules.


def figure_wgmma_d(n: int) -> np.ndarray:
    """Figure 149, as described above: [128 threads, N/2 values, (row, col)]."""
    c = isa_mma_c()
    out = np.zeros((128, n // 2, 2), dtype=np.int64)
    for w in range(4):
        for j in range(n // 8):
            out[32 * w:32 * w + 32, 4 * j:4 * j + 4, 0] = c[:, :, 0] + 16 * w
            out[32 * w:32 * w + 32, 4 * j:4 * j + 4, 1] = c[:, :, 1] + 8 * j
    return out


def figure_wgmma_a() -> np.ndarray:
    """Figure 148, as described above: [128 threads, 8 elements, (row, col)]."""
    a = isa_mma_a()
    out = np.zeros((128, 8, 2), dtype=np.int64)
    for w in range(4):
        out[32 * w:32 * w + 32, :, 0] = a[:, :, 0] + 16 * w
        out[32 * w:32 * w + 32, :, 1] = a[:, :, 1]
    return out


def cute_eval(shape: tuple, stride: tuple, index: int) -> int:
    """A flat CuTe layout (shape, stride) at a 1-D index: colexicographic (first mode fastest)."""
    offset = 0
    for s, d in zip(shape, stride):
        offset += (index % s) * d
        index //= s
    return offset


def cute_tv_table(thr_shape, thr_stride, val_shape, val_stride, rows: int) -> np.ndarray:
    threads, values = math.prod(thr_shape), math.prod(val_shape)
    out = np.zeros((threads, values, 2), dtype=np.int64)
    for th in range(threads):
        for v in range(values):
            off = cute_eval(thr_shape, thr_stride, th) + cute_eval(val_shape, val_stride, v)
            out[th, v] = off % rows, off // rows  # column-major (M, N) codomain
    return out


def cute_clayout_64xn(n: int) -> np.ndarray:
    return cute_tv_table((4, 8, 4), (128, 1, 16), (2, 2, n // 8), (64, 8, 512), 64)


def cute_alayout_64x16() -> np.ndarray:
    return cute_tv_table((4, 8, 4), (128, 1, 16), (2, 2, 2), (64, 8, 512), 64)


WGMMA_NS = list(range(8, 257, 8))
TILINGS = [(1, 1, 1, 1), (2, 1, 1, 1), (1, 4, 1, 1), (2, 4, 1, 1), (3, 2, 1, 1), (1, 2, 2, 1), (2, 2, 4, 1),
           (1, 1, 1, 2), (2, 2, 2, 2), (1, 3, 1, 4)]

ATOMS = {  # name: (layout under test, oracle, declared ownership)
    "mma_sync_A": (ty.MMA_SYNC_A, isa_mma_a, mma_sync.A_OWNERSHIP),
    "mma_sync_B": (ty.MMA_SYNC_B, isa_mma_b, mma_sync.B_OWNERSHIP),
    "mma_sync_C": (ty.MMA_SYNC_C, isa_mma_c, ty.QUAD),
    "wgmma_A_RS": (ty.WGMMA_A_RS, figure_wgmma_a, wgmma.RS_A_OWNERSHIP),
}


def all_layout_cases():
    """(id, layout, oracle table) for every atom, every wgmma N and every tiling."""
    cases = [(name, lay, fn()) for name, (lay, fn, _) in ATOMS.items()]
    cases += [(f"wgmma_acc{n}", ty.wgmma_acc(n), figure_wgmma_d(n)) for n in WGMMA_NS]
    cases += [(f"tiled{t}", ty.tiled_mma_c(*t), tiled_c_oracle(*t)) for t in TILINGS]
    return cases


LAYOUT_CASES = all_layout_cases()


# -- reference fragments from a tile ---------------------------------------------------------------

def fragment_from_tile(tile: np.ndarray, layout, ownership, oracle: np.ndarray) -> ty.Fragment:
    """A reference fragment whose (thread, value) holds tile[oracle[thread, value]]."""
    data = np.asarray(tile, dtype=np.float32)[oracle[..., 0], oracle[..., 1]]
    return ty.Fragment(data, ownership, layout)


def random_tile(rng, shape, masked=0.0):
    tile = (rng.standard_normal(shape) * 2.0).astype(np.float32)
    if masked:
        tile[rng.random(shape) < masked] = -np.inf
    return tile
