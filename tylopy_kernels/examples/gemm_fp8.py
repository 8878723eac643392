"""Per-tensor scaled FP8 GEMM for Hopper (sm_90a), written with tylopy's public names only:

    C (bf16, M x N) = scale_a * scale_b * (A (e4m3, M x K) @ B (e4m3, N x K)^T)

the product ``torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16)`` computes.
FP8 wgmma reads both operands K-major, so B comes as N x K (a Linear weight's layout).

One persistent CTA per SM, 384 threads, warp-specialized like the bf16 GEMM of
``tylopy_kernels/gemm``:

1. Warpgroup 0 (producer) gives registers back and one elected thread streams k-blocks of 128
   codes (one 128-byte swizzled row per operand row) of A and B by TMA through a ring of
   ``STAGES`` shared-memory stages, each with a full and an empty mbarrier.
2. Warpgroups 1 and 2 (consumers) take more registers and share every BLOCK_M x BLOCK_N tile,
   each 64 rows: per k-block, four m64 n{BLOCK_N} k32 SS wgmmas (the descriptor moves 32 bytes
   per k32 step), commit, wait until only this k-block is in flight, release the previous stage.
3. Epilogue: scale by scale_a * scale_b (read once from two one-element f32 tensors) and round
   to bf16. ``STORE="tma"``: each consumer writes 64-column chunks into two alternating
   128-byte-swizzled shared buffers and TMA-stores them (the TMA clips rows >= M and columns
   >= N); ``STORE="direct"``: column pairs straight from the registers, rows >= M and columns
   >= N skipped. TMA zero-fills rows and k past the operands' ends.

``PROMOTE=True`` adds each k-block's wgmma result (started from zero) into a separate f32
accumulator with ordinary FADDs, as DeepSeek-V3 does against the tensor cores' limited FP8
accumulation precision (docs/fp8.md); it doubles the accumulator registers, so it needs
BLOCK_N <= 128.

The library operator ``tylopy.scaled_matmul`` (``tylopy_kernels/gemm/fp8.py``) is this kernel grown
to per-row and 128-block scales, e5m2, fp16/fp32 outputs and a bias, autotuned; it shares the
producer and the main loop with this file.

Host side: ``scaled_mm(a, b, scale_a, scale_b)`` (CUDA tensors; ``emulate=True`` runs CPU
tensors in the emulator) and ``main()``, a benchmark against ``torch._scaled_mm``:

    python -m tylopy_kernels.examples.gemm_fp8 --sizes 4096 8192
    tylopy bench gemm_fp8 --sizes 4096 8192        (once the package's entry points are installed)
"""
import dataclasses
from typing import Any, NamedTuple

import tylopy as ty
from tylopy import hopper
# The producer, the ring and the k-block issue are the library kernel's (tylopy_kernels/gemm/fp8.py,
# behind tylopy.scaled_matmul); this file keeps the per-tensor bf16 epilogue and its two store paths.
from tylopy_kernels.gemm.fp8 import (OperandRing, TileGrid, add_into, chained, kblock, my_tiles, producer, release,
                                     tile_of)

BLOCK_K = 128            # codes per k-block: one 128-byte swizzle row
ROW = 128                # bytes per operand row in shared memory
CONSUMERS = 2
THREADS = 128 * (1 + CONSUMERS)
REGISTERS = (40, 232)    # setmaxnreg split: 128 * 40 + 256 * 232 = 384 * 168
EPI_COLS = 64            # bf16 columns of one 128-byte staging row
EPI_BUF = 64 * ROW       # one consumer's staging buffer: its 64 rows x 128 bytes
EPILOGUE_BARRIER = 1     # named barriers 1 and 2: consumer c's staging buffers
SMEM_LIMIT = 232448      # H100/H200 opt-in dynamic shared memory per block


def smem_layout(block_m, block_n, stages, store="tma"):
    """Byte offsets of the A ring, the B ring, the full and empty barriers, the total and the
    epilogue's staging buffers (two per consumer with STORE="tma")."""
    a_bytes, b_bytes = block_m * ROW, block_n * ROW
    b = stages * a_bytes
    epi = b + stages * b_bytes
    full = epi + (CONSUMERS * 2 * EPI_BUF if store == "tma" else 0)
    empty = full + 8 * stages
    return a_bytes, b_bytes, b, full, empty, empty + 8 * stages, epi


class Output(NamedTuple):
    """Where C goes: its pointer and tensor map, its row stride, M and N, the store path ("tma" or
    "direct") and the per-tensor scale scale_a * scale_b (read once per consumer)."""

    out: Any
    tm_c: Any
    ldc: Any
    m: Any
    n: Any
    store: str
    scale: Any


@ty.func
def mainloop(ring, it0, k_blocks, promote):
    """Every k-block of one tile (k_blocks >= 1) from the consumer's ``OperandRing``. Plain: one
    accumulator chain (the library's ``chained``). PROMOTE: each k-block from zero, waited out and
    added into the f32 total."""
    if promote:
        total = hopper.wgmma_wait(0, kblock(ring, None, it0))
        release(ring, it0)
        for kb in range(1, k_blocks):
            part = hopper.wgmma_wait(0, kblock(ring, None, it0 + kb))
            release(ring, it0 + kb)
            total = add_into(total, part)
        return total
    return chained(ring, it0, k_blocks)


@ty.func
def store(acc, dst, row0, col0, block_n):
    """bf16 column pairs straight from the registers: register i holds row 16w + g + 8((i >> 1) & 1),
    column 8(i >> 2) + 2t + (i & 1); the host keeps N and ldc even, so a pair is one 4-byte store."""
    out, ldc, m, n, scale = dst.out, dst.ldc, dst.m, dst.n, dst.scale
    w = ty.warp_idx() & 3
    g = ty.lane_id() >> 2
    t = ty.lane_id() & 3
    words = ty.ptr_cast(out, ty.b32)
    vals = acc.values
    for j in range(block_n // 8):
        col = col0 + 8 * j + 2 * t
        if col < n:
            for half in range(2):
                row = row0 + 16 * w + g + 8 * half
                if row < m:
                    i = 4 * j + 2 * half
                    at = ty.cast(row, ty.i64) * ldc + ty.cast(col, ty.i64)
                    words[at >> 1] = ty.pack2(vals[i] * scale, vals[i + 1] * scale, ty.bf16)


@ty.func
def store_tma(acc, dst, smem, epi, seq, row0, col0, block_n):
    """Stage 64-column chunks in the 128-byte-swizzled image TMA expects (row r at 128 r, 16-byte
    piece p at p ^ (r % 8)) in two alternating buffers at ``epi`` and TMA-store each. Register i
    holds column 8(i >> 2) + 2t + (i & 1) of row 16w + g + 8((i >> 1) & 1), so a pair of 8-column
    group q lands at piece q ^ g. ``seq`` counts this consumer's chunks so far (the buffer parity)."""
    tm_c, scale = dst.tm_c, dst.scale
    c = ty.warpgroup_idx() - 1
    w = ty.warp_idx() & 3
    g = ty.lane_id() >> 2
    t = ty.lane_id() & 3
    leader = (ty.thread_idx() & 127) == 0
    vals = acc.values
    for j in range(block_n // EPI_COLS):
        buf = smem + (epi + (2 * c) * EPI_BUF) + ((seq + j) & 1) * EPI_BUF
        if leader:
            hopper.bulk_wait(1, read=True)   # the store that last read this buffer is done reading
        ty.barrier_sync(EPILOGUE_BARRIER + c, 128)
        for q in range(EPI_COLS // 8):
            for half in range(2):
                i = 4 * (8 * j + q) + 2 * half
                at = buf + ((16 * w + g + 8 * half) * ROW + (q ^ g) * 16 + 4 * t)
                ty.store(ty.ptr_cast(at, ty.b32), ty.pack2(vals[i] * scale, vals[i + 1] * scale, ty.bf16))
        hopper.fence_proxy_async()
        ty.barrier_sync(EPILOGUE_BARRIER + c, 128)
        if leader:
            hopper.tma_store(tm_c, buf, col0 + EPI_COLS * j, row0)
            hopper.bulk_commit()
    return seq + block_n // EPI_COLS


@ty.func
def consumer(smem, dst, tiles, lay, stages, promote):
    """Consumer warpgroups 1 and 2: 64 rows each of every tile of ``tiles`` (a ``TileGrid``) this
    CTA takes, written to ``dst`` (an ``Output``)."""
    hopper.setmaxnreg(REGISTERS[1], increase=True)
    c = ty.warpgroup_idx() - 1
    base = ty.address(smem)
    block_m, block_n = tiles.block_m, tiles.block_n
    atom = hopper.WgmmaAtom(block_n, ty.e4m3, "ss")
    row_off = c * (block_m // CONSUMERS)
    ring = OperandRing(smem, base, atom, lay, stages, row_off)
    it = 0
    seq = 0
    for local in range(my_tiles(tiles.num_m * tiles.num_n)):
        tm, tn = tile_of(ty.block_idx(0) + local * ty.grid_dim(0), tiles.num_m, tiles.num_n, tiles.group_m)
        acc = mainloop(ring, it, tiles.k_blocks, promote)
        if dst.store == "tma":
            seq = store_tma(acc, dst, smem, lay[6], seq, tm * block_m + row_off, tn * block_n, block_n)
        else:
            store(acc, dst, tm * block_m + row_off, tn * block_n, block_n)
        it = it + tiles.k_blocks
    if dst.store == "tma":
        if (ty.thread_idx() & 127) == 0:
            hopper.bulk_wait(0)   # the staging buffers must outlive the last stores' reads


@ty.kernel(threads=THREADS, min_blocks_per_sm=1, noalias=True, arch="sm_90a")
def gemm_fp8(tm_a: ty.tensormap, tm_b: ty.tensormap, tm_c: ty.tensormap, out: ty.ptr(ty.bf16),
             scale_a: ty.ptr(ty.f32), scale_b: ty.ptr(ty.f32), m: ty.i32, n: ty.i32, k: ty.i32, ldc: ty.i64,
             BLOCK_N: ty.constexpr = 256, STAGES: ty.constexpr = 4, GROUP_M: ty.constexpr = 8,
             PROMOTE: ty.constexpr = False, STORE: ty.constexpr = "tma"):
    """C = scale_a scale_b A B^T with A (M x K) and B (N x K) e4m3 behind the tensor maps."""
    block_m = 64 * CONSUMERS
    if PROMOTE and BLOCK_N > 128:
        raise ValueError(f"PROMOTE=True keeps two accumulators: it expects BLOCK_N <= 128, but got {BLOCK_N}")
    if STORE not in ("tma", "direct"):
        raise ValueError(f"STORE expects 'tma' or 'direct', but got {STORE!r}")
    lay = smem_layout(block_m, BLOCK_N, STAGES, STORE)
    smem = ty.dynamic_shared(ty.u8, lay[5], align=1024)
    full, empty = lay[3], lay[4]
    if ty.thread_idx() == 0:
        hopper.ring_init(smem, hopper.Ring(full, empty, STAGES), CONSUMERS)
    ty.syncthreads()
    num_m = (m + (block_m - 1)) // block_m
    num_n = (n + (BLOCK_N - 1)) // BLOCK_N
    k_blocks = (k + (BLOCK_K - 1)) // BLOCK_K
    tiles = TileGrid(block_m, BLOCK_N, num_m, num_n, k_blocks, GROUP_M)
    if ty.warpgroup_idx() == 0:
        producer(smem, tm_a, tm_b, tiles, lay, STAGES, REGISTERS)
    else:
        scale = scale_a[0] * scale_b[0]
        consumer(smem, Output(out, tm_c, ldc, m, n, STORE, scale), tiles, lay, STAGES, PROMOTE)


# -- host side ------------------------------------------------------------------------------------------

def stages_for(block_n: int, store: str = "tma") -> int:
    """The deepest ring (up to 6) that fits the 227 KB of shared memory."""
    for stages in range(6, 1, -1):
        if smem_layout(64 * CONSUMERS, block_n, stages, store)[5] <= SMEM_LIMIT:
            return stages
    return 2


def check_inputs(a, b, scale_a, scale_b) -> None:
    import torch
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2 or t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"scaled_mm expects {name} as a 2-D torch.float8_e4m3fn tensor, but got "
                            f"{t.dtype} of shape {tuple(t.shape)}")
        if t.stride(1) != 1 or t.stride(0) % 16 or t.data_ptr() % 16:
            raise ValueError(f"scaled_mm expects {name} row-major with rows 16-byte aligned (TMA), but got strides "
                             f"{tuple(t.stride())}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"scaled_mm expects a (M x K) and b (N x K), but got {tuple(a.shape)} and {tuple(b.shape)}")
    if b.shape[0] % 8:
        raise ValueError(f"scaled_mm expects N (b's rows) to be a multiple of 8, but got {b.shape[0]}")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s.numel() != 1 or s.dtype != torch.float32:
            raise TypeError(f"scaled_mm expects {name} as a one-element float32 tensor (per-tensor scale), but got "
                            f"{s.dtype} with {s.numel()} elements")


def _maps(a, b, c, block_m, block_n, emulate):
    """Tensor maps of A and B (k-blocks of 128 codes) and C (64 x 64 bf16 store boxes)."""
    from tylopy.runtime.tensormap import TensorMap, TensorMapSpec
    out = []
    for t, box, dt in ((a, (BLOCK_K, block_m), "e4m3"), (b, (BLOCK_K, block_n), "e4m3"), (c, (EPI_COLS, 64), "bf16")):
        geometry = ((t.shape[1], t.shape[0]), (t.stride(0) * t.element_size(),), box, dt, 128)
        out.append(TensorMapSpec(t, *geometry) if emulate else TensorMap.cached(t, *geometry))
    return out


@dataclasses.dataclass(frozen=True)
class Fp8Schedule:
    """The kernel's compile-time schedule: ``block_n`` (64, 128 or 256 columns per tile),
    ``promote`` (add the wgmma sums into a second f32 accumulator every k-block) and ``store``
    ("tma" through shared memory, or "direct" from the registers)."""

    block_n: int = 256
    promote: bool = False
    store: str = "tma"


def scaled_mm(a, b, scale_a, scale_b, schedule: Fp8Schedule = Fp8Schedule(), emulate: bool = False,
              grid: int | None = None):
    """bf16 ``scale_a * scale_b * (a @ b.T)`` for e4m3 ``a`` (M x K) and ``b`` (N x K); ``emulate``
    runs CPU tensors in the emulator on ``grid`` CTAs (default: 2, on a GPU one per SM)."""
    import torch
    block_n, promote, store = schedule.block_n, schedule.promote, schedule.store
    check_inputs(a, b, scale_a, scale_b)
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    tiles = -(-m // (64 * CONSUMERS)) * -(-n // block_n)
    if grid is None:
        grid = 2 if emulate else torch.cuda.get_device_properties(a.device).multi_processor_count
    grid = max(1, min(grid, tiles))
    tm_a, tm_b, tm_c = _maps(a, b, c, 64 * CONSUMERS, block_n, emulate)
    args = (tm_a, tm_b, tm_c, c, scale_a, scale_b, m, n, k, n)
    cfg = dict(BLOCK_N=block_n, STAGES=stages_for(block_n, store), PROMOTE=promote, STORE=store)
    if emulate:
        gemm_fp8.emulate(*args, grid=(grid,), **cfg)
    else:
        gemm_fp8[(grid,)](*args, **cfg)
    return c


def emulate_example(m: int = 150, n: int = 136, k: int = 272, grid=None):
    """A ragged e4m3 GEMM in the emulator (``tylopy emulate tylopy_kernels/examples/gemm_fp8.py``):
    (result, float64 reference, tolerance: 2**-7 of the largest sum of |products|)."""
    import torch
    gen = torch.Generator().manual_seed(0)
    a = (torch.randn(m, k, generator=gen) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=gen) * 4).to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([0.5]), torch.tensor([0.25])
    c = scaled_mm(a, b, sa, sb, Fp8Schedule(block_n=128), emulate=True,
                  grid=grid[0] if isinstance(grid, tuple) else grid)
    want = 0.125 * (a.double() @ b.double().T)
    tol = 2.0 ** -7 * 0.125 * float((a.double().abs() @ b.double().abs().T).max())
    return c.double().numpy(), want.numpy(), tol


def main(argv=None):
    """Benchmark against torch._scaled_mm (cuBLAS) on square problems; prints TFLOP/s and the
    largest difference from torch's result relative to max |C|."""
    import argparse

    import torch
    from tylopy.benchmarking import median_ms
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--block-n", type=int, default=256)
    p.add_argument("--promote", action="store_true")
    p.add_argument("--store", choices=("tma", "direct"), default="tma")
    args = p.parse_args(argv)
    for s in args.sizes:
        gen = torch.Generator(device="cuda").manual_seed(s)
        a = torch.randn(s, s, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        b = torch.randn(s, s, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        sa = torch.tensor([0.5], device="cuda")
        sb = torch.tensor([2.0], device="cuda")
        schedule = Fp8Schedule(block_n=args.block_n, promote=args.promote, store=args.store)
        ours = scaled_mm(a, b, sa, sb, schedule)
        flops = 2 * s ** 3
        row = [f"{s}^3"]
        for name, fn in (("tylopy", lambda: scaled_mm(a, b, sa, sb, schedule)),
                         ("torch", lambda: torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)),
                         ("torch fast_accum", lambda: torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16,
                                                                       use_fast_accum=True))):
            ms = median_ms(fn)
            row.append(f"{name} {flops / ms / 1e9:.0f} TFLOP/s ({ms:.3f} ms)")
        ref = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
        rel = float((ours.float() - ref.float()).abs().max() / ref.float().abs().max())
        print("  ".join(row) + f"  max|diff|/max|C| = {rel:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
