"""The Hopper attention backward over packed variable-length batches: the dK/dV kernel of
``backward.py`` per (block of 128 keys, key/value head, document), and the two small kernels
around it (statistics before, dQ after) indexed by document.

A CTA reads its document's first rows and lengths from cu_seqlens on the device (clamped to
[0, max_seqlen] and to the packed tensors, as the forward does; kept in shared memory), TMA-loads K/V from row
cu_k[b] + n0 and Q/dO from cu_q[b] + m0, and keeps the causal diagonal at the document's
bottom-right corner. Rows past a document's end hold the next document's values or whatever
lies past the used rows (NaN, say): each consumer zeroes its K/V rows past the end once, and the
two consumers zero the Q and dO rows past the end of a document's last query tile before any
product reads them, so a zero weight never meets a NaN (0 * NaN is NaN in a wgmma).

L log2(e), delta and the fp32 dQ accumulator are (H, n_pad) / (H, n_pad, D) buffers in which
document b's rows start at ``stat_start`` = round_down(cu_q[b] + 128 b, 128): every document's
query tiles get 128-aligned rows of their own (FlashAttention 3's padded offsets), so n_pad =
total_q + 128 (B + 1) rounded up covers them all.
"""
import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90.backward import (BLOCK_N, CONSUMER_THREADS, KEYS_PER_CONSUMER, Config, Problem, Smem,
                                                    check_config, consumer, init_barriers, producer)
from tylopy_kernels.attention.sm90.backward_aux import row_dot, store_dq_tile, zero_accum_part
from tylopy_kernels.attention.sm90.backward_common import LOG2E, ROW_BYTES, Gradients, Sizes, TensorMaps, bar_at

PAD = 128
KEY_TAIL_BARRIER = 6      # + consumer index: one consumer's 128 threads zeroed its K/V rows
QUERY_TAIL_BARRIER = 8    # both consumers zeroed the Q/dO rows of a document's last query tile
POS_INF = float("inf")
NEG_INF = float("-inf")


class VarlenBwd:
    """The run-time data of a packed batch (called through ``Problem.varlen``)."""

    def __init__(self, cu_q, cu_k, max_q, max_k, total_q, total_k, block_m):
        self.cu_q, self.cu_k, self.max_q, self.max_k = cu_q, cu_k, max_q, max_k
        self.total_q, self.total_k, self.block_m = total_q, total_k, block_m
        self.zero_query_tail = zero_query_tail
        self.zero_key_tail = zero_key_tail


@ty.func
def document(cu, b, most, total):
    """(first row, length) of document b, clamped: 0 <= start <= total, 0 <= length <= most and
    start + length <= total, so malformed prefix sums never address outside the packed rows."""
    start = ty.minimum(ty.maximum(cu[b], 0), total)
    n = ty.minimum(ty.maximum(cu[b + 1] - start, 0), most)
    return start, ty.minimum(n, total - start)


@ty.func
def stat_start(q_start, b):
    return ((q_start + PAD * b) // PAD) * PAD


DOC_FIELDS = ("q_start", "n_q", "k_start", "n_k", "stat_start")


class SharedDoc(Problem):
    """The CTA's document: its rows and lengths (``DOC_FIELDS``) stay in shared memory and every use
    loads them (one LDS), so no register holds them through the consumers' tile loop (kept in
    registers, they spilled there with ``diag`` and ``num_m``, which derive from them)."""

    def __init__(self, prob, smem, offset):
        # the batch's other fields as they are; these are properties here
        vars(self).update({k: v for k, v in vars(prob).items() if k not in DOC_FIELDS + ("diag", "num_m")})
        self.smem, self.doc_at = smem, offset

    def field(self, name):
        return ty.load(ty.ptr_cast(self.smem + (self.doc_at + 4 * DOC_FIELDS.index(name)), ty.i32))

    q_start = property(lambda self: self.field("q_start"))
    n_q = property(lambda self: self.field("n_q"))
    k_start = property(lambda self: self.field("k_start"))
    n_k = property(lambda self: self.field("n_k"))
    stat_start = property(lambda self: self.field("stat_start"))
    diag = property(lambda self: self.field("n_k") - self.field("n_q"))
    num_m = property(lambda self: (self.field("n_q") + (self.varlen.block_m - 1)) // self.varlen.block_m)


@ty.func
def doc_problem(prob, b, smem, offset):
    """The CTA's document (``SharedDoc``): thread 0 stores its rows and lengths; they are read after
    the next ``syncthreads``."""
    vl = prob.varlen
    q_start, n_q = document(vl.cu_q, b, vl.max_q, vl.total_q)
    k_start, n_k = document(vl.cu_k, b, vl.max_k, vl.total_k)
    if ty.thread_idx() == 0:
        for i, v in enumerate((q_start, n_q, k_start, n_k, stat_start(q_start, b))):
            ty.store(ty.ptr_cast(smem + (offset + 4 * i), ty.i32), v)
    return SharedDoc(prob, smem, offset)


@ty.func
def zero_rows(smem, offset, rows, first, panels, t, threads):
    """Zero rows first.. of a (rows x 64*panels) tile stored as 64-column panels of 128-byte rows
    (the swizzle permutes 16-byte pieces inside a row: whole rows stay rows). A run-time loop: the
    unrolled steps' addresses and row tests were loop invariants the consumers' tile loop spilled."""
    zero = ty.cast(0, ty.u32)
    for p in range(panels):
        for word in ty.range(32 * first + t, 32 * rows, threads, unroll=1):
            ty.store(ty.ptr_cast(smem + (offset + p * rows * ROW_BYTES + 4 * word), ty.u32), zero)


@ty.func
def zero_key_tail(smem, lay, prob, cfg, n0, wi):
    """Consumer wi zeroes its 64 rows of K and V past the document's end, then syncs its warpgroup
    (its own products read them next; the other consumer's dQ product reads K after the dS barrier)."""
    valid = prob.n_k - n0 - KEYS_PER_CONSUMER * wi
    if valid < KEYS_PER_CONSUMER:
        t = ty.thread_idx() & 127
        first = ty.maximum(valid, 0)
        mine = KEYS_PER_CONSUMER * ROW_BYTES * wi
        for base in (lay.k, lay.v):
            for p in range(cfg.panels):
                zero_rows(smem, base + p * BLOCK_N * ROW_BYTES + mine, KEYS_PER_CONSUMER, first, 1, t, 128)
        hopper.fence_proxy_async()
        ty.barrier_sync(KEY_TAIL_BARRIER + wi, 128)


@ty.func
def zero_query_tail(smem, lay, prob, cfg, stage, phase, m0, wi):
    """On a document's last query tile (uniform over both consumers): wait for dO too, zero the Q
    and dO rows past the end (the 256 consumer threads share the work), sync both consumers."""
    valid = prob.n_q - m0
    if valid < cfg.block_m:
        hopper.mbarrier_wait(bar_at(smem, lay.do_full + 8 * stage), phase, "do_full (document end)", stage)
        t = (ty.thread_idx() & 127) + 128 * wi
        for base in (lay.q, lay.do):
            zero_rows(smem, base + stage * lay.tile_bytes, cfg.block_m, valid, cfg.panels, t, CONSUMER_THREADS)
        hopper.fence_proxy_async()
        ty.barrier_sync(QUERY_TAIL_BARRIER, CONSUMER_THREADS)


@ty.kernel(threads=384, min_blocks_per_sm=1, noalias=True)
def attention_bwd_varlen_sm90(
    tm_q: ty.tensormap, tm_k: ty.tensormap, tm_v: ty.tensormap, tm_do: ty.tensormap,
    tm_lse: ty.tensormap, tm_delta: ty.tensormap, tm_dq: ty.tensormap,
    dk: ty.ptr(ty.i16), dv: ty.ptr(ty.i16), dq_accum: ty.ptr(ty.f32), cu_q: ty.ptr(ty.i32), cu_k: ty.ptr(ty.i32),
    max_q: ty.i32, max_k: ty.i32, total_q: ty.i32, total_k: ty.i32, n_heads: ty.i32, group: ty.i32, n_pad: ty.i32,
    scale: ty.f32, causal: ty.i32, dk_stride_h: ty.i64, dk_stride_n: ty.i64, dv_stride_h: ty.i64,
    dv_stride_n: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_M: ty.constexpr = 128,
    STAGES: ty.constexpr = 2, DQ: ty.constexpr = "tma", DQ_ORDER: ty.constexpr = "early",
    DK_SMEM: ty.constexpr = False, Q_ORDER: ty.constexpr = ("h", "n", "b"), KV_ORDER: ty.constexpr = ("h", "n", "b"),
):
    """Grid (key blocks of max_k, key/value heads, documents); a CTA past its document's keys exits."""
    check_config(HEAD_DIM, BLOCK_M, STAGES, DQ, DQ_ORDER)
    cfg = Config(DTYPE, HEAD_DIM, BLOCK_M, STAGES, has_mask=False, dq=DQ, dq_order=DQ_ORDER, dk_smem=DK_SMEM,
                 q_order=Q_ORDER, kv_order=KV_ORDER)
    lay = Smem(HEAD_DIM, BLOCK_M, STAGES, DQ)
    smem = ty.dynamic_shared(ty.u8, lay.total + 4 * len(DOC_FIELDS), align=1024)
    prob = Problem(Sizes(max_q, max_k, n_heads, group, n_pad), scale, causal, (None, (0, 0, 0)), BLOCK_M)
    prob.varlen = VarlenBwd(cu_q, cu_k, max_q, max_k, total_q, total_k, BLOCK_M)
    doc = doc_problem(prob, ty.block_idx(2), smem, lay.total)
    init_barriers(smem, lay, STAGES)                     # (its syncthreads publishes the document)
    if ty.block_idx(0) * BLOCK_N < doc.n_k:
        wg = ty.warpgroup_idx()
        if wg == 0:
            producer(smem, lay, doc, cfg, TensorMaps(tm_q, tm_k, tm_v, tm_do, tm_lse, tm_delta, tm_dq))
        else:
            consumer(smem, lay, doc, cfg, wg, Gradients(dk, dv, dq_accum, (0, dk_stride_h, dk_stride_n),
                                                        (0, dv_stride_h, dv_stride_n)))


@ty.kernel(threads=128, noalias=True)
def attention_bwd_varlen_preprocess(
    out: ty.ptr(ty.i16), dout: ty.ptr(ty.i16), lse: ty.ptr(ty.f32), delta: ty.ptr(ty.f32), lse_log2: ty.ptr(ty.f32),
    dq_accum: ty.ptr(ty.f32), cu_q: ty.ptr(ty.i32), max_q: ty.i32, total_q: ty.i32, n_pad: ty.i32,
    o_stride_h: ty.i64, o_stride_n: ty.i64, do_stride_h: ty.i64, do_stride_n: ty.i64, l_stride_h: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64,
):
    """Grid (ceil(round_up(max_q, 128) / rows per CTA), heads, documents): delta and L log2(e) of
    the document's rows, delta 0 and L +inf for the rows up to its 128-row padding; and zeros in
    the dQ accumulator's floats of those rows (the dK/dV kernel adds into them afterwards: no fill
    kernel of its own). A 64-row block of the accumulator is 4096 floats per 64 columns in wgmma
    order, so the 64 / rows CTAs of a block each zero a 1024-float part of it."""
    lanes = HEAD_DIM // 8
    rows = 128 // lanes
    tid = ty.thread_idx()
    row = ty.block_idx(0) * rows + tid // lanes
    part = tid % lanes
    h = ty.block_idx(1)
    b = ty.block_idx(2)
    q_start, n_q = document(cu_q, b, max_q, total_q)
    first = ty.block_idx(0) * rows                     # the CTA's first row in the document
    if first < (n_q + (PAD - 1)) // PAD * PAD:
        block = ty.cast(h, ty.i64) * ty.cast(n_pad // 64, ty.i64) + ty.cast((stat_start(q_start, b) + first) // 64,
                                                                           ty.i64)
        zero_accum_part(dq_accum, block * (64 * HEAD_DIM), (first % 64) // rows * 1024)
    h64 = ty.cast(h, ty.i64)
    r64 = ty.cast(q_start + row, ty.i64)
    acc = ty.cast(0.0, ty.f32)
    if row < n_q:
        o_off = h64 * o_stride_h + r64 * o_stride_n + ty.cast(part * 8, ty.i64)
        do_off = h64 * do_stride_h + r64 * do_stride_n + ty.cast(part * 8, ty.i64)
        acc = row_dot(out, dout, o_off, do_off, DTYPE)
    m = 1
    while m < lanes:
        acc = acc + ty.shfl_xor(acc, m)
        m = m * 2
    if (part == 0) & (row < (n_q + (PAD - 1)) // PAD * PAD):
        stat = ty.cast(h, ty.i64) * ty.cast(n_pad, ty.i64) + ty.cast(stat_start(q_start, b) + row, ty.i64)
        delta[stat] = acc
        scaled = ty.cast(POS_INF, ty.f32)
        if row < n_q:
            x = lse[h64 * l_stride_h + r64]
            scaled = ty.select(x == NEG_INF, POS_INF, x * LOG2E)
        lse_log2[stat] = scaled


@ty.func
def zero_uncovered(grad, cu, b, span, head, strides, row_words):
    """Zero ``grad``'s rows of ``head`` from document b's last computed row to the next document's
    first: the rows past max_seqlen of a longer document and, after the last document, every row
    to the end. ``span`` = (max_seqlen, total rows); ``strides`` = (head, row) in 32-bit words,
    ``row_words`` a row's words. The prefix sums are the repaired ones (monotonic, from 0), so
    these ranges and the documents' rows cover every row."""
    most, total = span
    start, n = document(cu, b, most, total)
    end = total
    if b + 1 < ty.grid_dim(2):
        end = ty.minimum(ty.maximum(cu[b + 1], start + n), total)
    words = ty.ptr_cast(grad, ty.u32)
    base = ty.cast(head, ty.i64) * strides[0]
    zero = ty.cast(0, ty.u32)
    for i in ty.range(ty.thread_idx(), (end - start - n) * row_words, 128, unroll=1):
        row = ty.cast(start + n + i // row_words, ty.i64)
        words[base + row * strides[1] + ty.cast(i % row_words, ty.i64)] = zero


@ty.kernel(threads=128, noalias=True)
def attention_bwd_varlen_dq_convert(
    dq_accum: ty.ptr(ty.f32), dq: ty.ptr(ty.i16), cu_q: ty.ptr(ty.i32), max_q: ty.i32, total_q: ty.i32,
    n_pad: ty.i32, scale: ty.f32, dq_stride_h: ty.i64, dq_stride_n: ty.i64,
    dk: ty.ptr(ty.i16), dv: ty.ptr(ty.i16), cu_k: ty.ptr(ty.i32), max_k: ty.i32, total_k: ty.i32, heads_kv: ty.i32,
    dk_stride_h: ty.i64, dk_stride_n: ty.i64, dv_stride_h: ty.i64, dv_stride_n: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, WIDE: ty.constexpr = False,
):
    """Grid (round_up(max_q, 64) / 64 * HEAD_DIM / 64, heads, documents): dQ = scale * accumulator
    for the document's rows, one 64x64 sub-tile per CTA (``backward_aux.store_dq_tile``). The first
    CTA of each (head, document) also zeroes the gradient rows no kernel computes (``zero_uncovered``:
    dq's, and dk's and dv's for the first heads_kv heads), so the three need no fill before the
    backward. (Strides in elements; every row stride is even: 32-bit stores.)"""
    col_tiles = HEAD_DIM // 64
    row_tile = ty.block_idx(0) // col_tiles
    col_tile = ty.block_idx(0) % col_tiles
    h = ty.block_idx(1)
    b = ty.block_idx(2)
    if ty.block_idx(0) == 0:
        row_words = HEAD_DIM // 2
        zero_uncovered(dq, cu_q, b, (max_q, total_q), h, (dq_stride_h // 2, dq_stride_n // 2), row_words)
        if h < heads_kv:
            zero_uncovered(dk, cu_k, b, (max_k, total_k), h, (dk_stride_h // 2, dk_stride_n // 2), row_words)
            zero_uncovered(dv, cu_k, b, (max_k, total_k), h, (dv_stride_h // 2, dv_stride_n // 2), row_words)
    q_start, n_q = document(cu_q, b, max_q, total_q)
    if row_tile * 64 < n_q:
        tile = (h * (n_pad // 64) + stat_start(q_start, b) // 64 + row_tile) * col_tiles + col_tile
        out_base = ty.cast(h, ty.i64) * dq_stride_h + ty.cast(q_start, ty.i64) * dq_stride_n
        store_dq_tile(dq_accum, tile, scale, dq, out_base, dq_stride_n, (row_tile * 64, n_q, col_tile * 64),
                      (DTYPE, WIDE))


def padded_rows(total_q, n_docs):
    """Rows of the L/delta/dQ buffers: every document's rows from its ``stat_start``, 128-aligned."""
    return -(-(total_q + PAD * (n_docs + 1)) // PAD) * PAD

