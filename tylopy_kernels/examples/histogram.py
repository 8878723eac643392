"""Histogram: ``counts[b]`` is the number of elements of ``data`` equal to ``b``, for ``0 <= b < nbins``.

Algorithm (shared-memory privatization): each block keeps its own histogram in shared memory.
It clears it, walks the input with a grid-stride loop adding 1 to its private bin with
``ty.red_add`` on shared memory (``red.shared.add``, CTA scope: only the block's threads touch
it), waits at a barrier, and then adds each non-empty private bin to the global histogram
with ``ty.red_add`` on global memory (``red.global.add``). Contention on the global counters
drops from one update per element to one per block and bin. Values outside ``[0, nbins)`` are
ignored. Integer counts are exact whatever the order of the atomic updates.

Constraints: ``data`` is a contiguous 1-D int32 tensor with fewer than 2**31 elements;
``1 <= nbins <= 12288`` (the private copy lives in 48 KB of static shared memory).

Run it: ``histogram(data, nbins)`` on a CUDA tensor (``emulate=True`` with a CPU tensor runs it in
the emulator, blocks one after another); ``tylopy emulate tylopy_kernels/examples/histogram.py``.
"""
import tylopy as ty

BLOCK = 256
MAX_BINS = 12288


@ty.kernel(threads=BLOCK)
def histogram_kernel(data: ty.ptr(ty.i32), n: ty.i32, counts: ty.ptr(ty.i32), NBINS: ty.constexpr):
    t = ty.thread_idx()
    private = ty.shared(ty.i32, NBINS)
    for b in range(t, NBINS, BLOCK):
        private[b] = 0
    ty.syncthreads()
    for i in range(ty.block_idx() * BLOCK + t, n, ty.grid_dim() * BLOCK):
        v = data[i]
        if (v >= 0) & (v < NBINS):
            ty.red_add(private + v, 1, scope="cta")
    ty.syncthreads()  # every private update is done before the bins are read
    for b in range(t, NBINS, BLOCK):
        c = private[b]
        if c != 0:
            ty.red_add(counts + b, c)


def check_inputs(data, nbins, device: str) -> None:
    """Raise ValueError/TypeError naming the argument that a launch could not take."""
    import torch
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"histogram: data expects a torch.Tensor, but got {type(data).__name__}")
    if data.device.type != device:
        raise ValueError(f"histogram: data expects a {device} tensor, but got one on {data.device}")
    if data.dim() != 1 or data.dtype != torch.int32 or not data.is_contiguous():
        raise ValueError(f"histogram: data expects a contiguous 1-D int32 tensor, but got shape {tuple(data.shape)}, "
                         f"dtype {data.dtype}, contiguous={data.is_contiguous()}")
    if data.numel() >= 2**31:
        raise ValueError(f"histogram: data expects fewer than 2**31 elements, but got {data.numel()}")
    if isinstance(nbins, bool) or not isinstance(nbins, int) or not 1 <= nbins <= MAX_BINS:
        raise ValueError(f"histogram: nbins expects an int in 1..{MAX_BINS} (48 KB of shared memory), "
                         f"but got {nbins!r}")


def histogram(data, nbins: int, *, blocks: int | None = None, emulate: bool = False):
    """int32 counts of the values 0..nbins-1 in ``data`` (CUDA; CPU with ``emulate=True``)."""
    import torch
    check_inputs(data, nbins, "cpu" if emulate else "cuda")
    counts = torch.zeros(nbins, dtype=torch.int32, device=data.device)
    n = data.numel()
    if n == 0:
        return counts
    if blocks is None:
        limit = 8 if emulate else 4 * torch.cuda.get_device_properties(data.device).multi_processor_count
        blocks = min((n + BLOCK - 1) // BLOCK, limit)
    if emulate:
        histogram_kernel.emulate(data, n, counts, grid=(blocks,), NBINS=nbins)
    else:
        histogram_kernel[(blocks,)](data, n, counts, NBINS=nbins)
    return counts


def emulate_example(n: int = 5000, nbins: int = 300):
    """``tylopy emulate tylopy_kernels/examples/histogram.py``: skewed random data with out-of-range values."""
    import torch
    g = torch.Generator().manual_seed(3)
    data = (torch.randn(n, generator=g).abs() * nbins / 3).int() - 5  # some negative, some >= nbins
    got = histogram(data, nbins, emulate=True)
    inside = data[(data >= 0) & (data < nbins)].long()
    return got.numpy(), torch.bincount(inside, minlength=nbins).numpy(), 0.0
