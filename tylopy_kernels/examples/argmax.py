"""Masked argmax per row: ``out[r]`` is the index of the largest ``x[r, i]`` among ``mask[r, i]``.

Rules: ties go to the smallest index; a NaN counts as larger than every number (as in
``torch.argmax``), so a row whose unmasked elements hold a NaN returns its first unmasked NaN;
``-inf`` is an ordinary value (a row of unmasked ``-inf`` returns its first unmasked index); a
row with no unmasked element returns -1.

Algorithm: one warp per row. Lane ``l`` scans the elements ``l, l + 32, ...`` in increasing
order and keeps its best value and index (a strict ``>`` keeps the earliest of equal values)
and the index of its first NaN. The warp then combines the 32 candidates with votes and
reductions: ``ty.vote_any`` asks whether some lane saw a NaN (then the answer is the smallest
NaN index, ``ty.warp_reduce("min", ...)``); otherwise ``ty.warp_reduce("max", ...)`` finds the
largest value and a ``"min"`` reduction over the lanes holding it picks the smallest index.

Constraints: ``x`` is a contiguous 2-D float32 tensor ``[rows, n]`` with fewer than 2**31
elements; ``mask`` a bool tensor of the same shape (or None: every element counts).

Run it: ``masked_argmax(x, mask)`` on CUDA tensors (``emulate=True`` with CPU tensors runs it
in the emulator); ``tylopy emulate tylopy_kernels/examples/argmax.py`` checks a ragged example.
"""
import tylopy as ty

WARPS = 4  # rows per block
NONE = 2**31 - 1  # "no index yet"


@ty.kernel(threads=32 * WARPS)
def masked_argmax_rows(x: ty.ptr(ty.f32), mask: ty.ptr(ty.u8), out: ty.ptr(ty.i32), rows: ty.i32, n: ty.i32):
    row = ty.block_idx() * WARPS + ty.warp_idx()
    lane = ty.lane_id()
    if row < rows:  # warp-uniform: the votes and reductions below see a converged warp
        xr = x + row * n
        mr = mask + row * n
        best = ty.cast(float("-inf"), ty.f32)
        best_idx = ty.cast(NONE, ty.i32)
        nan_idx = ty.cast(NONE, ty.i32)
        for i in range(lane, n, 32):
            v = xr[i]
            counts = mr[i] != 0
            is_nan = v != v
            better = (v > best) | ((v == best) & (best_idx == NONE))  # the first -inf counts too
            take = counts & ~is_nan & better
            best = ty.select(take, v, best)
            best_idx = ty.select(take, i, best_idx)
            nan_idx = ty.select(counts & is_nan & (nan_idx == NONE), i, nan_idx)
        first_nan = ty.warp_reduce("min", nan_idx)
        largest = ty.warp_reduce("max", best)  # NaN-free: each lane keeps numbers only
        holder = ty.select((best == largest) & (best_idx != NONE), best_idx, NONE)
        first_largest = ty.warp_reduce("min", holder)
        answer = ty.select(ty.vote_any(nan_idx != NONE), first_nan, first_largest)
        if lane == 0:
            out[row] = ty.select(answer == NONE, -1, answer)


def check_inputs(x, mask, device: str) -> None:
    """Raise ValueError/TypeError naming the argument that a launch could not take."""
    import torch
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"masked_argmax: x expects a torch.Tensor, but got {type(x).__name__}")
    if x.device.type != device:
        raise ValueError(f"masked_argmax: x expects a {device} tensor, but got one on {x.device}")
    if x.dim() != 2 or x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(f"masked_argmax: x expects a contiguous 2-D float32 tensor, but got shape "
                         f"{tuple(x.shape)}, dtype {x.dtype}, contiguous={x.is_contiguous()}")
    if x.numel() >= 2**31:
        raise ValueError(f"masked_argmax: x expects fewer than 2**31 elements, but got {x.numel()}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"masked_argmax: mask expects a bool tensor or None, but got "
                            f"{getattr(mask, 'dtype', type(mask).__name__)}")
        if mask.shape != x.shape or mask.device != x.device:
            raise ValueError(f"masked_argmax: mask expects shape {tuple(x.shape)} on {x.device} (like x), but got "
                             f"shape {tuple(mask.shape)} on {mask.device}")


def masked_argmax(x, mask=None, *, emulate: bool = False):
    """int32 index of each row's largest unmasked element (rules in the module doc)."""
    import torch
    check_inputs(x, mask, "cpu" if emulate else "cuda")
    rows, n = x.shape
    out = torch.full((rows,), -1, dtype=torch.int32, device=x.device)
    if rows == 0 or n == 0:
        return out
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.contiguous()
    m8 = m.view(torch.uint8)
    grid = ((rows + WARPS - 1) // WARPS,)
    if emulate:
        masked_argmax_rows.emulate(x, m8, out, rows, n, grid=grid)
    else:
        masked_argmax_rows[grid](x, m8, out, rows, n)
    return out


def reference(x, mask):
    """The rules of the module doc, element by element in float64 (a numpy int64 array)."""
    import numpy as np
    xs = x.double().numpy()
    ms = np.ones(xs.shape, bool) if mask is None else mask.numpy()
    out = np.full(xs.shape[0], -1, dtype=np.int64)
    for r in range(xs.shape[0]):
        idx = np.flatnonzero(ms[r])
        if idx.size == 0:
            continue
        vals = xs[r, idx]
        nans = idx[np.isnan(vals)]
        out[r] = nans[0] if nans.size else idx[int(np.argmax(vals))]  # argmax: first of the largest
    return out


def emulate_example(rows: int = 11, n: int = 75):
    """``tylopy emulate tylopy_kernels/examples/argmax.py``: random rows with ties, NaN, -inf and empty masks."""
    import torch
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-20, 20, (rows, n), generator=g).float()  # small integers: many ties
    mask = torch.rand(rows, n, generator=g) < 0.7
    x[1, 40] = float("nan")
    x[2] = float("-inf")
    mask[3] = False
    got = masked_argmax(x, mask, emulate=True)
    return got.numpy(), reference(x, mask), 0.0
