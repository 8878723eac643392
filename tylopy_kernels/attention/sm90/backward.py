"""Attention backward for Hopper (sm_90a): the warp-specialized dK/dV kernel (and dQ partials).

Given Q, K, V, O, dO and the forward's row log-sum-exp L, the gradients are (scale c)::

    P = exp(c Q K^T - L)         dV = P^T dO          dP = dO V^T
    dS = P * (dP - delta)        dK = c dS^T Q        dQ = c dS K       delta = rowsum(dO * O)

Four kernels compute them (``backward_launch.launch_backward_hopper`` runs them):

1. ``attention_bwd_preprocess`` (``backward_aux.py``): delta and L log2(e) per query row
   into padded fp32 buffers (padding rows get delta 0 and L = +inf, so their P is exactly 0; a
   row the forward left empty, L = -inf, also becomes +inf).
2. ``attention_bwd_sm90`` (here): one CTA per (block of 128 keys, key/value head, batch); 384
   threads. K and V stay in shared memory. Warpgroup 0 (the producer) streams Q, dO, L and delta
   tiles of ``BLOCK_M`` query rows through a ring of ``STAGES`` stages (TMA, full/empty
   mbarriers; Q with L and dO with delta on separate barriers). Warpgroups 1 and 2 (the
   consumers) own 64 keys each and, per query tile, compute S^T and dP^T, P^T and dS^T in
   registers, accumulate dV and dK in registers, write dS^T to shared memory, multiply dS K
   and add the partial dQ into an fp32 accumulator: ``DQ="tma"`` stages it in shared memory and
   producer warp 1 adds it with one TMA reduce-add per 64x64 sub-tile (FA3's way; the consumers
   spend no registers on it), ``DQ="atomic"`` adds it straight from registers with
   ``red.global.add.v4.f32``. Under GQA the CTA of key/value head g walks the query heads of its
   group one after another, so dK and dV are summed in registers (deterministic).
3. ``attention_bwd_dq_convert`` (``backward_aux.py``): dQ = c * accumulator, in the
   input dtype, after every CTA of 2. has added its part.
4. Deterministic mode instead runs ``attention_bwd_dq_sm90`` (``backward_dq.py``): one CTA
   per (128 query rows, query head, batch) streams K and V and accumulates dQ in registers,
   recomputing S and dP (3 more GEMMs in all, no atomics); 2. then runs with ``DQ="none"``.

The five products and their wgmma operand majors. Every tile sits in shared memory as TMA's
128-byte-swizzled image: rows of 64 elements (128 B), a head dim of 128 as two 64-column
panels. An operand is K-major when its reduction dimension runs along the stored rows,
MN-major (imm-trans = 1) when its M or N dimension does:

=====================  =====  =============================  ==============================
product (per WG)       shape  A                              B
=====================  =====  =============================  ==============================
S^T  = K_w Q^T         64xBM  K (keys x D), K-major, SS      Q (BM x D), K-major
dP^T = V_w dO^T        64xBM  V (keys x D), K-major, SS      dO (BM x D), K-major
dV  += P^T dO          64xD   P^T registers (RS, K-major)    dO (BM x D), MN-major
dK  += dS^T Q          64xD   dS^T registers (RS, K-major)   Q (BM x D), MN-major
dQ   = dS K            64x64  dS^T smem (keys x BM),         K (keys x D), MN-major
                              MN-major (imm-trans-a)
=====================  =====  =============================  ==============================

Computing S^T rather than S ("swapped AB") puts keys on the accumulator rows, so P^T and dS^T
become the register-A operands of dV and dK by the same-lane conversion (``pack_operand_a``),
with no shuffles; each thread then needs L and delta of 2*BM/8 query columns, read from the
staged shared-memory copies. dQ needs all 128 keys of dS, so both consumers store their dS^T
rows (software 128-byte swizzle, two buffers) and meet on a named barrier; consumer w then
multiplies one 64x64 dQ sub-tile: query rows 64w.. when ``BLOCK_M`` = 128 (head dim 64), head
dim columns 64w.. when ``BLOCK_M`` = 64 (head dim 128). The dQ accumulator stores each 64x64
sub-tile in the wgmma accumulator's register order (thread t's registers 4j..4j+3 at floats
512j + 4t): one contiguous 16 KB TMA box, or 16-byte ``red.global.add.v4.f32`` atomics of which
a warp's 32 cover 512 contiguous bytes; ``attention_bwd_dq_convert`` reads the same order back.

Schedule choices are compile-time parameters: ``STAGES`` (ring depth), ``DQ`` and ``DQ_ORDER``
("early": dQ = dS K issued between the dV and dK products, FA3's order; "late": after both;
"serial": once dV and dK completed, the fewest live registers).

Masks: keys past n_k (the last key block), causal (key j > query i, the forward's top-left
convention), and the optional Boolean mask (read through its strides, broadcast dims stride 0)
set P to 0 (the first two only in warps whose tile they reach); query rows past n_q read zeros
from TMA and an L of +inf. Under causal masking a CTA starts at the first query block that reaches its keys.

Constraints: head dim 64 (``BLOCK_M`` 128) or 128 (``BLOCK_M`` 64); bf16 or fp16; (B, H, N, D)
views whose last dim is contiguous and whose other strides are multiples of 16 bytes.
"""
from dataclasses import dataclass
from typing import Any

import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90.tiles import batch_coord, shift
from tylopy_kernels.attention.sm90.backward_common import (LOG2E, PANEL, REGISTER_SPLIT, ROW_BYTES, Gradients, Sizes,
                                                           TensorMaps, bar_at, kmajor_desc, kmajor_step, load_tile,
                                                           mnmajor_desc, probabilities_t, rs_gemm, ss_gemm, stage_of,
                                                           store_rows, tile_needs_mask, tma_coords, user_mask_bits,
                                                           zeros)

BLOCK_N = 128                 # keys per CTA: two consumer warpgroups of 64
KEYS_PER_CONSUMER = 64
CONSUMER_THREADS = 256
CONSUMER_WARPS = 8
DQ_TILE_BYTES = 64 * 64 * 4   # one fp32 64x64 dQ sub-tile
# Named barriers (0 is __syncthreads): both consumers stored their dS^T rows; consumer w's dQ
# sub-tile is staged (w's 128 threads arrive, producer warp 1 syncs) / its buffer is free again.
DS_BARRIER = 1
DQ_FULL = 2
DQ_EMPTY = 4
DQ_HANDOFF_THREADS = 128 + 32
# (head dim, BLOCK_M) pairs: S^T, dP^T (64 x BLOCK_M) and dK, dV (64 x D) must fit 240 registers,
# and consumer w's dQ sub-tile is 64 x 64 (rows 64w.. for BLOCK_M 128, columns 64w.. for 64).
SUPPORTED = {(64, 128), (128, 64)}
DQ_MODES = ("tma", "atomic", "none")
DQ_ORDERS = ("early", "late", "serial")


def check_config(head_dim, block_m, stages, dq, dq_order):
    if (head_dim, block_m) not in SUPPORTED:
        raise ValueError(f"attention backward (Hopper) expects (HEAD_DIM, BLOCK_M) in {sorted(SUPPORTED)}, but got "
                         f"({head_dim}, {block_m})")
    if stages not in (1, 2, 3, 4):
        raise ValueError(f"attention backward (Hopper) STAGES expects 1..4, but got {stages}")
    if dq not in DQ_MODES or dq_order not in DQ_ORDERS:
        raise ValueError(f"attention backward (Hopper) DQ expects one of {DQ_MODES} and DQ_ORDER one of {DQ_ORDERS}, "
                         f"but got {dq!r} and {dq_order!r}")


class Smem:
    """Byte offsets in the dynamic shared memory; every tile 1024-byte aligned (swizzle atoms)."""

    def __init__(self, head_dim, block_m, stages, dq):
        self.kv_bytes = BLOCK_N * head_dim * 2
        self.tile_bytes = block_m * head_dim * 2        # one Q or dO stage
        self.ds_bytes = BLOCK_N * block_m * 2 if dq != "none" else 0
        self.stat_bytes = block_m * 4                   # one L or delta stage
        self.k = 0
        self.v = self.k + self.kv_bytes
        self.q = self.v + self.kv_bytes
        self.do = self.q + stages * self.tile_bytes
        self.ds = self.do + stages * self.tile_bytes
        self.dq = self.ds + 2 * self.ds_bytes          # two dS^T buffers, then two dQ sub-tiles
        self.lse = self.dq + (2 * DQ_TILE_BYTES if dq == "tma" else 0)
        self.delta = self.lse + stages * self.stat_bytes
        bars = self.delta + stages * self.stat_bytes
        self.kv_full = bars
        self.q_full = bars + 8
        self.q_empty = self.q_full + 8 * stages
        self.do_full = self.q_empty + 8 * stages
        self.do_empty = self.do_full + 8 * stages
        self.total = self.do_empty + 8 * stages


@dataclass(eq=False)   # compared and hashed by identity, as the trace treats a plain holder
class Config:
    """The compile-time choices every role reads (the kernel's constexprs, by name)."""

    dtype: Any
    head_dim: int
    block_m: int
    stages: int
    has_mask: bool
    dq: str
    dq_order: str
    dk_smem: bool
    q_order: tuple
    kv_order: tuple

    def __post_init__(self):
        self.dk_smem = self.dk_smem and self.dq != "none"
        self.panels = self.head_dim // PANEL


class Problem:
    """The run-time sizes, strides and pointers (a plain holder of IR values)."""

    def __init__(self, sizes: Sizes, scale, causal, mask, block_m):
        """``mask``: the packed mask bits' pointer (or None) and their (batch, head, row) strides."""
        self.n_q, self.n_k, self.n_heads, self.group, self.n_pad = sizes
        self.scale, self.causal = scale, causal
        self.mask, self.m_strides = mask
        self.num_m = (sizes.n_q + (block_m - 1)) // block_m
        # Packed batches (``backward_varlen.py``): the CTA's document. Dense problems keep these
        # Python zeros and None, which emit nothing.
        self.varlen = None
        self.q_start = 0     # the document's first packed rows (queries, keys)
        self.k_start = 0
        self.diag = 0        # causal: key j takes part for query i when j <= i + diag
        self.stat_start = 0  # the document's first row in the padded L/delta/dQ buffers
        # Programmable attention (``backward_variant.py``): the work list and the score transform.
        # Dense problems keep None, which emits nothing.
        self.variant = None


# -- producer ---------------------------------------------------------------------------------------

@ty.func
def work_range(prob, n0, block_m):
    """(first query block, query blocks per head, iterations): causal skips the query blocks that
    end before this CTA's first key; GQA walks the group's query heads one after another."""
    if prob.variant is not None:
        return prob.variant.work_range(prob, n0, block_m)
    m_first = 0
    if prob.causal != 0:
        if prob.varlen is None:
            m_first = n0 // block_m
        else:  # the first query that reaches key n0 is n0 - diag (bottom-right diagonal)
            m_first = ty.maximum(n0 - prob.diag, 0) // block_m
    per_head = ty.maximum(prob.num_m - m_first, 0)   # 0 when every query precedes these keys
    return m_first, per_head, per_head * prob.group


@ty.func
def iteration(prob, hk, m_first, per_head, it, block_m):
    """(query head, first query row) of iteration ``it``."""
    if prob.variant is not None:
        return prob.variant.iteration(prob, hk, m_first, per_head, it, block_m)
    return hk * prob.group + it // per_head, (m_first + it % per_head) * block_m


@ty.func
def init_barriers(smem, lay, stages):
    if ty.thread_idx() == 0:
        hopper.mbarrier_init(bar_at(smem, lay.kv_full), 1)
        for s in range(stages):
            hopper.mbarrier_init(bar_at(smem, lay.q_full + 8 * s), 1)
            hopper.mbarrier_init(bar_at(smem, lay.do_full + 8 * s), 1)
            # Every consumer warp releases a stage (it read L or delta from it with plain loads).
            hopper.mbarrier_init(bar_at(smem, lay.q_empty + 8 * s), CONSUMER_WARPS)
            hopper.mbarrier_init(bar_at(smem, lay.do_empty + 8 * s), CONSUMER_WARPS)
        hopper.fence_mbarrier_init()
        hopper.fence_proxy_async()
    ty.syncthreads()


@ty.func
def load_tiles(smem, lay, prob, cfg, maps):
    """Producer warp 0 (one thread): K and V once, then Q with L and dO with delta per iteration."""
    for tm in (maps.q, maps.k, maps.v, maps.do, maps.lse, maps.delta):
        hopper.prefetch_tensormap(tm)
    n0 = ty.block_idx(0) * BLOCK_N
    hk = ty.block_idx(1)
    b = ty.block_idx(2)
    kv_full = bar_at(smem, lay.kv_full)
    hopper.mbarrier_arrive_expect_tx(kv_full, 2 * lay.kv_bytes)
    load_tile(smem, lay.k, maps.k, kv_full, BLOCK_N, cfg.panels,
              tma_coords(cfg.kv_order, shift(n0, prob.k_start), hk, batch_coord(prob, b)))
    load_tile(smem, lay.v, maps.v, kv_full, BLOCK_N, cfg.panels,
              tma_coords(cfg.kv_order, shift(n0, prob.k_start), hk, batch_coord(prob, b)))
    m_first, per_head, total = work_range(prob, n0, cfg.block_m)
    for it in range(total):
        hq, m0 = iteration(prob, hk, m_first, per_head, it, cfg.block_m)
        stat_row = b * prob.n_heads + hq if prob.varlen is None else hq  # packed: (H, padded rows)
        q_ring = hopper.Ring(lay.q_full, lay.q_empty, cfg.stages)   # Q (with LSE) and dO (with delta): rings in step
        stage, q_full = hopper.ring_acquire(smem, q_ring, it, lay.tile_bytes + lay.stat_bytes, "q_empty")
        load_tile(smem, lay.q + stage * lay.tile_bytes, maps.q, q_full, cfg.block_m, cfg.panels,
                  tma_coords(cfg.q_order, shift(m0, prob.q_start), hq, batch_coord(prob, b)))
        hopper.tma_load(smem + (lay.lse + stage * lay.stat_bytes), maps.lse, q_full, shift(m0, prob.stat_start),
                        stat_row)
        do_ring = hopper.Ring(lay.do_full, lay.do_empty, cfg.stages)
        stage, do_full = hopper.ring_acquire(smem, do_ring, it, lay.tile_bytes + lay.stat_bytes, "do_empty")
        load_tile(smem, lay.do + stage * lay.tile_bytes, maps.do, do_full, cfg.block_m, cfg.panels,
                  tma_coords(cfg.q_order, shift(m0, prob.q_start), hq, batch_coord(prob, b)))
        hopper.tma_load(smem + (lay.delta + stage * lay.stat_bytes), maps.delta, do_full, shift(m0, prob.stat_start),
                        stat_row)


@ty.func
def reduce_dq_tiles(smem, lay, prob, cfg, tm_dq):
    """Producer warp 1 (DQ="tma"): for every iteration and consumer, wait for its staged dQ
    sub-tile, add it into the fp32 accumulator with one TMA reduce-add, and hand the buffer back
    once the TMA has read it (the last one is not handed back: nobody waits for it)."""
    n0 = ty.block_idx(0) * BLOCK_N
    hk = ty.block_idx(1)
    b = ty.block_idx(2)
    issuer = ty.lane_id() == 0                           # bulk groups are per thread: always lane 0
    m_first, per_head, total = work_range(prob, n0, cfg.block_m)
    for it in range(total):
        hq, m0 = iteration(prob, hk, m_first, per_head, it, cfg.block_m)
        for wi in range(2):
            ty.barrier_sync(DQ_FULL + wi, DQ_HANDOFF_THREADS)
            if issuer:
                tile = dq_tile_index(prob, cfg, b, hq, m0, wi)
                hopper.tma_store(tm_dq, smem + (lay.dq + wi * DQ_TILE_BYTES), 0, 16 * tile, reduce="add")
                hopper.bulk_commit()
                hopper.bulk_wait(0, read=True)
            if it + 1 < total:
                ty.barrier_arrive(DQ_EMPTY + wi, DQ_HANDOFF_THREADS)
    if issuer:
        hopper.bulk_wait(0)


@ty.func
def producer(smem, lay, prob, cfg, maps):
    """Warpgroup 0 (``maps``: the ``TensorMaps``): warp 0 loads, warp 1 (DQ="tma") adds dQ up."""
    hopper.setmaxnreg(REGISTER_SPLIT[0], increase=False)
    warp = ty.warp_idx() & 3
    if warp == 0:
        if ty.elect_one():
            load_tiles(smem, lay, prob, cfg, maps)
    if cfg.dq == "tma":
        if warp == 1:
            reduce_dq_tiles(smem, lay, prob, cfg, maps.dq)


# -- consumers --------------------------------------------------------------------------------------

@ty.func
def column_stats(smem, offset, j):
    """The fp32 statistics of query columns 8j + 2t and 8j + 2t + 1 (one 8-byte shared load)."""
    t = ty.lane_id() & 3
    return ty.load(ty.ptr_cast(smem + (offset + 4 * (8 * j + 2 * t)), ty.f32), vec=2)


EARLY_STATS = 2   # 8-column groups of L (and delta) loaded before the wait for S (dP^T)


class TileStats:
    """A query tile's fp32 statistics (L or delta) per 8-column group j (``stats[j]``, as
    ``column_stats``): the first ``EARLY_STATS`` groups are loaded when this is made, before the
    wait for the product that needs them, the others where they are used. Loaded after the wait,
    the first exponent of a tile waited for its L (~30 cycles, 8% of the loop's stall samples at
    D=128); loading all groups early spills (16-32 registers more across the wait)."""

    def __init__(self, smem, offset, block_m, early=None):
        self.smem, self.offset = smem, offset
        early = EARLY_STATS if early is None else early
        self.loaded = {j: column_stats(smem, offset, j) for j in range(min(early, block_m // 8))}

    def __getitem__(self, j):
        if j not in self.loaded:  # one load per group, however many registers read it
            self.loaded[j] = column_stats(self.smem, self.offset, j)
        return self.loaded[j]


@ty.func
def score_grads_t(p, dp, delta, dtype):
    """dS^T = P^T (dP^T - delta) (``delta``: ``TileStats`` of the query columns), and both P^T
    and dS^T packed into the register-A operands of dV and dK, one k16 step per fragment
    (``pack_operand_a``'s order). Works through 8-column groups, packing each as soon as its dS
    is known, so the f32 P^T and dP^T registers of a group die early."""
    pv = p.values
    dv = dp.values
    p_words = []
    ds_words = []
    for j in range(len(pv) // 4):
        ds = [pv[4 * j + e] * (dv[4 * j + e] - delta[j][e & 1]) for e in range(4)]
        for h in range(2):
            p_words.append(ty.pack2(pv[4 * j + 2 * h], pv[4 * j + 2 * h + 1], dtype))
            ds_words.append(ty.pack2(ds[2 * h], ds[2 * h + 1], dtype))
    p_ops = [ty.Fragment(tuple(p_words[4 * kk: 4 * kk + 4]), ty.WGMMA_A_RS, pack=2, dtype=dtype)
             for kk in range(len(p_words) // 4)]
    ds_ops = [ty.Fragment(tuple(ds_words[4 * kk: 4 * kk + 4]), ty.WGMMA_A_RS, pack=2, dtype=dtype)
              for kk in range(len(ds_words) // 4)]
    return p_ops, ds_ops


@ty.func
def store_ds(smem, ds_offset, ds_ops, wi):
    """Write this consumer's 64 rows of dS^T (keys 64wi..) into the swizzled dS^T buffer (rows =
    keys, 64-query panels of 128 rows) with one stmatrix.x4 per k16 step: word r of step kk is
    the 8x8 block of rows 8(r & 1).. and columns 16kk + 8(r >> 1).., and lane l gives the address
    of row l % 8 of block l // 8, its 16-byte chunk moved by the 128-byte swizzle (chunk ^ row % 8)."""
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    i = lane & 7
    row = KEYS_PER_CONSUMER * wi + 16 * warp + 8 * ((lane >> 3) & 1) + i
    # The swizzle only flips address bits 4-6 (rows are 128 bytes, tiles 1024-aligned): XOR the
    # whole offset, so the per-step addresses stay tied to ds_offset instead of being hoisted.
    flip = i << 4
    row_base = ds_offset + row * ROW_BYTES + ((lane >> 4) << 4)
    for kk in range(len(ds_ops)):
        offset = (row_base + (kk // 4) * BLOCK_N * ROW_BYTES + ((2 * (kk % 4)) << 4)) ^ flip
        ty.stmatrix(ty.ptr_cast(smem + offset, ty.b32), ds_ops[kk].values)


@ty.func
def dq_product(smem, lay, cfg, base, ds_offset, wi):
    """This consumer's 64x64 dQ sub-tile of dS K: A = dS (queries x keys) read MN-major from the
    dS^T buffer, B = K read MN-major; 8 k-steps of 16 keys (2048 bytes each)."""
    atom = hopper.WgmmaAtom(64, cfg.dtype, "ss")
    ds_panel = BLOCK_N * ROW_BYTES                    # 64 queries x 128 keys
    a_off = ds_offset + (wi * ds_panel if cfg.block_m == 128 else 0)
    b_off = lay.k + (wi * BLOCK_N * ROW_BYTES if cfg.block_m == 64 else 0)
    a_desc = mnmajor_desc(base, a_off, ds_panel)
    b_desc = mnmajor_desc(base, b_off, BLOCK_N * ROW_BYTES)
    hopper.wgmma_fence()
    acc = None
    for kk in range(BLOCK_N // 16):
        step = (16 * ROW_BYTES // 16) * kk
        acc = hopper.wgmma(atom, acc, a_desc + step, b_desc + step, trans_a=1, trans_b=1)
    hopper.wgmma_commit()
    return acc


@ty.func
def dk_product(cfg, base, dk, ds_ops, ds_offset, wi, q_off):
    """dK += dS^T Q, B = Q read MN-major; A = dS^T from registers (RS), or (``DK_SMEM``) read
    K-major from this consumer's 64 rows of the dS^T buffer, so dS^T's registers die once stored."""
    panel_bytes = cfg.block_m * ROW_BYTES
    b_desc = mnmajor_desc(base, q_off, panel_bytes)
    if cfg.dk_smem:
        atom = hopper.WgmmaAtom(cfg.head_dim, cfg.dtype, "ss")
        a_desc = kmajor_desc(base, ds_offset + KEYS_PER_CONSUMER * ROW_BYTES * wi)
        hopper.wgmma_fence()
        for kk in range(cfg.block_m // 16):
            dk = hopper.wgmma(atom, dk, kmajor_step(a_desc, kk, BLOCK_N), b_desc + (16 * ROW_BYTES // 16) * kk,
                              trans_b=1)
        hopper.wgmma_commit()
        return dk
    return rs_gemm(hopper.WgmmaAtom(cfg.head_dim, cfg.dtype, "rs"), dk, ds_ops, b_desc)


@ty.func
def dq_tile_index(prob, cfg, b, hq, m0, wi):
    """Index of this consumer's 64x64 sub-tile in the dQ accumulator: (b, h, row tile, col tile)."""
    col_tiles = cfg.head_dim // 64
    row_tile = shift(m0, prob.stat_start) // 64 + (wi if cfg.block_m == 128 else 0)
    col_tile = wi if cfg.block_m == 64 else 0
    plane = b * prob.n_heads + hq if prob.varlen is None else hq  # packed: (H, padded rows)
    return (plane * (prob.n_pad // 64) + row_tile) * col_tiles + col_tile


@ty.func
def accumulate_dq(c, dq, it, hq, m0):
    """Add consumer ``c``'s 64x64 dQ partial into its sub-tile of the fp32 accumulator, which
    holds sub-tiles in register order (floats 512j + 4t + e hold thread t's register 4j + e).

    "tma": stage it in shared memory for producer warp 1's TMA reduce-add (eight conflict-free
    16-byte stores a thread, once the previous sub-tile left the buffer); "atomic": eight
    red.global.add.v4.f32 a thread.
    """
    smem, lay, prob, cfg, b, wi = c.smem, c.lay, c.prob, c.cfg, c.b, c.wi
    t = ty.thread_idx() & 127
    vals = dq.values
    if cfg.dq == "tma":
        if it > 0:
            ty.barrier_sync(DQ_EMPTY + wi, DQ_HANDOFF_THREADS)
        buf = lay.dq + wi * DQ_TILE_BYTES + 16 * t
        for j in range(len(vals) // 4):
            ty.store(ty.ptr_cast(smem + (buf + 2048 * j), ty.f32), tuple(vals[4 * j: 4 * j + 4]))
        hopper.fence_proxy_async()                       # generic stores -> the TMA's reads
        ty.barrier_arrive(DQ_FULL + wi, DQ_HANDOFF_THREADS)
    else:
        tile = dq_tile_index(prob, cfg, b, hq, m0, wi)
        lanes = 32 * (ty.warp_idx() & 3) + ty.lane_id()  # t, per tile: hoisted, its i64 held 2 registers
        base = ty.cast(tile, ty.i64) * 4096 + ty.cast(lanes * 4, ty.i64)
        for j in range(len(vals) // 4):
            ty.red_add(c.dq_accum + (base + 512 * j), tuple(vals[4 * j: 4 * j + 4]))


@ty.func
def release(smem, offset, stage, leader):
    if leader:
        hopper.mbarrier_arrive(bar_at(smem, offset + 8 * stage))


class Consumer:
    """What one consumer's query tiles share (a plain holder): the shared memory (pointer and u32
    address), its layout, the problem and config, the consumer's keys, the scale in log2 units and
    the fp32 dQ accumulator (DQ="atomic")."""

    def __init__(self, smem, base, lay, prob, cfg, keys, scale_log2, dq_accum):
        """``keys``: (the CTA's first key n0, its batch b, the consumer's index wi: keys n0 + 64 wi ..)."""
        self.smem, self.base, self.lay, self.prob, self.cfg = smem, base, lay, prob, cfg
        self.n0, self.b, self.wi = keys
        self.scale_log2, self.dq_accum = scale_log2, dq_accum


@ty.func
def consumer_step(c, it, hq, m0, dv, dk):
    """One query tile against consumer ``c``'s 64 keys: dV += P^T dO, dK += dS^T Q, dQ += dS K."""
    smem, lay, prob, cfg, base, wi = c.smem, c.lay, c.prob, c.cfg, c.base, c.wi
    stage, phase = stage_of(it, cfg.stages)
    leader = ty.lane_id() == 0                           # one arrival per warp on the empty barriers
    atom_s = hopper.WgmmaAtom(cfg.block_m, cfg.dtype, "ss")
    atom_kv = hopper.WgmmaAtom(cfg.head_dim, cfg.dtype, "rs")
    k_steps = cfg.head_dim // 16
    key0 = c.n0 + KEYS_PER_CONSUMER * wi
    q_off = lay.q + stage * lay.tile_bytes
    do_off = lay.do + stage * lay.tile_bytes
    mine = KEYS_PER_CONSUMER * ROW_BYTES * wi            # this consumer's rows of K and V
    panel_bytes = cfg.block_m * ROW_BYTES
    with_dq = cfg.dq != "none"

    need = None  # voted before the products: next to its use it held more registers through them (D=64 spilled)
    if prob.variant is None:
        need = tile_needs_mask(prob, key0, m0)
    hopper.mbarrier_wait(bar_at(smem, lay.q_full + 8 * stage), phase, "q_full", stage)
    if prob.varlen is not None:  # Q and dO rows past the document's end: zeros before any product
        prob.varlen.zero_query_tail(smem, lay, prob, cfg, stage, phase, m0, wi)
    s = ss_gemm(atom_s, kmajor_desc(base, lay.k + mine), BLOCK_N, kmajor_desc(base, q_off), cfg.block_m, k_steps)
    # L came with Q (q_full); a variant whose dS needs the transform's slope reads it after dP^T
    early = getattr(prob.variant, "early_stats", None)
    lse = TileStats(smem, lay.lse + stage * lay.stat_bytes, cfg.block_m, early)
    hopper.mbarrier_wait(bar_at(smem, lay.do_full + 8 * stage), phase, "do_full", stage)
    dp = ss_gemm(atom_s, kmajor_desc(base, lay.v + mine), BLOCK_N, kmajor_desc(base, do_off), cfg.block_m, k_steps)
    s = hopper.wgmma_wait(1, s)
    bits = user_mask_bits(prob, key0, m0, hq, c.b, cfg.block_m) if cfg.has_mask else None
    if prob.variant is None:
        p = probabilities_t(s, lse, c.scale_log2, (prob, key0, m0, need), bits)
        delta = TileStats(smem, lay.delta + stage * lay.stat_bytes, cfg.block_m)  # delta came with dO
        dp = hopper.wgmma_wait(0, dp)
        p_ops, ds_ops = score_grads_t(p, dp, delta, cfg.dtype)
    else:  # the score transform, its derivative and the variant's masks (``backward_variant.py``)
        p_ops, ds_ops = prob.variant.score_grads(s, dp, c, (stage, lse), (key0, m0, hq, c.b), it, bits)
    if with_dq:
        ds_offset = lay.ds + (it & 1) * lay.ds_bytes
        store_ds(smem, ds_offset, ds_ops, wi)
        hopper.fence_proxy_async()                       # generic stores -> wgmma (async proxy) reads
    dv = rs_gemm(atom_kv, dv, p_ops, mnmajor_desc(base, do_off, panel_bytes))
    if with_dq:
        ty.barrier_sync(DS_BARRIER, CONSUMER_THREADS)    # both consumers' dS^T rows are in place
        if cfg.dq_order == "early":
            dq = dq_product(smem, lay, cfg, base, ds_offset, wi)
    dk = dk_product(cfg, base, dk, ds_ops, ds_offset, wi, q_off)
    if cfg.dk_smem:
        ds_ops = []                                      # dK reads dS^T from shared memory
    if with_dq and cfg.dq_order == "late":
        dq = dq_product(smem, lay, cfg, base, ds_offset, wi)
    if with_dq and cfg.dq_order == "early":
        dv, dq, p_ops = hopper.wgmma_wait(1, dv, dq, p_ops)
        release(smem, lay.do_empty, stage, leader)       # dP^T and dV have read this dO stage
        accumulate_dq(c, dq, it, hq, m0)                 # overlaps the dK product
        dk, ds_ops = hopper.wgmma_wait(0, dk, ds_ops)
        release(smem, lay.q_empty, stage, leader)        # S^T and dK have read this Q stage
    else:
        if with_dq and cfg.dq_order == "late":
            dv, dk, p_ops, ds_ops = hopper.wgmma_wait(1, dv, dk, p_ops, ds_ops)
        else:
            dv, dk, p_ops, ds_ops = hopper.wgmma_wait(0, dv, dk, p_ops, ds_ops)
        release(smem, lay.do_empty, stage, leader)
        release(smem, lay.q_empty, stage, leader)
        if with_dq:
            if cfg.dq_order == "serial":
                dq = dq_product(smem, lay, cfg, base, ds_offset, wi)
            dq = hopper.wgmma_wait(0, dq)
            accumulate_dq(c, dq, it, hq, m0)
    return dv, dk


@ty.func
def consumer(smem, lay, prob, cfg, wg, grads):
    """Consumer warpgroup wg (``grads``: the ``Gradients``): dK and dV of its 64 keys, dQ partials."""
    hopper.setmaxnreg(REGISTER_SPLIT[1], increase=True)
    wi = wg - 1
    n0 = ty.block_idx(0) * BLOCK_N
    hk = ty.block_idx(1)
    b = ty.block_idx(2)
    base = ty.address(smem)
    scale_log2 = prob.scale * LOG2E
    c = Consumer(smem, base, lay, prob, cfg, (n0, b, wi), scale_log2, grads.dq_accum)
    dv = zeros(cfg.head_dim)
    dk = zeros(cfg.head_dim)
    hopper.mbarrier_wait(bar_at(smem, lay.kv_full), 0, "kv_full")
    if prob.varlen is not None:  # K and V rows past the document's end: zeros before any product
        prob.varlen.zero_key_tail(smem, lay, prob, cfg, n0, wi)
    m_first, per_head, total = work_range(prob, n0, cfg.block_m)
    for it in range(total):
        hq, m0 = iteration(prob, hk, m_first, per_head, it, cfg.block_m)
        dv, dk = consumer_step(c, it, hq, m0, dv, dk)
    row0 = n0 + KEYS_PER_CONSUMER * wi
    dk_strides, dv_strides = grads.dk_strides, grads.dv_strides
    dk_base = ty.cast(b, ty.i64) * dk_strides[0] + ty.cast(hk, ty.i64) * dk_strides[1]
    dv_base = ty.cast(b, ty.i64) * dv_strides[0] + ty.cast(hk, ty.i64) * dv_strides[1]
    if prob.varlen is not None:
        dk_base = dk_base + ty.cast(prob.k_start, ty.i64) * dk_strides[2]
        dv_base = dv_base + ty.cast(prob.k_start, ty.i64) * dv_strides[2]
    store_rows(dk * prob.scale, grads.dk, row0, prob.n_k, dk_base, dk_strides[2], 0, cfg.dtype)
    store_rows(dv, grads.dv, row0, prob.n_k, dv_base, dv_strides[2], 0, cfg.dtype)


def smem_bytes(HEAD_DIM=64, BLOCK_M=128, STAGES=2, DQ="tma", **_):
    return Smem(HEAD_DIM, BLOCK_M, STAGES, DQ).total


@ty.kernel(threads=384, min_blocks_per_sm=1, noalias=True)
def attention_bwd_sm90(
    tm_q: ty.tensormap, tm_k: ty.tensormap, tm_v: ty.tensormap, tm_do: ty.tensormap,
    tm_lse: ty.tensormap, tm_delta: ty.tensormap, tm_dq: ty.tensormap,
    dk: ty.ptr(ty.i16), dv: ty.ptr(ty.i16), dq_accum: ty.ptr(ty.f32), mask_bits: ty.ptr(ty.u32),
    n_q: ty.i32, n_k: ty.i32, n_heads: ty.i32, group: ty.i32, n_pad: ty.i32, scale: ty.f32, causal: ty.i32,
    dk_stride_b: ty.i64, dk_stride_h: ty.i64, dk_stride_n: ty.i64,
    dv_stride_b: ty.i64, dv_stride_h: ty.i64, dv_stride_n: ty.i64,
    mb_stride_b: ty.i64, mb_stride_h: ty.i64, mb_stride_row: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_M: ty.constexpr = 128,
    STAGES: ty.constexpr = 2, HAS_MASK: ty.constexpr = False, DQ: ty.constexpr = "tma",
    DQ_ORDER: ty.constexpr = "early", DK_SMEM: ty.constexpr = False,
    Q_ORDER: ty.constexpr = ("n", "h", "b"), KV_ORDER: ty.constexpr = ("n", "h", "b"),
):
    """Grid (key blocks of 128, key/value heads, batch). ``n_heads`` counts query heads, ``group``
    query heads per key/value head; ``n_pad`` is the padded query length of the L/delta buffers
    (a multiple of BLOCK_M and of 64). ``tm_dq`` (DQ="tma") and ``dq_accum`` (DQ="atomic") are the
    fp32 dQ accumulator; ``mask_bits`` the user mask packed by ``attention_bwd_pack_mask`` with keys
    on the rows (HAS_MASK)."""
    check_config(HEAD_DIM, BLOCK_M, STAGES, DQ, DQ_ORDER)
    cfg = Config(DTYPE, HEAD_DIM, BLOCK_M, STAGES, has_mask=HAS_MASK, dq=DQ, dq_order=DQ_ORDER, dk_smem=DK_SMEM,
                 q_order=Q_ORDER, kv_order=KV_ORDER)
    lay = Smem(HEAD_DIM, BLOCK_M, STAGES, DQ)
    smem = ty.dynamic_shared(ty.u8, lay.total, align=1024)
    prob = Problem(Sizes(n_q, n_k, n_heads, group, n_pad), scale, causal,
                   (mask_bits, (mb_stride_b, mb_stride_h, mb_stride_row)), BLOCK_M)
    init_barriers(smem, lay, STAGES)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, lay, prob, cfg, TensorMaps(tm_q, tm_k, tm_v, tm_do, tm_lse, tm_delta, tm_dq))
    else:
        consumer(smem, lay, prob, cfg, wg, Gradients(dk, dv, dq_accum, (dk_stride_b, dk_stride_h, dk_stride_n),
                                                     (dv_stride_b, dv_stride_h, dv_stride_n)))
