"""Checking attention gradients the way FlashAttention's tests do.

For inputs in bf16 or fp16, a result passes when its largest error against a float64 reference
is at most twice the largest error of the same computation done by torch in the input dtype,
plus a small floor (half a unit in the last place of the reference's largest magnitude):

    max |ours - ref64|  <=  2 max |torch_in_dtype - ref64|  +  u max(1, max |ref64|)

Both references are ``autograd.py``'s reference formulas (the ones the kernels implement,
checked against torch autograd by the tests): ``ref64`` in float64, the other in the inputs'
dtype. ``check`` applies the rule to out, lse (against float64 only: its rule is relative),
dq, dk and dv, and raises AssertionError naming every quantity that fails; varlen inputs
(packed (total, H, D) tensors and cu_seqlens) are compared over the rows of their sequences.

    got, scale = emulate(BackwardInputs(q, k, v, dout, mask, causal))      # CPU, the portable kernels
    check(got, BackwardInputs(q, k, v, dout, mask, causal, scale))
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from tylopy_kernels.attention import autograd as A
from tylopy_kernels.attention.common import ForwardTensors

UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
LSE_RTOL = 1e-5


class BackwardInputs(NamedTuple):
    """One attention backward problem: q, k, v and the output gradient ``dout`` ((B, H, n, D), or
    packed (total, H, D) with ``varlen``), the optional mask, SDPA's top-left ``causal``, the scale
    (None: 1/sqrt(D)), the optional gradient of the returned LSE (``dlse``), and ``varlen``:
    (cu_q, cu_k) for the references and checks, (cu_q, cu_k, max_seqlen_q, max_seqlen_k) for
    ``emulate``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    mask: torch.Tensor | None = None
    causal: bool = False
    scale: float | None = None
    dlse: torch.Tensor | None = None
    varlen: tuple | None = None

    def resolved_scale(self) -> float:
        return 1.0 / math.sqrt(self.q.shape[-1]) if self.scale is None else self.scale


def references(inputs: BackwardInputs):
    """{name: tensor} in float64 and {name: tensor} in the inputs' dtype (out, lse, dq, dk, dv)."""
    q, k, v, dout, mask, causal, _, dlse, varlen = inputs
    scale = inputs.resolved_scale()
    result = []
    for dtype in (torch.float64, q.dtype):
        t = [x.to(dtype) for x in (q, k, v, dout)]
        d = None if dlse is None else dlse.to(torch.float64 if dtype == torch.float64 else torch.float32)
        if varlen is None:
            out, lse = A.reference_forward(*t[:3], mask, causal, scale)
            grads = A.reference_backward(ForwardTensors(*t[:3], out, lse, mask), t[3], d, causal, scale)
        else:
            cu_q, cu_k = varlen[:2]
            out, lse = A.reference_varlen_forward(*t[:3], cu_q, cu_k, causal, scale)
            grads = A.reference_varlen_backward(ForwardTensors(*t[:3], out, lse), t[3], d, (cu_q, cu_k), causal, scale)
        result.append(dict(zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads))))
    return result


def _rows(name, varlen):
    """The rows of a packed tensor that belong to sequences: (dim, count) or None for all."""
    if varlen is None:
        return None
    cu_q, cu_k = varlen[:2]
    n = int((cu_q if name in ("out", "dq", "lse") else cu_k)[-1])
    return (1 if name == "lse" else 0), n


def _valid(t, name, varlen):
    rows = _rows(name, varlen)
    return t if rows is None else t.narrow(rows[0], 0, rows[1])


def check(got: dict, inputs: BackwardInputs) -> str:
    """Apply the rule to every entry of ``got`` (out, lse, dq, dk, dv) of ``inputs``; returns a
    one-line summary."""
    if not isinstance(inputs, BackwardInputs):
        raise TypeError(f"check expects inputs=BackwardInputs(q, k, v, dout, ...), but got {type(inputs).__name__}")
    ref64, same = references(inputs)  # on the inputs' device
    q, varlen = inputs.q, inputs.varlen
    u = UNIT_ROUNDOFF[q.dtype]
    problems, parts = [], []
    for name, value in got.items():
        mine = _valid(value.detach().cpu().double(), name, varlen)
        ref = _valid(ref64[name].cpu(), name, varlen)
        if name == "lse":
            finite = torch.isfinite(ref)
            if not torch.equal(torch.isinf(mine), torch.isinf(ref)) or torch.isnan(mine).any():
                problems.append("lse: -inf where the reference is finite, or the other way, or NaN")
                continue
            err = ((mine - ref).abs() / ref.abs().clamp_min(1.0))[finite].max().item() if finite.any() else 0.0
            parts.append(f"lse {err:.1e}")
            if err > LSE_RTOL:
                problems.append(f"lse: relative error {err:.2e} > {LSE_RTOL:.0e}")
            continue
        if not torch.isfinite(mine).all():
            problems.append(f"{name}: not finite")
            continue
        err = (mine - ref).abs().max().item() if ref.numel() else 0.0
        base = (_valid(same[name].cpu().double(), name, varlen) - ref).abs().max().item() if ref.numel() else 0.0
        floor = u * max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
        parts.append(f"{name} {err:.1e}/{base:.1e}")
        if err > 2 * base + floor:
            problems.append(f"{name}: error {err:.3e} > 2 x {base:.3e} (torch in {q.dtype}) + {floor:.1e}")
    if problems:
        raise AssertionError("; ".join(problems))
    return ", ".join(parts)


def emulate(inputs: BackwardInputs, seed=None):
    """({out, lse, dq, dk, dv}, scale) of ``inputs`` by the portable launchers' plans run in the
    emulator on CPU tensors (``varlen=(cu_q, cu_k, max_seqlen_q, max_seqlen_k)`` for packed ones). Outputs start
    NaN-filled, except the rows of packed tensors past every sequence (zeros, LSE -inf: the kernels
    do not write them); ``seed`` picks a random warp schedule for the backward."""
    from tylopy_kernels.attention.portable.backward_launch import (BackwardOptions, BackwardTensors,
                                                                   plan_backward_portable)
    from tylopy_kernels.attention.portable.launch import ForwardOptions, ForwardTensors, plan_forward
    q, k, v, dout, mask, causal, _, dlse, varlen = inputs
    scale = inputs.resolved_scale()
    packed = varlen is not None
    heads = q.shape[-2 if packed else 1]
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full((heads, q.shape[0]) if packed else q.shape[:3], float("nan"))
    fwd_varlen = None if not packed else (varlen[0], varlen[1], varlen[2])
    if packed:  # rows past every sequence are not written by the kernels
        n_q, n_k = int(varlen[0][-1]), int(varlen[1][-1])
        out[n_q:] = 0
        lse[:, n_q:] = float("-inf")
    launch = plan_forward(ForwardTensors(q, k, v, out, lse, mask), ForwardOptions(scale, causal, varlen=fwd_varlen))
    if launch is not None:
        launch.run(emulate=True)
    grads = [torch.full(t.shape, float("nan"), dtype=t.dtype) for t in (q, k, v)]
    if packed:
        for g, n in zip(grads, (n_q, n_k, n_k)):
            g[n:] = 0
    tensors = BackwardTensors(q, k, v, out, dout, lse, *grads, attn_mask=mask, dlse=dlse)
    for step in plan_backward_portable(tensors, BackwardOptions(scale, causal, varlen=varlen)):
        step.run(emulate=True, seed=seed)
    return dict(out=out, lse=lse, dq=grads[0], dk=grads[1], dv=grads[2]), scale
