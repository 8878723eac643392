"""Split-KV decode attention (mma.sync, sm_80+): a few query rows against a long KV cache.

What it computes. For each sequence b, key/value head hk and query row (position i < n_q,
query head h = hk * G + g of the hk's group of G = H_q / H_kv heads) it computes
``softmax(scale * q k^T, masked) v`` over the keys 0 .. L_b - 1 of the cache, L_b =
``seqlens[b]``, and the row's log-sum-exp. ``decode_launch.attention_decode`` is the entry point.

The work split. One CTA owns one (key range, kv head, batch): the G * n_q query rows of the kv
head are the M rows of its tensor-core tiles (row r = i * G + g, 16 rows per M tile, ROW_TILES
tiles per CTA), so every K/V byte of the range is read once for the whole GQA group. The key
range of a sequence is cut into ``num_splits`` ranges of whole CTA tiles (BLOCK_N = WARPS *
WARP_KEYS keys); each range is a CTA (grid x), whose result is a partial O (fp32, normalized
by its own sum) and LSE. A range without keys (past a short sequence's end) gives O = 0 and
LSE = -inf. The partials are merged by ``attention_decode_merge`` (a second launch) or, with
FUSED_MERGE, by the last CTA of each (kv head, batch) to arrive at an arrival counter.

Inside the CTA, per warp. Warp w takes keys w * WARP_KEYS .. of every CTA tile and streams them
through its own ring of STAGES shared-memory stages with 16-byte ``cp.async`` copies (rows past
L_b zero-filled, never read); only the warp's 32 lanes synchronize on its ring, through named
barrier 1 + w, so warps never wait for each other in the main loop and (STAGES - 1) stages per
warp are always in flight. Per key block: S = Q K^T (``ldmatrix`` + ``mma.sync``), mask, the
online softmax update (``ty.softmax_update``), O = alpha O + P V. After the loop the warps'
states (m, l, O) meet in shared memory and are combined with ``ty.softmax_merge`` (each warp
combines a slice of the head dim), normalized (``ty.softmax_normalize``), and the LSE taken
(``ty.softmax_lse``).

Masking, bottom-right aligned (as FlashAttention's decoding with a cache): query i is position
L_b - n_q + i, so with ``causal`` key j is visible to query i iff j <= i + L_b - n_q; without it
every key below L_b is visible. A row that sees no key (L_b < n_q - i under causal, or L_b = 0)
has O = 0 and LSE = -inf. Only blocks that reach past L_b - n_q (causal) or L_b are masked.

Merging partials. A partial (O_s, LSE_s) is the online-softmax summary (m = LSE_s, l = 1) in
natural-log units (scale 1): ``softmax_merge`` of two such summaries gives the combined (m, l)
and the factors that rescale each O; the result is O / l and LSE m + ln l. An empty partial
(-inf, l = 0) merges exactly (factor 0), and all-empty gives O = 0, LSE = -inf.

Parameters: every tensor is one ``ty.tensor`` parameter (pointer, shape and strides; their
declarations and the holders the helpers read are in ``problem.py``), passed as views of the
caller's tensors: q and out as (B, n_q, H_q, D) in either layout, the caches as (B, N_max, H_kv,
D) or pages, the LSE (B, H_q, n_q), the split partials (rows, splits x D) and (rows, splits), row
(b * H_q + h) * n_q + i. n_q, H_q, the capacity, the page size, the pool size and the split count
are read off their shapes; the scalars are the GQA group, the scale and causal.

Caches: contiguous ``(B, N_max, H_kv, D)`` (or any strides, last dim contiguous, 16-byte
aligned rows), or paged: ``(num_pages, page_size, H_kv, D)`` with ``block_table[b, p]`` the page
that holds keys p * page_size .. of sequence b (page_size a multiple of WARP_KEYS, so one warp
block lies in one page and costs one table read). An entry that is negative or not below
``num_pages`` is never dereferenced: each warp first checks the entries of its key blocks and, on
a bad one, records it in ``status`` (4 int32 words: the count of bad entries seen, the lowest
sequence, the lowest and highest bad entry) and leaves its keys out. Pages and
table entries past L_b are never read.

Schedule (constexprs; ``decode/launch.py``'s ``SCHEDULE`` has the defaults, ``tylopy bench attention_decode --sweep``
measures others): WARPS, WARP_KEYS (16 or 32 keys per warp block), STAGES (ring depth),
ROW_TILES (1 or 2 M tiles of 16 rows), Q_SMEM (Q kept in shared memory and read by ldmatrix per
block, which frees the 32 registers per M tile that Q fragments would hold: two M tiles at D = 128
fit in 255 registers only this way). Each CTA issues its first K/V copies before it loads Q.

Run: ``tylopy dump tylopy_kernels/attention/decode/kernel.py:attention_decode_fwd -D HEAD_DIM=128`` (PTX + ptxas).
"""
import tylopy as ty

from tylopy_kernels.attention.decode.problem import (COUNTERS, PARTIAL_LSE, PARTIALS, ROW_LSE, SEQLENS, STATUS, TABLE,
                                                    TOKENS, Cache, Config, Dest, KeyBlock, Rows, decode_swizzle,
                                                    head_row, merge_values, q_tile_bytes, smem_bytes, stage_bytes)
from tylopy_kernels.attention.portable.forward import atoms_of, k_operand_row_chunk, tiled, v_operand_row_chunk, zero_atom

HEAD_DIMS = (64, 128)
NEG_INF = float("-inf")
MAX_GRID_YZ = 65535


def _threads(WARPS=4, **_):
    return 32 * WARPS


# -- copies: one warp's key block into its ring -----------------------------------------------------------

@ty.func
def copy_block(src, base, dst, blk, lane, cfg):
    """Copy the rows of ``blk`` from cache ``src`` (element offset ``base`` of its row 0) into ``dst``
    (swizzled); keys at or past kv_len are zero-filled without reading (their source row is clamped
    to ``row_cap``, so no address past the cache is ever formed)."""
    chunks = cfg.head_dim // 8
    rows_per_pass = 32 // chunks
    chunk = lane % chunks
    for p in range(cfg.warp_keys // rows_per_pass):
        r = lane // chunks + p * rows_per_pass
        ok = blk.key0 + r < blk.kv_len
        row = ty.minimum(blk.row0 + r, blk.row_cap)
        g = src.ptr + (base + ty.cast(row, ty.i64) * src.stride[1] + ty.cast(chunk * 8, ty.i64))
        ty.cp_async(dst + decode_swizzle(r, chunk, cfg.head_dim), g, 16, src_bytes=ty.select(ok, 16, 0), cache="cg")


@ty.func
def copy_kv_block(cache, ring, stage, key0, kv_len, lane, cfg):
    """Start the copy of the warp's K and V block at key0 into ``stage`` of its ring (no commit)."""
    dst = ring + stage * stage_bytes(cfg.warp_keys, cfg.head_dim)
    v_dst = dst + cfg.warp_keys * cfg.head_dim * 2
    if cfg.paged:
        # page_size is a multiple of warp_keys: the block lies in one page, one table read. A block
        # wholly past the end (zero-filled) reads the last page's entry, never one past it.
        page_size = cache.page_size
        page_idx = ty.minimum(key0, kv_len - 1) // page_size
        page = ty.cast(cache.table[cache.b, page_idx], ty.i64)  # checked by warp_meets_bad_page
        blk = KeyBlock(key0, ty.minimum(key0 - page_idx * page_size, page_size - cfg.warp_keys), page_size - 1,
                       kv_len)
        copy_block(cache.k, cache.k_base + page * cache.k.stride[0], dst, blk, lane, cfg)
        copy_block(cache.v, cache.v_base + page * cache.v.stride[0], v_dst, blk, lane, cfg)
    else:
        blk = KeyBlock(key0, key0, kv_len - 1, kv_len)
        copy_block(cache.k, cache.k_base, dst, blk, lane, cfg)
        copy_block(cache.v, cache.v_base, v_dst, blk, lane, cfg)


@ty.func
def warp_meets_bad_page(cache, status, first_key, count, kv_len, lane, block_n):
    """Before its K/V stream, a warp checks the table entry of each of its ``count`` key blocks (lane l
    the blocks l, l + 32, ...). An entry outside the page pool is recorded in ``status`` (the count
    of bad entries seen, the lowest sequence, the lowest and highest entry) and the warp reads none
    of its blocks: its keys are left out, and no address outside the cache is formed."""
    num_pages = cache.k.shape[0]  # (i64: the entry is compared in 64 bits, so any pool size is exact)
    bad = False
    for j in range(lane, count, 32):
        key0 = first_key + j * block_n
        page_idx = ty.minimum(key0, kv_len - 1) // cache.page_size
        entry = cache.table[cache.b, page_idx]
        if (entry < 0) | (ty.cast(entry, ty.i64) >= num_pages):
            bad = True
            ty.red_add(status.ptr, 1)
            ty.red_min(status.address(1), cache.b)
            ty.red_min(status.address(2), entry)
            ty.red_max(status.address(3), entry)
    return ty.vote_any(bad)


# -- the warp's work on one key block --------------------------------------------------------------------------

def scores(atom, qa, kbuf, lane, cfg):
    """S = Q K^T for each M tile (f32, WARP_KEYS / 8 atoms); one ldmatrix of K feeds every M tile.
    ``qa``: Q's A fragments [mt][kk], or the shared-memory Q tile (a pointer) to ldmatrix them from."""
    s = [[zero_atom() for _ in range(cfg.warp_keys // 8)] for _ in range(cfg.row_tiles)]
    for kk in range(cfg.head_dim // 16):
        a = [qa[mt][kk] if isinstance(qa, list) else q_from_smem(atom, qa, lane, mt, kk, cfg.head_dim)
             for mt in range(cfg.row_tiles)]
        for n_pair in range(cfg.warp_keys // 16):
            key, chunk = k_operand_row_chunk(lane, n_pair, kk)
            w = ty.ldmatrix(kbuf + decode_swizzle(key, chunk, cfg.head_dim), 4, trans=False)
            for mt in range(cfg.row_tiles):
                s[mt][2 * n_pair] = ty.mma(atom, a[mt], atom.b_fragment(w[0:2]), s[mt][2 * n_pair])
                s[mt][2 * n_pair + 1] = ty.mma(atom, a[mt], atom.b_fragment(w[2:4]), s[mt][2 * n_pair + 1])
    return [tiled(x) for x in s]


def accumulate_pv(atom, p, o, vbuf, lane, cfg):
    """O += P V for each M tile: P rounded to the input dtype in the same lanes, V by ldmatrix.trans."""
    o = [list(x) for x in o]
    for kk in range(cfg.warp_keys // 16):
        pa = [ty.pack_operand_a(atom, p[mt], 0, kk) for mt in range(cfg.row_tiles)]
        for d_pair in range(cfg.head_dim // 16):
            key, chunk = v_operand_row_chunk(lane, kk, d_pair)
            w = ty.ldmatrix(vbuf + decode_swizzle(key, chunk, cfg.head_dim), 4, trans=True)
            for mt in range(cfg.row_tiles):
                o[mt][2 * d_pair] = ty.mma(atom, pa[mt], atom.b_fragment(w[0:2]), o[mt][2 * d_pair])
                o[mt][2 * d_pair + 1] = ty.mma(atom, pa[mt], atom.b_fragment(w[2:4]), o[mt][2 * d_pair + 1])
    return o


@ty.func
def mask_block(s, key0, limits, lane):
    """-inf where key key0 + c is past its row's last visible key (``limits`` per row slot)."""
    vals = []
    for i in range(len(s)):
        _, c = s.layout.coord(0, lane, i)
        vals.append(ty.select(key0 + c <= limits[s.layout.row_slots[i]], s.values[i], NEG_INF))
    return s.with_data(vals)


# -- queries: rows r = i * G + g of the kv head's group --------------------------------------------------------

@ty.func
def row_position(row, n_rows, group):
    """(query position i, head in group g, row exists) of CTA row ``row``."""
    i = row // group
    return i, row - i * group, row < n_rows


@ty.func
def load_q(q, rows, lane, cfg):
    """The A fragments of Q for each M tile (D / 16 k-steps); rows past n_rows read as zeros."""
    words = ty.ptr_cast(q.ptr, ty.b32)
    atom = ty.MmaSyncAtom(cfg.dtype)
    tiles = []
    for mt in range(cfg.row_tiles):
        offsets = []
        oks = []
        for half in range(2):  # A rows g and g + 8
            row, _ = ty.MMA_SYNC_A.coord(0, lane, 2 * half)
            i, g, ok = row_position(rows.row0 + 16 * mt + row, rows.n_rows, rows.group)
            oks.append(ok)
            offsets.append(head_row(q, rows.b, i, rows.h0 + g))
        frags = []
        for kk in range(cfg.head_dim // 16):
            regs = []
            for r in range(4):
                _, col = ty.MMA_SYNC_A.coord(0, lane, 2 * r)
                off = offsets[r & 1] + ty.cast(col + 16 * kk, ty.i64)
                regs.append(ty.load(words + (off >> 1), mask=oks[r & 1]))
            frags.append(atom.a_fragment(regs))
        tiles.append(frags)
    return tiles


@ty.func
def stage_q(q, rows, qbuf, tid, cfg):
    """Q_SMEM: the CTA's 16 * ROW_TILES query rows into shared memory (swizzled like K; rows past
    n_rows zero), for ldmatrix to read per key block instead of holding Q in registers."""
    chunks = cfg.head_dim // 8
    total = 16 * cfg.row_tiles * chunks
    for p in range((total + cfg.threads - 1) // cfg.threads):
        idx = tid + p * cfg.threads
        r = idx // chunks
        c = idx - r * chunks
        i, g, ok = row_position(rows.row0 + r, rows.n_rows, rows.group)
        src = q.ptr + (head_row(q, rows.b, i, rows.h0 + g) + ty.cast(c * 8, ty.i64))
        if idx < total:
            ty.store(ty.ptr_cast(qbuf + decode_swizzle(r, c, cfg.head_dim), ty.i16), ty.load(src, vec=8, mask=ok))


def q_from_smem(atom, qbuf, lane, mt, kk, head_dim):
    """The A operand of M tile ``mt``, k-step ``kk`` by one ldmatrix.x4: matrices (rows 0-7 | 8-15) x
    (k 0-7 | 8-15) in the order a0..a3; lane l gives row l % 8 + 8 ((l >> 3) & 1), chunk 2 kk + l >> 4."""
    row = 16 * mt + (lane & 7) + 8 * ((lane >> 3) & 1)
    chunk = 2 * kk + (lane >> 4)
    return atom.a_fragment(ty.ldmatrix(qbuf + decode_swizzle(row, chunk, head_dim), 4, trans=False))


@ty.func
def row_limits(rows, kv_len, causal, lane, row_tiles):
    """Per M tile, the last visible key of the lane's two C rows (bottom-right causal alignment)."""
    out = []
    for mt in range(row_tiles):
        lim = []
        for half in range(2):
            r, _ = ty.MMA_SYNC_C.coord(0, lane, 2 * half)
            i, _g, _ok = row_position(rows.row0 + 16 * mt + r, rows.n_rows, rows.group)
            last = kv_len - 1
            if causal != 0:
                last = ty.minimum(i + (kv_len - rows.n_q), last)
            lim.append(last)
        out.append(lim)
    return out


# -- the warps' merge through shared memory -------------------------------------------------------------------

def _slot(lane_base, idx):
    return lane_base + idx * 32


@ty.func
def spill_state(buf, warp, lane, states, o, cfg):
    """Warp ``warp``'s m, partial l and O into its part of ``buf`` (f32, [warp][value][lane])."""
    nv = merge_values(cfg.head_dim, cfg.row_tiles)
    base = warp * (nv * 32) + lane
    idx = 0
    for mt in range(cfg.row_tiles):
        for x in list(states[mt].maximum.values) + list(states[mt].sum.values) + list(tiled(o[mt]).values):
            buf[_slot(base, idx)] = x
            idx += 1


@ty.func
def merged_slice(buf, warp, lane, states, scale, cfg):
    """The warps' states merged with softmax_merge, and this warp's slice of O (atoms
    [warp * A / WARPS, (warp + 1) * A / WARPS) of each M tile) rescaled to match: (state, o slice)."""
    head_dim = cfg.head_dim
    nv = merge_values(head_dim, cfg.row_tiles)
    per = (head_dim // 8) // cfg.warps
    first = warp * per  # run-time: the slice's first atom
    out_states = []
    out_o = []
    for mt in range(cfg.row_tiles):
        m_off = mt * (4 + head_dim // 2)
        acc_state = None
        acc = None
        for src in range(cfg.warps):
            base = src * (nv * 32) + lane
            m = [buf[_slot(base, m_off + j)] for j in range(2)]
            l = [buf[_slot(base, m_off + 2 + j)] for j in range(2)]
            st = ty.SoftmaxState(states[mt].maximum.with_data(m), states[mt].sum.with_data(l), partial_sum=True)
            vals = [buf[_slot(base, m_off + 4 + first * 4 + j)] for j in range(per * 4)]
            if acc_state is None:
                acc_state, acc = st, vals
            else:
                acc_state, ra, rb = ty.softmax_merge(acc_state, st, scale)
                acc = [a * ra.values[(j % 4) >> 1] + x * rb.values[(j % 4) >> 1] for j, (a, x) in
                       enumerate(zip(acc, vals))]
        out_states.append(acc_state)
        out_o.append(ty.Fragment(tuple(acc), ty.QUAD, ty.tiled_mma_c(1, per)))
    return out_states, out_o


# -- merging split partials: (O_s, LSE_s) as summaries (m = LSE_s, l = 1) in natural-log units --------------

MERGE_UNROLL = 16  # partials loaded together: the loads of a group are in flight at once


@ty.func
def merge_partials(dest, prow, d0, head_dim):
    """Four columns d0 .. d0 + 3 of one row's merged output and its LSE, over the row's partials
    (as many as ``dest.lse_part`` has splits).

    The partials are read in groups of MERGE_UNROLL (all loads of a group issued before the first
    merge, so a group costs one memory latency); within a group they are merged in split order
    with ``softmax_merge``; slots past num_splits read as empty partials (LSE -inf, O 0)."""
    num_splits = ty.cast(dest.lse_part.shape[1], ty.i32)
    zero = ty.cast(0.0, ty.f32)
    own = ty.LocalOwnership(2, 1)
    state = ty.SoftmaxState(ty.Fragment((ty.cast(NEG_INF, ty.f32),), own), ty.Fragment((zero,), own))
    acc = ty.Fragment((zero, zero, zero, zero), ty.LocalOwnership(2, 4))
    row64 = ty.cast(prow, ty.i64)
    lse_row = row64 * dest.lse_part.stride[0]
    o_row = row64 * dest.o_part.stride[0] + ty.cast(d0, ty.i64)
    for g in range((num_splits + (MERGE_UNROLL - 1)) // MERGE_UNROLL):
        # the group's loads at constant offsets from its first split's addresses
        first = ty.cast(g * MERGE_UNROLL, ty.i64)
        lse_at = dest.lse_part.ptr + (lse_row + first)
        o_at = dest.o_part.ptr + (o_row + first * head_dim)
        lses = []
        outs = []
        for u in range(MERGE_UNROLL):
            ok = g * MERGE_UNROLL + u < num_splits
            lses.append(ty.select(ok, ty.load(lse_at + u, mask=ok), NEG_INF))
            outs.append(ty.load(o_at + u * head_dim, vec=4, mask=ok))
        for u in range(MERGE_UNROLL):
            lse = lses[u]
            part = ty.SoftmaxState(ty.Fragment((lse,), own),
                                   ty.Fragment((ty.select(lse > NEG_INF, 1.0, 0.0),), own))
            state, ra, rb = ty.softmax_merge(state, part, 1.0)
            a = ra.values[0]
            b = rb.values[0]
            acc = acc.with_data([x * a + y * b for x, y in zip(acc.values, outs[u])])
    result = ty.softmax_normalize(acc, state)
    return result.values, ty.softmax_lse(state, 1.0).values[0]


@ty.func
def store_merged(dest, row, vals, lse, d0):
    """Four output columns of row ``row`` = (b, i, h) as two packed words (one 8-byte store); the
    LSE from the d0 = 0 thread."""
    b, i, h = row
    words = ty.ptr_cast(dest.out.ptr + (head_row(dest.out, b, i, h) + ty.cast(d0, ty.i64)), ty.b32)
    ty.store(words, (ty.pack2(vals[0], vals[1], dest.dtype), ty.pack2(vals[2], vals[3], dest.dtype)))
    if dest.return_lse:
        if d0 == 0:
            dest.lse[b, h, i] = lse


@ty.func
def output_row(b, i, h, n_q, n_heads):
    """The row of the partials of (b, h, i): its index in (B, H_q, n_q) order, the LSE's."""
    return (b * n_heads + h) * n_q + i


@ty.func
def store_slice(dest, rows, warp, lane, split, results, cfg):
    """This warp's slice of the CTA's rows: fp32 partials (SPLIT) or the output in the input dtype.
    ``results``: (O slices, LSE states) per M tile."""
    o, lse = results
    t = lane & 3
    first_atom = warp * ((cfg.head_dim // 8) // cfg.warps)
    for mt in range(cfg.row_tiles):
        for half in range(2):
            r, _ = ty.MMA_SYNC_C.coord(0, lane, 2 * half)
            i, g, ok = row_position(rows.row0 + 16 * mt + r, rows.n_rows, rows.group)
            if ok:
                vals = o[mt].values
                if cfg.split:
                    prow = ty.cast(output_row(rows.b, i, rows.h0 + g, rows.n_q, rows.n_heads), ty.i64)
                    part = prow * dest.o_part.stride[0] + ty.cast(split * cfg.head_dim, ty.i64)
                    for a in range(len(vals) // 4):
                        col = (first_atom + a) * 8 + 2 * t
                        ty.store(dest.o_part.ptr + (part + ty.cast(col, ty.i64)),
                                 (vals[4 * a + 2 * half], vals[4 * a + 2 * half + 1]))
                    if (t == 0) & (warp == 0):
                        dest.lse_part[prow, split] = lse[mt].values[half]
                else:
                    words = ty.ptr_cast(dest.out.ptr, ty.b32)
                    base = head_row(dest.out, rows.b, i, rows.h0 + g)
                    for a in range(len(vals) // 4):
                        col = (first_atom + a) * 8 + 2 * t
                        words[(base + ty.cast(col, ty.i64)) >> 1] = ty.pack2(vals[4 * a + 2 * half],
                                                                             vals[4 * a + 2 * half + 1], dest.dtype)
                    if dest.return_lse:
                        if (t == 0) & (warp == 0):
                            dest.lse[rows.b, rows.h0 + g, i] = lse[mt].values[half]


@ty.func
def fused_merge(smem_flag, dest, rows, counter, tid, cfg):
    """FUSED_MERGE: count this CTA's arrival; the last CTA of the (kv head, batch) merges its rows.

    Every thread's partial stores precede the barrier, the barrier precedes thread 0's acq_rel
    add, which the last arrival's add acquires: the last CTA reads every other CTA's partials.
    The last arrival also resets the counter to zero for the next launch.
    """
    ty.syncthreads()
    if tid == 0:
        old = ty.atomic_add(counter, 1, sem="acq_rel")
        last = old == ty.cast(dest.lse_part.shape[1], ty.i32) - 1
        smem_flag[0] = ty.select(last, 1, 0)
        if last:
            counter[0] = 0
    ty.syncthreads()
    if smem_flag[0] != 0:
        chunks = cfg.head_dim // 4
        items = 16 * cfg.row_tiles * chunks
        for p in range((items + cfg.threads - 1) // cfg.threads):
            it = tid + p * cfg.threads
            r = it // chunks
            d0 = (it - r * chunks) * 4
            i, g, ok = row_position(rows.row0 + r, rows.n_rows, rows.group)
            if ok & (it < items):
                h = rows.h0 + g
                vals, lse = merge_partials(dest, output_row(rows.b, i, h, rows.n_q, rows.n_heads), d0, cfg.head_dim)
                store_merged(dest, (rows.b, i, h), vals, lse, d0)


def _max_registers(MAX_REGISTERS=0, **_):
    return MAX_REGISTERS or None


@ty.kernel(threads=_threads, arch="sm_80", max_registers=_max_registers, noalias=True)
def attention_decode_fwd(
    q: TOKENS, k: TOKENS, v: TOKENS, out: TOKENS, lse: ROW_LSE, o_part: PARTIALS, lse_part: PARTIAL_LSE,
    seqlens: SEQLENS, block_table: TABLE, counters: COUNTERS, status: STATUS,
    kv_group: ty.i32, scale: ty.f32, causal: ty.i32,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 128, WARPS: ty.constexpr = 4,
    WARP_KEYS: ty.constexpr = 16, STAGES: ty.constexpr = 4, ROW_TILES: ty.constexpr = 1,
    PAGED: ty.constexpr = False, SPLIT: ty.constexpr = False, FUSED_MERGE: ty.constexpr = False,
    RETURN_LSE: ty.constexpr = False, Q_SMEM: ty.constexpr = False, MAX_REGISTERS: ty.constexpr = 0,
):
    """One CTA: key tiles [t0, t0 + count) of sequence b for the rows of kv head hk (grid: splits, H_kv x row
    blocks, B; SPLIT: as many splits as lse_part has). k/v are (B, N_max, H_kv, D), or with PAGED pages
    (num_pages, page_size, H_kv, D) and block_table (B, max_pages); the placeholders of unused tensors
    (no LSE, no partials, no table, no counters) are never read."""
    cfg = Config(DTYPE, HEAD_DIM, warps=WARPS, warp_keys=WARP_KEYS, row_tiles=ROW_TILES, paged=PAGED, split=SPLIT)
    lane = ty.lane_id()
    warp = ty.warp_idx()
    tid = ty.thread_idx()
    split = ty.block_idx(0)
    n_q = ty.cast(q.shape[1], ty.i32)
    n_rows = n_q * kv_group
    row_blocks = (n_rows + (16 * ROW_TILES - 1)) // (16 * ROW_TILES)
    hk = ty.block_idx(1) // row_blocks
    rb = ty.block_idx(1) - hk * row_blocks
    b = ty.block_idx(2)
    b64 = ty.cast(b, ty.i64)
    hk64 = ty.cast(hk, ty.i64)
    rows = Rows(b, hk * kv_group, kv_group, n_q, n_rows, rb * (16 * ROW_TILES), ty.cast(q.shape[2], ty.i32))
    if PAGED:
        page_size = ty.cast(k.shape[1], ty.i32)
        cache = Cache(k, v, hk64 * k.stride[2], hk64 * v.stride[2], block_table, b, page_size)
        capacity = k.shape[1] * block_table.shape[1]
    else:
        cache = Cache(k, v, b64 * k.stride[0] + hk64 * k.stride[2], b64 * v.stride[0] + hk64 * v.stride[2],
                      block_table, b, 0)
        capacity = k.shape[1]
    # The capacity (pages x table width) is 64-bit; the length clamped to it fits i32, as seqlens does.
    kv_len = ty.cast(ty.minimum(ty.cast(ty.maximum(seqlens[b], 0), ty.i64), capacity), ty.i32)
    num_splits = ty.cast(lse_part.shape[1], ty.i32) if SPLIT else 1
    block_n = cfg.block_n
    n_tiles = (kv_len + (block_n - 1)) // block_n
    per_split = (n_tiles + num_splits - 1) // num_splits
    t0 = split * per_split
    count = ty.maximum(ty.minimum(t0 + per_split, n_tiles) - t0, 0)

    total = smem_bytes(HEAD_DIM=HEAD_DIM, WARPS=WARPS, WARP_KEYS=WARP_KEYS, STAGES=STAGES, ROW_TILES=ROW_TILES,
                       Q_SMEM=Q_SMEM)
    smem = ty.dynamic_shared(ty.u8, total, align=128)
    sb = stage_bytes(WARP_KEYS, HEAD_DIM)
    ring = smem + warp * (STAGES * sb)
    first_key = t0 * block_n + warp * WARP_KEYS
    if PAGED:
        if warp_meets_bad_page(cache, status, first_key, count, kv_len, lane, block_n):
            count = 0
    # The K/V stream starts first; Q's load and the row limits overlap its latency.
    for s in range(STAGES - 1):
        if s < count:
            copy_kv_block(cache, ring, s, first_key + s * block_n, kv_len, lane, cfg)
        ty.cp_async_commit()
    if Q_SMEM:
        qa = smem + (total - 16 - q_tile_bytes(HEAD_DIM, ROW_TILES, True))
        stage_q(q, rows, qa, tid, cfg)
        ty.syncthreads()
    else:
        qa = load_q(q, rows, lane, cfg)
    limits = row_limits(rows, kv_len, causal, lane, ROW_TILES)
    all_visible = kv_len - ty.select(causal != 0, n_q - 1, 0)  # keys below it: visible to every row
    atom = ty.MmaSyncAtom(DTYPE)
    states = [ty.SoftmaxState(tiled([zero_atom() for _ in range(WARP_KEYS // 8)]), partial_sum=True)
              for _ in range(ROW_TILES)]
    o = [[zero_atom() for _ in range(HEAD_DIM // 8)] for _ in range(ROW_TILES)]
    for j in range(count):
        ty.cp_async_wait(STAGES - 2)
        ty.barrier_sync(1 + warp, 32)  # block j is in; every lane is done with block j - 1's stage
        nxt = j + (STAGES - 1)
        if nxt < count:
            copy_kv_block(cache, ring, nxt % STAGES, first_key + nxt * block_n, kv_len, lane, cfg)
        ty.cp_async_commit()
        kbuf = ring + (j % STAGES) * sb
        key0 = first_key + j * block_n
        s_tiles = scores(atom, qa, kbuf, lane, cfg)
        if key0 + WARP_KEYS > all_visible:
            s_tiles = [mask_block(s_tiles[mt], key0, limits[mt], lane) for mt in range(ROW_TILES)]
        p = []
        for mt in range(ROW_TILES):
            upd = ty.softmax_update(states[mt], s_tiles[mt], scale)
            states[mt] = upd.state
            o[mt] = atoms_of(tiled(o[mt]) * upd.rescale)
            p.append(upd.weights)
        o = accumulate_pv(atom, p, o, kbuf + WARP_KEYS * HEAD_DIM * 2, lane, cfg)

    ty.cp_async_wait(0)
    ty.syncthreads()  # every warp is done with its ring: the merge reuses the memory
    buf = ty.ptr_cast(smem, ty.f32)
    spill_state(buf, warp, lane, states, o, cfg)
    ty.syncthreads()
    merged, o_slice = merged_slice(buf, warp, lane, states, scale, cfg)
    result = [ty.softmax_normalize(o_slice[mt], merged[mt]) for mt in range(ROW_TILES)]
    row_lse = [ty.softmax_lse(merged[mt], scale) for mt in range(ROW_TILES)]
    dest = Dest(out, lse, o_part, lse_part, DTYPE, RETURN_LSE)
    store_slice(dest, rows, warp, lane, split, (result, row_lse), cfg)
    if FUSED_MERGE:
        flag = ty.ptr_cast(smem + (total - 16), ty.i32)
        fused_merge(flag, dest, rows, counters.address((b, ty.block_idx(1))), tid, cfg)


MERGE_THREADS = 128


@ty.kernel(threads=MERGE_THREADS, arch="sm_80", noalias=True)
def attention_decode_merge(
    o_part: PARTIALS, lse_part: PARTIAL_LSE, out: TOKENS, lse: ROW_LSE,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 128, RETURN_LSE: ty.constexpr = False,
):
    """One thread per four columns of an output row (the B * H_q * n_q rows of ``o_part``, in the
    order of ``output_row``): the split partials merged into out (B, n_q, H_q, D) and lse."""
    chunks = HEAD_DIM // 4
    it = ty.block_idx(0) * MERGE_THREADS + ty.thread_idx()
    prow = it // chunks
    d0 = (it - prow * chunks) * 4
    if prow < ty.cast(o_part.shape[0], ty.i32):
        n_q = ty.cast(out.shape[1], ty.i32)
        n_heads = ty.cast(out.shape[2], ty.i32)
        bh = prow // n_q
        i = prow - bh * n_q
        b = bh // n_heads
        h = bh - b * n_heads
        dest = Dest(out, lse, o_part, lse_part, DTYPE, RETURN_LSE)
        vals, row_lse = merge_partials(dest, prow, d0, HEAD_DIM)
        store_merged(dest, (b, i, h), vals, row_lse, d0)
