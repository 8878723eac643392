"""SDPA's conventions that ``tylopy.attention`` and ``attention_varlen`` follow beyond the shapes:
autocast and nested jagged tensors.

Autocast. Under ``torch.autocast(device, dtype)`` SDPA runs fp32 inputs in the autocast dtype;
so do the entry points (``autocast_inputs``, before their checks, which accept only 16-bit
inputs), and so do the operators in a compiled or exported graph (``tylopy_kernels.ops``
registers the same rule on the Autocast dispatch keys).

Nested jagged tensors (``torch.nested``, ``layout=torch.jagged``): ``attention`` accepts query,
key and value as (B, H, j, D) nested tensors (SDPA's layout: a (B, j, H, D) one after
``.transpose(1, 2)``) and runs ``attention_varlen`` on their packed values: ``cu_seqlens`` are
the offsets as int32 (a device-side conversion) and ``max_seqlen`` the length the nested tensor
caches, else its total token count (an upper bound, read without waiting for the GPU: the grid
gets blocks that return at once). The output (and the LSE with ``return_lse``) is nested with
the query's offsets.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from tylopy_kernels.attention.common import rejecter

_fail = rejecter("attention")

_HOW = ("dense (B, H, N, D) tensors, or nested jagged (B, H, j, D) ones for query, key and value "
        "(torch.nested.nested_tensor(seqs, layout=torch.jagged).transpose(1, 2)); for packed sequences call "
        "tylopy.attention_varlen(values, ..., cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)")


def autocast_inputs(*tensors):
    """The tensors as an autocast region runs them: fp32 ones in the autocast dtype (SDPA's rule)."""
    first = tensors[0]
    dev = first.device.type
    if dev not in ("cuda", "cpu") or not torch.is_autocast_enabled(dev):
        return tensors
    dtype = torch.get_autocast_dtype(dev)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t for t in tensors)


def is_nested(*tensors) -> bool:
    return any(getattr(t, "is_nested", False) for t in tensors)


def _packed(name, t):
    """(values (total, H, D), offsets, max_seqlen or None) of a (B, H, j, D) nested jagged tensor."""
    if not getattr(t, "is_nested", False) or t.layout != torch.jagged:
        _fail(TypeError, name, _HOW, "a dense tensor mixed with nested ones" if isinstance(t, torch.Tensor)
              and not t.is_nested else f"{type(t).__name__} of layout {getattr(t, 'layout', None)}")
    if t.dim() != 4 or getattr(t, "_ragged_idx", None) != 2:
        _fail(ValueError, name, "a nested (B, H, j, D) tensor, the ragged dimension third (SDPA's layout: "
              "nested (B, j, H, D).transpose(1, 2))", f"shape {tuple(t.shape)}")
    return t.values().transpose(0, 1), t.offsets(), getattr(t, "_maybe_max_seqlen", None)


def _renest(packed, offsets, max_seqlen):
    """(total, X, ...) values back to a nested (B, X, j, ...) tensor with the query's offsets."""
    return torch.nested.nested_tensor_from_jagged(packed, offsets, max_seqlen=max_seqlen).transpose(1, 2)


class SdpaOptions(NamedTuple):
    """``attention``'s arguments after query, key and value that SDPA has too, plus ``return_lse``,
    as the caller passed them (unchecked)."""

    attn_mask: Any = None
    dropout_p: Any = 0.0
    is_causal: Any = False
    scale: Any = None
    enable_gqa: Any = False
    return_lse: Any = False


def nested_attention(query, key, value, options: SdpaOptions):
    """``attention`` of nested jagged (B, H, j, D) tensors through ``attention_varlen``."""
    from tylopy_kernels.attention import attention_varlen
    attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse = options
    q, off_q, max_q = _packed("query", query)
    k, off_k, max_k = _packed("key", key)
    v, off_v, _ = _packed("value", value)
    if attn_mask is not None:
        _fail(ValueError, "attn_mask", "None for nested tensors (the sequences' lengths are the mask)", "a mask")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or dropout_p != 0.0:
        _fail(ValueError, "dropout_p", "0.0 (attention dropout is not implemented)", repr(dropout_p))
    if off_v is not off_k and (off_v.shape != off_k.shape or value.shape[2] != key.shape[2]):
        _fail(ValueError, "value", "the key's offsets (the same sequences)", "other offsets")
    if off_k.shape != off_q.shape:
        _fail(ValueError, "key", f"{off_q.shape[0] - 1} sequences, as the query", off_k.shape[0] - 1)
    if is_causal and off_k is not off_q:
        # SDPA aligns causal masks top-left, attention_varlen bottom-right: equal only for equal lengths, which
        # offsets in two tensors cannot show without waiting for the GPU.
        _fail(ValueError, "is_causal", "query and key sharing one offsets tensor (self-attention); for other "
              "lengths call tylopy.attention_varlen, whose causal mask is aligned bottom-right", "other offsets")
    cu_q = off_q.to(torch.int32)
    cu_k = cu_q if off_k is off_q else off_k.to(torch.int32)
    max_q = q.shape[0] if max_q is None else int(max_q)
    max_k = k.shape[0] if max_k is None else int(max_k)
    res = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=is_causal, scale=scale,
                           enable_gqa=enable_gqa, return_lse=return_lse)
    if not return_lse:
        return _renest(res, off_q, max_q)
    out, lse = res
    return _renest(out, off_q, max_q), _renest(lse.transpose(0, 1), off_q, max_q)


__all__ = ["SdpaOptions", "autocast_inputs", "is_nested", "nested_attention"]
