"""Shared pieces of the tests of ``attention_varlen`` with variant keywords (CPU emulator and GPU):
ragged document lengths, the user mods, and the per-document float64 reference.

The reference runs each document alone through ``tylopy.attention``'s float64 torch path (the
dense variant definition, ``variants.reference_forward``) with the same keywords, bottom-right
aligned; the user's mods see b = the document's index there too. Nothing of the packed route
(document table, generated mods, block mask) takes part in it.
"""
import torch

import tylopy as ty

# documents: a long one over a tile edge, a length-1 one, one with keys but no queries, one with
# queries but no keys, more keys than queries and the reverse
LENS_Q = (130, 1, 0, 70, 40, 23)
LENS_K = (150, 1, 5, 64, 0, 31)


def prefix(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def packed(total, heads, dim, gen, dtype, pad=48):
    """A fresh random (total, heads, dim) view whose storage holds NaN past its last row."""
    buf = torch.full((total + pad, heads, dim), float("nan"), dtype=dtype)
    buf[:total] = torch.randn(total, heads, dim, generator=gen).to(dtype)
    return buf[:total]


def doc_bias(score, b, h, q_idx, kv_idx):
    """A per-document, per-head distance bias (document-relative positions)."""
    return score * (1.0 + 0.125 * h) - 0.02 * (q_idx - kv_idx).abs() + 0.25 * b


def doc_bias_bwd(score, grad, b, h, q_idx, kv_idx):
    return grad * (1.0 + 0.125 * h)


def gain_mods(device=None, heads=8):
    """(score_mod, score_mod_bwd) reading a per-head gain captured on ``device``: score * gain[h] minus a
    distance bias plus a per-document offset, and its derivative, which reads the same tensor."""
    gain = (0.625 + 0.25 * (torch.arange(heads) % 4)).to(torch.float32).to(device)

    def gain_bias(score, b, h, q_idx, kv_idx):
        return score * gain[h] - 0.02 * (q_idx - kv_idx).abs() + 0.25 * b

    def gain_bias_bwd(score, grad, b, h, q_idx, kv_idx):
        return grad * gain[h]
    return gain_bias, gain_bias_bwd


def stripes(b, h, q_idx, kv_idx):
    return (q_idx + 2 * kv_idx + h + b) % 5 != 1


def per_document(q, k, v, cu_q, cu_k, scale, keywords, is_causal):
    """(out (total_q, H, D), lse (H, total_q)) in float64, each document alone (differentiable)."""
    H = q.shape[1]
    outs, lses = [], []
    for d in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[d], cu_q[d + 1], cu_k[d], cu_k[d + 1]
        nq = qe - qs
        if nq == 0:
            continue
        if ke == ks:  # no keys: zeros, LSE -inf (the sink's logit with sinks)
            outs.append(torch.zeros_like(q[qs:qe]))
            sinks = keywords.get("sinks")
            lses.append(sinks.double().view(H, 1).expand(H, nq) if sinks is not None
                        else torch.full((H, nq), float("-inf"), dtype=torch.float64, device=q.device))
            continue
        kw = dict(keywords)
        for arg in ("score_mod", "mask_mod", "score_mod_bwd"):
            kw[arg] = _shifted(kw[arg], d, arg) if kw.get(arg) is not None else None
        slopes = kw.get("alibi_slopes")
        if slopes is not None and slopes.dim() == 2:
            kw["alibi_slopes"] = slopes[d:d + 1].contiguous()
        one = (lambda t: t.transpose(0, 1).unsqueeze(0))
        o, lse = ty.attention(one(q[qs:qe]), one(k[ks:ke]), one(v[ks:ke]), is_causal=is_causal,
                              causal_align="bottom_right", enable_gqa=True, scale=scale, return_lse=True, **kw)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    rows = cu_q[-1]
    out = torch.cat(outs) if outs else q[:0].double()
    lse = torch.cat(lses, 1) if lses else torch.zeros((H, 0), dtype=torch.float64, device=q.device)
    tail = q.shape[0] - rows   # rows past the last document
    if tail:
        out = torch.cat([out, torch.zeros_like(q[rows:])])
        sinks = keywords.get("sinks")  # (with sinks such a row's LSE is the sink's logit, as any row without keys)
        lse = torch.cat([lse, sinks.double().view(H, 1).expand(H, tail) if sinks is not None
                         else torch.full((H, tail), float("-inf"), dtype=torch.float64, device=q.device)], 1)
    return out, lse


def _shifted(fn, d, arg):
    """``fn`` with b = the document index (the dense call passes b = 0)."""
    if arg == "mask_mod":
        return lambda b, h, i, j, *rest: fn(b + d, h, i, j, *rest)
    if arg == "score_mod_bwd":
        return lambda s, g, b, h, i, j, *rest: fn(s, g, b + d, h, i, j, *rest)
    return lambda s, b, h, i, j, *rest: fn(s, b + d, h, i, j, *rest)
