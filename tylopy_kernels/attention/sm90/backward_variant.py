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
import dataclasses
import hashlib

import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90.backward import (Config, Problem, Smem, check_config, column_stats, consumer,
                                                    init_barriers, producer)
from tylopy_kernels.attention.sm90.backward_common import LOG2E, NEG_INF, mask_bit
from tylopy_kernels.attention.sm90.mod_grad import score_and_grad, transform_has_slope

HQ_SHIFT = 16            # a work entry: (query head << 16) | (query tile << 1) | full


class CompiledVariant:
    """The VARIANT constexpr: the call's Variant, fingerprinted by value for the compile cache (its
    mods by their code, constants and captured values; not by their registry ids)."""

    def __init__(self, variant):
        self.variant = variant

    def __eq__(self, other):
        return isinstance(other, CompiledVariant) and self.__tylopy_fingerprint__() == other.__tylopy_fingerprint__()

    def __hash__(self):
        return hash(self.__tylopy_fingerprint__())

    def __tylopy_fingerprint__(self):
        v = self.variant
        parts = [repr(dataclasses.replace(v, score_mod=None, mask_mod=None))]
        for ref in (v.score_mod, v.mask_mod):
            if ref is not None:
                code = ref.code
                digest = hashlib.sha256(code.co_code + repr((code.co_consts, code.co_names, code.co_varnames,
                                                             code.co_filename, ref.captured)).encode())
                parts.append(f"{ref.qualname}:{digest.hexdigest()[:24]}")
        return "|".join(parts)


class VariantBwd:
    """The compile-time variant and its run-time data (called through ``Problem.variant``)."""

    def __init__(self, variant, n_q, n_k, diag, slopes, slope_stride_b, fmask, fm_strides, work, work_count,
                 work_stride, n_kv_tiles, n_kv_heads, score_mod_bwd):
        self.variant = variant
        self.n_q, self.n_k, self.diag = n_q, n_k, diag
        self.slopes, self.slope_stride_b = slopes, slope_stride_b
        self.fmask, self.fm_strides = fmask, fm_strides
        self.work, self.work_count, self.work_stride = work, work_count, work_stride
        self.n_kv_tiles, self.n_kv_heads = n_kv_tiles, n_kv_heads
        self.score_mod_bwd = score_mod_bwd
        self.work_range = work_range
        self.iteration = iteration
        self.score_grads = score_grads


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
    var = vb.variant
    if var.block_mask is not None:
        return 0, 0, vb.work_count[work_slot(vb)]
    left, right = var.window
    if var.causal:
        right = 0 if right < 0 else min(right, 0)
    m_first = 0
    m_end = prob.num_m
    if right >= 0:  # key j is seen by queries i >= j - diag - right
        m_first = ty.maximum(n0 - vb.diag - right, 0) // block_m
    if left >= 0:   # ... and i <= j - diag + left
        m_end = ty.minimum(ty.maximum(n0 + 127 - vb.diag + left, -1) // block_m + 1, prob.num_m)
    per_head = ty.maximum(m_end - m_first, 0)
    return m_first, per_head, per_head * prob.group


@ty.func
def work_entry(prob, it):
    vb = prob.variant
    return vb.work[ty.cast(work_slot(vb), ty.i64) * vb.work_stride + ty.cast(it, ty.i64)]


@ty.func
def iteration(prob, hk, m_first, per_head, it, block_m):
    if prob.variant.variant.block_mask is not None:
        entry = work_entry(prob, it)
        return entry >> HQ_SHIFT, ((entry >> 1) & ((1 << (HQ_SHIFT - 1)) - 1)) * block_m
    return hk * prob.group + it // per_head, (m_first + it % per_head) * block_m


@ty.func
def visible(prob, b, hq, qi, ki, full):
    """Step 6 without the Boolean mask's bits: keys past n_k, causal, window, mask_mod (not on a
    block mask's full tiles). Rows past n_q need nothing: their L is +inf."""
    vb = prob.variant
    var = vb.variant
    keep = ki < vb.n_k
    if var.causal:
        keep = keep & (ki <= qi + vb.diag)
    left, right = var.window
    if left >= 0:
        keep = keep & (ki >= qi + vb.diag - left)
    if right >= 0:
        keep = keep & (ki <= qi + vb.diag + right)
    if var.mask_mod is not None:
        # in-range indices only: a mod may index a tensor with them (the element is masked anyway)
        qc = ty.minimum(qi, vb.n_q - 1)
        kc = ty.minimum(ki, vb.n_k - 1)
        got = var.mask_mod.function()(b, hq, qc, kc)
        keep = keep & (got | full) if full is not None else keep & got
    return keep


@ty.func
def score_grads(s, dp, smem, lay, prob, cfg, stage, key0, m0, hq, b, it, bits):
    """(P^T operands of dV, dS^T operands of dK), the variant's ``score_grads_t``: P^T from the
    transformed scores, dS^T = P^T (dP^T - delta) t'."""
    vb = prob.variant
    var = vb.variant
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    full = None
    if var.block_mask is not None and var.mask_mod is not None:
        full = (work_entry(prob, it) & 1) != 0
    with_grad = transform_has_slope(var) or vb.score_mod_bwd is not None
    fused = with_grad or var.transforms_scores   # (a transform's registers: no f32 P tile beside dP^T)
    if fused:
        # dS needs t' beside P: wait for dP^T first and finish each element at once (P, t', dS,
        # both packed), so no f32 tile of P t' waits beside dP^T's registers (that spills).
        dp = hopper.wgmma_wait(0, dp)
    vals = list(s.values)
    dv = dp.values if fused else None
    p_f32 = []     # t' = 1: f32 P until dP^T is there
    p_words = []
    ds_words = []
    for j in range(len(vals) // 4):
        lse = column_stats(smem, lay.lse + stage * lay.stat_bytes, j)
        delta = column_stats(smem, lay.delta + stage * lay.stat_bytes, j) if fused else None
        ps = []
        ds = []
        for e in range(4):
            i = 4 * j + e
            r, c = s.layout.coord(warp, lane, i)
            ki = key0 + r
            qi = m0 + c
            t, grad = score_and_grad(prob, b, hq, qi, ki, vals[i] * prob.scale, with_grad)
            keep = visible(prob, b, hq, qi, ki, full)
            if bits is not None:
                h, w, bit = mask_bit(i)
                keep = keep & ((bits[h][w] & (1 << bit)) != 0)
            p = ty.exp2(ty.select(keep, ty.fma(t, LOG2E, -lse[e & 1]), NEG_INF))
            ps.append(p)
            if fused:
                ds.append((p * grad if with_grad else p) * (dv[i] - delta[e & 1]))
        if fused:
            for h in range(2):
                p_words.append(ty.pack2(ps[2 * h], ps[2 * h + 1], cfg.dtype))
                ds_words.append(ty.pack2(ds[2 * h], ds[2 * h + 1], cfg.dtype))
        else:
            p_f32 += ps
    if not fused:
        dp = hopper.wgmma_wait(0, dp)
        dv = dp.values
        for j in range(len(vals) // 4):
            delta = column_stats(smem, lay.delta + stage * lay.stat_bytes, j)
            ds = [p_f32[4 * j + e] * (dv[4 * j + e] - delta[e & 1]) for e in range(4)]
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
    slopes: ty.ptr(ty.f32), fmask: ty.ptr(ty.f32), work: ty.ptr(ty.i32), work_count: ty.ptr(ty.i32),
    n_q: ty.i32, n_k: ty.i32, n_heads: ty.i32, group: ty.i32, n_pad: ty.i32, scale: ty.f32, diag: ty.i32,
    slope_stride_b: ty.i32, work_stride: ty.i64, n_kv_tiles: ty.i32, n_kv_heads: ty.i32,
    dk_stride_b: ty.i64, dk_stride_h: ty.i64, dk_stride_n: ty.i64,
    dv_stride_b: ty.i64, dv_stride_h: ty.i64, dv_stride_n: ty.i64,
    mb_stride_b: ty.i64, mb_stride_h: ty.i64, mb_stride_row: ty.i64,
    fm_stride_b: ty.i64, fm_stride_h: ty.i64, fm_stride_q: ty.i64, fm_stride_k: ty.i64,
    VARIANT: ty.constexpr, SCORE_MOD_BWD: ty.constexpr = None,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_M: ty.constexpr = 128,
    STAGES: ty.constexpr = 2, HAS_MASK: ty.constexpr = False, DQ: ty.constexpr = "tma",
    DQ_ORDER: ty.constexpr = "serial", DK_SMEM: ty.constexpr = False,
    Q_ORDER: ty.constexpr = ("n", "h", "b"), KV_ORDER: ty.constexpr = ("n", "h", "b"),
):
    """``attention_bwd_sm90`` with ``VARIANT`` (a ``variants.Variant``): grid (key tiles of 128,
    key/value heads, batch). ``mask_bits``: the Boolean attn_mask packed as the dense kernel's;
    ``slopes``: ALiBi slopes (b * slope_stride_b + h); ``fmask``: the float attn_mask in fp32 read
    through its strides; ``work``/``work_count``: the block mask's lists (``work_list``)."""
    check_config(HEAD_DIM, BLOCK_M, STAGES, DQ, DQ_ORDER)
    cfg = Config(DTYPE, HEAD_DIM, BLOCK_M, STAGES, HAS_MASK, DQ, DQ_ORDER, DK_SMEM, Q_ORDER, KV_ORDER)
    lay = Smem(HEAD_DIM, BLOCK_M, STAGES, DQ)
    smem = ty.dynamic_shared(ty.u8, lay.total, align=1024)
    prob = Problem(n_q, n_k, n_heads, group, n_pad, scale, 0, mask_bits, (mb_stride_b, mb_stride_h, mb_stride_row),
                   BLOCK_M)
    prob.diag = diag
    prob.variant = VariantBwd(VARIANT.variant, n_q, n_k, diag, slopes, slope_stride_b, fmask,
                              (fm_stride_b, fm_stride_h, fm_stride_q, fm_stride_k), work, work_count, work_stride,
                              n_kv_tiles, n_kv_heads, SCORE_MOD_BWD)
    init_barriers(smem, lay, STAGES)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, lay, prob, cfg, tm_q, tm_k, tm_v, tm_do, tm_lse, tm_delta, tm_dq)
    else:
        consumer(smem, lay, prob, cfg, wg, dk, dv, dq_accum, (dk_stride_b, dk_stride_h, dk_stride_n),
                 (dv_stride_b, dv_stride_h, dv_stride_n))
