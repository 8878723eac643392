"""The Hopper backward of programmable attention on the GPU: ``launch_backward_variant``'s dq, dk,
dv (and dsinks) against float64 autograd of the torch reference, for every variant of the emulator
tests at ragged sizes, D 64 and 128, GQA; and training through ``tylopy.attention`` (eager and
``torch.compile``) without falling back to the reference path."""
import math
import warnings

import pytest
import torch

import tylopy as ty
from tylopy_kernels.attention import variants as V
from tylopy_kernels.attention.testing.variant_backward import check, variant_cases

pytestmark = pytest.mark.gpu

needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                  reason="needs a Hopper GPU")


def _cases(g, B, H, n_q, n_k):
    return {name: {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
            for name, kw in variant_cases(g, B, H, n_q, n_k).items()}


@needs_hopper
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["softcap", "alibi-bh", "causal-bottom-right-window", "window-both-sides", "sinks",
                                  "float-mask", "bool-mask", "score_mod", "mask_mod", "softcap-alibi-sinks-causal"])
def test_variant_backward_on_the_gpu(name, D):
    from tylopy_kernels.attention.sm90.backward_variant_launch import (BackwardTensors, VariantCall,
                                                                       launch_backward_variant)
    B, H, H_kv, n_q, n_k = 2, 4, 2, 300, 430
    g = torch.Generator().manual_seed(D)
    q, k, v, dout = (torch.randn(B, h, n, D, generator=g).to(torch.bfloat16).cuda()
                     for h, n in ((H, n_q), (H_kv, n_k), (H_kv, n_k), (H, n_q)))
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, **_cases(g, B, H, n_q, n_k)[name])
    scale = 1 / math.sqrt(D)
    out, lse = V.reference_forward(q, k, v, variant, tensors, scale)
    dq, dk, dv = (torch.full_like(t, math.nan) for t in (q, k, v))
    dsinks = torch.zeros(H if variant.sinks else 0, device="cuda")
    launch_backward_variant(BackwardTensors(q, k, v, out, dout, lse.float(), dq, dk, dv), dsinks,
                            VariantCall(variant, tensors, scale))
    got = dict(dq=dq, dk=dk, dv=dv)
    if variant.sinks:
        got["dsinks"] = dsinks
    print(name, D, check({n: t.cpu() for n, t in got.items()}, q.cpu(), k.cpu(), v.cpu(), dout.cpu(), variant,
                         [t.cpu() for t in tensors], scale))


@needs_hopper
@pytest.mark.parametrize("compiled", [False, True])
def test_training_step_through_tylopy_attention_runs_the_kernels(compiled):
    B, H, n, D = 2, 4, 512, 128
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(torch.bfloat16).cuda().requires_grad_() for _ in range(3))
    sinks = torch.randn(H, generator=g).cuda().requires_grad_()

    def f(q, k, v, sinks):
        return ty.attention(q, k, v, is_causal=True, softcap=30.0, sinks=sinks, window_size=(256, 0))

    fn = torch.compile(f, fullgraph=True) if compiled else f
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="tylopy.attention: this variant runs on the torch")  # a fallback
        grads = torch.autograd.grad(fn(q, k, v, sinks).float().square().sum(), (q, k, v, sinks))
    variant, tensors = V.make_variant(B, H, n, n, q.device, is_causal=True, softcap=30.0, sinks=sinks.detach(),
                                      window_size=(256, 0))
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, sinks)]
    ts = list(tensors)
    ts[variant.index("sinks")] = leaves[3]
    o, _ = V.reference_forward(*leaves[:3], variant, ts, 1 / math.sqrt(D))
    want = torch.autograd.grad(o.square().sum(), leaves)
    for name, a, w in zip(("dq", "dk", "dv", "dsinks"), grads, want):
        err = (a.double() - w).abs().max().item()
        assert err <= 2e-2 * w.abs().max().item(), f"{name}: {err}"


@needs_hopper
def test_deterministic_mode_takes_the_reference_backward_and_says_so():
    """Under torch.use_deterministic_algorithms the variant backward (dQ summed with atomics) is
    left for the reference, with one warning naming why; twice the same call, the same bits."""
    from tylopy_kernels.attention import autograd_variants
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=g).to(torch.bfloat16).cuda().requires_grad_() for _ in range(3))
    autograd_variants._warned.clear()
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        grads = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                out = ty.attention(q, k, v, window_size=(64, 0))
                grads.append(torch.autograd.grad(out.float().sum(), (q, k, v)))
    finally:
        torch.use_deterministic_algorithms(before)
    msgs = [str(w.message) for w in caught if "use_deterministic_algorithms" in str(w.message)]
    assert len(msgs) == 1 and "reference path" in msgs[0], msgs
    assert all(torch.equal(a, b) for a, b in zip(*grads))
