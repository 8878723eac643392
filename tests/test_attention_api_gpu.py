"""GPU tier of ``tylopy.attention``'s interface: the portable forward at D = 128, grouped and
multi-query K/V on both kernels, the direct launch without the operator when nothing needs
gradients, and the host time of both ways (printed)."""
import math
import time

import pytest
import torch

import tylopy
from tylopy_kernels.attention import autograd as A
from tylopy_kernels.attention.testing import grad_check as grad_check

pytestmark = pytest.mark.gpu


def _inputs(B, H, H_kv, n_q, n_k, D, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shapes = ((B, H, n_q, D), (B, H_kv, n_k, D), (B, H_kv, n_k, D))
    return [torch.randn(s, generator=gen, device="cuda").to(dtype) for s in shapes]


def _check_forward(out, lse, q, k, v, mask=None, causal=False):
    got = dict(out=out) if lse is None else dict(out=out, lse=lse)
    return grad_check.check(got, grad_check.BackwardInputs(q, k, v, torch.zeros_like(q), mask, causal,
                                                           1 / math.sqrt(q.shape[-1])))


@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_portable_forward_at_head_dim_128(block_n, causal):
    from tylopy_kernels.attention.portable.launch import streaming_attention
    q, k, v = _inputs(2, 3, 3, 1000, 1000, 128, seed=block_n)
    out, lse = streaming_attention(q, k, v, is_causal=causal, return_lse=True, block_n=block_n)
    _check_forward(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("H,H_kv,D", [(8, 2, 64), (8, 1, 128), (4, 2, 32), (6, 3, 16)])
def test_grouped_query_forward_on_the_default_path_and_the_portable_kernel(H, H_kv, D):
    from tylopy_kernels.attention.portable.launch import streaming_attention
    q, k, v = _inputs(2, H, H_kv, 333, 517, D, seed=H_kv)
    out, lse = tylopy.attention(q, k, v, enable_gqa=True, return_lse=True)
    _check_forward(out, lse, q, k, v)
    out2, lse2 = streaming_attention(q, k, v, enable_gqa=True, return_lse=True)
    _check_forward(out2, lse2, q, k, v)
    # repeated heads (an expand view for one head) without enable_gqa: the same function
    ke, ve = ((t.expand(2, H, 517, D) if H_kv == 1 else t.repeat_interleave(H // H_kv, 1)) for t in (k, v))
    _check_forward(tylopy.attention(q, ke, ve), None, q, k, v)


def test_no_grad_calls_launch_directly(monkeypatch):
    q, k, v = _inputs(1, 2, 2, 128, 128, 64)

    def refuse(*args, **kwargs):
        raise AssertionError("the operator was used for a call that needs no gradient")

    monkeypatch.setattr(A, "attention_op", refuse)
    out = tylopy.attention(q, k, v)
    assert out.grad_fn is None
    q.requires_grad_(True)
    with pytest.raises(AssertionError, match="operator was used"):
        tylopy.attention(q, k, v)


def test_host_time_per_call_is_reported(capsys):
    q, k, v = _inputs(1, 2, 2, 128, 128, 64)
    qg = q.clone().requires_grad_(True)
    times = {}
    for name, fn in (("direct", lambda: tylopy.attention(q, k, v)), ("operator", lambda: tylopy.attention(qg, k, v)),
                     ("sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        times[name] = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
    with capsys.disabled():
        print("\n[host time per call, us] " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    assert times["direct"] < times["operator"] * 1.5
