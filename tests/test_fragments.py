"""Fragments against the PTX ISA, lane by lane (CPU tier).

Every (thread, value) of every atom layout is compared with an oracle written here from the PTX
ISA's fragment tables (quoted above each oracle), never from ``tylopy/ir/layouts.py``; the wgmma
layouts, which the ISA gives only as figures, get two oracles that must agree: the figure's
per-warp description and CuTe's ``CLayout_64xN`` / ``ALayout_64x16`` evaluated as CuTe layouts.
Then the CPU reference semantics of the fragment ops are checked on random data against numpy:
reductions, the online softmax state (against a float64 oracle of the recurrence), the same-lane
C -> A conversion (against torch's round-to-nearest-even and hand-written bit patterns), the
mma.sync reference, and the wgmma shared-memory descriptor.

Element numbering: tylopy numbers the 16-bit elements of an operand e = 2*register + half
(register r holds elements 2r in bits 0-15 and 2r+1 in bits 16-31). PTX names the A elements
a0..a7 "low to high" in that same order (a0, a1 share the first .f16x2 register), so e == PTX's i.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.errors import LayoutError, OwnershipError
from tylopy.tile import mma_sync, wgmma
from tylopy.tile.layouts import Ownership
from tylopy.tile.mma_sync import gather_tile

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


# -- layouts: every (thread, value) ---------------------------------------------------------------

@pytest.mark.parametrize("name,layout,oracle", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
def test_layout_table_matches_the_isa(name, layout, oracle):
    assert layout.table.shape == oracle.shape
    bad = np.argwhere((layout.table != oracle).any(axis=-1))
    assert bad.size == 0, "first mismatches (thread, value): " + ", ".join(
        f"T{th}:{v} tylopy {tuple(layout.table[th, v])} ISA {tuple(oracle[th, v])}" for th, v in bad[:8])
    for th in range(oracle.shape[0]):  # the traced path (coord on ints) agrees with the table
        w, lane = divmod(th, 32)
        for v in (0, oracle.shape[1] - 1):
            assert tuple(layout.coord(w, lane, v)) == tuple(oracle[th, v])


@pytest.mark.parametrize("name,layout,oracle", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
def test_layout_is_a_bijection_onto_its_tile(name, layout, oracle):
    rows, cols = layout.shape
    assert layout.threads * layout.nvalues == rows * cols
    hits = np.zeros((rows, cols), dtype=np.int64)
    np.add.at(hits, (oracle[..., 0], oracle[..., 1]), 1)
    assert (hits == 1).all(), f"{name}: elements held {hits.min()}..{hits.max()} times"


@pytest.mark.parametrize("n", WGMMA_NS)
def test_wgmma_accumulator_figure_agrees_with_cute(n):
    """The two independent readings of the wgmma accumulator are the same map."""
    np.testing.assert_array_equal(figure_wgmma_d(n), cute_clayout_64xn(n))


def test_wgmma_register_a_figure_agrees_with_cute():
    np.testing.assert_array_equal(figure_wgmma_a(), cute_alayout_64x16())


# -- ownership: derived from the oracle --------------------------------------------------------------

def _xor_span(masks):
    span = {0}
    for m in masks:
        span |= {x ^ m for x in span}
    return span


def derived_sharing(oracle: np.ndarray, axis: int) -> tuple[tuple[int, ...], int]:
    """(lane xor masks, number of warps) of the threads that hold one logical row (axis 0) or column
    (axis 1); the same for every row/column, else the layout has no single ownership."""
    holders = defaultdict(set)
    for th in range(oracle.shape[0]):
        for x in oracle[th, :, axis]:
            holders[int(x)].add(th)
    found = set()
    for ths in holders.values():
        warps = sorted({th // 32 for th in ths})
        per_warp = set()
        for w in warps:
            lanes = sorted(th % 32 for th in ths if th // 32 == w)
            diffs = {l ^ lanes[0] for l in lanes}
            masks = tuple(m for m in (1, 2, 4, 8, 16) if m in diffs)
            assert diffs == _xor_span(masks), f"lanes {lanes} sharing a line are not an xor subspace"
            per_warp.add(masks)
        assert len(per_warp) == 1
        found.add((per_warp.pop(), len(warps)))
    assert len(found) == 1, f"lines shared differently: {found}"
    return found.pop()


OWNERSHIP_CASES = [(name, fn(), own) for name, (_, fn, own) in ATOMS.items()]
OWNERSHIP_CASES += [(f"wgmma_acc{n}", figure_wgmma_d(n), ty.WARPGROUP) for n in (8, 64, 256)]


@pytest.mark.parametrize("name,oracle,declared", OWNERSHIP_CASES, ids=[c[0] for c in OWNERSHIP_CASES])
def test_declared_ownership_matches_the_isa(name, oracle, declared):
    row_lanes, row_warps = derived_sharing(oracle, 0)
    col_lanes, col_warps = derived_sharing(oracle, 1)
    assert (row_lanes, col_lanes) == (declared.row_lanes, declared.col_lanes)
    assert (row_warps, col_warps) == (declared.row_warps, declared.col_warps)


def test_ownership_constants_are_the_documented_ones():
    assert (ty.QUAD.row_lanes, ty.QUAD.col_lanes, ty.QUAD.col_warps) == ((1, 2), (4, 8, 16), 1)
    assert (ty.WARPGROUP.row_lanes, ty.WARPGROUP.col_lanes, ty.WARPGROUP.col_warps) == ((1, 2), (4, 8, 16), 4)
    assert ty.WARP.row_lanes == (1, 2, 4, 8, 16)


@pytest.mark.parametrize("tiling", TILINGS, ids=[str(t) for t in TILINGS])
def test_tiled_accumulator_rows_are_quads(tiling):
    m_reps, n_reps, warps_m, warps_n = tiling
    oracle = tiled_c_oracle(*tiling)
    assert derived_sharing(oracle, 0) == (ty.QUAD.row_lanes, warps_n)
    assert derived_sharing(oracle, 1) == (ty.QUAD.col_lanes, warps_m)


# -- lane maps ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,layout,oracle", [c for c in LAYOUT_CASES if c[0] in (
    "mma_sync_A", "mma_sync_B", "mma_sync_C", "wgmma_A_RS", "wgmma_acc64", "tiled(2, 2, 2, 2)")])
def test_lane_map_renders_every_element(name, layout, oracle):
    rows, cols = layout.shape
    text = layout.lane_map(max_cols=cols)
    lines = text.splitlines()
    assert lines[0] == str(layout)
    want = {}
    for th, v in itertools.product(range(oracle.shape[0]), range(oracle.shape[1])):
        want[tuple(oracle[th, v])] = f"T{th}:{v}"
    assert want[(0, 0)] == "T0:0"
    grid = [line.split() for line in lines[2:]]
    assert len(grid) == rows
    for r, cells in enumerate(grid):
        assert int(cells[0]) == r and len(cells) == cols + 1, f"row {r}: {cells}"
        for c, cell in enumerate(cells[1:]):
            assert cell == want[(r, c)], f"({r}, {c}) shows {cell}, the ISA says {want[(r, c)]}"


def test_lane_map_of_mma_c_shows_quads():
    text = ty.MMA_SYNC_C.lane_map()
    assert "T0:0" in text and "T31:3" in text and "." not in text.split("\n", 1)[1]


# -- reference reductions -----------------------------------------------------------------------------

def fragment_from_tile(tile: np.ndarray, layout, ownership, oracle: np.ndarray) -> ty.Fragment:
    """A reference fragment whose (thread, value) holds tile[oracle[thread, value]]."""
    data = np.asarray(tile, dtype=np.float32)[oracle[..., 0], oracle[..., 1]]
    return ty.Fragment(data, ownership, layout)


def random_tile(rng, shape, masked=0.0):
    tile = (rng.standard_normal(shape) * 2.0).astype(np.float32)
    if masked:
        tile[rng.random(shape) < masked] = -np.inf
    return tile


REDUCE_CASES = [  # (id, layout, ownership, oracle, dims allowed)
    ("mma_c", ty.MMA_SYNC_C, ty.QUAD, isa_mma_c(), (1, 2)),
    ("tiled_2x4", ty.tiled_mma_c(2, 4), ty.QUAD, tiled_c_oracle(2, 4, 1, 1), (1, 2)),
    ("tiled_1x2_wm4", ty.tiled_mma_c(1, 2, 4, 1), ty.QUAD, tiled_c_oracle(1, 2, 4, 1), (2,)),
    ("wgmma8", ty.wgmma_acc(8), ty.WARPGROUP, figure_wgmma_d(8), (2,)),
    ("wgmma64", ty.wgmma_acc(64), ty.WARPGROUP, figure_wgmma_d(64), (2,)),
    ("wgmma256", ty.wgmma_acc(256), ty.WARPGROUP, figure_wgmma_d(256), (2,)),
]
REDUCE_PARAMS = [(cid, lay, own, orc, dims, op) for cid, lay, own, orc, dl in REDUCE_CASES for dims in dl
                 for op in ("sum", "max", "min")]

NP_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


@pytest.mark.parametrize("cid,layout,own,oracle,dims,op", REDUCE_PARAMS,
                         ids=[f"{p[0]}-dims{p[4]}-{p[5]}" for p in REDUCE_PARAMS])
def test_reduce_matches_numpy_in_every_lane(cid, layout, own, oracle, dims, op):
    rng = np.random.default_rng(hash((cid, dims, op)) % 2**32)
    tile = random_tile(rng, layout.shape, masked=0.1 if op == "max" else 0.0)
    frag = fragment_from_tile(tile, layout, own, oracle)
    np.testing.assert_array_equal(gather_tile(frag), tile)
    red = frag.reduce(op, dims)
    axis = 1 if dims == 2 else 0  # dims=2 reduces over a row's columns
    want = NP_REDUCE[op](tile.astype(np.float64), axis=axis)
    got = red.data  # (threads, slots)
    line = red.layout.table[..., 0 if dims == 2 else 1]  # which row/column each (thread, slot) holds
    assert got.shape == line.shape
    for th in range(layout.threads):  # every thread holds exactly the rows (columns) the ISA gives it
        assert set(line[th]) == set(oracle[th, :, 0 if dims == 2 else 1])
    if op == "sum":
        n = tile.shape[axis]
        bound = n * 2.0 ** -24 * np.abs(tile.astype(np.float64)).sum(axis=axis)
        err = np.abs(got - want[line])
        assert (err <= bound[line]).all(), f"sum off by {err.max()} (bound {bound.max()})"
    else:
        np.testing.assert_array_equal(got, want[line].astype(np.float32))
    assert red.ownership.kind == "reduced"


def test_reduce_across_warps_is_refused():
    frag = fragment_from_tile(np.ones((64, 32), np.float32), ty.wgmma_acc(32), ty.WARPGROUP, figure_wgmma_d(32))
    with pytest.raises(OwnershipError, match=r"dims=1 .*spans 4 warps"):
        frag.reduce("sum", dims=1)
    state = ty.SoftmaxState(frag, dims=1)
    with pytest.raises(OwnershipError, match="4 warps"):
        ty.softmax_update(state, frag)


def test_reduce_rejects_bad_arguments():
    frag = fragment_from_tile(np.ones((16, 8), np.float32), ty.MMA_SYNC_C, ty.QUAD, isa_mma_c())
    with pytest.raises(ValueError, match="reduce op expects"):
        frag.reduce("mean", 2)
    with pytest.raises(ValueError, match="reduce dims expects"):
        frag.reduce("sum", 3)


def test_combining_different_ownership_names_both():
    layout = ty.wgmma_acc(16)
    tile = np.ones(layout.shape, np.float32)
    a = fragment_from_tile(tile, layout, ty.WARPGROUP, figure_wgmma_d(16))
    b = fragment_from_tile(tile, layout, ty.QUAD, figure_wgmma_d(16))
    with pytest.raises(OwnershipError) as err:
        a + b
    assert str(ty.WARPGROUP) in str(err.value) and str(ty.QUAD) in str(err.value)


def test_broadcasting_a_summary_of_other_rows_is_refused():
    rng = np.random.default_rng(7)
    small = fragment_from_tile(random_tile(rng, (16, 8)), ty.MMA_SYNC_C, ty.QUAD, isa_mma_c())
    big = fragment_from_tile(random_tile(rng, (32, 8)), ty.tiled_mma_c(2, 1), ty.QUAD, tiled_c_oracle(2, 1, 1, 1))
    row_max = small.reduce("max", 2)
    with pytest.raises(OwnershipError, match="rows"):
        big * row_max
    with pytest.raises(OwnershipError, match="rows"):
        ty.softmax_update(ty.SoftmaxState(small), big)
    local = ty.Fragment((1.0, 2.0), ty.LocalOwnership(2, 2)).reduce("max", 2)
    with pytest.raises(OwnershipError):
        small * local  # a lane-local summary never becomes a quad summary


def test_a_summary_of_the_same_rows_broadcasts():
    """A 32-column score accumulator and a 64-column output share rows, so they share a state."""
    rng = np.random.default_rng(8)
    s = fragment_from_tile(random_tile(rng, (64, 32)), ty.wgmma_acc(32), ty.WARPGROUP, figure_wgmma_d(32))
    o_tile = random_tile(rng, (64, 64))
    o = fragment_from_tile(o_tile, ty.wgmma_acc(64), ty.WARPGROUP, figure_wgmma_d(64))
    row_max = s.reduce("max", 2)
    want = o_tile * gather_tile(s).max(axis=1, keepdims=True)
    np.testing.assert_array_equal(gather_tile(o * row_max), want)


MISDECLARED = [  # (id, layout, declared ownership, oracle, dims)
    ("QUAD-on-2-N-warps-dims2", ty.tiled_mma_c(1, 1, 1, 2), ty.QUAD, tiled_c_oracle(1, 1, 1, 2), 2),
    ("QUAD-on-2-M-warps-dims1", ty.tiled_mma_c(1, 1, 2, 1), ty.QUAD, tiled_c_oracle(1, 1, 2, 1), 1),
    ("QUAD-on-wgmma-dims1", ty.wgmma_acc(16), ty.QUAD, figure_wgmma_d(16), 1),
    ("no-col-lanes-on-mma-C-dims1", ty.MMA_SYNC_C, Ownership("quad", (1, 2), ()), isa_mma_c(), 1),
]


@pytest.mark.parametrize("cid,layout,own,oracle,dims", MISDECLARED, ids=[c[0] for c in MISDECLARED])
def test_misdeclared_ownership_is_refused(cid, layout, own, oracle, dims):
    """A reduction over lanes or warps the declaration leaves out must fail, not return partials:
    wrong lanes are refused when the fragment is built, rows or columns spread over warps when reduced."""
    rng = np.random.default_rng(9)
    with pytest.raises(OwnershipError):
        frag = fragment_from_tile(random_tile(rng, layout.shape), layout, own, oracle)
        frag.reduce("max", dims)


# -- online softmax: float64 oracle of the recurrence ----------------------------------------------------

class OnlineSoftmax64:
    """The seed's recurrence per row, in float64 with natural exp and explicit branches:
    m' = max(m, rowmax(x)); alpha = exp(s(m - m')); p = exp(s(x - m')); l' = alpha l + rowsum(p);
    the empty state is (-inf, 0) and an update that leaves m' = -inf gives alpha = 0, p = 0."""

    def __init__(self, rows: int, scale: float):
        self.m = np.full(rows, -np.inf)
        self.l = np.zeros(rows)
        self.scale = scale

    def update(self, x: np.ndarray):
        x = x.astype(np.float64)
        alpha = np.zeros(len(self.m))
        p = np.zeros_like(x)
        for r in range(len(self.m)):
            m_new = max(self.m[r], x[r].max())
            if m_new == -np.inf:  # nothing valid yet: zero weights, nothing to rescale
                alpha[r] = 0.0
                continue
            alpha[r] = 0.0 if self.m[r] == -np.inf else math.exp(self.scale * (self.m[r] - m_new))
            valid = x[r] != -np.inf
            p[r, valid] = np.exp(self.scale * (x[r, valid] - m_new))
            self.l[r] = alpha[r] * self.l[r] + p[r].sum()
            self.m[r] = m_new
        return alpha, p

    def lse(self):
        out = np.full(len(self.m), -np.inf)
        ok = self.l > 0
        out[ok] = self.scale * self.m[ok] + np.log(self.l[ok])
        return out


def summary_by_row(frag: ty.Fragment, dims: int = 2):
    """(data, the row/column each (thread, slot) holds) of a reduced fragment."""
    return frag.data, frag.layout.table[..., 0 if dims == 2 else 1]


def check_summary(frag, want, rtol, dims=2, atol=0.0):
    got, line = summary_by_row(frag, dims)
    w = want[line]
    assert not np.isnan(got).any()
    if rtol == 0:
        np.testing.assert_array_equal(got, w.astype(np.float32))
    else:
        np.testing.assert_allclose(got, w, rtol=rtol, atol=atol)


def check_full(frag, want, oracle, rtol, scale=None):
    """Every (thread, value) against ``want`` at the ISA position; ``scale`` (a tile of magnitudes,
    e.g. sum |p v| / l for a numerator that cancels) turns rtol into an absolute bound."""
    got = frag.data
    assert not np.isnan(got).any()
    at = (oracle[..., 0], oracle[..., 1])
    if scale is None:
        np.testing.assert_allclose(got, want[at], rtol=rtol, atol=1e-30)
    else:
        err = np.abs(got - want[at])
        assert (err <= rtol * scale[at]).all(), f"off by {np.max(err / np.maximum(scale[at], 1e-300))} of the magnitude"


def masked_tiles(rng, shape, n_tiles):
    """Random scores with ~20% -inf; row 0 masked everywhere, row 1 in the first tile only,
    row 2 in the last tile only."""
    tiles = [random_tile(rng, shape, masked=0.2) for _ in range(n_tiles)]
    for t in tiles:
        t[0] = -np.inf
    tiles[0][1] = -np.inf
    tiles[-1][2] = -np.inf
    return tiles


SOFTMAX_CASES = [
    ("mma_c", ty.MMA_SYNC_C, ty.QUAD, isa_mma_c()),
    ("tiled_2x4", ty.tiled_mma_c(2, 4), ty.QUAD, tiled_c_oracle(2, 4, 1, 1)),
    ("tiled_1x2_wm2", ty.tiled_mma_c(1, 2, 2, 1), ty.QUAD, tiled_c_oracle(1, 2, 2, 1)),
    ("wgmma24", ty.wgmma_acc(24), ty.WARPGROUP, figure_wgmma_d(24)),
    ("wgmma64", ty.wgmma_acc(64), ty.WARPGROUP, figure_wgmma_d(64)),
]
SOFTMAX_PARAMS = [c + (ps,) for c in SOFTMAX_CASES for ps in (False, True)]

RTOL = 1e-5  # float32 exp2/fma against float64 exp: arguments of a few tens, a few ulp each


@pytest.mark.parametrize("cid,layout,own,oracle,partial", SOFTMAX_PARAMS,
                         ids=[f"{p[0]}-{'partial' if p[4] else 'reduced'}" for p in SOFTMAX_PARAMS])
def test_softmax_update_matches_the_float64_recurrence(cid, layout, own, oracle, partial):
    rng = np.random.default_rng(11)
    scale = 0.7
    tiles = masked_tiles(rng, layout.shape, 3)
    values = [random_tile(rng, layout.shape) for _ in tiles]
    ref = OnlineSoftmax64(layout.shape[0], scale)
    state = ty.SoftmaxState(fragment_from_tile(tiles[0], layout, own, oracle), partial_sum=partial)
    numerator, want_num, mag = None, np.zeros(layout.shape), np.zeros(layout.shape)
    for t, (x, v) in enumerate(zip(tiles, values)):
        scores = fragment_from_tile(x, layout, own, oracle)
        upd = ty.softmax_update(state, scores, scale)
        state = upd.state
        alpha, p = ref.update(x)
        check_summary(upd.rescale, alpha, RTOL)
        rescale, rows = summary_by_row(upd.rescale)
        empty_before = [0, 1] if t == 1 else [0]  # row 0 is always masked, row 1 was masked in tile 0
        if t == 0:  # updating the empty state: rescale exactly 0 everywhere
            assert (rescale == 0).all()
        assert (rescale[np.isin(rows, empty_before)] == 0).all()
        check_full(upd.weights, p, oracle, RTOL)
        check_summary(state.maximum, ref.m, 0)
        if not partial:
            check_summary(state.sum, ref.l, RTOL)
        vf = fragment_from_tile(v, layout, own, oracle)
        numerator = upd.weights * vf if numerator is None else numerator * upd.rescale + upd.weights * vf
        want_num = alpha[:, None] * want_num + p * v
        mag = alpha[:, None] * mag + np.abs(p * v)
    out = ty.softmax_normalize(numerator, state)
    with np.errstate(invalid="ignore", divide="ignore"):
        want_out = np.where(ref.l[:, None] > 0, want_num / ref.l[:, None], 0.0)
        mag = np.where(ref.l[:, None] > 0, mag / ref.l[:, None], 0.0)
    check_full(out, want_out, oracle, RTOL, scale=mag)
    assert (gather_tile(out)[0] == 0).all(), "a fully masked row normalizes to zeros"
    with np.errstate(divide="ignore"):  # the reference takes log2(0) of a fully masked row, then selects -inf
        lse = ty.softmax_lse(state, scale)
    want_lse = ref.lse()
    assert want_lse[0] == -np.inf
    got, line = summary_by_row(lse)
    assert (got[line == 0] == -np.inf).all()
    finite = line != 0
    np.testing.assert_allclose(got[finite], want_lse[line[finite]], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("cid,layout,own,oracle", SOFTMAX_CASES, ids=[c[0] for c in SOFTMAX_CASES])
def test_partial_sum_normalizes_like_the_reduced_sum(cid, layout, own, oracle):
    rng = np.random.default_rng(12)
    tiles = masked_tiles(rng, layout.shape, 2)
    results = []
    for partial in (False, True):
        state = ty.SoftmaxState(fragment_from_tile(tiles[0], layout, own, oracle), partial_sum=partial)
        num = None
        for x in tiles:
            upd = ty.softmax_update(state, fragment_from_tile(x, layout, own, oracle), 0.5)
            state = upd.state
            num = upd.weights if num is None else num * upd.rescale + upd.weights
        with np.errstate(divide="ignore"):
            lse = ty.softmax_lse(state, 0.5)
        results.append((gather_tile(ty.softmax_normalize(num, state)), gather_tile(lse)))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6, atol=0)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cid,layout,own,oracle", SOFTMAX_CASES, ids=[c[0] for c in SOFTMAX_CASES])
def test_merging_two_halves_equals_one_pass(cid, layout, own, oracle):
    rng = np.random.default_rng(13)
    scale = 1.3
    x1, x2, x3 = masked_tiles(rng, layout.shape, 3)
    x3[3] = -np.inf  # row 3: nothing in the second half
    frags = [fragment_from_tile(x, layout, own, oracle) for x in (x1, x2, x3)]

    def run(fs, partial=False):
        st = ty.SoftmaxState(frags[0], partial_sum=partial)
        for f in fs:
            st = ty.softmax_update(st, f, scale).state
        return st

    whole = run(frags)
    merged, ra, rb = ty.softmax_merge(run(frags[:2]), run(frags[2:], partial=True), scale)
    check_summary(merged.maximum, gather_tile(whole.maximum)[:, 0], 0)
    check_summary(merged.sum, gather_tile(whole.sum)[:, 0], 1e-6)
    ref_a, ref_b, ref_all = (OnlineSoftmax64(layout.shape[0], scale) for _ in range(3))
    for x in (x1, x2):
        ref_a.update(x)
    ref_b.update(x3)
    for x in (x1, x2, x3):
        ref_all.update(x)
    check_summary(merged.maximum, ref_all.m, 0)
    check_summary(merged.sum, ref_all.l, RTOL)
    shift = np.where(np.isinf(ref_all.m), 0.0, ref_all.m)  # the merged maximum; 0 for a row with nothing valid
    with np.errstate(invalid="ignore"):
        want_ra = np.where(ref_a.m == -np.inf, 0.0, np.exp(scale * (ref_a.m - shift)))
        want_rb = np.where(ref_b.m == -np.inf, 0.0, np.exp(scale * (ref_b.m - shift)))
    check_summary(ra, want_ra, RTOL)
    check_summary(rb, want_rb, RTOL)
    assert gather_tile(rb)[3, 0] == 0 and gather_tile(ra)[0, 0] == 0 and gather_tile(rb)[0, 0] == 0
    with np.errstate(divide="ignore"):
        lse = gather_tile(ty.softmax_lse(merged, scale))[:, 0]
    assert lse[0] == -np.inf and not np.isnan(lse).any()


def test_softmax_dims1_on_a_quad_fragment():
    """Columns of an mma C atom: the state keeps axis 1 and its column ownership."""
    rng = np.random.default_rng(14)
    x = random_tile(rng, (16, 8), masked=0.2)
    x[:, 5] = -np.inf
    frag = fragment_from_tile(x, ty.MMA_SYNC_C, ty.QUAD, isa_mma_c())
    state = ty.SoftmaxState(frag, dims=1)
    assert state.maximum.ownership.col_lanes == ty.QUAD.col_lanes
    upd = ty.softmax_update(state, frag)
    ref = OnlineSoftmax64(8, 1.0)
    alpha, p = ref.update(x.T)
    check_summary(upd.state.maximum, ref.m, 0, dims=1)
    check_summary(upd.state.sum, ref.l, RTOL, dims=1)
    check_full(upd.weights, p.T, isa_mma_c(), RTOL)
    out = gather_tile(ty.softmax_normalize(upd.weights, upd.state))
    assert (out[:, 5] == 0).all()
    np.testing.assert_allclose(out[:, :5].sum(axis=0), 1.0, rtol=1e-6)


def test_seed_example():
    f = ty.Fragment((0.0, 0.0), ty.LocalOwnership(2, 2))
    s = ty.SoftmaxState(f)
    u = ty.softmax_update(s, f)
    triple = (u.state.maximum.item(), u.state.sum.item(), u.rescale.item())
    normalized = ty.softmax_normalize(u.weights, u.state).data
    print("seed example:", triple, normalized)
    assert triple == (0.0, 2.0, 0.0)
    assert normalized == (0.5, 0.5)


def test_empty_update_never_computes_inf_minus_inf():
    f = ty.Fragment((-math.inf, -math.inf), ty.LocalOwnership(2, 2))
    # -inf - -inf in numpy would raise FloatingPointError here (log2(0) of the empty row is expected)
    with np.errstate(invalid="raise", divide="ignore"):
        u = ty.softmax_update(ty.SoftmaxState(f), f, 0.125)
        out = ty.softmax_normalize(u.weights, u.state).data
        lse = ty.softmax_lse(u.state, 0.125).item()
    assert (u.state.maximum.item(), u.state.sum.item(), u.rescale.item()) == (-math.inf, 0.0, 0.0)
    assert u.weights.data == (0.0, 0.0) and out == (0.0, 0.0) and lse == -math.inf


# -- same-lane C -> A conversion ---------------------------------------------------------------------

def rne_bits(x, dtype: str) -> np.ndarray:
    """float32 -> bf16/fp16 bit patterns by torch's conversion (round to nearest even)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.to(torch.bfloat16 if dtype == "bf16" else torch.float16).view(torch.int16).numpy().view(np.uint16)


def is_nan_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    exp_mask, man_mask = (0x7F80, 0x007F) if dtype == "bf16" else (0x7C00, 0x03FF)
    bits = bits.astype(np.uint32)
    return ((bits & exp_mask) == exp_mask) & ((bits & man_mask) != 0)


def expected_words(tile16: np.ndarray, oracle: np.ndarray, dtype: str) -> np.ndarray:
    """Packed operand words per the ISA: register r = element 2r (bits 0-15) | element 2r+1 (bits 16-31)."""
    bits = rne_bits(tile16[oracle[..., 0], oracle[..., 1]], dtype).astype(np.uint32)
    return bits[:, 0::2] | (bits[:, 1::2] << 16)


def assert_words_equal(got, want, dtype):
    got = np.asarray(got, dtype=np.uint32)
    want = np.asarray(want, dtype=np.uint32)
    assert got.shape == want.shape
    for shift in (0, 16):
        g, w = (got >> shift) & 0xFFFF, (want >> shift) & 0xFFFF
        nan = is_nan_bits(w, dtype)
        assert is_nan_bits(g[nan], dtype).all(), "a NaN did not stay NaN"
        bad = np.argwhere((g != w) & ~nan)
        assert bad.size == 0, "first mismatches (thread, register): " + ", ".join(
            f"{tuple(b)} got {g[tuple(b)]:#06x} want {w[tuple(b)]:#06x}" for b in bad[:6])


def bits_to_f32(patterns) -> np.ndarray:
    return np.asarray(patterns, dtype=np.uint32).view(np.float32)


# (float32 bits, expected bits) written by hand from IEEE round-to-nearest-even.
BF16_SPECIALS = [
    (0x3F800000, 0x3F80),  # 1.0
    (0x3F808000, 0x3F80),  # halfway between 0x3F80 and 0x3F81: to even
    (0x3F818000, 0x3F82),  # halfway between 0x3F81 and 0x3F82: to even
    (0x3F808001, 0x3F81),  # just above halfway
    (0x3F807FFF, 0x3F80),  # just below halfway
    (0xBF818000, 0xBF82),  # negative halfway
    (0x80000000, 0x8000),  # -0.0 keeps its sign bit
    (0x7F800000, 0x7F80), (0xFF800000, 0xFF80),  # +-inf
    (0x00010000, 0x0001), (0x80010000, 0x8001),  # bf16 subnormals survive: no flush to zero
    (0x00018000, 0x0002), (0x00008000, 0x0000),  # subnormal halfway cases
    (0x007F0000, 0x007F),  # largest bf16 subnormal
    (0x7F7F0000, 0x7F7F),  # largest finite bf16
    (0x7F7FFFFF, 0x7F80),  # float32 max rounds to inf: no saturation
]
F16_SPECIALS = [
    (0x3F800000, 0x3C00),  # 1.0
    (0x3F801000, 0x3C00),  # 1 + 2^-11: halfway between 0x3C00 and 0x3C01, to even
    (0x3F803000, 0x3C02),  # 1 + 3*2^-11: halfway between 0x3C01 and 0x3C02, to even
    (0x80000000, 0x8000),  # -0.0
    (0x7F800000, 0x7C00), (0xFF800000, 0xFC00),  # +-inf
    (0x477FE000, 0x7BFF),  # 65504, the largest finite
    (0x477FF000, 0x7C00),  # 65520: halfway to 65536, to even = overflow to inf
    (0x33800000, 0x0001),  # 2^-24, the smallest fp16 subnormal: no flush to zero
    (0x33000000, 0x0000),  # 2^-25: halfway between 0 and 2^-24, to even
    (0x33C00000, 0x0002),  # 3*2^-25: halfway between 2^-24 and 2^-23, to even
    (0xB3800000, 0x8001),  # -2^-24
]
NANS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF]  # incl. a NaN whose payload is only in low bits


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_rne_oracle_agrees_with_the_hand_written_bits(dtype):
    cases = BF16_SPECIALS if dtype == "bf16" else F16_SPECIALS
    got = rne_bits(bits_to_f32([c[0] for c in cases]), dtype)
    assert [int(x) for x in got] == [c[1] for c in cases]


def c_pair(rng, tile16):
    """The two adjacent 16x8 C atoms (columns 0-7, 8-15) holding a 16x16 tile."""
    c = isa_mma_c()
    return (fragment_from_tile(tile16[:, :8], ty.MMA_SYNC_C, ty.QUAD, c),
            fragment_from_tile(tile16[:, 8:], ty.MMA_SYNC_C, ty.QUAD, c))


ATOM_DTYPES = {"bf16": ty.bf16, "f16": ty.f16}


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_pack_two_atoms_gives_the_isa_a_operand(dtype):
    rng = np.random.default_rng(21)
    tile = (rng.standard_normal((16, 16)) * 3).astype(np.float32)
    left, right = c_pair(rng, tile)
    atom = ty.MmaSyncAtom(ATOM_DTYPES[dtype])
    a = ty.pack_operand_a(atom, left, right)
    assert (a.layout, a.pack, a.dtype, a.ownership) == (ty.MMA_SYNC_A, 2, atom.dtype, mma_sync.A_OWNERSHIP)
    assert_words_equal(a.data, expected_words(tile, isa_mma_a(), dtype), dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_pack_special_values(dtype):
    cases = BF16_SPECIALS if dtype == "bf16" else F16_SPECIALS
    patterns = [c[0] for c in cases] + NANS
    flat = np.resize(np.asarray(patterns, np.uint32), 256)
    tile = flat.view(np.float32).reshape(16, 16)
    left, right = c_pair(None, tile)
    with np.errstate(over="ignore"):  # numpy warns on the float16 overflow to inf that RNE requires
        a = ty.pack_operand_a(ty.MmaSyncAtom(ATOM_DTYPES[dtype]), left, right)
    words = np.asarray(a.data, np.uint32)
    oracle = isa_mma_a()
    table = dict(cases)
    for lane, e in itertools.product(range(32), range(8)):
        r, c = oracle[lane, e]
        half = (int(words[lane, e // 2]) >> (16 * (e & 1))) & 0xFFFF
        src = int(tile.view(np.uint32)[r, c])
        if src in table:
            assert half == table[src], f"{src:#010x} -> {half:#06x}, want {table[src]:#06x}"
        else:
            assert is_nan_bits(np.array([half]), dtype)[0], f"NaN {src:#010x} -> {half:#06x}"
    assert_words_equal(words, expected_words(tile, oracle, dtype), dtype)


PACK_TILINGS = [(1, 2), (2, 4), (3, 2), (1, 8)]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("m_reps,n_reps", PACK_TILINGS)
def test_pack_tiled_accumulator_every_m_and_k(m_reps, n_reps, dtype):
    rng = np.random.default_rng(m_reps * 10 + n_reps)
    layout = ty.tiled_mma_c(m_reps, n_reps)
    tile = (rng.standard_normal(layout.shape) * 3).astype(np.float32)
    tile[0, 0], tile[-1, -1] = -0.0, np.inf
    acc = fragment_from_tile(tile, layout, ty.QUAD, tiled_c_oracle(m_reps, n_reps, 1, 1))
    atom = ty.MmaSyncAtom(ATOM_DTYPES[dtype])
    for m in range(m_reps):
        for k in range(n_reps // 2):
            a = ty.pack_operand_a(atom, acc, m, k)
            block = tile[16 * m:16 * m + 16, 16 * k:16 * k + 16]
            assert_words_equal(a.data, expected_words(block, isa_mma_a(), dtype), dtype)
            np.testing.assert_array_equal(mma_sync.pack_operand_a(atom, acc, m, k).data, a.data)


def test_pack_tiled_accumulator_errors():
    atom = ty.MmaSyncAtom(ty.bf16)

    def acc(*tiling):
        layout = ty.tiled_mma_c(*tiling)
        return fragment_from_tile(np.zeros(layout.shape, np.float32), layout, ty.QUAD, tiled_c_oracle(*tiling))

    with pytest.raises(LayoutError, match="2 N warps"):
        ty.pack_operand_a(atom, acc(1, 2, 1, 2), 0, 0)
    with pytest.raises(LayoutError, match="3 N atoms.*unpaired"):
        ty.pack_operand_a(atom, acc(1, 3, 1, 1), 0, 0)
    with pytest.raises(LayoutError, match=r"m expects 0\.\.1, but got 2"):
        ty.pack_operand_a(atom, acc(2, 2, 1, 1), 2, 0)
    with pytest.raises(LayoutError, match=r"m expects 0\.\.1, but got -1"):
        ty.pack_operand_a(atom, acc(2, 2, 1, 1), -1, 0)
    with pytest.raises(LayoutError, match=r"k expects 0\.\.1, but got 2"):
        ty.pack_operand_a(atom, acc(1, 4, 1, 1), 0, 2)
    with pytest.raises(LayoutError, match="expects a tiled mma.m16n8k16 accumulator"):
        ty.pack_operand_a(atom, fragment_from_tile(np.zeros((64, 16), np.float32), ty.wgmma_acc(16),
                                                   ty.WARPGROUP, figure_wgmma_d(16)), 0, 0)
    with pytest.raises(LayoutError, match="right expects"):
        wide = acc(1, 2, 1, 1)
        ty.pack_operand_a(atom, fragment_from_tile(np.zeros((16, 8), np.float32), ty.MMA_SYNC_C, ty.QUAD,
                                                   isa_mma_c()), wide)
    with pytest.raises(TypeError, match="MmaSyncAtom or WgmmaAtom"):
        ty.pack_operand_a("bf16", wide, 0, 0)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("n", [64, 128])
def test_pack_wgmma_accumulator_every_k_step(n, dtype):
    rng = np.random.default_rng(n)
    tile = (rng.standard_normal((64, n)) * 3).astype(np.float32)
    tile[5, 3], tile[40, n - 1], tile[63, 0] = -0.0, -np.inf, np.nan
    acc = fragment_from_tile(tile, ty.wgmma_acc(n), ty.WARPGROUP, figure_wgmma_d(n))
    atom = ty.WgmmaAtom(n, ATOM_DTYPES[dtype], "rs")
    for k in range(n // 16):
        a = ty.pack_operand_a(atom, acc, k)
        assert (a.layout, a.pack, a.dtype) == (ty.WGMMA_A_RS, 2, atom.dtype)
        assert_words_equal(a.data, expected_words(tile[:, 16 * k:16 * k + 16], figure_wgmma_a(), dtype), dtype)
    with pytest.raises(LayoutError, match=rf"k expects 0\.\.{n // 16 - 1} for N={n}, but got {n // 16}"):
        ty.pack_operand_a(atom, acc, n // 16)


# -- mma.sync reference --------------------------------------------------------------------------------

def packed_fragment(tile: np.ndarray, oracle: np.ndarray, dtype: str, ownership, layout) -> ty.Fragment:
    words = expected_words(tile, oracle, dtype)
    return ty.Fragment(words, ownership, layout, pack=2)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_mma_reference_is_the_float64_product_of_the_rounded_operands(dtype):
    rng = np.random.default_rng(31)
    a_tile = rng.standard_normal((16, 16)).astype(np.float32)
    b_tile = rng.standard_normal((16, 8)).astype(np.float32)
    c_tile = rng.standard_normal((16, 8)).astype(np.float32)
    atom = ty.MmaSyncAtom(ATOM_DTYPES[dtype])
    a = packed_fragment(a_tile, isa_mma_a(), dtype, mma_sync.A_OWNERSHIP, ty.MMA_SYNC_A)
    b = packed_fragment(b_tile, isa_mma_b(), dtype, mma_sync.B_OWNERSHIP, ty.MMA_SYNC_B)
    c = fragment_from_tile(c_tile, ty.MMA_SYNC_C, ty.QUAD, isa_mma_c())
    d = mma_sync.mma(atom, a, b, c)
    assert (d.layout, d.ownership) == (ty.MMA_SYNC_C, ty.QUAD)
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    a64 = torch.from_numpy(a_tile).to(tdt).double().numpy()
    b64 = torch.from_numpy(b_tile).to(tdt).double().numpy()
    want = a64 @ b64 + c_tile.astype(np.float64)
    oracle = isa_mma_c()
    np.testing.assert_allclose(d.data, want[oracle[..., 0], oracle[..., 1]], rtol=2.0 ** -23, atol=1e-12)


def test_mma_reference_then_pack_chains_two_products():
    """S = Q K (two n8 atoms), P = pack(S), O = P V: the same-lane chain of the attention kernels."""
    rng = np.random.default_rng(32)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((16, 16), (16, 16), (16, 8)))
    atom = ty.MmaSyncAtom(ty.bf16)
    qa = packed_fragment(q, isa_mma_a(), "bf16", mma_sync.A_OWNERSHIP, ty.MMA_SYNC_A)
    zero = fragment_from_tile(np.zeros((16, 8), np.float32), ty.MMA_SYNC_C, ty.QUAD, isa_mma_c())
    s = [mma_sync.mma(atom, qa, packed_fragment(k[:, 8 * j:8 * j + 8], isa_mma_b(), "bf16", mma_sync.B_OWNERSHIP,
                                                ty.MMA_SYNC_B), zero) for j in range(2)]
    p = ty.pack_operand_a(atom, s[0], s[1])
    o = mma_sync.mma(atom, p, packed_fragment(v, isa_mma_b(), "bf16", mma_sync.B_OWNERSHIP, ty.MMA_SYNC_B), zero)
    def r(x):  # bf16-rounded, as float64
        return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).double().numpy()

    s64 = (r(q) @ r(k)).astype(np.float32)
    np.testing.assert_array_equal(np.hstack([gather_tile(x) for x in s]), s64)
    np.testing.assert_allclose(gather_tile(o), r(s64) @ r(v), rtol=2.0 ** -23, atol=1e-12)


# -- wgmma shared-memory descriptor ----------------------------------------------------------------------

def test_descriptor_bits_match_the_reference_table():
    """hopper-reference.md section 2: address >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45,
    swizzle 1 (128B) / 2 (64B) / 3 (32B) / 0 in bits 62-63; D = 64 bf16 tiles give
    0x4000004000010000 | ((addr & 0x3FFFF) >> 4)."""
    for addr in (0, 0x400, 0x8000, 0x3FFF0, 0x12340):
        assert wgmma.descriptor_bits(addr) == 0x4000004000010000 | ((addr & 0x3FFFF) >> 4)
        assert ty.hopper.descriptor_bits(addr, 16, 1024, 128) == 0x4000004000010000 | (addr >> 4)
    d = wgmma.descriptor_bits(0x1230, lbo=8192, sbo=2048, swizzle=64)
    assert d & 0x3FFF == 0x123
    assert (d >> 16) & 0x3FFF == 8192 >> 4
    assert (d >> 32) & 0x3FFF == 2048 >> 4
    assert d >> 62 == 2
    assert (d >> 46) & 1 == 0 and (d >> 49) & 0x7 == 0  # no Blackwell bit 46, base offset 0
    assert wgmma.descriptor_bits(0, swizzle=32) >> 62 == 3
    assert wgmma.descriptor_bits(0, swizzle=0) >> 62 == 0
    assert wgmma.descriptor_bits(0x40000 + 0x100) & 0x3FFF == 0x10  # only the 18-bit shared window counts


def test_descriptor_rejects_misaligned_fields():
    with pytest.raises(LayoutError, match="addr expects a multiple of 16 bytes, but got 8"):
        wgmma.descriptor_bits(8)
    with pytest.raises(LayoutError, match="sbo expects a multiple of 16"):
        wgmma.descriptor_bits(0, sbo=1000)
    with pytest.raises(LayoutError, match="swizzle expects 0, 32, 64 or 128"):
        wgmma.descriptor_bits(0, swizzle=256)
