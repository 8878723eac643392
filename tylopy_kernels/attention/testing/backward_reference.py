"""References for attention gradients: autograd in a chosen precision, and the pass rule.

``attention_grads(q, k, v, dout, ...)`` runs softmax attention forward and backward through torch
autograd in ``dtype`` (float64 for the oracle, the inputs' dtype for the baseline a kernel is
measured against) and returns (out, lse, dq, dk, dv). K and V may have fewer heads than Q (GQA:
query head h uses key/value head h // group; their gradients are summed over the group). Masked
scores are -inf; a row with no key left has output 0, LSE -inf and zero gradients.

``gradient_rule(got, oracle, baseline)`` is FlashAttention's test rule: the kernel's largest
error against the float64 oracle may be at most twice that of the same computation done by
torch in the input dtype, plus a floor for outputs that are exact in both.
"""
from __future__ import annotations

import math

import torch


def attention_grads(q, k, v, dout, *, is_causal=False, scale=None, attn_mask=None, dtype=torch.float64):
    """(out, lse, dq, dk, dv) by autograd in ``dtype``; ``is_causal`` keeps key j <= query i."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    qq, kk, vv = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    kr, vr = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
    s = (qq @ kr.transpose(-1, -2)) * scale
    keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device)
    if is_causal:
        keep = torch.ones_like(keep).tril()
    keep = keep & attn_mask.to(s.device) if attn_mask is not None else keep.expand(s.shape)
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s.float() if dtype != torch.float64 else s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = p @ vr
    out.backward(dout.to(dtype))
    return out.detach(), lse.detach().float(), qq.grad, kk.grad, vv.grad


def max_error(got, oracle) -> float:
    return (got.double() - oracle.double()).abs().max().item() if got.numel() else 0.0


def gradient_rule(got, oracle, baseline, floor: float | None = None) -> tuple[bool, str]:
    """(passes, message): error(got) <= 2 error(baseline) + floor, errors against ``oracle``.

    The default floor is 2**-9 of the oracle's largest magnitude (a few units in the last place
    of bf16 at that size), so an output the baseline happens to get exactly right still passes
    when the kernel rounds it once differently."""
    err, base = max_error(got, oracle), max_error(baseline, oracle)
    if floor is None:
        floor = 2.0 ** -9 * (oracle.double().abs().max().item() if oracle.numel() else 0.0) + 1e-6
    ok = math.isfinite(err) and err <= 2 * base + floor
    return ok, f"max error {err:.3e} vs torch in the input dtype {base:.3e} (limit {2 * base + floor:.3e})"
