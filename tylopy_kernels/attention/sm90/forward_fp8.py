"""FP8 (e4m3) attention forward for Hopper (sm_90a), head dim 64 or 128, bf16 output.

    O = v_descale * softmax(scale * q_descale * k_descale * Q K^T + mask) V

with Q, K, V e4m3 codes and the descales per (batch, K/V head). The structure is the bf16
forward's (``forward.py``, ``consumer.py``): warpgroup 0 loads Q once and streams K and V tiles
through a TMA ring; two consumer warpgroups of 64 query rows take turns on the tensor cores, issue
S_j = Q K_j^T with O += P_{j-1} V_{j-1} in flight, and run the exp2 online softmax
(``softmax.py``) on S_j while the PV product runs. What FP8 changes:

* Every wgmma is m64 nN k32 with both operands K-major (8-bit operands have no transpose). Q and
  K are K-major over D: a row of D codes is one D-byte swizzle row (128-byte swizzle at D = 128,
  64-byte at D = 64), so a Q or K tile is one column chunk and a k32 step moves the descriptor by
  32 bytes.
* PV contracts over keys, so V must be K-major over keys: the kernel reads V^T, (B, H_kv, D, N')
  codes written by the host (``fp8_launch.py``, one pass over V) with the keys of every group of
  32 permuted (below) and N' the length rounded up to 32 (zeros past N). A V^T tile of BLOCK_N
  keys is BLOCK_N / 128 column chunks of D rows x 128 bytes (128-byte swizzle); its bytes equal a
  K tile's.
* P is re-quantized in registers to e4m3 for the RS product. The weights are 2^8 times the
  softmax weights (``P_OFFSET``: headroom below e4m3's 448, so weights down to 2^-14 of the row's
  reference stay normal), which needs a reference that moves whenever a row's maximum rises
  (``RESCALE_THRESHOLD`` 0: weights <= 2^8). The row sums are taken from the f32 weights before
  rounding; the factor cancels in O / l and ``softmax.finish`` takes it out of the LSE.
* Key permutation. Thread (warp w, lane 4g + t) holds accumulator register i of S at row
  16w + g + 8((i >> 1) & 1), column 8(i >> 2) + 2t + (i & 1); FP8 wgmma's A register r, byte h
  is row 16w + g + 8(r & 1), k = 4t + h + 16(r >> 1) (docs/fp8.md). Packing the registers
  16c + 8(r >> 1) + 2(r & 1) + {0, 1, 4, 5} of S into A register r of k32 step c keeps every
  weight in its lane and puts key 8a + 2t + e of the step (a = 0..3, e = 0..1) at
  k = 16(a >> 1) + 4t + 2(a & 1) + e. V^T's columns carry the same permutation of each 32 keys,
  so the product is unchanged: no shuffles.
* The epilogue multiplies O by v_descale / l and stores bf16.
* Per key tile the tensor cores (both products) and the MUFU (one ex2 a score) need about the same
  time at FP8 rates, so the exponentials bound the kernel as much as the MMAs: ``POLY_EXP2`` = k
  computes k of every 8 on the FMA pipe (``softmax.poly_exp2``, relative error 1e-4, far below
  the e4m3 rounding of P that follows).

Constraints: D = 64 or 128; BLOCK_N 128 or 256; two or three consumers (128 or 192 query rows a
CTA); one CTA per (query block, head, batch). Q and K are (B, H, N, D) views whose last dim is contiguous and whose
other strides are multiples of 16 bytes.

Run it: ``tylopy dump tylopy_kernels/attention/sm90/forward_fp8.py`` (PTX + ptxas report);
``tylopy.attention(q8, k8, v8, q_descale=..., ...)`` on an H100/H200.
"""
import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90 import softmax as softmax
from tylopy_kernels.attention.sm90.consumer import (ROWS, TURN_THREADS, Turn, first_masked_tile, mask_scores,
                                                   pass_dead_tiles, release, rescale_o, store_direct,
                                                   store_lse, wait_pv)
from tylopy_kernels.attention.sm90.forward import init_barriers
from tylopy_kernels.attention.sm90.tiles import (REGISTER_SPLIT, Output, Problem, Sizes, bar_at, next_tile,
                                                 place_barriers, tma_coords)

ROW_BYTES = 128         # one 128-byte swizzle row of V^T: 128 keys
KEY_GROUP = 32          # keys permuted together (one k32 step of the PV product)
P_OFFSET = 8.0          # log2 of the weights' headroom factor (weights <= 2^8 < 448)


def key_slot(c):
    """Where key c (0..31) of a k32 step sits in V^T's columns and in P's A fragment."""
    a, t, e = c >> 3, (c >> 1) & 3, c & 1
    return 16 * (a >> 1) + 4 * t + 2 * (a & 1) + e


class Fp8Plan:
    """The compile-time shape and the shared-memory layout (byte offsets, tiles 1024-byte aligned).
    The field names are the bf16 ``Plan``'s, so the shared barrier and turn helpers read it."""

    def __init__(self, head_dim, block_n, stages, consumers):
        if head_dim not in (64, 128):
            raise ValueError(f"HEAD_DIM expects 64 or 128 for the FP8 forward, but got {head_dim}")
        if block_n not in (128, 256):
            raise ValueError(f"BLOCK_N expects 128 or 256 (whole 128-byte rows of V^T), but got {block_n}")
        if consumers not in (2, 3):
            raise ValueError(f"CONSUMERS expects 2 or 3 for the FP8 forward, but got {consumers}")
        self.head_dim, self.block_n, self.stages, self.consumers = head_dim, block_n, stages, consumers
        self.chunks = 1                                   # Q/K: D codes are one D-byte swizzle row
        self.qk_row = head_dim                            # bytes (and swizzle) of a Q/K row
        self.v_chunks = block_n // ROW_BYTES              # V^T: keys in 128-code column chunks
        self.block_m = ROWS * consumers
        self.q_chunk = self.block_m * head_dim
        self.kv_chunk = block_n * head_dim
        self.v_chunk = head_dim * ROW_BYTES
        self.q_bytes = self.q_chunk
        self.tile_bytes = block_n * head_dim               # K: block_n rows; V^T: D rows x block_n codes
        self.q = 0
        self.k = self.q + self.q_bytes
        self.v = self.k + stages * self.tile_bytes
        bars = self.o = self.v + stages * self.tile_bytes
        place_barriers(self, bars, stages, "fewer STAGES or a smaller BLOCK_N")


class Fp8Schedule:
    """What the shared consumer helpers read of a schedule (``store_direct``: the output dtype;
    ``wait_pv``: where the PV wait goes)."""

    def __init__(self, has_mask, return_lse, exponent, threshold, pv_wait, poly):
        self.dtype = ty.bf16
        self.has_mask, self.return_lse = has_mask, return_lse
        self.exponent, self.threshold, self.pv_wait, self.poly = exponent, threshold, pv_wait, poly


@ty.func
def producer(smem, plan, prob, tm_q, tm_k, tm_vt, coord_order):
    hopper.setmaxnreg(REGISTER_SPLIT[plan.consumers][0], increase=False)
    warp = ty.warp_idx() & 3
    if warp == 0:
        if ty.elect_one():
            hopper.prefetch_tensormap(tm_k)
            hopper.prefetch_tensormap(tm_vt)
            valid, m0, h, b, n_tiles = next_tile(prob, 0, False, "heads")
            kv_h = h // prob.kv_group
            q_full = bar_at(smem, plan.q_full)
            hopper.mbarrier_arrive_expect_tx(q_full, plan.q_bytes)
            hopper.tma_load(smem + plan.q, tm_q, q_full, 0, *tma_coords(coord_order, m0, h, b))
            for j in range(n_tiles):
                # K and V: two rings in step
                stage, k_full = hopper.ring_acquire(smem, plan.k_ring, j, plan.tile_bytes, "k stage empty")
                hopper.tma_load(smem + (plan.k + stage * plan.tile_bytes), tm_k, k_full, 0,
                                *tma_coords(coord_order, j * plan.block_n, kv_h, b))
                stage, v_full = hopper.ring_acquire(smem, plan.v_ring, j, plan.tile_bytes, "v stage empty")
                for c in range(plan.v_chunks):  # V^T (key, d, head, batch): 128 keys x D rows a box
                    hopper.tma_load(smem + (plan.v + stage * plan.tile_bytes + c * plan.v_chunk), tm_vt, v_full,
                                    j * plan.block_n + ROW_BYTES * c, 0, kv_h, b)


@ty.func
def score_gemm(plan, q_desc, k_desc):
    """S = Q K^T over D codes: k32 steps of 32 bytes (2 descriptor units) inside the D-byte rows."""
    atom = hopper.WgmmaAtom(plan.block_n, ty.e4m3, "ss")
    s = None
    for kk in range(plan.head_dim // 32):
        s = hopper.wgmma(atom, s, q_desc + 2 * kk, k_desc + 2 * kk)
    hopper.wgmma_commit()
    return s


@ty.func
def issue_scores(smem, plan, q_desc, k_base, j, turn):
    stage = hopper.ring_wait(smem, plan.k_ring, j, "k_full")
    ty.barrier_sync(turn.mine, TURN_THREADS)
    hopper.wgmma_fence()
    return score_gemm(plan, q_desc, k_base + ty.cast(stage * (plan.tile_bytes >> 4), ty.u64))


@ty.func
def issue_pv(smem, plan, v_base, o, pa, j):
    """Wait for V^T_j and issue O += P_j V_j: k32 steps over keys, both operands K-major."""
    stage = hopper.ring_wait(smem, plan.v_ring, j, "v_full")
    v_desc = v_base + ty.cast(stage * (plan.tile_bytes >> 4), ty.u64)
    atom = hopper.WgmmaAtom(plan.head_dim, ty.e4m3, "rs")
    hopper.wgmma_fence()
    for kk in range(len(pa)):
        chunk, step = divmod(kk, ROW_BYTES // 32)
        o = hopper.wgmma(atom, o, pa[kk], v_desc + (chunk * (plan.v_chunk >> 4) + 2 * step))
    hopper.wgmma_commit()
    return o


@ty.func
def pack_p(plan, p):
    """The weights as e4m3 A fragments of the PV product, each weight kept in its lane: A register
    r of k32 step c holds S registers 16c + 8(r >> 1) + 2(r & 1) + {0, 1, 4, 5} (``key_slot``)."""
    atom = hopper.WgmmaAtom(plan.head_dim, ty.e4m3, "rs")
    frags = []
    for c in range(plan.block_n // 32):
        words = []
        for r in range(4):
            i = 16 * c + 8 * (r >> 1) + 2 * (r & 1)
            words.append(ty.pack_fp8x4(p[i], p[i + 1], p[i + 4], p[i + 5], ty.e4m3))
        frags.append(atom.a_fragment(words))
    return frags


@ty.func
def descale_of(descales, which, kv):
    """Descale ``which`` (0 q, 1 k, 2 v) of K/V head ``kv`` (= b H_kv + g): bit ``which`` of the
    form says per (batch, K/V head), else one value (per tensor)."""
    ptrs, form = descales
    return ptrs[which][kv * ty.cast((form >> which) & 1, ty.i64)]


@ty.func
def consumer(smem, plan, prob, sched, wg, descales):
    """One work tile for one consumer: 64 query rows against the tile's key range."""
    turn = Turn(wg, plan.consumers)
    if wg == 1:
        ty.barrier_arrive(1, TURN_THREADS)  # consumer 1 takes the first turn
    valid, m0, h, b, n_tiles = next_tile(prob, 0, False, "heads")
    block_n = plan.block_n
    kv = ty.cast(b, ty.i64) * ty.cast(prob.n_heads // prob.kv_group, ty.i64) + ty.cast(h // prob.kv_group, ty.i64)
    scale = prob.scale * descale_of(descales, 0, kv) * descale_of(descales, 1, kv)
    sm = softmax.Softmax(scale, "bf16", sched.exponent, sched.threshold, sched.poly, P_OFFSET)
    row0 = m0 + (wg - 1) * ROWS
    base = ty.address(smem)
    row = plan.qk_row  # K-major Q/K: 8-row swizzle atoms of D-byte rows
    q_desc = hopper.smem_descriptor(base + ty.cast(plan.q + (wg - 1) * ROWS * row, ty.u32), sbo=8 * row, swizzle=row)
    k_base = hopper.smem_descriptor(base + ty.cast(plan.k, ty.u32), sbo=8 * row, swizzle=row)
    v_base = hopper.smem_descriptor(base + ty.cast(plan.v, ty.u32))
    leader = (ty.thread_idx() & 127) == 0
    mask_base = ty.cast(b, ty.i64) * prob.m_strides[0] + ty.cast(h, ty.i64) * prob.m_strides[1]
    my_tiles = n_tiles
    if prob.causal != 0:
        my_tiles = ty.minimum(n_tiles, (ty.minimum(prob.n_k, row0 + ROWS) + (block_n - 1)) // block_n)
    mask_from = first_masked_tile(prob, row0, sched.has_mask)
    hopper.mbarrier_wait(bar_at(smem, plan.q_full), 0, "q_full")

    s = issue_scores(smem, plan, q_desc, k_base, 0, turn)
    ty.barrier_arrive(turn.next, TURN_THREADS)
    s = hopper.wgmma_wait(0, s)
    release(smem, plan.k_ring, 0, leader)
    if mask_from == 0:
        s = mask_scores(s, row0, 0, prob, mask_base, sched.has_mask)
    st, p, alpha, moved = softmax.update(sm, softmax.initial_state(), list(s.values))
    st = softmax.add_to_sums(st, alpha, [p])
    pa = pack_p(plan, p)
    o = ty.Fragment(tuple(ty.cast(0.0, ty.f32) for _ in range(plan.head_dim // 2)), ty.WARPGROUP,
                    ty.wgmma_acc(plan.head_dim))
    for j in range(1, my_tiles):
        cur = issue_scores(smem, plan, q_desc, k_base, j, turn)
        o = issue_pv(smem, plan, v_base, o, pa, j - 1)
        ty.barrier_arrive(turn.next, TURN_THREADS)
        cur, o = hopper.wgmma_wait(1, cur, o)          # S_j is ready, the PV product is not
        release(smem, plan.k_ring, j, leader)
        if j >= mask_from:
            cur = mask_scores(cur, row0, j * block_n, prob, mask_base, sched.has_mask)
        st, p, alpha, moved = softmax.update(sm, st, list(cur.values))
        st = softmax.add_to_sums(st, alpha, [p])
        o, pa = wait_pv(sched, o, pa, p)
        release(smem, plan.v_ring, j - 1, leader)
        o = rescale_o(o, alpha, moved)
        pa = pack_p(plan, p)
    o = issue_pv(smem, plan, v_base, o, pa, my_tiles - 1)
    o, pa = hopper.wgmma_wait(0, o, pa)
    release(smem, plan.v_ring, my_tiles - 1, leader)
    pass_dead_tiles(smem, plan, prob, 0, my_tiles, n_tiles, turn, leader)
    inv, lse = softmax.finish(sm, st, sched.return_lse)
    vs = descale_of(descales, 2, kv)
    o = o.with_data(softmax.scale_rows(o.values, [x * vs for x in inv]))
    store_lse(prob, lse, row0, h, b)
    store_direct(prob, sched, o, row0, h, b)


def _threads(CONSUMERS=2, **_):
    return 128 * (CONSUMERS + 1)


@ty.kernel(threads=_threads, min_blocks_per_sm=1, noalias=True)
def attention_fwd_fp8_sm90(
    tm_q: ty.tensormap, tm_k: ty.tensormap, tm_vt: ty.tensormap,
    out: ty.ptr(ty.i16), lse_ptr: ty.ptr(ty.f32), mask: ty.ptr(ty.u8),
    q_descale: ty.ptr(ty.f32), k_descale: ty.ptr(ty.f32), v_descale: ty.ptr(ty.f32), descale_form: ty.i32,
    n_q: ty.i32, n_k: ty.i32, n_heads: ty.i32, n_batch: ty.i32, kv_group: ty.i32, scale: ty.f32, causal: ty.i32,
    o_stride_b: ty.i64, o_stride_h: ty.i64, o_stride_n: ty.i64,
    m_stride_b: ty.i64, m_stride_h: ty.i64, m_stride_q: ty.i64, m_stride_k: ty.i64,
    HEAD_DIM: ty.constexpr = 128, BLOCK_N: ty.constexpr = 128, STAGES: ty.constexpr = 2,
    CONSUMERS: ty.constexpr = 2, HAS_MASK: ty.constexpr = False, RETURN_LSE: ty.constexpr = False,
    COORD_ORDER: ty.constexpr = ("n", "h", "b"), EXPONENT: ty.constexpr = "shared",
    RESCALE_THRESHOLD: ty.constexpr = 0.0, PV_WAIT: ty.constexpr = "pinned", POLY_EXP2: ty.constexpr = 0,
):
    """One CTA per (query block of 128 rows, head, batch). Q and K come as tensor maps over (D,
    then n, h, b in ``COORD_ORDER``), V^T over (keys, D, K/V head, batch). The descales are float32,
    contiguous (B, H_kv) where bit 0/1/2 (q/k/v) of ``descale_form`` is set, else one value; the
    scores are scaled by ``scale`` q_descale k_descale, O by v_descale."""
    plan = Fp8Plan(HEAD_DIM, BLOCK_N, STAGES, CONSUMERS)
    sched = Fp8Schedule(HAS_MASK, RETURN_LSE, EXPONENT, RESCALE_THRESHOLD, PV_WAIT, POLY_EXP2)
    smem = ty.dynamic_shared(ty.u8, plan.total, align=1024)
    prob = Problem(Sizes(n_q, n_k, n_heads, n_batch, kv_group), scale, causal,
                   Output(out, lse_ptr, tm_q, (o_stride_b, o_stride_h, o_stride_n)),
                   (mask, (m_stride_b, m_stride_h, m_stride_q, m_stride_k)), plan.block_m, BLOCK_N)
    init_barriers(smem, plan)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, plan, prob, tm_q, tm_k, tm_vt, COORD_ORDER)
    else:
        hopper.setmaxnreg(REGISTER_SPLIT[CONSUMERS][1], increase=True)
        consumer(smem, plan, prob, sched, wg, ((q_descale, k_descale, v_descale), descale_form))


