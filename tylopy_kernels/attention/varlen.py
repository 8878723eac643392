"""``attention_varlen``: attention over packed batches of variable-length sequences.

    out = tylopy.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  is_causal=False, scale=None, enable_gqa=False)

as ``flash_attn_varlen_func``: q is (total_q, H, D), k and v (total_k, H_kv, D), bf16 or fp16
with a contiguous last dim; sequence b holds query rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1]
and key rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] (int32 prefix sums of B + 1 entries, the
same B for both, starting at 0); max_seqlen_q/k bound every sequence's length (the grid is
sized by them, so a longer sequence would be cut short: they are not checked against the
tensors, which would need the host to wait for the GPU). Sequences may be empty (their output
rows do not exist; queries whose sequence has no keys get zeros and LSE -inf) or of length 1.
``is_causal`` aligns the diagonal to the bottom-right corner of each sequence, as flash-attn
does: key j takes part for query i when j <= i + n_k - n_q (the usual mask when n_q == n_k).
With ``enable_gqa=True`` H_kv may divide H. ``return_lse=True`` adds the LSE as (H, total_q),
fp32. Rows past cu_seqlens_q[-1] get zeros (and LSE -inf), their gradients zeros.

It runs the portable kernels (``portable.py``, ``backward_portable.py``), which index each
sequence by its offsets on a grid of (query blocks, heads, sequences), every CTA past its
sequence's end returning at once. It is differentiable (``tylopy::attention_varlen_fwd``,
``autograd.py``) and traceable by ``torch.compile``. This module holds the checks and the CUDA
implementations; the entry point is ``tylopy_kernels.attention.attention_varlen``.
"""
from __future__ import annotations

import math

import torch

from tylopy_kernels.attention import _fail, _nonpositive_scale
from tylopy_kernels.attention.common import check_token_tensor

HEAD_DIMS = (16, 32, 64, 128)


def check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, enable_gqa):
    """Validate; returns the resolved scale."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_token_tensor(_fail, name, t, 3, "(total_tokens, heads, head_dim)")
        if t.device != q.device:
            _fail(ValueError, name, f"the query's device {q.device}", t.device)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        _fail(TypeError, "k/v", f"the query's dtype {q.dtype}", f"{k.dtype} and {v.dtype}")
    _, H, D = q.shape
    if k.shape != v.shape:
        _fail(ValueError, "v", f"the shape of k {tuple(k.shape)}", tuple(v.shape))
    if k.shape[2] != D:
        _fail(ValueError, "k/v head_dim", D, k.shape[2])
    if D not in HEAD_DIMS:
        _fail(ValueError, "q head_dim", "16, 32, 64 or 128", D)
    h_kv = k.shape[1]
    if not isinstance(enable_gqa, bool):
        _fail(TypeError, "enable_gqa", "a bool", type(enable_gqa).__name__)
    if enable_gqa and (h_kv == 0 or H % h_kv):
        _fail(ValueError, "k/v heads", f"a count that divides the {H} query heads (enable_gqa=True)", h_kv)
    if not enable_gqa and h_kv != H:
        _fail(ValueError, "k/v heads", f"{H} (or enable_gqa=True for fewer)", h_kv)
    for name, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] < 1:
            _fail(TypeError, name, "a 1-D torch.int32 tensor of batch + 1 prefix sums",
                  f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}")
        if t.device != q.device:
            _fail(ValueError, name, f"the query's device {q.device}", t.device)
    if cu_q.shape[0] != cu_k.shape[0]:
        _fail(ValueError, "cu_seqlens_k", f"as many entries as cu_seqlens_q ({cu_q.shape[0]})", cu_k.shape[0])
    if cu_q.shape[0] - 1 > 65535:
        _fail(ValueError, "cu_seqlens_q", "at most 65535 sequences (a grid dimension)", cu_q.shape[0] - 1)
    for name, n in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            _fail(TypeError, name, "a non-negative int", repr(n))
    if not isinstance(is_causal, bool):
        _fail(TypeError, "is_causal", "a bool", type(is_causal).__name__)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        _fail(TypeError, "scale", "a float or None", type(scale).__name__)
    elif not (abs(scale) <= 1.7976931348623157e308 if isinstance(scale, int) else math.isfinite(scale)):
        _fail(ValueError, "scale", "a finite number", scale if len(str(scale)) < 40 else "an int beyond the float range")
    if q.device.type not in ("cuda", "meta"):  # last: bad input fails the same way without a GPU
        _fail(ValueError, "q", "a CUDA tensor", f"a tensor on {q.device}")
    return float(scale)


def forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, return_lse):
    """(out, lse or None) on CUDA by the portable kernel."""
    from tylopy_kernels.attention.portable.launch import launch_forward
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device) if return_lse else None
    if q.shape[0] * q.shape[1] == 0 or max_q == 0 or max_k == 0:
        return out, lse
    q, scale = _nonpositive_scale(q, scale)
    launch_forward(q, k, v, out, lse, scale=scale, is_causal=is_causal, varlen=(cu_q, cu_k, max_q))
    return out, lse


def backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dlse, is_causal, scale):
    """(dq, dk, dv) on CUDA by the portable kernels; zeros for rows outside every sequence."""
    from tylopy_kernels.attention.portable.backward_launch import launch_backward_portable
    dq, dk, dv = (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if q.shape[0] * q.shape[1] == 0 or max_q == 0 or max_k == 0:
        return dq, dk, dv
    if dout.stride(-1) != 1:  # e.g. the zero-stride gradient of out.sum()
        dout = dout.contiguous()
    q_used, s = _nonpositive_scale(q, scale)
    launch_backward_portable(q_used, k, v, out, dout, lse, dq, dk, dv, is_causal=is_causal, scale=s, dlse=dlse,
                             varlen=(cu_q, cu_k, max_q, max_k))
    if scale < 0:
        dq.neg_()
    elif scale == 0:
        dq.zero_()
    return dq, dk, dv
