"""``attention`` with float8 (e4m3) inputs: the FP8 forward of FlashAttention-3's interface.

    out = tylopy.attention(q8, k8, v8, is_causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    out, lse = tylopy.attention(q8, k8, v8, return_lse=True, enable_gqa=True, ...)

computes softmax(scale * q_descale * k_descale * q k^T) (v_descale * v) in bf16 from
``torch.float8_e4m3fn`` q/k/v (B, H, N, D) and (B, H_kv, N_k, D), D = 64 or 128; each descale is None (1), a
one-element float32 tensor (per tensor) or a (B, H_kv) float32 tensor (per batch and K/V head, as
FlashAttention-3). Forward only; Hopper only (``sm90/forward_fp8.py``, ``sm90/fp8_launch.py``);
docs/fp8.md has the numerics. Every check runs before the GPU is touched.
"""
from __future__ import annotations

from typing import Optional

import torch

from tylopy_kernels.attention.common import rejecter

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Calls whose signature (``_signature``) passed ``check_fp8``: their softmax scale, checks skipped.
_checked = None  # a PlanCache, made at the end of the module
HEAD_DIMS = (64, 128)
_fail = rejecter("attention")


def is_fp8_call(query, key, value, descales) -> bool:
    """Whether a call takes the FP8 path: a float8 input or a descale given."""
    return (any(getattr(t, "dtype", None) in FP8_DTYPES for t in (query, key, value))
            or any(d is not None for d in descales))


def _check_descale(name, d, B, Hkv, device):
    if d is None:
        return
    if not isinstance(d, torch.Tensor):
        _fail(TypeError, name, "None or a float32 torch.Tensor", type(d).__name__)
    if d.dtype != torch.float32:
        _fail(TypeError, name, "dtype torch.float32", d.dtype)
    if d.device != device:
        _fail(ValueError, name, f"the query's device {device}", d.device)
    if d.numel() != 1 and tuple(d.shape) != (B, Hkv):
        _fail(ValueError, name, f"one element (per tensor) or shape (batch, kv_heads) = {(B, Hkv)}", tuple(d.shape))


def reject_variant(given):
    """Variant keywords (``given``: name -> value of those not at their defaults) have no FP8 kernel."""
    if given:
        name = next(iter(given))
        _fail(ValueError, name, "its default with float8 inputs (the FP8 forward has no variants)", repr(given[name]))


def check_fp8(qkv, attn_mask, dropout_p, is_causal, scale, enable_gqa, descales, traced=False):
    """Validate an FP8 call (``qkv`` = (query, key, value)); returns the softmax scale. ``traced``:
    the operator runs it later, so the device is not required to be CUDA here."""
    from tylopy_kernels.attention.checks import check_inputs
    query, key, value = qkv
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            _fail(TypeError, name, "a torch.Tensor", type(t).__name__)
        if t.dtype != torch.float8_e4m3fn:
            _fail(TypeError, name, "dtype torch.float8_e4m3fn (q, k and v all e4m3 when one is float8 or a descale "
                  "is given)", t.dtype)
        if t.device != query.device:
            _fail(ValueError, name, f"the query's device {query.device}", t.device)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(f"attention: {name} expects requires_grad=False with float8 inputs (the FP8 "
                                      f"forward has no backward), but got a tensor that requires grad")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or dropout_p != 0.0:
        _fail(ValueError, "dropout_p", "0.0 (attention dropout is not implemented)", repr(dropout_p))
    if attn_mask is not None and isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point():
        _fail(TypeError, "attn_mask", "None or a torch.bool mask with float8 inputs", attn_mask.dtype)
    # the shape rules are SDPA's, checked on 16-bit stand-ins of the same shapes and strides
    shown = [torch.empty_strided(t.shape, t.stride(), dtype=torch.bfloat16, device="meta") for t in (query, key, value)]
    mask = attn_mask.to("meta") if isinstance(attn_mask, torch.Tensor) else attn_mask
    B, H, n_q, n_k, D, scale = check_inputs(*shown, mask, is_causal, scale, enable_gqa)
    if isinstance(attn_mask, torch.Tensor) and attn_mask.device != query.device:
        _fail(ValueError, "attn_mask", f"the query's device {query.device}", attn_mask.device)
    if D not in HEAD_DIMS:
        _fail(ValueError, "query head_dim", "64 or 128 with float8 inputs", D)
    for name, d in zip(("q_descale", "k_descale", "v_descale"), descales):
        _check_descale(name, d, B, key.shape[1], query.device)
        if d is not None and d.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(f"attention: {name} expects requires_grad=False (the FP8 forward has no "
                                      f"backward), but got a tensor that requires grad")
    if query.device.type != "cuda" and not traced:
        _fail(ValueError, "query", "a CUDA tensor", f"a tensor on {query.device}")
    return scale


def _descale_signature(d):
    return None if d is None else (type(d), getattr(d, "shape", None), getattr(d, "dtype", None),
                                   getattr(d, "device", None))


def _signature(qkv, attn_mask, dropout_p, is_causal, scale, enable_gqa, descales):
    """Everything ``check_fp8`` reads, for calls on plain CUDA tensors without a mask or gradients
    (None otherwise: those take the checks every time)."""
    if attn_mask is not None or any(type(t) is not torch.Tensor for t in qkv) or torch.compiler.is_compiling():
        return None
    if any(t.requires_grad for t in qkv) or qkv[0].device.type != "cuda":
        return None
    if any(getattr(d, "requires_grad", False) for d in descales):
        return None
    sig = (tuple((t.shape, t.stride(), t.dtype, t.device) for t in qkv), dropout_p, type(dropout_p), is_causal,
           type(is_causal), scale, type(scale), enable_gqa, type(enable_gqa),
           tuple(_descale_signature(d) for d in descales))
    try:
        hash(sig)
    except TypeError:  # an argument of a type the checks will refuse
        return None
    return sig


def _traced(query) -> bool:
    """A trace (torch.compile / torch.export), meta or fake tensors, or another tensor subclass: the
    call goes through the ``tylopy::attention_fp8_fwd`` operator, whose fake gives the shapes."""
    return type(query) is not torch.Tensor or query.is_meta or torch.compiler.is_compiling()


def fp8_attention(qkv, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, descales):
    """The checked FP8 forward of ``qkv`` = (query, key, value): (out, lse) with return_lse, else
    out (bf16)."""
    if type(return_lse) is not bool:
        _fail(TypeError, "return_lse", "a bool", type(return_lse).__name__)
    query, key, value = qkv
    if isinstance(query, torch.Tensor) and _traced(query):
        scale = check_fp8(qkv, attn_mask, dropout_p, is_causal, scale, enable_gqa, descales, traced=True)
        out, lse = attention_fp8_fwd(query, key, value, attn_mask, is_causal, scale, return_lse, *descales)
        return (out, lse) if return_lse else out
    return _run_fp8(qkv, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, descales)


def _run_fp8(qkv, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, descales):
    """``fp8_attention`` on plain tensors: checks (skipped for a signature seen before), then the kernel."""
    query, key, value = qkv
    sig = _signature(qkv, attn_mask, dropout_p, is_causal, scale, enable_gqa, descales)
    known = _checked.get(sig) if sig is not None else None
    if known is None:
        known = check_fp8(qkv, attn_mask, dropout_p, is_causal, scale, enable_gqa, descales)
        if sig is not None:
            _checked.put(sig, known)
    scale = known
    from tylopy_kernels.attention.dispatch import _capability
    major, minor = _capability(query.device.index)
    if major != 9:
        _fail(NotImplementedError, "query", "a tensor on a Hopper GPU (sm_90) for float8 inputs",
              f"a tensor on a GPU of compute capability {major}.{minor}")
    B, H, n_q, D = query.shape
    out = torch.empty((B, H, n_q, D), dtype=torch.bfloat16, device=query.device)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=query.device) if return_lse else None
    if B * H * n_q == 0 or key.shape[2] == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out
    if scale <= 0:  # the kernel keeps the maximum of raw scores: softmax(c q k) = softmax(|c| (-q) k)
        codes = query.view(torch.uint8)
        query = (codes ^ 0x80 if scale < 0 else codes & 0).view(torch.float8_e4m3fn)
        scale = -scale if scale < 0 else 1.0
    from tylopy_kernels.attention.sm90.fp8_launch import Fp8Problem, launch_fp8
    launch_fp8(Fp8Problem(query, key, value, attn_mask, is_causal, scale, descales), out, lse)
    return (out, lse) if return_lse else out


# -- the operator -----------------------------------------------------------------------------------

@torch.library.custom_op("tylopy::attention_fp8_fwd", mutates_args=())
def attention_fp8_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
                      is_causal: bool, scale: float, return_lse: bool, q_descale: Optional[torch.Tensor],
                      k_descale: Optional[torch.Tensor],
                      v_descale: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked FP8 forward as an operator: (out bf16, lse fp32 or an empty (0,) tensor). On CUDA
    the kernel; on any other device the float64 reference of the dequantized inputs, rounded to bf16
    (an exported program runs on the CPU too)."""
    descales = (q_descale, k_descale, v_descale)
    if q.device.type == "cuda":
        res = _run_fp8((q, k, v), attn_mask, 0.0, is_causal, scale, q.shape[1] != k.shape[1], True, descales)
    else:
        res = reference_fp8((q, k, v), attn_mask, is_causal, scale, descales)
    out, lse = res
    return out, (lse if return_lse else lse.new_empty((0,)))


@attention_fp8_fwd.register_fake
def _(q, k, v, attn_mask, is_causal, scale, return_lse, q_descale, k_descale, v_descale):
    B, H, n_q, D = q.shape
    lse_shape = (B, H, n_q) if return_lse else (0,)
    return q.new_empty((B, H, n_q, D), dtype=torch.bfloat16), q.new_empty(lse_shape, dtype=torch.float32)


def dequantized(codes: torch.Tensor, descale) -> torch.Tensor:
    """float64 values of codes times their descale (None: 1). A (B, H_kv) descale of a tensor with
    more heads (the query, under grouped-query attention) applies to each group of H / H_kv heads."""
    x = codes.double()
    if descale is None:
        return x
    d = descale.double()
    if d.numel() == 1:
        return x * d.reshape(-1)[0].to(x.device)
    d = d.repeat_interleave(x.shape[1] // d.shape[1], 1)
    return x * d[:, :, None, None]


def reference_fp8(qkv, attn_mask, is_causal, scale, descales):
    """(out bf16, lse fp32) of the dequantized inputs in float64, K/V heads repeated for GQA."""
    from tylopy_kernels.attention.autograd import reference_forward
    q, k, v = (dequantized(t, d) for t, d in zip(qkv, descales))
    H = q.shape[1]
    k, v = (t.repeat_interleave(H // t.shape[1], 1) if t.shape[1] != H else t for t in (k, v))
    out, lse = reference_forward(q, k, v, attn_mask, is_causal, scale)
    return out.to(torch.bfloat16), lse.to(torch.float32)


import tylopy as ty  # noqa: E402  (last: tylopy imports the attention entry points)

_checked = ty.PlanCache("FP8 attention signatures", capacity=256)
