"""References for the GEMM: the tensor cores' own arithmetic (bit-exact, for the emulator) and
FP64 with an error bound (for the GPU).

``tensorcore_model`` applies ``tylopy.semantics.tensorcore.mma_f32`` k16 step by step in the
kernel's order (k-blocks of 64 from 0, zero-filled past K), adds the bias in f32, applies a numpy
epilogue and rounds to the output dtype: what the emulator (and an H200) computes, bit for bit,
when the epilogue uses exact operations.

``within_bound`` checks a GPU result against FP64: each element may differ by the accumulation
error of fp32 tensor-core sums (terms truncated to 2^-25 of each k16 step's largest term, so at
most about 2^-20 of the step's magnitude, over K/16 steps: 2^-19 sum_k |a_ik| |b_kj| is safe) plus
one rounding to the output dtype (2^-8 relative for bf16, 2^-11 for fp16, 2^-24 for fp32).
"""
from __future__ import annotations

import numpy as np
import torch

OUT_REL = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -23}
ACC_REL = 2.0 ** -19


def tensorcore_model(a: torch.Tensor, b: torch.Tensor, bias=None, out_dtype=None, epilogue=None,
                     split_k: int = 1) -> torch.Tensor:
    """C = round(epilogue(sum of mma_f32 k16 steps + bias)) for 2-D CPU tensors (bf16/fp16 in).

    ``split_k`` = S: split s chains the k-blocks [s KT / S, (s + 1) KT / S) from zero, and the S
    partial sums are added in order in f32 (the split-K reduction).
    """
    from tylopy.semantics.tensorcore import mma_f32
    dt = "bf16" if a.dtype == torch.bfloat16 else "f16"
    m, k = a.shape
    n = b.shape[1]
    blocks = max(1, -(-k // 64))
    kp = 64 * blocks
    av = np.zeros((m, kp), np.float32)
    av[:, :k] = a.float().numpy()
    bv = np.zeros((kp, n), np.float32)
    bv[:k] = b.float().numpy()
    acc = None
    for split in range(split_k):
        part = None
        for s in range(64 * (split * blocks // split_k), 64 * ((split + 1) * blocks // split_k), 16):
            part = mma_f32(av[:, s:s + 16], bv[s:s + 16], part, dt)
        acc = part if acc is None else (acc + part).astype(np.float32)
    if bias is not None:
        acc = (acc + bias.float().numpy()[None, :]).astype(np.float32)
    if epilogue is not None:
        acc = np.asarray(epilogue(acc), dtype=np.float32)
    return torch.from_numpy(acc).to(out_dtype or a.dtype)


def reference_fp64(a: torch.Tensor, b: torch.Tensor, bias=None, epilogue=None) -> torch.Tensor:
    """epilogue(A B + bias) in float64 (on the inputs' device)."""
    c = a.double() @ b.double()
    if bias is not None:
        c = c + bias.double()
    return epilogue(c) if epilogue is not None else c


def bound(a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor, out_dtype, slope: float = 1.0) -> torch.Tensor:
    """The largest error each element may have (``slope`` scales the epilogue's amplification)."""
    mag = a.double().abs() @ b.double().abs()
    return slope * ACC_REL * mag + OUT_REL[out_dtype] * ref.abs() + 1e-30


def within_bound(out: torch.Tensor, a, b, ref, slope: float = 1.0) -> tuple[bool, float]:
    """(every element within ``bound``, the largest error / bound ratio); NaN anywhere fails."""
    err = (out.double() - ref).abs()
    ratio = err / bound(a, b, ref, out.dtype, slope)
    worst = float(ratio.max()) if ratio.numel() else 0.0
    return bool(torch.isfinite(out).all()) and worst <= 1.0, worst
