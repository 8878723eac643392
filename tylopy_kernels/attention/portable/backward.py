"""Portable attention backward (mma.sync, sm_80+): dQ, dK, dV of ``out = softmax(scale Q K^T + mask) V``.

What it computes. Given the forward's inputs, its output O, the row log-sum-exp L (natural
log, fp32) and the output gradient dO, with P = exp(scale S - L) recomputed from S = Q K^T:

    dV = P^T dO          dP = dO V^T          delta_i = sum_d dO[i, d] O[i, d]  (- dL_i)
    dS = P * (dP - delta)                     dQ = scale dS K          dK = scale dS^T Q

(a gradient dL of the returned LSE enters as dS += P dL, folded into delta). Three kernels,
every one of them deterministic (no atomics: the same inputs give the same bits):

1. ``attention_bwd_preprocess_portable``: delta per query row. D/8 lanes share a row, each
   reading one 16-byte chunk of O and of dO; a shuffle reduction sums the chunks.
2. ``attention_bwd_dkdv_portable``: one CTA owns 16 x WARPS keys of one key/value head, one
   warp 16 of them, and works in the transposed orientation, so every product is a forward-like
   ``mma.sync`` chain with no transposes in registers:
   S^T = K Q^T (A = the warp's K rows, B = the Q tile by ``ldmatrix``), P^T = exp2(S^T c - L'),
   dP^T = V dO^T, dS^T = P^T (dP^T - delta); dV += P^T dO and dK += dS^T Q take P^T and dS^T
   as A operands in the same lanes (``ty.pack_operand_a``) and dO/Q by ``ldmatrix.trans``.
   Query tiles of BLOCK_M rows (Q, dO, L, delta) stream through a two-stage ``cp.async`` ring
   shared by the CTA's warps. With grouped-query attention the CTA walks the query heads of
   its group one after another, so dK and dV are the group's sum, added in a fixed order.
   K and V stay in registers as A operands, or in shared memory (``KV_SMEM``, D = 128: the
   dK and dV accumulators alone take 128 registers there) and are re-read by ``ldmatrix``.
3. ``attention_bwd_dq_portable``: the forward's structure (a warp owns 16 query rows, Q and dO
   in registers as A operands, K/V tiles through the ring) recomputing S and dP per key tile:
   dQ += dS K, K by ``ldmatrix.trans``. Recomputing costs two of the seven products, and buys
   a bitwise reproducible dQ without an fp32 accumulator in global memory.

Masks are those of the forward (``forward.py``): keys past n_k, causal (key j kept for query
i when j <= i + n_k - n_q), a Boolean mask read through strides; queries past n_q are zero
filled and masked, so memory past every end (NaN included) is never used. A query row whose
keys are all masked has L = -inf and gets P = 0 (its exponent offset is taken as 0). Packed
variable-length batches (``VARLEN``) take per-sequence offsets from cu_q/cu_k as the forward.

Parameters as the forward's: each tensor is one ``ty.tensor`` parameter carrying its own shape
and strides. q, k, v, out, dout, dq, dk and dv are ``TOKENS`` (B, H, N, D) (packed: (B, H,
total, D) views of batch stride 0), the LSE, delta and the LSE gradient ``ROW_STATS`` (B, H,
n_q) (packed: (B, H, total)), the mask a ``MASK``; n_q and n_k are the row counts of q and k.

Run and check::

    tylopy dump tylopy_kernels/attention/portable/backward.py:attention_bwd_dkdv_portable -D HEAD_DIM=128 \
        -D BLOCK_M=32 -D KV_SMEM=True     # the launcher's D = 128 schedule (BLOCK_M, KV_SMEM below)
    python -m pytest -q tests/test_attention_backward_portable.py      # emulator + ptxas, no GPU
"""

from typing import Any, NamedTuple

from tylopy_kernels.attention.portable.forward import (MASK, NEG_INF, ROW_STATS, ROWS_PER_WARP, STAGES, TOKENS, Copier,
                                                       Problem, Schedule, Smem, copy_kv, copy_tile, head_rows, load_q,
                                                       mask_scores, maybe_mask, pv_tile, score_tile, sequence,
                                                       shared_bytes, store_output, swizzled_offset, tiled, visible,
                                                       zero_atom)

import tylopy as ty

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)
WARPS = 4
PRE_THREADS = 256
# Query rows per tile of the dK/dV kernel, and whether it re-reads K/V from shared memory, per
# head dim (ptxas, sm_80: D = 64 takes 162 registers so, 255 with 64-row tiles and K/V in
# registers; D = 32 with K/V in registers spills a few bytes once a mask is read; D = 128 takes
# 254); key rows per tile of the dQ kernel (D = 128: 242 registers).
BLOCK_M = {16: 64, 32: 64, 64: 32, 128: 32}
KV_SMEM = {16: False, 32: True, 64: True, 128: True}
BLOCK_N = {16: 64, 32: 64, 64: 64, 128: 32}


def _threads(WARPS=WARPS, **_):
    return 32 * WARPS


class Grad(NamedTuple):
    """What the gradient kernels read besides the forward's inputs: the output gradient dO and,
    per query row, the forward's LSE L and delta (TensorArgs; delta has L's layout)."""

    dout: Any
    lse: Any
    delta: Any


def row_stats(grad, b, h, start):
    """(L, delta) ``Rows`` of head h of batch entry b from query row start on. delta is read at L's
    offsets: the launcher allocates it like L, and a second offset, recomputed for every query head
    of the dK/dV loop, cost that kernel 23 registers (ptxas, D = 64 with a mask)."""
    lse = head_rows(grad.lse, b, h, start)
    return lse, lse._replace(t=grad.delta)


# -- 1. delta = rowsum(dO * O) ------------------------------------------------------------------------------

@ty.kernel(threads=PRE_THREADS, arch="sm_80", noalias=True)
def attention_bwd_preprocess_portable(
    out: TOKENS, dout: TOKENS, dlse: ROW_STATS, delta: ROW_STATS, cu_q: ty.ptr(ty.i32),
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, HAS_DLSE: ty.constexpr = False,
    VARLEN: ty.constexpr = False,
):
    """Grid (row blocks of PRE_THREADS * 8 / D rows, heads, batch or sequences); delta and dlse
    have the LSE's layout ((B, H, n_q), or (B, H, total) packed, batch stride 0)."""
    lanes = HEAD_DIM // 8  # lanes per row, one 16-byte chunk each
    seq = sequence((cu_q, cu_q), out, out, VARLEN)
    h = ty.block_idx(1)
    idx = ty.block_idx(0) * PRE_THREADS + ty.thread_idx()
    row = idx // lanes
    col = (idx % lanes) * 8
    ok = row < seq.n_q
    at = seq.q_start + row  # (the rows from the head's first on: one row offset for every tensor)
    o_words = ty.load(ty.ptr_cast(out.ptr, ty.b32) + (head_rows(out, seq.b, h, 0).offset(at, col) >> 1), vec=4,
                      mask=ok)
    d_words = ty.load(ty.ptr_cast(dout.ptr, ty.b32) + (head_rows(dout, seq.b, h, 0).offset(at, col) >> 1), vec=4,
                      mask=ok)
    acc = ty.cast(0.0, ty.f32)
    for w in range(4):
        o_lo, o_hi = ty.unpack2(o_words[w], DTYPE)
        d_lo, d_hi = ty.unpack2(d_words[w], DTYPE)
        acc = ty.fma(o_lo, d_lo, ty.fma(o_hi, d_hi, acc))
    m = 1
    while m < lanes:  # the row's lanes are adjacent: a butterfly over the low bits of the lane
        acc = acc + ty.shfl_xor(acc, m)
        m = m * 2
    if ok & ((idx % lanes) == 0):
        if HAS_DLSE:
            acc = acc - ty.load(head_rows(dlse, seq.b, h, 0).address(at))
        ty.store(head_rows(delta, seq.b, h, 0).address(at), acc)


# -- shared pieces of the two gradient kernels -------------------------------------------------------------

@ty.func
def weights(s, nl, c, on_rows):
    """P = exp2(S c + nl) with nl = -L log2(e) per row (``on_rows``) or per column of the C atoms:
    value i of an atom sits at row g + 8 (i >> 1), column 2t + (i & 1)."""
    vals = []
    for i in range(len(s)):
        off = nl[(i // 4) * 2 + ((i >> 1) & 1)] if on_rows else nl[(i // 4) * 2 + (i & 1)]
        vals.append(ty.exp2(ty.fma(s.values[i], c, off)))
    return s.with_data(vals)


@ty.func
def grad_scores(p, dp, delta, on_rows):
    """dS = P (dP - delta), delta per row or per column like ``weights``."""
    vals = []
    for i in range(len(p)):
        d = delta[(i // 4) * 2 + ((i >> 1) & 1)] if on_rows else delta[(i // 4) * 2 + (i & 1)]
        vals.append(p.values[i] * (dp.values[i] - d))
    return p.with_data(vals)


def exponent_offset(lse):
    """-L log2(e); 0 for an empty row (L = -inf), whose scores are all -inf and give P = 0."""
    return ty.select(lse == NEG_INF, 0.0, lse * (-LOG2E))


def scaled(frags, scale):
    return [f * scale for f in frags]


# -- 2. dK and dV -------------------------------------------------------------------------------------------

class DkdvSmem:
    """Per stage: the Q tile, the dO tile (BLOCK_M x D, swizzled), L and delta (BLOCK_M f32 each);
    then, with KV_SMEM, the CTA's K and V rows."""

    def __init__(self, block_m, head_dim, warps, kv_smem):
        self.tile = Smem(block_m, head_dim, STAGES)
        self.block_m = block_m
        self.q = 0
        self.do = self.tile.tile_bytes
        self.lse = 2 * self.tile.tile_bytes
        self.delta = self.lse + 4 * block_m
        self.stage_bytes = self.delta + 4 * block_m
        self.kv = Smem(ROWS_PER_WARP * warps, head_dim, 1)
        self.k = STAGES * self.stage_bytes
        self.v = self.k + self.kv.tile_bytes
        self.total = self.k + (2 * self.kv.tile_bytes if kv_smem else 0)


class QueryTile(NamedTuple):
    """The ``Rows`` a dK/dV step streams for one query head: Q and dO (their ``n``: the queries that
    exist), and the LSE and delta per query row."""

    q: Any
    dout: Any
    lse: Any
    delta: Any


@ty.func
def copy_query_tile(src, lay, cp, stage_off, m0):
    """Start copying query tile ``m0`` of ``src`` (``QueryTile``: Q, dO, L, delta) into a stage;
    rows past the queries that exist become zeros."""
    d = lay.tile.head_dim
    copy_tile(src.q, cp, stage_off + lay.q, m0, lay.block_m, d)
    copy_tile(src.dout, cp, stage_off + lay.do, m0, lay.block_m, d)
    tid = cp.tid
    if tid < lay.block_m:
        ok = m0 + tid < src.q.n
        for stats, off in ((src.lse, lay.lse), (src.delta, lay.delta)):
            dst = cp.smem + (stage_off + off + 4 * tid)
            if cp.async_copy:
                ty.cp_async(dst, stats.address(m0 + tid), 4, src_bytes=ty.select(ok, 4, 0))
            else:
                ty.store(ty.ptr_cast(dst, ty.f32), ty.load(stats.address(m0 + tid), mask=ok))
    if cp.async_copy:
        ty.cp_async_commit()


def column_values(smem, off, lane, block_m, fn):
    """fn(value) of the two columns 8 n + 2t, 8 n + 2t + 1 this lane holds in each C atom n."""
    words = ty.ptr_cast(smem + (off + 8 * (lane & 3)), ty.f32)
    vals = []
    for n in range(block_m // 8):
        lo, hi = ty.load(words + 8 * n, vec=2)
        vals += [fn(lo), fn(hi)]
    return vals


def kv_operands(smem, off, warp, lane, head_dim):
    """The warp's 16 K (or V) rows as D/16 A fragments, by ``ldmatrix.x4`` from the resident tile:
    matrix i holds rows 8 (i & 1) .. +7 and columns 8 (i >> 1) .. +7 of each 16 x 16 block."""
    atom_rows = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)
    frags = []
    for kk in range(head_dim // 16):
        w = ty.ldmatrix(smem + (off + swizzled_offset(atom_rows, 2 * kk + (lane >> 4), head_dim)), 4, trans=False)
        frags.append(w)
    return frags


@ty.func
def mask_keys_on_rows(s, vis, row0, col0, lane, block_m):
    """S^T tiles that need it (``vis``: ``Visible``): queries past n_q, keys past n_k, the causal
    diagonal, a user mask."""
    if vis.mask is not None:
        s = mask_scores(s, vis, row0, col0, lane, True)
    else:
        needs = (col0 + block_m > vis.n_q) | (row0 + ROWS_PER_WARP > vis.n_k) | \
                ((vis.causal != 0) & (row0 + (ROWS_PER_WARP - 1) > col0 + vis.causal_off))
        if needs:
            s = mask_scores(s, vis, row0, col0, lane, True)
    return s


@ty.func
def dkdv_rows(prob, grad, dst, seq, hk, sched):
    """The CTA's 16 x WARPS keys of key/value head ``hk`` of sequence ``seq`` (``Seq``): dK and dV,
    summed over the group's query heads, into ``dst`` = (dk, dv) TensorArgs."""
    dk, dv = dst
    block_m, head_dim, dtype = sched.block, sched.head_dim, sched.dtype
    lay = DkdvSmem(block_m, head_dim, sched.warps, sched.kv_smem)
    cp = Copier(shared_bytes(lay.total), ty.thread_idx(), sched.threads, sched.async_copy)
    atom = ty.MmaSyncAtom(dtype)
    lane = ty.lane_id()
    warp = ty.warp_idx()
    n0 = ty.block_idx(0) * sched.rows
    row0 = n0 + warp * ROWS_PER_WARP
    c = prob.scale * LOG2E
    causal_off = seq.n_k - seq.n_q
    first = 0
    if prob.causal != 0:
        first = ty.maximum(n0 - causal_off, 0) // block_m  # earlier queries see none of these keys
    n_tiles = ty.maximum((seq.n_q + (block_m - 1)) // block_m - first, 0)
    total = n_tiles * prob.kv_group

    k_rows = head_rows(prob.k, seq.b, hk, seq.k_start, seq.n_k)
    v_rows = head_rows(prob.v, seq.b, hk, seq.k_start, seq.n_k)
    if sched.kv_smem:
        copy_tile(k_rows, cp, lay.k, n0, lay.kv.block_n, head_dim)
        copy_tile(v_rows, cp, lay.v, n0, lay.kv.block_n, head_dim)
        ka = None
        va = None
    else:
        ka = load_q(k_rows, row0, lane, head_dim, dtype)
        va = load_q(v_rows, row0, lane, head_dim, dtype)
    dk_acc = [zero_atom() for _ in range(head_dim // 8)]
    dv_acc = [zero_atom() for _ in range(head_dim // 8)]

    def tile_at(it):
        """(query head, first query row) of step ``it``: the group's heads one after another."""
        head = hk * prob.kv_group + it // n_tiles
        return head, (first + it % n_tiles) * block_m

    def issue(it, stage_off):
        head, m0 = tile_at(it)
        src = QueryTile(head_rows(prob.q, seq.b, head, seq.q_start, seq.n_q),
                        head_rows(grad.dout, seq.b, head, seq.q_start, seq.n_q),
                        *row_stats(grad, seq.b, head, seq.q_start))
        copy_query_tile(src, lay, cp, stage_off, m0)

    if total > 0:
        issue(0, 0)
    for it in range(total):
        stage_off = (it & 1) * lay.stage_bytes
        if sched.async_copy:
            ty.cp_async_wait(0)
        ty.syncthreads()  # step it's tiles are visible; every warp is done with step it - 1's stage
        if it + 1 < total:
            issue(it + 1, ((it + 1) & 1) * lay.stage_bytes)
        head, m0 = tile_at(it)
        vis = visible(prob, seq, head, sched.has_mask)
        nl = column_values(cp.smem, stage_off + lay.lse, lane, block_m, exponent_offset)
        dl = column_values(cp.smem, stage_off + lay.delta, lane, block_m, lambda x: x)
        kf = [atom.a_fragment(w) for w in kv_operands(cp.smem, lay.k, warp, lane, head_dim)] if sched.kv_smem else ka
        s = score_tile(atom, kf, cp.smem, stage_off + lay.q, lane, block_m, head_dim)  # S^T = K Q^T
        s = mask_keys_on_rows(s, vis, row0, m0, lane, block_m)
        p = weights(s, nl, c, False)
        vf = [atom.a_fragment(w) for w in kv_operands(cp.smem, lay.v, warp, lane, head_dim)] if sched.kv_smem else va
        dp = score_tile(atom, vf, cp.smem, stage_off + lay.do, lane, block_m, head_dim)  # dP^T = V dO^T
        ds = grad_scores(p, dp, dl, False)
        dv_acc = pv_tile(atom, p, dv_acc, cp.smem, stage_off + lay.do, lane, block_m, head_dim)  # += P^T dO
        dk_acc = pv_tile(atom, ds, dk_acc, cp.smem, stage_off + lay.q, lane, block_m, head_dim)  # += dS^T Q

    store_output(tiled(scaled(dk_acc, prob.scale)), head_rows(dk, seq.b, hk, seq.k_start, seq.n_k), row0, lane, dtype)
    store_output(tiled(dv_acc), head_rows(dv, seq.b, hk, seq.k_start, seq.n_k), row0, lane, dtype)


@ty.kernel(threads=_threads, arch="sm_80", noalias=True)
def attention_bwd_dkdv_portable(
    q: TOKENS, k: TOKENS, v: TOKENS, dout: TOKENS, lse: ROW_STATS, delta: ROW_STATS, dk: TOKENS, dv: TOKENS,
    mask: MASK, cu_q: ty.ptr(ty.i32), cu_k: ty.ptr(ty.i32), kv_group: ty.i32, scale: ty.f32, causal: ty.i32,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_M: ty.constexpr = 64,
    WARPS: ty.constexpr = WARPS, HAS_MASK: ty.constexpr = False, KV_SMEM: ty.constexpr = False,
    ASYNC_COPY: ty.constexpr = True, VARLEN: ty.constexpr = False,
):
    """Grid (key blocks of 16 x WARPS, key/value heads, batch or sequences); delta has L's layout
    (and is read at L's offsets)."""
    sched = Schedule(DTYPE, HEAD_DIM, BLOCK_M, WARPS, HAS_MASK, async_copy=ASYNC_COPY, kv_smem=KV_SMEM)
    seq = sequence((cu_q, cu_k), q, k, VARLEN)
    args = (Problem(q, k, v, mask, kv_group, scale, causal), Grad(dout, lse, delta), (dk, dv), seq, ty.block_idx(1),
            sched)
    if VARLEN:
        if ty.block_idx(0) * sched.rows < seq.n_k:  # else past the sequence's last key
            dkdv_rows(*args)
    else:
        dkdv_rows(*args)


# -- 3. dQ --------------------------------------------------------------------------------------------------

@ty.func
def dq_rows(prob, grad, dq, seq, h, sched):
    """The CTA's 16 x WARPS query rows of head ``h`` of sequence ``seq`` (``Seq``): dQ = scale
    times the sum over key tiles of dS K, into the ``dq`` TensorArg."""
    block_n, head_dim, dtype = sched.block, sched.head_dim, sched.dtype
    rows = sched.rows
    lay = Smem(block_n, head_dim, STAGES)
    cp = Copier(shared_bytes(lay.total), ty.thread_idx(), sched.threads, sched.async_copy)
    atom = ty.MmaSyncAtom(dtype)
    lane = ty.lane_id()
    warp = ty.warp_idx()
    m0 = (ty.grid_dim(0) - 1 - ty.block_idx(0)) * rows  # longest rows first under causal masking
    row0 = m0 + warp * ROWS_PER_WARP
    n_q = seq.n_q
    c = prob.scale * LOG2E
    vis = visible(prob, seq, h, sched.has_mask)
    kv_end = seq.n_k
    if prob.causal != 0:
        kv_end = ty.minimum(seq.n_k, ty.maximum(m0 + rows + vis.causal_off, 0))
    n_tiles = (kv_end + (block_n - 1)) // block_n
    kv_head = h // prob.kv_group
    kv = (head_rows(prob.k, seq.b, kv_head, seq.k_start, seq.n_k), head_rows(prob.v, seq.b, kv_head, seq.k_start,
                                                                             seq.n_k))

    qa = load_q(head_rows(prob.q, seq.b, h, seq.q_start, n_q), row0, lane, head_dim, dtype)
    doa = load_q(head_rows(grad.dout, seq.b, h, seq.q_start, n_q), row0, lane, head_dim, dtype)
    lse, delta = row_stats(grad, seq.b, h, seq.q_start)
    nl = []
    dl = []
    for half in range(2):  # rows g and g + 8 of the warp's 16
        row = row0 + (lane >> 2) + 8 * half
        nl.append(exponent_offset(ty.load(lse.address(row), mask=row < n_q)))
        dl.append(ty.load(delta.address(row), mask=row < n_q))
    nl = nl * (block_n // 8)  # per C atom: its two rows
    dl = dl * (block_n // 8)
    dq_acc = [zero_atom() for _ in range(head_dim // 8)]

    copy_kv(kv, cp, 0, lay, 0)
    for j in range(n_tiles):
        stage_off = (j & 1) * lay.stage_bytes
        if sched.async_copy:
            ty.cp_async_wait(0)
        ty.syncthreads()
        if j + 1 < n_tiles:
            copy_kv(kv, cp, ((j + 1) & 1) * lay.stage_bytes, lay, (j + 1) * block_n)
        s = score_tile(atom, qa, cp.smem, stage_off, lane, block_n, head_dim)  # S = Q K^T
        s = maybe_mask(s, vis, row0, j * block_n, lane, block_n)
        p = weights(s, nl, c, True)
        dp = score_tile(atom, doa, cp.smem, stage_off + lay.tile_bytes, lane, block_n, head_dim)  # dP = dO V^T
        ds = grad_scores(p, dp, dl, True)
        dq_acc = pv_tile(atom, ds, dq_acc, cp.smem, stage_off, lane, block_n, head_dim)  # += dS K

    store_output(tiled(scaled(dq_acc, prob.scale)), head_rows(dq, seq.b, h, seq.q_start, n_q), row0, lane, dtype)


@ty.kernel(threads=_threads, arch="sm_80", noalias=True)
def attention_bwd_dq_portable(
    q: TOKENS, k: TOKENS, v: TOKENS, dout: TOKENS, lse: ROW_STATS, delta: ROW_STATS, dq: TOKENS, mask: MASK,
    cu_q: ty.ptr(ty.i32), cu_k: ty.ptr(ty.i32), kv_group: ty.i32, scale: ty.f32, causal: ty.i32,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 64,
    WARPS: ty.constexpr = WARPS, HAS_MASK: ty.constexpr = False, ASYNC_COPY: ty.constexpr = True,
    VARLEN: ty.constexpr = False,
):
    """Grid (query blocks of 16 x WARPS, query heads, batch or sequences); delta has L's layout
    (and is read at L's offsets)."""
    sched = Schedule(DTYPE, HEAD_DIM, BLOCK_N, WARPS, HAS_MASK, async_copy=ASYNC_COPY)
    seq = sequence((cu_q, cu_k), q, k, VARLEN)
    args = (Problem(q, k, v, mask, kv_group, scale, causal), Grad(dout, lse, delta), dq, seq, ty.block_idx(1), sched)
    if VARLEN:
        if (ty.grid_dim(0) - 1 - ty.block_idx(0)) * sched.rows < seq.n_q:
            dq_rows(*args)
    else:
        dq_rows(*args)
