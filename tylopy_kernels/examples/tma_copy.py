"""Scaled copy through the TMA: ``out = alpha * x`` for a 2-D tensor, one tile per block.

The smallest complete TMA kernel (sm_90a), in the order the hardware needs it:

1. One thread initializes an mbarrier expecting one arrival, publishes the init
   (``fence_mbarrier_init`` and ``fence_proxy_async``) and a ``syncthreads`` makes it visible.
2. One thread arms the barrier with the box's byte count (``mbarrier_arrive_expect_tx``) and
   issues ``tma_load`` of the block's (BM, BN) box into shared memory; every thread waits on
   phase 0 of the barrier. Rows and columns past the tensor's end arrive as zeros and the whole
   box is credited to the barrier, so the byte count is always ``tm.box_bytes``.
3. Each thread scales its elements in shared memory (the box is row-major there: ``swizzle=0``),
   then runs ``fence_proxy_async`` (ordinary stores become visible to the TMA), and a
   ``syncthreads`` orders every write before the store.
4. One thread ``tma_store``s the box into ``out`` (the TMA clips it at the tensor's edges),
   closes the bulk group and waits until the store has read shared memory before the block exits.

Host side: ``ty.tensor_map(x, box=(BM, BN))`` describes each tensor once; the same maps run on the
GPU (CUDA tensors) and in ``kernel.emulate`` (CPU tensors). Coordinates in the kernel are
innermost first: ``(column, row)``.

Constraints (checked by ``ty.tensor_map``, which names the argument): x and out are 2-D with
their rows 16-byte aligned (for float32, a multiple of 4 columns) and the same shape and dtype
(float32, float16 or bfloat16).

Run it: ``scaled_copy(x, alpha)`` on a CUDA tensor, ``emulate=True`` with a CPU tensor;
``tylopy emulate tylopy_kernels/examples/tma_copy.py`` checks a ragged example.
"""
import functools

import tylopy as ty
from tylopy import hopper

BM, BN = 32, 32   # the box: 32 rows of 32 columns (128 bytes of float32 a row)
THREADS = 128


@functools.cache
def copy_kernel(dtype):
    @ty.kernel(threads=THREADS, arch="sm_90a", name=f"tma_scaled_copy_{dtype}")
    def tma_scaled_copy(src: ty.tensormap, dst: ty.tensormap, alpha: ty.f32,
                        box_bytes: ty.constexpr = BM * BN * dtype.nbytes):  # what tm.box_bytes says
        tile = ty.shared(dtype, BM * BN, align=128)   # TMA tiles are 128-byte aligned
        bar = ty.shared(ty.u64, 1, align=8)
        t = ty.thread_idx()
        if t == 0:
            hopper.mbarrier_init(bar, 1, label="tile full")
            hopper.fence_mbarrier_init()
            hopper.fence_proxy_async()
        ty.syncthreads()
        col0 = ty.block_idx(0) * BN
        row0 = ty.block_idx(1) * BM
        if t == 0:
            hopper.mbarrier_arrive_expect_tx(bar, box_bytes)
            hopper.tma_load(tile, src, bar, col0, row0)
        hopper.mbarrier_wait(bar, 0, label="tile full")
        for i in ty.static_range(BM * BN // THREADS):
            at = tile + (i * THREADS + t)
            ty.store(at, ty.cast(ty.cast(ty.load(at), ty.f32) * alpha, dtype))
        hopper.fence_proxy_async()
        ty.syncthreads()
        if t == 0:
            hopper.tma_store(dst, tile, col0, row0)
            hopper.bulk_commit()
            hopper.bulk_wait(0, read=True)   # the source tile must outlive the store's reads

    return tma_scaled_copy


tma_scaled_copy_f32 = copy_kernel(ty.f32)  # module-level, so `tylopy dump` finds it
tma_scaled_copy_bf16 = copy_kernel(ty.bf16)


def check_inputs(x, device: str) -> None:
    """Raise TypeError/ValueError naming the argument a launch could not take."""
    import torch
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"scaled_copy: x expects a torch.Tensor, but got {type(x).__name__}")
    if x.device.type != device:
        raise ValueError(f"scaled_copy: x expects a {device} tensor, but got one on {x.device}")
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"scaled_copy: x expects a 2-D float32 or bfloat16 tensor, but got shape {tuple(x.shape)}, "
                         f"dtype {x.dtype}")


def scaled_copy(x, alpha: float, *, emulate: bool = False):
    """``alpha * x`` through TMA loads and stores (CUDA; CPU with ``emulate=True``)."""
    import torch
    check_inputs(x, "cpu" if emulate else "cuda")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return out
    src = ty.tensor_map(x, box=(BM, BN))    # (rows, columns), as x.shape
    dst = ty.tensor_map(out, box=(BM, BN))
    kernel = copy_kernel(ty.f32 if x.dtype == torch.float32 else ty.bf16)
    grid = ((x.shape[1] + BN - 1) // BN, (x.shape[0] + BM - 1) // BM)
    if emulate:
        kernel.emulate(src, dst, alpha, box_bytes=src.box_bytes, grid=grid)
    else:
        kernel[grid](src, dst, alpha, box_bytes=src.box_bytes)
    return out


def reference(x, alpha: float):
    """float64 alpha * x, rounded once to x's dtype (what the kernel computes: an f32 product, one rounding)."""
    return (x.double() * alpha).float().to(x.dtype)


def emulate_example(rows: int = 45, cols: int = 76):
    """``tylopy emulate tylopy_kernels/examples/tma_copy.py``: a ragged 2 x 3 grid of boxes, against float64."""
    import torch
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, cols, generator=g)
    y = scaled_copy(x, 1.5, emulate=True)
    return y.numpy(), (x.double() * 1.5).numpy(), 1e-6
