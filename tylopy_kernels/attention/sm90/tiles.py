"""Shared pieces of the Hopper attention forward: the compile-time plan (schedule and shared-memory
layout), the run-time problem, and the order in which CTAs take work tiles."""
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import tylopy as ty
from tylopy import hopper

ROW_BYTES = 128        # one 64-element 16-bit row of a column chunk: one 128-byte swizzle row
MAX_SMEM = 232448      # H100/H200 opt-in dynamic shared memory per block
# Registers per thread after setmaxnreg, (producer, consumer): the whole pool of 1 CTA per SM
# (65536 / threads, rounded down to 8) is redistributed, e.g. 128*24 + 256*240 = 384*168.
REGISTER_SPLIT = {2: (24, 240), 3: (32, 160), 4: (24, 112)}
# Consumer k's own 128 threads sync on named barrier CONSUMER_BARRIER + k (5..8): the O staging of
# the TMA store, a skipped work tile. Barriers 1..4 are the tensor-core turns.
CONSUMER_BARRIER = 4


class Plan:
    """The compile-time schedule and the shared-memory layout (byte offsets, every tile 1024-byte
    aligned for SW128). A tile of R rows x D columns is D/64 column chunks of R x 128 bytes."""

    def __init__(self, head_dim, block_n, stages, consumers, tma_store):
        if head_dim not in (64, 128):
            raise ValueError(f"HEAD_DIM expects 64 or 128, but got {head_dim}")
        if block_n % 16 or not 16 <= block_n <= 256:
            raise ValueError(f"BLOCK_N expects a multiple of 16 in 16..256, but got {block_n}")
        if consumers not in REGISTER_SPLIT:
            raise ValueError(f"CONSUMERS expects one of {sorted(REGISTER_SPLIT)}, but got {consumers}")
        self.head_dim, self.block_n, self.stages, self.consumers = head_dim, block_n, stages, consumers
        self.chunks = head_dim // 64
        self.block_m = 64 * consumers
        self.q_chunk = self.block_m * ROW_BYTES
        self.kv_chunk = block_n * ROW_BYTES
        self.q_bytes = self.q_chunk * self.chunks
        self.tile_bytes = self.kv_chunk * self.chunks
        self.o_chunk = 64 * ROW_BYTES                      # one consumer's 64 rows
        self.q = 0
        self.k = self.q + self.q_bytes
        self.v = self.k + stages * self.tile_bytes
        self.o = self.v + stages * self.tile_bytes         # O staging for the TMA store
        bars = self.o + (consumers * self.o_chunk * self.chunks if tma_store else 0)
        place_barriers(self, bars, stages, "fewer STAGES, a smaller BLOCK_N, or TMA_STORE=False")


def place_barriers(plan, bars, stages, remedy):
    """The mbarriers from byte ``bars`` on (Q full/empty, then a full and an empty barrier per stage
    for K and for V), ``plan.total``, and the shared-memory limit check (``remedy``: what to change)."""
    plan.q_full = bars
    plan.q_empty = bars + 8
    plan.k_full = bars + 16
    plan.k_empty = plan.k_full + 8 * stages
    plan.v_full = plan.k_empty + 8 * stages
    plan.v_empty = plan.v_full + 8 * stages
    plan.k_ring = hopper.Ring(plan.k_full, plan.k_empty, stages)   # the K and V tiles' rings
    plan.v_ring = hopper.Ring(plan.v_full, plan.v_empty, stages)
    plan.total = plan.v_empty + 8 * stages
    if plan.total > MAX_SMEM:
        raise ValueError(f"this schedule needs {plan.total} bytes of shared memory, but a block has at most "
                         f"{MAX_SMEM} ({remedy})")


@dataclass(eq=False)   # compared and hashed by identity, as the trace treats a plain holder
class Schedule:
    """The compile-time options the consumers read (``attention_fwd_sm90``'s constexprs, by name)."""

    dtype: Any
    has_mask: bool = False
    return_lse: bool = False
    persistent: bool = False
    tile_order: str = "heads"
    coord_order: tuple = ("n", "h", "b")
    out_order: Optional[tuple] = None      # None: the coordinate order
    exponent: str = "ffma"
    threshold: float = 8.0
    split_s: bool = False
    pv_wait: str = "pinned"
    poly: int = 0
    tma_store: bool = False
    defer_epilogue: bool = False
    early_sums: bool = True

    def __post_init__(self):
        if self.pv_wait not in ("pinned", "free"):
            raise ValueError(f"PV_WAIT expects 'pinned' or 'free', but got {self.pv_wait!r}")
        if self.tile_order not in ("heads", "lpt"):
            raise ValueError(f"ORDER expects 'heads' or 'lpt', but got {self.tile_order!r}")
        if self.out_order is None:
            self.out_order = self.coord_order


bar_at = hopper.barrier_at  # the mbarrier at a shared-memory offset (ty.hopper's ring helpers)


@ty.func
def tma_coords(order, n, h, b):
    """TMA coordinates after the D dimension, in the order the host sorted the strides."""
    pos = {"n": n, "h": h, "b": b}
    return tuple(pos[x] for x in order)


class Sizes(NamedTuple):
    """A problem's run-time sizes: queries and keys per sequence, query heads, batch, query heads per
    key/value head, the K/V batch stride flag (0: one K/V batch shared by all) and log2 of the
    "lpt" order's head group."""

    n_q: Any
    n_k: Any
    n_heads: Any
    n_batch: Any
    kv_group: Any
    kv_batch: Any = 1
    head_group_log2: Any = 0


class Output(NamedTuple):
    """Where a problem's results go: O's pointer, the LSE's (or a placeholder), O's tensor map (for
    TMA stores; any map otherwise) and O's (batch, head, row) strides."""

    out: Any
    lse_ptr: Any
    tm_o: Any
    strides: tuple


class WorkTile(NamedTuple):
    """One work tile as a consumer takes it: ``k``, how many tiles the CTA took before it (the Q
    buffer's phase), ``it``, the ring iteration of its first key tile (the ring runs on across
    tiles), and ``next_tile``'s first query row, head, batch and key tile count."""

    k: Any
    it: Any
    m0: Any
    h: Any
    b: Any
    n_tiles: Any


class Problem:
    """The run-time sizes, strides and pointers every role needs (a plain holder of IR values):
    ``Sizes``, the scale, causal (0/1), an ``Output``, the Boolean mask's pointer and its (batch,
    head, query, key) strides, and the tile sizes."""

    def __init__(self, sizes: Sizes, scale, causal, output: Output, mask, block_m, block_n):
        mask_ptr, m_strides = mask
        self.n_q, self.n_k, self.n_heads, self.n_batch = sizes.n_q, sizes.n_k, sizes.n_heads, sizes.n_batch
        self.kv_group, self.kv_batch, self.head_group_log2 = sizes.kv_group, sizes.kv_batch, sizes.head_group_log2
        self.scale, self.causal = scale, causal
        self.out, self.lse_ptr, self.mask, self.tm_o = output.out, output.lse_ptr, mask_ptr, output.tm_o
        self.o_strides, self.m_strides = output.strides, m_strides
        self.block_m, self.block_n = block_m, block_n
        self.num_m = (sizes.n_q + (block_m - 1)) // block_m
        self.total = self.num_m * sizes.n_heads * sizes.n_batch
        # Packed batches (``varlen_tiles``): the per-document view a tile works in. Dense problems keep
        # these Python zeros, so ``shift`` emits nothing for them.
        self.varlen = None
        # Variants (``variant_tiles``): which key tiles a query tile visits and where they lie. Dense
        # problems keep None, so ``next_tile`` and ``key_row`` emit what they did before.
        self.variant = None
        self.q_start = 0   # first packed row of the tile's document (queries, keys)
        self.k_start = 0
        self.diag = 0      # causal diagonal offset: key j takes part for query i when j <= i + diag


def shift(x, offset):
    """x + offset, or x itself for a Python 0 (the dense kernel's code stays what it was)."""
    if isinstance(offset, int) and offset == 0:
        return x
    return x + offset


def tile_problem(prob, b):
    """The problem a work tile of batch entry (document) b sees: ``prob`` itself when dense."""
    if prob.varlen is None:
        return prob
    return prob.varlen.doc(prob, b)


@ty.func
def skip_tile(smem, plan, prob, valid, k, persistent, wg):
    """Packed batches and variants, persistent loop: a work tile that is not valid (past its
    document's end, or a variant's query tile that sees no key) can come before valid ones, so it
    still turns the Q buffer's barriers once -- their parity is the loop count k -- the producer
    (``wg`` None) arriving on q_full without a load, each consumer (``wg``: its warpgroup index)
    on q_empty. Dense problems skip only at the end of the loop and emit nothing here.

    A consumer's four warps all pass their q_full wait before its leader arrives on q_empty: that
    arrival lets the producer complete q_full again (two skipped tiles in a row need nothing else),
    and a warp still short of its wait would then find the parity come round and wait a lap late,
    for ever (the hang of the persistent packed forward on the GPU)."""
    if (prob.varlen is not None or prob.variant is not None) and persistent:
        if ~valid:
            if wg is None:
                hopper.mbarrier_wait(bar_at(smem, plan.q_empty), (k & 1) ^ 1, "q_empty (skipped tile)")
                hopper.mbarrier_arrive(bar_at(smem, plan.q_full))
            else:
                hopper.mbarrier_wait(bar_at(smem, plan.q_full), k & 1, "q_full (skipped tile)")
                ty.barrier_sync(CONSUMER_BARRIER + wg, 128)
                if (ty.thread_idx() & 127) == 0:
                    hopper.mbarrier_arrive(bar_at(smem, plan.q_empty))


def batch_coord(prob, b):
    """The batch coordinate of the tensor maps and stores: a packed batch is one (total, H, D) tensor."""
    return b if prob.varlen is None else 0


@ty.func
def tiles_of_this_cta(prob, persistent):
    """How many work tiles this CTA loops over (upper bound; ``next_tile`` says which are real)."""
    if persistent:
        return (prob.total + ty.grid_dim(0) - 1) // ty.grid_dim(0)
    return 1


@ty.func
def next_tile(prob, k, persistent, order):
    """(valid, first query row, head, batch, key tiles) of this CTA's k-th work tile.

    One tile per CTA: the grid is (query blocks, heads, batch) and the block indices are the
    coordinates (the last query block first: under causal masking it carries the most key tiles;
    the hardware's block scheduler balances the rest). Persistent: CTA i takes positions i,
    2G-1-i, 2G+i, ... of the sequence ``work_tile`` decodes.
    """
    if prob.varlen is not None:
        return prob.varlen.next_tile(prob, k, persistent, order)
    if prob.variant is not None:
        return prob.variant.next_tile(prob, k, persistent, order)
    if persistent:
        pos = tile_position(k)
        m0, h, b, n_tiles = work_tile(prob, pos, order)
        return pos < prob.total, m0, h, b, n_tiles
    m0 = (ty.grid_dim(0) - 1 - ty.block_idx(0)) * prob.block_m
    return ty.cast(1, ty.i1), m0, ty.block_idx(1), ty.block_idx(2), key_tiles(prob, m0)


def key_row(prob, tp, j, m0, h, b):
    """The first key row (in the tensor map) of the j-th key tile a work tile visits: tile j itself
    for dense and packed problems, the j-th listed (or first in range) tile for a variant."""
    if prob.variant is not None:
        return prob.variant.key_row(prob, j, m0, h, b)
    return shift(j * prob.block_n, tp.k_start)


@ty.func
def key_tiles(prob, m0):
    kv_end = prob.n_k
    if prob.causal != 0:
        kv_end = ty.minimum(prob.n_k, shift(m0 + prob.block_m, prob.diag))
    return (kv_end + (prob.block_n - 1)) // prob.block_n


@ty.func
def tile_position(k):
    """The k-th work tile of this CTA: i, 2G-1-i, 2G+i, ... so heavy and light causal tiles alternate."""
    g = ty.grid_dim(0)
    i = ty.block_idx(0)
    return k * g + ty.select((k & 1) == 0, i, g - 1 - i)


@ty.func
def work_tile(prob, pos, order):
    """Tile position -> (first query row, head, batch, key tiles).

    "heads": the query blocks of one (batch, head) are neighbours (K and V reused from L2), the
    last block first. "lpt" (longest processing time first, for causal masking): (batch, head)
    pairs in groups of 2^``head_group_log2`` (dividing B H) whose K and V fit in L2; inside a group, every pair's last
    query block, then every pair's block before it, and so on.
    """
    if order == "lpt":
        per_group = prob.num_m << prob.head_group_log2
        grp = pos // per_group  # the one division, as in the "heads" order
        inside = pos - grp * per_group
        m_block = prob.num_m - 1 - (inside >> prob.head_group_log2)
        hb = (grp << prob.head_group_log2) + (inside & ((1 << prob.head_group_log2) - 1))
    else:
        m_block = prob.num_m - 1 - pos % prob.num_m
        hb = pos // prob.num_m
    m0 = m_block * prob.block_m
    return m0, hb % prob.n_heads, hb // prob.n_heads, key_tiles(prob, m0)
