"""GEMM on tensor cores with mma.sync: ``c = a @ b`` for bf16/f16 ``a`` (M x K) and ``b`` (K x N),
f32 accumulation, f32 or bf16 output. Written only with public ``ty.*`` names.

The algorithm (one CTA of 4 warps per 64 x 64 tile of c; each warp owns a 32 x 32 quarter):

1. Pipeline: the K dimension is walked in 32-wide k-tiles. A ring of ``STAGES`` (3) shared-memory
   stages holds the A tile (64 x 32) and the B tile (32 x 64) of upcoming k-tiles. Every thread
   copies two 16-byte chunks of each tile with ``ty.cp_async`` and closes one commit group per
   k-tile, so k-tile ``t + 2`` is in flight while k-tile ``t`` is multiplied.
2. Each iteration: ``ty.cp_async_wait(STAGES - 2)`` (this thread's copies of k-tile ``t`` have
   landed), ``ty.syncthreads()`` (everyone's have, and every warp is done with the stage about to
   be refilled), issue the copies of k-tile ``t + STAGES - 1``, commit (an empty group at the end
   keeps the count uniform), multiply.
3. Multiply: per 16-wide k-step, ``ty.ldmatrix`` x4 gives each warp's A operands (two 16 x 16
   atoms, row-major tile, no transpose) and, with ``trans=True`` from the row-major K x N B tile,
   the B operands of two 8-column atoms at a time; 2 x 4 ``ty.mma`` per k-step.
4. Epilogue: each lane stores its accumulators (rows g, g + 8 of each atom, columns 2t, 2t + 1),
   masked to rows < M and columns < N, converted to the output type.

Shared-memory layout: rows of 16-byte chunks, chunk c of row r stored at chunk c ^ f(r), so the
8 rows one ldmatrix matrix reads fall in 8 different bank groups (no bank conflicts):
f(r) = (r >> 1) & 3 for the 4-chunk A rows, f(r) = r & 7 for the 8-chunk B rows.

Tails: rows of A past M, rows of B past K and chunks past K (A) or N (B) are copied with
``src_bytes=0``, which reads nothing and zero-fills the 16 bytes; the epilogue masks the stores.
A 16-byte copy needs 16-byte aligned rows: the launcher copies ``a`` or ``b`` once into a
zero-padded buffer whose row length is a multiple of 8 elements when K or N is not (zero
columns do not change the product); everything else is used in place.

Run it: ``matmul(a, b)`` on CUDA tensors, ``matmul(a, b, emulate=True)`` on CPU tensors (the
same kernel in the emulator), ``tylopy emulate tylopy_kernels/examples/gemm_mma_sync.py`` (a ragged
example against float64), ``tylopy dump tylopy_kernels/examples/gemm_mma_sync.py`` for PTX + ptxas.
"""
import functools
from typing import Any, NamedTuple

import tylopy as ty

BM, BN, BK = 64, 64, 32
STAGES = 3
WARPS = 4
THREADS = 32 * WARPS
A_TILE = BM * BK * 2          # bytes
B_TILE = BK * BN * 2
STAGE_BYTES = A_TILE + B_TILE


def a_offset(row, chunk):
    """Byte offset of 16-byte chunk ``chunk`` (0..3) of A-tile row ``row`` (swizzled)."""
    return row * (BK * 2) + ((chunk ^ ((row >> 1) & 3)) << 4)


def b_offset(row, chunk):
    """Byte offset of 16-byte chunk ``chunk`` (0..7) of B-tile row ``row`` (a k index; swizzled)."""
    return row * (BN * 2) + ((chunk ^ (row & 7)) << 4)


class Inputs(NamedTuple):
    """The product's inputs: ``a`` (M x K) and ``b`` (K x N) as raw 16-bit bits, their row strides in
    elements, and M, N, K."""

    a: Any
    b: Any
    lda: Any
    ldb: Any
    M: Any
    N: Any
    K: Any


@ty.func
def load_tiles(inputs, smem, stage, m0, n0, k0, tid):
    """Start the cp.async copies of k-tile ``k0`` of the tile at (m0, n0) into ``stage``; chunks past
    the matrix zero-fill."""
    a, b, lda, ldb, M, N, K = inputs
    base = stage * STAGE_BYTES
    for it in range(BM * BK // 8 // THREADS):  # A: 64 rows x 4 chunks
        idx = tid + it * THREADS
        row, chunk = idx >> 2, idx & 3
        ok = (m0 + row < M) & (k0 + chunk * 8 < K)
        src = a + (ty.cast(ty.minimum(m0 + row, M - 1), ty.i64) * lda + ty.cast(k0 + chunk * 8, ty.i64))
        ty.cp_async(smem + (base + a_offset(row, chunk)), src, 16, src_bytes=ty.select(ok, 16, 0))
    for it in range(BK * BN // 8 // THREADS):  # B: 32 rows x 8 chunks
        idx = tid + it * THREADS
        row, chunk = idx >> 3, idx & 7
        ok = (k0 + row < K) & (n0 + chunk * 8 < N)
        src = b + (ty.cast(ty.minimum(k0 + row, K - 1), ty.i64) * ldb + ty.cast(n0 + chunk * 8, ty.i64))
        ty.cp_async(smem + (base + A_TILE + b_offset(row, chunk)), src, 16, src_bytes=ty.select(ok, 16, 0))


def multiply_stage(atom, smem, stage, acc, lane, wm, wn):
    """acc[mi][ni] += A[warp rows] B[warp cols] over one k-tile (BK / 16 k-steps)."""
    a_base = stage * STAGE_BYTES
    b_base = a_base + A_TILE
    j, i = lane >> 3, lane & 7  # this lane gives the address of row i of ldmatrix matrix j
    for kk in range(BK // 16):
        a_frags = []
        for mi in range(2):
            row = wm * 32 + mi * 16 + i + 8 * (j & 1)
            words = ty.ldmatrix(smem + (a_base + a_offset(row, 2 * kk + (j >> 1))), 4)
            a_frags.append(atom.a_fragment(words))
        for pair in range(2):  # two 8-column atoms per ldmatrix.x4.trans
            k_row = kk * 16 + i + 8 * (j & 1)
            words = ty.ldmatrix(smem + (b_base + b_offset(k_row, (wn * 32 + pair * 16) // 8 + (j >> 1))), 4,
                                trans=True)
            for half in range(2):
                b_frag = atom.b_fragment(words[2 * half:2 * half + 2])
                for mi in range(2):
                    ni = 2 * pair + half
                    acc[mi][ni] = ty.mma(atom, a_frags[mi], b_frag, acc[mi][ni])
    return acc


@functools.cache
def gemm_kernel(out_dtype):
    """The GEMM kernel writing ``out_dtype`` (``ty.f32`` or ``ty.bf16``); inputs are raw 16-bit bits."""

    @ty.kernel(threads=THREADS, arch="sm_80", name=f"gemm_mma_sync_{out_dtype}")
    def gemm(a: ty.ptr(ty.i16), b: ty.ptr(ty.i16), c: ty.ptr(out_dtype), M: ty.i32, N: ty.i32, K: ty.i32,
             lda: ty.i64, ldb: ty.i64, ldc: ty.i64, DTYPE: ty.constexpr = ty.bf16):
        smem = ty.shared(ty.u8, STAGES * STAGE_BYTES, align=128)
        atom = ty.MmaSyncAtom(DTYPE)
        tid = ty.thread_idx()
        lane = ty.lane_id()
        warp = ty.warp_idx()
        wm, wn = warp >> 1, warp & 1
        inputs = Inputs(a, b, lda, ldb, M, N, K)
        m0 = ty.block_idx(1) * BM
        n0 = ty.block_idx(0) * BN
        k_tiles = (K + (BK - 1)) // BK
        acc = [[atom.zeros() for _ in range(4)] for _ in range(2)]
        for s in range(STAGES - 1):  # the prologue: the first STAGES - 1 k-tiles in flight
            if s < k_tiles:
                load_tiles(inputs, smem, s, m0, n0, s * BK, tid)
            ty.cp_async_commit()
        for kt in range(k_tiles):
            ty.cp_async_wait(STAGES - 2)  # my copies of k-tile kt have landed
            ty.syncthreads()              # everyone's have; nobody reads the stage refilled next
            nxt = kt + (STAGES - 1)
            if nxt < k_tiles:
                load_tiles(inputs, smem, nxt % STAGES, m0, n0, nxt * BK, tid)
            ty.cp_async_commit()
            acc = multiply_stage(atom, smem, kt % STAGES, acc, lane, wm, wn)
        g, t = lane >> 2, lane & 3
        for mi in range(2):
            for ni in range(4):
                vals = acc[mi][ni].values
                for r in range(4):
                    row = m0 + wm * 32 + mi * 16 + g + 8 * (r >> 1)
                    col = n0 + wn * 32 + ni * 8 + 2 * t + (r & 1)
                    if (row < M) & (col < N):
                        c[ty.cast(row, ty.i64) * ldc + ty.cast(col, ty.i64)] = ty.cast(vals[r], out_dtype)

    return gemm


gemm_f32_out = gemm_kernel(ty.f32)     # module level, so `tylopy dump` finds both
gemm_bf16_out = gemm_kernel(ty.bf16)


# -- host side ------------------------------------------------------------------------------------------

def _padded(t, rows: int, cols: int):
    """``t`` itself when its rows are 16-byte aligned, else a zero-padded copy with that property."""
    import torch
    ok = t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0
    if ok:
        return t
    cols8 = -(-cols // 8) * 8
    out = torch.zeros((rows, cols8), dtype=t.dtype, device=t.device)
    out[:, :cols] = t
    return out


def check_inputs(a, b, out_dtype) -> None:
    import torch
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul expects 2-D a and b, but got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul expects a (M x K) and b (K x N), but got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
        raise TypeError(f"matmul expects a and b both bfloat16 or both float16, but got {a.dtype} and {b.dtype}")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"matmul out_dtype expects torch.float32 or torch.bfloat16, but got {out_dtype}")
    if a.device != b.device:
        raise ValueError(f"matmul expects a and b on one device, but got {a.device} and {b.device}")


def matmul(a, b, out_dtype=None, emulate: bool = False):
    """``a @ b`` (bf16/f16, f32 accumulation) as ``out_dtype`` (torch.float32 default, or torch.bfloat16).

    CUDA tensors run on the GPU (sm_80+); with ``emulate=True``, CPU tensors run in the emulator.
    """
    import torch
    out_dtype = torch.float32 if out_dtype is None else out_dtype
    check_inputs(a, b, out_dtype)
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    a_in, b_in = _padded(a, M, K), _padded(b, K, N)
    kernel = gemm_kernel(ty.f32 if out_dtype == torch.float32 else ty.bf16)
    args = (a_in.view(torch.int16), b_in.view(torch.int16), c, M, N, K, a_in.stride(0), b_in.stride(0), N)
    grid = (-(-N // BN), -(-M // BM))
    dt = ty.bf16 if a.dtype == torch.bfloat16 else ty.f16
    if emulate:
        kernel.emulate(*args, grid=grid, DTYPE=dt)
    else:
        kernel[grid](*args, DTYPE=dt)
    return c


def emulate_example(m: int = 37, n: int = 45, k: int = 83):
    """``tylopy emulate tylopy_kernels/examples/gemm_mma_sync.py``: a ragged bf16 GEMM against float64."""
    import torch
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(k, n, generator=gen).to(torch.bfloat16)
    c = matmul(a, b, emulate=True)
    want = a.double() @ b.double()
    tol = 4 * k * 2.0 ** -24 * float((a.double().abs() @ b.double().abs()).max())
    return c.numpy(), want.numpy(), tol
