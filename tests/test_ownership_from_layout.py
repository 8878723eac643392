"""A layout determines its ownership: who shares a row or a column is read off its lane table.

A fragment built from a layout alone takes that ownership; a declared ownership is checked
against it, so the two can never disagree.
"""
import numpy as np
import pytest

import tylopy as ty
from tylopy.errors import OwnershipError
from tylopy.tile.layouts import Ownership


def rows_shared_by(layout):
    """Oracle: for each lane, the lanes of the same warp holding exactly the same set of rows."""
    t = layout.table
    return {lane: {m for m in (1, 2, 4, 8, 16)
                   if set(t[lane, :, 0]) == set(t[lane ^ m, :, 0])} for lane in range(32)}


@pytest.mark.parametrize("layout,expected", [
    (ty.MMA_SYNC_C, ty.QUAD), (ty.MMA_SYNC_A, ty.QUAD), (ty.wgmma_acc(64), ty.WARPGROUP),
    (ty.wgmma_acc(256), ty.WARPGROUP), (ty.WGMMA_A_RS, ty.WARPGROUP),
])
def test_derived_ownership_matches_the_named_constants(layout, expected):
    assert layout.ownership == expected
    masks = rows_shared_by(layout)
    assert all(tuple(sorted(v)) == layout.ownership.row_lanes for v in masks.values())


def test_fragment_from_a_layout_alone():
    data = np.arange(32 * 4, dtype=np.float32).reshape(32, 4)
    f = ty.Fragment(data, ty.MMA_SYNC_C)
    assert f.ownership == ty.QUAD
    assert f.reduce("max", 2).data.shape == (32, 2)


def test_declared_ownership_is_checked_against_the_layout():
    data = np.zeros((32, 4), dtype=np.float32)
    wrong = Ownership("quad", row_lanes=(1,), col_lanes=(4, 8, 16))
    with pytest.raises(OwnershipError, match="share a row"):
        ty.Fragment(data, wrong, ty.MMA_SYNC_C)


def test_tiled_accumulator_over_warps_counts_its_warps():
    layout = ty.tiled_mma_c(1, 2, warps_m=2, warps_n=2)
    own = layout.ownership
    assert own.row_lanes == (1, 2) and own.row_warps == 2 and own.col_warps == 2


def test_operand_b_layout_has_an_ownership():
    own = ty.MMA_SYNC_B.ownership
    assert own.row_lanes == (4, 8, 16) and own.col_lanes == (1, 2)
