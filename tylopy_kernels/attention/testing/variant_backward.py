"""Variant cases and the gradient check the variant backward's emulator and GPU tests share.

``check`` compares dq, dk, dv (and dsinks) with float64 autograd of the torch reference
(``variants.reference_backward``): the largest error at most ``TOL`` of the largest reference
gradient, a few bf16 units (the kernels' products take bf16 operands).
"""
import torch

from tylopy_kernels.attention import variants as V
from tylopy_kernels.attention.common import ForwardTensors, VariantCall

TOL = 1.5e-2


def gated_bias(score, b, h, q_idx, kv_idx):
    """A smooth cap plus a per-head distance bias: neither is a built-in keyword."""
    return 30.0 * torch.tanh(score / 30.0) * (1.0 + 0.25 * h) - 0.01 * (q_idx - kv_idx)


def check(got, q, k, v, dout, variant, tensors, scale):
    """Raise AssertionError naming the first gradient in ``got`` past the rule; else a summary line."""
    ref = V.reference_backward(ForwardTensors(q.double(), k.double(), v.double(), None), dout.double(),
                               VariantCall(variant, [t.double() if t.is_floating_point() else t for t in tensors], scale))
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
    """{name: make_variant keywords} with random tensors from generator ``g`` (CPU)."""
    return {
        "softcap": dict(softcap=12.0),
        "alibi-bh": dict(alibi_slopes=torch.rand(B, H, generator=g)),
        "alibi-causal": dict(alibi_slopes=torch.rand(B, H, generator=g) + 0.05, is_causal=True),  # (folded)
        "causal-bottom-right-window": dict(is_causal=True, causal_align="bottom_right", window_size=(70, -1)),
        "window-both-sides": dict(window_size=(90, 40)),
        "sinks": dict(sinks=torch.randn(H, generator=g)),
        "float-mask": dict(attn_mask=torch.randn(1, H, n_q, n_k, generator=g)),
        "bool-mask": dict(attn_mask=torch.rand(n_q, n_k, generator=g) > 0.3),
        "score_mod": dict(score_mod=gated_bias),
        "mask_mod": dict(mask_mod=lambda b, h, q, kv: (q + 2 * kv + h) % 5 != 1),
        "softcap-alibi-sinks-causal": dict(softcap=8.0, alibi_slopes=torch.rand(H, generator=g) * 0.1, is_causal=True,
                                           causal_align="bottom_right",
                                           sinks=torch.randn(H, generator=g)),
    }


