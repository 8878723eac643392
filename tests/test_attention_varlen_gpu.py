"""GPU tier of ``tylopy.attention_varlen``: forward and gradients through autograd over packed
batches with empty and length-1 sequences, NaN past the last sequence, causal and grouped heads
(FlashAttention's rule against a float64 per-sequence reference), the batched kernels' results
on equal lengths, CUDA graphs and ``torch.compile``."""
import math

import pytest
import torch

import tylopy
from tylopy_kernels.attention.testing import grad_check as grad_check

pytestmark = pytest.mark.gpu


def cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


def packed(lengths, heads, D, dtype, gen, pad=7):
    total = sum(lengths)
    t = torch.full((total + pad, heads, D), float("nan"), dtype=dtype, device="cuda")
    t[:total] = torch.randn(total, heads, D, generator=gen, device="cuda").to(dtype)
    return t.requires_grad_()


CASES = [
    # name, query lengths, key lengths, H, H_kv, D, dtype, causal
    ("mixed-D64", (0, 1, 300, 1000, 17), (3, 1, 0, 1000, 640), 4, 4, 64, torch.bfloat16, False),
    ("causal-D128", (128, 1, 511, 0, 1000), (128, 1, 700, 5, 1000), 4, 4, 128, torch.bfloat16, True),
    ("gqa-D32-f16", (65, 1, 129), (65, 2, 33), 8, 2, 32, torch.float16, True),
    ("mqa-D16", (40, 0, 1), (1, 9, 40), 4, 1, 16, torch.bfloat16, False),
    ("long-D128-gqa", (4096, 1), (4096, 4096), 8, 2, 128, torch.bfloat16, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_varlen_forward_and_gradients_pass_the_rule(case):
    _, lq, lk, H, H_kv, D, dtype, causal = case
    gen = torch.Generator(device="cuda").manual_seed(len(lq) * D)
    q, k, v = packed(lq, H, D, dtype, gen), packed(lk, H_kv, D, dtype, gen), packed(lk, H_kv, D, dtype, gen)
    dout = torch.randn(q.shape, generator=gen, device="cuda").to(dtype)
    cu_q, cu_k = cu(lq), cu(lk)
    out, lse = tylopy.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), is_causal=causal,
                                       enable_gqa=H != H_kv, return_lse=True)
    out.backward(dout)
    got = dict(out=out.detach(), lse=lse.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    grad_check.check(got, grad_check.BackwardInputs(q.detach(), k.detach(), v.detach(), dout, None, causal,
                                                    1 / math.sqrt(D), varlen=(cu_q, cu_k)))
    n_q, n_k = sum(lq), sum(lk)
    assert (out[n_q:] == 0).all() and (q.grad[n_q:] == 0).all() and (k.grad[n_k:] == 0).all()


def test_equal_lengths_give_the_batched_portable_results():
    """D = 32: the portable kernel on every GPU (on Hopper D = 64 and 128 take the sm90 kernels)."""
    from tylopy_kernels.attention.portable.launch import streaming_attention
    gen = torch.Generator(device="cuda").manual_seed(1)
    B, n, H, D = 3, 333, 4, 32
    q, k, v = (torch.randn(B, n, H, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    lengths = cu([n] * B)
    out = tylopy.attention_varlen(*(t.reshape(B * n, H, D) for t in (q, k, v)), lengths, lengths, n, n,
                                  is_causal=True)
    want = streaming_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    assert torch.equal(out.view(B, n, H, D), want.transpose(1, 2))


def test_varlen_training_step_replays_in_a_cuda_graph():
    gen = torch.Generator(device="cuda").manual_seed(2)
    lq = (100, 1, 0, 257)
    q, k, v = (packed(lq, 4, 64, torch.bfloat16, gen, pad=0).detach().requires_grad_() for _ in range(3))
    dout = torch.randn(q.shape, generator=gen, device="cuda").to(torch.bfloat16)
    c = cu(lq)

    def step():
        out = tylopy.attention_varlen(q, k, v, c, c, 257, 257, is_causal=True)
        out.backward(dout)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for t in (q, k, v):
                t.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    with torch.no_grad():
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype))
    graph.replay()
    torch.cuda.synchronize()
    got = dict(out=out.detach().clone(), dq=q.grad.clone(), dk=k.grad.clone(), dv=v.grad.clone())
    grad_check.check(got, grad_check.BackwardInputs(q.detach(), k.detach(), v.detach(), dout, None, True, 1 / 8,
                                                    varlen=(c, c)))


def test_compiled_varlen_has_no_graph_break_and_matches_eager():
    gen = torch.Generator(device="cuda").manual_seed(3)
    lq = (64, 1, 200)
    q, k, v = (packed(lq, 4, 32, torch.bfloat16, gen, pad=0).detach().requires_grad_() for _ in range(3))
    c = cu(lq)

    def loss(q, k, v):
        return tylopy.attention_varlen(q, k, v, c, c, 200, 200, is_causal=True).float().square().sum()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(loss)(q, k, v)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(got, eager):  # the same kernels; only the loss's own ops may round differently
        assert (a.float() - b.float()).abs().max().item() <= 1e-2 * b.float().abs().max().item()
