"""The consumer warpgroups of the Hopper attention forward: per work tile, 64 query rows against
every key tile of the tile's range (``forward.py`` describes the whole kernel).

Tensor-core turns: consumer k syncs on named barrier k (0 is __syncthreads) -- 128 threads of
consumer k sync there and the 128 of the consumer before it arrive -- issues its wgmmas and
arrives on the next consumer's barrier. The O staging buffer of the TMA store has one named
barrier per consumer (``CONSUMER_BARRIER + k``, ``tiles.py``), 128 threads.
"""
import inspect

import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90 import softmax as softmax
from tylopy_kernels.attention.sm90.tiles import (CONSUMER_BARRIER, ROW_BYTES, WorkTile, bar_at, next_tile, shift,
                                                skip_tile, tile_problem, tiles_of_this_cta, tma_coords)

ROWS = 64                  # query rows per consumer warpgroup
TURN_THREADS = 256
NEG_INF = float("-inf")
# wgmma_wait(..., after=values) pins the exponentials before the PV wait; without it, tying the
# weights through the wait as extra fragments has the same effect on the order.
PIN_AFTER = "after" in inspect.signature(hopper.wgmma_wait).parameters


class Turn:
    def __init__(self, wg, consumers):
        self.mine = wg
        self.next = wg % consumers + 1


@ty.func
def release(smem, ring, j, leader):
    """One thread per consumer arrives on load ``j``'s empty barrier of ``ring`` (count = consumers)."""
    if leader:
        hopper.ring_release(smem, ring, j)


class Descs:
    """The u64 descriptor bases of this consumer (desc units are 16 bytes): its 64 Q rows, and K/V
    stage 0 (V read MN-major: its 64-column chunks are ``kv_chunk`` bytes apart, the LBO)."""

    def __init__(self, q, k, v):
        self.q, self.k, self.v = q, k, v


@ty.func
def descriptors(plan, base, wg):
    q = hopper.smem_descriptor(base + ty.cast(plan.q + (wg - 1) * ROWS * ROW_BYTES, ty.u32))
    k = hopper.smem_descriptor(base + ty.cast(plan.k, ty.u32))
    v = hopper.smem_descriptor(base + ty.cast(plan.v, ty.u32), lbo=plan.kv_chunk)
    return Descs(q, k, v)


@ty.func
def score_gemm(atom, plan, q_desc, k_desc):
    """S = Q K^T over D in k16 steps (K-major: +32 bytes a step inside a 64-column chunk)."""
    s = None
    for k in range(plan.head_dim // 16):
        chunk, step = divmod(k, 4)
        s = hopper.wgmma(atom, s, q_desc + (chunk * (plan.q_chunk >> 4) + 2 * step),
                         k_desc + (chunk * (plan.kv_chunk >> 4) + 2 * step))
    hopper.wgmma_commit()
    return s


@ty.func
def issue_scores(smem, plan, sched, descs, j, turn):
    """Wait for K_j, take the turn and issue S_j = Q K_j^T: one commit group, or two of half
    width (SPLIT_S) so the softmax of the first half can start while the second is computed.
    The turn is passed on by the caller."""
    stage = hopper.ring_wait(smem, plan.k_ring, j, "k_full")
    ty.barrier_sync(turn.mine, TURN_THREADS)
    k_desc = descs.k + ty.cast(stage * (plan.tile_bytes >> 4), ty.u64)
    hopper.wgmma_fence()
    if sched.split_s:
        atom = hopper.WgmmaAtom(plan.block_n // 2, sched.dtype, "ss")
        half = (plan.block_n // 2) * ROW_BYTES >> 4
        return [score_gemm(atom, plan, descs.q, k_desc), score_gemm(atom, plan, descs.q, k_desc + half)]
    return [score_gemm(hopper.WgmmaAtom(plan.block_n, sched.dtype, "ss"), plan, descs.q, k_desc)]


@ty.func
def issue_pv(smem, plan, sched, descs, o, p, j):
    """Wait for V_j and issue O += P_j V_j (P in registers, V MN-major: a k16 step is 16 rows)."""
    stage = hopper.ring_wait(smem, plan.v_ring, j, "v_full")
    v_desc = descs.v + ty.cast(stage * (plan.tile_bytes >> 4), ty.u64)
    atom = hopper.WgmmaAtom(plan.head_dim, sched.dtype, "rs")
    hopper.wgmma_fence()
    for kk in range(len(p)):
        o = hopper.wgmma(atom, o, p[kk], v_desc + 128 * kk, trans_b=1)
    hopper.wgmma_commit()
    return o


@ty.func
def mask_scores(s, row0, col0, prob, mask_base, has_mask):
    """-inf where a key is past the end, in the future (causal), or masked off by the user."""
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    slots = s.layout.row_slots
    first = [slots.index(k) for k in range(max(slots) + 1)]
    rows = [row0 + s.layout.coord(warp, lane, i)[0] for i in first]  # this thread's two rows
    if has_mask:
        row_ptrs = [prob.mask + (mask_base + ty.cast(r, ty.i64) * prob.m_strides[2]) for r in rows]
    vals = []
    for i in range(len(s)):
        row = rows[slots[i]]
        col = col0 + s.layout.coord(warp, lane, i)[1]
        ok = (col < prob.n_k) & ((prob.causal == 0) | (col <= shift(row, prob.diag)))
        if has_mask:
            flag = ty.load(row_ptrs[slots[i]] + ty.cast(col, ty.i64) * prob.m_strides[3], mask=ok & (row < prob.n_q))
            ok = ok & (flag != 0)
        vals.append(ty.select(ok, s.values[i], NEG_INF))
    return s.with_data(vals)


@ty.func
def mask_parts(parts, row0, col0, prob, mask_base, has_mask):
    out, off = [], 0
    for s in parts:
        out.append(mask_scores(s, row0, col0 + off, prob, mask_base, has_mask))
        off = off + s.layout.shape[1]
    return out


@ty.func
def values_of(parts):
    vals = []
    for s in parts:
        vals = vals + list(s.values)
    return vals


@ty.func
def pack_p(plan, sched, p):
    """Same-lane conversion of the weights into the A operand of the next PV product."""
    frag = ty.Fragment(tuple(p), ty.WARPGROUP, ty.wgmma_acc(plan.block_n))
    atom = hopper.WgmmaAtom(plan.head_dim, sched.dtype, "rs")
    return [ty.pack_operand_a(atom, frag, kk) for kk in range(plan.block_n // 16)]


@ty.func
def wait_pv(sched, o, p_prev, weights):
    """Wait for O += P_{j-1} V_{j-1}. PV_WAIT="pinned": after every exponential of this tile
    (they run under the PV product); "free": where the compiler puts it."""
    if sched.pv_wait == "pinned":
        w = ty.Fragment(tuple(weights), ty.WARPGROUP, ty.wgmma_acc(len(weights) * 2))
        if PIN_AFTER:
            return hopper.wgmma_wait(0, o, p_prev, after=(w,))
        o, p_prev, w = hopper.wgmma_wait(0, o, p_prev, w)
        return o, p_prev
    return hopper.wgmma_wait(0, o, p_prev)


@ty.func
def rescale_o(o, alpha, moved):
    """O *= alpha per row; skipped (a warp-uniform branch) when no row of the warp moved."""
    if moved is None:
        return o.with_data(softmax.scale_rows(o.values, alpha))
    out = o
    if moved:
        out = o.with_data(softmax.scale_rows(o.values, alpha))
    return out


@ty.func
def merge_halves(p, alpha, moved, p2, alpha2, moved2):
    """Join the softmax steps of S's two halves: the first half's weights were measured from the
    reference before the second half moved it (rare with a lazy threshold: a uniform branch)."""
    if moved2 is None:
        p = softmax.scale_rows(p, alpha2)
    else:
        if moved2:
            p = softmax.scale_rows(p, alpha2)
    alpha = [a * b for a, b in zip(alpha, alpha2)]
    moved = None if moved is None or moved2 is None else (moved | moved2)
    return p + p2, alpha, moved


@ty.func
def consumer(smem, plan, prob, sched, wg):
    turn = Turn(wg, plan.consumers)
    if wg == 1:
        ty.barrier_arrive(1, TURN_THREADS)  # consumer 1 takes the first turn
    it = 0
    done = no_output(plan, sched) if sched.defer_epilogue else None
    for k in range(tiles_of_this_cta(prob, sched.persistent)):
        valid, m0, h, b, n_tiles = next_tile(prob, k, sched.persistent, sched.tile_order)
        skip_tile(smem, plan, prob, valid, k, sched.persistent, wg)
        if valid:
            done = consumer_tile(smem, plan, prob, sched, wg, turn, WorkTile(k, it, m0, h, b, n_tiles), done)
            it = it + n_tiles
    if sched.defer_epilogue:
        write_output(smem, plan, prob, sched, wg, done)  # the last tile's
    if sched.tma_store:
        if (ty.thread_idx() & 127) == 0:
            hopper.bulk_wait(0)


@ty.func
def before_turn(smem, plan, prob, turn, j, it_j):
    """Packed batches only: the first consumer zeroes the rows of key tile j (ring iteration
    ``it_j``) past the document's end in V before any PV product reads them (0 * NaN is NaN)."""
    if prob.varlen is not None:
        prob.varlen.zero_v_tail(smem, plan, prob, turn.mine, j, it_j)


@ty.func
def pass_dead_tiles(smem, plan, prob, it, first, n_tiles, turn, leader):
    """Tiles wholly in this consumer's causal future: no math, but every stage and turn protocol
    step the other consumers and the producer count on."""
    for j in range(first, n_tiles):
        hopper.ring_wait(smem, plan.k_ring, j, "k_full (dead tile)")
        before_turn(smem, plan, prob, turn, j - it, j)
        ty.barrier_sync(turn.mine, TURN_THREADS)
        ty.barrier_arrive(turn.next, TURN_THREADS)
        release(smem, plan.k_ring, j, leader)
        hopper.ring_wait(smem, plan.v_ring, j, "v_full (dead tile)")
        release(smem, plan.v_ring, j, leader)


@ty.func
def first_masked_tile(prob, row0, has_mask):
    """Tiles before this one need no mask: wholly inside n_k and (causal) before the diagonal."""
    if has_mask:
        return 0
    first = prob.n_k // prob.block_n
    if prob.causal != 0:
        first = ty.minimum(first, shift(row0 + 1, prob.diag) // prob.block_n)
    if prob.varlen is not None:  # a row before the diagonal's start: (negative) // block_n rounds to 0 or up
        first = ty.maximum(first, 0)
    return first


@ty.func
def consumer_tile(smem, plan, prob, sched, wg, turn, tile, done):
    """One work tile (a ``WorkTile``) for one consumer: 64 query rows against every key tile of the
    tile's range.

    ``done`` is the previous tile's output (``no_output``'s structure); with DEFER_EPILOGUE it is
    written under this tile's first S product. Returns this tile's output, live unless written.
    """
    k, it, m0, h, b, n_tiles = tile
    prob = tile_problem(prob, b)
    block_n = plan.block_n
    sm = softmax.Softmax(prob.scale, sched.dtype.name, sched.exponent, sched.threshold, sched.poly)
    row0 = m0 + (wg - 1) * ROWS
    descs = descriptors(plan, ty.address(smem), wg)
    leader = (ty.thread_idx() & 127) == 0
    mask_base = ty.cast(b, ty.i64) * prob.m_strides[0] + ty.cast(h, ty.i64) * prob.m_strides[1]
    # Under causal masking this consumer's last useful tile ends at its own last row.
    my_tiles = n_tiles
    if prob.causal != 0:
        my_tiles = ty.minimum(n_tiles, (ty.minimum(prob.n_k, shift(row0 + ROWS, prob.diag)) + (block_n - 1)) // block_n)
        if prob.varlen is not None:  # rows before a document's diagonal start still take tile 0 (all masked)
            my_tiles = ty.maximum(my_tiles, 1)
    mask_from = first_masked_tile(prob, row0, sched.has_mask)
    hopper.mbarrier_wait(bar_at(smem, plan.q_full), k & 1, "q_full")

    # Tile 0: scores and softmax only; its PV product is issued with tile 1's scores.
    before_turn(smem, plan, prob, turn, 0, it)
    parts = issue_scores(smem, plan, sched, descs, it, turn)
    ty.barrier_arrive(turn.next, TURN_THREADS)
    if sched.defer_epilogue:  # the previous tile's output goes out while S_0 is on the tensor cores
        write_output(smem, plan, prob, sched, wg, done)
    parts = hopper.wgmma_wait(0, parts)
    release(smem, plan.k_ring, it, leader)
    if mask_from == 0:
        parts = mask_parts(parts, row0, 0, prob, mask_base, sched.has_mask)
    st, p, alpha, moved = softmax.update(sm, softmax.initial_state(), values_of(parts))
    st = softmax.add_to_sums(st, alpha, [p])
    pa = pack_p(plan, sched, p)
    o = ty.Fragment(tuple(ty.cast(0.0, ty.f32) for _ in range(plan.head_dim // 2)), ty.WARPGROUP,
                    ty.wgmma_acc(plan.head_dim))

    # Tile j: S_j and O += P_{j-1} V_{j-1} in flight together; the softmax of S_j overlaps the PV.
    for j in range(1, my_tiles):
        before_turn(smem, plan, prob, turn, j, it + j)
        cur = issue_scores(smem, plan, sched, descs, it + j, turn)
        o = issue_pv(smem, plan, sched, descs, o, pa, it + j - 1)
        ty.barrier_arrive(turn.next, TURN_THREADS)
        masked = j >= mask_from
        col0 = j * block_n
        if sched.split_s:
            cur, o = hopper.wgmma_wait(2, cur, o)         # the first half of S_j is ready
            first = cur[0]
            if masked:
                first = mask_scores(first, row0, col0, prob, mask_base, sched.has_mask)
            st, p, alpha, moved = softmax.update(sm, st, list(first.values))
            second, o = hopper.wgmma_wait(1, cur[1], o)
            release(smem, plan.k_ring, it + j, leader)
            if masked:
                second = mask_scores(second, row0, col0 + block_n // 2, prob, mask_base, sched.has_mask)
            st, p2, alpha2, moved2 = softmax.update(sm, st, list(second.values))
            p, alpha, moved = merge_halves(p, alpha, moved, p2, alpha2, moved2)
        else:
            cur, o = hopper.wgmma_wait(1, cur, o)          # S_j is ready, the PV product is not
            release(smem, plan.k_ring, it + j, leader)
            s = cur[0]
            if masked:
                s = mask_scores(s, row0, col0, prob, mask_base, sched.has_mask)
            st, p, alpha, moved = softmax.update(sm, st, list(s.values))
        if sched.early_sums:  # the row sums consume each weight as it comes: ptxas interleaves the MUFUs
            st = softmax.add_to_sums(st, alpha, [p])
        o, pa = wait_pv(sched, o, pa, p)
        release(smem, plan.v_ring, it + j - 1, leader)
        o = rescale_o(o, alpha, moved)
        if not sched.early_sums:
            st = softmax.add_to_sums(st, alpha, [p])
        pa = pack_p(plan, sched, p)

    if leader:  # every S GEMM of this tile has completed: the producer may load the next Q
        hopper.mbarrier_arrive(bar_at(smem, plan.q_empty))
    o = issue_pv(smem, plan, sched, descs, o, pa, it + my_tiles - 1)
    o, pa = hopper.wgmma_wait(0, o, pa)
    release(smem, plan.v_ring, it + my_tiles - 1, leader)
    pass_dead_tiles(smem, plan, prob, it, it + my_tiles, it + n_tiles, turn, leader)
    inv, lse = softmax.finish(sm, st, sched.return_lse)
    o = o.with_data(softmax.scale_rows(o.values, inv))
    store_lse(prob, lse, row0, h, b)  # two values a row: not worth carrying into the next tile
    out = {"o": o, "row0": row0, "h": h, "b": b, "live": ty.cast(1, ty.i1)}
    if sched.defer_epilogue:
        return out
    write_output(smem, plan, prob, sched, wg, out)
    return None


@ty.func
def no_output(plan, sched):
    """The output slot before any tile: same structure as a finished tile's, not live."""
    zero = ty.cast(0.0, ty.f32)
    o = ty.Fragment(tuple(zero for _ in range(plan.head_dim // 2)), ty.WARPGROUP, ty.wgmma_acc(plan.head_dim))
    z = ty.cast(0, ty.i32)
    return {"o": o, "row0": z, "h": z, "b": z, "live": ty.cast(0, ty.i1)}


@ty.func
def write_output(smem, plan, prob, sched, wg, out):
    """Store a finished tile's normalized O if the slot is live."""
    if out["live"]:
        if sched.tma_store:
            store_tma(smem, plan, prob, sched, wg, out, (ty.thread_idx() & 127) == 0)
        else:
            store_direct(prob, sched, out["o"], out["row0"], out["h"], out["b"])


@ty.func
def store_direct(prob, sched, o, row0, h, b):
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    vals = o.values
    o_base = ty.cast(b, ty.i64) * prob.o_strides[0] + ty.cast(h, ty.i64) * prob.o_strides[1]
    if prob.varlen is not None:
        o_base = o_base + ty.cast(prob.q_start, ty.i64) * prob.o_strides[2]
    out_words = ty.ptr_cast(prob.out, ty.b32)
    for i in range(0, len(vals), 2):
        r, c = o.layout.coord(warp, lane, i)
        row = row0 + r
        if row < prob.n_q:
            word = ty.pack2(vals[i], vals[i + 1], sched.dtype)
            offset = o_base + ty.cast(row, ty.i64) * prob.o_strides[2] + ty.cast(c, ty.i64)
            out_words[offset >> 1] = word


@ty.func
def store_lse(prob, lse, row0, h, b):
    if lse is not None:
        lane = ty.lane_id()
        warp = ty.warp_idx() & 3  # a shuffle: the whole warp computes it
        if (lane & 3) == 0:
            if prob.varlen is None:
                base = (ty.cast(b, ty.i64) * ty.cast(prob.n_heads, ty.i64) + ty.cast(h, ty.i64)) * ty.cast(prob.n_q, ty.i64)
            else:  # (H, total_q)
                base = ty.cast(h, ty.i64) * prob.varlen.total_q + ty.cast(prob.q_start, ty.i64)
            for r in range(2):
                row = row0 + 16 * warp + (lane >> 2) + 8 * r
                if row < prob.n_q:
                    prob.lse_ptr[base + ty.cast(row, ty.i64)] = lse[r]


@ty.func
def store_tma(smem, plan, prob, sched, wg, out, leader):
    """Stage the consumer's 64 x D output rows (``out``: a finished tile's output slot) in shared
    memory in the 128-byte swizzle of the O tensor map, then one thread TMA-stores each 64-column
    chunk (rows >= n_q are clipped)."""
    o, row0, h, b = out["o"], out["row0"], out["h"], out["b"]
    bar = CONSUMER_BARRIER + wg
    buf = plan.o + (wg - 1) * plan.o_chunk * plan.chunks
    lane = ty.lane_id()
    warp = ty.warp_idx() & 3
    g, t = lane >> 2, lane & 3
    if leader:
        hopper.bulk_wait(0, read=True)  # the previous tile's store has read the buffer
    ty.barrier_sync(bar, 128)
    vals = o.values
    row_base = buf + (16 * warp + g) * ROW_BYTES + 4 * t
    for i in range(0, len(vals), 2):
        piece = i >> 2                        # 8-column (16-byte) piece of the row, 0..D/8-1
        chunk, col16 = divmod(piece, 8)
        addr = row_base + (chunk * plan.o_chunk + 8 * ROW_BYTES * ((i >> 1) & 1)) + ((col16 ^ g) << 4)
        ty.store(ty.ptr_cast(smem + addr, ty.b32), ty.pack2(vals[i], vals[i + 1], sched.dtype))
    hopper.fence_proxy_async()
    ty.barrier_sync(bar, 128)
    if leader:
        for c in range(plan.chunks):
            hopper.tma_store(prob.tm_o, smem + (buf + c * plan.o_chunk), 64 * c,
                             *tma_coords(sched.out_order, row0, h, b))
        hopper.bulk_commit()
