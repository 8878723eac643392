"""FP8 attention checks shared by the tests and the benchmark: quantization with descales, the
FP64 reference on the dequantized inputs, and SDPA in bf16 on the same inputs (the error scale a
16-bit kernel has)."""
from __future__ import annotations

import math

import torch

from tylopy_kernels.attention.fp8 import dequantized  # noqa: F401  (the tests and the bench take it from here)
from tylopy_kernels.attention.sm90.forward_fp8 import P_OFFSET

E4M3_MAX = 448.0


def quantize(x: torch.Tensor, per_head: bool, kv_heads=None):
    """(e4m3 codes, float32 descale) of a (B, H, N, D) tensor: amax / 448 per tensor (a 1-element
    descale) or per (batch, K/V head) (a (B, H_kv) descale: the query's H / H_kv heads of a group
    share one, as FlashAttention-3's q_descale), as an FP8 pipeline would store them."""
    B, H, N, D = x.shape
    kv_heads = kv_heads or H
    if per_head:
        amax = x.reshape(B, kv_heads, H // kv_heads * N, D).abs().amax(dim=(2, 3))
        descale = amax.float().clamp_min(1e-12) / E4M3_MAX
        div = descale.repeat_interleave(H // kv_heads, 1)[:, :, None, None]
    else:
        descale = (x.abs().amax().float().clamp_min(1e-12) / E4M3_MAX).reshape(1)
        div = descale
    return (x.float() / div).to(torch.float8_e4m3fn), descale


def reference(q, k, v, causal=False, scale=None, mask=None):
    """FP64 (softmax(scale q k^T) v, LSE) of float64 (B, H, N, D) inputs; K/V heads repeated for GQA."""
    H = q.shape[1]
    k, v = (t.repeat_interleave(H // t.shape[1], 1) if t.shape[1] != H else t for t in (k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def sdpa_bf16(q, k, v, causal=False, scale=None, mask=None):
    """torch SDPA on the dequantized inputs rounded to bf16 (what a bf16 kernel would be given)."""
    H = q.shape[1]
    k, v = (t.repeat_interleave(H // t.shape[1], 1) if t.shape[1] != H else t for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                            attn_mask=mask, is_causal=causal, scale=scale)


def errors(out, want) -> dict:
    """max and mean absolute error of ``out`` against the FP64 ``want``."""
    err = (out.double() - want).abs()
    return {"max_abs": err.max().item(), "mean_abs": err.mean().item()}


def error_table(q8, k8, v8, descales, causal=False, out=None, scale=None) -> dict:
    """{"tylopy_fp8": errors, "sdpa_bf16": errors} on one problem (``out``: the FP8 output)."""
    qd, kd, vd = (dequantized(t, d) for t, d in zip((q8, k8, v8), descales))
    want, _ = reference(qd, kd, vd, causal, scale)
    row = {"sdpa_bf16": errors(sdpa_bf16(qd, kd, vd, causal, scale), want)}
    if out is not None:
        row["tylopy_fp8"] = errors(out, want)
    return row


def blockwise_model(q8, k8, v8, descales, causal=False, scale=None, block_n=128, mask=None):
    """The FP8 kernel's algorithm in float64: per key tile the running row maximum m, weights
    p = 2^((s - m) log2 e + P_OFFSET) rounded to e4m3 for the PV product, row sums of the unrounded
    weights, O and l rescaled when m moves; O / l times v_descale. It differs from the kernel
    only by the tensor cores' truncations and the approximate exp2 (a rare weight on the other
    side of an e4m3 rounding boundary)."""
    H, Hkv = q8.shape[1], k8.shape[1]
    kd = dequantized(k8, descales[1]).repeat_interleave(H // Hkv, 1)
    vc = v8.double().repeat_interleave(H // Hkv, 1)
    vdesc = dequantized(torch.ones(v8.shape[:2] + (1, 1), dtype=torch.float8_e4m3fn), descales[2])
    vdesc = vdesc.repeat_interleave(H // Hkv, 1)
    scale = 1 / math.sqrt(q8.shape[-1]) if scale is None else scale
    s = (dequantized(q8, descales[0]) @ kd.transpose(-1, -2)) * scale
    n_q, n_k = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    log2e = 1 / math.log(2)
    m = torch.full(s.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
    l = torch.zeros_like(m)
    o = torch.zeros(s.shape[:-1] + (q8.shape[-1],), dtype=torch.float64)
    for j in range(0, n_k, block_n):
        sj = s[..., j:j + block_n]
        m_new = torch.maximum(m, sj.amax(-1, keepdim=True))
        m_use = torch.where(m_new == -math.inf, 0.0, m_new)
        alpha = torch.exp2((m - m_use) * log2e)
        p = torch.exp2((sj - m_use) * log2e + P_OFFSET)
        pq = p.float().to(torch.float8_e4m3fn).double()
        l = l * alpha + p.sum(-1, keepdim=True)
        o = o * alpha + pq @ vc[..., j:j + block_n, :]
        m = m_new
    return torch.where(l > 0, o / l, 0.0) * vdesc
