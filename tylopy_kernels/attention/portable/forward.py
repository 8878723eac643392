"""Portable streaming attention (mma.sync, sm_80+): softmax(scale * Q K^T, masked) V, never storing scores.

What it computes. For (B, H, N, D) tensors q, k, v (bf16 or fp16, D in {16, 32, 64, 128}) it
writes ``out = softmax(scale * q k^T + mask) v`` and optionally the row log-sum-exp, with the
N x N scores living only in registers, one 16 x BLOCK_N tile per warp at a time. It is the
fallback of ``tylopy.attention`` wherever the Hopper kernel does not apply (head dims 16 and 32,
pre-Hopper GPUs, tensors TMA cannot describe, packed variable-length batches), and
``streaming_attention()`` (``launch.py``, the host side) calls it directly. Its backward is
``backward.py``.

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

Parameters: each tensor is one ``ty.tensor`` parameter, its pointer, shape and strides taken from
the torch tensor at launch, so a kernel reads every tensor through its own strides. q, k, v and
out are ``TOKENS`` (B, H, N, D) tensors of 16-bit elements (bf16 or fp16 bits seen as int16: the
DTYPE constexpr says which; 64-bit offsets; the last dim contiguous), the LSE is a ``ROW_STATS``
(B, H, n_q) f32 tensor and the mask a ``MASK`` (B, H, n_q, n_k) uint8 tensor; n_q and n_k are the
row counts of q and k. A tensor a specialization does not read (no mask, no LSE) is a placeholder.

Variable-length batches (``VARLEN=True``): q, k, v are (total, H, D) packed sequences, passed as
(B, H, total, D) views whose batch stride is 0 (the LSE (H, total) as (B, H, total)): sequence b
is batch entry b, every entry the same rows; grid z walks the sequences, ``cu_q[b]``/``cu_k[b]``
(int32 prefix sums) give each one's first row and length, and a CTA whose rows start past its
sequence's end returns at once.

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
from typing import Any, NamedTuple

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

# The tensor parameters (the backward's too). Tokens: 16-bit elements (the kernels read 32-bit words and
# 16-byte chunks, so bf16 and fp16 both travel as int16 and DTYPE says which), offsets in 64 bits (B x H x
# N x D passes 2^31 elements in long batches), the head dim contiguous (checked at launch; the word loads
# and cp.async need it). Row statistics: the LSE, delta and the LSE gradient. The mask is not contiguous:
# its broadcast dims, the key dim included, have stride 0.
TOKENS = ty.tensor(ty.i16, 4, index=ty.i64, contiguous=True)
ROW_STATS = ty.tensor(ty.f32, 3, index=ty.i64, contiguous=True)
MASK = ty.tensor(ty.u8, 4, index=ty.i64)


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


# -- rows of a tensor parameter and the copies into shared memory -----------------------------------------

class Rows(NamedTuple):
    """The rows of one (batch entry, head) of a tensor parameter from a first row on (a plain holder
    of IR values): ``t`` the TensorArg ((B, H, N, D) tokens or (B, H, N) row statistics), ``base``
    the element offset of the first row (i64) and ``n`` the rows that exist (i32; rows at or past
    it are never read or stored; None where the caller bounds them)."""

    t: Any
    base: Any
    n: Any = None

    def offset(self, row, col=None):
        """The element offset of (row, col), or of row for row statistics (64-bit)."""
        off = self.base + times_stride(row, self.t.stride[2])
        return off if col is None else off + ty.cast(col, ty.i64)

    def address(self, row, col=None):
        return self.t.ptr + self.offset(row, col)


def times_stride(i, stride):
    """i * stride in 64 bits; a contiguous dim's stride is the constant 1 and multiplies nothing."""
    i = ty.cast(i, ty.i64)
    return i if isinstance(stride, int) and stride == 1 else i * stride


def head_offset(t, b, h):
    """The element offset of head ``h`` of batch entry ``b`` of tensor ``t`` (64-bit)."""
    return times_stride(b, t.stride[0]) + times_stride(h, t.stride[1])


def head_rows(t, b, h, start, n=None) -> Rows:
    """Rows ``start`` .. of head ``h`` of batch entry ``b`` of tensor ``t`` (``n`` of them exist)."""
    return Rows(t, head_offset(t, b, h) + times_stride(start, t.stride[2]), n)


def seq_len(t):
    """The rows of a (B, H, N, D) tensor, as the i32 the kernels count rows in."""
    return ty.cast(t.shape[2], ty.i32)


class Seq(NamedTuple):
    """Where one sequence lies: ``b`` its batch coordinate (of packed sequences too: their views'
    batch stride is 0), its first query and key rows, and its n_q queries and n_k keys."""

    b: Any
    q_start: Any
    k_start: Any
    n_q: Any
    n_k: Any


def sequence(cu, q, k, varlen) -> Seq:
    """Batch entry or packed sequence ``block_idx(2)``: ``cu`` = (cu_q, cu_k), the int32 prefix
    sums read with ``varlen``; else q's and k's rows. (Packed sequences keep b, times the views'
    batch stride 0, as the kernels always did: with the constant 0 instead, ptxas spills 16 bytes
    of the D = 64 forward to fit it in 128 registers.)"""
    b = ty.block_idx(2)
    if varlen:
        cu_q, cu_k = cu
        q_start = cu_q[b]
        k_start = cu_k[b]
        return Seq(b, q_start, k_start, cu_q[b + 1] - q_start, cu_k[b + 1] - k_start)
    return Seq(b, 0, 0, seq_len(q), seq_len(k))


class Copier(NamedTuple):
    """Who copies tiles into the shared memory ``smem``: the CTA's ``threads`` threads (this one
    ``tid``), with 16-byte ``cp.async`` copies (``async_copy``) or ld.global / st.shared."""

    smem: Any
    tid: Any
    threads: int
    async_copy: bool


@ty.func
def copy_chunk(src, cp, tile_off, key0, idx, head_dim):
    """Copy 16-byte chunk ``idx`` of a tile of ``src`` (``Rows``) from row key0 on; rows at or past
    src.n become zeros."""
    chunks = head_dim // 8
    row = idx >> int(math.log2(chunks))
    chunk = idx & (chunks - 1)
    key = key0 + row
    n_k = src.n  # (keys, or the dK/dV kernel's queries)
    ok = key < n_k
    g = src.address(key, chunk * 8)
    off = tile_off + swizzled_offset(row, chunk, head_dim)
    if cp.async_copy:
        # src_bytes 0 reads nothing and zero-fills the 16 bytes (the zfill form CUTLASS and Triton use for tails).
        ty.cp_async(cp.smem + off, g, 16, src_bytes=ty.select(ok, 16, 0), cache="cg")
    else:
        ty.store(ty.ptr_cast(cp.smem + off, ty.i16), ty.load(g, vec=8, mask=ok))


@ty.func
def copy_tile(src, cp, tile_off, key0, block_n, head_dim):
    """Copy the block_n x D tile of ``src`` from row key0 on to byte ``tile_off`` of shared memory."""
    total = block_n * head_dim // 8
    if total >= cp.threads:
        for it in range(total // cp.threads):
            copy_chunk(src, cp, tile_off, key0, cp.tid + it * cp.threads, head_dim)
    else:
        if cp.tid < total:
            copy_chunk(src, cp, tile_off, key0, cp.tid, head_dim)


@ty.func
def copy_kv(kv, cp, stage_off, lay, key0):
    """Start copying key tile ``key0`` of ``kv`` = (K rows, V rows) into the stage at ``stage_off``;
    one cp.async group."""
    k_rows, v_rows = kv
    copy_tile(k_rows, cp, stage_off, key0, lay.block_n, lay.head_dim)
    copy_tile(v_rows, cp, stage_off + lay.tile_bytes, key0, lay.block_n, lay.head_dim)
    if cp.async_copy:
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


class Visible(NamedTuple):
    """Which (query, key) pairs of one (batch entry, head) take part: keys below ``n_k`` (queries
    below ``n_q`` in S^T tiles), under ``causal`` (0/1) the keys at or before query +
    ``causal_off``, and with a Boolean mask (``mask``: its ``Rows`` of this (batch entry, head),
    indexed by query and key; None without HAS_MASK) the pairs it keeps."""

    n_q: Any
    n_k: Any
    causal: Any
    causal_off: Any
    mask: Any = None


def visible(prob, seq, h, has_mask) -> Visible:
    """The pairs head ``h`` of sequence ``seq`` sees (``prob``: the launch's ``Problem``)."""
    mask = Rows(prob.mask, head_offset(prob.mask, seq.b, h)) if has_mask else None
    return Visible(seq.n_q, seq.n_k, prob.causal, seq.n_k - seq.n_q, mask)


@ty.func
def mask_scores(s, vis, row0, col0, lane, keys_on_rows=False):
    """-inf where a key is past n_k, in the query's future (causal: key > query + causal_off), or
    dropped by the mask (``vis``: ``Visible``). ``keys_on_rows``: the tile is S^T (rows are keys,
    columns queries, as in the backward's dK/dV kernel), and queries past n_q are masked too."""
    n_q, n_k, causal, causal_off = vis.n_q, vis.n_k, vis.causal, vis.causal_off
    vals = []
    for i in range(len(s)):
        r, c = s.layout.coord(0, lane, i)
        query, key = (col0 + c, row0 + r) if keys_on_rows else (row0 + r, col0 + c)
        ok = (key < n_k) & ((causal == 0) | (key <= query + causal_off))
        if keys_on_rows:
            ok = ok & (query < n_q)
        if vis.mask is not None:
            m = vis.mask  # the mask's strides: stride 0 along its broadcast dims
            flag = ty.load(m.t.ptr + (m.base + ty.cast(query, ty.i64) * m.t.stride[2] + ty.cast(key, ty.i64) *
                                      m.t.stride[3]), mask=ok & (query < n_q))
            ok = ok & (flag != 0)
        vals.append(ty.select(ok, s.values[i], NEG_INF))
    return s.with_data(vals)


@ty.func
def maybe_mask(s, vis, row0, col0, lane, block_n):
    """Mask only the tiles that need it: the ragged last tile, the causal diagonal, a user mask."""
    if vis.mask is not None:
        s = mask_scores(s, vis, row0, col0, lane)
    else:
        needs_mask = (col0 + block_n > vis.n_k) | ((vis.causal != 0) & (col0 + (block_n - 1) > row0 + vis.causal_off))
        if needs_mask:
            s = mask_scores(s, vis, row0, col0, lane)
    return s


@ty.func
def load_q(src, row0, lane, head_dim, dtype):
    """This warp's 16 x D block of ``src`` (``Rows`` of Q, or of K, V, dO) as D/16 A fragments;
    rows past src.n read as zeros."""
    words = ty.ptr_cast(src.t.ptr, ty.b32)
    atom = ty.MmaSyncAtom(dtype)
    frags = []
    for kk in range(head_dim // 16):
        regs = []
        for r in range(4):
            row, col = ty.MMA_SYNC_A.coord(0, lane, 2 * r)  # the low half of a_r; the high half is col + 1
            qrow = row0 + row
            offset = src.offset(qrow, col + 16 * kk)
            regs.append(ty.load(words + (offset >> 1), mask=qrow < src.n))
        frags.append(atom.a_fragment(regs))
    return frags


@ty.func
def store_output(o, dst, row0, lane, dtype):
    """Rows < dst.n of ``dst`` (``Rows``) only: each lane packs its two adjacent columns into one b32 store."""
    words = ty.ptr_cast(dst.t.ptr, ty.b32)
    vals = o.values
    for half in range(2):  # rows g and g + 8 of the warp's 16
        r, _ = o.layout.coord(0, lane, 2 * half)
        row = row0 + r
        if row < dst.n:
            for i in range(2 * half, len(vals), 4):
                _, c = o.layout.coord(0, lane, i)
                offset = dst.offset(row, c)
                words[offset >> 1] = ty.pack2(vals[i], vals[i + 1], dtype)


@ty.func
def store_lse(lse, dst, row0, lane):
    """The row LSE into ``dst`` (``Rows`` of the (B, H, n_q) LSE), rows < dst.n; one lane of four."""
    if (lane & 3) == 0:
        for slot in range(len(lse)):
            r, _ = lse.layout.coord(0, lane, slot)
            row = row0 + r
            if row < dst.n:
                dst.t.ptr[dst.offset(row)] = lse.values[slot]


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


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The compile-time options the helpers read (the kernels' constexprs, by name): ``block``
    is the rows of a streamed tile (keys in the forward and dQ kernels, queries in the dK/dV one)."""

    dtype: Any
    head_dim: int
    block: int
    warps: int
    has_mask: bool = False
    return_lse: bool = False
    async_copy: bool = True
    kv_smem: bool = False

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def rows(self) -> int:
        """The CTA's query rows (dK/dV: its key rows), 16 per warp."""
        return ROWS_PER_WARP * self.warps


class Problem(NamedTuple):
    """One launch's inputs and how they are read (a plain holder of IR values): the q, k, v and
    mask TensorArgs, ``kv_group`` query heads per key/value head (query head h reads K/V head
    h // kv_group), the softmax scale and causal (0/1)."""

    q: Any
    k: Any
    v: Any
    mask: Any
    kv_group: Any
    scale: Any
    causal: Any


@ty.func
def attend_rows(prob, dst, seq, h, sched):
    """The CTA's WARPS x 16 query rows of head ``h`` of sequence ``seq`` (``Seq``) into ``dst`` =
    (out, lse) TensorArgs (lse written with RETURN_LSE)."""
    out, lse_out = dst
    block_n, head_dim = sched.block, sched.head_dim
    rows = sched.rows
    lay = Smem(block_n, head_dim, STAGES)
    cp = Copier(shared_bytes(lay.total), ty.thread_idx(), sched.threads, sched.async_copy)
    atom = ty.MmaSyncAtom(sched.dtype)
    lane = ty.lane_id()
    warp = ty.warp_idx()
    # Longest query blocks first: under causal masking the last blocks carry the most tiles.
    m0 = (ty.grid_dim(0) - 1 - ty.block_idx(0)) * rows
    row0 = m0 + warp * ROWS_PER_WARP
    vis = visible(prob, seq, h, sched.has_mask)
    kv_end = seq.n_k
    if prob.causal != 0:
        kv_end = ty.minimum(seq.n_k, ty.maximum(m0 + rows + vis.causal_off, 0))  # stop at the diagonal
    n_tiles = (kv_end + (block_n - 1)) // block_n
    kv_head = h // prob.kv_group
    kv = (head_rows(prob.k, seq.b, kv_head, seq.k_start, seq.n_k), head_rows(prob.v, seq.b, kv_head, seq.k_start,
                                                                             seq.n_k))

    qa = load_q(head_rows(prob.q, seq.b, h, seq.q_start, seq.n_q), row0, lane, head_dim, sched.dtype)
    state = ty.SoftmaxState(tiled([zero_atom() for _ in range(block_n // 8)]), partial_sum=True)
    o = [zero_atom() for _ in range(head_dim // 8)]

    copy_kv(kv, cp, 0, lay, 0)
    for j in range(n_tiles):
        stage_off = (j & 1) * lay.stage_bytes
        if sched.async_copy:
            ty.cp_async_wait(0)
        ty.syncthreads()  # tile j is visible, and every warp is done with tile j - 1's buffer
        if j + 1 < n_tiles:
            copy_kv(kv, cp, ((j + 1) & 1) * lay.stage_bytes, lay, (j + 1) * block_n)
        s = score_tile(atom, qa, cp.smem, stage_off, lane, block_n, head_dim)
        s = maybe_mask(s, vis, row0, j * block_n, lane, block_n)
        upd = ty.softmax_update(state, s, prob.scale)
        state = upd.state
        o = atoms_of(tiled(o) * upd.rescale)
        o = pv_tile(atom, upd.weights, o, cp.smem, stage_off + lay.tile_bytes, lane, block_n, head_dim)

    result = ty.softmax_normalize(tiled(o), state)
    lse = ty.softmax_lse(state, prob.scale) if sched.return_lse else None
    store_output(result, head_rows(out, seq.b, h, seq.q_start, seq.n_q), row0, lane, sched.dtype)
    if sched.return_lse:
        store_lse(lse, head_rows(lse_out, seq.b, h, seq.q_start, seq.n_q), row0, lane)


@ty.kernel(threads=_threads, arch="sm_80", max_registers=_max_registers, noalias=True)
def streaming_attention_fwd(
    q: TOKENS, k: TOKENS, v: TOKENS, out: TOKENS, lse: ROW_STATS, mask: MASK, scale: ty.f32, causal: ty.i32,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 64,
    WARPS: ty.constexpr = DEFAULT_WARPS, HAS_MASK: ty.constexpr = False, RETURN_LSE: ty.constexpr = False,
    ASYNC_COPY: ty.constexpr = True, MAX_REGISTERS: ty.constexpr = DEFAULT_MAX_REGISTERS,
):
    """One CTA: WARPS x 16 query rows of one (batch, head), as many K/V heads as Q heads;
    ASYNC_COPY=False copies with ld/st. ``attention_fwd_portable`` is the general form (grouped
    heads, packed sequences)."""
    sched = Schedule(DTYPE, HEAD_DIM, BLOCK_N, WARPS, HAS_MASK, RETURN_LSE, ASYNC_COPY)
    attend_rows(Problem(q, k, v, mask, 1, scale, causal), (out, lse), sequence(None, q, k, False), ty.block_idx(1),
                sched)


@ty.kernel(threads=_threads, arch="sm_80", max_registers=_max_registers, noalias=True)
def attention_fwd_portable(
    q: TOKENS, k: TOKENS, v: TOKENS, out: TOKENS, lse: ROW_STATS, mask: MASK,
    cu_q: ty.ptr(ty.i32), cu_k: ty.ptr(ty.i32), kv_group: ty.i32, scale: ty.f32, causal: ty.i32,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 64,
    WARPS: ty.constexpr = DEFAULT_WARPS, HAS_MASK: ty.constexpr = False, RETURN_LSE: ty.constexpr = False,
    ASYNC_COPY: ty.constexpr = True, MAX_REGISTERS: ty.constexpr = DEFAULT_MAX_REGISTERS,
    VARLEN: ty.constexpr = False,
):
    """Grid (query blocks, query heads, batch or sequences). Query head h reads K/V head
    h // kv_group. With VARLEN the tensors are packed rows seen as (B, H, total, D) with batch
    stride 0 (the LSE (B, H, total)), and sequence b spans rows cu_q[b] .. cu_q[b + 1] (keys
    likewise); cu_q and cu_k are read only then."""
    sched = Schedule(DTYPE, HEAD_DIM, BLOCK_N, WARPS, HAS_MASK, RETURN_LSE, ASYNC_COPY)
    prob = Problem(q, k, v, mask, kv_group, scale, causal)
    seq = sequence((cu_q, cu_k), q, k, VARLEN)
    if VARLEN:
        if (ty.grid_dim(0) - 1 - ty.block_idx(0)) * sched.rows < seq.n_q:  # else past the end
            attend_rows(prob, (out, lse), seq, ty.block_idx(1), sched)
    else:
        attend_rows(prob, (out, lse), seq, ty.block_idx(1), sched)
