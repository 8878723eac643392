"""The merge algebra of online-softmax summaries, in the Fragment reference semantics (the numpy
model of what the kernels compute), against an FP64 oracle.

A row's keys are cut into chunks; each chunk's summary (m, l) and numerator O come from
``ty.softmax_update`` over 16 x 8 score tiles in the mma.sync C layout (as the decode kernel's
warps compute them); ``ty.softmax_merge`` combines the chunks. Checked: the merged LSE and
output against FP64 over the whole row; associativity and commutativity within rounding; and
exactness at the edges: an empty chunk (no keys) or a fully masked chunk merges as the
identity, bit for bit, in either position; all chunks empty give O = 0 and LSE = -inf. The
decode's partial form (m = LSE, l = 1, scale 1) is checked the same way.
"""
import math

import numpy as np
import pytest

import tylopy as ty

# lg2.approx of a zero sum is -inf by design (an empty row's LSE); numpy warns about it
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")

LAYOUT = ty.tiled_mma_c(1, 1)          # 16 rows x 8 keys, 4 values per lane
ROWS, COLS = LAYOUT.shape
D = 4                                   # value columns per key


def fragment(tile: np.ndarray) -> ty.Fragment:
    """A 16 x 8 float32 tile as a reference fragment (lane, register) in the C layout."""
    t = LAYOUT.table
    return ty.Fragment(tile[t[..., 0], t[..., 1]].astype(np.float32), ty.QUAD, LAYOUT)


def rows_of(frag: ty.Fragment) -> np.ndarray:
    """A row summary fragment (2 values per lane: rows g, g + 8) as a vector of 16 rows."""
    out = np.empty(ROWS, np.float32)
    data = frag.data
    for lane in range(32):
        out[lane // 4] = data[lane, 0]
        out[lane // 4 + 8] = data[lane, 1]
    return out


def summarize(scores: np.ndarray, values: np.ndarray, scale: float):
    """(state, O numerator (16, D) float32) of one chunk: softmax_update tile by tile, O = alpha O + P V."""
    state = ty.SoftmaxState(fragment(np.zeros((ROWS, COLS))))
    o = np.zeros((ROWS, D), np.float32)
    for c0 in range(0, scores.shape[1], COLS):
        tile = np.full((ROWS, COLS), -np.inf)
        tile[:, :min(COLS, scores.shape[1] - c0)] = scores[:, c0:c0 + COLS]
        vals = np.zeros((COLS, D))
        vals[:min(COLS, scores.shape[1] - c0)] = values[c0:c0 + COLS]
        upd = ty.softmax_update(state, fragment(tile), scale)
        state = upd.state
        p = np.zeros((ROWS, COLS), np.float32)
        t = LAYOUT.table
        p[t[..., 0], t[..., 1]] = upd.weights.data
        o = (o * rows_of(upd.rescale)[:, None] + p.astype(np.float64) @ vals).astype(np.float32)
    return state, o


def merge(a, b, scale):
    (sa, oa), (sb, ob) = a, b
    st, ra, rb = ty.softmax_merge(sa, sb, scale)
    return st, (oa * rows_of(ra)[:, None] + ob * rows_of(rb)[:, None]).astype(np.float32)


def finish(summary, scale):
    st, o = summary
    lse = rows_of(ty.softmax_lse(st, scale))
    l = rows_of(st.sum)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(l[:, None] > 0, o / l[:, None], 0.0)
    return out, lse


def oracle(scores, values, scale):
    s = scores.astype(np.float64) * scale
    m = s.max(axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(s - m)
    l = w.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(l[:, None] > 0, (w @ values) / l[:, None], 0.0)
        lse = np.where(l > 0, m[:, 0] + np.log(l), -np.inf)
    return out, lse


def random_row_block(rng, n_keys, masked_frac=0.0):
    scores = rng.normal(0, 3, (ROWS, n_keys))
    scores[rng.random((ROWS, n_keys)) < masked_frac] = -np.inf
    values = rng.normal(0, 1, (n_keys, D))
    return scores.astype(np.float32), values.astype(np.float32)


def check_close(out, lse, ref_out, ref_lse, n_merges=1):
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(lse), ~finite)
    # float32 with ex2.approx / lg2.approx (relative error ~2^-22 each): a few 1e-7 per merge
    tol = (n_merges + 2) * 1e-7
    assert np.all(np.abs(lse[finite] - ref_lse[finite]) <= tol * (1 + np.abs(ref_lse[finite])))
    assert np.all(np.abs(out - ref_out) <= 10 * tol * max(1.0, np.abs(ref_out).max()))
    assert np.all(out[~finite] == 0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cuts", [(8,), (8, 24), (3, 11, 40), (1, 2, 3, 5, 8, 13)])
def test_merged_chunks_equal_the_whole_row(seed, cuts):
    rng = np.random.default_rng(seed)
    scale = 0.125 * (1 + seed)
    n = sum(cuts)
    scores, values = random_row_block(rng, n, masked_frac=0.2)
    pieces, c0 = [], 0
    for c in cuts:
        pieces.append(summarize(scores[:, c0:c0 + c], values[c0:c0 + c], scale))
        c0 += c
    acc = pieces[0]
    for p in pieces[1:]:
        acc = merge(acc, p, scale)
    out, lse = finish(acc, scale)
    check_close(out, lse, *oracle(scores, values, scale), n_merges=len(cuts))


@pytest.mark.parametrize("seed", range(6))
def test_associative_and_commutative_within_rounding(seed):
    rng = np.random.default_rng(100 + seed)
    scale = 0.3
    parts = [random_row_block(rng, n, 0.1) for n in (5, 17, 9)]
    a, b, c = (summarize(s, v, scale) for s, v in parts)
    left = finish(merge(merge(a, b, scale), c, scale), scale)
    right = finish(merge(a, merge(b, c, scale), scale), scale)
    swapped = finish(merge(c, merge(b, a, scale), scale), scale)
    for x, y in ((left, right), (left, swapped)):
        assert np.all(np.abs(x[1] - y[1]) <= 1e-6 * (1 + np.abs(x[1])))
        assert np.all(np.abs(x[0] - y[0]) <= 2e-6 * max(1.0, np.abs(x[0]).max()))
    scores = np.concatenate([s for s, _ in parts], axis=1)
    values = np.concatenate([v for _, v in parts], axis=0)
    check_close(*left, *oracle(scores, values, scale), n_merges=3)


def _empty(kind, rng, scale):
    if kind == "no keys":
        return summarize(np.zeros((ROWS, 0), np.float32), np.zeros((0, D), np.float32), scale)
    scores, values = random_row_block(rng, 11)
    scores[:] = -np.inf                                  # every key masked
    return summarize(scores, values, scale)


@pytest.mark.parametrize("kind", ["no keys", "fully masked"])
def test_empty_chunks_merge_as_the_identity_bit_for_bit(kind):
    rng = np.random.default_rng(7)
    scale = 0.2
    x = summarize(*random_row_block(rng, 19, 0.3), scale)
    e = _empty(kind, rng, scale)
    assert np.all(np.isneginf(rows_of(e[0].maximum))) and np.all(rows_of(e[0].sum) == 0) and np.all(e[1] == 0)
    for merged in (merge(x, e, scale), merge(e, x, scale)):
        st, o = merged
        assert np.array_equal(rows_of(st.maximum), rows_of(x[0].maximum))
        assert np.array_equal(rows_of(st.sum), _full_sum(x[0]))
        assert np.array_equal(o, x[1])
        out, lse = finish(merged, scale)
        ref_out, ref_lse = finish((x[0], x[1]), scale)
        assert np.array_equal(lse, ref_lse) and np.array_equal(out, ref_out)


def _full_sum(state):
    """The row sums of a state (a lane-partial sum reduced over the quad)."""
    from tylopy.tile.softmax import reduced_sum
    return rows_of(reduced_sum(state))


def test_all_chunks_empty_give_zero_and_minus_infinity():
    rng = np.random.default_rng(3)
    scale = 0.5
    acc = _empty("no keys", rng, scale)
    for kind in ("fully masked", "no keys", "fully masked"):
        acc = merge(acc, _empty(kind, rng, scale), scale)
    out, lse = finish(acc, scale)
    assert np.all(np.isneginf(lse)) and np.all(out == 0) and not np.isnan(out).any()
    normalized = ty.softmax_normalize(fragment(np.ones((ROWS, COLS))), acc[0])
    assert np.all(normalized.data == 0)


# -- the decode's partials: (O_s normalized, LSE_s) merged as summaries (m = LSE_s, l = 1), scale 1 --------

def lse_state(lse: np.ndarray) -> ty.SoftmaxState:
    """Partials' LSEs as a summary of lane-local rows: m = LSE, l = 1 (0 where LSE is -inf)."""
    own = ty.LocalOwnership(2, 1)
    m = ty.Fragment(tuple(float(x) for x in lse), own)
    return ty.SoftmaxState(m, ty.Fragment(tuple(1.0 if x > -np.inf else 0.0 for x in lse), own))


def merge_partials(parts):
    """What attention_decode_merge computes, row by row, over partials [(O (rows, D), LSE (rows,))]."""
    rows = len(parts[0][1])
    state = lse_state(np.full(rows, -np.inf))
    acc = np.zeros((rows, D), np.float32)
    for o, lse in parts:
        state, ra, rb = ty.softmax_merge(state, lse_state(lse), 1.0)
        fa = np.array([x[0] for x in ra.values], np.float32)
        fb = np.array([x[0] for x in rb.values], np.float32)
        acc = (acc * fa[:, None] + o * fb[:, None]).astype(np.float32)
    l = np.array([x[0] for x in state.sum.values], np.float32)
    lse = np.array([x[0] for x in ty.softmax_lse(state, 1.0).values], np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(l[:, None] > 0, acc / l[:, None], 0.0), lse


@pytest.mark.parametrize("seed", range(3))
def test_lse_partials_merge_like_the_decode(seed):
    rng = np.random.default_rng(50 + seed)
    scale = 0.088
    cuts = [0, 13, 0, 7, 30, 1]                          # empty splits between real ones
    scores, values = random_row_block(rng, sum(cuts), 0.15)
    scores[3] = -np.inf                                  # one row sees no key at all
    parts, c0 = [], 0
    for c in cuts:
        o, lse = oracle(scores[:, c0:c0 + c], values[c0:c0 + c], scale) if c else (np.zeros((ROWS, D)),
                                                                                   np.full(ROWS, -np.inf))
        parts.append((o.astype(np.float32), lse.astype(np.float32)))
        c0 += c
    out, lse = merge_partials(parts)
    check_close(out, lse, *oracle(scores, values, scale), n_merges=len(cuts))
    assert np.isneginf(lse[3]) and np.all(out[3] == 0)


def test_lse_partials_all_empty():
    parts = [(np.zeros((ROWS, D), np.float32), np.full(ROWS, -np.inf, np.float32)) for _ in range(3)]
    out, lse = merge_partials(parts)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_one_partial_passes_through_exactly():
    rng = np.random.default_rng(9)
    o = rng.normal(size=(ROWS, D)).astype(np.float32)
    lse = rng.normal(size=ROWS).astype(np.float32) * 10
    out, merged = merge_partials([(np.zeros_like(o), np.full(ROWS, -np.inf, np.float32)), (o, lse)])
    assert np.array_equal(out, o) and np.array_equal(merged, lse)
    assert math.isfinite(float(merged.sum()))
