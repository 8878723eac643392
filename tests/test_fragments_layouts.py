"""Fragment layouts against the PTX ISA, lane by lane (CPU tier): every (thread, value) of every
atom layout, wgmma N and tiling equals the oracle tables of ``fragment_oracles.py``; each layout
is a bijection onto its tile; the wgmma figure and CuTe oracles agree; the ownership each layout
declares (which lanes and warps share a row or a column) is the one the ISA tables imply; lane
maps render every element.
"""
from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest

import tylopy as ty

from fragment_oracles import (ATOMS, LAYOUT_CASES, TILINGS, WGMMA_NS, cute_alayout_64x16, cute_clayout_64xn,
                              figure_wgmma_a, figure_wgmma_d, tiled_c_oracle)


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
