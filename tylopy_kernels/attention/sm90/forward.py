"""Warp-specialized attention forward for Hopper (sm_90a), head dim 64 or 128.

Computes O = softmax(scale * Q K^T + mask) V per (batch, head), and optionally the row
log-sum-exp, without ever writing scores or probabilities to global memory.

Algorithm (one CTA per (query block, head, batch), or a persistent loop over them):

1. Warpgroup 0 is the producer. It gives registers back (``setmaxnreg.dec``), loads the Q tile
   once with TMA and streams K and V tiles of ``BLOCK_N`` keys through a ring of ``STAGES``
   shared-memory stages (128-byte swizzle; a row of D = 128 is two 64-column boxes, stored as
   two column chunks). Each stage has a full and an empty mbarrier for K and for V; a stage is
   refilled once every consumer has released it. K/V may have fewer heads than Q (grouped-query
   attention): head h reads K/V head h // kv_group.
2. Warpgroups 1..CONSUMERS are consumers, 64 query rows each (``setmaxnreg.inc``). For key
   tile j: wait for K_j, take the tensor-core turn (named barrier), issue S_j = Q K_j^T (SS
   wgmma, optionally as two half-width groups) and O += P_{j-1} V_{j-1} (RS wgmma), hand the
   turn on, wait for S_j only, release K_j, mask and run the online softmax step on S_j
   (``hopper_softmax``: FMA-form exponent under a warp-uniform guard, lazy rescale), wait for
   the PV product (after the exponentials: they overlap it), release V_{j-1}, rescale O when
   a row's reference maximum moved, and convert S_j's registers in the same lanes into the
   16-bit A operand P_j of the next PV product.
3. After the last tile: O += P V, normalize by the row sums, store O (directly, or through
   shared memory and a TMA store) and LSE for the rows that exist. A persistent CTA (D=64) stores
   a tile's O after issuing the next tile's first S product, so the epilogue runs under it.

Constraints: D in {64, 128}; bf16 or fp16; Q/K/V as (B, H, N, D) views whose last dim is
contiguous and whose other strides are multiples of 16 bytes. Lengths, heads, batch, the K/V
head group, scale, causal and the optional Boolean mask are run-time data; the tile schedule
and the dtype are compile-time (``launch.SCHEDULE``; docs/performance.md has what each
option should change).

Run it: ``tylopy dump tylopy_kernels/attention/sm90/forward.py -D HEAD_DIM=128 -D CONSUMERS=2`` (PTX + ptxas
report, no GPU needed); ``tylopy.attention(q, k, v)`` on an H100/H200; check it with
``pytest -m gpu tests/test_attention_hopper_gpu.py``.
"""
import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90.consumer import consumer
from tylopy_kernels.attention.sm90.tiles import (REGISTER_SPLIT, Output, Plan, Problem, Schedule, Sizes, bar_at,
                                                batch_coord, key_row, next_tile, shift, skip_tile, tile_problem,
                                                tiles_of_this_cta, tma_coords)


@ty.func
def init_barriers(smem, plan):
    if ty.thread_idx() == 0:
        hopper.mbarrier_init(bar_at(smem, plan.q_full), 1)
        hopper.mbarrier_init(bar_at(smem, plan.q_empty), plan.consumers)
        for s in range(plan.stages):
            hopper.mbarrier_init(bar_at(smem, plan.k_full + 8 * s), 1)
            hopper.mbarrier_init(bar_at(smem, plan.v_full + 8 * s), 1)
            hopper.mbarrier_init(bar_at(smem, plan.k_empty + 8 * s), plan.consumers)
            hopper.mbarrier_init(bar_at(smem, plan.v_empty + 8 * s), plan.consumers)
        hopper.fence_mbarrier_init()
        hopper.fence_proxy_async()
    ty.syncthreads()


@ty.func
def load_rows(smem, plan, dst, chunk_bytes, tmap, bar, coords):
    """One TMA box per 64-column chunk of a tile (128-byte swizzle boxes are 64 elements wide);
    ``coords``: the tile's TMA coordinates after D (``tma_coords``)."""
    for c in range(plan.chunks):
        hopper.tma_load(smem + (dst + c * chunk_bytes), tmap, bar, 64 * c, *coords)


@ty.func
def load_tile(smem, plan, tmap, offset, ring, it, coords):
    """Wait until the ring stage of iteration ``it`` is free, then TMA one key tile into it."""
    stage, full_bar = hopper.ring_acquire(smem, ring, it, plan.tile_bytes)
    load_rows(smem, plan, offset + stage * plan.tile_bytes, plan.kv_chunk, tmap, full_bar, coords)


@ty.func
def producer(smem, plan, prob, sched, tm_q, tm_k, tm_v):
    """Warpgroup 0: Q once per work tile, K and V through their rings (``sched``: the persistent
    loop, its tile order and the tensor maps' coordinate order)."""
    hopper.setmaxnreg(REGISTER_SPLIT[plan.consumers][0], increase=False)
    warp = ty.warp_idx() & 3
    if warp == 0:
        if ty.elect_one():
            hopper.prefetch_tensormap(tm_k)
            hopper.prefetch_tensormap(tm_v)
            it = 0
            for k in range(tiles_of_this_cta(prob, sched.persistent)):
                valid, m0, h, b, n_tiles = next_tile(prob, k, sched.persistent, sched.tile_order)
                skip_tile(smem, plan, prob, valid, k, sched.persistent, None)
                if valid:
                    tp = tile_problem(prob, b)
                    kv_h = h // prob.kv_group
                    kv_b = batch_coord(prob, b) * prob.kv_batch
                    # Q has one buffer: the next tile's Q lands while the consumers finish this one.
                    hopper.mbarrier_wait(bar_at(smem, plan.q_empty), (k & 1) ^ 1, "q_empty")
                    q_full = bar_at(smem, plan.q_full)
                    hopper.mbarrier_arrive_expect_tx(q_full, plan.q_bytes)
                    load_rows(smem, plan, plan.q, plan.q_chunk, tm_q, q_full,
                              tma_coords(sched.coord_order, shift(m0, tp.q_start), h, batch_coord(prob, b)))
                    for j in range(n_tiles):
                        row = key_row(prob, tp, j, m0, h, b)
                        load_tile(smem, plan, tm_k, plan.k, plan.k_ring, it + j,
                                  tma_coords(sched.coord_order, row, kv_h, kv_b))
                        load_tile(smem, plan, tm_v, plan.v, plan.v_ring, it + j,
                                  tma_coords(sched.coord_order, row, kv_h, kv_b))
                    it = it + n_tiles


def defer_epilogue(plan, wanted, persistent, return_lse):
    """Whether a persistent CTA writes a tile's O under the next tile's first S product. At D=128
    the carried O (64 registers) spills next to a mask or a TMA store (ptxas: 32-60 bytes), so
    only D=64 defers."""
    return bool(wanted and persistent and plan.head_dim == 64)


def _threads(CONSUMERS=3, **_):
    return 128 * (CONSUMERS + 1)


@ty.kernel(threads=_threads, min_blocks_per_sm=1, noalias=True)
def attention_fwd_sm90(
    tm_q: ty.tensormap, tm_k: ty.tensormap, tm_v: ty.tensormap, tm_o: ty.tensormap,
    out: ty.ptr(ty.i16), lse_ptr: ty.ptr(ty.f32), mask: ty.ptr(ty.u8),
    n_q: ty.i32, n_k: ty.i32, n_heads: ty.i32, n_batch: ty.i32, kv_group: ty.i32, kv_batch: ty.i32,
    head_group_log2: ty.i32, scale: ty.f32, causal: ty.i32,
    o_stride_b: ty.i64, o_stride_h: ty.i64, o_stride_n: ty.i64,
    m_stride_b: ty.i64, m_stride_h: ty.i64, m_stride_q: ty.i64, m_stride_k: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 128,
    STAGES: ty.constexpr = 2, CONSUMERS: ty.constexpr = 3, HAS_MASK: ty.constexpr = False,
    RETURN_LSE: ty.constexpr = False, COORD_ORDER: ty.constexpr = ("n", "h", "b"),
    PERSISTENT: ty.constexpr = False, ORDER: ty.constexpr = "heads", EXPONENT: ty.constexpr = "ffma",
    RESCALE_THRESHOLD: ty.constexpr = 8.0, SPLIT_S: ty.constexpr = False, PV_WAIT: ty.constexpr = "pinned",
    POLY_EXP2: ty.constexpr = 0, TMA_STORE: ty.constexpr = False, O_ORDER: ty.constexpr = None,
    DEFER_EPILOGUE: ty.constexpr = True, EARLY_SUMS: ty.constexpr = True,
):
    """One CTA works through tiles (query block, head, batch): one per CTA when the grid covers
    them all, or a persistent loop when the grid is the number of SMs.

    Q, K, V and O (``tm_o``, read only with TMA_STORE) come as tensor maps over (D, then n, h, b
    in ``COORD_ORDER``); K/V have ``n_heads / kv_group`` heads and, with ``kv_batch`` = 0, one
    batch shared by all. 2^``head_group_log2`` (a divisor of heads x batch) sizes the "lpt"
    persistent order.
    """
    plan = Plan(HEAD_DIM, BLOCK_N, STAGES, CONSUMERS, TMA_STORE)
    sched = Schedule(DTYPE, has_mask=HAS_MASK, return_lse=RETURN_LSE, persistent=PERSISTENT, tile_order=ORDER,
                     coord_order=COORD_ORDER, out_order=O_ORDER, exponent=EXPONENT, threshold=RESCALE_THRESHOLD,
                     split_s=SPLIT_S, pv_wait=PV_WAIT, poly=POLY_EXP2, tma_store=TMA_STORE,
                     defer_epilogue=defer_epilogue(plan, DEFER_EPILOGUE, PERSISTENT, RETURN_LSE), early_sums=EARLY_SUMS)
    smem = ty.dynamic_shared(ty.u8, plan.total, align=1024)
    prob = Problem(Sizes(n_q, n_k, n_heads, n_batch, kv_group, kv_batch, head_group_log2), scale, causal,
                   Output(out, lse_ptr, tm_o, (o_stride_b, o_stride_h, o_stride_n)),
                   (mask, (m_stride_b, m_stride_h, m_stride_q, m_stride_k)), plan.block_m, BLOCK_N)
    init_barriers(smem, plan)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, plan, prob, sched, tm_q, tm_k, tm_v)
    else:
        hopper.setmaxnreg(REGISTER_SPLIT[CONSUMERS][1], increase=True)
        consumer(smem, plan, prob, sched, wg)
