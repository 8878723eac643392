"""The operators behind ``tylopy.attention`` with variant keywords (``variants.py`` defines them):

=====================================  ======================================================
``tylopy::attention_variant_fwd``      (q, k, v, tensors, variant_id, scale, return_lse)
                                       -> (out, lse)
``tylopy::attention_variant_bwd``      (dout, q, k, v, out, lse, tensors, variant_id, scale, dlse)
                                       -> (dq, dk, dv, dsinks)
=====================================  ======================================================

A variant's mods are Python functions, not tensors: the operators take the id under which
``variants.register_variant`` keeps the Variant (and through it the mods), and the tensors the
variant reads as one list (``Variant.tensor_names`` names them). Fake implementations give the
shapes, so ``torch.compile(fullgraph=True)`` traces a call into one graph.

Where it runs: Hopper (sm_90), D = 64 or 128, 16-bit inputs: the variant kernel
(``sm90/forward_variant.py``); anything else: the torch reference in fp32 (``variants.
reference_forward``), with one warning per reason. The backward runs Hopper's variant backward
where ``sm90/backward_variant_launch.py`` exists and supports the call, else the reference.
"""
from __future__ import annotations

import threading
import warnings
from typing import Optional

import torch
from torch import Tensor

from tylopy_kernels.attention import variants as V
from tylopy_kernels.attention.common import BackwardTensors, ForwardTensors, VariantCall
from tylopy_kernels.eager import EagerOp

NEG_INF = float("-inf")
_warned: set = set()
_warn_lock = threading.Lock()


def warn_fallback(why: str):
    """One warning per reason: the call runs the torch reference path."""
    with _warn_lock:
        if why in _warned:
            return
        _warned.add(why)
    warnings.warn(f"tylopy.attention: this variant runs on the torch fp32 reference path ({why})", stacklevel=4)


def kernel_refusal(q, k, v, variant) -> Optional[str]:
    """Why the Hopper variant kernel does not take this call (None: it does)."""
    if q.device.type != "cuda":
        return f"the inputs are on {q.device.type}, not a CUDA device"
    from tylopy_kernels.attention.dispatch import _capability
    major, minor = _capability(q.device.index)
    if major != 9:
        return f"the variant kernel needs Hopper (sm_90), but this GPU is sm_{major}{minor}"
    if q.shape[3] not in (64, 128):
        return f"the variant kernel takes head dims 64 and 128, but got {q.shape[3]}"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"the variant kernel takes bf16 and fp16, but got {q.dtype}"
    if variant.block_mask is not None and variant.block_mask[0] != 128:
        return f"the variant kernel takes BLOCK_SIZE=128 block masks, but got {variant.block_mask[0]}"
    return None


def forward_variant(q, k, v, variant, tensors, scale, return_lse=True):
    """(out, lse fp32): the kernel where it applies, else the reference (one warning per reason)."""
    B, H, n_q, D = q.shape
    if B * H * n_q == 0:
        return q.new_empty(q.shape), torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    if k.shape[2] == 0:  # no keys: every row is empty (output 0, LSE -inf or the sink)
        lse = torch.full((B, H, n_q), NEG_INF, dtype=torch.float32, device=q.device)
        if variant.sinks:
            lse.copy_(tensors[variant.index("sinks")].view(1, H, 1).expand(B, H, n_q))
        return q.new_zeros(q.shape), lse
    why = kernel_refusal(q, k, v, variant)
    if why is None:
        from tylopy_kernels.attention.sm90.variant_launch import launch_variant
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
        launch_variant(ForwardTensors(q, k, v, out, lse), VariantCall(variant, tensors, scale))
        return out, lse
    if q.dtype != torch.float64:
        warn_fallback(why)
    out, lse = V.reference_forward(q, k, v, variant, tensors, scale)
    return out, lse.float() if q.dtype != torch.float64 else lse


def backward_refusal(dlse) -> Optional[str]:
    """Why the Hopper variant backward does not take a call its forward kernel took (None: it does)."""
    if dlse is not None:
        return "its backward: a gradient of the LSE, which the Hopper variant backward does not take"
    if torch.are_deterministic_algorithms_enabled():
        return ("its backward: torch.use_deterministic_algorithms(True), and the Hopper variant backward adds dQ "
                "and the sinks' gradient with atomics")
    return None


def backward_variant(forward: ForwardTensors, dout, call: VariantCall, dlse):
    """(dq, dk, dv, dsinks): the Hopper kernels where they apply, else the reference (one warning
    per reason). ``forward``: the forward's q, k, v, out and lse."""
    q, k, v, out, lse, _ = forward
    variant, tensors, scale = call
    bwd = variant.score_mod_bwd.function() if variant.score_mod_bwd is not None else None
    on_kernel = kernel_refusal(q, k, v, variant) is None  # (the forward warned where it is not)
    why = backward_refusal(dlse) if on_kernel else None
    if why is not None:
        warn_fallback(why)
    elif on_kernel:
        try:
            from tylopy_kernels.attention.sm90 import backward_variant_launch as bvl
        except ImportError:
            bvl = None
        if bvl is not None and bvl.supports(q, k, v, variant):
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            # (filled by the launch: the kernels zero and add it, or a copy of the torch sum)
            dsinks = torch.empty(q.shape[1] if variant.sinks else 0, dtype=torch.float32, device=q.device)
            bvl.launch_backward_variant(BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv), dsinks, call,
                                        score_mod_bwd=bwd)
            return dq, dk, dv, dsinks
    return V.reference_backward(forward, dout, call, dlse)


def _variant_fwd(q: Tensor, k: Tensor, v: Tensor, tensors: list[Tensor], variant_id: str, scale: float,
                 return_lse: bool) -> tuple[Tensor, Tensor]:
    variant = V.lookup_variant(variant_id)
    if k.stride(-1) != 1 or q.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return forward_variant(q, k, v, variant, V.with_captured(variant, tensors), scale, return_lse)


attention_variant_fwd = torch.library.custom_op("tylopy::attention_variant_fwd", mutates_args=())(_variant_fwd)


@attention_variant_fwd.register_fake
def _(q, k, v, tensors, variant_id, scale, return_lse):
    B, H, n_q, D = q.shape
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty((B, H, n_q, D)), q.new_empty((B, H, n_q), dtype=lse_dtype)


def _variant_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, tensors: list[Tensor],
                 variant_id: str, scale: float, dlse: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    variant = V.lookup_variant(variant_id)
    dq, dk, dv, dsinks = backward_variant(ForwardTensors(q, k, v, out, lse), dout,
                                          VariantCall(variant, V.with_captured(variant, tensors), scale), dlse)
    return _strided_like(q, dq), _strided_like(k, dk), _strided_like(v, dv), dsinks


attention_variant_bwd = torch.library.custom_op("tylopy::attention_variant_bwd", mutates_args=())(_variant_bwd)
variant_bwd = EagerOp(attention_variant_bwd, _variant_bwd)


def _strided_like(like, grad):
    """``grad`` with ``like``'s strides, as the fake promises (torch.compile's generated code checks
    them): the kernel path already allocates with ``empty_like``, the reference path may not."""
    if grad.stride() == like.stride():
        return grad
    return torch.empty_like(like, dtype=grad.dtype).copy_(grad)


@attention_variant_bwd.register_fake
def _(dout, q, k, v, out, lse, tensors, variant_id, scale, dlse):
    variant = V.lookup_variant(variant_id)
    n = q.shape[1] if variant.sinks else 0
    # the gradients keep the inputs' strides (packed sequences pass (B, H, N, D) views of (N, H, D))
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty((n,), dtype=torch.float32))


def _setup(ctx, inputs, output):
    q, k, v, tensors, variant_id, scale, return_lse = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *tensors)
    ctx.n_tensors, ctx.variant_id, ctx.scale, ctx.return_lse = len(tensors), variant_id, scale, return_lse
    if not return_lse:
        ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, *tensors = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, dsinks = variant_bwd(dout, q, k, v, out, lse, tensors, ctx.variant_id, ctx.scale,
                                     dlse if ctx.return_lse else None)
    variant = V.lookup_variant(ctx.variant_id)
    grads = [None] * len(tensors)
    if variant.sinks:
        grads[variant.index("sinks")] = dsinks
    if variant.attn_mask == "float":
        # d mask = the logits' gradient P (dP - delta) (the mask is added last, with derivative 1),
        # recomputed in torch; the caller's expand/float of the mask sums it over broadcast dims.
        # ALiBi slopes get none: as FlashAttention's, they are constants.
        from tylopy_kernels.attention.sm90.backward_variant_launch import float_mask_grad
        d = dlse if ctx.return_lse else None
        call = VariantCall(variant, V.with_captured(variant, tensors), ctx.scale)
        grads[variant.index("attn_mask")] = float_mask_grad(ForwardTensors(q, k, v, out, lse), dout, call,
                                                            d).to(tensors[variant.index("attn_mask")].dtype)
    return dq, dk, dv, grads, None, None, None


attention_variant_fwd.register_autograd(_backward, setup_context=_setup)
variant_fwd = EagerOp(attention_variant_fwd, _variant_fwd, _setup, _backward)


def variant_op(q, k, v, variant_id, tensors, scale, return_lse=False):
    """Attention with the variant registered as ``variant_id`` (``variants.make_variant_id``) through the
    operator (its body directly in eager code: ``eager.EagerOp``); ``tensors`` are the explicit ones
    (the mods' captured tensors are read when it runs)."""
    out, lse = variant_fwd(q, k, v, list(tensors), variant_id, float(scale), return_lse)
    return (out, lse) if return_lse else out


__all__ = ["variant_op", "forward_variant", "backward_variant", "kernel_refusal"]
