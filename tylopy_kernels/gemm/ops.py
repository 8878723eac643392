"""``tylopy::matmul``: the GEMM as a torch operator, differentiable and traceable.

    tylopy::matmul(a, b, bias, out_dtype, epilogue, schedule) -> Tensor

``tylopy.matmul`` calls it when an input requires grad, under ``torch.compile`` /
``torch.export``, and for meta or fake tensors (and other tensor subclasses); plain CUDA
tensors launch directly. ``epilogue`` and ``schedule`` are strings, as an operator's schema
needs: the epilogue's name among ``epilogues.py``'s ("relu", "gelu", "silu", "scale=<alpha>",
"" for none) and the schedule dict's items as a Python literal ("" for the autotuner).

The gradient (``register_autograd``) uses the operator itself: dA = dC B^T and dB = A^T dC
(the kernel reads the transposed views as they are, K-major or MN-major), d(bias) = the column
sums of dC in fp32; dC is rounded to the inputs' dtype first when the output is fp32. An
epilogue has no derivative here, so ``tylopy.matmul`` refuses one when an input requires grad.
On CUDA the operator runs the kernel; elsewhere the same function with torch operations in
fp32 (float64 inputs in float64): the reference that lets the CPU tests check the formulas.

Only torch is imported at load time (``import tylopy`` registers the operator).
"""
from __future__ import annotations

import ast
import functools
from typing import Optional

import torch
from torch import Tensor

NAMED_EPILOGUES = ("relu", "gelu", "silu")


def _fail(exc, arg, expected, got):
    raise exc(f"matmul: {arg} expects {expected}, but got {got}")


def epilogue_name(epilogue) -> str:
    """The operator's string for ``epilogue``: '' for None, the name of one of ``epilogues.py``'s."""
    if epilogue is None:
        return ""
    from tylopy_kernels.gemm import epilogues
    for name in NAMED_EPILOGUES:
        if epilogue is getattr(epilogues, name):
            return name
    if isinstance(epilogue, functools.partial) and epilogue.func is epilogues._scaled:
        return f"scale={epilogue.keywords['alpha']!r}"
    _fail(TypeError, "epilogue", "None or one of tylopy_kernels.gemm.epilogues (relu, gelu, silu, scale(alpha)) "
          "under torch.compile / torch.export or for fake tensors (an operator takes no functions; apply "
          "any other as torch operations after matmul)", getattr(epilogue, "__name__", type(epilogue).__name__))


def _epilogue_of(name: str):
    if not name:
        return None
    from tylopy_kernels.gemm import epilogues
    if name.startswith("scale="):
        return epilogues.scale(float(name[len("scale="):]))
    return getattr(epilogues, name)


def _reference_epilogue(name: str, x):
    if not name:
        return x
    if name.startswith("scale="):
        return x * float(name[len("scale="):])
    if name == "relu":
        return torch.relu(x)
    if name == "gelu":
        return torch.nn.functional.gelu(x, approximate="tanh")
    return torch.nn.functional.silu(x)


def schedule_key(schedule) -> str:
    return "" if schedule is None else repr(tuple(sorted(schedule.items())))


@torch.library.custom_op("tylopy::matmul", mutates_args=())
def matmul_op(a: Tensor, b: Tensor, bias: Optional[Tensor], out_dtype: torch.dtype, epilogue: str,
              schedule: str) -> Tensor:
    if a.device.type == "cuda":
        from tylopy_kernels.gemm import launch_matmul
        return launch_matmul(a, b, bias, out_dtype, epilogue=_epilogue_of(epilogue),
                             schedule=dict(ast.literal_eval(schedule)) if schedule else None)
    acc = torch.promote_types(a.dtype, torch.float32)
    c = a.to(acc) @ b.to(acc)
    if bias is not None:
        c = c + bias.to(acc)
    return _reference_epilogue(epilogue, c).to(out_dtype)


@matmul_op.register_fake
def _(a, b, bias, out_dtype, epilogue, schedule):
    return a.new_empty((*a.shape[:-1], b.shape[1]), dtype=out_dtype)


def _setup(ctx, inputs, output):
    a, b, bias, out_dtype, epilogue, schedule = inputs
    ctx.save_for_backward(a, b)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, dc):
    a, b = ctx.saved_tensors
    k, n = b.shape
    dc = dc.reshape(-1, n)
    if not dc.is_contiguous():  # e.g. the zero-stride gradient of c.sum(): the kernel reads rows or columns
        dc = dc.contiguous()
    if dc.dtype != a.dtype:  # an fp32 output: the kernel takes the inputs' dtype
        dc = dc.to(a.dtype)
    da = db = dbias = None
    if ctx.needs_input_grad[0]:
        da = matmul_op(dc, b.t(), None, a.dtype, "", "").reshape(a.shape)
    if ctx.needs_input_grad[1]:
        db = matmul_op(a.reshape(-1, k).t(), dc, None, b.dtype, "", "")
    if ctx.needs_input_grad[2]:
        dbias = dc.sum(dim=0, dtype=torch.float32).to(ctx.bias_dtype)
    return da, db, dbias, None, None, None


matmul_op.register_autograd(_backward, setup_context=_setup)


def through_op(a, b, bias) -> bool:
    """Autograd, a trace, meta/fake tensors or a tensor subclass need the operator."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)):
        return True
    return type(a) is not torch.Tensor or a.is_meta or torch.compiler.is_compiling()


def matmul_through_op(a, b, bias, out_dtype, epilogue, schedule):
    """The checked call through the operator."""
    from tylopy_kernels.gemm import check_inputs
    out_dtype = check_inputs(a, b, bias, out_dtype, epilogue, schedule)[3]
    if epilogue is not None and torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or
                                                             (bias is not None and bias.requires_grad)):
        _fail(ValueError, "epilogue", "None when an input requires grad (the epilogue has no derivative here; apply "
              "it as a torch operation after matmul, or call under torch.no_grad())", epilogue)
    if a.device.type not in ("cuda", "meta"):
        _fail(ValueError, "a", "a CUDA tensor", f"a tensor on {a.device}")
    return matmul_op(a, b, bias, out_dtype, epilogue_name(epilogue), schedule_key(schedule))


__all__ = ["matmul_op", "matmul_through_op", "through_op", "epilogue_name", "schedule_key"]
