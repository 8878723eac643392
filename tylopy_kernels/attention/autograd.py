"""PyTorch integration of ``tylopy.attention``: custom operators, their fake tensors and gradients.

Four ``torch.library`` operators carry attention through autograd and ``torch.compile``:

=================================  ===========================================================
``tylopy::attention_fwd``          (q, k, v, attn_mask, is_causal, scale, return_lse) -> (out, lse)
``tylopy::attention_bwd``          (dout, q, k, v, out, lse, attn_mask, dlse, is_causal, scale)
                                   -> (dq, dk, dv)
``tylopy::attention_varlen_fwd``   (q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale,
                                   return_lse) -> (out, lse)
``tylopy::attention_varlen_bwd``   (dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dlse,
                                   is_causal, scale) -> (dq, dk, dv)
=================================  ===========================================================

Each has a fake implementation (``register_fake``: shapes, dtypes and devices only), so dynamo
traces a model that calls ``tylopy.attention`` into one graph (``fullgraph=True``) and AOT
autograd derives the backward graph from the registered formula. The forward saves q, k, v, out
and lse; the backward recomputes the probabilities from lse (``portable/backward.py`` has the
formulas). ``return_lse`` only says whether the caller sees lse: when it does not, lse is marked
non-differentiable and its gradient never reaches the backward, so the fast backward runs; when
it does, a gradient of lse is folded into the backward (the portable kernels take it).

On CUDA the operators launch the kernels (``tylopy_kernels.attention.dispatch.forward`` and ``backward``
pick Hopper's or the portable ones). On any other device they compute the same function with
torch operations in the inputs' dtype: a reference, so ``torch.autograd.gradcheck`` can check the
formula in float64 on the CPU through the very operators (``attention_op``, ``varlen_op``).

Eager calls skip the dispatcher (``eager.EagerOp``): the entry points call the operators' bodies
and give autograd the registered formulas directly, which saves about 200 microseconds of host
time per training step; a trace, a dispatch mode or a subclass tensor takes the operators.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tylopy_kernels.attention.common import ForwardTensors, PackedDocs
from tylopy_kernels.eager import EagerOp

NEG_INF = float("-inf")


# -- the reference math (CPU, any float dtype) ---------------------------------------------------------

def _allowed(n_q, n_k, mask, is_causal, device):
    """Boolean (.., n_q, n_k): keys that take part (causal: key j <= query i + n_k - n_q)."""
    keep = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if is_causal:
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)
    return keep if mask is None else keep & mask


def _grouped(t, heads):
    return t.repeat_interleave(heads // t.shape[1], dim=1) if t.shape[1] != heads else t


def _probabilities(q, k, mask, is_causal, scale, lse=None):
    """(P, lse) of the reference: rows with no key take part get P = 0 and lse = -inf."""
    s = (q @ _grouped(k, q.shape[1]).transpose(-1, -2)) * scale
    s = s.masked_fill(~_allowed(q.shape[2], k.shape[2], mask, is_causal, q.device), NEG_INF)
    if lse is None:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
    return p, lse


def lse_dtype(q):
    """fp32 LSE, as the kernels give; float64 inputs (the reference) keep float64."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def reference_forward(q, k, v, mask, is_causal, scale):
    """(out, lse) for (B, H, N, D) tensors; K/V heads may divide H (grouped-query attention)."""
    if k.shape[2] == 0:
        return q.new_zeros(q.shape), q.new_full(q.shape[:3], NEG_INF, dtype=lse_dtype(q))
    p, lse = _probabilities(q, k, mask, is_causal, scale)
    return p @ _grouped(v, q.shape[1]), lse.to(lse_dtype(q))


def _group_sum(t, heads_kv):
    B, H, N, D = t.shape
    return t.reshape(B, heads_kv, H // heads_kv, N, D).sum(dim=2)


def reference_backward(forward: ForwardTensors, dout, dlse, is_causal, scale):
    """(dq, dk, dv) from the saved lse, by the formulas the kernels use. ``forward``: the forward's
    q, k, v, out, lse and attn_mask; ``dlse`` the LSE's gradient or None."""
    q, k, v, out, lse, mask = forward
    if k.shape[2] == 0 or q.shape[2] == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    H, H_kv = q.shape[1], k.shape[1]
    p, _ = _probabilities(q, k, mask, is_causal, scale, lse.to(q.dtype))
    dv = _group_sum(p.transpose(-1, -2) @ dout, H_kv)
    dp = dout @ _grouped(v, H).transpose(-1, -2)
    delta = (dout * out).sum(dim=-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse.to(q.dtype).unsqueeze(-1)
    ds = p * (dp - delta)
    dq = (ds @ _grouped(k, H)) * scale
    dk = _group_sum(ds.transpose(-1, -2) @ q, H_kv) * scale
    return dq, dk, dv


def _sequences(cu_q, cu_k):
    return list(zip(cu_q.tolist(), cu_q.tolist()[1:], cu_k.tolist(), cu_k.tolist()[1:]))


def _as_batch(t, a, b):
    return t[a:b].transpose(0, 1).unsqueeze(0)  # (1, H, n, D)


def reference_varlen_forward(q, k, v, cu_q, cu_k, is_causal, scale):
    out = q.new_zeros(q.shape)
    lse = q.new_full((q.shape[1], q.shape[0]), NEG_INF, dtype=lse_dtype(q))
    for q0, q1, k0, k1 in _sequences(cu_q, cu_k):
        if q1 > q0:
            o, l = reference_forward(_as_batch(q, q0, q1), _as_batch(k, k0, k1), _as_batch(v, k0, k1), None,
                                     is_causal, scale)
            out[q0:q1] = o[0].transpose(0, 1)
            lse[:, q0:q1] = l[0]
    return out, lse


def reference_varlen_backward(forward: ForwardTensors, dout, dlse, cu_seqlens, is_causal, scale):
    """(dq, dk, dv) of packed sequences, one ``reference_backward`` per sequence. ``forward``: the
    packed q, k, v, out and lse (H, total_q); ``cu_seqlens``: (cu_q, cu_k)."""
    q, k, v, out, lse, _ = forward
    cu_q, cu_k = cu_seqlens
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0, q1, k0, k1 in _sequences(cu_q, cu_k):
        doc = ForwardTensors(_as_batch(q, q0, q1), _as_batch(k, k0, k1), _as_batch(v, k0, k1), _as_batch(out, q0, q1),
                             lse[:, q0:q1].unsqueeze(0))
        grads = reference_backward(doc, _as_batch(dout, q0, q1),
                                   None if dlse is None else dlse[:, q0:q1].unsqueeze(0), is_causal, scale)
        for dst, g, a, b in ((dq, grads[0], q0, q1), (dk, grads[1], k0, k1), (dv, grads[2], k0, k1)):
            dst[a:b] = g[0].transpose(0, 1)
    return dq, dk, dv


# -- the operators -------------------------------------------------------------------------------------------

def _rows_contiguous(*tensors):
    """The kernels read rows of D contiguous elements; a compiler may hand over other strides."""
    return [t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous() for t in tensors]


def _attention_fwd(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor], is_causal: bool, scale: float,
                   return_lse: bool) -> tuple[Tensor, Tensor]:
    if q.device.type == "cuda":
        from tylopy_kernels.attention.dispatch import forward
        return forward(*_rows_contiguous(q, k, v), attn_mask, is_causal, scale, True)[:2]
    return reference_forward(q, k, v, attn_mask, is_causal, scale)


attention_fwd = torch.library.custom_op("tylopy::attention_fwd", mutates_args=())(_attention_fwd)


@attention_fwd.register_fake
def _(q, k, v, attn_mask, is_causal, scale, return_lse):
    B, H, n_q, D = q.shape
    return q.new_empty((B, H, n_q, D)), q.new_empty((B, H, n_q), dtype=lse_dtype(q))


def _attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   attn_mask: Optional[Tensor], dlse: Optional[Tensor], is_causal: bool,
                   scale: float) -> tuple[Tensor, Tensor, Tensor]:
    if q.device.type == "cuda":
        from tylopy_kernels.attention.dispatch import backward
        return backward(ForwardTensors(*_rows_contiguous(q, k, v), out, lse, attn_mask), dout, dlse, is_causal, scale)
    return reference_backward(ForwardTensors(q, k, v, out, lse, attn_mask), dout, dlse, is_causal, scale)


attention_bwd = torch.library.custom_op("tylopy::attention_bwd", mutates_args=())(_attention_bwd)


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, attn_mask, dlse, is_causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
                          is_causal: bool, scale: float, return_lse: bool) -> tuple[Tensor, Tensor]:
    if q.device.type == "cuda":
        from tylopy_kernels.attention.varlen import forward_varlen
        return forward_varlen(*_rows_contiguous(q, k, v), PackedDocs(cu_q, cu_k, max_q, max_k), is_causal, scale, True)
    return reference_varlen_forward(q, k, v, cu_q, cu_k, is_causal, scale)


attention_varlen_fwd = torch.library.custom_op("tylopy::attention_varlen_fwd", mutates_args=())(_attention_varlen_fwd)


@attention_varlen_fwd.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, return_lse):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=lse_dtype(q))


def _attention_varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_q: Tensor,
                          cu_k: Tensor, max_q: int, max_k: int, dlse: Optional[Tensor], is_causal: bool,
                          scale: float) -> tuple[Tensor, Tensor, Tensor]:
    if q.device.type == "cuda":
        from tylopy_kernels.attention.varlen import backward_varlen
        return backward_varlen(ForwardTensors(*_rows_contiguous(q, k, v), out, lse), dout, dlse,
                               PackedDocs(cu_q, cu_k, max_q, max_k), is_causal, scale)
    return reference_varlen_backward(ForwardTensors(q, k, v, out, lse), dout, dlse, (cu_q, cu_k), is_causal, scale)


attention_varlen_bwd = torch.library.custom_op("tylopy::attention_varlen_bwd", mutates_args=())(_attention_varlen_bwd)


@attention_varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dlse, is_causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# -- the autograd formulas -------------------------------------------------------------------------------------

def _save(ctx, tensors, output, return_lse, **attrs):
    out, lse = output
    ctx.save_for_backward(*tensors, out, lse)
    ctx.return_lse = return_lse
    for name, value in attrs.items():
        setattr(ctx, name, value)
    if not return_lse:
        ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros, no slow path


def _fwd_setup(ctx, inputs, output):
    q, k, v, attn_mask, is_causal, scale, return_lse = inputs
    _save(ctx, (q, k, v, attn_mask), output, return_lse, is_causal=is_causal, scale=scale)


def _incoming(ctx, dout, dlse, out):
    """(dout, dlse) for the backward: zeros where no gradient came, no dlse unless lse was returned."""
    if dout is None:
        dout = torch.zeros_like(out)
    return dout, (dlse if ctx.return_lse else None)


def _fwd_backward(ctx, dout, dlse):
    q, k, v, attn_mask, out, lse = ctx.saved_tensors
    dout, dlse = _incoming(ctx, dout, dlse, out)
    dq, dk, dv = eager_bwd(dout, q, k, v, out, lse, attn_mask, dlse, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None, None, None


attention_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)
# the same bodies and formulas without operator dispatch, in eager code (``eager.EagerOp``)
eager_fwd = EagerOp(attention_fwd, _attention_fwd, _fwd_setup, _fwd_backward)
eager_bwd = EagerOp(attention_bwd, _attention_bwd)


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, return_lse = inputs
    _save(ctx, (q, k, v, cu_q, cu_k), output, return_lse, max_q=max_q, max_k=max_k, is_causal=is_causal,
          scale=scale)


def _varlen_backward(ctx, dout, dlse):
    q, k, v, cu_q, cu_k, out, lse = ctx.saved_tensors
    dout, dlse = _incoming(ctx, dout, dlse, out)
    dq, dk, dv = eager_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, ctx.max_q, ctx.max_k, dlse,
                                  ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None, None, None, None, None, None


attention_varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup)
eager_varlen_fwd = EagerOp(attention_varlen_fwd, _attention_varlen_fwd, _varlen_setup, _varlen_backward)
eager_varlen_bwd = EagerOp(attention_varlen_bwd, _attention_varlen_bwd)


# -- entry points ----------------------------------------------------------------------------------------------

def attention_op(q, k, v, attn_mask=None, is_causal=False, scale=1.0, return_lse=False):
    """Attention through the operator (differentiable, traceable); no argument checks."""
    out, lse = eager_fwd(q, k, v, attn_mask, is_causal, float(scale), return_lse)
    return (out, lse) if return_lse else out


def varlen_op(q, k, v, docs: PackedDocs, is_causal=False, scale=1.0, return_lse=False):
    """Packed variable-length attention through the operator (``docs.seqused_*`` must be None); no
    argument checks."""
    cu_q, cu_k, max_q, max_k = docs[:4]
    out, lse = eager_varlen_fwd(q, k, v, cu_q, cu_k, int(max_q), int(max_k), is_causal, float(scale), return_lse)
    return (out, lse) if return_lse else out
