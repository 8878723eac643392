"""The warp-specialized Hopper attention forward with a variant (``variants.py``): sliding window,
softcap, ALiBi, sinks, float and bool masks, causal masks of either alignment, user score_mod /
mask_mod and block masks.

The same producer as ``forward.py`` (its key tiles come from ``variant_tiles``: only the tiles in
the variant's key range or the block mask's lists are loaded) and the consumers' pieces of
``consumer.py`` (turns, wgmma issue and waits, online softmax, stores), with one consumer tile
loop of its own: each S tile goes through ``variant_tiles.scores`` (transform, masks) before the
softmax step, and the row normalizer takes the sink. Consumers of 64 rows, 128-key tiles, no TMA
store: two (240 registers a thread, what the mods and masks need) or, at D=64 for the builtins
that fit 160 registers, three (``variant_launch.default_schedule``); with three, each consumer
computes only the key tiles its own rows see and passes the rest (``pass_tile``). One work tile
per CTA, or with PERSISTENT a loop over them (grid = SMs; the producer loads the next tile's Q and
keys while the consumers finish this one; a query tile that sees no key still turns the Q
buffer's barriers).

A separate kernel (not a constexpr of the dense one) so the dense kernel's parameters, and so its
PTX, stay what they are.
"""
import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90 import softmax
from tylopy_kernels.attention.sm90.consumer import (ROWS, TURN_THREADS, Turn, descriptors, issue_pv, issue_scores,
                                                   pack_p, release, rescale_o, store_direct, store_lse, wait_pv)
from tylopy_kernels.attention.sm90.forward import _threads, init_barriers, producer
from tylopy_kernels.attention.sm90.tiles import (REGISTER_SPLIT, Output, Plan, Problem, Schedule, Sizes, WorkTile,
                                                bar_at, next_tile, skip_tile, tiles_of_this_cta)
from tylopy_kernels.attention.sm90.variant_tiles import (NEG_INF, QueryRows, VariantProblem, alibi_row_shift,
                                                        consumer_tiles, finish, mask_row_pointers, scores,
                                                        tile_number, variant_tile_at)


@ty.func
def empty_tile(prob, sched, sink, row0, h, b):
    """A query tile that visits no key: output 0, LSE -inf (or the sink: log exp(sink))."""
    zero = ty.cast(0.0, ty.f32)
    o = ty.Fragment(tuple(zero for _ in range(prob.head_dim // 2)), ty.WARPGROUP, ty.wgmma_acc(prob.head_dim))
    store_direct(prob, sched, o, row0, h, b)
    if sched.return_lse:
        val = ty.cast(NEG_INF, ty.f32) if sink is None else sink
        store_lse(prob, [val, val], row0, h, b)


@ty.func
def pass_tile(smem, plan, turn, j, leader):
    """A key tile none of this consumer's rows see: take and pass the turn (the others' rotation
    counts one turn a tile from every consumer) and give K_j back, once it has landed (an arrival
    before then would count toward the stage's previous use)."""
    hopper.ring_wait(smem, plan.k_ring, j, "k_full (passed)")
    ty.barrier_sync(turn.mine, TURN_THREADS)
    ty.barrier_arrive(turn.next, TURN_THREADS)
    release(smem, plan.k_ring, j, leader)


@ty.func
def pass_values(smem, plan, j, leader):
    """V_j of a passed key tile: given back once it has landed."""
    hopper.ring_wait(smem, plan.v_ring, j, "v_full (passed)")
    release(smem, plan.v_ring, j, leader)


@ty.func
def pass_tiles(smem, plan, turn, first, end, leader):
    """Pass ring iterations first .. end - 1 whole: K (with the turn), then V."""
    for j in range(first, end):
        pass_tile(smem, plan, turn, j, leader)
        pass_values(smem, plan, j, leader)


@ty.func
def variant_tile(smem, plan, prob, sched, wg, turn, tile):
    """One work tile (a ``WorkTile``) for one consumer: 64 query rows against the key tiles they
    see among the n_tiles the work tile visits. The tiles before and after this consumer's range
    (``consumer_tiles``) are passed: the turn goes on and the stages are given back."""
    k, it, m0, h, b, n_tiles = tile
    vp = prob.variant
    kvv = vp.kv
    block_n = plan.block_n
    sm = softmax.Softmax(1.0 if kvv.transforms else prob.scale, sched.dtype.name, sched.exponent, sched.threshold,
                         sched.poly)
    row0 = m0 + (wg - 1) * ROWS
    descs = descriptors(plan, ty.address(smem), wg)
    leader = (ty.thread_idx() & 127) == 0
    slope = None
    if vp.v.alibi:
        slope = vp.slopes[b, h]
    sink = None
    if vp.v.sinks:
        sink = vp.sinks[h]
    hopper.mbarrier_wait(bar_at(smem, plan.q_full), k & 1, "q_full")
    mine_range = consumer_tiles(prob, m0, row0, n_tiles)
    passing = mine_range is not None  # (a trace-time choice: without it the loop is the work tile's)
    lo, mine = (0, n_tiles) if not passing else mine_range
    if passing:
        pass_tiles(smem, plan, turn, it, it + lo, leader)
    hi = lo + mine
    if passing and mine == 0:  # none of this consumer's rows sees a key: zeros, LSE -inf (or the sink)
        pass_tiles(smem, plan, turn, it + hi, it + n_tiles, leader)
        if sched.persistent and leader:
            hopper.mbarrier_arrive(bar_at(smem, plan.q_empty))
        empty_tile(prob, sched, sink, row0, h, b)
    else:
        own = it + lo  # the ring iteration of this consumer's first key tile
        # Its first tile: scores and softmax only; its PV product is issued with the next tile's scores.
        parts = issue_scores(smem, plan, sched, descs, own, turn)
        ty.barrier_arrive(turn.next, TURN_THREADS)
        parts = hopper.wgmma_wait(0, parts)
        release(smem, plan.k_ring, own, leader)
        num, partial = tile_number(prob, lo, m0, h, b)
        qrows = QueryRows(row0, b, h, slope, mask_row_pointers(prob, parts[0], row0, b, h))
        vals = scores(prob, parts[0], qrows, num * block_n, partial)
        st, p, alpha, moved = softmax.update(sm, softmax.initial_state(), vals)
        st = softmax.add_to_sums(st, alpha, [p])
        pa = pack_p(plan, sched, p)
        o = ty.Fragment(tuple(ty.cast(0.0, ty.f32) for _ in range(plan.head_dim // 2)), ty.WARPGROUP,
                        ty.wgmma_acc(plan.head_dim))

        for jj in range(1, mine):
            cur = issue_scores(smem, plan, sched, descs, own + jj, turn)
            o = issue_pv(smem, plan, sched, descs, o, pa, own + jj - 1)
            ty.barrier_arrive(turn.next, TURN_THREADS)
            cur, o = hopper.wgmma_wait(1, cur, o)          # S_j is ready, the PV product is not
            release(smem, plan.k_ring, own + jj, leader)
            num, partial = tile_number(prob, lo + jj, m0, h, b)
            vals = scores(prob, cur[0], qrows, num * block_n, partial)
            st, p, alpha, moved = softmax.update(sm, st, vals)
            st = softmax.add_to_sums(st, alpha, [p])
            o, pa = wait_pv(sched, o, pa, p)
            release(smem, plan.v_ring, own + jj - 1, leader)
            o = rescale_o(o, alpha, moved)
            pa = pack_p(plan, sched, p)

        # The turns of the tiles past this consumer's range go before its epilogue, so the others do not
        # wait for it; while it holds its last V stage the producer gets at most STAGES K tiles further
        # (it loads K and V in turn), so more than that are passed after the last V is given back.
        if passing:
            split = ty.select(n_tiles - hi <= plan.stages, n_tiles, hi)
            for j in range(hi, split):
                pass_tile(smem, plan, turn, it + j, leader)
        if sched.persistent and leader:  # every S product of this tile has completed: the next Q may land
            hopper.mbarrier_arrive(bar_at(smem, plan.q_empty))
        o = issue_pv(smem, plan, sched, descs, o, pa, own + mine - 1)
        o, pa = hopper.wgmma_wait(0, o, pa)
        release(smem, plan.v_ring, own + mine - 1, leader)
        if passing:
            for j in range(split, n_tiles):
                pass_tile(smem, plan, turn, it + j, leader)
            for j in range(hi, n_tiles):
                pass_values(smem, plan, it + j, leader)
        shift = [alibi_row_shift(slope, r) for r in range(2)] if kvv.alibi_fold else None
        inv, lse = finish(sm, st, sched.return_lse, sink, shift)
        o = o.with_data(softmax.scale_rows(o.values, inv))
        store_lse(prob, lse, row0, h, b)
        store_direct(prob, sched, o, row0, h, b)


@ty.func
def variant_consumer(smem, plan, prob, sched, wg):
    turn = Turn(wg, plan.consumers)
    if wg == 1:
        ty.barrier_arrive(1, TURN_THREADS)  # consumer 1 takes the first turn
    it = 0
    for k in range(tiles_of_this_cta(prob, sched.persistent)):
        valid, m0, h, b, n_tiles = next_tile(prob, k, sched.persistent, sched.tile_order)
        skip_tile(smem, plan, prob, valid, k, sched.persistent, wg)
        if valid:
            variant_tile(smem, plan, prob, sched, wg, turn, WorkTile(k, it, m0, h, b, n_tiles))
            it = it + n_tiles
        else:
            real, _, _, _ = variant_tile_at(prob, k, sched.persistent)
            if real:  # a query tile that sees no key: zeros, LSE -inf (or the sink)
                sink = None
                if prob.variant.v.sinks:
                    sink = prob.variant.sinks[h]
                empty_tile(prob, sched, sink, m0 + (wg - 1) * ROWS, h, b)


@ty.kernel(threads=_threads, min_blocks_per_sm=1, noalias=True)
def attention_variant_fwd_sm90(
    tm_q: ty.tensormap, tm_k: ty.tensormap, tm_v: ty.tensormap,
    out: ty.ptr(ty.i16), lse_ptr: ty.ptr(ty.f32),
    n_q: ty.i32, n_k: ty.i32, n_heads: ty.i32, n_batch: ty.i32, kv_group: ty.i32, kv_batch: ty.i32, scale: ty.f32,
    o_stride_b: ty.i64, o_stride_h: ty.i64, o_stride_n: ty.i64,
    diag: ty.i32, win_left: ty.i32, win_right: ty.i32, softcap: ty.f32,
    slopes: ty.tensor(ty.f32, 2), sinks: ty.tensor(ty.f32, 1), mask: ty.tensor(4, index=ty.i64),
    bm_num: ty.tensor(ty.i32, 3), bm_idx: ty.tensor(ty.i32, 4), bm_full_num: ty.tensor(ty.i32, 3),
    bm_full_idx: ty.tensor(ty.i32, 4),
    aux0: ty.tensor(4), aux1: ty.tensor(4), aux2: ty.tensor(4), aux3: ty.tensor(4),
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 128,
    STAGES: ty.constexpr = 2, CONSUMERS: ty.constexpr = 2, RETURN_LSE: ty.constexpr = True,
    COORD_ORDER: ty.constexpr = ("n", "h", "b"), EXPONENT: ty.constexpr = "shared",
    RESCALE_THRESHOLD: ty.constexpr = 8.0, PV_WAIT: ty.constexpr = "pinned", VARIANT: ty.constexpr = None,
    PERSISTENT: ty.constexpr = False,
):
    """One CTA per (query block of 128 rows, head, batch), or PERSISTENT CTAs looping over them in
    the "heads" order; ``VARIANT`` is a
    ``variant_tiles.KernelVariant``. Tensor parameters a variant does not use get 1-element
    placeholders (``variant_launch``)."""
    plan = Plan(HEAD_DIM, BLOCK_N, STAGES, CONSUMERS, False)
    sched = Schedule(DTYPE, return_lse=RETURN_LSE, persistent=PERSISTENT, coord_order=COORD_ORDER, exponent=EXPONENT,
                     threshold=RESCALE_THRESHOLD, pv_wait=PV_WAIT)
    smem = ty.dynamic_shared(ty.u8, plan.total, align=1024)
    prob = Problem(Sizes(n_q, n_k, n_heads, n_batch, kv_group, kv_batch), scale, 0,
                   Output(out, lse_ptr, tm_q, (o_stride_b, o_stride_h, o_stride_n)), (out, (0, 0, 0, 0)), plan.block_m,
                   BLOCK_N)
    prob.head_dim = HEAD_DIM
    prob.variant = VariantProblem(VARIANT, (diag, win_left, win_right, softcap), (slopes, sinks, mask),
                                  (bm_num, bm_idx, bm_full_num, bm_full_idx), (aux0, aux1, aux2, aux3))
    init_barriers(smem, plan)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, plan, prob, sched, tm_q, tm_k, tm_v)  # the "heads" order (Schedule's default)
    else:
        hopper.setmaxnreg(REGISTER_SPLIT[CONSUMERS][1], increase=True)
        variant_consumer(smem, plan, prob, sched, wg)
