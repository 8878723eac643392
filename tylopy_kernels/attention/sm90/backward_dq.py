"""Deterministic dQ for the Hopper attention backward: no atomics, one CTA per query block.

One CTA per (128 query rows, query head, batch), 384 threads, laid out like the forward kernel:
warpgroup 0 loads the Q and dO tiles once and streams K and V tiles of ``BLOCK_N`` keys through a
ring of ``STAGES`` stages (K and V on their own full/empty mbarriers); consumers 1 and 2 own 64
query rows each and, per key tile, compute

    S  = Q K^T   (SS: Q and K K-major)          P  = exp2(S c log2 e - L log2 e)
    dP = dO V^T  (SS: dO and V K-major)         dS = P (dP - delta)
    dQ += dS K   (RS: dS from registers by the same-lane conversion, K MN-major)

keeping dQ in registers and storing c dQ once. It recomputes S and dP, which the dK/dV kernel
also computes (so the deterministic backward costs 7 GEMMs against 5), but the sum over key
tiles always runs in the same order: the result is bitwise reproducible. The dK/dV kernel then
runs with ``DQ="none"``. L and delta (the padded fp32 rows of the preprocessing kernel)
are two values per thread, read straight from global memory. Under GQA, query head h reads key
/ value head h // group; under causal masking only the key tiles up to the block's last row run.
"""
from dataclasses import dataclass
from typing import Any

import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90.backward_common import (LOG2E, PANEL, REGISTER_SPLIT, ROW_BYTES, Sizes, bar_at,
                                                           kmajor_desc, load_tile, mask_bounds, masked_exp2,
                                                           mnmajor_desc, rs_gemm, ss_gemm, stage_of, store_rows,
                                                           tma_coords, user_mask_bits)

BLOCK_M = 128                 # query rows per CTA: two consumers of 64
ROWS_PER_CONSUMER = 64


def check_config(head_dim, block_n, stages):
    if head_dim not in (64, 128) or block_n not in (64, 128) or stages not in (2, 3, 4):
        raise ValueError(f"attention dQ kernel (Hopper) expects HEAD_DIM 64/128, BLOCK_N 64/128 and STAGES 2..4, but "
                         f"got {head_dim}, {block_n}, {stages}")


class Smem:
    """Byte offsets in the dynamic shared memory (every tile 1024-byte aligned)."""

    def __init__(self, head_dim, block_n, stages):
        self.tile_bytes = BLOCK_M * head_dim * 2
        self.kv_bytes = block_n * head_dim * 2
        self.q = 0
        self.do = self.tile_bytes
        self.k = 2 * self.tile_bytes
        self.v = self.k + stages * self.kv_bytes
        bars = self.v + stages * self.kv_bytes
        self.q_full = bars
        self.k_full = bars + 8
        self.k_empty = self.k_full + 8 * stages
        self.v_full = self.k_empty + 8 * stages
        self.v_empty = self.v_full + 8 * stages
        self.total = self.v_empty + 8 * stages
        self.k_ring = hopper.Ring(self.k_full, self.k_empty, stages)   # the K and V tiles' rings
        self.v_ring = hopper.Ring(self.v_full, self.v_empty, stages)


@dataclass(eq=False)   # compared and hashed by identity, as the trace treats a plain holder
class Config:
    """The compile-time choices every role reads (the kernel's constexprs, by name)."""

    dtype: Any
    head_dim: int
    block_n: int
    stages: int
    has_mask: bool
    pipeline: bool
    q_order: tuple
    kv_order: tuple

    def __post_init__(self):
        self.panels = self.head_dim // PANEL


class Problem:
    """The run-time sizes, scale, causal flag and packed mask bits (pointer, (batch, head, row)
    strides) of the dQ kernel, its key tile width, the padded fp32 rows it reads and where dQ goes
    (a plain holder of IR values)."""

    def __init__(self, sizes: Sizes, scale, causal, mask, block_n, stats, out):
        """``stats``: the L log2(e) and delta rows' pointers; ``out``: dQ's pointer and its (batch,
        head, row) strides."""
        self.n_q, self.n_k, self.n_heads, self.group, self.n_pad = sizes
        self.scale, self.causal = scale, causal
        self.mask, self.m_strides = mask
        self.block_n = block_n
        self.lse_log2, self.delta = stats
        self.dq, self.dq_strides = out
        self.num_m = (sizes.n_q + (BLOCK_M - 1)) // BLOCK_M


@ty.func
def tile_of_this_cta(prob):
    """(first query row, query head, key/value head, batch, key tiles); the last query block first
    (under causal masking it carries the most key tiles)."""
    m0 = (ty.grid_dim(0) - 1 - ty.block_idx(0)) * BLOCK_M
    hq = ty.block_idx(1)
    kv_end = prob.n_k
    if prob.causal != 0:
        kv_end = ty.minimum(prob.n_k, m0 + BLOCK_M)
    return m0, hq, hq // prob.group, ty.block_idx(2), (kv_end + (prob.block_n - 1)) // prob.block_n


@ty.func
def init_barriers(smem, lay, stages):
    if ty.thread_idx() == 0:
        hopper.mbarrier_init(bar_at(smem, lay.q_full), 1)
        for s in range(stages):
            hopper.mbarrier_init(bar_at(smem, lay.k_full + 8 * s), 1)
            hopper.mbarrier_init(bar_at(smem, lay.v_full + 8 * s), 1)
            hopper.mbarrier_init(bar_at(smem, lay.k_empty + 8 * s), 2)
            hopper.mbarrier_init(bar_at(smem, lay.v_empty + 8 * s), 2)
        hopper.fence_mbarrier_init()
        hopper.fence_proxy_async()
    ty.syncthreads()


@ty.func
def ring_load(smem, lay, cfg, tmap, offset, ring, j, coords):
    """Wait until the stage of ``ring`` for tile ``j`` is free, then TMA one key tile into it
    (``coords``: its TMA coordinates after the head-dim one)."""
    stage, full_bar = hopper.ring_acquire(smem, ring, j, lay.kv_bytes)
    load_tile(smem, offset + stage * lay.kv_bytes, tmap, full_bar, cfg.block_n, cfg.panels, coords)


@ty.func
def producer(smem, lay, prob, cfg, tm_q, tm_k, tm_v, tm_do):
    hopper.setmaxnreg(REGISTER_SPLIT[0], increase=False)
    warp = ty.warp_idx() & 3
    if warp == 0:
        if ty.elect_one():
            for tm in (tm_q, tm_k, tm_v, tm_do):
                hopper.prefetch_tensormap(tm)
            m0, hq, hk, b, n_tiles = tile_of_this_cta(prob)
            q_full = bar_at(smem, lay.q_full)
            hopper.mbarrier_arrive_expect_tx(q_full, 2 * lay.tile_bytes)
            load_tile(smem, lay.q, tm_q, q_full, BLOCK_M, cfg.panels, tma_coords(cfg.q_order, m0, hq, b))
            load_tile(smem, lay.do, tm_do, q_full, BLOCK_M, cfg.panels, tma_coords(cfg.q_order, m0, hq, b))
            for j in range(n_tiles):
                row = j * prob.block_n
                ring_load(smem, lay, cfg, tm_k, lay.k, lay.k_ring, j, tma_coords(cfg.kv_order, row, hk, b))
                ring_load(smem, lay, cfg, tm_v, lay.v, lay.v_ring, j, tma_coords(cfg.kv_order, row, hk, b))


@ty.func
def row_stats(values, rows_base, row0):
    """This thread's two rows (g and g + 8 of its warp's 16) of a padded fp32 statistic."""
    warp = ty.warp_idx() & 3
    g = ty.lane_id() >> 2
    return [values[rows_base + ty.cast(row0 + 16 * warp + g + 8 * h, ty.i64)] for h in range(2)]


class Consumer:
    """What one consumer's key tiles share (a plain holder of compile-time choices and IR values)."""

    def __init__(self, smem, lay, prob, cfg, where, stats, descs):
        """``where``: (first row, query head, batch); ``stats``: the rows' L log2(e) and delta;
        ``descs``: the shared memory's u32 address and the K-major descriptors of this consumer's
        Q and dO rows."""
        self.smem, self.lay, self.prob, self.cfg = smem, lay, prob, cfg
        self.row0, self.hq, self.b = where
        self.lse, self.dlt = stats
        self.base, self.q_desc, self.do_desc = descs


@ty.func
def key_tile(c, j, dq, prev_ops, leader, scale_log2):
    """Key tile j: S and dP, P and dS, then dQ += dS K (issued, and with ``PIPELINE`` left in
    flight). ``dq`` None starts the sum (the peeled first tile)."""
    prob, lay, smem, cfg, base = c.prob, c.lay, c.smem, c.cfg, c.base
    block_n = prob.block_n
    atom_s = hopper.WgmmaAtom(block_n, cfg.dtype, "ss")
    atom_q = hopper.WgmmaAtom(cfg.head_dim, cfg.dtype, "rs")
    stage, phase = stage_of(j, cfg.stages)
    k_off = lay.k + stage * lay.kv_bytes
    col0 = j * block_n
    bits = user_mask_bits(prob, c.row0, col0, c.hq, c.b, block_n) if cfg.has_mask else None
    hopper.mbarrier_wait(bar_at(smem, lay.k_full + 8 * stage), phase, "k_full", stage)
    s = ss_gemm(atom_s, c.q_desc, BLOCK_M, kmajor_desc(base, k_off), block_n, cfg.head_dim // 16)
    hopper.mbarrier_wait(bar_at(smem, lay.v_full + 8 * stage), phase, "v_full", stage)
    dp = ss_gemm(atom_s, c.do_desc, BLOCK_M, kmajor_desc(base, lay.v + stage * lay.kv_bytes), block_n,
                 cfg.head_dim // 16)
    if dq is not None and cfg.pipeline:  # S is ready and so is the previous tile's dQ product
        s, dq, prev_ops = hopper.wgmma_wait(1, s, dq, prev_ops)
        if leader:                                       # ... which has read the previous K tile
            hopper.mbarrier_arrive(bar_at(smem, lay.k_empty + 8 * ((j - 1) % cfg.stages)))
    else:
        s = hopper.wgmma_wait(1, s)
    bounds = mask_bounds(prob, c.row0, col0, False)
    slots = s.layout.row_slots
    p = s.with_data([masked_exp2(x, scale_log2, c.lse[slots[i]], bounds[slots[i]], i, False, bits)
                     for i, x in enumerate(s.values)])
    dp = hopper.wgmma_wait(0, dp)
    if leader:
        hopper.mbarrier_arrive(bar_at(smem, lay.v_empty + 8 * stage))
    ds = p.with_data([x * (y - c.dlt[slots[i]]) for i, (x, y) in enumerate(zip(p.values, dp.values))])
    ops = [ty.pack_operand_a(atom_q, ds, kk) for kk in range(block_n // 16)]
    dq = rs_gemm(atom_q, dq, ops, mnmajor_desc(base, k_off, block_n * ROW_BYTES))
    if not cfg.pipeline:
        dq, ops = hopper.wgmma_wait(0, dq, ops)
        if leader:
            hopper.mbarrier_arrive(bar_at(smem, lay.k_empty + 8 * stage))
    return dq, ops


@ty.func
def consumer(smem, lay, prob, cfg, wg):
    hopper.setmaxnreg(REGISTER_SPLIT[1], increase=True)
    wi = wg - 1
    m0, hq, hk, b, n_tiles = tile_of_this_cta(prob)
    row0 = m0 + ROWS_PER_CONSUMER * wi
    base = ty.address(smem)
    leader = (ty.thread_idx() & 127) == 0
    scale_log2 = prob.scale * LOG2E
    stats_base = ty.cast(b * prob.n_heads + hq, ty.i64) * ty.cast(prob.n_pad, ty.i64)
    stats = (row_stats(prob.lse_log2, stats_base, row0), row_stats(prob.delta, stats_base, row0))
    mine = ROWS_PER_CONSUMER * ROW_BYTES * wi
    c = Consumer(smem, lay, prob, cfg, (row0, hq, b), stats,
                 (base, kmajor_desc(base, lay.q + mine), kmajor_desc(base, lay.do + mine)))
    hopper.mbarrier_wait(bar_at(smem, lay.q_full), 0, "q_full")
    # PIPELINE: tile j's dQ product stays in flight (with its A registers) while tile j + 1's S and
    # dP are issued; the wait for S then also covers it. Tile 0 is peeled (there is always one),
    # so the accumulator enters the loop as the pending result of a wgmma.
    dq, ops = key_tile(c, 0, None, None, leader, scale_log2)
    for j in range(1, n_tiles):
        dq, ops = key_tile(c, j, dq, ops, leader, scale_log2)
    if cfg.pipeline:
        dq, ops = hopper.wgmma_wait(0, dq, ops)            # the last tile's K is never reloaded
    dq_strides = prob.dq_strides
    out_base = ty.cast(b, ty.i64) * dq_strides[0] + ty.cast(hq, ty.i64) * dq_strides[1]
    store_rows(dq * prob.scale, prob.dq, row0, prob.n_q, out_base, dq_strides[2], 0, cfg.dtype)


def smem_bytes(HEAD_DIM=64, BLOCK_N=128, STAGES=2, **_):
    return Smem(HEAD_DIM, BLOCK_N, STAGES).total


@ty.kernel(threads=384, min_blocks_per_sm=1, noalias=True)
def attention_bwd_dq_sm90(
    tm_q: ty.tensormap, tm_k: ty.tensormap, tm_v: ty.tensormap, tm_do: ty.tensormap,
    lse_log2: ty.ptr(ty.f32), delta: ty.ptr(ty.f32), dq: ty.ptr(ty.i16), mask_bits: ty.ptr(ty.u32),
    n_q: ty.i32, n_k: ty.i32, n_heads: ty.i32, group: ty.i32, n_pad: ty.i32, scale: ty.f32, causal: ty.i32,
    dq_stride_b: ty.i64, dq_stride_h: ty.i64, dq_stride_n: ty.i64,
    mb_stride_b: ty.i64, mb_stride_h: ty.i64, mb_stride_row: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 128,
    STAGES: ty.constexpr = 2, HAS_MASK: ty.constexpr = False, PIPELINE: ty.constexpr = True,
    Q_ORDER: ty.constexpr = ("n", "h", "b"), KV_ORDER: ty.constexpr = ("n", "h", "b"),
):
    """Grid (query blocks of 128, query heads, batch); ``n_pad`` is the padded length of the L and
    delta rows (a multiple of 128)."""
    check_config(HEAD_DIM, BLOCK_N, STAGES)
    cfg = Config(DTYPE, HEAD_DIM, BLOCK_N, STAGES, has_mask=HAS_MASK, pipeline=PIPELINE, q_order=Q_ORDER,
                 kv_order=KV_ORDER)
    lay = Smem(HEAD_DIM, BLOCK_N, STAGES)
    smem = ty.dynamic_shared(ty.u8, lay.total, align=1024)
    prob = Problem(Sizes(n_q, n_k, n_heads, group, n_pad), scale, causal,
                   (mask_bits, (mb_stride_b, mb_stride_h, mb_stride_row)), BLOCK_N, (lse_log2, delta),
                   (dq, (dq_stride_b, dq_stride_h, dq_stride_n)))
    init_barriers(smem, lay, STAGES)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, lay, prob, cfg, tm_q, tm_k, tm_v, tm_do)
    else:
        consumer(smem, lay, prob, cfg, wg)
