"""RMSNorm: ``y[r, :] = x[r, :] / sqrt(mean(x[r, :]**2) + eps) * weight``, one row per warp.

Algorithm: each warp owns one row. Lane ``l`` accumulates the squares of the row's elements
``l, l + 32, l + 64, ...`` in f32 (in that order, with fma), ``ty.warp_reduce("sum", ...)``
combines the 32 partial sums in its butterfly order so every lane holds the row's total, and
each lane then writes its elements scaled by ``1 / sqrt(total / n + eps)`` (correctly rounded
``sqrt`` and division) and by the weight. Statistics are in f32 for both storage types.

Constraints: ``x`` is a contiguous 2-D tensor ``[rows, n]`` of float32 or bfloat16 with fewer
than 2**31 elements, ``weight`` a contiguous 1-D tensor of ``n`` elements of the same dtype;
any ``n >= 1`` (the last lanes of a row simply have fewer elements). One kernel per dtype
(``rmsnorm_kernel(ty.f32)``, ``rmsnorm_kernel(ty.bf16)``).

Run it: ``rmsnorm(x, weight, eps)`` on CUDA tensors; ``rmsnorm(x, weight, eps, emulate=True)``
on CPU tensors runs the same kernel in the emulator; ``tylopy emulate
tylopy_kernels/examples/rmsnorm.py`` checks a ragged example against torch in float64.
"""
import functools

import tylopy as ty

WARPS = 4  # rows per block


@functools.cache
def rmsnorm_kernel(dtype):
    """The RMSNorm kernel for rows of ``dtype`` (``ty.f32`` or ``ty.bf16``)."""

    @ty.kernel(threads=32 * WARPS, name=f"rmsnorm_{dtype}")
    def rmsnorm_rows(x: ty.ptr(dtype), weight: ty.ptr(dtype), y: ty.ptr(dtype), rows: ty.i32, n: ty.i32,
                     eps: ty.f32):
        row = ty.block_idx() * WARPS + ty.warp_idx()
        lane = ty.lane_id()
        if row < rows:  # the same in every lane of the warp: the warp stays converged
            xr = x + row * n
            yr = y + row * n
            squares = ty.cast(0.0, ty.f32)
            for i in range(lane, n, 32):
                v = ty.cast(xr[i], ty.f32)
                squares = ty.fma(v, v, squares)
            total = ty.warp_reduce("sum", squares)
            inv_rms = 1.0 / ty.sqrt(total / ty.cast(n, ty.f32) + eps)
            for i in range(lane, n, 32):
                v = ty.cast(xr[i], ty.f32) * inv_rms * ty.cast(weight[i], ty.f32)
                yr[i] = ty.cast(v, dtype)

    return rmsnorm_rows


rmsnorm_f32 = rmsnorm_kernel(ty.f32)    # module-level, so `tylopy dump` finds both
rmsnorm_bf16 = rmsnorm_kernel(ty.bf16)


def _dtype_of(t):
    import torch
    return {torch.float32: ty.f32, torch.bfloat16: ty.bf16}.get(t.dtype)


def check_inputs(x, weight, eps, device: str) -> None:
    """Raise ValueError/TypeError naming the argument that a launch could not take."""
    import torch
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rmsnorm: {name} expects a torch.Tensor, but got {type(t).__name__}")
        if t.device.type != device:
            raise ValueError(f"rmsnorm: {name} expects a {device} tensor, but got one on {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"rmsnorm: {name} expects a contiguous tensor (call .contiguous())")
    if x.dim() != 2 or x.shape[1] < 1:
        raise ValueError(f"rmsnorm: x expects a 2-D tensor [rows, n] with n >= 1, but got shape {tuple(x.shape)}")
    if _dtype_of(x) is None:
        raise TypeError(f"rmsnorm: x expects dtype torch.float32 or torch.bfloat16, but got {x.dtype}")
    if weight.dtype != x.dtype or weight.shape != (x.shape[1],):
        raise ValueError(f"rmsnorm: weight expects shape ({x.shape[1]},) and dtype {x.dtype} (like x), but got "
                         f"shape {tuple(weight.shape)} and dtype {weight.dtype}")
    if x.numel() >= 2**31:
        raise ValueError(f"rmsnorm: x expects fewer than 2**31 elements (32-bit offsets), but got {x.numel()}")
    if not (isinstance(eps, (int, float)) and eps > 0 and eps < float("inf")):
        raise ValueError(f"rmsnorm: eps expects a positive finite number, but got {eps!r}")


def rmsnorm(x, weight, eps: float = 1e-6, *, emulate: bool = False):
    """RMSNorm of each row of ``x`` (CUDA tensors; CPU tensors with ``emulate=True``)."""
    import torch
    check_inputs(x, weight, eps, "cpu" if emulate else "cuda")
    y = torch.empty_like(x)
    rows, n = x.shape
    if rows == 0:
        return y
    kernel = rmsnorm_kernel(_dtype_of(x))
    grid = ((rows + WARPS - 1) // WARPS,)
    if emulate:
        kernel.emulate(x, weight, y, rows, n, float(eps), grid=grid)
    else:
        kernel[grid](x, weight, y, rows, n, float(eps))
    return y


def reference(x, weight, eps: float):
    """RMSNorm in float64 (the result is not rounded to x's dtype)."""
    x64, w64 = x.double(), weight.double()
    return x64 * (x64.pow(2).mean(dim=1, keepdim=True) + eps).rsqrt() * w64


def emulate_example(rows: int = 9, n: int = 77):
    """``tylopy emulate tylopy_kernels/examples/rmsnorm.py``: a ragged f32 and bf16 example against float64 torch."""
    import torch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, n, generator=g) * 3
    w = torch.rand(n, generator=g) + 0.5
    y32 = rmsnorm(x, w, 1e-5, emulate=True)
    y16 = rmsnorm(x.bfloat16(), w.bfloat16(), 1e-5, emulate=True)
    ref16 = reference(x.bfloat16(), w.bfloat16(), 1e-5)
    err16 = ((y16.double() - ref16).abs() / ref16.abs().clamp_min(1e-3)).max().item()
    if err16 > 2**-7:  # one bf16 rounding of the output, plus the f32 statistics
        raise RuntimeError(f"rmsnorm bf16: relative error {err16:.3g} exceeds 2**-7")
    return y32.numpy(), reference(x, w, 1e-5).numpy(), 1e-5
