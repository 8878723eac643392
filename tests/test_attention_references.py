"""The references and pass rules the Hopper attention is judged by, without a GPU:
``tylopy_kernels/attention/testing/reference.py`` and ``rules.py`` (which the GPU tests and
``tylopy check attention`` use): the oracle against torch in float64, the same-boundary recurrence,
and the rules accepting a float32 model of the kernel (``float32_model.py``) while rejecting it
with one step broken; the scenarios and the launch recorder.
"""
import pytest
import torch

from tylopy.testing import on_device
from tylopy_kernels.attention.testing import cases as C
from tylopy_kernels.attention.testing import float32_model as F
from tylopy_kernels.attention.testing import reference as R
from tylopy_kernels.attention.testing import rules as rules
from tylopy_kernels.attention.testing import scenarios as S
from tylopy_kernels.examples.vector_add import vector_add


# -- references and pass rules ------------------------------------------------------------------------

def _qkv(B=1, H=2, n_q=8, n_k=8, D=64, dtype=torch.bfloat16):
    return (torch.randn(B, H, n_q, D).to(dtype), torch.randn(B, H, n_k, D).to(dtype),
            torch.randn(B, H, n_k, D).to(dtype))


def _case_tensors(case):
    return C.make_inputs(case, "cpu")


ORACLE_CASES = [C.Case("bf16", 2, 3, 37, 53), C.Case("f16", 1, 2, 40, 40, causal=True),
                C.Case("bf16", 2, 2, 30, 70, mask="keys"), C.Case("f16", 2, 2, 33, 45, mask="heads", scale=0.3)]


@pytest.mark.parametrize("case", ORACLE_CASES, ids=[c.name for c in ORACLE_CASES])
def test_oracle_matches_torch_in_float64(case):
    q, k, v, mask = _case_tensors(case)
    ref = R.oracle(q, k, v, mask, case.causal, case.scale)
    empty = R.empty_rows(q, k, mask, case.causal)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask,
                                                            is_causal=case.causal, scale=case.scale)
    want = want.masked_fill(empty[..., None], 0)
    torch.testing.assert_close(ref.out, want, rtol=1e-12, atol=1e-12)
    s = (q.double() @ k.double().transpose(-1, -2)) * R.resolve_scale(case.scale, 64)
    s = s.masked_fill(~R.allowed_keys(q, k, mask, case.causal), float("-inf"))
    torch.testing.assert_close(ref.lse, torch.logsumexp(s, -1), rtol=1e-12, atol=1e-12)
    assert bool((ref.out[empty] == 0).all()) and bool((ref.lse[empty] == float("-inf")).all())


def test_oracle_without_keys_gives_zeros_and_minus_inf():
    q, k, v = _qkv(n_k=0)
    ref = R.oracle(q, k, v)
    assert bool((ref.out == 0).all()) and bool((ref.lse == float("-inf")).all())


@pytest.mark.parametrize("threshold", [None, 0.0, 8.0])
@pytest.mark.parametrize("block_n", [1, 7, 64, 128, 1000])
@pytest.mark.parametrize("case", ORACLE_CASES, ids=[c.name for c in ORACLE_CASES])
def test_same_boundary_without_rounding_is_the_oracle(case, block_n, threshold):
    """The online recurrence in float64 is exact up to float64 rounding, for any tile size, with
    the running maximum or a lazy one."""
    q, k, v, mask = _case_tensors(case)
    ref = R.oracle(q, k, v, mask, case.causal, case.scale)
    unrounded = R.HOPPER.replace(block_n=block_n, p_dtype=torch.float64, rescale_threshold=threshold)
    sb = R.same_boundary(q, k, v, mask, case.causal, case.scale, unrounded)
    torch.testing.assert_close(sb.out, ref.out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sb.lse, ref.lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_same_boundary_rounds_p_of_one_tile_like_the_formula(dtype):
    """One tile: out = round(exp(s - max s)) v / sum exp(s - max s), P rounded through float32."""
    torch.manual_seed(3)
    q, k, v = _qkv(B=1, H=1, n_q=20, n_k=50, dtype=dtype)
    s = (q.double() @ k.double().transpose(-1, -2)) / 8
    p = torch.exp(s - s.amax(-1, keepdim=True))
    want = (p.float().to(dtype).double() @ v.double()) / p.sum(-1, keepdim=True)
    sb = R.same_boundary(q, k, v, model=R.HOPPER.replace(block_n=64))
    torch.testing.assert_close(sb.out, want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(sb.out, R.oracle(q, k, v).out, rtol=1e-6, atol=0), "P was not rounded"


RULE_CASES = [C.Case("bf16", 2, 3, 129, 203, lse=True), C.Case("f16", 1, 2, 300, 300, causal=True),
              C.Case("bf16", 2, 2, 150, 333, mask="random", lse=True), C.Case("f16", 1, 2, 256, 256, inputs="large"),
              C.Case("bf16", 1, 1, 1, 239), C.Case("f16", 2, 2, 200, 200, inputs="uniform", lse=True)]


@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("case", RULE_CASES, ids=[c.name for c in RULE_CASES])
def test_rules_accept_the_float32_model(case, block_n):
    S.run_case(case, F.fp32_model(block_n), device="cpu", block_n=block_n)


BROKEN = [("P not rounded", dict(round_p_to_input=False), 128, "differ from the same-boundary"),
          ("other tile boundaries", dict(block_n=64), 128, "differ from the same-boundary"),
          ("O not rescaled", dict(block_n=64, rescale=False), 64, "oracle error")]


@pytest.mark.parametrize("change,block_n,why", [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_rules_reject_a_broken_model(change, block_n, why):
    model = F.fp32_model(**dict(dict(block_n=128), **change))
    with pytest.raises(AssertionError, match=why):
        S.run_case(C.Case("bf16", 2, 3, 300, 333, lse=True), model, device="cpu", block_n=block_n)


def test_rules_reject_nan_and_nonzero_empty_rows():
    case = C.Case("bf16", 1, 2, 40, 70, mask="random", lse=True)
    q, k, v, mask = _case_tensors(case)
    out, lse = F.fp32_model(128)(q, k, v, attn_mask=mask, return_lse=True)
    rules.check_output(out, lse, R.AttentionInputs(q, k, v, mask), model=R.HOPPER)
    bad = out.clone()
    bad[0, 1, 5, 3] = float("nan")
    with pytest.raises(AssertionError, match="NaN"):
        rules.check_output(bad, lse, R.AttentionInputs(q, k, v, mask), model=R.HOPPER)
    bad = out.clone()
    bad[0, 0, 0, 0] = 1e-3  # row 0 has no key
    with pytest.raises(AssertionError, match="no key"):
        rules.check_output(bad, lse, R.AttentionInputs(q, k, v, mask), model=R.HOPPER)
    bad_lse = lse.clone()
    bad_lse[0, 0, 0] = 0.0
    with pytest.raises(AssertionError, match="LSE"):
        rules.check_output(out, bad_lse, R.AttentionInputs(q, k, v, mask), model=R.HOPPER)


def test_scenarios_accept_the_float32_model():
    model, causal = F.fp32_model(128), C.Case("bf16", 1, 2, 150, 150, causal=True, lse=True)
    masked = C.Case("f16", 2, 2, 70, 90, mask="transposed", lse=True)
    S.check_nan_padding(masked, model, "cpu")
    S.check_future_perturbation(causal, model, (0, 63, 64, 149), "cpu")
    S.check_repeatable(masked, model, 3, "cpu")
    S.check_transposed_layout(masked, model, "cpu", 128)
    S.check_empty(model, device="cpu")
    S.check_canary(masked, F.model_launch(128), "cpu")


def test_scenarios_reject_broken_implementations():
    model = F.fp32_model(128)
    causal = C.Case("bf16", 1, 1, 100, 100, causal=True)

    def leaks_future(q, k, v, attn_mask=None, is_causal=False, scale=None, return_lse=False):
        return model(q, k, v, attn_mask, False, scale, return_lse)

    with pytest.raises(AssertionError, match="changed outputs"):
        S.check_future_perturbation(causal, leaks_future, (10,), "cpu")

    def writes_past_the_end(tensors, options):
        F.model_launch(128)(tensors, options)
        out = tensors.out
        out.as_strided((1,), (1,), out.storage_offset() - 1).fill_(0)

    with pytest.raises(AssertionError, match="outside"):
        S.check_canary(C.Case("bf16", 1, 1, 20, 30), writes_past_the_end, "cpu")

    def reads_padding(q, k, v, attn_mask=None, is_causal=False, scale=None, return_lse=False):
        """Reads one key row past n_k where the buffer has one (a NaN row when padded)."""
        wide = (k.shape[0], k.shape[1], k.shape[2] + 1, k.shape[3])
        last = k.storage_offset() + sum((n - 1) * st for n, st in zip(wide, k.stride()))
        if last < k.untyped_storage().nbytes() // k.element_size():
            k = v = k.as_strided(wide, k.stride())
        return model(q, k, v, attn_mask, is_causal, scale, return_lse)

    with pytest.raises(AssertionError, match="NaN padding"):
        S.check_nan_padding(C.Case("bf16", 1, 1, 20, 30), reads_padding, "cpu")


def test_recorded_launches_sees_only_the_hopper_forward(fake):
    x, y, out = (on_device(torch.randn(256)) for _ in range(3))
    with S.recorded_launches() as seen:
        vector_add[(1,)](x, y, out, 256)
    assert seen == [] and len(fake.launches) == 1


def test_case_inputs_are_reproducible_and_as_described():
    case = C.Case("bf16", 2, 3, 50, 60, inputs="large", mask="keys")
    a, b = C.make_inputs(case, "cpu"), C.make_inputs(case, "cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    q, k, _, mask = a
    s = (q.double() @ k.double().transpose(-1, -2)) / 8
    assert 2.5e4 < float(s.abs().max()) < 3.5e4
    assert mask.shape == (2, 1, 1, 60) and not bool(mask[0].any()) and bool(mask[1].all())
    q, k, _, _ = C.make_inputs(C.Case("f16", 1, 1, 4, 4, inputs="large_uniform"), "cpu")
    assert bool(((q.double() @ k.double().transpose(-1, -2)) / 8 == 3e4).all())
