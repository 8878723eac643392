"""Fragment reductions and the online softmax against numpy (CPU tier): the reference semantics of
``reduce`` in every lane and for every layout, the ownership rules that refuse summaries across
rows, warps or misdeclared layouts, and the online softmax state (update, partial sums, merging,
normalization) against a float64 oracle of the recurrence, on random and masked tiles.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import tylopy as ty
from tylopy.errors import OwnershipError
from tylopy.tile.layouts import Ownership
from tylopy.tile.mma_sync import gather_tile

from fragment_oracles import figure_wgmma_d, fragment_from_tile, isa_mma_c, random_tile, tiled_c_oracle


# -- reference reductions -----------------------------------------------------------------------------


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
    """The online-softmax recurrence per row, in float64 with natural exp and explicit branches:
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


def test_worked_example():
    f = ty.Fragment((0.0, 0.0), ty.LocalOwnership(2, 2))
    s = ty.SoftmaxState(f)
    u = ty.softmax_update(s, f)
    triple = (u.state.maximum.item(), u.state.sum.item(), u.rescale.item())
    normalized = ty.softmax_normalize(u.weights, u.state).data
    print("worked example:", triple, normalized)
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
