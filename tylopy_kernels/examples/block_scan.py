"""Inclusive prefix sum: ``y[i] = x[0] + ... + x[i]``, within a block and over any length.

Algorithm, one block of 256 threads per tile of 1024 elements (4 per thread):

1. Each thread loads 4 consecutive elements (zero past the end) and sums them in order,
   keeping the running sums.
2. ``block_exclusive_scan``: a warp scan of the thread totals with ``ty.shfl_up`` (Kogge-Stone:
   offsets 1, 2, 4, 8, 16), the 8 warp totals through shared memory, scanned by warp 0 the same
   way; each thread gets the sum of everything before it in the tile, and the tile's total.
3. ``y = that prefix + the thread's running sum``; the tile's total goes to ``tile_sums``.

Longer inputs take a second pass: the tile totals are scanned with the same code (recursively,
1024 tiles per level), and ``add_tile_offsets`` adds each tile's predecessor total. Floats add
in this fixed order: an element's value passes through about 15 roundings per level, so it is
within ``64 * 2**-24 * sum(|x|)`` of the exact sum for up to two levels (a million elements);
integers wrap like C's.

Constraints: ``x`` is a contiguous 1-D float32 or int32 tensor with fewer than 2**31 elements.

Run it: ``prefix_sum(x)`` on a CUDA tensor (``emulate=True`` with a CPU tensor runs it in the
emulator); ``tylopy emulate tylopy_kernels/examples/block_scan.py`` checks a ragged two-level example.
"""
import functools

import tylopy as ty

BLOCK = 256
ITEMS = 4
TILE = BLOCK * ITEMS
NWARPS = BLOCK // 32


@ty.func
def warp_inclusive_scan(v):
    """Each lane gets the sum of the values of lanes 0..lane (the whole warp must be converged)."""
    lane = ty.lane_id()
    for k in ty.static_range(5):
        d = 1 << k
        below = ty.shfl_up(v, d)
        v = ty.select(lane >= d, v + below, v)
    return v


@ty.func
def block_exclusive_scan(v, totals):
    """(sum of the values of threads 0..tid-1, sum over the block); ``totals``: NWARPS shared slots."""
    lane = ty.lane_id()
    warp = ty.warp_idx()
    zero = ty.cast(0, v.type)
    inclusive = warp_inclusive_scan(v)
    exclusive = ty.select(lane == 0, zero, ty.shfl_up(inclusive, 1))
    if lane == 31:
        totals[warp] = inclusive
    ty.syncthreads()
    if warp == 0:
        s = warp_inclusive_scan(ty.load(totals + lane, mask=lane < NWARPS))
        if lane < NWARPS:
            totals[lane] = s
    ty.syncthreads()
    before = ty.load(totals + (warp - 1), mask=warp > 0)  # warp 0: nothing before it, reads zero
    return before + exclusive, totals[NWARPS - 1]


@functools.cache
def scan_kernels(dtype):
    """(scan_tiles, add_tile_offsets) for ``dtype`` (``ty.f32`` or ``ty.i32``)."""

    @ty.kernel(threads=BLOCK, name=f"scan_tiles_{dtype}")
    def scan_tiles(x: ty.ptr(dtype), y: ty.ptr(dtype), tile_sums: ty.ptr(dtype), n: ty.i32):
        t = ty.thread_idx()
        first = ty.block_idx() * TILE + t * ITEMS
        running = []
        acc = ty.cast(0, dtype)
        for k in ty.static_range(ITEMS):
            acc = acc + ty.load(x + (first + k), mask=first + k < n)
            running.append(acc)
        totals = ty.shared(dtype, NWARPS)
        before, tile_total = block_exclusive_scan(acc, totals)
        for k in ty.static_range(ITEMS):
            if first + k < n:
                y[first + k] = before + running[k]
        if t == 0:
            tile_sums[ty.block_idx()] = tile_total

    @ty.kernel(threads=BLOCK, name=f"add_tile_offsets_{dtype}")
    def add_tile_offsets(y: ty.ptr(dtype), scanned_sums: ty.ptr(dtype), n: ty.i32):
        b = ty.block_idx()
        if b > 0:
            offset = scanned_sums[b - 1]
            for k in ty.static_range(ITEMS):
                i = b * TILE + k * BLOCK + ty.thread_idx()  # consecutive threads, consecutive elements
                if i < n:
                    y[i] = y[i] + offset

    return scan_tiles, add_tile_offsets


scan_tiles_f32, add_tile_offsets_f32 = scan_kernels(ty.f32)  # module-level, so `tylopy dump` finds them
scan_tiles_i32, add_tile_offsets_i32 = scan_kernels(ty.i32)


def check_inputs(x, device: str) -> None:
    """Raise ValueError/TypeError naming the argument that a launch could not take."""
    import torch
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"prefix_sum: x expects a torch.Tensor, but got {type(x).__name__}")
    if x.device.type != device:
        raise ValueError(f"prefix_sum: x expects a {device} tensor, but got one on {x.device}")
    if x.dim() != 1 or not x.is_contiguous() or x.dtype not in (torch.float32, torch.int32):
        raise ValueError(f"prefix_sum: x expects a contiguous 1-D float32 or int32 tensor, but got shape "
                         f"{tuple(x.shape)}, dtype {x.dtype}, contiguous={x.is_contiguous()}")
    if x.numel() >= 2**31:
        raise ValueError(f"prefix_sum: x expects fewer than 2**31 elements, but got {x.numel()}")


def prefix_sum(x, *, emulate: bool = False):
    """Inclusive prefix sum of a 1-D float32/int32 tensor (CUDA; CPU with ``emulate=True``)."""
    import torch
    check_inputs(x, "cpu" if emulate else "cuda")
    n = x.numel()
    y = torch.empty_like(x)
    if n == 0:
        return y
    scan_tiles, add_offsets = scan_kernels(ty.f32 if x.dtype == torch.float32 else ty.i32)
    tiles = (n + TILE - 1) // TILE
    sums = torch.empty(tiles, dtype=x.dtype, device=x.device)
    launch = (lambda k, *a: k.emulate(*a, grid=(tiles,))) if emulate else (lambda k, *a: k[(tiles,)](*a))
    launch(scan_tiles, x, y, sums, n)
    if tiles > 1:  # second pass: scan the tile totals, then add each tile's predecessor total
        launch(add_offsets, y, prefix_sum(sums, emulate=emulate), n)
    return y


def emulate_example(n: int = 2 * TILE + 77):
    """``tylopy emulate tylopy_kernels/examples/block_scan.py``: three tiles, the last one ragged, against float64."""
    import torch
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, generator=g)
    y = prefix_sum(x, emulate=True)
    ref = torch.cumsum(x.double(), 0)
    tol = 64 * 2**-24 * float(x.abs().sum())
    return y.numpy(), ref.numpy(), tol
