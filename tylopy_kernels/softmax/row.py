"""Row softmax, one warp per row: the first reduction kernel to read.

Computes ``out[r, :] = exp(x[r, :] - max_r) / sum(exp(x[r, :] - max_r))`` for a (rows, cols)
float32 tensor, i.e. ``torch.softmax(x, dim=1)``.

Algorithm: a block of ``WARPS`` warps handles ``WARPS`` consecutive rows, one warp per row.
Lane ``i`` of a warp owns the columns i, i+32, i+64, ... of its row, and the row is read three
times:

1. each lane keeps a running maximum of its columns; a butterfly of ``shfl_xor`` exchanges
   (lane distances 16, 8, 4, 2, 1) leaves the row maximum ``m`` in every lane;
2. each lane sums ``exp(x - m)`` over its columns, and a second butterfly gives the row sum ``l``.
   ``exp(x - m)`` is computed as ``exp2(x*log2(e) - m*log2(e))``: one fma and one ``ex2.approx``.
   The shift ``m*log2(e)`` is rounded once and used for every element and for ``l``, so its
   rounding error is a common factor that the division cancels;
3. each lane writes ``exp2(...) * (1/l)``.

Constraints: x is a 2-D float32 CUDA tensor (copied first if not contiguous); any cols >= 1.
A row whose logits are all -inf gives zeros (torch gives NaN); NaN logits give a NaN row.

Run and check (needs a GPU)::

    python -c "import torch; from tylopy_kernels.softmax.row import softmax; \\
x = torch.randn(1000, 777, device='cuda'); print((softmax(x) - torch.softmax(x, 1)).abs().max())"

Inspect the PTX and the ptxas report (no GPU needed)::

    python -c "from tylopy_kernels.softmax.row import row_softmax; k = row_softmax.compile(); \\
print(k.ptx); print(k.report)"
"""
import tylopy as ty

WARPS = 4  # rows per block, one warp each
LOG2E = 1.4426950408889634  # exp(t) == exp2(t * LOG2E)
NEG_INF = float("-inf")


@ty.func
def warp_max(v):
    """The maximum of ``v`` over the warp's 32 lanes, in every lane."""
    for offset in (16, 8, 4, 2, 1):  # a compile-time loop: unrolls into five shuffles
        v = ty.maximum(v, ty.shfl_xor(v, offset))
    return v


@ty.func
def warp_sum(v):
    """The sum of ``v`` over the warp's 32 lanes, in every lane."""
    for offset in (16, 8, 4, 2, 1):
        v = v + ty.shfl_xor(v, offset)
    return v


@ty.kernel(threads=WARPS * 32, noalias=True)
def row_softmax(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), rows: ty.i32, cols: ty.i32):
    lane = ty.thread_idx() & 31
    row = ty.block_idx() * WARPS + (ty.thread_idx() >> 5)
    if row < rows:  # whole warps leave together, so the shuffles below always see 32 lanes
        start = ty.cast(row, ty.i64) * ty.cast(cols, ty.i64)  # i64: rows*cols may pass 2**31
        x_row = x + start
        out_row = out + start

        m = ty.cast(NEG_INF, ty.f32)
        for c in range(lane, cols, 32):  # run-time bounds: an IR loop, not unrolled
            m = ty.maximum(m, x_row[c])
        m = warp_max(m)
        # The shift in the exp2 domain; an all -inf row takes 0 so that no -inf - (-inf) appears.
        shift = ty.select(m == NEG_INF, 0.0, m * LOG2E)

        l = ty.cast(0.0, ty.f32)
        for c in range(lane, cols, 32):
            l = l + ty.exp2(ty.fma(x_row[c], LOG2E, -shift))
        l = warp_sum(l)
        inv_l = ty.select(l > 0.0, ty.rcp(l), 0.0)  # l == 0 only for an all -inf row

        for c in range(lane, cols, 32):
            out_row[c] = ty.exp2(ty.fma(x_row[c], LOG2E, -shift)) * inv_l


def softmax(x, out=None):
    """``torch.softmax(x, dim=1)`` for a 2-D float32 CUDA tensor; written into ``out`` if given."""
    import torch
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax expects x to be a torch.Tensor, but got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"softmax expects x of dtype torch.float32, but got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"softmax expects x to be 2-D (rows, cols), but got shape {tuple(x.shape)}")
    if x.device.type != "cuda":
        raise ValueError(f"softmax expects x on a CUDA device, but got one on {x.device}")
    x = x.contiguous()
    if out is None:
        out = torch.empty_like(x)
    elif not isinstance(out, torch.Tensor):
        raise TypeError(f"softmax expects out to be a torch.Tensor or None, but got {type(out).__name__}")
    elif out.dtype != x.dtype or out.shape != x.shape or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"softmax expects out to be a contiguous tensor like x ({x.dtype}, shape {tuple(x.shape)}, "
                         f"{x.device}), but got {out.dtype}, shape {tuple(out.shape)}, {out.device}, "
                         f"strides {out.stride()}")
    nbytes = 4 * x.numel()
    if x.data_ptr() < out.data_ptr() + nbytes and out.data_ptr() < x.data_ptr() + nbytes:
        raise ValueError("softmax expects out not to overlap x (x is read again after out is written)")
    rows, cols = x.shape
    if rows and cols:
        row_softmax[((rows + WARPS - 1) // WARPS,)](x, out, rows, cols)
    return out
