"""GPU tier of attention's gradients: ``tylopy.attention`` under autograd, CUDA graphs and
``torch.compile``.

Every gradient check applies FlashAttention's rule (``tylopy_kernels/attention/testing/grad_check.py``): the
error against float64 is at most twice that of torch computing in the input dtype, plus half an
ulp. Inputs live inside larger NaN-filled buffers (memory past every end is NaN). On Hopper
head dims 64 and 128 run Hopper's backward kernels and 16 and 32 the portable ones; the
portable backward is also run directly at every head dim, so both are checked on an H200.
"""
import math

import pytest
import torch

import tylopy
from tylopy_kernels.attention.testing import grad_check as grad_check
from tylopy_kernels.attention.portable.backward_launch import launch_backward_portable

pytestmark = pytest.mark.gpu


def nan_padded(shape, dtype, gen, pad=(0, 1, 3, 0), layout="bhnd"):
    """A leaf tensor of ``shape`` with random values whose storage continues with NaN past every
    end; ``layout="bnhd"`` stores it as (B, N, H, D) and returns the (B, H, N, D) view."""
    order = (0, 2, 1, 3) if layout == "bnhd" else (0, 1, 2, 3)
    stored = [shape[i] for i in order]
    big = torch.full([n + pad[i] for i, n in zip(order, stored)], float("nan"), dtype=dtype, device="cuda")
    view = big[tuple(slice(0, n) for n in stored)]
    view.copy_(torch.randn(stored, generator=gen, device="cuda").to(dtype))
    return view.permute(*order).detach().requires_grad_()


def make_case(B, H, H_kv, n_q, n_k, D, dtype, mask_kind=None, layout="bhnd", seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = nan_padded((B, H, n_q, D), dtype, gen, layout=layout)
    k = nan_padded((B, H_kv, n_k, D), dtype, gen, layout=layout)
    v = nan_padded((B, H_kv, n_k, D), dtype, gen, pad=(1, 0, 5, 0), layout=layout)
    dout = torch.randn(B, H, n_q, D, generator=gen, device="cuda").to(dtype)
    mask = None
    if mask_kind == "random":
        mask = torch.rand(B, H, n_q, n_k, generator=gen, device="cuda") > 0.3
    elif mask_kind == "rows":  # broadcast over batch; every 5th query sees no key
        mask = torch.rand(1, H, n_q, n_k, generator=gen, device="cuda") > 0.5
        mask[:, :, ::5] = False
    elif mask_kind == "keys":  # a padding mask over keys, broadcast over heads and queries
        mask = torch.arange(n_k, device="cuda")[None, None, None, :] < n_k - 7
    return q, k, v, dout, mask


def run_autograd(q, k, v, dout, mask, causal, gqa, return_lse=False, dlse=None):
    for t in (q, k, v):
        t.grad = None
    res = tylopy.attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa, return_lse=return_lse)
    out, lse = res if return_lse else (res, None)
    assert out.grad_fn is not None
    torch.autograd.backward([out] + ([lse] if dlse is not None else []), [dout] + ([dlse] if dlse is not None else []))
    got = dict(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    if lse is not None:
        got["lse"] = lse.detach()
    return got


CASES = [
    # name, B, H, H_kv, n_q, n_k, D, dtype, causal, mask kind, layout
    ("ragged-D64-bf16", 2, 4, 4, 333, 517, 64, torch.bfloat16, False, None, "bhnd"),
    ("ragged-D128-f16", 1, 4, 4, 517, 211, 128, torch.float16, False, None, "bhnd"),
    ("causal-D64-bf16", 2, 3, 3, 1000, 1000, 64, torch.bfloat16, True, None, "bnhd"),
    ("causal-D128-bf16", 1, 4, 4, 777, 777, 128, torch.bfloat16, True, None, "bhnd"),
    ("causal-D32-f16", 1, 2, 2, 300, 300, 32, torch.float16, True, None, "bhnd"),
    ("ragged-D16-bf16", 3, 2, 2, 129, 65, 16, torch.bfloat16, False, None, "bnhd"),
    ("mask-random-D64", 1, 2, 2, 200, 300, 64, torch.bfloat16, False, "random", "bhnd"),
    ("mask-rows-D128", 2, 2, 2, 150, 150, 128, torch.float16, False, "rows", "bhnd"),
    ("mask-keys-D32", 2, 2, 2, 100, 90, 32, torch.bfloat16, False, "keys", "bhnd"),
    ("gqa8to2-D64", 1, 8, 2, 256, 384, 64, torch.bfloat16, False, None, "bhnd"),
    ("gqa8to1-causal-D128", 1, 8, 1, 300, 300, 128, torch.bfloat16, True, None, "bnhd"),
    ("gqa4to2-D16", 2, 4, 2, 70, 70, 16, torch.float16, True, None, "bhnd"),
    ("one-query-D64", 1, 2, 2, 1, 333, 64, torch.bfloat16, False, None, "bhnd"),
    ("one-key-D128", 1, 2, 2, 100, 1, 128, torch.bfloat16, False, None, "bhnd"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_autograd_gradients_pass_the_flash_attention_rule(case):
    _, B, H, H_kv, n_q, n_k, D, dtype, causal, mask_kind, layout = case
    q, k, v, dout, mask = make_case(B, H, H_kv, n_q, n_k, D, dtype, mask_kind, layout)
    got = run_autograd(q, k, v, dout, mask, causal, H_kv != H)
    grad_check.check(got, grad_check.BackwardInputs(q.detach(), k.detach(), v.detach(), dout, mask, causal,
                                                    1 / math.sqrt(D)))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_portable_backward_passes_the_rule_at_every_head_dim(case):
    _, B, H, H_kv, n_q, n_k, D, dtype, causal, mask_kind, layout = case
    q, k, v, dout, mask = make_case(B, H, H_kv, n_q, n_k, D, dtype, mask_kind, layout, seed=1)
    q, k, v = (t.detach() for t in (q, k, v))
    scale = 1 / math.sqrt(D)
    out, lse = tylopy.attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=H_kv != H, return_lse=True)
    grads = [torch.full(t.shape, float("nan"), dtype=dtype, device="cuda") for t in (q, k, v)]
    launch_backward_portable(q, k, v, out, dout, lse, *grads, is_causal=causal, scale=scale, attn_mask=mask)
    got = dict(out=out, dq=grads[0], dk=grads[1], dv=grads[2])
    grad_check.check(got, grad_check.BackwardInputs(q, k, v, dout, mask, causal, scale))


@pytest.mark.parametrize("D", [32, 64, 128])
def test_lse_gradient_is_included(D):
    q, k, v, dout, mask = make_case(1, 2, 2, 130, 170, D, torch.bfloat16, seed=2)
    dlse = torch.randn(1, 2, 130, device="cuda")
    got = run_autograd(q, k, v, dout, mask, False, False, return_lse=True, dlse=dlse)
    grad_check.check(got, grad_check.BackwardInputs(q.detach(), k.detach(), v.detach(), dout, None, False,
                                                    1 / math.sqrt(D), dlse=dlse))


@pytest.mark.parametrize("scale", [-0.2, 0.0])
def test_nonpositive_scale_gradients(scale):
    q, k, v, dout, _ = make_case(1, 2, 2, 64, 80, 64, torch.bfloat16, seed=3)
    for t in (q, k, v):
        t.grad = None
    out = tylopy.attention(q, k, v, scale=scale)
    out.backward(dout)
    got = dict(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    grad_check.check(got, grad_check.BackwardInputs(q.detach(), k.detach(), v.detach(), dout, None, False, scale))


@pytest.mark.parametrize("D", [32, 64, 128])
def test_gradient_of_a_plain_sum_has_zero_strides_and_still_works(D):
    q, k, v, _, _ = make_case(1, 2, 2, 100, 120, D, torch.bfloat16, seed=7)
    out = tylopy.attention(q, k, v)
    out.sum().backward()  # dout is a zero-stride expand of one element
    ones = torch.ones_like(out)
    inputs = grad_check.BackwardInputs(q.detach(), k.detach(), v.detach(), ones, None, False, 1 / math.sqrt(D))
    grad_check.check(dict(dq=q.grad, dk=k.grad, dv=v.grad), inputs)


# -- determinism --------------------------------------------------------------------------------------------------

def _grads(q, k, v, dout, causal, gqa):
    got = run_autograd(q, k, v, dout, None, causal, gqa)
    return [got[n].clone() for n in ("dq", "dk", "dv")]


@pytest.mark.parametrize("D,gqa", [(64, False), (128, True), (32, True)])
def test_dk_dv_are_bitwise_reproducible_and_dq_in_deterministic_mode(D, gqa):
    q, k, v, dout, _ = make_case(2, 8, 2 if gqa else 8, 1024, 1024, D, torch.bfloat16, seed=4)
    first = _grads(q, k, v, dout, True, gqa)
    for _ in range(3):
        again = _grads(q, k, v, dout, True, gqa)
        assert torch.equal(again[1], first[1]) and torch.equal(again[2], first[2])
    torch.use_deterministic_algorithms(True)
    try:
        first = _grads(q, k, v, dout, True, gqa)
        for _ in range(3):
            assert all(torch.equal(a, b) for a, b in zip(_grads(q, k, v, dout, True, gqa), first))
    finally:
        torch.use_deterministic_algorithms(False)


# -- CUDA graphs and torch.compile ------------------------------------------------------------------------------

@pytest.mark.parametrize("D,gqa,causal", [(64, False, True), (128, True, False), (32, False, False)])
def test_forward_and_backward_replay_in_a_cuda_graph(D, gqa, causal):
    q, k, v, dout, _ = make_case(1, 4, 2 if gqa else 4, 300, 300, D, torch.bfloat16, seed=5)
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))

    def step():
        out = tylopy.attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        out.backward(dout)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile, allocate, cache tensor maps
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
    gen = torch.Generator(device="cuda").manual_seed(6)
    with torch.no_grad():
        for t in (q, k, v, dout):
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype))
    graph.replay()
    torch.cuda.synchronize()
    got = dict(out=out.detach().clone(), dq=q.grad.clone(), dk=k.grad.clone(), dv=v.grad.clone())
    grad_check.check(got, grad_check.BackwardInputs(q.detach(), k.detach(), v.detach(), dout, None, causal,
                                                    1 / math.sqrt(D)))


class Block(torch.nn.Module):
    """Pre-norm attention with grouped K/V heads and an MLP, (B, N, C) in and out."""

    def __init__(self, dim, heads, kv_heads, attention):
        super().__init__()
        self.heads, self.kv_heads, self.attention = heads, kv_heads, attention
        self.head_dim = dim // heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(self.norm1(x)).view(B, N, self.heads + 2 * self.kv_heads, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        y = self.attention(q, k, v, is_causal=True, enable_gqa=self.heads != self.kv_heads)
        x = x + self.proj(y.transpose(1, 2).reshape(B, N, C))
        return x + self.mlp(self.norm2(x))


@pytest.mark.parametrize("dim,heads,kv_heads", [(512, 4, 4), (512, 8, 2), (256, 8, 8)])
def test_compiled_training_step_matches_eager(dim, heads, kv_heads):
    torch.manual_seed(0)
    block = Block(dim, heads, kv_heads, tylopy.attention).cuda().to(torch.bfloat16)
    x = torch.randn(2, 512, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(block, fullgraph=True)
    eager_loss = block(x).float().square().mean()
    eager = torch.autograd.grad(eager_loss, [x, block.qkv.weight])
    loss = compiled(x).float().square().mean()
    got = torch.autograd.grad(loss, [x, block.qkv.weight])
    torch.testing.assert_close(loss, eager_loss, rtol=2e-2, atol=1e-3)
    for a, b in zip(got, eager):
        assert torch.isfinite(a).all()
        err = (a.float() - b.float()).abs().max().item()
        assert err <= 0.05 * b.float().abs().max().item() + 1e-3, err


def test_expand_views_of_one_head_are_not_copied():
    """MQA through ``expand`` (stride 0 over heads): no K/V copy of H heads is ever allocated."""
    H, n, D = 32, 4096, 128
    q = torch.randn(1, H, n, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    one_k = torch.randn(1, 1, n, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    one_v = torch.randn(1, 1, n, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    copy_bytes = H * n * D * 2
    with torch.no_grad():
        tylopy.attention(q, one_k.expand(1, H, n, D), one_v.expand(1, H, n, D))  # warm up
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = tylopy.attention(q, one_k.expand(1, H, n, D), one_v.expand(1, H, n, D))
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < out.numel() * 2 + copy_bytes // 2, (extra, copy_bytes)
    out = tylopy.attention(q, one_k.expand(1, H, n, D), one_v.expand(1, H, n, D))
    out.float().sum().backward()
    assert one_k.grad.shape == (1, 1, n, D) and torch.isfinite(one_k.grad).all()
