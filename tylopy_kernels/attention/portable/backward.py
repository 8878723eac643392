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

Masks are those of the forward (``portable.py``): keys past n_k, causal (key j kept for query
i when j <= i + n_k - n_q), a Boolean mask read through strides; queries past n_q are zero
filled and masked, so memory past every end (NaN included) is never used. A query row whose
keys are all masked has L = -inf and gets P = 0 (its exponent offset is taken as 0). Packed
variable-length batches (``VARLEN``) take per-sequence offsets from cu_q/cu_k as the forward.

Run and check::

    tylopy dump tylopy_kernels/attention/portable/backward.py:attention_bwd_dkdv_portable -D HEAD_DIM=128
    python -m pytest -q tests/test_attention_backward_portable.py      # emulator + ptxas, no GPU
"""

import tylopy as ty

from tylopy_kernels.attention.portable.forward import (NEG_INF, ROWS_PER_WARP, STAGES, Smem, copy_kv, copy_tile, load_q, mask_scores, maybe_mask,
                       pv_tile, score_tile, shared_bytes, store_output, swizzled_offset, tiled, zero_atom)

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


def seq_bounds(cu_q, cu_k, b, n_q, n_k, varlen):
    """(first query row, first key row, n_q, n_k) of batch entry or sequence ``b``."""
    if varlen:
        q_start = cu_q[b]
        k_start = cu_k[b]
        return q_start, k_start, cu_q[b + 1] - q_start, cu_k[b + 1] - k_start
    return 0, 0, n_q, n_k


# -- 1. delta = rowsum(dO * O) ------------------------------------------------------------------------------

@ty.kernel(threads=PRE_THREADS, arch="sm_80", noalias=True)
def attention_bwd_preprocess_portable(
    out: ty.ptr(ty.i16), dout: ty.ptr(ty.i16), dlse: ty.ptr(ty.f32), delta: ty.ptr(ty.f32), cu_q: ty.ptr(ty.i32),
    n_q: ty.i32, o_stride_b: ty.i64, o_stride_h: ty.i64, o_stride_n: ty.i64,
    do_stride_b: ty.i64, do_stride_h: ty.i64, do_stride_n: ty.i64, lse_stride_b: ty.i64, lse_stride_h: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, HAS_DLSE: ty.constexpr = False,
    VARLEN: ty.constexpr = False,
):
    """Grid (row blocks of PRE_THREADS * 8 / D rows, heads, batch or sequences); delta and dlse
    have the LSE's layout ((B, H, n_q), or (H, total) packed)."""
    lanes = HEAD_DIM // 8  # lanes per row, one 16-byte chunk each
    b = ty.block_idx(2)
    h64 = ty.cast(ty.block_idx(1), ty.i64)
    b64 = ty.cast(b, ty.i64)
    q_start, _, n_rows, _ = seq_bounds(cu_q, cu_q, b, n_q, n_q, VARLEN)
    idx = ty.block_idx(0) * PRE_THREADS + ty.thread_idx()
    row = idx // lanes
    col = ty.cast((idx % lanes) * 8, ty.i64)
    ok = row < n_rows
    r64 = ty.cast(q_start + row, ty.i64)
    o_words = ty.load(ty.ptr_cast(out, ty.b32) + ((b64 * o_stride_b + h64 * o_stride_h + r64 * o_stride_n + col) >> 1),
                      vec=4, mask=ok)
    d_words = ty.load(ty.ptr_cast(dout, ty.b32) + ((b64 * do_stride_b + h64 * do_stride_h + r64 * do_stride_n + col)
                                                   >> 1), vec=4, mask=ok)
    acc = ty.cast(0.0, ty.f32)
    for w in range(4):
        o_lo, o_hi = ty.unpack2(o_words[w], DTYPE)
        d_lo, d_hi = ty.unpack2(d_words[w], DTYPE)
        acc = ty.fma(o_lo, d_lo, ty.fma(o_hi, d_hi, acc))
    m = 1
    while m < lanes:  # the row's lanes are adjacent: a butterfly over the low bits of the lane
        acc = acc + ty.shfl_xor(acc, m)
        m = m * 2
    at = b64 * lse_stride_b + h64 * lse_stride_h + r64
    if ok & ((idx % lanes) == 0):
        if HAS_DLSE:
            acc = acc - dlse[at]
        delta[at] = acc


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


@ty.func
def copy_query_tile(src, lay, smem, stage_off, bases, strides, lse_ptr, delta_ptr, lse_base, m0, n_q, tid, threads,
                    async_copy):
    """Start copying query tile ``m0`` (Q, dO, L, delta) into a stage; rows past n_q become zeros."""
    q, dout = src
    d = lay.tile.head_dim
    copy_tile(q, bases[0], strides[0], smem, stage_off + lay.q, m0, n_q, tid, lay.block_m, d, threads, async_copy)
    copy_tile(dout, bases[1], strides[1], smem, stage_off + lay.do, m0, n_q, tid, lay.block_m, d, threads, async_copy)
    if tid < lay.block_m:
        ok = m0 + tid < n_q
        at = lse_base + ty.cast(m0 + tid, ty.i64)
        for src_ptr, off in ((lse_ptr, lay.lse), (delta_ptr, lay.delta)):
            dst = smem + (stage_off + off + 4 * tid)
            if async_copy:
                ty.cp_async(dst, src_ptr + at, 4, src_bytes=ty.select(ok, 4, 0))
            else:
                ty.store(ty.ptr_cast(dst, ty.f32), ty.load(src_ptr + at, mask=ok))
    if async_copy:
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
def mask_keys_on_rows(s, row0, col0, lane, n_q, n_k, causal, causal_off, mask_args, has_mask, block_m):
    """S^T tiles that need it: queries past n_q, keys past n_k, the causal diagonal, a user mask."""
    if has_mask:
        s = mask_scores(s, row0, col0, lane, n_q, n_k, causal, causal_off, mask_args, has_mask, True)
    else:
        needs = (col0 + block_m > n_q) | (row0 + ROWS_PER_WARP > n_k) | \
                ((causal != 0) & (row0 + (ROWS_PER_WARP - 1) > col0 + causal_off))
        if needs:
            s = mask_scores(s, row0, col0, lane, n_q, n_k, causal, causal_off, mask_args, has_mask, True)
    return s


@ty.func
def dkdv_rows(q, k, v, dout, lse, delta, dk, dv, mask, seq, n_q, n_k, hk, kv_group, scale, causal, strides,
              DTYPE, HEAD_DIM, BLOCK_M, WARPS, HAS_MASK, KV_SMEM, ASYNC_COPY):
    """The CTA's 16 x WARPS keys of key/value head ``hk``: dK and dV summed over the group's query heads."""
    qs, ks, vs, dos, dks, dvs, ls, ms = strides
    threads = 32 * WARPS
    lay = DkdvSmem(BLOCK_M, HEAD_DIM, WARPS, KV_SMEM)
    smem = shared_bytes(lay.total)
    atom = ty.MmaSyncAtom(DTYPE)
    tid = ty.thread_idx()
    lane = ty.lane_id()
    warp = ty.warp_idx()
    n0 = ty.block_idx(0) * (ROWS_PER_WARP * WARPS)
    row0 = n0 + warp * ROWS_PER_WARP
    b, q_start, k_start = seq
    b64 = ty.cast(b, ty.i64)
    q0 = ty.cast(q_start, ty.i64)
    k0 = ty.cast(k_start, ty.i64)
    hk64 = ty.cast(hk, ty.i64)
    c = scale * LOG2E
    causal_off = n_k - n_q
    first = 0
    if causal != 0:
        first = ty.maximum(n0 - causal_off, 0) // BLOCK_M  # earlier queries see none of these keys
    n_tiles = ty.maximum((n_q + (BLOCK_M - 1)) // BLOCK_M - first, 0)
    total = n_tiles * kv_group

    k_base = b64 * ks[0] + hk64 * ks[1] + k0 * ks[2]
    v_base = b64 * vs[0] + hk64 * vs[1] + k0 * vs[2]
    if KV_SMEM:
        copy_tile(k, k_base, ks[2], smem, lay.k, n0, n_k, tid, lay.kv.block_n, HEAD_DIM, threads, ASYNC_COPY)
        copy_tile(v, v_base, vs[2], smem, lay.v, n0, n_k, tid, lay.kv.block_n, HEAD_DIM, threads, ASYNC_COPY)
        ka = None
        va = None
    else:
        ka = load_q(k, k_base, ks[2], row0, n_k, lane, HEAD_DIM, DTYPE)
        va = load_q(v, v_base, vs[2], row0, n_k, lane, HEAD_DIM, DTYPE)
    dk_acc = [zero_atom() for _ in range(HEAD_DIM // 8)]
    dv_acc = [zero_atom() for _ in range(HEAD_DIM // 8)]
    src = (q, dout)
    row_strides = (qs[2], dos[2])

    def tile_at(it):
        """(query head, first query row) of step ``it``: the group's heads one after another."""
        head = hk * kv_group + it // n_tiles
        return head, (first + it % n_tiles) * BLOCK_M

    def issue(it, stage_off):
        head, m0 = tile_at(it)
        h64 = ty.cast(head, ty.i64)
        bases = (b64 * qs[0] + h64 * qs[1] + q0 * qs[2], b64 * dos[0] + h64 * dos[1] + q0 * dos[2])
        copy_query_tile(src, lay, smem, stage_off, bases, row_strides, lse, delta, b64 * ls[0] + h64 * ls[1] + q0,
                        m0, n_q, tid, threads, ASYNC_COPY)

    if total > 0:
        issue(0, 0)
    for it in range(total):
        stage_off = (it & 1) * lay.stage_bytes
        if ASYNC_COPY:
            ty.cp_async_wait(0)
        ty.syncthreads()  # step it's tiles are visible; every warp is done with step it - 1's stage
        if it + 1 < total:
            issue(it + 1, ((it + 1) & 1) * lay.stage_bytes)
        head, m0 = tile_at(it)
        mask_args = (mask, b64 * ms[0] + ty.cast(head, ty.i64) * ms[1], ms[2], ms[3])
        nl = column_values(smem, stage_off + lay.lse, lane, BLOCK_M, exponent_offset)
        dl = column_values(smem, stage_off + lay.delta, lane, BLOCK_M, lambda x: x)
        kf = [atom.a_fragment(w) for w in kv_operands(smem, lay.k, warp, lane, HEAD_DIM)] if KV_SMEM else ka
        s = score_tile(atom, kf, smem, stage_off + lay.q, lane, BLOCK_M, HEAD_DIM)  # S^T = K Q^T
        s = mask_keys_on_rows(s, row0, m0, lane, n_q, n_k, causal, causal_off, mask_args, HAS_MASK, BLOCK_M)
        p = weights(s, nl, c, False)
        vf = [atom.a_fragment(w) for w in kv_operands(smem, lay.v, warp, lane, HEAD_DIM)] if KV_SMEM else va
        dp = score_tile(atom, vf, smem, stage_off + lay.do, lane, BLOCK_M, HEAD_DIM)  # dP^T = V dO^T
        ds = grad_scores(p, dp, dl, False)
        dv_acc = pv_tile(atom, p, dv_acc, smem, stage_off + lay.do, lane, BLOCK_M, HEAD_DIM)  # += P^T dO
        dk_acc = pv_tile(atom, ds, dk_acc, smem, stage_off + lay.q, lane, BLOCK_M, HEAD_DIM)  # += dS^T Q

    store_output(tiled(scaled(dk_acc, scale)), None, dk, None, row0, n_k,
                 b64 * dks[0] + hk64 * dks[1] + k0 * dks[2], dks[2], 0, lane, DTYPE, False)
    store_output(tiled(dv_acc), None, dv, None, row0, n_k, b64 * dvs[0] + hk64 * dvs[1] + k0 * dvs[2], dvs[2], 0,
                 lane, DTYPE, False)


@ty.kernel(threads=_threads, arch="sm_80", noalias=True)
def attention_bwd_dkdv_portable(
    q: ty.ptr(ty.i16), k: ty.ptr(ty.i16), v: ty.ptr(ty.i16), dout: ty.ptr(ty.i16),
    lse: ty.ptr(ty.f32), delta: ty.ptr(ty.f32), dk: ty.ptr(ty.i16), dv: ty.ptr(ty.i16), mask: ty.ptr(ty.u8),
    cu_q: ty.ptr(ty.i32), cu_k: ty.ptr(ty.i32),
    n_q: ty.i32, n_k: ty.i32, kv_group: ty.i32, scale: ty.f32, causal: ty.i32,
    q_stride_b: ty.i64, q_stride_h: ty.i64, q_stride_n: ty.i64,
    k_stride_b: ty.i64, k_stride_h: ty.i64, k_stride_n: ty.i64,
    v_stride_b: ty.i64, v_stride_h: ty.i64, v_stride_n: ty.i64,
    do_stride_b: ty.i64, do_stride_h: ty.i64, do_stride_n: ty.i64,
    dk_stride_b: ty.i64, dk_stride_h: ty.i64, dk_stride_n: ty.i64,
    dv_stride_b: ty.i64, dv_stride_h: ty.i64, dv_stride_n: ty.i64,
    lse_stride_b: ty.i64, lse_stride_h: ty.i64,
    m_stride_b: ty.i64, m_stride_h: ty.i64, m_stride_q: ty.i64, m_stride_k: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_M: ty.constexpr = 64,
    WARPS: ty.constexpr = WARPS, HAS_MASK: ty.constexpr = False, KV_SMEM: ty.constexpr = False,
    ASYNC_COPY: ty.constexpr = True, VARLEN: ty.constexpr = False,
):
    """Grid (key blocks of 16 x WARPS, key/value heads, batch or sequences); delta has L's layout."""
    b = ty.block_idx(2)
    q_start, k_start, seq_q, seq_k = seq_bounds(cu_q, cu_k, b, n_q, n_k, VARLEN)
    strides = ((q_stride_b, q_stride_h, q_stride_n), (k_stride_b, k_stride_h, k_stride_n),
               (v_stride_b, v_stride_h, v_stride_n), (do_stride_b, do_stride_h, do_stride_n),
               (dk_stride_b, dk_stride_h, dk_stride_n), (dv_stride_b, dv_stride_h, dv_stride_n),
               (lse_stride_b, lse_stride_h), (m_stride_b, m_stride_h, m_stride_q, m_stride_k))
    args = (q, k, v, dout, lse, delta, dk, dv, mask, (b, q_start, k_start), seq_q, seq_k, ty.block_idx(1), kv_group,
            scale, causal, strides, DTYPE, HEAD_DIM, BLOCK_M, WARPS, HAS_MASK, KV_SMEM, ASYNC_COPY)
    if VARLEN:
        if ty.block_idx(0) * (ROWS_PER_WARP * WARPS) < seq_k:  # else past the sequence's last key
            dkdv_rows(*args)
    else:
        dkdv_rows(*args)


# -- 3. dQ --------------------------------------------------------------------------------------------------

@ty.func
def dq_rows(q, k, v, dout, lse, delta, dq, mask, seq, n_q, n_k, h, kv_group, scale, causal, strides,
            DTYPE, HEAD_DIM, BLOCK_N, WARPS, HAS_MASK, ASYNC_COPY):
    """The CTA's 16 x WARPS query rows of head ``h``: dQ = scale sum over key tiles of dS K."""
    qs, ks, vs, dos, dqs, ls, ms = strides
    threads = 32 * WARPS
    rows = ROWS_PER_WARP * WARPS
    lay = Smem(BLOCK_N, HEAD_DIM, STAGES)
    smem = shared_bytes(lay.total)
    atom = ty.MmaSyncAtom(DTYPE)
    tid = ty.thread_idx()
    lane = ty.lane_id()
    warp = ty.warp_idx()
    m0 = (ty.grid_dim(0) - 1 - ty.block_idx(0)) * rows  # longest rows first under causal masking
    row0 = m0 + warp * ROWS_PER_WARP
    b, q_start, k_start = seq
    b64 = ty.cast(b, ty.i64)
    h64 = ty.cast(h, ty.i64)
    hk64 = ty.cast(h // kv_group, ty.i64)
    q0 = ty.cast(q_start, ty.i64)
    k0 = ty.cast(k_start, ty.i64)
    c = scale * LOG2E
    causal_off = n_k - n_q
    kv_end = n_k
    if causal != 0:
        kv_end = ty.minimum(n_k, ty.maximum(m0 + rows + causal_off, 0))
    n_tiles = (kv_end + (BLOCK_N - 1)) // BLOCK_N
    k_base = b64 * ks[0] + hk64 * ks[1] + k0 * ks[2]
    v_base = b64 * vs[0] + hk64 * vs[1] + k0 * vs[2]
    mask_args = (mask, b64 * ms[0] + h64 * ms[1], ms[2], ms[3])

    qa = load_q(q, b64 * qs[0] + h64 * qs[1] + q0 * qs[2], qs[2], row0, n_q, lane, HEAD_DIM, DTYPE)
    doa = load_q(dout, b64 * dos[0] + h64 * dos[1] + q0 * dos[2], dos[2], row0, n_q, lane, HEAD_DIM, DTYPE)
    stat = b64 * ls[0] + h64 * ls[1] + q0
    nl = []
    dl = []
    for half in range(2):  # rows g and g + 8 of the warp's 16
        row = row0 + (lane >> 2) + 8 * half
        at = stat + ty.cast(row, ty.i64)
        nl.append(exponent_offset(ty.load(lse + at, mask=row < n_q)))
        dl.append(ty.load(delta + at, mask=row < n_q))
    nl = nl * (BLOCK_N // 8)  # per C atom: its two rows
    dl = dl * (BLOCK_N // 8)
    dq_acc = [zero_atom() for _ in range(HEAD_DIM // 8)]

    copy_kv(k, v, k_base, v_base, ks[2], vs[2], smem, 0, lay, 0, n_k, tid, threads, ASYNC_COPY)
    for j in range(n_tiles):
        stage_off = (j & 1) * lay.stage_bytes
        if ASYNC_COPY:
            ty.cp_async_wait(0)
        ty.syncthreads()
        if j + 1 < n_tiles:
            copy_kv(k, v, k_base, v_base, ks[2], vs[2], smem, ((j + 1) & 1) * lay.stage_bytes, lay,
                    (j + 1) * BLOCK_N, n_k, tid, threads, ASYNC_COPY)
        s = score_tile(atom, qa, smem, stage_off, lane, BLOCK_N, HEAD_DIM)  # S = Q K^T
        s = maybe_mask(s, row0, j * BLOCK_N, lane, n_q, n_k, causal, causal_off, mask_args, HAS_MASK, BLOCK_N)
        p = weights(s, nl, c, True)
        dp = score_tile(atom, doa, smem, stage_off + lay.tile_bytes, lane, BLOCK_N, HEAD_DIM)  # dP = dO V^T
        ds = grad_scores(p, dp, dl, True)
        dq_acc = pv_tile(atom, ds, dq_acc, smem, stage_off, lane, BLOCK_N, HEAD_DIM)  # += dS K

    store_output(tiled(scaled(dq_acc, scale)), None, dq, None, row0, n_q, b64 * dqs[0] + h64 * dqs[1] + q0 * dqs[2],
                 dqs[2], 0, lane, DTYPE, False)


@ty.kernel(threads=_threads, arch="sm_80", noalias=True)
def attention_bwd_dq_portable(
    q: ty.ptr(ty.i16), k: ty.ptr(ty.i16), v: ty.ptr(ty.i16), dout: ty.ptr(ty.i16),
    lse: ty.ptr(ty.f32), delta: ty.ptr(ty.f32), dq: ty.ptr(ty.i16), mask: ty.ptr(ty.u8),
    cu_q: ty.ptr(ty.i32), cu_k: ty.ptr(ty.i32),
    n_q: ty.i32, n_k: ty.i32, kv_group: ty.i32, scale: ty.f32, causal: ty.i32,
    q_stride_b: ty.i64, q_stride_h: ty.i64, q_stride_n: ty.i64,
    k_stride_b: ty.i64, k_stride_h: ty.i64, k_stride_n: ty.i64,
    v_stride_b: ty.i64, v_stride_h: ty.i64, v_stride_n: ty.i64,
    do_stride_b: ty.i64, do_stride_h: ty.i64, do_stride_n: ty.i64,
    dq_stride_b: ty.i64, dq_stride_h: ty.i64, dq_stride_n: ty.i64,
    lse_stride_b: ty.i64, lse_stride_h: ty.i64,
    m_stride_b: ty.i64, m_stride_h: ty.i64, m_stride_q: ty.i64, m_stride_k: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 64,
    WARPS: ty.constexpr = WARPS, HAS_MASK: ty.constexpr = False, ASYNC_COPY: ty.constexpr = True,
    VARLEN: ty.constexpr = False,
):
    """Grid (query blocks of 16 x WARPS, query heads, batch or sequences)."""
    b = ty.block_idx(2)
    q_start, k_start, seq_q, seq_k = seq_bounds(cu_q, cu_k, b, n_q, n_k, VARLEN)
    strides = ((q_stride_b, q_stride_h, q_stride_n), (k_stride_b, k_stride_h, k_stride_n),
               (v_stride_b, v_stride_h, v_stride_n), (do_stride_b, do_stride_h, do_stride_n),
               (dq_stride_b, dq_stride_h, dq_stride_n), (lse_stride_b, lse_stride_h),
               (m_stride_b, m_stride_h, m_stride_q, m_stride_k))
    args = (q, k, v, dout, lse, delta, dq, mask, (b, q_start, k_start), seq_q, seq_k, ty.block_idx(1), kv_group,
            scale, causal, strides, DTYPE, HEAD_DIM, BLOCK_N, WARPS, HAS_MASK, ASYNC_COPY)
    if VARLEN:
        if (ty.grid_dim(0) - 1 - ty.block_idx(0)) * (ROWS_PER_WARP * WARPS) < seq_q:
            dq_rows(*args)
    else:
        dq_rows(*args)
