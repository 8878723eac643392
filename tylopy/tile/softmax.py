"""Online softmax state over fragments: the row summary (m, l) that tiles update one at a time.

With previous summary (m, l) and a tile of raw scores x (masked entries -inf), for softmax
scale s and c = s * log2(e)::

    m' = max(m, rowmax(x))
    m* = 0 if m' == -inf else m'         # an empty row never computes -inf - (-inf)
    alpha = exp2((m - m*) * c)           # rescales the previous numerator and sum
    p = exp2((x - m*) * c)               # unnormalized weights: exact 0 exponent at the maximum
    l' = alpha * l + rowsum(p)

Elements select, never branch. The empty state is (-inf, 0); updating it gives alpha = 0. A
row whose keys are all masked keeps (-inf, 0), normalizes to zeros and has LSE -inf.

A worked example (natural exp, s = 1):

>>> from tylopy.tile.fragment import Fragment
>>> from tylopy.tile.layouts import LocalOwnership
>>> f = Fragment((0.0, 0.0), LocalOwnership(2, 2)); s = SoftmaxState(f)
>>> u = softmax_update(s, f)
>>> (u.state.maximum.item(), u.state.sum.item(), u.rescale.item())
(0.0, 2.0, 0.0)
>>> softmax_normalize(u.weights, u.state).data
(0.5, 0.5)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import OwnershipError
from ..language.tracing import if_else
from .fragment import NEG_INF, Fragment, broadcast_rows, rows_agree
from .layouts import reduced_layout

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class SoftmaxState:
    """FP32 running maximum and sum per row, as reduced fragments that keep axis and ownership.

    ``partial_sum=True`` keeps each lane's share of the sum un-reduced (FA3's choice: the quad
    reduction happens once, in ``softmax_normalize``/``finalize``, not on every tile).
    """

    maximum: Fragment
    sum: Fragment
    dims: int = 2
    partial_sum: bool = False

    def __init__(self, like, sum=None, dims: int = 2, partial_sum: bool = False):
        if sum is None:  # SoftmaxState(fragment, dims=...): the empty state shaped like ``like``
            if dims not in (1, 2):
                raise ValueError(f"SoftmaxState dims expects 1 or 2, but got {dims!r}")
            frag = like
            ops = frag.ops
            layout = reduced_layout(frag.layout, dims)
            ref = frag.values[0]
            m = tuple(ops.const(NEG_INF, ref) for _ in range(layout.nvalues))
            z = tuple(ops.const(0.0, ref) for _ in range(layout.nvalues))
            own = frag.ownership.reduced(dims)
            object.__setattr__(self, "maximum", Fragment(m, own, layout))
            object.__setattr__(self, "sum", Fragment(z, own, layout))
        else:
            object.__setattr__(self, "maximum", like)
            object.__setattr__(self, "sum", sum)
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "partial_sum", partial_sum)

    def __tylopy_flatten__(self):
        lm, am = self.maximum.__tylopy_flatten__()
        ls, as_ = self.sum.__tylopy_flatten__()
        return lm + ls, (am, as_, len(lm), self.dims, self.partial_sum)

    @classmethod
    def __tylopy_unflatten__(cls, aux, leaves):
        am, as_, n, dims, partial = aux
        return cls(Fragment.__tylopy_unflatten__(am, leaves[:n]), Fragment.__tylopy_unflatten__(as_, leaves[n:]),
                   dims, partial)

    def check_rows(self, frag: Fragment, what: str):
        if not rows_agree(frag.layout, self.maximum.layout, self.dims):
            raise OwnershipError(f"{what}: the state holds the rows of {self.maximum.layout}, "
                                 f"but the fragment is {frag.layout}", None)
        want = frag.ownership.reduced(self.dims)
        have = self.maximum.ownership
        if (want.row_lanes, want.col_lanes) != (have.row_lanes, have.col_lanes):
            raise OwnershipError(f"{what}: the state's reduced ownership {have} does not match the fragment's "
                                 f"{frag.ownership}; a lane-local summary cannot become a warp summary", None)


@dataclass(frozen=True)
class SoftmaxUpdate:
    state: SoftmaxState
    weights: Fragment   # unnormalized p, f32
    rescale: Fragment   # alpha per row: multiply the previous numerator by it

    def __tylopy_flatten__(self):
        parts = [self.state, self.weights, self.rescale]
        leaves, auxes = [], []
        for x in parts:
            l, a = x.__tylopy_flatten__()
            leaves += l
            auxes.append((type(x), a, len(l)))
        return leaves, tuple(auxes)

    @classmethod
    def __tylopy_unflatten__(cls, aux, leaves):
        out, i = [], 0
        for t, a, n in aux:
            out.append(t.__tylopy_unflatten__(a, leaves[i:i + n]))
            i += n
        return cls(*out)


def _coef(ops, scale, like):
    c = scale * LOG2E if isinstance(scale, (int, float)) else scale * LOG2E
    return ops.const(c, like) if not ops.traced and isinstance(c, float) else c


def softmax_update(state: SoftmaxState, scores: Fragment, scale=1.0, exponent: str = "exact") -> SoftmaxUpdate:
    """One tile of the online softmax; ``scale`` (> 0) multiplies the scores (1/sqrt(D) for attention).

    The running maximum is of raw scores, which is the maximum of scaled scores only for a
    positive scale: callers with scale <= 0 negate or zero the scores first (as ``attention`` does).

    ``exponent``: "exact" computes ex2((x - m) c), exact at the row maximum for any magnitude;
    "fast" computes ex2(fma(x, c, -round(m c))), one op less per element, whose common offset
    overflows once |m c| nears 2^31; "auto" takes the fast form per thread while |m c| < 2^30.
    """
    if exponent not in ("exact", "fast", "auto"):
        raise ValueError(f"softmax_update exponent expects 'exact', 'fast' or 'auto', but got {exponent!r}")
    state.check_rows(scores, "softmax_update")
    ops = scores.ops
    dims = state.dims
    tile_max = scores.reduce("max", dims)
    m_new = state.maximum.with_data([ops.max(a, b) for a, b in zip(state.maximum.values, tile_max.values)])
    ref = m_new.values[0]
    c = _coef(ops, scale, ref)
    neg_inf = ops.const(NEG_INF, ref)
    zero = ops.const(0.0, ref)
    m_use = [ops.select(ops.eq(m, neg_inf), zero, m) for m in m_new.values]
    alpha, p = _weights(ops, scores, m_new, state.maximum.values, m_use, c, exponent)
    if state.partial_sum:
        slots = scores.layout.row_slots if dims == 2 else scores.layout.col_slots
        sums = []
        for s, (l_old, a) in enumerate(zip(state.sum.values, alpha)):
            acc = ops.mul(a, l_old)
            for v, k in zip(p.values, slots):
                if k == s:
                    acc = ops.add(acc, v)
            sums.append(acc)
    else:
        row_sum = p.reduce("sum", dims)
        sums = [ops.fma(a, l_old, r) for a, l_old, r in zip(alpha, state.sum.values, row_sum.values)]
    new_state = SoftmaxState(m_new, state.sum.with_data(sums), dims, state.partial_sum)
    return SoftmaxUpdate(new_state, p, m_new.with_data(alpha))


# Below this |m c| the exponent fma(x, c, -round(m c)) is off from (x - m) c by at most 2^-(24-30-1)
# = 32 for every element of a row alike: a common factor that cancels between p, l and alpha.
FAST_EXPONENT_LIMIT = 2.0 ** 30


def _weights(ops, scores: Fragment, rows: Fragment, m_old, m_use, c, exponent: str):
    """(alpha per row, p) with exponents measured from the running maximum; ``rows`` is a row
    summary fragment of the scores (the new maximum) to carry per-row values.

    Fast path: p = ex2(fma(x, c, -mc)) and alpha = ex2(m_old c - mc) with mc = round(m c): one FMA
    per element, and alpha telescopes exactly across tiles because every tile uses the same rounded
    products. When |m c| >= 2^30 (scores around 1e9 and beyond) the rounding of m c alone could
    overflow ex2, so such rows take (x - m) c, exact at the maximum, at one more op per element.
    """
    mc = [ops.mul(mu, c) for mu in m_use]

    def fast():
        a = [ops.exp2(ops.sub(ops.mul(mo, c), x)) for mo, x in zip(m_old, mc)]
        neg = [ops.sub(ops.const(0.0, x) if not ops.traced else 0.0, x) for x in mc]
        pv = broadcast_rows(scores, rows.with_data(neg), lambda x, nm: ops.exp2(ops.fma(x, c, nm)))
        return a + list(pv.values)

    def exact():
        a = [ops.exp2(ops.mul(ops.sub(mo, mu), c)) for mo, mu in zip(m_old, m_use)]
        pv = broadcast_rows(scores, rows.with_data(m_use), lambda x, mu: ops.exp2(ops.mul(ops.sub(x, mu), c)))
        return a + list(pv.values)

    n = len(m_use)
    if exponent != "auto":
        vals = fast() if exponent == "fast" else exact()
        return vals[:n], scores.with_data(vals[n:])
    limit = FAST_EXPONENT_LIMIT
    ok = None
    for x in mc:
        inside = (x < limit) & (x > -limit)
        ok = inside if ok is None else (ok & inside)
    if ops.traced:
        vals = list(if_else(ok, fast, exact))
    else:
        f, e = fast(), exact()
        vals = [np.where(ok, a, b).astype(np.float32) for a, b in zip(f, e)]
    return vals[:n], scores.with_data(vals[n:])


def reduced_sum(state: SoftmaxState) -> Fragment:
    """The full row sum: a partial (per-lane) sum is reduced over the lanes that share the row."""
    if not state.partial_sum:
        return state.sum
    ops = state.sum.ops
    own = state.sum.ownership
    vals = list(state.sum.values)
    for m in (own.row_lanes if state.dims == 2 else own.col_lanes):
        vals = [ops.add(v, ops.shfl_xor(v, m)) for v in vals]
    return state.sum.with_data(vals)


def softmax_normalize(numerator: Fragment, state: SoftmaxState) -> Fragment:
    """numerator / l per row; rows with l == 0 (all masked) or NaN become 0."""
    state.check_rows(numerator, "softmax_normalize")
    ops = numerator.ops
    l = reduced_sum(state)
    ref = l.values[0]
    zero = ops.const(0.0, ref)
    inv = []
    for x in l.values:
        ok = ops.gt(x, zero)  # false for 0 and NaN
        inv.append(ops.select(ok, ops.rcp(x), zero))
    return broadcast_rows(numerator, l.with_data(inv), ops.mul)


def softmax_lse(state: SoftmaxState, scale=1.0) -> Fragment:
    """log-sum-exp per row in natural-log units: m*scale + ln(l); -inf where l == 0."""
    ops = state.maximum.ops
    l = reduced_sum(state)
    ref = l.values[0]
    zero = ops.const(0.0, ref)
    ln2 = ops.const(math.log(2.0), ref) if not ops.traced else math.log(2.0)
    s = ops.const(scale, ref) if not ops.traced and isinstance(scale, (int, float)) else scale
    out = []
    for m, x in zip(state.maximum.values, l.values):
        val = ops.fma(m, s, ops.mul(ops.log2(x), ln2))
        out.append(ops.select(ops.gt(x, zero), val, ops.const(NEG_INF, ref)))
    return l.with_data(out)


def softmax_merge(a: SoftmaxState, b: SoftmaxState, scale=1.0):
    """Combine two independent summaries of the same rows: (state, rescale_a, rescale_b).

    Merging is not associative in floating point: chunk order changes the last bits.
    """
    if a.maximum.layout != b.maximum.layout or a.maximum.ownership != b.maximum.ownership:
        raise OwnershipError(f"softmax_merge: summaries of different rows or owners: {a.maximum} and {b.maximum}", None)
    ops = a.maximum.ops
    la, lb = reduced_sum(a), reduced_sum(b)
    ref = la.values[0]
    c = _coef(ops, scale, ref)
    neg_inf, zero = ops.const(NEG_INF, ref), ops.const(0.0, ref)
    ms, ra, rb, ls = [], [], [], []
    for ma, mb, xa, xb in zip(a.maximum.values, b.maximum.values, la.values, lb.values):
        m = ops.max(ma, mb)
        mu = ops.select(ops.eq(m, neg_inf), zero, m)
        fa = ops.exp2(ops.mul(ops.sub(ma, mu), c))
        fb = ops.exp2(ops.mul(ops.sub(mb, mu), c))
        ms.append(m)
        ra.append(fa)
        rb.append(fb)
        ls.append(ops.fma(fa, xa, ops.mul(fb, xb)))
    st = SoftmaxState(a.maximum.with_data(ms), la.with_data(ls), a.dims, False)
    return st, a.maximum.with_data(ra), a.maximum.with_data(rb)
