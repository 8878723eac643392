"""Variants on the Hopper attention forward: which key tiles a query tile visits, and what happens
to a tile of scores (``variants.py`` defines the semantics).

The producer asks ``tiles.next_tile`` for its tile count and ``tiles.key_row`` for each tile's
first key row; a problem carrying a ``VariantProblem`` answers from it:

* tiles in range: the key range of causal masking and a sliding window around the diagonal
  (``diag`` = 0 top-left, N_k - N bottom-right), so tiles wholly outside are never loaded;
* a block mask: the query tile's partial tiles (``kv_indices``) then its full ones
  (``full_kv_indices``); an empty query tile visits none and writes zeros (LSE -inf, or the sink).

The consumers then run ``scores`` on each tile's S fragment: the score transform in natural units
(scale, softcap, score_mod, ALiBi, float mask) when the variant has one, then the masks (key
range, causal, window, bool mask, mask_mod on partial tiles only) as -inf before the maximum.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import tylopy as ty

from tylopy_kernels.attention.sm90 import mods
from tylopy_kernels.attention.sm90.tiles import tile_position
from tylopy_kernels.attention.variants import Variant

NEG_INF = float("-inf")
LOG2E = 1.4426950408889634
WIDE_POSITIONS = 1 << 22      # from this length on, an ALiBi distance may not fit the exponent trick
MAGIC = 0x4B400000            # the bits of 1.5 * 2^23


@dataclass(frozen=True)
class KernelVariant:
    """The VARIANT constexpr: a Variant without its run-time values (window sizes, softcap, shapes,
    the mods' registry ids), so calls differing only in those share one specialization; ``live``
    (not compared) is the call's Variant, whose mods the trace calls."""

    key: Variant
    aux_meta: tuple                       # per aux slot: (ndim, is_bool)
    scaled_first: bool = False            # scale the scores before the softmax even without a transform
    wide_positions: bool = False          # ALiBi distances may reach 2^22: convert them with cvt (``alibi_distance``)
    alibi_fold: bool = False              # ALiBi as slope * column, its row part kept out of the softmax (``alibi_columns``)
    live: Variant = field(compare=False, default=None)

    @staticmethod
    def of(variant: Variant, aux_meta, scaled_first=False, n_q=0, n_k=0, fold_alibi=False) -> "KernelVariant":
        """``fold_alibi``: the kernel can take ALiBi folded (the forward) where every visible key lies
        left of the distance's zero (``alibi_foldable``)."""
        def blank(ref):
            return None if ref is None else replace(ref, mod_id="")
        left, right = variant.window
        key = replace(variant, softcap=1.0 if variant.softcap else 0.0, window=(min(left, 0), min(right, 0)),
                      block_mask=None if variant.block_mask is None else (variant.block_mask[0],),
                      score_mod=blank(variant.score_mod), mask_mod=blank(variant.mask_mod))
        wide = bool(variant.alibi) and max(n_q, n_k) >= WIDE_POSITIONS
        fold = fold_alibi and alibi_foldable(variant, n_q, n_k)
        return KernelVariant(key, tuple(aux_meta), bool(scaled_first), wide and not fold, fold, variant)

    def __tylopy_fingerprint__(self):
        parts = [repr(replace(self.key, score_mod=None, mask_mod=None)), repr(self.aux_meta), repr(self.scaled_first),
                 repr(self.wide_positions), repr(self.alibi_fold)]
        for ref in (self.key.score_mod, self.key.mask_mod):
            if ref is not None:
                code = ref.code
                digest = hashlib.sha256(code.co_code + repr((code.co_consts, code.co_names, code.co_varnames,
                                                             code.co_filename, ref.captured)).encode())
                parts.append(f"{ref.qualname}:{digest.hexdigest()[:24]}")
        bwd = self.live.score_mod_bwd if self.live is not None else None
        if bwd is not None and bwd.tensor_slots:  # which slots the derivative's tensors read (by identity)
            parts.append(f"score_mod_bwd slots {bwd.tensor_slots!r}")
        return "|".join(parts)

    @property
    def transforms(self) -> bool:
        return self.key.transforms_scores or self.scaled_first


def alibi_foldable(variant: Variant, n_q: int, n_k: int) -> bool:
    """Whether every key a query row sees lies at or left of the row's ALiBi zero (key j of query i has
    distance i + N_k - N - j >= 0): then -slope |distance| = slope j - slope (i + N_k - N), and the row
    part, the same for all of a row's keys, can stay out of the softmax (``alibi_columns``)."""
    if not variant.alibi:
        return False
    right = variant.window[1]
    if variant.causal:
        reach = min(right, 0) if right >= 0 else 0
    elif right >= 0:
        reach = right
    else:
        return False
    return variant.diag(n_q, n_k) + reach <= n_k - n_q


class VariantProblem:
    """The run-time data of a variant (kernel parameters) and its compile-time structure."""

    def __init__(self, kv, bounds, tensors, bm, aux):
        """``kv``: the KernelVariant; ``bounds``: (diag, window left, window right, softcap);
        ``tensors``: (ALiBi slopes, sink logits, attn_mask); ``bm``: the block mask's four tensors;
        ``aux``: the mods' four tensor slots."""
        diag, left, right, softcap = bounds
        slopes, sinks, mask = tensors
        self.kv, self.v = kv, kv.key
        self.diag, self.left, self.right, self.softcap = diag, left, right, softcap
        self.inv_softcap = 1.0 / softcap if kv.key.softcap else None  # (a run-time division once per CTA)
        # softcap_tanh's exponent scale, 2 log2(e) / softcap (once per CTA)
        self.tanh_scale = self.inv_softcap * (2.0 * LOG2E) if kv.key.softcap else None
        self.slopes, self.sinks, self.mask = slopes, sinks, mask
        self.bm_num, self.bm_idx, self.bm_full_num, self.bm_full_idx = bm
        self.aux = [mods.AuxTensor(a, meta[0], meta[1], f"aux{k}") if k < len(kv.aux_meta) else None
                    for k, (a, meta) in enumerate(zip(aux, tuple(kv.aux_meta) + ((4, False),) * 4))]
        # called through the problem: tiles.py does not import this module
        self.next_tile = variant_next_tile
        self.key_row = variant_key_row

    @property
    def has_window_left(self):
        return self.v.window[0] >= 0

    @property
    def has_right_bound(self):
        return self.v.causal or self.v.window[1] >= 0


@ty.func
def key_range(prob, m0, rows=None):
    """(first key tile, tile count) that query rows m0 .. m0 + rows - 1 (default: the work tile's
    block_m) may see (causal, window)."""
    vp = prob.variant
    rows = prob.block_m if rows is None else rows
    hi = prob.n_k
    if vp.has_right_bound:
        reach = ty.cast(0, ty.i32)
        if vp.v.window[1] >= 0:
            reach = vp.right
            if vp.v.causal:
                reach = ty.minimum(reach, 0)
        hi = ty.maximum(ty.minimum(hi, m0 + rows + vp.diag + reach), 0)
    lo = ty.cast(0, ty.i32)
    if vp.has_window_left:
        lo = ty.maximum(m0 + vp.diag - vp.left, 0)
    first = lo // prob.block_n
    end = (hi + (prob.block_n - 1)) // prob.block_n
    return first, ty.maximum(end - first, 0)


@ty.func
def block_counts(prob, m0, h, b):
    """(partial tiles, full tiles) of the block mask for query tile m0 / block_m."""
    vp = prob.variant
    mt = m0 // prob.block_m
    bb = ty.minimum(b, vp.bm_num.shape[0] - 1)
    hh = ty.minimum(h, vp.bm_num.shape[1] - 1)
    return vp.bm_num[bb, hh, mt], vp.bm_full_num[bb, hh, mt]


@ty.func
def variant_tile_at(prob, k, persistent):
    """(whether this CTA's k-th work tile exists, m0, h, b): one work tile per CTA over a grid of
    (query blocks, H, B), the last query block first; persistent: position ``tiles.tile_position(k)``
    in the "heads" order (b clamped past the end, so the lists read stay in bounds)."""
    if persistent:
        pos = tile_position(k)
        m0 = (prob.num_m - 1 - pos % prob.num_m) * prob.block_m
        hb = pos // prob.num_m
        return pos < prob.total, m0, hb % prob.n_heads, ty.minimum(hb // prob.n_heads, prob.n_batch - 1)
    m0 = (ty.grid_dim(0) - 1 - ty.block_idx(0)) * prob.block_m
    return ty.cast(1, ty.i1), m0, ty.block_idx(1), ty.block_idx(2)


@ty.func
def variant_next_tile(prob, k, persistent, order):
    """(valid, m0, h, b, key tiles) of this CTA's k-th work tile (``variant_tile_at``); a query tile
    that visits no key tile is not valid (the consumers write its empty rows)."""
    real, m0, h, b = variant_tile_at(prob, k, persistent)
    if prob.variant.v.block_mask is not None:
        partial, full = block_counts(prob, m0, h, b)
        n_tiles = partial + full
    else:
        first, n_tiles = key_range(prob, m0)
    return real & (n_tiles > 0), m0, h, b, n_tiles


@ty.func
def tile_number(prob, j, m0, h, b):
    """(key tile number of the j-th visited tile, whether mask_mod must run on it)."""
    vp = prob.variant
    if vp.v.block_mask is not None:
        partial, full = block_counts(prob, m0, h, b)
        mt = m0 // prob.block_m
        bb = ty.minimum(b, vp.bm_idx.shape[0] - 1)
        hh = ty.minimum(h, vp.bm_idx.shape[1] - 1)
        is_partial = j < partial
        jj = ty.select(is_partial, j, j - partial)
        num = ty.select(is_partial, vp.bm_idx[bb, hh, mt, jj], vp.bm_full_idx[bb, hh, mt, jj])
        return num, is_partial
    first, n_tiles = key_range(prob, m0)
    return first + j, ty.cast(1, ty.i1)


@ty.func
def consumer_tiles(prob, m0, row0, n_tiles):
    """(first, count) of the work tile's visited key tiles (numbered 0 .. n_tiles - 1) that one
    consumer's 64 rows from row0 may see, or None where they are all of them: with causal or window
    bounds and query tiles of 192 rows, a consumer's rows see fewer tiles than the tile's (the first
    consumer none past its diagonal); the others it only passes on. A block mask's lists are the
    tile's; with query tiles of 128 rows and 128-key tiles a consumer could pass a tile only under a
    window whose left reach ends in the tile's second half, not worth the registers the passing
    code costs there (4 bytes of spills at D=128, persistent)."""
    vp = prob.variant
    if vp.v.block_mask is not None or not (vp.has_right_bound or vp.has_window_left) or prob.block_m <= 128:
        return None
    first, _ = key_range(prob, m0)
    mine, count = key_range(prob, row0, 64)
    lo = ty.minimum(ty.maximum(mine - first, 0), n_tiles)
    hi = ty.minimum(ty.maximum(mine + count - first, lo), n_tiles)
    return lo, hi - lo


def variant_key_row(prob, j, m0, h, b):
    num, _ = tile_number(prob, j, m0, h, b)
    return num * prob.block_n


# -- one tile of scores -------------------------------------------------------------------------------------


@ty.func
def _mask_needed(prob, row0, col0, rows, cols):
    """Whether any key of this consumer's rows x the tile's columns may be masked by position."""
    vp = prob.variant
    need = col0 + cols > prob.n_k
    if vp.has_right_bound:
        reach = ty.cast(0, ty.i32)
        if vp.v.window[1] >= 0:
            reach = vp.right
            if vp.v.causal:
                reach = ty.minimum(reach, 0)
        need = need | (col0 + cols - 1 > row0 + vp.diag + reach)
    if vp.has_window_left:
        need = need | (col0 < row0 + rows - 1 + vp.diag - vp.left)
    return need


@ty.func
def _visible(prob, row, col):
    vp = prob.variant
    ok = col < prob.n_k
    if vp.v.causal:
        ok = ok & (col <= row + vp.diag)
    if vp.v.window[1] >= 0:
        ok = ok & (col <= row + vp.diag + vp.right)
    if vp.has_window_left:
        ok = ok & (col >= row + vp.diag - vp.left)
    return ok


def softcap_tanh(vp, x):
    """tanh(x / softcap) as 1 - 2 / (1 + e^(2x / softcap)): one ex2 and one rsqrt (squared for the
    reciprocal), 6 instructions against ``ty.tanh``'s ~25 (its exp, correctly rounded rcp and series).
    Absolute error a few 2**-23 (relative error grows below |x / softcap| ~ 2**-10, where the
    capped score is below 0.03 softcap 2**-10: far inside bf16's rounding of the products'
    operands). +-1 at the infinities (ex2 gives inf or 0, rsqrt 0 or 1); NaN stays NaN. The forward
    and the backward both call it, so they see the same scores."""
    r = ty.rsqrt(ty.exp2(x * vp.tanh_scale) + 1.0)
    return ty.fma(r * -2.0, r, 1.0)


def _transform(prob, x, b, h, row, col, mask_val, alibi):
    """Steps 2-5 of ``variants.score_transform`` on one scaled score (``alibi``: ``_after_softcap``'s)."""
    vp = prob.variant
    if vp.v.softcap:
        x = vp.softcap * softcap_tanh(vp, x)
    return _after_softcap(prob, x, b, h, row, col, mask_val, alibi)


class FoldedBias:
    """ALiBi's term of one score, folded (``alibi_columns``), where ``_transform`` takes a slope."""

    def __init__(self, value):
        self.value = value


def _folded(prob, raw, b, h, row, col, mask_val, bias):
    """``_transform`` of a raw score with ALiBi folded into ``bias`` (``alibi_columns``): with no
    softcap or score_mod before it, scale and bias are one FFMA."""
    vp = prob.variant
    if not vp.v.softcap and vp.v.score_mod is None:
        x = ty.fma(raw, prob.scale, bias)
        return x if mask_val is None else x + mask_val
    return _transform(prob, raw * prob.scale, b, h, row, col, mask_val, FoldedBias(bias))


def _after_softcap(prob, x, b, h, row, col, mask_val, alibi):
    """Steps 3-5 (score_mod, ALiBi, the float mask) on a capped score; ``alibi``: the slope of this
    (batch, head), or its term folded (``FoldedBias``)."""
    vp = prob.variant
    if vp.v.score_mod is not None:
        x = mods.call_traced("score_mod", vp.kv.live.score_mod, vp.kv.live, vp.aux, (x, b, h, row, col))
    if isinstance(alibi, FoldedBias):
        x = x + alibi.value
    elif vp.v.alibi:
        x = ty.fma(-alibi, ty.abs(alibi_distance(prob, row, col)), x)
    if mask_val is not None:
        x = x + mask_val
    return x


def alibi_columns(prob, s, row0, col0, slope):
    """ALiBi folded (``KernelVariant.alibi_fold``): where every visible key j of row i has distance
    d = i + N_k - N - j >= 0, -slope d = slope (j - c) - slope (i - row0) with c = row0 + N_k - N. The
    second term is the same for all of a row's keys: the softmax is blind to it, so the scores take only
    the first, and the LSE and a sink take the second (``alibi_row_shift``). Per thread and tile that is
    one FFMA per column (a cvt per tile) where the distance costs an IADD, an FADD and an FFMA per score;
    j - c stays within a tile of 0 near the diagonal, where the largest weights are, so the float
    rounding of the far keys' biases never meets a weight that counts. Returns each register's bias
    (registers of one column share one value)."""
    lay = s.layout
    lane = ty.lane_id()
    warp = ty.warp_idx() & 3
    steps = {}
    for i in range(len(s.values)):
        step = lay.coord(0, 0, i)[1] - lay.coord(0, 0, 0)[1]
        for w, ln in ((0, 31), (3, 5)):  # the columns are the lane's first plus a fixed step (checked)
            assert lay.coord(w, ln, i)[1] - lay.coord(w, ln, 0)[1] == step, lay.name
        steps[i] = step
    first = col0 + lay.coord(warp, lane, 0)[1] - row0 - (prob.n_k - prob.n_q)
    base = slope * ty.cast(first, ty.f32)
    bias = {}
    for step in sorted(set(steps.values())):
        bias[step] = base if step == 0 else ty.fma(slope, float(step), base)
    return [bias[steps[i]] for i in range(len(s.values))]


def alibi_row_shift(slope, r):
    """slope (i - row0) of this thread's row r (0 or 1) of the accumulator: what folded ALiBi
    (``alibi_columns``) left in row i's scores, to be taken off its LSE and added to its sink."""
    lane = ty.lane_id()
    warp = ty.warp_idx() & 3
    return slope * ty.cast(16 * warp + (lane >> 2) + 8 * r, ty.f32)


def alibi_distance(prob, row, col):
    """row + N_k - N - col as an f32. An int-to-float cvt per score runs at 16 a clock per SM, the
    exp2's rate, and doubles the softmax's load there; instead, for |d| < 2^22 the float whose bits are
    those of 1.5 * 2^23 plus d is exactly 1.5 * 2^23 + d, and one FADD takes 1.5 * 2^23 off (an IADD and
    an FADD, both full rate). Longer sequences (``wide_positions``) keep the cvt."""
    dist = row + (prob.n_k - prob.n_q) - col
    if prob.variant.kv.wide_positions:
        return ty.cast(dist, ty.f32)
    return ty.bitcast(dist + MAGIC, ty.f32) - 12582912.0


class QueryRows(NamedTuple):
    """One consumer's 64 query rows of a work tile, as ``scores`` reads them for each key tile: the
    first row, the batch and head, ALiBi's slope of that (batch, head) (or None) and the attn_mask's
    row pointers (``mask_row_pointers``, or None)."""

    row0: Any
    b: Any
    h: Any
    slope: Any
    mask_rows: Any


@ty.func
def scores(prob, s, qrows, col0, is_partial):
    """The S fragment of the key tile from column ``col0`` on, as the softmax takes it: transformed
    (natural units) and masked (-inf); ``qrows``: the consumer's ``QueryRows``."""
    row0, b, h, slope, mask_rows = qrows
    vp = prob.variant
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    slots = s.layout.row_slots
    first = [slots.index(k) for k in range(max(slots) + 1)]
    rows = [row0 + s.layout.coord(warp, lane, i)[0] for i in first]
    vals = list(s.values)
    forget_loads(vp)
    # Position masks (key range, causal, window) only on tiles they may cut; a bool mask everywhere;
    # mask_mod everywhere, or with a block mask on its partial tiles only (full tiles never ask it).
    # (One pass over the tile: a second branch for mask_mod keeps S live across it and spills at D=128.)
    need = ty.cast(1, ty.i1)
    if vp.v.attn_mask != "bool" and (vp.v.mask_mod is None or vp.v.block_mask is not None):
        need = _mask_needed(prob, row0, col0, 64, s.layout.shape[1])
        if vp.v.mask_mod is not None:
            need = need | is_partial
    if vp.kv.transforms:
        bias = alibi_columns(prob, s, row0, col0, slope) if vp.kv.alibi_fold else None
        out = []
        for i in range(len(vals)):
            row = rows[slots[i]]
            col = col0 + s.layout.coord(warp, lane, i)[1]
            mval = None
            if vp.v.attn_mask == "float":
                mval = _mask_at(prob, mask_rows[slots[i]], row, col)
            if bias is not None:
                out.append(_folded(prob, vals[i], b, h, row, col, mval, bias[i]))
            else:
                out.append(_transform(prob, vals[i] * prob.scale, b, h, row, col, mval, slope))
        vals = out
    if need:
        vals = _apply_masks(prob, s, vals, rows, slots, col0, qrows, is_partial)
    return vals


@ty.func
def mask_row_pointers(prob, s, row0, b, h):
    """This thread's two rows of the attn_mask (pointers to their column 0), or None without one:
    per element only the column's offset is left to add."""
    vp = prob.variant
    if not vp.v.attn_mask:
        return None
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    slots = s.layout.row_slots
    first = [slots.index(k) for k in range(max(slots) + 1)]
    m = vp.mask
    base = m.ptr + (ty.cast(b, ty.i64) * m.stride[0] + ty.cast(h, ty.i64) * m.stride[1])
    return [base + ty.cast(row0 + s.layout.coord(warp, lane, i)[0], ty.i64) * m.stride[2] for i in first]


def forget_loads(vp):
    for a in vp.aux:
        if a is not None:
            a.forget()


def _mask_at(prob, row_ptr, row, col, ok=None):
    """The attn_mask at (row, col) (0 outside the lengths, where the load is predicated off)."""
    inside = (col < prob.n_k) & (row < prob.n_q) if ok is None else ok & (row < prob.n_q)
    return ty.load(row_ptr + ty.cast(col, ty.i64) * prob.variant.mask.stride[3], mask=inside)


@ty.func
def _apply_masks(prob, s, vals, rows, slots, col0, qrows, is_partial):
    """Position masks, the bool attn_mask and mask_mod (its answer counts on partial tiles only:
    a block mask's full tiles take every key); ``rows``: this thread's two query rows."""
    b, h, mask_rows = qrows.b, qrows.h, qrows.mask_rows
    vp = prob.variant
    forget_loads(vp)  # a new block: loads traced elsewhere do not dominate it
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    out = []
    # One index value per column, made at its first use: in the accumulator layout registers i
    # and i ^ 2 hold one column in the thread's two rows, so a mod's loads by key index are shared.
    shared = all(slots[i] == (i >> 1) & 1 for i in range(len(vals)))
    cols = {}
    for i in range(len(vals)):
        row = rows[slots[i]]
        c = i & ~2 if shared else i
        if c not in cols:
            cols[c] = col0 + s.layout.coord(warp, lane, i)[1]
        col = cols[c]
        ok = _visible(prob, row, col)
        if vp.v.attn_mask == "bool":
            ok = ok & (_mask_at(prob, mask_rows[slots[i]], row, col, ok) != 0)
        if vp.v.mask_mod is not None:
            keep = mods.call_traced("mask_mod", vp.kv.live.mask_mod, vp.kv.live, vp.aux, (b, h, row, col))
            if vp.v.block_mask is not None:
                keep = keep | ~is_partial
            ok = ok & keep
        out.append(ty.select(ok, vals[i], NEG_INF))
    return out


@ty.func
def finish(sm, state, want_lse, sink, shift=None):
    """``softmax.finish`` with an optional sink logit (natural units) in every row's normalizer.
    The row's sums are relative to its reference R = m c - ffma lo (``softmax`` module text); a sink
    far above every score (a row whose keys all carry a large ALiBi distance) would overflow
    2^(sink log2 e - R), so the sums move to the larger of R and the sink first:
    T = max(R, sink log2 e), l' = l 2^(R - T) + 2^(sink log2 e - T), 1/l' scaled by 2^(R - T) for the
    output (accumulated against R), LSE = (T + log2 l') ln 2. ``shift``: per row, what the scores
    carried above their true value (folded ALiBi, ``alibi_row_shift``): the sink is compared with the
    scores after it, the LSE is given without it."""
    inv, lse = [], []
    for r in range(2):
        l = state["l"][r]
        l = l + ty.shfl_xor(l, 1)
        l = l + ty.shfl_xor(l, 2)
        m = state["m"][r]
        m_use = ty.select(m == NEG_INF, 0.0, m)
        lo = ty.select(state["ffma"], state["lo"][r], 0.0)
        if sink is None:
            ok = l > 0.0  # false for 0 and NaN
            inv.append(ty.select(ok, ty.rcp(l), 0.0))
            val = ty.fma(m_use, sm.scale, (ty.log2(l) - lo) * 0.6931471805599453) if want_lse else None
        else:
            ref = ty.fma(m_use, sm.c, -lo)
            s_log2 = (sink if shift is None else sink + shift[r]) * LOG2E
            top = ty.maximum(ref, s_log2)
            down = ty.exp2(ref - top)
            l = ty.fma(l, down, ty.exp2(s_log2 - top))
            ok = l > 0.0  # false for 0 and NaN (a sink of -inf in a row without keys)
            inv.append(ty.select(ok, down * ty.rcp(l), 0.0))
            val = (top + ty.log2(l)) * 0.6931471805599453 if want_lse else None
        if want_lse:
            if shift is not None:
                val = val - shift[r]
            lse.append(ty.select(ok, val, NEG_INF))
    return inv, (lse if want_lse else None)
