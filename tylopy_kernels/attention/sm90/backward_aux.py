"""The small kernels around the Hopper attention backward: statistics before it, dQ after it.

``attention_bwd_preprocess``: per query row, delta = sum_d dO * O (fp32, fused multiply-adds in
head-dim order per 16-byte chunk, then a butterfly over the row's lanes) and L log2(e) from the
forward's natural-log LSE, both into padded (B*H, n_pad) fp32 buffers the main kernels read with
TMA or plain loads. Rows past n_q get delta 0 and L = +inf; a row whose LSE is -inf (every key
masked) also gets +inf, so exp2(s c - L) is exactly 0 for it and its gradients vanish.

``attention_bwd_dq_convert``: dQ = scale * the fp32 accumulator the dK/dV kernel added its
partial products into, rounded to the input dtype. The accumulator holds 64x64 sub-tiles
(batch, head, row tile, column tile) in wgmma register order (``backward.accumulate_dq``); the
conversion reads each lane quad's 16 floats (two rows' eight columns) as one 64-byte run and
writes whole rows (``store_dq_tile``).

Attention sinks (one logit s_h per head that joins every row's normalizer) have the gradient
d s_h = -sum over (b, i) of e^(s_h - lse_bhi) delta_bhi: with ``SINKS`` the statistics kernel
zeroes dsinks and the conversion, which runs after it on the same stream, adds each 64-row tile's
terms (from the delta and L log2(e) the statistics kernel wrote) with one atomic per warp. The
sum's order follows the CTAs, so dsinks can differ in the last bits between runs, as dQ can.
"""
import tylopy as ty

from tylopy_kernels.attention.sm90.backward_common import LOG2E

POS_INF = float("inf")
NEG_INF = float("-inf")


@ty.func
def row_dot(out, dout, o_off, do_off, dtype):
    """sum over 8 consecutive elements of out * dout (two 16-byte loads)."""
    ow = ty.load(ty.ptr_cast(out + o_off, ty.b32), vec=4)
    dw = ty.load(ty.ptr_cast(dout + do_off, ty.b32), vec=4)
    acc = ty.cast(0.0, ty.f32)
    for k in range(4):
        o0, o1 = ty.unpack2(ow[k], dtype)
        d0, d1 = ty.unpack2(dw[k], dtype)
        acc = ty.fma(o0, d0, acc)
        acc = ty.fma(o1, d1, acc)
    return acc


@ty.func
def zero_accum_part(dq_accum, base, first):
    """Zero the 1024 floats of the dQ accumulator from ``base`` (i64) + ``first`` (i32) on: two
    16-byte stores per thread."""
    at = base + ty.cast(first + 4 * ty.thread_idx(), ty.i64)
    zero = ty.cast(0.0, ty.f32)
    for j in range(2):
        ty.store(dq_accum + (at + 512 * j), (zero, zero, zero, zero))


@ty.kernel(threads=128, noalias=True)
def attention_bwd_preprocess(
    out: ty.ptr(ty.i16), dout: ty.ptr(ty.i16), lse: ty.ptr(ty.f32), delta: ty.ptr(ty.f32), lse_log2: ty.ptr(ty.f32),
    dq_accum: ty.ptr(ty.f32), dsinks: ty.ptr(ty.f32), n_q: ty.i32, n_heads: ty.i32, n_pad: ty.i32,
    o_stride_b: ty.i64, o_stride_h: ty.i64, o_stride_n: ty.i64,
    do_stride_b: ty.i64, do_stride_h: ty.i64, do_stride_n: ty.i64,
    l_stride_b: ty.i64, l_stride_h: ty.i64, l_stride_n: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, ZERO_ACCUM: ty.constexpr = False,
    SINKS: ty.constexpr = False,
):
    """Grid (n_pad / rows per CTA, heads, batch); HEAD_DIM / 8 lanes share a row, 16 bytes each.
    ``ZERO_ACCUM``: also zero the dQ accumulator's floats of these rows (rows x HEAD_DIM = 1024 per
    CTA, in the (batch, head) plane's order), which the dK/dV kernel adds into afterwards; this
    saves a fill kernel of its own. ``SINKS``: zero dsinks (H,), which the conversion adds into."""
    if SINKS:
        if (ty.block_idx(0) == 0) & (ty.block_idx(2) == 0) & (ty.thread_idx() == 0):
            dsinks[ty.block_idx(1)] = ty.cast(0.0, ty.f32)
    if ZERO_ACCUM:
        plane = ty.cast(ty.block_idx(2) * n_heads + ty.block_idx(1), ty.i64) * ty.cast(n_pad, ty.i64) * HEAD_DIM
        zero_accum_part(dq_accum, plane, ty.block_idx(0) * 1024)
    lanes = HEAD_DIM // 8
    rows = 128 // lanes
    tid = ty.thread_idx()
    row = ty.block_idx(0) * rows + tid // lanes
    part = tid % lanes
    h = ty.block_idx(1)
    b = ty.block_idx(2)
    b64 = ty.cast(b, ty.i64)
    h64 = ty.cast(h, ty.i64)
    r64 = ty.cast(row, ty.i64)
    acc = ty.cast(0.0, ty.f32)
    if row < n_q:
        o_off = b64 * o_stride_b + h64 * o_stride_h + r64 * o_stride_n + ty.cast(part * 8, ty.i64)
        do_off = b64 * do_stride_b + h64 * do_stride_h + r64 * do_stride_n + ty.cast(part * 8, ty.i64)
        acc = row_dot(out, dout, o_off, do_off, DTYPE)
    m = 1
    while m < lanes:  # compile-time: every lane of the row takes part in each butterfly step
        acc = acc + ty.shfl_xor(acc, m)
        m = m * 2
    if (part == 0) & (row < n_pad):
        stat = (b * n_heads + h) * n_pad + row
        delta[stat] = acc
        scaled = ty.cast(POS_INF, ty.f32)
        if row < n_q:
            x = lse[b64 * l_stride_b + h64 * l_stride_h + r64 * l_stride_n]
            scaled = ty.select(x == NEG_INF, POS_INF, x * LOG2E)
        lse_log2[stat] = scaled


@ty.func
def store_dq_tile(dq_accum, tile, scale, dq, out_base, stride_n, rows, cfg):
    """dQ = scale * one 64x64 accumulator sub-tile, rounded to ``cfg`` = (dtype, wide) and stored
    from output row ``rows`` = (row0, n_rows, col0) on, rows at or past n_rows skipped.

    The sub-tile holds float 512j + 4t + e of wgmma thread t = 32w + l at row 16w + l/4 + 8(e/2),
    column 8j + 2(l%4) + e%2: the 16 floats of one lane quad are two rows' eight columns. Thread
    t takes quads q = t/8 and t/8 + 16 of column group j = t%8, so a warp reads 256 contiguous
    bytes per column group and writes four whole 128-byte rows; ``wide``: one 16-byte store per
    row segment (dq 16-byte aligned with strides of 8 elements), else four 4-byte stores."""
    row0, n_rows, col0 = rows
    dtype, wide = cfg
    tid = ty.thread_idx()
    j = tid & 7
    words = ty.ptr_cast(dq, ty.b32)
    for p in range(2):
        q = (tid >> 3) + 16 * p
        src = ty.cast(tile, ty.i64) * 4096 + ty.cast(512 * j + 16 * q, ty.i64)
        quads = [ty.load(dq_accum + (src + 4 * k), vec=4) for k in range(4)]
        for h in range(2):
            row = row0 + 16 * (q >> 3) + (q & 7) + 8 * h
            if row < n_rows:
                packed = tuple(ty.pack2(v[2 * h] * scale, v[2 * h + 1] * scale, dtype) for v in quads)
                at = (out_base + ty.cast(row, ty.i64) * stride_n + ty.cast(col0 + 8 * j, ty.i64)) >> 1
                if wide:
                    ty.store(words + at, packed)
                else:
                    for k in range(4):
                        words[at + k] = packed[k]


@ty.func
def add_sink_grads(sinks, dsinks, stats, h):
    """dsinks[h] -= sum over this tile's 64 rows of e^(s_h - lse) delta (threads 0-63, a row
    each; 2^(s_h log2 e - L log2 e) from the padded statistics ``stats`` = (delta, L log2 e, the
    row's statistics index of row 0)). Rows past n_q have delta 0 and L = +inf: terms of 0."""
    delta, lse_log2, stat0 = stats
    tid = ty.thread_idx()
    term = ty.cast(0.0, ty.f32)
    if tid < 64:
        stat = stat0 + tid
        term = ty.exp2(sinks[h] * LOG2E - lse_log2[stat]) * delta[stat]
    m = 1
    while m < 32:
        term = term + ty.shfl_xor(term, m)
        m = m * 2
    if (tid == 0) | (tid == 32):
        ty.red_add(dsinks + h, -term)


@ty.kernel(threads=128, noalias=True)
def attention_bwd_dq_convert(
    dq_accum: ty.ptr(ty.f32), dq: ty.ptr(ty.i16), n_q: ty.i32, n_heads: ty.i32, n_pad: ty.i32, scale: ty.f32,
    dq_stride_b: ty.i64, dq_stride_h: ty.i64, dq_stride_n: ty.i64,
    delta: ty.ptr(ty.f32), lse_log2: ty.ptr(ty.f32), sinks: ty.ptr(ty.f32), dsinks: ty.ptr(ty.f32),
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, WIDE: ty.constexpr = False,
    SINKS: ty.constexpr = False,
):
    """Grid (n_pad / 64 * HEAD_DIM / 64, heads, batch): one 64x64 sub-tile per CTA (``store_dq_tile``;
    ``WIDE``: dq's base and strides allow 16-byte stores). ``SINKS``: the first column tile of each
    64 rows also adds their sink-gradient terms into dsinks (``add_sink_grads``)."""
    col_tiles = HEAD_DIM // 64
    row_tile = ty.block_idx(0) // col_tiles
    col_tile = ty.block_idx(0) % col_tiles
    h = ty.block_idx(1)
    b = ty.block_idx(2)
    if SINKS:
        if col_tile == 0:
            add_sink_grads(sinks, dsinks, (delta, lse_log2, (b * n_heads + h) * n_pad + row_tile * 64), h)
    tile = ((b * n_heads + h) * (n_pad // 64) + row_tile) * col_tiles + col_tile
    out_base = ty.cast(b, ty.i64) * dq_stride_b + ty.cast(h, ty.i64) * dq_stride_h
    store_dq_tile(dq_accum, tile, scale, dq, out_base, dq_stride_n, (row_tile * 64, n_q, col_tile * 64),
                  (DTYPE, WIDE))


@ty.kernel(threads=128, noalias=True)
def attention_bwd_pack_mask(
    mask: ty.ptr(ty.u8), bits: ty.ptr(ty.u32), n_q: ty.i32, n_k: ty.i32, rows: ty.i32, words: ty.i32,
    m_stride_b: ty.i64, m_stride_h: ty.i64, m_stride_q: ty.i64, m_stride_k: ty.i64,
    KEYS_ON_ROWS: ty.constexpr = True,
):
    """The Boolean mask bit-packed for the backward kernels: bits[bh, row, w] bit i is the mask at
    (key row, query 32w + i) (``KEYS_ON_ROWS``) or (query row, key 32w + i); 0 past n_q or n_k.

    Grid (ceil(rows * words / 128), the mask's heads, its batch): a broadcast (stride 0) batch or
    head dimension is packed once. Consecutive threads take consecutive rows, so each of the 32
    byte loads of a warp reads 32 neighbours along the row dimension.
    """
    idx = ty.block_idx(0) * 128 + ty.thread_idx()
    h = ty.block_idx(1)
    b = ty.block_idx(2)
    if idx < rows * words:
        row = idx % rows
        w = idx // rows
        base = ty.cast(b, ty.i64) * m_stride_b + ty.cast(h, ty.i64) * m_stride_h
        word = ty.cast(0, ty.u32)
        for i in range(32):
            col = 32 * w + i
            q, k = (col, row) if KEYS_ON_ROWS else (row, col)
            flag = ty.load(mask + (base + ty.cast(q, ty.i64) * m_stride_q + ty.cast(k, ty.i64) * m_stride_k),
                           mask=(q < n_q) & (k < n_k))
            word = word | ty.select(flag != 0, ty.cast(1 << i, ty.u32), ty.cast(0, ty.u32))
        plane = b * ty.grid_dim(1) + h
        bits[(ty.cast(plane, ty.i64) * ty.cast(rows, ty.i64) + ty.cast(row, ty.i64)) * ty.cast(words, ty.i64)
             + ty.cast(w, ty.i64)] = word
