"""CPU tier of ``tylopy.attention``'s interface (tylopy_kernels/attention/__init__.py).

* SDPA's signature and keyword arguments: ``dropout_p`` (non-zero: NotImplementedError naming
  it), ``enable_gqa`` (fewer K/V heads only with it, a divisor of the query heads), head dims
  16, 32, 64 and 128;
* meta tensors go through the operator's fake implementation: shapes, dtypes, a ``grad_fn``
  and gradients of the right shapes, grouped heads included;
* when the operator is used (autograd, ``torch.compile``, meta) and when the kernel is launched
  directly;
* the portable plans read zero-stride ``expand`` views and grouped K/V heads in place (no copy:
  the launch gets the caller's storage and a zero head stride, or the group size).
"""
import math

import pytest
import torch

import tylopy
from tylopy_kernels import attention as api
from tylopy_kernels.attention.portable.backward_launch import BackwardOptions, BackwardTensors, plan_backward_portable
from tylopy_kernels.attention.portable.launch import ForwardOptions, ForwardTensors, plan_forward


def _qkv(B=1, H=4, H_kv=4, n_q=8, n_k=8, D=64, device="cpu", grad=False):
    q = torch.zeros(B, H, n_q, D, dtype=torch.bfloat16, device=device, requires_grad=grad)
    k = torch.zeros(B, H_kv, n_k, D, dtype=torch.bfloat16, device=device, requires_grad=grad)
    v = torch.zeros(B, H_kv, n_k, D, dtype=torch.bfloat16, device=device, requires_grad=grad)
    return q, k, v


def test_signature_is_sdpas_plus_return_lse():
    """SDPA's parameters and return_lse by position; the variant keywords (docs/attention-variants.md)
    and FP8's descales (docs/fp8.md) only by keyword."""
    import inspect
    params = list(inspect.signature(tylopy.attention).parameters.values())
    positional = [p for p in params if p.kind != p.KEYWORD_ONLY]
    assert [p.name for p in positional] == ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                                            "enable_gqa", "return_lse"]
    assert [p.default for p in positional[3:]] == [None, 0.0, False, None, False, False]
    assert [p.name for p in params if p.kind == p.KEYWORD_ONLY] == [
        "window_size", "softcap", "alibi_slopes", "sinks", "score_mod", "mask_mod", "block_mask", "aux",
        "causal_align", "score_mod_bwd", "q_descale", "k_descale", "v_descale"]
    varlen = inspect.signature(tylopy.attention_varlen).parameters.values()
    assert [p.name for p in varlen if p.kind == p.KEYWORD_ONLY] == [
        "window_size", "softcap", "alibi_slopes", "sinks", "score_mod", "mask_mod", "aux", "score_mod_bwd",
        "causal_align"]


@pytest.mark.parametrize("p", [0.1, 1.0, 1e-9])
def test_nonzero_dropout_is_not_implemented(p):
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match=r"dropout_p expects 0\.0.*but got"):
        tylopy.attention(q, k, v, dropout_p=p)


def test_zero_dropout_is_accepted_and_bad_types_rejected():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="CUDA"):  # passes every check, then needs a GPU
        tylopy.attention(q, k, v, None, 0.0, True)
    with pytest.raises(TypeError, match="dropout_p expects a float"):
        tylopy.attention(q, k, v, dropout_p="0")


def test_fewer_kv_heads_need_enable_gqa():
    q, k, v = _qkv(H=8, H_kv=2)
    with pytest.raises(ValueError, match=r"key/value heads expects 8 \(or enable_gqa=True for fewer\)"):
        tylopy.attention(q, k, v)
    with pytest.raises(ValueError, match="CUDA"):
        tylopy.attention(q, k, v, enable_gqa=True)
    q, k, v = _qkv(H=8, H_kv=3)
    with pytest.raises(ValueError, match="divides the 8 query heads"):
        tylopy.attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("D,ok", [(16, True), (32, True), (64, True), (128, True), (8, False), (96, False),
                                  (256, False)])
def test_head_dims(D, ok):
    q, k, v = _qkv(D=D)
    if ok:
        assert api.check_inputs(q, k, v, None, False, None)[4] == D
    else:
        with pytest.raises(ValueError, match="head_dim"):
            api.check_inputs(q, k, v, None, False, None)


def test_cpu_tensors_are_rejected_even_when_they_require_grad():
    q, k, v = _qkv(grad=True)
    with pytest.raises(ValueError, match=r"query expects a CUDA tensor"):
        tylopy.attention(q, k, v)


# -- meta tensors: the operator's fake implementation --------------------------------------------------------

def test_meta_forward_shapes_and_lse():
    q, k, v = _qkv(B=2, H=8, H_kv=2, n_q=5, n_k=9, D=128, device="meta")
    out, lse = tylopy.attention(q, k, v, enable_gqa=True, return_lse=True)
    assert out.shape == (2, 8, 5, 128) and out.dtype == torch.bfloat16 and out.device.type == "meta"
    assert lse.shape == (2, 8, 5) and lse.dtype == torch.float32
    assert out.grad_fn is None  # nothing requires grad


def test_meta_backward_gives_gradients_of_the_inputs_shapes():
    q, k, v = _qkv(B=2, H=8, H_kv=2, n_q=5, n_k=9, device="meta", grad=True)
    mask = torch.ones(5, 9, dtype=torch.bool, device="meta")
    out = tylopy.attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert out.grad_fn is not None
    out.float().sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_expand_views_pass_the_checks_and_keep_their_shape_in_gradients():
    q, k, v = _qkv(H=8, H_kv=1, device="meta", grad=True)
    ke, ve = k.expand(1, 8, 8, 64), v.expand(1, 8, 8, 64)
    out = tylopy.attention(q, ke, ve)  # as many heads as query: no enable_gqa needed
    out.float().sum().backward()
    assert k.grad.shape == (1, 1, 8, 64)  # the expand's backward sums the heads


# -- when the operator is used -------------------------------------------------------------------------------

def test_operator_only_for_autograd_meta_or_compile():
    q, k, v = _qkv()
    assert not api._through_op(q, k, v)
    k.requires_grad_(True)
    assert api._through_op(q, k, v)
    with torch.no_grad():
        assert not api._through_op(q, k, v)
    with torch.inference_mode():
        assert not api._through_op(*_qkv())
    assert api._through_op(*_qkv(device="meta"))


# -- in-place K/V: expand views and grouped heads in the portable plans ---------------------------------------

def test_portable_forward_reads_expand_views_and_groups_in_place():
    q = torch.randn(2, 8, 20, 32).to(torch.bfloat16)
    one = torch.randn(2, 1, 30, 32).to(torch.bfloat16)
    out = torch.empty_like(q)
    for k, group in ((one.expand(2, 8, 30, 32), 1), (one, 8)):
        launch = plan_forward(ForwardTensors(q, k, k, out), ForwardOptions(scale=0.5))
        assert launch.args["k"].data_ptr() == one.data_ptr()  # the caller's storage: no copy
        assert launch.args["kv_group"] == group
        assert launch.args["k"].stride(1) == (0 if group == 1 else one.stride(1))  # the kernel reads k's strides
    assert launch.grid == (1, 8, 2)  # (query blocks of 64 rows, heads, batch)


def test_portable_backward_reads_expand_views_in_place():
    q = torch.randn(1, 4, 20, 32).to(torch.bfloat16)
    one = torch.randn(1, 1, 30, 32).to(torch.bfloat16)
    k = one.expand(1, 4, 30, 32)
    grads = [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, k)]
    steps = plan_backward_portable(BackwardTensors(q, k, k, q, q, torch.zeros(1, 4, 20), *grads), BackwardOptions(0.5))
    names = [s.kernel.name for s in steps]
    assert names == ["attention_bwd_preprocess_portable", "attention_bwd_dkdv_portable", "attention_bwd_dq_portable"]
    for step in steps[1:]:
        assert step.args["k"].data_ptr() == one.data_ptr() and step.args["v"].data_ptr() == one.data_ptr()
        assert step.args["k"].stride(1) == 0
    assert steps[1].grid == (math.ceil(30 / 64), 4, 1)


def test_training_benchmark_is_registered_and_needs_a_gpu(capsys):
    from tylopy import cli
    from tylopy_kernels.attention.bench import training as bench_training
    assert cli.main(["bench", "attention_training", "--batch", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    block = bench_training.make_block(256, 4, 2, bench_training._tylopy, torch.bfloat16, "meta")
    x = torch.randn(2, 64, 256, dtype=torch.bfloat16, device="meta")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    assert bench_training.step_flops(4, 4096, 2048, 16, 128) > 3 * 2 * 4 * 4096 * 12 * 2048 ** 2


def test_portable_plans_copy_what_they_cannot_read_in_place():
    q = torch.randn(1, 2, 20, 32).to(torch.bfloat16)
    lse = torch.zeros(1, 2, 20)
    grads = [torch.empty_like(q) for _ in range(3)]
    scalar = torch.ones(()).to(torch.bfloat16).expand(1, 2, 20, 32)  # the gradient of out.sum(): stride 0 everywhere
    with pytest.raises(ValueError, match="dout expects a contiguous last dimension"):  # the API copies it first
        plan_backward_portable(BackwardTensors(q, q, q, q, scalar, lse, *grads), BackwardOptions(0.5))
    one_head = torch.randn(1, 1, 20, 32).to(torch.bfloat16).expand(1, 2, 20, 32)
    steps = plan_backward_portable(BackwardTensors(q, q, q, q, one_head, lse, *grads), BackwardOptions(0.5))
    assert steps[0].args["dout"].data_ptr() == one_head.data_ptr()  # read in place
    odd = torch.randn(1, 2, 20, 36).to(torch.bfloat16)[..., :32]  # rows of 72 bytes: not 16-byte aligned
    launch = plan_forward(ForwardTensors(odd, q, q, torch.empty_like(q)), ForwardOptions(scale=0.5))
    assert launch.args["q"].data_ptr() != odd.data_ptr() and launch.args["k"].data_ptr() == q.data_ptr()
