"""``attention``: the PyTorch entry point, a drop-in for ``scaled_dot_product_attention`` where
the shapes are supported, and ``attention_varlen`` for packed variable-length batches.

    out = tylopy.attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None)
    out, lse = tylopy.attention(q, k, v, return_lse=True)
    out = tylopy.attention(q, k_few_heads, v_few_heads, enable_gqa=True)   # grouped-query attention
    out = tylopy.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)

Inputs are (B, H, N, D) tensors, bf16 or fp16, D in {16, 32, 64, 128}, on one CUDA device; any
strides whose last dimension is contiguous (so a (B, N, H, D) buffer viewed with
``.transpose(1, 2)`` works without a copy). On Hopper with D = 64 or 128 it runs the
warp-specialized kernel (``sm90/forward.py``); elsewhere the portable mma.sync kernel
(``portable/forward.py``); ``dispatch.py`` chooses.
With ``enable_gqa=True`` (as SDPA) key/value may have fewer heads than query, a divisor of them:
query head h reads key/value head h // (H / H_kv); both kernels index them in place, and a
zero-stride ``expand`` view too. ``dropout_p`` must be 0.

Gradients: when an input requires grad, or under ``torch.compile``, the call goes through the
``tylopy::attention_fwd`` operator (``autograd.py``), whose backward runs Hopper's backward
kernels (D = 64, 128 on sm_90) or the portable ones (``portable/backward.py``); otherwise the
forward kernel is launched directly. docs/attention-training.md has the whole picture.
Launches go on the current stream, never synchronize the host, and can be captured in a graph.

Every check below runs before the GPU is touched, so bad input fails the same way on a machine
without one.
"""
from __future__ import annotations

import torch

from tylopy_kernels.attention.checks import _fail, check_inputs
from tylopy_kernels.attention.conventions import SdpaOptions, autocast_inputs, is_nested, nested_attention
from tylopy_kernels.attention.dispatch import _tma_strides_ok, forward
from tylopy_kernels.attention.fp8 import fp8_attention, is_fp8_call, reject_variant


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              return_lse=False, *, window_size=None, softcap=None, alibi_slopes=None, sinks=None, score_mod=None,
              mask_mod=None, block_mask=None, aux=None, causal_align="top_left", score_mod_bwd=None, q_descale=None,
              k_descale=None, v_descale=None):
    """softmax(scale * query key^T, masked) value, like SDPA; with ``return_lse`` also the row LSE (fp32).

    Differentiable: when an input requires grad, or under ``torch.compile``, the call goes
    through the ``tylopy::attention_fwd`` operator (``autograd.py``), whose backward runs
    tylopy's backward kernels; otherwise it launches the forward kernel directly.

    ``torch.float8_e4m3fn`` inputs (D = 64 or 128, Hopper, forward only) run the FP8 kernel (``fp8.py``):
    ``q_descale``/``k_descale``/``v_descale`` (float32, one element or (B, H_kv)) dequantize them, as
    FlashAttention-3's; the output is bf16 (docs/fp8.md).

    The keywords after ``*`` (and a float ``attn_mask``, or ``is_causal`` with unequal lengths)
    make it a variant (``variants.py``, docs/attention-variants.md): sliding window, softcap,
    ALiBi, attention sinks, user ``score_mod``/``mask_mod`` and block-sparse masks.
    """
    descales = (q_descale, k_descale, v_descale)
    if is_fp8_call(query, key, value, descales):
        given = {n: x for n, x in (("window_size", window_size), ("softcap", softcap), ("alibi_slopes", alibi_slopes),
                                   ("sinks", sinks), ("score_mod", score_mod), ("mask_mod", mask_mod),
                                   ("block_mask", block_mask), ("aux", aux), ("score_mod_bwd", score_mod_bwd))
                 if x is not None}
        if causal_align != "top_left":
            given["causal_align"] = causal_align
        reject_variant(given)
        return fp8_attention((query, key, value), attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                             descales)
    if (window_size is not None or softcap is not None or alibi_slopes is not None or sinks is not None
            or score_mod is not None or mask_mod is not None or block_mask is not None or aux is not None
            or causal_align != "top_left" or score_mod_bwd is not None or (not is_nested(query, key, value) and (
                _float_mask(attn_mask) or _rectangular_causal(query, key, is_causal)))):
        from tylopy_kernels.attention.variants import VariantKeywords
        keywords = VariantKeywords(is_causal, causal_align, attn_mask, window_size=window_size, softcap=softcap,
                                   alibi_slopes=alibi_slopes, sinks=sinks, score_mod=score_mod, mask_mod=mask_mod,
                                   block_mask=block_mask, aux=aux, score_mod_bwd=score_mod_bwd)
        return _variant_attention(query, key, value,
                                  SdpaOptions(attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse), keywords)
    T = torch.Tensor
    if (type(query) is not T or type(key) is not T or type(value) is not T) and is_nested(query, key, value):
        # SDPA's nested jagged tensors: attention_varlen on the packed values
        return nested_attention(query, key, value,
                                SdpaOptions(attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse))
    if getattr(query, "dtype", None) is torch.float32:  # fp32 under autocast runs in its dtype, as SDPA
        query, key, value = autocast_inputs(query, key, value)
    if type(return_lse) is not bool:
        _fail(TypeError, "return_lse", "a bool", type(return_lse).__name__)
    sig = _signature(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    known = _checked.get(sig) if sig is not None else None
    if known is None:
        if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool):
            _fail(TypeError, "dropout_p", "a float", type(dropout_p).__name__)
        if dropout_p != 0.0:
            raise NotImplementedError(f"attention: dropout_p expects 0.0 (attention dropout is not implemented), "
                                      f"but got {dropout_p}")
        scale = check_inputs(query, key, value, attn_mask, is_causal, scale, enable_gqa)[5]
        if query.device.type not in ("cuda", "meta"):
            _fail(ValueError, "query", "a CUDA tensor", f"a tensor on {query.device}")
        if sig is not None:
            known = _Known(scale, _tma_strides_ok(query, key, value))
            _checked.put(sig, known)
    else:
        scale = known.scale
        again = known.repeats[return_lse]
        # a signature means CUDA tensors and no trace: of _through_op's reasons only autograd is left
        if again is not None and again.fits(query, key, value) and not _needs_grad(query, key, value):
            out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
            lse = torch.empty(query.shape[:3], dtype=torch.float32, device=query.device) if return_lse else None
            if again.launch(query, key, value, out, lse, scale):
                return (out, lse) if return_lse else out
    if _through_op(query, key, value):
        from tylopy_kernels.attention.autograd import attention_op
        return attention_op(query, key, value, attn_mask, is_causal, scale, return_lse)
    out, lse, again = forward(query, key, value, attn_mask, is_causal, scale, return_lse, known)
    if known is not None:
        known.repeats[return_lse] = again
    return (out, lse) if return_lse else out


def _float_mask(attn_mask) -> bool:
    return isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point() and not attn_mask.is_nested


def _rectangular_causal(query, key, is_causal) -> bool:
    return (is_causal is True and isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor)
            and not query.is_nested and not key.is_nested  # (nested tensors: nested_attention's rules)
            and query.dim() == 4 and key.dim() == 4 and query.shape[2] != key.shape[2])


def _variant_attention(query, key, value, options: SdpaOptions, keywords):
    """``attention`` with variant keywords (``variants.VariantKeywords``, is_causal and attn_mask as in
    ``options``): checked, described (``variants.make_variant_id``) and run through the
    ``tylopy::attention_variant_fwd`` operator (kernel or torch path)."""
    from tylopy_kernels.attention import variants
    attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse = options
    from tylopy_kernels.attention.autograd_variants import variant_op
    if getattr(query, "dtype", None) is torch.float32:
        query, key, value = autocast_inputs(query, key, value)
    if type(return_lse) is not bool:
        _fail(TypeError, "return_lse", "a bool", type(return_lse).__name__)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or dropout_p != 0.0:
        _fail(ValueError, "dropout_p", "0.0 (attention dropout is not implemented)", repr(dropout_p))
    if not isinstance(is_causal, bool):
        _fail(TypeError, "is_causal", "a bool", type(is_causal).__name__)
    shown = (query, key, value)
    if all(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in shown):
        # float64 runs the reference (the tests' oracle path): checked as 16-bit tensors of the same shapes
        shown = tuple(torch.empty_strided(t.shape, t.stride(), dtype=torch.bfloat16, device="meta") for t in shown)
    B, H, n_q, n_k, D, scale = check_inputs(*shown, None, False, scale, enable_gqa)
    vid, tensors = variants.make_variant_id(B, H, n_q, n_k, query.device,
                                            keywords)
    return variant_op(query, key, value, vid, tensors, scale, return_lse)


class _Known:
    """What a call whose signature passed every check leaves for the next one like it."""

    __slots__ = ("scale", "strides_ok", "repeats")

    def __init__(self, scale, strides_ok):
        self.scale = scale            # the resolved softmax scale
        self.strides_ok = strides_ok  # whether TMA can map the inputs' strides
        self.repeats = {False: None, True: None}  # per return_lse: the Hopper launch kept (or None)


# Calls without a mask on CUDA tensors whose signature (shapes, strides, dtypes, devices, options
# and their types) passed check_inputs before. Everything the checks read is in the signature, so
# a hit skips only work that would repeat; with the launch kept too, it allocates the output and
# launches (launch_hopper's plan reuse, see sm90/launch.Repeat).
_checked = None  # a PlanCache, made at the end of the module


def _signature(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    T = torch.Tensor
    if attn_mask is not None or type(query) is not T or type(key) is not T or type(value) is not T:
        return None
    if torch.compiler.is_compiling():  # a trace takes the checks (and no cache) every time
        return None
    dev = query.get_device()
    if dev < 0:  # CPU and meta tensors take the checks every time
        return None
    return (query.shape, key.shape, value.shape, query.stride(), key.stride(), value.stride(), query.dtype,
            key.dtype, value.dtype, dev, key.get_device(), value.get_device(), dropout_p, type(dropout_p),
            is_causal, type(is_causal), scale, type(scale), enable_gqa, type(enable_gqa))


def _needs_grad(query, key, value) -> bool:
    return torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)


def _through_op(query, key, value) -> bool:
    """Autograd, a trace (torch.compile) or meta tensors need the operator; a plain call does not."""
    grad = _needs_grad(query, key, value)
    return grad or query.device.type == "meta" or torch.compiler.is_compiling()


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None,
                     enable_gqa=False, return_lse=False, seqused_q=None, seqused_k=None, *, window_size=None,
                     softcap=None, alibi_slopes=None, sinks=None, score_mod=None, mask_mod=None, aux=None,
                     score_mod_bwd=None, causal_align="bottom_right"):
    """Packed variable-length batches, like ``flash_attn_varlen_func`` (``varlen.py`` says more):
    q (total_q, H, D), k/v (total_k, H_kv, D), int32 prefix sums cu_seqlens_q/k (on the device,
    or on the host: checked there, then copied); (out, lse) with ``return_lse``, lse of shape
    (H, total_q). ``seqused_q``/``seqused_k`` (int32 (B,), Hopper only): only the first that many
    tokens of each sequence count. Differentiable as ``attention`` (without seqused_q/seqused_k).
    The keywords after ``*`` are ``attention``'s variants per document (``varlen_variants.py``,
    docs/attention-varlen.md): positions relative to each document, b the document's index."""
    from tylopy_kernels.attention.common import PackedDocs
    from tylopy_kernels.attention.varlen import check_seqused, check_varlen, device_cu_seqlens, forward_varlen
    if getattr(q, "dtype", None) is torch.float32:  # fp32 under autocast runs in its dtype, as SDPA
        q, k, v = autocast_inputs(q, k, v)
    options = dict(window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                   score_mod=score_mod, mask_mod=mask_mod, aux=aux, score_mod_bwd=score_mod_bwd)
    if any(val is not None for val in options.values()) or causal_align != "bottom_right":
        options.update(is_causal=is_causal, causal_align=causal_align)
        return _varlen_variant(q, k, v, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                               (scale, enable_gqa, return_lse, seqused_q, seqused_k), options)
    scale = check_varlen(q, k, v, PackedDocs(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), is_causal, scale,
                         enable_gqa)
    cu_seqlens_q, cu_seqlens_k = device_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0])
    seqused = (seqused_q, seqused_k)
    if seqused != (None, None):
        check_seqused(q, seqused_q, seqused_k, cu_seqlens_q.shape[0] - 1)
        if _through_op(q, k, v):
            raise NotImplementedError("attention_varlen: seqused_q/seqused_k expects inputs without gradients and "
                                      "outside torch.compile (the operator does not take them), but got inputs that "
                                      "need the operator")
        docs = PackedDocs(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *seqused)
        out, lse = forward_varlen(q, k, v, docs, is_causal, scale, return_lse)
        return (out, lse) if return_lse else out
    if _through_op(q, k, v):
        from tylopy_kernels.attention.autograd import varlen_op
        return varlen_op(q, k, v, PackedDocs(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), is_causal, scale,
                         return_lse)
    out, lse = forward_varlen(q, k, v, PackedDocs(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), is_causal,
                              scale, return_lse)
    return (out, lse) if return_lse else out


def _varlen_variant(q, k, v, lengths, call, options):
    """``attention_varlen`` with variant keywords: the packed tokens as one batch entry through the
    ``tylopy::attention_variant_fwd`` operator, a document mask and table (``varlen_variants.py``)."""
    from tylopy_kernels.attention.autograd_variants import variant_op
    from tylopy_kernels.attention.common import PackedDocs
    from tylopy_kernels.attention.varlen import check_varlen, device_cu_seqlens
    from tylopy_kernels.attention.varlen_variants import varlen_variant
    cu_q, cu_k, max_q, max_k = lengths
    scale, enable_gqa, return_lse, seqused_q, seqused_k = call
    if seqused_q is not None or seqused_k is not None:
        _fail(ValueError, "seqused_q/seqused_k", "None with variant keywords (the variant kernel takes whole "
              "documents)", "a tensor")
    if type(return_lse) is not bool:
        _fail(TypeError, "return_lse", "a bool", type(return_lse).__name__)
    shown = (q, k, v)
    if all(isinstance(t, torch.Tensor) for t in shown) and (q.device.type == "cpu" or q.dtype == torch.float64):
        # CPU (the torch reference path, with one warning) and float64 (the tests' oracle): checked as
        # 16-bit meta tensors of the same shapes
        shown = tuple(torch.empty_strided(t.shape, t.stride(), dtype=torch.bfloat16, device="meta") for t in shown)
    scale = check_varlen(*shown, PackedDocs(cu_q, cu_k, max_q, max_k), options["is_causal"], scale, enable_gqa)
    # the repaired device sums only build the document tables: a repeated call reuses those
    q1, k1, v1, vid, tensors = varlen_variant(
        q, k, v, (cu_q, cu_k, lambda: device_cu_seqlens(q, cu_q, cu_k, q.shape[0], k.shape[0])), options)
    out, lse = variant_op(q1, k1, v1, vid, tensors, scale, True) if return_lse else (
        variant_op(q1, k1, v1, vid, tensors, scale, False), None)
    out = out[0].transpose(0, 1)
    return (out, lse[0]) if return_lse else out


# Last: tylopy imports this module's entry points (tylopy/functions.py), so whichever package is
# imported first, the names above exist before tylopy's __init__ asks for them.
import tylopy as ty  # noqa: E402

_checked = ty.PlanCache("attention signatures", capacity=256)
