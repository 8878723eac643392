"""``attention_varlen`` with variant keywords on an H100/H200: the packed route through the Hopper
variant kernels (forward and backward) against each document alone in float64, at real sizes
(ragged documents with empty and length-1 ones, GQA, D = 64 and 128); torch.compile(fullgraph=True)
and a torch.export round trip of the operator; CUDA-graph capture with new prefix sums at replay;
``score_mod_bwd`` used by the dense backward kernel and, on packed documents, by the variant backward
kernel (a generated document-relative wrapper; the user's derivative reads a captured tensor).

    python -m pytest -q -m gpu tests/test_attention_varlen_variants_gpu.py
"""
import io
import math
import warnings

import pytest
import torch

import tylopy as ty
from attention_varlen_variant_cases import doc_bias, doc_bias_bwd, gain_mods, per_document, prefix, stripes
from conftest import requires_sm90

pytestmark = [pytest.mark.gpu, requires_sm90]
DEV = "cuda"
# 12 documents: empty, length 1, a few across 128-row tiles, more queries than keys and the reverse
LENS_Q = (700, 0, 1, 1030, 129, 64, 300, 1, 511, 900, 17, 256)
LENS_K = (700, 3, 1, 1030, 200, 64, 250, 0, 511, 1200, 17, 256)


def packed(total, heads, dim, seed, dtype=torch.bfloat16, pad=64):
    g = torch.Generator(device=DEV).manual_seed(seed)
    buf = torch.full((total + pad, heads, dim), float("nan"), dtype=dtype, device=DEV)
    buf[:total] = torch.randn(total, heads, dim, generator=g, device=DEV).to(dtype)
    return buf[:total]


def problem(D, H=8, H_kv=2, seed=0):
    cu_q, cu_k = prefix(LENS_Q), prefix(LENS_K)
    q, k, v = (packed(cu_q[-1], H, D, seed), packed(cu_k[-1], H_kv, D, seed + 1), packed(cu_k[-1], H_kv, D, seed + 2))
    return q, k, v, cu_q, cu_k


def keywords(name, H):
    g = torch.Generator(device=DEV).manual_seed(7)
    return {
        "window-softcap": dict(window_size=(256, 0), softcap=30.0),
        "mods-alibi-sinks": dict(score_mod=doc_bias, mask_mod=stripes, sinks=torch.randn(H, device=DEV, generator=g),
                                 alibi_slopes=torch.rand(len(LENS_Q), H, device=DEV, generator=g) * 0.05),
        "window-both-sides": dict(window_size=(100, 60)),
    }[name]


def call(q, k, v, cu_q, cu_k, causal, kw, return_lse=True):
    cq, ck = (torch.tensor(c, dtype=torch.int32, device=DEV) for c in (cu_q, cu_k))
    return ty.attention_varlen(q, k, v, cq, ck, max(LENS_Q), max(LENS_K), is_causal=causal, enable_gqa=True,
                               return_lse=return_lse, **kw)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["window-softcap", "mods-alibi-sinks", "window-both-sides"])
def test_packed_variants_forward_and_backward_match_float64(name, causal, D):
    q, k, v, cu_q, cu_k = problem(D, seed=D + causal)
    kw = keywords(name, q.shape[1])
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*reference path.*")  # the kernels, not the torch path
        out, lse = call(*leaves, cu_q, cu_k, causal, kw)
        dout = packed(q.shape[0], q.shape[1], D, seed=99)
        grads = torch.autograd.grad(out, leaves, dout)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want, want_lse = per_document(*exact, cu_q, cu_k, 1 / math.sqrt(D), kw, causal)
    assert not torch.isnan(out).any()
    assert (out.double() - want).abs().max().item() <= 2e-2 * v.double().abs().max().item()
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = ~torch.isinf(want_lse)
    assert (lse.double()[finite] - want_lse[finite]).abs().max().item() <= 2e-4 * max(1.0, want_lse[finite].abs().max())
    ref = torch.autograd.grad(want, exact, dout.double())
    for arg, mine, r in zip(("dq", "dk", "dv"), grads, ref):
        assert torch.isfinite(mine).all(), arg
        assert (mine.double() - r).abs().max().item() <= 2e-2 * r.abs().max().item(), arg


def test_compile_fullgraph_and_export_round_trip():
    q, k, v, cu_q, cu_k = problem(128, seed=3)
    kw = dict(window_size=(128, 0), softcap=20.0, score_mod=doc_bias)
    cq, ck = (torch.tensor(c, dtype=torch.int32, device=DEV) for c in (cu_q, cu_k))

    class Model(torch.nn.Module):
        def forward(self, q, k, v, cq, ck):
            return ty.attention_varlen(q, k, v, cq, ck, max(LENS_Q), max(LENS_K), is_causal=True, enable_gqa=True, **kw)
    eager = Model()(q, k, v, cq, ck)
    compiled = torch.compile(Model(), fullgraph=True)(q, k, v, cq, ck)
    assert (compiled.float() - eager.float()).abs().max().item() <= 1e-2
    program = torch.export.export(Model(), (q, k, v, cq, ck))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    buf.seek(0)
    again = torch.export.load(buf).module()(q, k, v, cq, ck)
    assert torch.equal(again, eager)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = torch.compile(Model(), fullgraph=True)(*leaves, cq, ck)
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    leaves2 = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(Model()(*leaves2, cq, ck), leaves2, torch.ones_like(out))
    for a, b in zip(grads, ref):
        assert (a.float() - b.float()).abs().max().item() <= 1e-2 * b.float().abs().max().item()


def test_cuda_graph_replays_with_new_prefix_sums():
    """Captured once, replayed after the prefix sums change in place: the document table and block
    mask are rebuilt by the graph's own kernels (no host sync, no stale cache)."""
    q, k, v, cu_q, cu_k = problem(64, seed=5)
    kw = dict(window_size=(64, 0), softcap=15.0)
    cq, ck = (torch.tensor(c, dtype=torch.int32, device=DEV) for c in (cu_q, cu_k))
    run = (lambda: ty.attention_varlen(q, k, v, cq, ck, max(LENS_Q), max(LENS_K) + 400, is_causal=True,
                                       enable_gqa=True, **kw))
    run()  # compile and plan outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    other_q, other_k = prefix(LENS_Q[::-1]), prefix(LENS_K[::-1])
    cq.copy_(torch.tensor(other_q, dtype=torch.int32))
    ck.copy_(torch.tensor(other_k, dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    want, _ = per_document(q.double(), k.double(), v.double(), other_q, other_k, 1 / 8, kw, True)
    assert (out.double() - want).abs().max().item() <= 2e-2 * v.double().abs().max().item()


def test_score_mod_bwd_runs_in_the_dense_backward_kernel():
    """The user's derivative reaches the kernel: the true one gives float64 gradients, a flat one
    (zero) leaves dq = dk = 0."""
    g = torch.Generator(device=DEV).manual_seed(11)
    q, k, v = (torch.randn(2, 4, 500, 128, generator=g, device=DEV).bfloat16() for _ in range(3))
    dout = torch.randn(2, 4, 500, 128, generator=g, device=DEV).bfloat16()
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(ty.attention(*exact, score_mod=doc_bias), exact, dout.double())
    for bwd in (doc_bias_bwd, lambda s, grad, b, h, i, j: grad * 0.0):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*reference path.*")
            grads = torch.autograd.grad(ty.attention(*leaves, score_mod=doc_bias, score_mod_bwd=bwd), leaves, dout)
        if bwd is doc_bias_bwd:
            for a, r in zip(grads, ref):
                assert (a.double() - r).abs().max().item() <= 2e-2 * r.abs().max().item()
        else:
            assert grads[0].abs().max().item() == 0 and grads[1].abs().max().item() == 0


@pytest.mark.parametrize("D", [64, 128])
def test_packed_score_mod_bwd_runs_in_the_backward_kernel(D):
    """score_mod + score_mod_bwd on packed documents (ragged, empty and length-1 ones, GQA): forward and
    backward on the Hopper kernels with no warning (the user's derivative, which reads a per-head
    gain captured on the GPU, at document-relative indices), against float64 autograd of the mod per
    document; a flat (zero) derivative gives dq = dk = 0, so the kernel uses the given one."""
    q, k, v, cu_q, cu_k = problem(D, seed=9)
    mod, bwd = gain_mods(DEV, q.shape[1])
    dout = packed(q.shape[0], q.shape[1], D, seed=98)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want, _ = per_document(*exact, cu_q, cu_k, 1 / math.sqrt(D), dict(score_mod=mod), True)
    ref = torch.autograd.grad(want, exact, dout.double())
    for derivative in (bwd, lambda s, grad, b, h, i, j: grad * 0.0):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        from tylopy_kernels.attention import autograd_variants
        autograd_variants._warned.clear()    # (its warnings come once per reason and process)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="tylopy")   # no fallback to the torch path: the kernels run
            out = call(*leaves, cu_q, cu_k, True, dict(score_mod=mod, score_mod_bwd=derivative), return_lse=False)
            grads = torch.autograd.grad(out, leaves, dout)
        assert all(torch.isfinite(t).all() for t in grads)
        if derivative is bwd:
            for arg, mine, r in zip(("dq", "dk", "dv"), grads, ref):
                assert (mine.double() - r).abs().max().item() <= 2e-2 * r.abs().max().item(), arg
        else:
            assert grads[0].abs().max().item() == 0 and grads[1].abs().max().item() == 0
            assert (grads[2].double() - ref[2]).abs().max().item() <= 2e-2 * ref[2].abs().max().item()
