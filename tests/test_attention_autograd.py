"""CPU tier of attention's PyTorch integration (tylopy_kernels/attention/autograd.py).

* the autograd formula by ``torch.autograd.gradcheck`` in float64 through the operators (their
  CPU implementation is the float64 reference): ragged, causal, masks with empty rows, grouped
  heads, a gradient of the returned LSE, negative scale;
* the reference formulas against torch autograd through SDPA, independently;
* ``torch.library.opcheck`` on the four operators (schema, fake tensors, autograd registration);
* ``torch.compile(fullgraph=True)`` of a transformer block calling ``tylopy.attention`` on meta
  tensors: one graph, no break, the backward graph calls ``tylopy::attention_bwd`` (without an
  LSE gradient unless the LSE is returned); compiled float64 gradients equal eager ones.
"""
import pytest
import torch

import tylopy
from tylopy_kernels.attention import autograd as A

F64 = dict(dtype=torch.float64)


def _inputs(B=1, H=2, H_kv=2, n_q=4, n_k=5, D=8, seed=0, grad=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n_q, D, generator=gen, **F64)
    k = torch.randn(B, H_kv, n_k, D, generator=gen, **F64)
    v = torch.randn(B, H_kv, n_k, D, generator=gen, **F64)
    return [t.requires_grad_(grad) for t in (q, k, v)]


GRADCHECK = [
    ("ragged", dict(n_q=3, n_k=7), None, False, 0.4),
    ("causal", dict(n_q=5, n_k=5), None, True, 0.35),
    ("mask-empty-rows", dict(n_q=4, n_k=6), "rows", False, 0.5),
    ("gqa", dict(H=4, H_kv=2, n_q=3, n_k=4), None, False, 0.3),
    ("mqa-causal", dict(H=3, H_kv=1, n_q=4, n_k=4), None, True, 0.3),
    ("negative-scale", dict(n_q=2, n_k=3), None, False, -0.6),
]


def _mask(kind, n_q, n_k):
    if kind is None:
        return None
    m = torch.rand(n_q, n_k, generator=torch.Generator().manual_seed(9)) > 0.3
    m[1] = False  # a query row with no key
    return m


@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "out+lse"])
@pytest.mark.parametrize("name,shape,mask_kind,causal,scale", GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_gradcheck_through_the_operator(name, shape, mask_kind, causal, scale, with_lse):
    q, k, v = _inputs(**shape)
    mask = _mask(mask_kind, q.shape[2], k.shape[2])

    def fn(q, k, v):
        res = A.attention_op(q, k, v, mask, causal, scale, return_lse=with_lse)
        if not with_lse:
            return res
        out, lse = res
        return out, lse.masked_fill(torch.isinf(lse), 0.0)  # an empty row's -inf has no gradient

    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("gqa,causal", [(1, False), (2, True), (4, False)])
def test_reference_formulas_match_torch_autograd(gqa, causal):
    q, k, v = _inputs(B=2, H=4, H_kv=4 // gqa, n_q=6, n_k=6, D=16, seed=gqa)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), **F64)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3, enable_gqa=gqa > 1)
    want.backward(dout)
    with torch.no_grad():
        out, lse = A.reference_forward(q, k, v, None, causal, 0.3)
        grads = A.reference_backward(A.ForwardTensors(q, k, v, out, lse), dout, None, causal, 0.3)
    torch.testing.assert_close(out, want)
    for mine, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(mine, t.grad)


def test_lse_gradient_alone_and_empty_key_sets():
    q, k, v = _inputs(n_q=3, n_k=4)
    _, lse = A.attention_op(q, k, v, None, False, 0.5, return_lse=True)
    lse.sum().backward()  # only the LSE: dout is missing and taken as zeros
    s = q.detach() @ k.detach().transpose(-1, -2) * 0.5
    p = torch.softmax(s, -1)
    torch.testing.assert_close(q.grad, 0.5 * p @ k.detach())  # d lse / d q = scale sum_j P_j k_j
    assert torch.equal(v.grad, torch.zeros_like(v))
    q, k, v = _inputs(n_k=0)
    out, lse = A.attention_op(q, k, v, None, False, 0.5, return_lse=True)
    assert (out == 0).all() and (lse == float("-inf")).all()
    out.sum().backward()
    assert (q.grad == 0).all()


def test_lse_is_not_differentiable_unless_returned():
    q, k, v = _inputs()
    out, lse = A.attention_fwd(q, k, v, None, False, 0.5, False)
    assert out.requires_grad and not lse.requires_grad
    out, lse = A.attention_fwd(q, k, v, None, False, 0.5, True)
    assert lse.requires_grad


def test_an_unused_lse_sends_no_gradient_to_the_backward(monkeypatch):
    """So the backward can take the kernels that have no LSE gradient (Hopper's)."""
    seen = []
    real = A.eager_bwd  # what the backward formula calls (the operator in a trace, else its body)

    def spy(*args):
        seen.append(args[7])
        return real(*args)

    monkeypatch.setattr(A, "eager_bwd", spy)
    q, k, v = _inputs()
    out, lse = A.attention_op(q, k, v, None, False, 0.5, return_lse=True)
    out.sum().backward()
    out, lse = A.attention_op(q, k, v, None, False, 0.5, return_lse=True)
    (out.sum() + lse.sum()).backward()
    assert seen[0] is None and seen[1] is not None


def test_opcheck_of_every_operator():
    q, k, v = _inputs(H=4, H_kv=2, n_q=3, n_k=5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    out, lse = A.reference_forward(q.detach(), k.detach(), v.detach(), mask, False, 0.5)
    dout = torch.randn_like(out)
    torch.library.opcheck(A.attention_fwd, (q, k, v, mask, False, 0.5, True))
    q, k, v = (t.detach() for t in (q, k, v))  # the backward has no gradient of its own (no double backward)
    torch.library.opcheck(A.attention_bwd, (dout, q, k, v, out, lse, mask, None, False, 0.5))
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 5], dtype=torch.int32)
    pq, pk, pv = (t[0].transpose(0, 1).contiguous().detach().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(A.attention_varlen_fwd, (pq, pk, pv, cu, cu_k, 2, 3, True, 0.5, False))
    out, lse = A.reference_varlen_forward(pq.detach(), pk.detach(), pv.detach(), cu, cu_k, True, 0.5)
    pq, pk, pv = (t.detach() for t in (pq, pk, pv))
    torch.library.opcheck(A.attention_varlen_bwd, (torch.randn_like(out), pq, pk, pv, out, lse, cu, cu_k, 2, 3, None,
                                                   True, 0.5))


# -- torch.compile ------------------------------------------------------------------------------------------------

class Block(torch.nn.Module):
    """A pre-norm attention block with grouped K/V heads, (B, N, C) in and out."""

    def __init__(self, dim=128, heads=4, kv_heads=2, dtype=torch.bfloat16, return_lse=False):
        super().__init__()
        self.heads, self.kv_heads, self.return_lse = heads, kv_heads, return_lse
        self.head_dim = dim // heads
        self.norm = torch.nn.LayerNorm(dim, dtype=dtype)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, dtype=dtype)
        self.proj = torch.nn.Linear(dim, dim, dtype=dtype)

    def forward(self, x, mask=None):
        B, N, C = x.shape
        qkv = self.qkv(self.norm(x)).view(B, N, self.heads + 2 * self.kv_heads, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        res = tylopy.attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True,
                               return_lse=self.return_lse)
        y = res[0] + res[1].unsqueeze(-1).to(res[0].dtype) if self.return_lse else res
        return x + self.proj(y.transpose(1, 2).reshape(B, N, C))


def _meta_block(**kw):
    return Block(**kw).to("meta")


@pytest.mark.parametrize("with_mask", [False, True], ids=["causal", "mask"])
def test_dynamo_traces_one_graph_without_breaks(with_mask):
    block = _meta_block()
    x = torch.randn(2, 64, 128, dtype=torch.bfloat16, device="meta", requires_grad=True)
    mask = torch.ones(64, 64, dtype=torch.bool, device="meta") if with_mask else None
    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(x, mask)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def _compiled_graphs(fn, *args):
    """Compile ``fn`` with fullgraph=True through AOT autograd and run forward and backward; returns
    the tylopy calls of the forward and backward graphs."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    seen = {}

    def record(kind):
        def compiler(gm, _):
            seen[kind] = [n for n in gm.graph.nodes if n.op == "call_function" and "tylopy" in str(n.target)]
            return make_boxed_func(gm.forward)
        return compiler

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=record("fw"), bw_compiler=record("bw"))

    torch._dynamo.reset()
    loss = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    loss.backward()
    return seen


@pytest.mark.parametrize("return_lse", [False, True])
def test_compiled_block_calls_the_backward_operator(return_lse):
    block = _meta_block(return_lse=return_lse)
    x = torch.randn(2, 64, 128, dtype=torch.bfloat16, device="meta", requires_grad=True)
    seen = _compiled_graphs(lambda x: block(x).float().sum(), x)
    assert [str(n.target) for n in seen["fw"]] == ["tylopy.attention_fwd.default"]
    assert [str(n.target) for n in seen["bw"]] == ["tylopy.attention_bwd.default"]
    dlse = seen["bw"][0].args[7]
    assert (dlse is None) == (not return_lse)  # no LSE gradient reaches the backward unless LSE is used
    assert x.grad.shape == x.shape and block.qkv.weight.grad.shape == block.qkv.weight.shape


def test_compiled_float64_gradients_equal_eager_ones():
    q, k, v = _inputs(H=4, H_kv=2, n_q=6, n_k=6, D=8)
    mask = _mask("rows", 6, 6)

    def loss(q, k, v):
        out, lse = A.attention_op(q, k, v, mask, False, 0.4, return_lse=True)
        return (out * out).sum() + lse.masked_fill(torch.isinf(lse), 0).sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    torch._dynamo.reset()
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
