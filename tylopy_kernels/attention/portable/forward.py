"""Portable streaming attention (mma.sync, sm_80+): softmax(scale * Q K^T, masked) V, never storing scores.

What it computes. For (B, H, N, D) tensors q, k, v (bf16 or fp16, D in {16, 32, 64, 128}) it
writes ``out = softmax(scale * q k^T + mask) v`` and optionally the row log-sum-exp, with the
N x N scores living only in registers, one 16 x BLOCK_N tile per warp at a time. It is the
fallback of ``tylopy.attention`` wherever the Hopper kernel does not apply (head dims 16 and 32,
pre-Hopper GPUs, tensors TMA cannot describe, packed variable-length batches), and
``streaming_attention()`` (``portable_launch.py``, the host side) calls it directly. Its
backward is ``backward_portable.py``.

The algorithm, per warp (one warp owns BM = 16 query rows; a CTA of ``WARPS`` warps owns
16 * WARPS rows and shares each key/value tile between them):

1. Load the warp's 16 x D block of Q once, as the A operands of ``mma.sync.m16n8k16`` (D / 16
   k-steps of four b32 words per lane; rows past n_q read as zeros and are never stored).
2. For each key tile of BLOCK_N (32 or 64) rows: all threads copy K and V tiles to shared memory
   (``cp.async`` 16-byte copies, double-buffered, so tile j + 1 arrives while tile j is computed;
   rows past n_k are zero-filled, never read). The rows are XOR-swizzled in 16-byte chunks so
   that ``ldmatrix`` reads them without bank conflicts.
3. S = Q K^T with mma.sync: K rows are the N dimension of S, so one non-transposing
   ``ldmatrix.x4`` gives the B operands of two 8-key atoms for one 16-wide k-step.
4. Mask (only tiles that need it): keys at or past n_k, keys in the future of the query
   (causal: key_index <= query_index is kept), and keys the Boolean mask drops all become -inf.
5. The online softmax update (``ty.softmax_update``) of the FP32 state (m, l) per query row:
   m' = max(m, rowmax(S)), alpha = exp2((m - m') c), p = exp2(S c - m' c) with c = scale log2(e)
   (one FMA and one ``ex2`` per score, selects instead of branches, an empty row never computes
   -inf - (-inf)). l' = alpha l + rowsum(p) sums the unrounded p.
6. O = alpha O + P V: P is rounded to the input dtype in the same lanes (``ty.pack_operand_a``:
   the C fragments of S are exactly the A fragments of P), V's B operands come from
   ``ldmatrix.x4.trans``.
7. After the last tile: out = O / l (rows with l = 0, all keys masked, give zeros), LSE = m scale
   + ln l (-inf for such rows), stored only for rows < n_q.

The three carried states, per query row, all FP32: m is the largest score seen so far (in score
units, before scaling), l the sum of exp(scale (s - m)) over the keys seen so far, and a (the D
accumulators O) the same weights times the value rows. A new maximum multiplies both l and a by
alpha = exp(scale (m_old - m_new)); forgetting to rescale a is a real bug, not a rounding issue.

The worked example, one query, scale folded into the logits, natural exp (the numbers of
``tests/test_streaming_attention.py``): logits [0, 0] in the first tile, [log 2] in the second,
values [1, 3] then [10].

    after tile 1:  m = 0,  l = e^0 + e^0 = 2,              a = 1*1 + 1*3 = 4
    after tile 2:  m = log 2, alpha = e^(0 - log 2) = 1/2,
                   l = 1/2 * 2 + e^0 = 2,                  a = 1/2 * 4 + 1 * 10 = 12
    output         a / l = 6 = (1 + 3 + 2*10) / 4, the full softmax weights [1/4, 1/4, 1/2]
    forgetting to rescale a:  a = 4 + 10 = 14, 14 / 2 = 7   (wrong)

Causal attention only visits tiles up to the CTA's diagonal (the loop stops at
min(n_k, last row + 1 + n_k - n_q)); inside the CTA's last tiles, a warp whose rows all precede a tile sees
every score masked: p = 0 and alpha = exp2(0) = 1, so its state is left unchanged. Every real
query sees key 0, so its first tile has a finite maximum.

Constraints: q, k, v (B, H, N, D) with a contiguous last dim; strides on B, H and N that are
multiples of 8 elements on a 16-byte aligned base are used in place (a zero stride too: an
``expand`` view is read where it lies), anything else is copied once. K and V may have fewer
heads than Q (grouped-query attention): query head h reads key/value head h // kv_group.
Causal masking keeps key j for query i when j <= i + (n_k - n_q), the diagonal aligned to the
bottom-right corner as flash-attn does; the public API allows it only for n_q == n_k, where
that is the usual j <= i (packed variable-length batches use it per sequence). The optional
mask is Boolean and broadcastable to (B, H, n_q, n_k), True = take part; it is read through a
uint8 view whose broadcast dims have stride 0 (no copy). Batch and heads are grid dimensions
(at most 65535 each).

Variable-length batches (``VARLEN=True``): q, k, v are (total, H, D) packed sequences; grid
z walks the sequences, ``cu_q[b]``/``cu_k[b]`` (int32 prefix sums) give each one's first row
and length, and a CTA whose rows start past its sequence's end returns at once.

Arch: the kernel is written for sm_80 (mma.sync, ldmatrix, cp.async). The launcher compiles it
for the device's own arch when tylopy knows it (sm_80, sm_86, sm_89, sm_90), because the core's
launcher loads the ptxas cubin and SASS is not portable across those; on anything else it loads
the sm_80 PTX and lets the driver JIT it.

Every instruction is a public primitive: ``ty.cp_async`` (16-byte copies, zero fill past n_k)
with ``ty.cp_async_commit`` / ``ty.cp_async_wait``, ``ty.ldmatrix``, ``ty.mma`` on
``ty.MmaSyncAtom`` fragments; so the kernel the CPU emulator runs is the one the GPU runs.
``ASYNC_COPY=False`` runs the same double-buffered pipeline with plain ``ld.global`` /
``st.shared`` copies instead of ``cp.async`` (a reference path: the GPU tests check that both
paths give the same bits).

Run and check::

    tylopy dump tylopy_kernels/attention/portable/forward.py -D HEAD_DIM=64 -D BLOCK_N=64    # PTX + ptxas, no GPU
    tylopy dump tylopy_kernels/attention/portable/forward.py:attention_fwd_portable -D HEAD_DIM=128 -D BLOCK_N=32
    tylopy check streaming_attention                                          # needs a GPU
    tylopy bench streaming_attention --output results/streaming_attention.json
"""

import dataclasses
import math

import tylopy as ty


HEAD_DIMS = (16, 32, 64, 128)
BLOCK_NS = (32, 64)
# D=128 takes 32-key tiles: 32 KB of static shared memory for the double-buffered K/V ring (64-key
# tiles need 64 KB, dynamic shared memory, and more registers).
DEFAULT_BLOCK_N = {16: 64, 32: 64, 64: 64, 128: 32}
DEFAULT_WARPS = 4
# ptxas register cap (0: none). Uncapped, D=64 with 64-key tiles takes about 160 registers (three 4-warp
# CTAs per SM) and everything else at most 128; a cap of 128 makes that one spill.
DEFAULT_MAX_REGISTERS = 0
NEG_INF = float("-inf")
ROWS_PER_WARP = 16
STAGES = 2
MAX_GRID_YZ = 65535
STATIC_SMEM_LIMIT = 48 * 1024


# -- shared memory: swizzled K/V tiles ---------------------------------------------------------------

def swizzled_offset(row, chunk, head_dim: int):
    """Byte offset of 16-byte chunk ``chunk`` of tile row ``row`` (ints or IR values).

    A row holds C = head_dim / 8 chunks; chunk c of row r sits at chunk c ^ f(r), with f(r) =
    (r // (8 / C)) % min(C, 8). The 8 rows an ``ldmatrix`` reads (8 consecutive rows, one logical
    chunk) then land in 8 different 16-byte bank groups: no bank conflicts for C = 2, 4, 8 or 16
    (a 256-byte row of D = 128 spans the 128 bytes of banks twice; XOR with row % 8 on the low
    three chunk bits spreads 8 rows over the 8 groups as for C = 8).
    """
    chunks = head_dim // 8
    shift = {16: 0, 8: 0, 4: 1, 2: 2}[chunks]
    return row * (chunks * 16) + ((chunk ^ ((row >> shift) & (min(chunks, 8) - 1))) << 4)


@dataclasses.dataclass(frozen=True)
class Smem:
    """Byte offsets of the K and V tiles of each stage in the static shared memory."""

    block_n: int
    head_dim: int
    stages: int

    @property
    def tile_bytes(self) -> int:
        return self.block_n * self.head_dim * 2

    @property
    def stage_bytes(self) -> int:
        return 2 * self.tile_bytes

    @property
    def total(self) -> int:
        return self.stages * self.stage_bytes


def k_operand_row_chunk(lane, n_pair: int, kk: int):
    """(key row, 16-byte chunk) whose address ``lane`` gives to the ``ldmatrix.x4`` of K.

    Matrix i = lane // 8 of the x4 is (keys 16 n_pair + 8 (i >> 1) .. +7, d 16 kk + 8 (i & 1)
    .. +7); not transposed, lane (g, t) receives K[key g][d 2t, 2t+1] of each: registers 0, 1 are
    b0, b1 of the 8-key atom 2 n_pair and registers 2, 3 those of atom 2 n_pair + 1.
    """
    return 16 * n_pair + (lane & 7) + 8 * (lane >> 4), 2 * kk + ((lane >> 3) & 1)


def v_operand_row_chunk(lane, kk: int, d_pair: int):
    """(key row, chunk) for the ``ldmatrix.x4.trans`` of V (B of O += P V, k = key, n = d).

    Matrix i is (keys 16 kk + 8 (i & 1) .. +7, d 16 d_pair + 8 (i >> 1) .. +7); transposed, lane
    (g, t) receives V[key 2t, 2t+1][d g]: registers 0, 1 are b0, b1 of the d atom 2 d_pair,
    registers 2, 3 those of atom 2 d_pair + 1.
    """
    return 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * d_pair + (lane >> 4)


@ty.func
def copy_chunk(src, src_base, src_stride, smem, tile_off, key0, n_k, idx, head_dim, async_copy):
    """Copy 16-byte chunk ``idx`` of a BLOCK_N x D tile; rows at or past n_k become zeros."""
    chunks = head_dim // 8
    row = idx >> int(math.log2(chunks))
    chunk = idx & (chunks - 1)
    key = key0 + row
    ok = key < n_k
    g = src + (src_base + ty.cast(key, ty.i64) * src_stride + ty.cast(chunk * 8, ty.i64))
    off = tile_off + swizzled_offset(row, chunk, head_dim)
    if async_copy:
        # src_bytes 0 reads nothing and zero-fills the 16 bytes (the zfill form CUTLASS and Triton use for tails).
        ty.cp_async(smem + off, g, 16, src_bytes=ty.select(ok, 16, 0), cache="cg")
    else:
        ty.store(ty.ptr_cast(smem + off, ty.i16), ty.load(g, vec=8, mask=ok))


@ty.func
def copy_tile(src, src_base, src_stride, smem, tile_off, key0, n_k, tid, block_n, head_dim, threads, async_copy):
    total = block_n * head_dim // 8
    if total >= threads:
        for it in range(total // threads):
            copy_chunk(src, src_base, src_stride, smem, tile_off, key0, n_k, tid + it * threads, head_dim, async_copy)
    else:
        if tid < total:
            copy_chunk(src, src_base, src_stride, smem, tile_off, key0, n_k, tid, head_dim, async_copy)


@ty.func
def copy_kv(k, v, k_base, v_base, k_stride, v_stride, smem, stage_off, lay, key0, n_k, tid, threads, async_copy):
    """Start copying key tile ``key0`` (K and V) into the stage at ``stage_off``; one cp.async group."""
    copy_tile(k, k_base, k_stride, smem, stage_off, key0, n_k, tid, lay.block_n, lay.head_dim, threads, async_copy)
    copy_tile(v, v_base, v_stride, smem, stage_off + lay.tile_bytes, key0, n_k, tid, lay.block_n, lay.head_dim,
              threads, async_copy)
    if async_copy:
        ty.cp_async_commit()


# -- the warp's work on one key tile ---------------------------------------------------------------------

def zero_atom():
    zero = ty.cast(0.0, ty.f32)
    return ty.Fragment((zero,) * 4, ty.QUAD, ty.MMA_SYNC_C)


def tiled(atoms):
    """Accumulator atoms side by side along N as one fragment (tiled_mma_c(1, len(atoms)))."""
    vals = tuple(v for a in atoms for v in a.values)
    return ty.Fragment(vals, ty.QUAD, ty.tiled_mma_c(1, len(atoms)))


def atoms_of(frag):
    vals = frag.values
    return [ty.Fragment(tuple(vals[4 * n:4 * n + 4]), ty.QUAD, ty.MMA_SYNC_C) for n in range(len(vals) // 4)]


def score_tile(atom, qa, smem, k_off, lane, block_n, head_dim):
    """S = Q K^T for this warp's 16 rows and the tile's BLOCK_N keys (f32, tiled over 8-key atoms)."""
    s = [zero_atom() for _ in range(block_n // 8)]
    for n_pair in range(block_n // 16):
        for kk in range(head_dim // 16):
            key, chunk = k_operand_row_chunk(lane, n_pair, kk)
            w = ty.ldmatrix(smem + (k_off + swizzled_offset(key, chunk, head_dim)), 4, trans=False)
            s[2 * n_pair] = ty.mma(atom, qa[kk], atom.b_fragment(w[0:2]), s[2 * n_pair])
            s[2 * n_pair + 1] = ty.mma(atom, qa[kk], atom.b_fragment(w[2:4]), s[2 * n_pair + 1])
    return tiled(s)


def pv_tile(atom, p, o, smem, v_off, lane, block_n, head_dim):
    """O += P V: P rounded to the input dtype in the same lanes, V's operands by ldmatrix.trans."""
    o = list(o)
    for kk in range(block_n // 16):
        pa = ty.pack_operand_a(atom, p, 0, kk)
        for d_pair in range(head_dim // 16):
            key, chunk = v_operand_row_chunk(lane, kk, d_pair)
            w = ty.ldmatrix(smem + (v_off + swizzled_offset(key, chunk, head_dim)), 4, trans=True)
            o[2 * d_pair] = ty.mma(atom, pa, atom.b_fragment(w[0:2]), o[2 * d_pair])
            o[2 * d_pair + 1] = ty.mma(atom, pa, atom.b_fragment(w[2:4]), o[2 * d_pair + 1])
    return o


@ty.func
def mask_scores(s, row0, col0, lane, n_q, n_k, causal, causal_off, mask_args, has_mask, keys_on_rows=False):
    """-inf where a key is past n_k, in the query's future (causal: key > query + causal_off), or
    dropped by the mask. ``keys_on_rows``: the tile is S^T (rows are keys, columns queries, as in
    the backward's dK/dV kernel), and queries past n_q are masked too."""
    vals = []
    for i in range(len(s)):
        r, c = s.layout.coord(0, lane, i)
        query, key = (col0 + c, row0 + r) if keys_on_rows else (row0 + r, col0 + c)
        ok = (key < n_k) & ((causal == 0) | (key <= query + causal_off))
        if keys_on_rows:
            ok = ok & (query < n_q)
        if has_mask:
            mask, m_base, m_stride_q, m_stride_k = mask_args
            flag = ty.load(mask + (m_base + ty.cast(query, ty.i64) * m_stride_q + ty.cast(key, ty.i64) * m_stride_k),
                           mask=ok & (query < n_q))
            ok = ok & (flag != 0)
        vals.append(ty.select(ok, s.values[i], NEG_INF))
    return s.with_data(vals)


@ty.func
def maybe_mask(s, row0, col0, lane, n_q, n_k, causal, causal_off, mask_args, has_mask, block_n):
    """Mask only the tiles that need it: the ragged last tile, the causal diagonal, a user mask."""
    if has_mask:
        s = mask_scores(s, row0, col0, lane, n_q, n_k, causal, causal_off, mask_args, has_mask)
    else:
        needs_mask = (col0 + block_n > n_k) | ((causal != 0) & (col0 + (block_n - 1) > row0 + causal_off))
        if needs_mask:
            s = mask_scores(s, row0, col0, lane, n_q, n_k, causal, causal_off, mask_args, has_mask)
    return s


@ty.func
def load_q(q, q_base, q_stride, row0, n_q, lane, head_dim, dtype):
    """This warp's 16 x D block of Q as D/16 A fragments; rows past n_q read as zeros."""
    words = ty.ptr_cast(q, ty.b32)
    atom = ty.MmaSyncAtom(dtype)
    frags = []
    for kk in range(head_dim // 16):
        regs = []
        for r in range(4):
            row, col = ty.MMA_SYNC_A.coord(0, lane, 2 * r)  # the low half of a_r; the high half is col + 1
            qrow = row0 + row
            offset = q_base + ty.cast(qrow, ty.i64) * q_stride + ty.cast(col + 16 * kk, ty.i64)
            regs.append(ty.load(words + (offset >> 1), mask=qrow < n_q))
        frags.append(atom.a_fragment(regs))
    return frags


@ty.func
def store_output(o, lse, out, lse_ptr, row0, n_q, o_base, o_stride, lse_base, lane, dtype, return_lse):
    """Rows < n_q only: each lane packs its two adjacent columns into one b32 store."""
    words = ty.ptr_cast(out, ty.b32)
    vals = o.values
    for half in range(2):  # rows g and g + 8 of the warp's 16
        r, _ = o.layout.coord(0, lane, 2 * half)
        row = row0 + r
        if row < n_q:
            for i in range(2 * half, len(vals), 4):
                _, c = o.layout.coord(0, lane, i)
                offset = o_base + ty.cast(row, ty.i64) * o_stride + ty.cast(c, ty.i64)
                words[offset >> 1] = ty.pack2(vals[i], vals[i + 1], dtype)
    if return_lse:
        if (lane & 3) == 0:
            for slot in range(len(lse)):
                r, _ = lse.layout.coord(0, lane, slot)
                row = row0 + r
                if row < n_q:
                    lse_ptr[lse_base + ty.cast(row, ty.i64)] = lse.values[slot]


# -- the kernels ------------------------------------------------------------------------------------------

def _threads(WARPS=DEFAULT_WARPS, **_):
    return 32 * WARPS


def _max_registers(MAX_REGISTERS=DEFAULT_MAX_REGISTERS, **_):
    return MAX_REGISTERS or None


def shared_bytes(nbytes: int):
    """``nbytes`` of shared memory, 128-byte aligned: static up to 48 KB, dynamic (opted in at launch) beyond."""
    if nbytes <= STATIC_SMEM_LIMIT:
        return ty.shared(ty.u8, nbytes, align=128)
    return ty.dynamic_shared(ty.u8, nbytes, align=128)


@ty.func
def attend_rows(q, k, v, out, lse_ptr, mask, seq, n_q, n_k, h, kv_group, scale, causal, strides,
                DTYPE, HEAD_DIM, BLOCK_N, WARPS, HAS_MASK, RETURN_LSE, ASYNC_COPY):
    """The CTA's WARPS x 16 query rows of head ``h`` of sequence ``seq`` = (batch, first query row,
    first key row); ``strides`` = (q, k, v, out: (b, h, n) each; lse: (b, h); mask: (b, h, q, k))."""
    qs, ks, vs, os_, ls, ms = strides
    threads = 32 * WARPS
    rows = ROWS_PER_WARP * WARPS
    lay = Smem(BLOCK_N, HEAD_DIM, STAGES)
    smem = shared_bytes(lay.total)
    atom = ty.MmaSyncAtom(DTYPE)
    tid = ty.thread_idx()
    lane = ty.lane_id()
    warp = ty.warp_idx()
    # Longest query blocks first: under causal masking the last blocks carry the most tiles.
    m0 = (ty.grid_dim(0) - 1 - ty.block_idx(0)) * rows
    row0 = m0 + warp * ROWS_PER_WARP
    causal_off = n_k - n_q
    kv_end = n_k
    if causal != 0:
        kv_end = ty.minimum(n_k, ty.maximum(m0 + rows + causal_off, 0))  # stop at the diagonal
    n_tiles = (kv_end + (BLOCK_N - 1)) // BLOCK_N
    b, q_start, k_start = seq
    b64 = ty.cast(b, ty.i64)
    h64 = ty.cast(h, ty.i64)
    hk64 = ty.cast(h // kv_group, ty.i64)
    q0 = ty.cast(q_start, ty.i64)
    k0 = ty.cast(k_start, ty.i64)
    k_base = b64 * ks[0] + hk64 * ks[1] + k0 * ks[2]
    v_base = b64 * vs[0] + hk64 * vs[1] + k0 * vs[2]
    mask_args = (mask, b64 * ms[0] + h64 * ms[1], ms[2], ms[3])

    qa = load_q(q, b64 * qs[0] + h64 * qs[1] + q0 * qs[2], qs[2], row0, n_q, lane, HEAD_DIM, DTYPE)
    state = ty.SoftmaxState(tiled([zero_atom() for _ in range(BLOCK_N // 8)]), partial_sum=True)
    o = [zero_atom() for _ in range(HEAD_DIM // 8)]

    copy_kv(k, v, k_base, v_base, ks[2], vs[2], smem, 0, lay, 0, n_k, tid, threads, ASYNC_COPY)
    for j in range(n_tiles):
        stage_off = (j & 1) * lay.stage_bytes
        if ASYNC_COPY:
            ty.cp_async_wait(0)
        ty.syncthreads()  # tile j is visible, and every warp is done with tile j - 1's buffer
        if j + 1 < n_tiles:
            copy_kv(k, v, k_base, v_base, ks[2], vs[2], smem, ((j + 1) & 1) * lay.stage_bytes, lay,
                    (j + 1) * BLOCK_N, n_k, tid, threads, ASYNC_COPY)
        s = score_tile(atom, qa, smem, stage_off, lane, BLOCK_N, HEAD_DIM)
        s = maybe_mask(s, row0, j * BLOCK_N, lane, n_q, n_k, causal, causal_off, mask_args, HAS_MASK, BLOCK_N)
        upd = ty.softmax_update(state, s, scale)
        state = upd.state
        o = atoms_of(tiled(o) * upd.rescale)
        o = pv_tile(atom, upd.weights, o, smem, stage_off + lay.tile_bytes, lane, BLOCK_N, HEAD_DIM)

    result = ty.softmax_normalize(tiled(o), state)
    lse = ty.softmax_lse(state, scale) if RETURN_LSE else None
    o_base = b64 * os_[0] + h64 * os_[1] + q0 * os_[2]
    lse_base = b64 * ls[0] + h64 * ls[1] + q0
    store_output(result, lse, out, lse_ptr, row0, n_q, o_base, os_[2], lse_base, lane, DTYPE, RETURN_LSE)


@ty.kernel(threads=_threads, arch="sm_80", max_registers=_max_registers, noalias=True)
def streaming_attention_fwd(
    q: ty.ptr(ty.i16), k: ty.ptr(ty.i16), v: ty.ptr(ty.i16), out: ty.ptr(ty.i16),
    lse_ptr: ty.ptr(ty.f32), mask: ty.ptr(ty.u8),
    n_q: ty.i32, n_k: ty.i32, n_heads: ty.i32, scale: ty.f32, causal: ty.i32,
    q_stride_b: ty.i64, q_stride_h: ty.i64, q_stride_n: ty.i64,
    k_stride_b: ty.i64, k_stride_h: ty.i64, k_stride_n: ty.i64,
    v_stride_b: ty.i64, v_stride_h: ty.i64, v_stride_n: ty.i64,
    o_stride_b: ty.i64, o_stride_h: ty.i64, o_stride_n: ty.i64,
    m_stride_b: ty.i64, m_stride_h: ty.i64, m_stride_q: ty.i64, m_stride_k: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 64,
    WARPS: ty.constexpr = DEFAULT_WARPS, HAS_MASK: ty.constexpr = False, RETURN_LSE: ty.constexpr = False,
    ASYNC_COPY: ty.constexpr = True, MAX_REGISTERS: ty.constexpr = DEFAULT_MAX_REGISTERS,
):
    """One CTA: WARPS x 16 query rows of one (batch, head), as many K/V heads as Q heads, LSE
    (B, H, n_q) contiguous; ASYNC_COPY=False copies with ld/st. ``attention_fwd_portable`` is the
    general form (grouped heads, LSE strides, packed sequences)."""
    lse_strides = (ty.cast(n_heads, ty.i64) * ty.cast(n_q, ty.i64), ty.cast(n_q, ty.i64))
    strides = ((q_stride_b, q_stride_h, q_stride_n), (k_stride_b, k_stride_h, k_stride_n),
               (v_stride_b, v_stride_h, v_stride_n), (o_stride_b, o_stride_h, o_stride_n), lse_strides,
               (m_stride_b, m_stride_h, m_stride_q, m_stride_k))
    attend_rows(q, k, v, out, lse_ptr, mask, (ty.block_idx(2), 0, 0), n_q, n_k, ty.block_idx(1), 1, scale, causal,
                strides, DTYPE, HEAD_DIM, BLOCK_N, WARPS, HAS_MASK, RETURN_LSE, ASYNC_COPY)


@ty.kernel(threads=_threads, arch="sm_80", max_registers=_max_registers, noalias=True)
def attention_fwd_portable(
    q: ty.ptr(ty.i16), k: ty.ptr(ty.i16), v: ty.ptr(ty.i16), out: ty.ptr(ty.i16),
    lse_ptr: ty.ptr(ty.f32), mask: ty.ptr(ty.u8), cu_q: ty.ptr(ty.i32), cu_k: ty.ptr(ty.i32),
    n_q: ty.i32, n_k: ty.i32, kv_group: ty.i32, scale: ty.f32, causal: ty.i32,
    q_stride_b: ty.i64, q_stride_h: ty.i64, q_stride_n: ty.i64,
    k_stride_b: ty.i64, k_stride_h: ty.i64, k_stride_n: ty.i64,
    v_stride_b: ty.i64, v_stride_h: ty.i64, v_stride_n: ty.i64,
    o_stride_b: ty.i64, o_stride_h: ty.i64, o_stride_n: ty.i64,
    lse_stride_b: ty.i64, lse_stride_h: ty.i64,
    m_stride_b: ty.i64, m_stride_h: ty.i64, m_stride_q: ty.i64, m_stride_k: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 64,
    WARPS: ty.constexpr = DEFAULT_WARPS, HAS_MASK: ty.constexpr = False, RETURN_LSE: ty.constexpr = False,
    ASYNC_COPY: ty.constexpr = True, MAX_REGISTERS: ty.constexpr = DEFAULT_MAX_REGISTERS,
    VARLEN: ty.constexpr = False,
):
    """Grid (query blocks, query heads, batch or sequences). Query head h reads K/V head
    h // kv_group. With VARLEN the tensors are packed (total, H, D) rows (stride_b unused, 0) and
    sequence b spans rows cu_q[b] .. cu_q[b + 1] (keys likewise); n_q and n_k are not read."""
    b = ty.block_idx(2)
    strides = ((q_stride_b, q_stride_h, q_stride_n), (k_stride_b, k_stride_h, k_stride_n),
               (v_stride_b, v_stride_h, v_stride_n), (o_stride_b, o_stride_h, o_stride_n),
               (lse_stride_b, lse_stride_h), (m_stride_b, m_stride_h, m_stride_q, m_stride_k))
    args = (DTYPE, HEAD_DIM, BLOCK_N, WARPS, HAS_MASK, RETURN_LSE, ASYNC_COPY)
    if VARLEN:
        q_start = cu_q[b]
        k_start = cu_k[b]
        seq_q = cu_q[b + 1] - q_start
        seq_k = cu_k[b + 1] - k_start
        if (ty.grid_dim(0) - 1 - ty.block_idx(0)) * (ROWS_PER_WARP * WARPS) < seq_q:  # else past the end
            attend_rows(q, k, v, out, lse_ptr, mask, (b, q_start, k_start), seq_q, seq_k, ty.block_idx(1),
                        kv_group, scale, causal, strides, *args)
    else:
        attend_rows(q, k, v, out, lse_ptr, mask, (b, 0, 0), n_q, n_k, ty.block_idx(1), kv_group, scale, causal,
                    strides, *args)
