"""A float32 model of the Hopper kernel's arithmetic, on the CPU: the stand-in that tests of the pass
rules (``rules.py``) and ``tylopy check attention --dry-run`` run instead of the GPU kernel.

``fp32_model`` is an ``attention``-like function; ``model_launch`` a ``launch_hopper``-like one.
Switching off one step of the algorithm (``round_p_to_input``, ``rescale``) or computing on other
tile boundaries gives the broken variants that the rules must reject.
"""
from __future__ import annotations

import torch

from tylopy_kernels.attention.testing.reference import LOG2E, NEG_INF, allowed_keys, resolve_scale


def fp32_model(block_n: int = 128, round_p_to_input: bool = True, rescale: bool = True):
    """An ``attention``-like function computing as the kernel does, in float32: raw scores, the
    running max per tile, c = scale log2(e), p = exp2((s - m) c), l over the unrounded p, P
    rounded to the input dtype before PV, O rescaled by exp2((m_old - m_new) c). ``round_p_to_input``
    and ``rescale`` switch off one step each, to check that the rules catch it."""
    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, return_lse=False):
        B, H, n_q, D = q.shape
        sc = resolve_scale(scale, D)
        c = torch.tensor(sc, dtype=torch.float32) * torch.tensor(LOG2E, dtype=torch.float32)
        m = torch.full((B, H, n_q, 1), NEG_INF)
        l = torch.zeros_like(m)
        acc = torch.zeros((B, H, n_q, D))
        for c0 in range(0, k.shape[2], block_n):
            cols = slice(c0, min(c0 + block_n, k.shape[2]))
            s = q.float() @ k[:, :, cols].float().transpose(-1, -2)
            s = s.masked_fill(~allowed_keys(q, k, attn_mask, is_causal, cols), NEG_INF)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_use = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp2((m - m_use) * c) if rescale else torch.ones_like(m)
            p = torch.exp2((s - m_use) * c)
            l = alpha * l + p.sum(-1, keepdim=True)
            pr = p.to(q.dtype).float() if round_p_to_input else p
            acc = alpha * acc + pr @ v[:, :, cols].float()
            m = m_new
        inv = torch.where(l > 0, 1 / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(l))
        out = (acc * inv).to(q.dtype)
        m_use = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        lse = torch.where(l > 0, m_use * sc + torch.log(l), torch.full_like(l, NEG_INF)).squeeze(-1)
        return (out, lse) if return_lse else out
    return attention


def model_launch(block_n: int = 128):
    """A ``launch_hopper``-like function over ``fp32_model``: ``launch(ForwardTensors, options)``
    writes into the tensors' out and lse (``options`` gives scale and is_causal)."""
    model = fp32_model(block_n)

    def launch(tensors, options):
        q, k, v, out, lse, attn_mask = tensors
        res = model(q, k, v, attn_mask=attn_mask, is_causal=options.is_causal, scale=options.scale,
                    return_lse=lse is not None)
        if lse is not None:
            out.copy_(res[0])
            lse.copy_(res[1])
        else:
            out.copy_(res)
    return launch
