"""The checks of ``tylopy.attention``'s dense call, as SDPA makes them (every one before the GPU is
touched, so bad input fails the same way on a machine without one): shapes, dtypes, devices, heads,
the mask, the scale. The entry point (``__init__``), the FP8, portable and ring launchers take them
from here.
"""
from __future__ import annotations

import math

import torch

from tylopy_kernels.attention.common import check_token_tensor, rejecter

_fail = rejecter("attention")


def check_inputs(query, key, value, attn_mask, is_causal, scale, enable_gqa=False):
    """Validate like SDPA; returns (B, H, n_q, n_k, D, scale)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_token_tensor(_fail, name, t, 4, "(batch, heads, seq, head_dim)")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        _fail(TypeError, "key/value", f"the query's dtype {query.dtype}", f"{key.dtype} and {value.dtype}")
    if key.device != query.device or value.device != query.device:
        _fail(ValueError, "key/value", f"the query's device {query.device}", f"{key.device} and {value.device}")
    B, H, n_q, D = query.shape
    if key.shape[0] != B or value.shape[0] != B:
        _fail(ValueError, "key/value batch", B, f"{key.shape[0]} and {value.shape[0]}")
    if not isinstance(enable_gqa, bool):
        _fail(TypeError, "enable_gqa", "a bool", type(enable_gqa).__name__)
    if enable_gqa:
        h_kv = key.shape[1]
        if value.shape[1] != h_kv or h_kv == 0 or H % h_kv:
            _fail(ValueError, "key/value heads", f"one count that divides the {H} query heads (enable_gqa=True)",
                  f"{key.shape[1]} and {value.shape[1]}")
    elif key.shape[1] != H or value.shape[1] != H:
        _fail(ValueError, "key/value heads", f"{H} (or enable_gqa=True for fewer)",
              f"{key.shape[1]} and {value.shape[1]}")
    if key.shape[3] != D or value.shape[3] != D:
        _fail(ValueError, "key/value head_dim", D, f"{key.shape[3]} and {value.shape[3]}")
    n_k = key.shape[2]
    if value.shape[2] != n_k:
        _fail(ValueError, "value", f"as many rows as key ({n_k})", value.shape[2])
    if D not in (16, 32, 64, 128):
        _fail(ValueError, "query head_dim", "16, 32, 64 or 128", D)
    if not isinstance(is_causal, bool):
        _fail(TypeError, "is_causal", "a bool", type(is_causal).__name__)
    if is_causal and n_q != n_k:
        _fail(ValueError, "is_causal", "equal query and key lengths (rectangular causal is ambiguous)",
              f"{n_q} queries and {n_k} keys")
    if is_causal and attn_mask is not None:
        _fail(ValueError, "attn_mask", "None when is_causal=True (as SDPA)", "a mask")
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            _fail(TypeError, "attn_mask", "a torch.Tensor of dtype torch.bool", type(attn_mask).__name__)
        if attn_mask.dtype != torch.bool:
            _fail(TypeError, "attn_mask", "dtype torch.bool (True = take part)", attn_mask.dtype)
        if attn_mask.device != query.device:
            _fail(ValueError, "attn_mask", f"the query's device {query.device}", attn_mask.device)
        if attn_mask.dim() > 4:
            _fail(ValueError, "attn_mask", "at most 4 dimensions", attn_mask.dim())
        try:
            torch.broadcast_shapes(attn_mask.shape, (B, H, n_q, n_k))
            attn_mask.expand(B, H, n_q, n_k)  # raises when the shapes do not broadcast
        except RuntimeError:
            _fail(ValueError, "attn_mask", f"a shape broadcastable to {(B, H, n_q, n_k)}", tuple(attn_mask.shape))
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        _fail(TypeError, "scale", "a float or None", type(scale).__name__)
    elif not (abs(scale) <= 1.7976931348623157e308 if isinstance(scale, int) else math.isfinite(scale)):
        shown = scale if len(str(scale)) < 40 else f"an int of {len(str(abs(scale)))} digits"
        _fail(ValueError, "scale", "a finite number", shown)  # (an int beyond the float range too)
    return B, H, n_q, n_k, D, float(scale)
