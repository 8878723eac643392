"""Inputs and the bit-exact numpy model of the library's scaled FP8 GEMM (tylopy_kernels/gemm/fp8.py),
shared by tests/test_gemm_fp8.py (emulator) and tests/test_gemm_fp8_gpu.py (H200).

The model is the kernel's arithmetic step by step: k32 wgmma steps by the FP8 tensor-core model
(``mma_fp8``) in k order; without promotion one chain over all of K, with promotion each k-block
of ``interval`` codes from zero, added into an f32 total (block scales: total = fma(part, s,
total), s = scale_a[r, kb] * scale_b[kb, c / 128] in f32, the first k-block part * s); then the
epilogue in f32 (per tensor / per row: v * s, or fma(v, s, bias) with a bias; block: v + bias)
and one rounding to the output dtype.
"""
import numpy as np
import torch

from tylopy.semantics.conversions import round_to
from tylopy.semantics.scalar import fma_f32
from tylopy.semantics.tensorcore import mma_fp8

FMT = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
OUT = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def operands(m, n, k, a_dtype=torch.float8_e4m3fn, b_dtype=torch.float8_e4m3fn, seed=0, device="cpu"):
    """a (M, K) row-major, b = w.t() of a row-major (N, K) w: random codes of moderate range."""
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=gen) * 3).to(a_dtype)
    w = (torch.randn(n, k, generator=gen) * 3).to(b_dtype)
    return a.to(device), w.to(device).t()


def scales(form, m, n, k, seed=0, device="cpu", transposed=False):
    """(scale_a, scale_b) of ``form``; ``transposed`` stores the block scales column-major."""
    gen = torch.Generator().manual_seed(seed + 1)
    kb, nb = -(-k // 128), -(-n // 128)

    def r(*shape):
        return torch.rand(*shape, generator=gen) * 1.5 + 0.25

    if form == "tensor":
        sa, sb = torch.tensor(0.75), torch.tensor([0.125])
    elif form == "row":
        sa, sb = r(m, 1), r(1, n)
    elif transposed:
        sa, sb = r(kb, m).t(), r(nb, kb).t()
    else:
        sa, sb = r(m, kb), r(kb, nb)
    return sa.to(device), sb.to(device)


def form_of(m, n, sa, sb):
    if sa.numel() == 1 and sb.numel() == 1:
        return "tensor"
    return "row" if tuple(sa.shape) == (m, 1) and tuple(sb.shape) == (1, n) else "block"


def model(a, b, sa, sb, bias=None, out_dtype=torch.bfloat16, promote=True, interval=128) -> np.ndarray:
    m, k = a.shape
    n = b.shape[1]
    form = form_of(m, n, sa, sb)
    promote = promote or form == "block"
    kp = -(-k // 128) * 128
    A = np.zeros((m, kp), np.float32)
    Bt = np.zeros((kp, n), np.float32)
    A[:, :k], Bt[:k] = a.cpu().float().numpy(), b.cpu().float().numpy()
    fmts = (FMT[a.dtype], FMT[b.dtype])
    sa_np, sb_np = sa.cpu().float().numpy(), sb.cpu().float().numpy()
    acc = None
    for kb, k0 in enumerate(range(0, kp, interval)):
        part = None if promote else acc
        for s in range(k0, k0 + interval, 32):
            part = mma_fp8(A[:, s:s + 32], Bt[s:s + 32], part, fmts)
        if not promote:
            acc = part
        elif form == "block":
            scale = (sa_np[:, kb:kb + 1] * sb_np[kb][np.arange(n) // 128][None, :]).astype(np.float32)
            acc = (part * scale).astype(np.float32) if acc is None else fma_f32(part, scale, acc)
        else:
            acc = part if acc is None else (acc + part).astype(np.float32)
    bias_np = None if bias is None else bias.cpu().float().numpy()[None, :]
    if form == "block":
        v = acc if bias_np is None else (acc + bias_np).astype(np.float32)
    else:
        if form == "tensor":
            s = np.full((m, n), np.float32(sa_np.reshape(-1)[0]) * np.float32(sb_np.reshape(-1)[0]), np.float32)
        else:
            s = (sa_np * sb_np).astype(np.float32)
        v = (acc * s).astype(np.float32) if bias_np is None else \
            fma_f32(acc, s, np.broadcast_to(bias_np, acc.shape).astype(np.float32))
    return v if out_dtype == torch.float32 else round_to(v, OUT[out_dtype])


def f64_bound(a, b, sa, sb, bias=None, out_dtype=torch.bfloat16, promote=True):
    """|C - exact| allowed: the FP8 accumulator's truncations (13 fraction bits per k32 step, over
    a k-block with promotion or all of K without) on the scaled sum of |products|, plus one output
    rounding."""
    from tylopy_kernels.gemm.fp8_ops import reference
    mag = reference(a.double().abs(), b.double().abs(), sa.abs(), sb.abs(), None, torch.float64, torch.float64).cpu()
    exact = reference(a, b, sa, sb, bias, torch.float64, torch.float64).cpu()
    steps = (128 if promote else a.shape[1]) / 32 + 2
    out_ulp = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -23}[out_dtype]
    return steps * 34 * 2.0 ** -12 * mag + out_ulp * (exact.abs() + mag * 2.0 ** -12) + 1e-30, exact
