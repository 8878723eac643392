"""The Hopper attention backward of programmable attention (``attention/variants.py``): the dK/dV
kernel of ``backward.py`` with the variant's score transform, its derivative and its masks.

Per (key, query) element of a consumer's S^T tile (``variants.py`` numbers the steps)::

    x  = c (q . k)                                    step 1 (c: the scale)
    t, t' = T(x), dT/dx                               steps 2-5: softcap, score_mod, alibi, float mask
    P  = 2^(t log2(e) - L log2(e))   where visible    step 6: causal, window, Boolean mask, mask_mod,
       = 0                           elsewhere        block mask tiles, keys past n_k
    dS = P (dP - delta) t'                            (dQ = c dS K and dK = c dS^T Q as in the dense kernel)

``t'`` comes from ``ty.value_and_derivative`` over the same DSL transform that gives ``t``
(``mod_grad.py``), or from the user's ``score_mod_bwd``. Without a transform (masks only) the
element work is the dense kernel's plus the masks, and it overlaps the dP^T product. With one, the
consumer waits for dP^T first and finishes every element at once (P, t', dS, both packed): an f32
tile of P t' beside dP^T's accumulator would not fit the 240 registers (ptxas spills).

Work: without a block mask, a CTA walks the query tiles that can reach its keys under the causal
diagonal and the window (``diag`` = 0 top-left, N_k - N bottom-right). With a block mask, the
host lists per (batch, key/value head, key tile) the (query head, query tile) pairs the mask
lists, each with a flag for a full tile (mask_mod is not evaluated there), in
``backward_variant_launch.work_list``; empty tiles are never visited.
"""
import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90.backward import (KEYS_PER_CONSUMER, Config, Problem, Smem, check_config, column_stats,
                                                    TileStats, consumer, init_barriers, producer)
from tylopy_kernels.attention.sm90.backward_common import BIG, LOG2E, NEG_INF, Gradients, Sizes, TensorMaps, mask_bit
from tylopy_kernels.attention.sm90.mod_grad import (ElementAt, ForwardView, float_mask_at, mask_mod_keep,
                                                    score_and_grad, transform_has_slope)
from tylopy_kernels.attention.sm90.variant_tiles import VariantProblem, forget_loads

HQ_SHIFT = 16            # a work entry: (query head << 16) | (query tile << 1) | full


class VariantBwd:
    """The variant's data (called through ``Problem.variant``): ``fwd`` is the forward's view of it
    (``variant_tiles.VariantProblem`` with the lengths), so the transform and masks are the forward's.
    Compile-time structure is read from ``key`` only (``KernelVariant.key``: window sizes and the
    softcap are run-time values)."""

    def __init__(self, vp, lengths, work, kv_tiles, score_mod_bwd):
        """``lengths``: (n_q, n_k); ``work``: the block mask's (lists, counts, list stride);
        ``kv_tiles``: (key tiles, key/value heads), which number the lists."""
        n_q, n_k = lengths
        self.fwd = ForwardView(vp, n_q, n_k)
        self.key = vp.v
        self.diag = vp.diag
        self.work, self.work_count, self.work_stride = work
        self.n_kv_tiles, self.n_kv_heads = kv_tiles
        self.score_mod_bwd = score_mod_bwd
        self.work_range = work_range
        self.iteration = iteration
        self.score_grads = score_grads
        self.early_stats = 0 if fused_path(self) else None  # (``backward.TileStats``; None: its default)


def fused_path(vb):
    """Whether dS needs the transform's derivative beside P (``fused_words``, after the wait for
    dP^T), rather than plain exponents that overlap the dP^T product. ALiBi alone, folded, is a
    constant per row and per column (``alibi_terms``) and takes the plain path. (The launcher
    folds it at D=64 only: at D=128 the folded terms spill 24-28 bytes in either path.)"""
    key = vb.key
    with_grad = transform_has_slope(key) or vb.score_mod_bwd is not None
    return (with_grad or key.transforms_scores) and not alibi_folded(vb)


def alibi_folded(vb):
    """ALiBi alone, folded by the launcher (``KernelVariant.alibi_fold``)."""
    key = vb.key
    kv = vb.fwd.variant.kv
    return key.alibi and kv.alibi_fold and not (
        key.softcap or key.score_mod is not None or key.attn_mask == "float" or kv.scaled_first)


@ty.func
def work_slot(vb):
    """The index of this CTA's (batch, key/value head, key tile) list."""
    return (ty.block_idx(2) * vb.n_kv_heads + ty.block_idx(1)) * vb.n_kv_tiles + ty.block_idx(0)


@ty.func
def work_range(prob, n0, block_m):
    """(first query block, query blocks per head, iterations) as ``backward.work_range``: the query
    tiles whose rows can see keys n0..n0+127 under the causal diagonal and the window, or (block
    mask) the length of this CTA's list."""
    vb = prob.variant
    key = vb.key
    vp = vb.fwd.variant
    if key.block_mask is not None:
        return 0, 0, vb.work_count[work_slot(vb)]
    m_first = 0
    m_end = prob.num_m
    if key.causal or key.window[1] >= 0:  # key j is seen by queries i >= j - diag - reach
        reach = ty.cast(0, ty.i32)
        if key.window[1] >= 0:
            reach = vp.right
            if key.causal:
                reach = ty.minimum(reach, 0)
        m_first = ty.maximum(n0 - vb.diag - reach, 0) // block_m
    if key.window[0] >= 0:                # ... and i <= j - diag + left
        m_end = ty.minimum(ty.maximum(n0 + 127 - vb.diag + vp.left, -1) // block_m + 1, prob.num_m)
    per_head = ty.maximum(m_end - m_first, 0)
    return m_first, per_head, per_head * prob.group


@ty.func
def work_entry(prob, it):
    vb = prob.variant
    return vb.work[ty.cast(work_slot(vb), ty.i64) * vb.work_stride + ty.cast(it, ty.i64)]


@ty.func
def iteration(prob, hk, m_first, per_head, it, block_m):
    if prob.variant.key.block_mask is not None:
        entry = work_entry(prob, it)
        return entry >> HQ_SHIFT, ((entry >> 1) & ((1 << (HQ_SHIFT - 1)) - 1)) * block_m
    return hk * prob.group + it // per_head, (m_first + it % per_head) * block_m


@ty.func
def position_bounds(vb, key0, m0):
    """Per key row of this thread (g and g + 8 of its warp's 16): (ok, lo, hi) such that query
    column offset o_i = 8(i >> 2) + (i & 1) of register i is visible under the key length, the
    causal diagonal and the window iff ok and lo <= o_i <= hi (``variant_tiles._visible``'s rules,
    solved for the query once per row so each register costs compares with immediates; None where
    a side has no bound). With a lower bound, a key row past n_k gets lo = BIG (no column passes)
    instead of its own predicate."""
    key = vb.key
    vp = vb.fwd.variant
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    base = m0 + 2 * (lane & 3) + vb.diag      # query i of offset o: i = base - diag + o
    out = []
    for h in range(2):
        ki = key0 + 16 * warp + (lane >> 2) + 8 * h
        ok = ki < vb.fwd.n_k
        lo = None
        hi = None
        if key.causal or key.window[1] >= 0:   # i >= ki - diag - reach
            lo = ty.select(ok, ki - right_reach(vb) - base, BIG)
            ok = None
        if key.window[0] >= 0:                 # i <= ki - diag + left
            hi = ki + vp.left - base
        out.append((ok, lo, hi))
    return out


@ty.func
def right_reach(vb):
    """How far right of the diagonal a query sees: 0 under causal masking, the window's right
    size (at most 0 with causal), unbounded is never asked."""
    key = vb.key
    reach = ty.cast(0, ty.i32)
    if key.window[1] >= 0:
        reach = vb.fwd.variant.right
        if key.causal:
            reach = ty.minimum(reach, 0)
    return reach


def position_keep(bounds, i):
    ok, lo, hi = bounds[(i >> 1) & 1]
    o = 8 * (i >> 2) + (i & 1)
    if lo is not None:
        ok = lo <= o
    if hi is not None:
        ok = ok & (hi >= o)
    return ok


@ty.func
def tile_needs_masks(vb, key0, m0, block_m, full):
    """Whether any element of this consumer's 64 keys x the query tile can be masked: keys past
    n_k, the causal diagonal or the window's sides crossing the tile, or mask_mod (on a block
    mask's partial tiles only; ``full``: the work entry's flag). Interior tiles take the plain
    path (P = 2^(x c log2 e - L log2 e), the dense kernel's element work). A Boolean attn_mask
    is applied from its bits on every tile, outside this test."""
    key = vb.key
    vp = vb.fwd.variant
    need = key0 + KEYS_PER_CONSUMER > vb.fwd.n_k
    if key.causal or key.window[1] >= 0:      # the last key against the first query
        need = need | (key0 + KEYS_PER_CONSUMER - 1 > m0 + vb.diag + right_reach(vb))
    if key.window[0] >= 0:                    # the first key against the last query
        need = need | (key0 < m0 + block_m - 1 + vb.diag - vp.left)
    if key.mask_mod is not None:
        if full is None:
            need = ty.cast(1, ty.i1)
        else:
            need = need | ~full
    return need


class TileArgs:
    """What the element work of one consumer's tile reads (a plain holder); ``staged`` is (the ring
    stage, the query columns' L: ``backward.TileStats``), ``where`` (first key row, first query
    row, query head, batch)."""

    def __init__(self, smem, lay, prob, cfg, staged, where):
        self.smem, self.lay, self.prob, self.cfg = smem, lay, prob, cfg
        self.stage, self.lse = staged
        self.key0, self.m0, self.hq, self.b = where
        self.full = None      # a block mask's full-tile flag (with mask_mod), or None
        self.slope = None     # ALiBi's slope of this (batch, query head), or None
        self.folded = False   # ALiBi alone and folded (``alibi_terms``)
        self.bits = None      # the Boolean attn_mask's words, or None


@ty.func
def element_keep(ta, i, masked, with_bits, bounds, keys, queries):
    """Whether register i's (key, query) pair takes part (None: every pair does): ``masked``, the
    position masks and mask_mod; ``with_bits``, the Boolean attn_mask's bit."""
    vb = ta.prob.variant
    key = vb.key
    keep = None
    if masked:
        keep = position_keep(bounds, i)
        if key.mask_mod is not None:
            keep = keep & mask_mod_keep(vb, ta.b, ta.hq, queries[i], keys[(i >> 1) & 1], ta.full)
    if with_bits and ta.bits is not None:
        h, w, bit = mask_bit(i)
        got = (ta.bits[h][w] & (1 << bit)) != 0
        keep = got if keep is None else keep & got
    return keep


class QueryColumns:
    """The query index of each register, made at its first use (inside the element loop, so no
    index is live across the tile) and shared by registers i and i ^ 2 (one column): loads a mod
    makes with an index are made once per column (``mods.AuxTensor`` keys them by value)."""

    def __init__(self, m0, g2):
        self.m0, self.g2, self.made = m0, g2, {}

    def __getitem__(self, i):
        o = 8 * (i >> 2) + (i & 1)
        if o not in self.made:
            self.made[o] = self.m0 + (2 * self.g2 + o)
        return self.made[o]


def element_indices(ta):
    """(this thread's two key rows, its registers' queries): index values mods and masks read. One
    value per key row, so loads a mod makes with a key's index are made once per tile."""
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    keys = [ta.key0 + 16 * warp + (lane >> 2) + 8 * h for h in range(2)]
    return keys, QueryColumns(ta.m0, lane & 3)


@ty.func
def plain_exponents(s, ta):
    """Without a transform: x c log2(e) - L log2(e) per register (one FMA, as the dense kernel),
    -inf where the Boolean attn_mask drops the pair. Folded ALiBi (``alibi_terms``) adds one FADD."""
    vals = list(s.values)
    scale_log2 = ta.prob.scale * LOG2E
    folded = alibi_terms(ta) if ta.folded else None
    out = []
    for j in range(len(vals) // 4):
        lse = ta.lse[j]
        for e in range(4):
            i = 4 * j + e
            if folded is None:
                arg = ty.fma(vals[i], scale_log2, -lse[e & 1])
            else:
                arg = alibi_exponent(vals[i], scale_log2, folded, j, e, lse)
            keep = element_keep(ta, i, False, True, None, None, None)
            out.append(arg if keep is None else ty.select(keep, arg, NEG_INF))
    return out


def alibi_terms(ta):
    """ALiBi folded (``KernelVariant.alibi_fold``: every visible key j of query i has distance
    d = i + N_k - N - j >= 0), in log2 units: -slope d = slope (j - k0) - slope (i + N_k - N - k0)
    with k0 this consumer's first key row, each part within a tile of 0 near the diagonal (where
    the weights that count are). Returns (the key part of this thread's two rows, the query part of
    its first column, -slope log2(e)'s factor for the others): per element one FADD beside the
    dense kernel's FMA, where the distance costs an IADD, an FADD and an FFMA and the transform
    path waits for dP^T before its exponents."""
    fv = ta.prob.variant.fwd
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    slope_log2 = ta.slope * LOG2E
    rows = [slope_log2 * ty.cast(16 * warp + (lane >> 2) + 8 * h, ty.f32) for h in range(2)]
    first = -slope_log2 * ty.cast(ta.m0 + 2 * (lane & 3) + (fv.n_k - fv.n_q) - ta.key0, ty.f32)
    return rows, first, slope_log2


def alibi_exponent(x, scale_log2, folded, j, e, lse):
    """x c log2(e) - L log2(e) plus folded ALiBi (``alibi_terms``) for register 4 j + e."""
    rows, first, slope_log2 = folded
    col = ty.fma(-slope_log2, float(8 * j + (e & 1)), first) - lse[e & 1]
    return ty.fma(x, scale_log2, col) + rows[((4 * j + e) >> 1) & 1]


@ty.func
def masked_exponents(args, ta):
    """``plain_exponents``' values with the position masks and mask_mod applied (-inf where dropped)."""
    vb = ta.prob.variant
    bounds = position_bounds(vb, ta.key0, ta.m0)
    forget_loads(vb.fwd.variant)     # a new scope for the mods' shared loads (``mods.AuxTensor``)
    keys, queries = element_indices(ta)
    return [ty.select(element_keep(ta, i, True, False, bounds, keys, queries), args[i], NEG_INF)
            for i in range(len(args))]


@ty.func
def fused_words(s, dp, ta):
    """With a transform (dP^T already waited for): P = 2^(T(x) log2 e - L log2 e) and dS = P (dP
    - delta) T'(x) per register, packed at once (no f32 tile of P T' beside dP^T: that spills).
    One pass with every mask (a second branch of the transform spills at D = 128)."""
    vb = ta.prob.variant
    key = vb.key
    vals = list(s.values)
    dv = dp.values
    with_grad = transform_has_slope(key) or vb.score_mod_bwd is not None
    bounds = position_bounds(vb, ta.key0, ta.m0)
    forget_loads(vb.fwd.variant)
    keys, queries = element_indices(ta)
    lay = ta.lay
    p_words = []
    ds_words = []
    for j in range(len(vals) // 4):
        lse = ta.lse[j]
        delta = column_stats(ta.smem, lay.delta + ta.stage * lay.stat_bytes, j)
        ps = []
        ds = []
        for e in range(4):
            i = 4 * j + e
            ki = keys[(i >> 1) & 1]
            qi = queries[i]
            mval = None
            if key.attn_mask == "float":
                mval = float_mask_at(vb, ta.b, ta.hq, qi, ki)
            t, grad = score_and_grad(vb, ElementAt(ta.b, ta.hq, qi, ki), vals[i] * ta.prob.scale, with_grad, ta.slope,
                                     mval)
            arg = ty.fma(t, LOG2E, -lse[e & 1])
            keep = element_keep(ta, i, True, True, bounds, keys, queries)
            p = ty.exp2(arg if keep is None else ty.select(keep, arg, NEG_INF))
            ps.append(p)
            ds.append((p * grad if with_grad else p) * (dv[i] - delta[e & 1]))
        for h in range(2):
            p_words.append(ty.pack2(ps[2 * h], ps[2 * h + 1], ta.cfg.dtype))
            ds_words.append(ty.pack2(ds[2 * h], ds[2 * h + 1], ta.cfg.dtype))
    return p_words, ds_words


@ty.func
def score_grads(s, dp, c, staged, where, it, bits):
    """(P^T operands of dV, dS^T operands of dK), the variant's ``score_grads_t``: P^T from the
    transformed scores, dS^T = P^T (dP^T - delta) t'. Tiles no mask can cut (``tile_needs_masks``)
    skip the masks' element work: the masked and the plain element code are two branches.
    ``c``: the consumer (``backward.Consumer``); ``staged``, ``where``: ``TileArgs``' (stage, L)
    and (key0, m0, hq, b)."""
    smem, lay, prob, cfg = c.smem, c.lay, c.prob, c.cfg
    key0, m0, hq, b = where
    stage = staged[0]
    vb = prob.variant
    key = vb.key
    ta = TileArgs(smem, lay, prob, cfg, staged, where)
    ta.bits = bits
    if key.block_mask is not None and key.mask_mod is not None:
        ta.full = (work_entry(prob, it) & 1) != 0
    if key.alibi:
        ta.slope = vb.fwd.variant.slopes[b, hq]
    need = tile_needs_masks(vb, key0, m0, cfg.block_m, ta.full)
    ta.folded = alibi_folded(vb)
    if fused_path(vb):
        # dS needs t' beside P: wait for dP^T first and finish each element at once.
        dp = hopper.wgmma_wait(0, dp)
        p_words, ds_words = fused_words(s, dp, ta)
    else:
        # Masks only: the exponents overlap the dP^T product, as in the dense kernel.
        args = plain_exponents(s, ta)
        if need:
            args = masked_exponents(args, ta)
        p_f32 = [ty.exp2(a) for a in args]
        delta = TileStats(smem, lay.delta + stage * lay.stat_bytes, cfg.block_m)  # before the wait
        dp = hopper.wgmma_wait(0, dp)
        dv = dp.values
        p_words = []
        ds_words = []
        for j in range(len(p_f32) // 4):
            ds = [p_f32[4 * j + e] * (dv[4 * j + e] - delta[j][e & 1]) for e in range(4)]
            for h in range(2):
                p_words.append(ty.pack2(p_f32[4 * j + 2 * h], p_f32[4 * j + 2 * h + 1], cfg.dtype))
                ds_words.append(ty.pack2(ds[2 * h], ds[2 * h + 1], cfg.dtype))
    p_ops = [ty.Fragment(tuple(p_words[4 * kk: 4 * kk + 4]), ty.WGMMA_A_RS, pack=2, dtype=cfg.dtype)
             for kk in range(len(p_words) // 4)]
    ds_ops = [ty.Fragment(tuple(ds_words[4 * kk: 4 * kk + 4]), ty.WGMMA_A_RS, pack=2, dtype=cfg.dtype)
              for kk in range(len(ds_words) // 4)]
    return p_ops, ds_ops


@ty.kernel(threads=384, min_blocks_per_sm=1, noalias=True)
def attention_bwd_variant_sm90(
    tm_q: ty.tensormap, tm_k: ty.tensormap, tm_v: ty.tensormap, tm_do: ty.tensormap,
    tm_lse: ty.tensormap, tm_delta: ty.tensormap, tm_dq: ty.tensormap,
    dk: ty.ptr(ty.i16), dv: ty.ptr(ty.i16), dq_accum: ty.ptr(ty.f32), mask_bits: ty.ptr(ty.u32),
    work: ty.ptr(ty.i32), work_count: ty.ptr(ty.i32),
    n_q: ty.i32, n_k: ty.i32, n_heads: ty.i32, group: ty.i32, n_pad: ty.i32, scale: ty.f32,
    work_stride: ty.i64, n_kv_tiles: ty.i32, n_kv_heads: ty.i32,
    dk_stride_b: ty.i64, dk_stride_h: ty.i64, dk_stride_n: ty.i64,
    dv_stride_b: ty.i64, dv_stride_h: ty.i64, dv_stride_n: ty.i64,
    mb_stride_b: ty.i64, mb_stride_h: ty.i64, mb_stride_row: ty.i64,
    diag: ty.i32, win_left: ty.i32, win_right: ty.i32, softcap: ty.f32,
    slopes: ty.tensor(ty.f32, 2), sinks: ty.tensor(ty.f32, 1), mask: ty.tensor(4, index=ty.i64),
    bm_num: ty.tensor(ty.i32, 3), bm_idx: ty.tensor(ty.i32, 4), bm_full_num: ty.tensor(ty.i32, 3),
    bm_full_idx: ty.tensor(ty.i32, 4),
    aux0: ty.tensor(4), aux1: ty.tensor(4), aux2: ty.tensor(4), aux3: ty.tensor(4),
    VARIANT: ty.constexpr = None, SCORE_MOD_BWD: ty.constexpr = None,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_M: ty.constexpr = 128,
    STAGES: ty.constexpr = 2, HAS_MASK: ty.constexpr = False, DQ: ty.constexpr = "tma",
    DQ_ORDER: ty.constexpr = "serial", DK_SMEM: ty.constexpr = False,
    Q_ORDER: ty.constexpr = ("n", "h", "b"), KV_ORDER: ty.constexpr = ("n", "h", "b"),
):
    """``attention_bwd_sm90`` with ``VARIANT`` (a ``variant_tiles.KernelVariant``): grid (key tiles of
    128, key/value heads, batch). ``mask_bits``: a Boolean attn_mask packed as the dense kernel's;
    ``work``/``work_count``: the block mask's lists (``backward_variant_launch.work_list``); from
    ``diag`` on, the forward's variant arguments (``variant_launch.variant_args``)."""
    check_config(HEAD_DIM, BLOCK_M, STAGES, DQ, DQ_ORDER)
    cfg = Config(DTYPE, HEAD_DIM, BLOCK_M, STAGES, has_mask=HAS_MASK, dq=DQ, dq_order=DQ_ORDER, dk_smem=DK_SMEM,
                 q_order=Q_ORDER, kv_order=KV_ORDER)
    lay = Smem(HEAD_DIM, BLOCK_M, STAGES, DQ)
    smem = ty.dynamic_shared(ty.u8, lay.total, align=1024)
    prob = Problem(Sizes(n_q, n_k, n_heads, group, n_pad), scale, 0,
                   (mask_bits, (mb_stride_b, mb_stride_h, mb_stride_row)), BLOCK_M)
    prob.diag = diag
    vp = VariantProblem(VARIANT, (diag, win_left, win_right, softcap), (slopes, sinks, mask),
                        (bm_num, bm_idx, bm_full_num, bm_full_idx), (aux0, aux1, aux2, aux3))
    prob.variant = VariantBwd(vp, (n_q, n_k), (work, work_count, work_stride), (n_kv_tiles, n_kv_heads),
                              SCORE_MOD_BWD)
    init_barriers(smem, lay, STAGES)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, lay, prob, cfg, TensorMaps(tm_q, tm_k, tm_v, tm_do, tm_lse, tm_delta, tm_dq))
    else:
        consumer(smem, lay, prob, cfg, wg, Gradients(dk, dv, dq_accum, (dk_stride_b, dk_stride_h, dk_stride_n),
                                                     (dv_stride_b, dv_stride_h, dv_stride_n)))
