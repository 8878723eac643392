"""Portable streaming attention (mma.sync, sm_80+): softmax(scale * Q K^T, masked) V, never storing scores.

What it computes. For (B, H, N, D) tensors q, k, v (bf16 or fp16, D in {16, 32, 64}) it writes
``out = softmax(scale * q k^T + mask) v`` and optionally the row log-sum-exp, with the N x N
scores living only in registers, one 16 x BLOCK_N tile per warp at a time. It is the fallback of
``tylopy.attention`` wherever the Hopper kernel does not apply (head dims 16 and 32, pre-Hopper
GPUs, tensors TMA cannot describe), and ``streaming_attention()`` below calls it directly.

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

The seed's example, one query, scale folded into the logits, natural exp (the numbers of
``tests/test_streaming_attention.py``): logits [0, 0] in the first tile, [log 2] in the second,
values [1, 3] then [10].

    after tile 1:  m = 0,  l = e^0 + e^0 = 2,              a = 1*1 + 1*3 = 4
    after tile 2:  m = log 2, alpha = e^(0 - log 2) = 1/2,
                   l = 1/2 * 2 + e^0 = 2,                  a = 1/2 * 4 + 1 * 10 = 12
    output         a / l = 6 = (1 + 3 + 2*10) / 4, the full softmax weights [1/4, 1/4, 1/2]
    forgetting to rescale a:  a = 4 + 10 = 14, 14 / 2 = 7   (wrong)

Causal attention only visits tiles up to the CTA's diagonal (the loop stops at
min(n_k, last row + 1)); inside the CTA's last tiles, a warp whose rows all precede a tile sees
every score masked: p = 0 and alpha = exp2(0) = 1, so its state is left unchanged. Every real
query sees key 0, so its first tile has a finite maximum.

Constraints: q, k, v (B, H, N, D) with a contiguous last dim; strides on B, H and N that are
multiples of 8 elements on a 16-byte aligned base are used in place, anything else is copied
once. Rectangular n_q != n_k is allowed without causal; causal needs n_q == n_k. The optional
mask is Boolean and broadcastable to (B, H, n_q, n_k), True = take part; it is read through a
uint8 view whose broadcast dims have stride 0 (no copy). Batch and heads are grid dimensions
(at most 65535 each).

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

    tylopy dump kernels/attention/portable.py -D HEAD_DIM=64 -D BLOCK_N=64    # PTX + ptxas, no GPU
    tylopy check streaming_attention                                          # needs a GPU
    tylopy bench streaming_attention --output results/streaming_attention.json
"""

import dataclasses
import math

import tylopy as ty

from .common import mask_and_lse_args

HEAD_DIMS = (16, 32, 64)
BLOCK_NS = (32, 64)
DEFAULT_BLOCK_N = {16: 64, 32: 64, 64: 64}
DEFAULT_WARPS = 4
# ptxas register cap (0: none). Uncapped, D=64 with 64-key tiles takes about 160 registers (three 4-warp
# CTAs per SM) and everything else at most 128; a cap of 128 makes that one spill.
DEFAULT_MAX_REGISTERS = 0
NEG_INF = float("-inf")
ROWS_PER_WARP = 16
STAGES = 2
MAX_GRID_YZ = 65535


# -- shared memory: swizzled K/V tiles ---------------------------------------------------------------

def swizzled_offset(row, chunk, head_dim: int):
    """Byte offset of 16-byte chunk ``chunk`` of tile row ``row`` (ints or IR values).

    A row holds C = head_dim / 8 chunks; chunk c of row r sits at chunk c ^ f(r), with f(r) =
    (r // (8 / C)) % C. The 8 rows an ``ldmatrix`` reads (8 consecutive rows, one logical chunk)
    then land in 8 different 16-byte bank groups: no bank conflicts for C = 2, 4 or 8.
    """
    chunks = head_dim // 8
    shift = {8: 0, 4: 1, 2: 2}[chunks]
    return row * (chunks * 16) + ((chunk ^ ((row >> shift) & (chunks - 1))) << 4)


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
def mask_scores(s, row0, col0, lane, n_q, n_k, causal, mask_args, has_mask):
    """-inf where a key is past n_k, in the query's future (causal), or dropped by the mask."""
    vals = []
    for i in range(len(s)):
        r, c = s.layout.coord(0, lane, i)
        row = row0 + r
        col = col0 + c
        ok = (col < n_k) & ((causal == 0) | (col <= row))
        if has_mask:
            mask, m_base, m_stride_q, m_stride_k = mask_args
            flag = ty.load(mask + (m_base + ty.cast(row, ty.i64) * m_stride_q + ty.cast(col, ty.i64) * m_stride_k),
                           mask=ok & (row < n_q))
            ok = ok & (flag != 0)
        vals.append(ty.select(ok, s.values[i], NEG_INF))
    return s.with_data(vals)


@ty.func
def maybe_mask(s, row0, col0, lane, n_q, n_k, causal, mask_args, has_mask, block_n):
    """Mask only the tiles that need it: the ragged last tile, the causal diagonal, a user mask."""
    if has_mask:
        s = mask_scores(s, row0, col0, lane, n_q, n_k, causal, mask_args, has_mask)
    else:
        needs_mask = (col0 + block_n > n_k) | ((causal != 0) & (col0 + (block_n - 1) > row0))
        if needs_mask:
            s = mask_scores(s, row0, col0, lane, n_q, n_k, causal, mask_args, has_mask)
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


# -- the kernel -------------------------------------------------------------------------------------------

def _threads(WARPS=DEFAULT_WARPS, **_):
    return 32 * WARPS


def _max_registers(MAX_REGISTERS=DEFAULT_MAX_REGISTERS, **_):
    return MAX_REGISTERS or None


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
    """One CTA: WARPS x 16 query rows of one (batch, head); ASYNC_COPY=False copies with ld/st (the emulator's path)."""
    threads = 32 * WARPS
    lay = Smem(BLOCK_N, HEAD_DIM, STAGES)
    smem = ty.shared(ty.u8, lay.total, align=128)
    atom = ty.MmaSyncAtom(DTYPE)
    tid = ty.thread_idx()
    lane = ty.lane_id()
    warp = ty.warp_idx()
    # Longest query blocks first: under causal masking the last blocks carry the most tiles.
    m0 = (ty.grid_dim(0) - 1 - ty.block_idx(0)) * (ROWS_PER_WARP * WARPS)
    h = ty.block_idx(1)
    b = ty.block_idx(2)
    row0 = m0 + warp * ROWS_PER_WARP
    kv_end = n_k
    if causal != 0:
        kv_end = ty.minimum(n_k, m0 + ROWS_PER_WARP * WARPS)  # stop at the diagonal
    n_tiles = (kv_end + (BLOCK_N - 1)) // BLOCK_N
    b64 = ty.cast(b, ty.i64)
    h64 = ty.cast(h, ty.i64)
    k_base = b64 * k_stride_b + h64 * k_stride_h
    v_base = b64 * v_stride_b + h64 * v_stride_h
    mask_args = (mask, b64 * m_stride_b + h64 * m_stride_h, m_stride_q, m_stride_k)

    qa = load_q(q, b64 * q_stride_b + h64 * q_stride_h, q_stride_n, row0, n_q, lane, HEAD_DIM, DTYPE)
    state = ty.SoftmaxState(tiled([zero_atom() for _ in range(BLOCK_N // 8)]), partial_sum=True)
    o = [zero_atom() for _ in range(HEAD_DIM // 8)]

    copy_kv(k, v, k_base, v_base, k_stride_n, v_stride_n, smem, 0, lay, 0, n_k, tid, threads, ASYNC_COPY)
    for j in range(n_tiles):
        stage_off = (j & 1) * lay.stage_bytes
        if ASYNC_COPY:
            ty.cp_async_wait(0)
        ty.syncthreads()  # tile j is visible, and every warp is done with tile j - 1's buffer
        if j + 1 < n_tiles:
            copy_kv(k, v, k_base, v_base, k_stride_n, v_stride_n, smem, ((j + 1) & 1) * lay.stage_bytes, lay,
                    (j + 1) * BLOCK_N, n_k, tid, threads, ASYNC_COPY)
        s = score_tile(atom, qa, smem, stage_off, lane, BLOCK_N, HEAD_DIM)
        s = maybe_mask(s, row0, j * BLOCK_N, lane, n_q, n_k, causal, mask_args, HAS_MASK, BLOCK_N)
        upd = ty.softmax_update(state, s, scale)
        state = upd.state
        o = atoms_of(tiled(o) * upd.rescale)
        o = pv_tile(atom, upd.weights, o, smem, stage_off + lay.tile_bytes, lane, BLOCK_N, HEAD_DIM)

    result = ty.softmax_normalize(tiled(o), state)
    lse = ty.softmax_lse(state, scale) if RETURN_LSE else None
    o_base = b64 * o_stride_b + h64 * o_stride_h
    lse_base = (b64 * ty.cast(n_heads, ty.i64) + h64) * ty.cast(n_q, ty.i64)
    store_output(result, lse, out, lse_ptr, row0, n_q, o_base, o_stride_n, lse_base, lane, DTYPE, RETURN_LSE)


# -- host side ------------------------------------------------------------------------------------------

_kernels: dict = {}


def device_arch(capability) -> tuple[str, bool]:
    """(arch to compile for, whether to hand the driver sm_80 PTX to JIT instead of a cubin)."""
    from tylopy.codegen.targets import SUPPORTED_ARCHS
    major, minor = capability
    if (major, minor) < (8, 0):
        raise ValueError(f"streaming_attention: query expects a GPU of compute capability 8.0 or newer (mma.sync "
                         f"on bf16, cp.async), but got sm_{major}{minor}")
    arch = f"sm_{major}{minor}"
    return (arch, False) if arch in SUPPORTED_ARCHS else ("sm_80", True)


_archs: dict = {}


def _device_arch(device):
    import torch
    index = device.index if device.index is not None else torch.cuda.current_device()
    arch = _archs.get(index)
    if arch is None:
        arch = _archs[index] = device_arch(torch.cuda.get_device_capability(index))
    return arch


def compiled_for(device, **constexprs):
    """The CompiledKernel of one specialization for ``device`` (cached)."""
    arch, jit = _device_arch(device)
    key = (arch, jit, tuple(sorted((k, repr(v)) for k, v in constexprs.items())))
    ck = _kernels.get(key)
    if ck is None:
        kern = _kernels.get(arch)
        if kern is None:
            kern = _kernels[arch] = streaming_attention_fwd.with_arch(arch)
        ck = kern.compile(**constexprs)
        if jit:  # an arch the codegen does not list: let the driver compile the sm_80 PTX
            ck = dataclasses.replace(ck, cubin=None, _launcher=None)
        _kernels[key] = ck
    return ck


def _in_place_ok(t) -> bool:
    """16-byte aligned rows: cp.async copies 16 bytes and Q is read as 32-bit words."""
    return t.data_ptr() % 16 == 0 and all(t.shape[d] == 1 or t.stride(d) % 8 == 0 for d in range(3))


def _aligned(t):
    import torch
    return t if _in_place_ok(t) else t.clone(memory_format=torch.contiguous_format)


def check_schedule(head_dim, block_n, warps) -> tuple[int, int]:
    """The (BLOCK_N, WARPS) to use: the defaults for None, else checked."""
    block_n = DEFAULT_BLOCK_N[head_dim] if block_n is None else block_n
    warps = DEFAULT_WARPS if warps is None else warps
    if isinstance(block_n, bool) or block_n not in BLOCK_NS:
        raise ValueError(f"streaming_attention: block_n expects one of {BLOCK_NS}, but got {block_n!r}")
    if isinstance(warps, bool) or warps not in (1, 2, 4, 8):
        raise ValueError(f"streaming_attention: warps expects 1, 2, 4 or 8, but got {warps!r}")
    return block_n, warps


def launch_streaming(q, k, v, attn_mask, is_causal, scale, out, lse, block_n=None, warps=None, async_copy=True):
    """Launch on checked inputs (``tylopy_kernels.attention.check_inputs``) into ``out`` (and ``lse``)."""
    import torch
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    block_n, warps = check_schedule(D, block_n, warps)
    for name, n in (("batch", B), ("heads", H)):
        if n > MAX_GRID_YZ:
            raise ValueError(f"streaming_attention: query {name} expects at most {MAX_GRID_YZ} (a grid dimension), "
                             f"but got {n}")
    if out.stride(-1) != 1 or out.data_ptr() % 4 or any(out.stride(d) % 2 for d in range(3)):
        raise ValueError(f"streaming_attention: out expects 4-byte aligned rows with a contiguous last dim, "
                         f"but got strides {out.stride()}")
    if lse is not None and not lse.is_contiguous():
        raise ValueError("streaming_attention: lse expects a contiguous (B, H, n_q) tensor")
    if B * H * n_q == 0:
        return
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    mask_t, ms, lse_t = mask_and_lse_args(attn_mask, lse, B, H, n_q, n_k, q.device)
    ck = compiled_for(q.device, DTYPE=ty.bf16 if q.dtype == torch.bfloat16 else ty.f16, HEAD_DIM=D,
                      BLOCK_N=block_n, WARPS=warps, HAS_MASK=attn_mask is not None, RETURN_LSE=lse is not None,
                      ASYNC_COPY=async_copy)
    grid = ((n_q + ROWS_PER_WARP * warps - 1) // (ROWS_PER_WARP * warps), H, B)
    ck(grid, q.view(torch.int16), k.view(torch.int16), v.view(torch.int16), out.view(torch.int16), lse_t, mask_t,
       n_q, n_k, H, float(scale), int(is_causal),
       q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
       v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2), *ms)


def streaming_attention(query, key, value, attn_mask=None, is_causal=False, scale=None, return_lse=False,
                        block_n=None, warps=None, out=None):
    """Like ``tylopy.attention``, always on this kernel; ``block_n`` (32/64) and ``warps`` pick the schedule."""
    import torch
    from . import check_inputs
    B, H, n_q, n_k, D, scale = check_inputs(query, key, value, attn_mask, is_causal, scale)
    block_n, warps = check_schedule(D, block_n, warps)
    if query.device.type != "cuda":
        raise ValueError(f"streaming_attention: query expects a CUDA tensor, but got a tensor on {query.device}")
    if out is None:
        out = torch.empty((B, H, n_q, D), dtype=query.dtype, device=query.device)
    elif out.shape != (B, H, n_q, D) or out.dtype != query.dtype or out.device != query.device:
        raise ValueError(f"streaming_attention: out expects a {query.dtype} tensor of shape {(B, H, n_q, D)} on "
                         f"{query.device}, but got {out.dtype} {tuple(out.shape)} on {out.device}")
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=query.device) if return_lse else None
    if n_k == 0 and B * H * n_q:  # no keys: every row is empty
        out.zero_()
        if lse is not None:
            lse.fill_(NEG_INF)
    else:
        launch_streaming(query, key, value, attn_mask, is_causal, scale, out, lse, block_n, warps)
    return (out, lse) if return_lse else out
