"""``scaled_matmul``: the PyTorch entry point of the scaled FP8 GEMM, and its torch operator.

    c = tylopy.scaled_matmul(x_fp8, w_fp8.t(), scale_x, scale_w)                  # per tensor
    c = tylopy.scaled_matmul(x_fp8, w_fp8.t(), sx, sw, bias=b, out_dtype=torch.float32)
    tylopy::scaled_matmul(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, schedule) -> Tensor

The arguments follow ``torch._scaled_mm(a, b, scale_a, scale_b, bias, out_dtype=..., use_fast_accum=...)``:
``a`` (M, K) row-major and ``b`` (K, N) column-major, e4m3 or e5m2 in any mix; the scales are
float32 and their shapes pick the form (``fp8_launch.scale_form``): one element each (per
tensor), (M, 1) and (1, N) (A per row, B per column), or (M, ceil(K/128)) and (ceil(K/128),
ceil(N/128)) (A in 1 x 128 blocks, B in 128 x 128 blocks, the DeepSeek-V3 recipe; torch's
blockwise forms). The product is sum over k of (a[m, k] scale_a) (b[k, n] scale_b), plus
``bias`` (N,) (bf16, fp16 or fp32, added in fp32), as ``out_dtype`` (bf16 by default, fp16 or
fp32; torch's default of the input dtype, fp8, is not offered).

``use_fast_accum`` is torch's: False (the default) adds every 128-wide k-block's tensor-core
result into an f32 accumulator, True chains all of K in the tensor cores' FP8 accumulator
(about 13 fraction bits, docs/fp8.md; faster). Block scales always promote (the scales are
applied there). ``schedule`` fixes BLOCK_N, STAGES and GROUP_M; without it ``ty.autotune`` picks.

On Hopper (sm_90) the kernel runs; on another CUDA GPU a torch reference (dequantize to fp32,
matmul) runs with one warning. Under ``torch.compile`` / ``torch.export`` and for meta or fake
tensors the call goes through the ``tylopy::scaled_matmul`` operator (a fake implementation
gives the output's shape); CPU tensors run the reference there. Not differentiable.
"""
from __future__ import annotations

import functools
import warnings
from typing import Optional

import torch
from torch import Tensor

_warned = set()


def _expand_scales(a, b, scale_a, scale_b):
    """The scales broadcast to A (M, K) and B (K, N), in fp32."""
    m, k = a.shape
    n = b.shape[1]
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return scale_a.reshape(1, 1).float(), scale_b.reshape(1, 1).float()
    if tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n):
        return scale_a.float(), scale_b.float()
    sa = scale_a.float().repeat_interleave(128, dim=1)[:, :k]
    sb = scale_b.float().repeat_interleave(128, dim=0)[:k].repeat_interleave(128, dim=1)[:, :n]
    return sa, sb


def reference(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16, dtype=torch.float32):
    """(a scale_a) @ (b scale_b) + bias, dequantized to ``dtype`` (fp32: the fallback; float64:
    the tests' reference)."""
    sa, sb = _expand_scales(a, b, scale_a, scale_b)
    c = (a.to(dtype) * sa.to(dtype)) @ (b.to(dtype) * sb.to(dtype))
    if bias is not None:
        c = c + bias.to(dtype)
    return c.to(out_dtype)


@torch.library.custom_op("tylopy::scaled_matmul", mutates_args=())
def scaled_matmul_op(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, bias: Optional[Tensor],
                     out_dtype: torch.dtype, use_fast_accum: bool, schedule: str) -> Tensor:
    if a.device.type == "cuda":
        import ast
        return launch_scaled_matmul(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum,
                                    schedule=dict(ast.literal_eval(schedule)) if schedule else None)
    return reference(a, b, scale_a, scale_b, bias, out_dtype)


@scaled_matmul_op.register_fake
def _(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, schedule):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def through_op(a) -> bool:
    """A trace, meta/fake tensors or a tensor subclass need the operator."""
    return type(a) is not torch.Tensor or a.is_meta or torch.compiler.is_compiling()


def scaled_matmul(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16, use_fast_accum=False, *,
                  schedule=None):
    """(a scale_a) @ (b scale_b) + bias for fp8 ``a`` (M, K) row-major and ``b`` (K, N) column-major,
    with ``torch._scaled_mm``'s argument conventions (module docstring; docs/fp8.md)."""
    if isinstance(a, torch.Tensor) and through_op(a):
        from tylopy_kernels.gemm.fp8_launch import check_inputs
        out_dtype = check_inputs(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, schedule)[4]
        if a.device.type not in ("cuda", "meta", "cpu"):
            raise ValueError(f"scaled_matmul: a expects a CUDA tensor, but got a tensor on {a.device}")
        key = "" if schedule is None else repr(tuple(sorted(schedule.items())))
        return scaled_matmul_op(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, key)
    return launch_scaled_matmul(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, schedule=schedule)


@functools.lru_cache(maxsize=None)
def _capability(device_index):
    return torch.cuda.get_device_capability(device_index)


_plans = None  # a PlanCache, made at the end of the module


def _signature(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, schedule):
    def t(x):
        return None if x is None else (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16)
    return (t(a), t(b), t(scale_a), t(scale_b), t(bias), out_dtype, use_fast_accum,
            None if schedule is None else tuple(sorted(schedule.items())))


def launch_scaled_matmul(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16, use_fast_accum=False, *,
                         schedule=None):
    """``scaled_matmul`` on plain CUDA tensors: checks (skipped for a signature seen before), launch."""
    from tylopy_kernels.gemm.launch import output_buffer
    try:
        sig = _signature(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, schedule)
        plan = _plans.get(sig)
    except (AttributeError, TypeError):  # not tensors, or an unhashable argument: the checks say why
        sig = plan = None
    if plan is not None:
        out = output_buffer(plan.m, plan.n, plan.out_dtype, a.device)
        plan(a, b, out, scale_a, scale_b, bias)
        return out if out.is_contiguous() else out.contiguous()
    from tylopy_kernels.gemm.fp8_launch import check_inputs, full_schedule, make_plan, run
    m, n, k, form, out_dtype = check_inputs(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, schedule)
    if a.device.type != "cuda":
        raise ValueError(f"scaled_matmul: a expects a CUDA tensor, but got a tensor on {a.device}")
    major, minor = _capability(a.device.index)
    if major != 9:
        if major not in _warned:
            _warned.add(major)
            warnings.warn(f"scaled_matmul: the FP8 kernel needs a Hopper GPU (sm_90: FP8 wgmma and TMA), but got "
                          f"sm_{major}{minor}; computing with torch in fp32 instead", RuntimeWarning, stacklevel=2)
        return reference(a, b, scale_a, scale_b, bias, out_dtype)
    if m == 0 or n == 0 or k == 0:  # an empty sum: zeros, plus the bias
        out = torch.zeros((m, n), dtype=torch.float32, device=a.device)
        return (out + bias.float() if bias is not None else out).to(out_dtype)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    out = output_buffer(m, n, out_dtype, a.device)
    promote = form == "block" or not use_fast_accum
    with torch.cuda.device(a.device):
        cfg = full_schedule(schedule, promote) if schedule is not None else \
            run.best_config(a, b, out, scale_a, scale_b, bias, promote).kwargs
        plan = make_plan(a, b, out, scale_a, scale_b, bias, form, cfg)
        plan(a, b, out, scale_a, scale_b, bias)
    if sig is not None and (bias is None or sig[4][1] == (1,)):
        _plans.put(sig, plan)
    return out if out.is_contiguous() else out.contiguous()


import tylopy as ty  # noqa: E402  (last: tylopy imports this module's entry point)

_plans = ty.PlanCache("scaled_matmul plans", capacity=1024)

__all__ = ["scaled_matmul", "scaled_matmul_op", "launch_scaled_matmul", "reference"]
