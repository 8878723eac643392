"""The online softmax of the Hopper attention forward, one key tile at a time.

Each consumer thread holds two rows of a wgmma accumulator (register i of an m64nN tile lies
in row half ``(i >> 1) & 1``); the four lanes of a quad share those rows. Per row the state
is

* ``m``: the reference maximum of raw scores that the exponents are measured from (-inf until
  the row has seen a key). With a rescale threshold T it is *lazy*: it moves only when a
  tile's maximum exceeds it by more than T in the log2 domain, so most tiles skip the O
  rescale (a warp-uniform branch); the weights are then at most 2^T (T = 8: 256), which fp32
  sums and bf16/fp16 weights hold. Without a threshold it is the running maximum.
* ``l``: this lane's share of the row sum (reduced over the quad once, at the end).
* ``lo``: m*c - round(m*c) (c = scale * log2 e), exact through one FMA.

and one warp-uniform flag ``ffma`` per warp: which exponent form the warp used last.

Exponent forms (docs/performance.md, "v5"). "ffma": p = ex2(fma(s, c, -round(m c))), one FMA per
score. Rounding m c costs at most half an ulp of m c, the same for every score of the row, so
it cancels between numerator and sum -- but only while it is small: at |m c| >= 2^30 (bf16;
2^26 for fp16, whose weights overflow past 2^16) the warp takes the exact form
p = ex2((s - m) c), exact at the maximum for any magnitude (scores ~1e11 from inputs of
133120). The choice is a vote over the warp, so the branch is uniform. The effective reference
of a row is R = m c - ffma * lo, and the rescale factor between tiles is 2^(R_old - R_new),
computed as ex2(fma(m_old - m_new, c, ffma_new lo_new - ffma_old lo_old)): exact across a
change of form, 1 exactly when nothing changed. The log-sum-exp is
m scale + (log2 l - ffma lo) ln 2.

"exact" always takes the exact form; "fast" always the FMA form (no guard: only to measure
what the guard costs; wrong for huge scores). "shared" is "ffma" with one exponent sequence for
both forms: a warp in the exact form first shifts its scores (s - m, the exact form's FADD) and
sets the offset to 0, and every warp then runs p = ex2(fma(s, c, offset)); fma(s - m, c, 0)
rounds as (s - m) c does, so the weights are bit for bit those of "ffma" (the polynomial, with
POLY_EXP2, then serves both forms). The point is code size: "ffma" carries the exponent block
twice.

``poly`` > 0 computes that many of every 8 exponentials of the FMA form with a polynomial on
the FMA pipe instead of MUFU.EX2 (Cody-Waite: 2^x = 2^round(x) * q(x - round(x)), q of degree
3 for bf16 weights and 4 for fp16, relative error 1.0e-4 / 2.9e-6, below the rounding of P).
"""
import math

import tylopy as ty

NEG_INF = float("-inf")
LOG2E = 1.4426950408889634
LN2 = math.log(2.0)
# Below this |m c| the FMA form's common offset error (half an ulp of m c: 32 at 2^30) keeps the
# largest weight under 2^(T + 32) (bf16, fp32 sums) or 2^(T + 2) (fp16, at 2^26).
FFMA_LIMIT = {"bf16": 2.0 ** 30, "f16": 2.0 ** 26}
# 2^f on [-1/2, 1/2] with q(0) = 1 exactly (so x = -127 gives +0); minimax in relative error.
POLY_COEFFS = {3: (0.6932829022407532, 0.24221037328243256, 0.05500858277082443),
               4: (0.6931241750717163, 0.24024099111557007, 0.05590637028217316, 0.009582818485796452)}
POLY_DEGREE = {"bf16": 3, "f16": 4}
ROUND_MAGIC = 12582912.0  # 1.5 * 2^23: x + M rounds x to an integer held in the low mantissa bits

# ty.vote_all / ty.vote_any when the toolkit has them (one instruction, and ptxas sees a uniform
# predicate); otherwise a butterfly over the quads (the predicates are already quad-uniform).
HAVE_VOTE = hasattr(ty, "vote_all") and hasattr(ty, "vote_any")


@ty.func
def _quad_uniform_all(pred):
    x = ty.select(pred, 1, 0)
    for d in (4, 8, 16):
        x = ty.minimum(x, ty.shfl_xor(x, d))
    return x != 0


@ty.func
def warp_all(pred):
    """True in every lane iff ``pred`` (the same in the four lanes of each quad) holds in every lane."""
    if HAVE_VOTE:
        return ty.vote_all(pred)
    return _quad_uniform_all(pred)


@ty.func
def warp_any(pred):
    if HAVE_VOTE:
        return ty.vote_any(pred)
    return ~_quad_uniform_all(~pred)


def row_of(i):
    """Which of the thread's two rows register i of a wgmma accumulator lies in."""
    return (i >> 1) & 1


@ty.func
def tree(fn, xs):
    """fn-reduce a list pairwise: the dependency chain is log2(len) deep, not len."""
    xs = list(xs)
    while len(xs) > 1:
        nxt = [fn(xs[k], xs[k + 1]) for k in range(0, len(xs) - 1, 2)]
        if len(xs) % 2:
            nxt.append(xs[-1])
        xs = nxt
    return xs[0]


@ty.func
def _add(a, b):
    return a + b


@ty.func
def row_maxima(vals):
    """The two rows' maxima over this tile's scores, reduced over the quad (raw score units)."""
    out = []
    for r in range(2):
        x = tree(ty.maximum, [v for i, v in enumerate(vals) if row_of(i) == r])
        x = ty.maximum(x, ty.shfl_xor(x, 1))
        out.append(ty.maximum(x, ty.shfl_xor(x, 2)))
    return out


@ty.func
def row_sums(vals):
    return [tree(_add, [v for i, v in enumerate(vals) if row_of(i) == r]) for r in range(2)]


class Softmax:
    """Compile-time choices of the softmax step: exponent form, lazy threshold, polynomial share."""

    def __init__(self, scale, dtype_name, exponent="ffma", threshold=8.0, poly=0, offset=0.0):
        if exponent not in ("ffma", "shared", "exact", "fast"):
            raise ValueError(f"EXPONENT expects 'ffma', 'shared', 'exact' or 'fast', but got {exponent!r}")
        if threshold is not None and not threshold >= 0:
            raise ValueError(f"RESCALE_THRESHOLD expects None or a number >= 0, but got {threshold!r}")
        if not (isinstance(poly, int) and 0 <= poly <= 8):
            raise ValueError(f"POLY_EXP2 expects an int 0..8 (exponentials of every 8 on the FMA pipe), "
                             f"but got {poly!r}")
        self.scale = scale
        self.c = scale * LOG2E
        self.exponent = exponent
        self.threshold = threshold
        self.poly = poly
        self.limit = FFMA_LIMIT[dtype_name]
        self.degree = POLY_DEGREE[dtype_name]
        # log2 of a power of two every weight is multiplied by (FP8 weights: headroom below e4m3's
        # 448, so that small weights stay normal); it cancels in O / l, and ``finish`` takes it out of
        # the LSE. 0 emits nothing.
        self.offset = offset


@ty.func
def initial_state():
    """(m, l, lo, ffma): no key seen; the flag says 'FMA form' (nothing to convert from)."""
    m = [ty.cast(NEG_INF, ty.f32), ty.cast(NEG_INF, ty.f32)]
    zero = [ty.cast(0.0, ty.f32), ty.cast(0.0, ty.f32)]
    return {"m": m, "l": zero, "lo": list(zero), "ffma": ty.cast(1, ty.i1)}


@ty.func
def poly_exp2(x, degree):
    """2^x on the FMA pipe; exact +0 for x <= -127 (and -inf)."""
    x = ty.maximum(x, -127.0)
    t = x + ROUND_MAGIC
    f = x - (t - ROUND_MAGIC)
    coeffs = POLY_COEFFS[degree]
    q = ty.cast(coeffs[-1], ty.f32)
    for k in range(len(coeffs) - 2, -1, -1):
        q = ty.fma(q, f, coeffs[k])
    q = ty.fma(q, f, 1.0)
    bits = ty.bitcast(q, ty.i32) + (ty.bitcast(t, ty.i32) << 23)
    return ty.bitcast(bits, ty.f32)


@ty.func
def _exps_ffma(vals, c, neg_hi, poly, degree):
    out = []
    for i, s in enumerate(vals):
        x = ty.fma(s, c, neg_hi[row_of(i)])
        out.append(poly_exp2(x, degree) if i % 8 < poly else ty.exp2(x))
    return out


@ty.func
def _exps_exact(vals, c, m_use, offset=0.0):
    if offset:
        return [ty.exp2((s - m_use[row_of(i)]) * c + offset) for i, s in enumerate(vals)]
    return [ty.exp2((s - m_use[row_of(i)]) * c) for i, s in enumerate(vals)]


def _with_offset(sm, neg_hi):
    """The per-row exponent offsets with the weights' power-of-two headroom added (none when 0)."""
    if sm.offset:
        return [x + sm.offset for x in neg_hi]
    return neg_hi


@ty.func
def update(sm, state, vals):
    """One tile of raw scores (masked entries -inf) -> (state, p, alpha per row, rescale).

    ``rescale`` is warp-uniform: False means alpha is 1 for both rows of every lane of the
    warp, and the caller may skip multiplying O (and earlier weights) by it.
    """
    c = sm.c
    m_old, lo_old, ffma_old = state["m"], state["lo"], state["ffma"]
    t = row_maxima(vals)
    if sm.threshold is None:
        m_new = [ty.maximum(a, b) for a, b in zip(m_old, t)]
        moved = None
    else:
        exceed = [(t[r] - m_old[r]) * c > sm.threshold for r in range(2)]
        m_new = [ty.select(exceed[r], t[r], m_old[r]) for r in range(2)]
        moved = warp_any(exceed[0] | exceed[1])
    m_use = [ty.select(m == NEG_INF, 0.0, m) for m in m_new]
    hi = [m * c for m in m_use]
    lo = [ty.fma(m_use[r], c, -hi[r]) for r in range(2)]
    if sm.exponent == "exact":
        ffma = ty.cast(0, ty.i1)
        p = _exps_exact(vals, c, m_use, sm.offset)
    elif sm.exponent == "fast":
        ffma = ty.cast(1, ty.i1)
        p = _exps_ffma(vals, c, _with_offset(sm, [-h for h in hi]), sm.poly, sm.degree)
    elif sm.exponent == "shared":
        ffma = warp_all((ty.abs(hi[0]) < sm.limit) & (ty.abs(hi[1]) < sm.limit))
        args, offset = list(vals), [-h for h in hi]
        if ~ffma:  # rare: the exact form's FADD, then the common sequence with no offset
            args = [v - m_use[row_of(i)] for i, v in enumerate(vals)]
            offset = [ty.cast(0.0, ty.f32), ty.cast(0.0, ty.f32)]
        p = _exps_ffma(args, c, _with_offset(sm, offset), sm.poly, sm.degree)
    else:
        ffma = warp_all((ty.abs(hi[0]) < sm.limit) & (ty.abs(hi[1]) < sm.limit))
        if ffma:
            p = _exps_ffma(vals, c, _with_offset(sm, [-h for h in hi]), sm.poly, sm.degree)
        else:
            p = _exps_exact(vals, c, m_use, sm.offset)
    # 2^(R_old - R_new) with R = m c - ffma lo (m_old = -inf gives 0: the row had nothing).
    alpha = []
    for r in range(2):
        corr = ty.select(ffma, lo[r], 0.0) - ty.select(ffma_old, lo_old[r], 0.0)
        alpha.append(ty.exp2(ty.fma(m_old[r] - m_use[r], c, corr)))
    if sm.exponent in ("ffma", "shared") and moved is not None:  # a change of form changes R even where m stayed
        moved = moved | (ffma != ffma_old)
    new = {"m": m_new, "l": state["l"], "lo": lo, "ffma": ffma}
    return new, p, alpha, moved


@ty.func
def add_to_sums(state, alpha, p_lists):
    """l = alpha l + the tile's weights (this lane's share)."""
    l = [state["l"][r] * alpha[r] for r in range(2)]
    for p in p_lists:
        sums = row_sums(p)
        l = [l[r] + sums[r] for r in range(2)]
    return {"m": state["m"], "l": l, "lo": state["lo"], "ffma": state["ffma"]}


@ty.func
def scale_rows(vals, alpha):
    return [v * alpha[row_of(i)] for i, v in enumerate(vals)]


@ty.func
def finish(sm, state, want_lse):
    """(1/l per row, 0 for rows without keys; LSE per row or None)."""
    inv, lse = [], []
    for r in range(2):
        l = state["l"][r]
        l = l + ty.shfl_xor(l, 1)
        l = l + ty.shfl_xor(l, 2)
        ok = l > 0.0  # false for 0 and NaN
        inv.append(ty.select(ok, ty.rcp(l), 0.0))
        if want_lse:
            m = state["m"][r]
            m_use = ty.select(m == NEG_INF, 0.0, m)
            lo = ty.select(state["ffma"], state["lo"][r], 0.0)
            log_l = ty.log2(l) - lo
            if sm.offset:
                log_l = log_l - sm.offset
            val = ty.fma(m_use, sm.scale, log_l * LN2)
            lse.append(ty.select(ok, val, NEG_INF))
    return inv, (lse if want_lse else None)
