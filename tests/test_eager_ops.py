"""Eager calls skip torch's operator dispatch (``tylopy_kernels.eager.EagerOp``): the same values
and gradients as through the operators, the operators wherever something watches the dispatcher."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tylopy as ty
from tylopy_kernels.attention import autograd as A
from tylopy_kernels.attention import autograd_variants as AV
from tylopy_kernels.attention import variants as V
from tylopy_kernels.eager import eager_ok

F64 = dict(dtype=torch.float64)


def _qkv(B=2, H=3, n=7, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, **F64).requires_grad_() for _ in range(3)]


def _grads(out, leaves, seed=1):
    g = torch.Generator().manual_seed(seed)
    dout = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad(out, leaves, dout, retain_graph=True)


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_variant_with_sinks_gives_the_operators_values_and_gradients_sinks_included():
    q, k, v = _qkv()
    sinks = torch.randn(3).requires_grad_()
    kw = dict(is_causal=True, window_size=(3, 0), sinks=sinks)
    out = ty.attention(q, k, v, **kw)  # eager: the operator's body and formula, no dispatch
    eager = _grads(out, (q, k, v, sinks))
    vid, tensors = V.make_variant_id(2, 3, 7, 7, q.device, V.VariantKeywords(**kw))
    ref_out, _ = AV.attention_variant_fwd(q, k, v, list(tensors), vid, 16 ** -0.5, False)  # the operator
    ref = _grads(ref_out, (q, k, v, sinks))
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    for got, want in zip(eager, ref):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert eager[3].abs().sum() > 0


def test_the_eager_backward_runs_again_with_retain_graph_and_matches_gradcheck():
    q, k, v = _qkv(B=1, H=2, n=5, D=4)
    first = _grads(A.attention_op(q, k, v, None, True, 0.5), (q, k, v))
    out = A.attention_op(q, k, v, None, True, 0.5)
    twice = [_grads(out, (q, k, v)) for _ in range(2)]
    for a, b, c in zip(first, *twice):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(b, c, rtol=0, atol=0)
    assert torch.autograd.gradcheck(lambda *t: A.attention_op(*t, None, True, 0.5), (q, k, v))


def test_a_dispatch_mode_sees_the_operators():
    q, k, v = _qkv(B=1, H=1, n=4, D=16)
    with _Seen() as seen:
        out = A.attention_op(q, k, v, None, False, 0.5)
        _grads(out, (q, k, v))
    assert any("tylopy.attention_fwd" in op for op in seen.ops)
    assert any("tylopy.attention_bwd" in op for op in seen.ops)
    with _Seen() as seen:
        ty.attention(q, k, v, window_size=(1, 1))
    assert any("tylopy.attention_variant_fwd" in op for op in seen.ops)


def test_only_plain_tensors_outside_traces_skip_the_operators():
    q = torch.randn(2, 2)
    assert eager_ok((q, [q, q], "id", 1.0))
    assert not eager_ok((q.to("meta"),))
    assert not eager_ok((q, [q.to("meta")]))
    with _Seen():
        assert not eager_ok((q,))
    assert eager_ok((torch.nn.Parameter(q),))
