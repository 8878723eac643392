"""Host side of the portable attention backward (``backward.py``): buffers and launches.

    launch_backward_portable(q, k, v, out, dout, lse, dq, dk, dv, is_causal=False, scale=0.125)
    plan_backward_portable(BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv), BackwardOptions(0.125))

fills dq, dk, dv from the forward's inputs, its output ``out``, the output gradient ``dout``
and the forward's LSE (fp32, natural log). Batched tensors are (B, H, N, D) with K/V of
H_kv heads dividing H (dk, dv get the sum over each group); ``varlen=(cu_q, cu_k, max_seqlen_q,
max_seqlen_k)`` takes packed (total, H, D) tensors and an LSE of shape (H, total_q). ``dlse``, a
gradient of the returned LSE (same layout), is folded into delta. ``plan_backward_portable``
returns the launches without running them, so the same plan runs in the emulator on CPU
tensors (``Launch.run(emulate=True)``). Every launch is deterministic. Each ``Launch`` names its
arguments by kernel parameter, one per tensor (the kernels read shapes and strides from them).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tylopy_kernels.attention.portable.backward import (BLOCK_M, BLOCK_N, HEAD_DIMS, KV_SMEM, PRE_THREADS, WARPS,
                                                        attention_bwd_dkdv_portable, attention_bwd_dq_portable,
                                                        attention_bwd_preprocess_portable)
from tylopy_kernels.attention.common import BackwardTensors, placeholder, rejecter  # noqa: F401 (BackwardTensors: re-exported)
from tylopy_kernels.attention.portable.forward import ROWS_PER_WARP
from tylopy_kernels.attention.portable.launch import (MAX_GRID_YZ, Launch, aligned, dtype_of, mask_view, stats_view,
                                                      token_view, unused)


_fail = rejecter("attention backward")


@dataclasses.dataclass(frozen=True)
class BackwardOptions:
    """What one backward computes: ``scale`` (> 0), SDPA's top-left ``is_causal``,
    ``varlen=(cu_q, cu_k, max_seqlen_q, max_seqlen_k)`` for packed tensors, and ``async_copy``
    (cp.async copies, else ld/st)."""

    scale: float
    is_causal: bool = False
    varlen: Optional[tuple] = None
    async_copy: bool = True


def _check(tensors: BackwardTensors, packed):
    q, k, v, out, dout, _, dq, dk, dv = tensors[:9]
    dims = 3 if packed else 4
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        if not isinstance(t, torch.Tensor) or t.dim() != dims:
            _fail(ValueError, name, f"a {dims}-D tensor", getattr(t, "shape", type(t)))
        if t.dtype != q.dtype or t.dtype not in (torch.bfloat16, torch.float16):
            _fail(TypeError, name, f"dtype bf16 or fp16 like q ({q.dtype})", t.dtype)
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            _fail(ValueError, name, "a contiguous last dimension", f"stride {t.stride(-1)}")
    for name, t, like in (("out", out, q), ("dout", dout, q), ("dq", dq, q), ("dk", dk, k), ("dv", dv, k),
                          ("v", v, k)):
        if t.shape != like.shape:
            _fail(ValueError, name, f"shape {tuple(like.shape)}", tuple(t.shape))
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):  # written as 32-bit words
        if t.data_ptr() % 4 or any(t.stride(d) % 2 for d in range(dims - 1)):
            _fail(ValueError, name, "4-byte aligned rows", f"strides {t.stride()}")
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        _fail(ValueError, "head_dim", f"one of {HEAD_DIMS}", D)
    H, H_kv = q.shape[-2 if packed else 1], k.shape[-2 if packed else 1]
    if H_kv == 0 or H % H_kv:
        _fail(ValueError, "key/value heads", f"a divisor of the {H} query heads", H_kv)
    return H, H_kv, D


def plan_backward_portable(tensors: BackwardTensors, options: BackwardOptions) -> list[Launch]:
    """The launches that fill dq, dk, dv (see the module docstring)."""
    q, k, v, out, dout, lse, dq, dk, dv, attn_mask, dlse = tensors
    scale, is_causal, varlen = options.scale, options.is_causal, options.varlen
    packed = varlen is not None
    H, H_kv, D = _check(tensors, packed)
    dev = q.device
    if packed:
        cu_q, cu_k, n_q, n_k = varlen  # n_q, n_k: the longest sequences
        B = cu_q.shape[0] - 1
        want_lse = (H, q.shape[0])
    else:
        B, n_q, n_k = q.shape[0], q.shape[2], k.shape[2]
        cu_q = cu_k = placeholder(dev, torch.int32)
        want_lse = (B, H, n_q)
    if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or tuple(lse.shape) != want_lse:
        _fail(ValueError, "lse", f"an fp32 tensor of shape {want_lse}", getattr(lse, "shape", type(lse)))
    if B > MAX_GRID_YZ or H > MAX_GRID_YZ:
        _fail(ValueError, "batch and heads", f"at most {MAX_GRID_YZ} each (grid dimensions)", (B, H))
    if B * H == 0:
        return []
    if not packed and n_q * n_k == 0:  # no scores: every gradient is zero
        for t in (dq, dk, dv):
            t.zero_()
        return []
    lse = lse.contiguous()
    delta = torch.empty_like(lse)  # L's layout: the gradient kernels read it at L's offsets
    f32 = torch.float32
    seqs = B if packed else None
    dlse_t = unused(dev, f32, 3) if dlse is None else stats_view(dlse.to(f32).contiguous(), seqs)
    q, k, v, out, dout = (aligned(t) for t in (q, k, v, out, dout))
    if attn_mask is not None and not packed:
        mask = mask_view(attn_mask, (B, H, n_q, n_k))
    else:
        mask = unused(dev, torch.uint8, 4)
    dtype = dtype_of(q)
    common = dict(DTYPE=dtype, HEAD_DIM=D, WARPS=WARPS, HAS_MASK=attn_mask is not None,
                  ASYNC_COPY=options.async_copy, VARLEN=packed)
    rows = ROWS_PER_WARP * WARPS
    views = {name: token_view(x, seqs) for name, x in (("q", q), ("k", k), ("v", v), ("out", out),
                                                          ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv))}
    stats = dict(lse=stats_view(lse, seqs), delta=stats_view(delta, seqs))
    inputs = dict(q=views["q"], k=views["k"], v=views["v"], dout=views["dout"], **stats, mask=mask, cu_q=cu_q,
                  cu_k=cu_k, kv_group=H // H_kv, scale=float(scale), causal=int(is_causal))
    pre_rows = PRE_THREADS * 8 // D
    launches = [Launch(attention_bwd_preprocess_portable, (-(-n_q // pre_rows), H, B),
                       dict(out=views["out"], dout=views["dout"], dlse=dlse_t, delta=stats["delta"], cu_q=cu_q),
                       dict(DTYPE=dtype, HEAD_DIM=D, HAS_DLSE=dlse is not None, VARLEN=packed))]
    if n_k > 0:
        launches.append(Launch(attention_bwd_dkdv_portable, (-(-n_k // rows), H_kv, B),
                               dict(inputs, dk=views["dk"], dv=views["dv"]),
                               dict(common, BLOCK_M=BLOCK_M[D], KV_SMEM=KV_SMEM[D])))
    if n_q > 0:
        launches.append(Launch(attention_bwd_dq_portable, (-(-n_q // rows), H, B), dict(inputs, dq=views["dq"]),
                               dict(common, BLOCK_N=BLOCK_N[D])))
    return [launch for launch in launches if launch.grid[0] > 0]


def launch_backward_portable(q, k, v, out, dout, lse, *grads, **options) -> None:
    """Fill ``grads`` (dq, dk, dv) on the current stream (no host synchronization; capturable in a
    CUDA graph). ``options``: ``attn_mask`` and ``dlse`` (``BackwardTensors``) and ``BackwardOptions``'
    fields, as keywords."""
    if len(grads) != 3:
        _fail(TypeError, "grads", "dq, dk, dv (three tensors)", f"{len(grads)} tensors")
    extra = {name: options.pop(name, None) for name in ("attn_mask", "dlse")}
    tensors = BackwardTensors(q, k, v, out, dout, lse, *grads, **extra)
    for launch in plan_backward_portable(tensors, BackwardOptions(**options)):
        launch.run()
