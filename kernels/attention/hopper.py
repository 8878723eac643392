"""Warp-specialized attention forward for Hopper (sm_90a), head dim 64.

Computes O = softmax(scale * Q K^T + mask) V per (batch, head), and optionally the row
log-sum-exp, without ever writing scores or probabilities to global memory.

Algorithm (one CTA per (128-query block, head, batch); 384 threads):

1. Warpgroup 0 is the producer. It gives registers back (``setmaxnreg.dec``), loads the Q tile
   once with TMA and streams K and V tiles of ``BLOCK_N`` keys through a ring of ``STAGES``
   shared-memory stages (128-byte swizzle). Each stage has a full and an empty mbarrier for K
   and for V; a stage is refilled once both consumers have released it.
2. Warpgroups 1 and 2 are consumers, 64 query rows each (``setmaxnreg.inc``). For key tile j:
   wait for K_j, take the tensor-core turn (named barrier), issue S_j = Q K_j^T (SS wgmma) and
   O += P_{j-1} V_{j-1} (RS wgmma), hand the turn to the other consumer, wait for S_j only,
   release K_j, mask and run the online softmax update on S_j (exp2 of pre-scaled scores,
   selects), wait for the PV product, release V_{j-1}, rescale O and convert S_j's registers in
   the same lanes into the bf16/fp16 A operand P_j of the next PV product.
3. After the last tile: O += P V, normalize by the row sums, store O (and LSE) for the rows that
   exist.

Constraints: D = 64; bf16 or fp16; Q/K/V as (B, H, N, D) views whose last dim is contiguous and
whose other strides are multiples of 16 bytes. Lengths, heads, batch, scale, causal and the
optional Boolean mask are run-time data; BLOCK_N, STAGES and the dtype are compile-time.

Run it: ``tylopy dump kernels/attention/hopper.py`` (PTX + ptxas report, no GPU needed);
``python -c "import torch, tylopy; ..."`` with ``tylopy.attention(q, k, v)`` on an H100/H200;
check it with ``pytest -m gpu tests/test_attention_hopper_gpu.py``.
"""
import tylopy as ty
from tylopy import hopper

HEAD_DIM = 64
ROWS_PER_CONSUMER = 64
ROW_BYTES = HEAD_DIM * 2           # one 64-element bf16 row is one 128-byte swizzle row
NEG_INF = float("-inf")
LOG2E = 1.4426950408889634

# Consumer k takes its tensor-core turn on named barrier k (0 is __syncthreads): 128 threads of
# consumer k sync there and the 128 of the consumer before it arrive.
CONSUMER_THREADS = 256


class Smem:
    """Byte offsets in the dynamic shared memory (every tile 1024-byte aligned for SW128)."""

    def __init__(self, block_n, stages, consumers):
        self.q = 0
        self.q_bytes = 64 * consumers * ROW_BYTES
        self.tile_bytes = block_n * ROW_BYTES
        self.k = self.q + self.q_bytes
        self.v = self.k + stages * self.tile_bytes
        bars = self.v + stages * self.tile_bytes
        self.q_full = bars
        self.q_empty = bars + 8
        self.k_full = bars + 16
        self.k_empty = self.k_full + 8 * stages
        self.v_full = self.k_empty + 8 * stages
        self.v_empty = self.v_full + 8 * stages
        self.total = self.v_empty + 8 * stages


@ty.func
def bar_at(smem, offset):
    return ty.ptr_cast(smem + offset, ty.u64)


@ty.func
def init_barriers(smem, lay, stages, consumers):
    if ty.thread_idx() == 0:
        hopper.mbarrier_init(bar_at(smem, lay.q_full), 1)
        hopper.mbarrier_init(bar_at(smem, lay.q_empty), consumers)
        for s in range(stages):
            hopper.mbarrier_init(bar_at(smem, lay.k_full + 8 * s), 1)
            hopper.mbarrier_init(bar_at(smem, lay.v_full + 8 * s), 1)
            hopper.mbarrier_init(bar_at(smem, lay.k_empty + 8 * s), consumers)
            hopper.mbarrier_init(bar_at(smem, lay.v_empty + 8 * s), consumers)
        hopper.fence_mbarrier_init()
        hopper.fence_proxy_async()
    ty.syncthreads()


@ty.func
def tma_coords(order, n, h, b):
    """TMA coordinates after the D dimension, in the order the host sorted the strides."""
    pos = {"n": n, "h": h, "b": b}
    return tuple(pos[x] for x in order)


# Registers per thread after setmaxnreg, (producer, consumer): the whole pool of 1 CTA per SM
# (65536 / threads, rounded down to 8) is redistributed, e.g. 128*24 + 256*240 = 384*168.
REGISTER_SPLIT = {2: (24, 240), 3: (32, 160)}


class Problem:
    """The run-time sizes, strides and pointers every role needs (a plain holder of IR values)."""

    def __init__(self, n_q, n_k, n_heads, n_batch, scale, causal, out, lse_ptr, mask, o_strides, m_strides,
                 block_m, block_n):
        self.n_q, self.n_k, self.n_heads, self.n_batch = n_q, n_k, n_heads, n_batch
        self.scale, self.causal = scale, causal
        self.out, self.lse_ptr, self.mask = out, lse_ptr, mask
        self.o_strides, self.m_strides = o_strides, m_strides
        self.block_m, self.block_n = block_m, block_n
        self.num_m = (n_q + (block_m - 1)) // block_m
        self.total = self.num_m * n_heads * n_batch


@ty.func
def tiles_of_this_cta(prob, persistent):
    """How many work tiles this CTA loops over (upper bound; ``work_tile`` says which are real)."""
    if persistent:
        return (prob.total + ty.grid_dim(0) - 1) // ty.grid_dim(0)
    return 1


@ty.func
def next_tile(prob, k, persistent):
    """(valid, first query row, head, batch, key tiles) of this CTA's k-th work tile.

    One tile per CTA: the grid is (query blocks, heads, batch) and the block indices are the
    coordinates (the last query block first: under causal masking it carries the most key tiles;
    the hardware's block scheduler balances the rest). Persistent: CTA i takes positions i,
    2G-1-i, 2G+i, ... of the sequence ``work_tile`` decodes.
    """
    if persistent:
        pos = tile_position(k)
        m0, h, b, n_tiles = work_tile(prob, pos)
        return pos < prob.total, m0, h, b, n_tiles
    m0 = (ty.grid_dim(0) - 1 - ty.block_idx(0)) * prob.block_m
    kv_end = prob.n_k
    if prob.causal != 0:
        kv_end = ty.minimum(prob.n_k, m0 + prob.block_m)
    return ty.cast(1, ty.i1), m0, ty.block_idx(1), ty.block_idx(2), (kv_end + (prob.block_n - 1)) // prob.block_n


@ty.func
def tile_position(k):
    """The k-th work tile of this CTA: i, 2G-1-i, 2G+i, ... so heavy and light causal tiles alternate."""
    g = ty.grid_dim(0)
    i = ty.block_idx(0)
    return k * g + ty.select((k & 1) == 0, i, g - 1 - i)


@ty.func
def work_tile(prob, pos):
    """Tile position -> (first query row, head, batch, key tiles).

    The query blocks of one (batch, head) are neighbours, so K and V are reused from L2, and the
    last block comes first: under causal masking it carries the most key tiles.
    """
    m_block = prob.num_m - 1 - pos % prob.num_m
    hb = pos // prob.num_m
    m0 = m_block * prob.block_m
    kv_end = prob.n_k
    if prob.causal != 0:
        kv_end = ty.minimum(prob.n_k, m0 + prob.block_m)
    return m0, hb % prob.n_heads, hb // prob.n_heads, (kv_end + (prob.block_n - 1)) // prob.block_n


@ty.func
def load_tile(smem, lay, tmap, offset, full, empty, it, row, h, b, stages, order):
    """Wait until the ring stage of iteration ``it`` is free, then TMA one key tile into it."""
    stage, phase = stage_of(it, stages)
    hopper.mbarrier_wait(bar_at(smem, empty + 8 * stage), phase ^ 1, "stage empty", stage)
    full_bar = bar_at(smem, full + 8 * stage)
    hopper.mbarrier_arrive_expect_tx(full_bar, lay.tile_bytes)
    hopper.tma_load(smem + (offset + stage * lay.tile_bytes), tmap, full_bar, 0, *tma_coords(order, row, h, b))


@ty.func
def producer(smem, lay, prob, tm_q, tm_k, tm_v, persistent, stages, order, consumers):
    hopper.setmaxnreg(REGISTER_SPLIT[consumers][0], increase=False)
    warp = ty.warp_idx() & 3
    if warp == 0:
        if ty.elect_one():
            hopper.prefetch_tensormap(tm_k)
            hopper.prefetch_tensormap(tm_v)
            it = 0
            for k in range(tiles_of_this_cta(prob, persistent)):
                valid, m0, h, b, n_tiles = next_tile(prob, k, persistent)
                if valid:
                    # Q has one buffer: the next tile's Q lands while the consumers finish this one.
                    hopper.mbarrier_wait(bar_at(smem, lay.q_empty), (k & 1) ^ 1, "q_empty")
                    q_full = bar_at(smem, lay.q_full)
                    hopper.mbarrier_arrive_expect_tx(q_full, lay.q_bytes)
                    hopper.tma_load(smem + lay.q, tm_q, q_full, 0, *tma_coords(order, m0, h, b))
                    for j in range(n_tiles):
                        row = j * prob.block_n
                        load_tile(smem, lay, tm_k, lay.k, lay.k_full, lay.k_empty, it + j, row, h, b, stages, order)
                        load_tile(smem, lay, tm_v, lay.v, lay.v_full, lay.v_empty, it + j, row, h, b, stages, order)
                    it = it + n_tiles


@ty.func
def score_gemm(atom, q_desc, k_desc):
    """S = Q K^T over D in k16 steps; K-major descriptors advance 32 bytes (2 in desc units) a step."""
    hopper.wgmma_fence()
    s = None
    for k in range(HEAD_DIM // 16):
        s = hopper.wgmma(atom, s, q_desc + 2 * k, k_desc + 2 * k)
    hopper.wgmma_commit()
    return s


@ty.func
def pv_gemm(atom, o, p, v_desc):
    """O += P V: P in registers (RS), V MN-major (trans-b); a k16 step is 16 rows = 2048 bytes."""
    hopper.wgmma_fence()
    for kk in range(len(p)):
        o = hopper.wgmma(atom, o, p[kk], v_desc + 128 * kk, trans_b=1)
    hopper.wgmma_commit()
    return o


@ty.func
def mask_scores(s, row0, col0, n_k, causal, mask_args, has_mask):
    """-inf where a key is past the end, in the future (causal), or masked off by the user."""
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    slots = s.layout.row_slots
    first = [slots.index(k) for k in range(max(slots) + 1)]
    rows = [row0 + s.layout.coord(warp, lane, i)[0] for i in first]  # this thread's two rows
    if has_mask:
        mask, n_q, m_base, m_stride_q, m_stride_k = mask_args
        row_ptrs = [mask + (m_base + ty.cast(r, ty.i64) * m_stride_q) for r in rows]
    vals = []
    for i in range(len(s)):
        row = rows[slots[i]]
        col = col0 + s.layout.coord(warp, lane, i)[1]
        ok = (col < n_k) & ((causal == 0) | (col <= row))
        if has_mask:
            flag = ty.load(row_ptrs[slots[i]] + ty.cast(col, ty.i64) * m_stride_k, mask=ok & (row < n_q))
            ok = ok & (flag != 0)
        vals.append(ty.select(ok, s.values[i], NEG_INF))
    return s.with_data(vals)


@ty.func
def maybe_mask(s, row0, col0, n_k, causal, mask_args, has_mask, block_n):
    """Mask only the tiles that need it: the ragged last tile and the causal diagonal."""
    if has_mask:
        s = mask_scores(s, row0, col0, n_k, causal, mask_args, has_mask)
    else:
        needs_mask = (col0 + block_n > n_k) | ((causal != 0) & (col0 + block_n - 1 > row0))
        if needs_mask:
            s = mask_scores(s, row0, col0, n_k, causal, mask_args, has_mask)
    return s


@ty.func
def store_output(o, lse, out, lse_ptr, row0, n_q, o_base, o_stride_n, lse_base, dtype, return_lse, scale):
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    vals = o.values
    out_words = ty.ptr_cast(out, ty.b32)
    for i in range(0, len(vals), 2):
        r, c = o.layout.coord(warp, lane, i)
        row = row0 + r
        if row < n_q:
            word = ty.pack2(vals[i], vals[i + 1], dtype)
            offset = o_base + ty.cast(row, ty.i64) * o_stride_n + ty.cast(c, ty.i64)
            out_words[offset >> 1] = word
    if return_lse:
        if (lane & 3) == 0:
            for slot in range(len(lse)):
                r, c = lse.layout.coord(warp, lane, slot)
                row = row0 + r
                if row < n_q:
                    lse_ptr[lse_base + ty.cast(row, ty.i64)] = lse.values[slot]


class Turn:
    """Round robin on the tensor cores: consumer k syncs on named barrier k and passes to k+1."""

    def __init__(self, wg, consumers):
        self.mine = wg
        self.next = wg % consumers + 1


@ty.func
def stage_of(j, stages):
    return j % stages, (j // stages) & 1


@ty.func
def scores_for_tile(smem, lay, atom_s, q_desc, base, j, stages, turn):
    """Wait for K_j, take the turn and issue S_j = Q K_j^T (the turn is passed on by the caller)."""
    stage, phase = stage_of(j, stages)
    hopper.mbarrier_wait(bar_at(smem, lay.k_full + 8 * stage), phase, "k_full", stage)
    ty.barrier_sync(turn.mine, CONSUMER_THREADS)
    k_desc = hopper.smem_descriptor(base + ty.cast(lay.k + stage * lay.tile_bytes, ty.u32))
    return score_gemm(atom_s, q_desc, k_desc)


@ty.func
def pv_for_tile(smem, lay, atom_o, o, p, base, j, stages):
    """Wait for V_j and issue O += P_j V_j."""
    stage, phase = stage_of(j, stages)
    hopper.mbarrier_wait(bar_at(smem, lay.v_full + 8 * stage), phase, "v_full", stage)
    v_desc = hopper.smem_descriptor(base + ty.cast(lay.v + stage * lay.tile_bytes, ty.u32))
    return pv_gemm(atom_o, o, p, v_desc)


@ty.func
def release(smem, offset, j, stages, leader):
    """One thread per consumer arrives on the stage's empty barrier (count = consumers)."""
    stage, phase = stage_of(j, stages)
    if leader:
        hopper.mbarrier_arrive(bar_at(smem, offset + 8 * stage))


@ty.func
def pass_dead_tiles(smem, lay, first, n_tiles, stages, turn, leader):
    """Tiles wholly in this consumer's causal future: no math, but every stage and turn protocol
    step the other consumers and the producer count on."""
    for j in range(first, n_tiles):
        stage, phase = stage_of(j, stages)
        hopper.mbarrier_wait(bar_at(smem, lay.k_full + 8 * stage), phase, "k_full (dead tile)", stage)
        ty.barrier_sync(turn.mine, CONSUMER_THREADS)
        ty.barrier_arrive(turn.next, CONSUMER_THREADS)
        release(smem, lay.k_empty, j, stages, leader)
        hopper.mbarrier_wait(bar_at(smem, lay.v_full + 8 * stage), phase, "v_full (dead tile)", stage)
        release(smem, lay.v_empty, j, stages, leader)


@ty.func
def consumer(smem, lay, prob, wg, persistent, dtype, block_n, stages, has_mask, return_lse, consumers, exponent):
    hopper.setmaxnreg(REGISTER_SPLIT[consumers][1], increase=True)
    turn = Turn(wg, consumers)
    if wg == 1:
        ty.barrier_arrive(1, CONSUMER_THREADS)  # consumer 1 takes the first turn
    it = 0
    for k in range(tiles_of_this_cta(prob, persistent)):
        valid, m0, h, b, n_tiles = next_tile(prob, k, persistent)
        if valid:
            consumer_tile(smem, lay, prob, wg, turn, k, it, m0, h, b, n_tiles, dtype, block_n, stages, has_mask,
                          return_lse, exponent)
            it = it + n_tiles


@ty.func
def consumer_tile(smem, lay, prob, wg, turn, k, it, m0, h, b, n_tiles, dtype, block_n, stages, has_mask, return_lse,
                  exponent):
    """One work tile for one consumer: 64 query rows against every key tile of the tile's range.

    ``it`` is the ring iteration of this tile's first key tile (the ring runs on across tiles).
    """
    atom_s = hopper.WgmmaAtom(block_n, dtype, "ss")
    atom_o = hopper.WgmmaAtom(HEAD_DIM, dtype, "rs")
    n_k, causal, scale = prob.n_k, prob.causal, prob.scale
    row0 = m0 + (wg - 1) * ROWS_PER_CONSUMER
    base = ty.address(smem)
    q_desc = hopper.smem_descriptor(base + ty.cast(lay.q + (wg - 1) * ROWS_PER_CONSUMER * ROW_BYTES, ty.u32))
    leader = (ty.thread_idx() & 127) == 0
    m_base = ty.cast(b, ty.i64) * prob.m_strides[0] + ty.cast(h, ty.i64) * prob.m_strides[1]
    mask_args = (prob.mask, prob.n_q, m_base, prob.m_strides[2], prob.m_strides[3])
    # Under causal masking this consumer's last useful tile ends at its own last row.
    my_tiles = n_tiles
    if causal != 0:
        my_tiles = ty.minimum(n_tiles, (ty.minimum(n_k, row0 + ROWS_PER_CONSUMER) + (block_n - 1)) // block_n)
    hopper.mbarrier_wait(bar_at(smem, lay.q_full), k & 1, "q_full")

    # Tile 0: scores and softmax only; its PV product is issued with tile 1's scores.
    s = scores_for_tile(smem, lay, atom_s, q_desc, base, it, stages, turn)
    ty.barrier_arrive(turn.next, CONSUMER_THREADS)
    s = hopper.wgmma_wait(0, s)
    release(smem, lay.k_empty, it, stages, leader)
    s = maybe_mask(s, row0, 0, n_k, causal, mask_args, has_mask, block_n)
    upd = ty.softmax_update(ty.SoftmaxState(s, partial_sum=True), s, scale, exponent=exponent)
    state = upd.state
    p = [ty.pack_operand_a(atom_o, upd.weights, kk) for kk in range(block_n // 16)]
    o = ty.Fragment(tuple(ty.cast(0.0, ty.f32) for _ in range(HEAD_DIM // 2)), ty.WARPGROUP, ty.wgmma_acc(HEAD_DIM))

    # Tile j: S_j and O += P_{j-1} V_{j-1} in flight together; softmax of S_j overlaps the PV product.
    for j in range(1, my_tiles):
        s = scores_for_tile(smem, lay, atom_s, q_desc, base, it + j, stages, turn)
        o = pv_for_tile(smem, lay, atom_o, o, p, base, it + j - 1, stages)
        ty.barrier_arrive(turn.next, CONSUMER_THREADS)
        s, o = hopper.wgmma_wait(1, s, o)
        release(smem, lay.k_empty, it + j, stages, leader)
        s = maybe_mask(s, row0, j * block_n, n_k, causal, mask_args, has_mask, block_n)
        upd = ty.softmax_update(state, s, scale, exponent=exponent)
        state = upd.state
        o, p = hopper.wgmma_wait(0, o, p)
        release(smem, lay.v_empty, it + j - 1, stages, leader)
        o = o * upd.rescale
        p = [ty.pack_operand_a(atom_o, upd.weights, kk) for kk in range(block_n // 16)]

    if leader:  # every S GEMM of this tile has completed: the producer may load the next Q
        hopper.mbarrier_arrive(bar_at(smem, lay.q_empty))
    o = pv_for_tile(smem, lay, atom_o, o, p, base, it + my_tiles - 1, stages)
    o = hopper.wgmma_wait(0, o)
    release(smem, lay.v_empty, it + my_tiles - 1, stages, leader)
    pass_dead_tiles(smem, lay, it + my_tiles, it + n_tiles, stages, turn, leader)
    o = ty.softmax_normalize(o, state)
    lse = ty.softmax_lse(state, scale) if return_lse else None
    o_base = ty.cast(b, ty.i64) * prob.o_strides[0] + ty.cast(h, ty.i64) * prob.o_strides[1]
    lse_base = (ty.cast(b, ty.i64) * ty.cast(prob.n_heads, ty.i64) + ty.cast(h, ty.i64)) * ty.cast(prob.n_q, ty.i64)
    store_output(o, lse, prob.out, prob.lse_ptr, row0, prob.n_q, o_base, prob.o_strides[2], lse_base, dtype,
                 return_lse, scale)


def _threads(CONSUMERS=2, **_):
    return 128 * (CONSUMERS + 1)


def _smem_bytes(BLOCK_N, STAGES, CONSUMERS):
    return Smem(BLOCK_N, STAGES, CONSUMERS).total


@ty.kernel(threads=_threads, min_blocks_per_sm=1, noalias=True)
def attention_fwd_sm90(
    tm_q: ty.tensormap, tm_k: ty.tensormap, tm_v: ty.tensormap,
    out: ty.ptr(ty.i16), lse_ptr: ty.ptr(ty.f32), mask: ty.ptr(ty.u8),
    n_q: ty.i32, n_k: ty.i32, n_heads: ty.i32, n_batch: ty.i32, scale: ty.f32, causal: ty.i32,
    o_stride_b: ty.i64, o_stride_h: ty.i64, o_stride_n: ty.i64,
    m_stride_b: ty.i64, m_stride_h: ty.i64, m_stride_q: ty.i64, m_stride_k: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, BLOCK_N: ty.constexpr = 128, STAGES: ty.constexpr = 2,
    CONSUMERS: ty.constexpr = 3, HAS_MASK: ty.constexpr = False, RETURN_LSE: ty.constexpr = False,
    COORD_ORDER: ty.constexpr = ("n", "h", "b"), PERSISTENT: ty.constexpr = False, EXPONENT: ty.constexpr = "exact",
):
    """One CTA works through tiles (query block, head, batch): one per CTA when the grid covers
    them all, or a persistent loop when the grid is the number of SMs."""
    lay = Smem(BLOCK_N, STAGES, CONSUMERS)
    smem = ty.dynamic_shared(ty.u8, lay.total, align=1024)
    prob = Problem(n_q, n_k, n_heads, n_batch, scale, causal, out, lse_ptr, mask,
                   (o_stride_b, o_stride_h, o_stride_n), (m_stride_b, m_stride_h, m_stride_q, m_stride_k),
                   ROWS_PER_CONSUMER * CONSUMERS, BLOCK_N)
    init_barriers(smem, lay, STAGES, CONSUMERS)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, lay, prob, tm_q, tm_k, tm_v, PERSISTENT, STAGES, COORD_ORDER, CONSUMERS)
    else:
        consumer(smem, lay, prob, wg, PERSISTENT, DTYPE, BLOCK_N, STAGES, HAS_MASK, RETURN_LSE, CONSUMERS, EXPONENT)
