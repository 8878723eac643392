"""CPU tier of ``tylopy.attention_varlen`` (tylopy_kernels/attention/varlen.py).

* the emulator runs the portable kernels' packed plans (forward and backward) over batches with
  empty and length-1 sequences, queries without keys, keys without queries, causal (aligned to
  each sequence's bottom-right corner) and grouped-query heads, NaN in the rows past the last
  sequence; every output passes FlashAttention's rule against a float64 per-sequence reference,
  and rows past the last sequence stay untouched;
* the autograd formula of ``tylopy::attention_varlen_fwd`` by ``torch.autograd.gradcheck`` in
  float64 through the operator's CPU reference;
* input checks, before any GPU work.
"""
import pytest
import torch

import tylopy
from tylopy_kernels.attention import autograd as A
from tylopy_kernels.attention.testing import grad_check as grad_check


def cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)


def packed(lengths, heads, D, dtype, gen, pad=3):
    """(total + pad, heads, D) rows of random values, NaN in the ``pad`` rows past the last sequence."""
    total = sum(lengths)
    t = torch.full((total + pad, heads, D), float("nan"), dtype=dtype)
    t[:total] = torch.randn(total, heads, D, generator=gen).to(dtype)
    return t


CASES = [
    # name, query lengths, key lengths, H, H_kv, D, dtype, causal
    ("mixed-D32", (0, 1, 17, 40), (5, 1, 0, 33), 2, 2, 32, torch.bfloat16, False),
    ("causal-gqa-D64", (1, 30, 0, 19), (1, 30, 4, 25), 4, 2, 64, torch.bfloat16, True),
    ("length1-D16-f16", (1, 1, 1), (1, 7, 1), 2, 1, 16, torch.float16, False),
    ("causal-D128", (20, 9), (20, 33), 1, 1, 128, torch.float16, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_emulated_varlen_passes_the_flash_attention_rule(case):
    _, lq, lk, H, H_kv, D, dtype, causal = case
    gen = torch.Generator().manual_seed(len(lq) + D)
    q, dout = packed(lq, H, D, dtype, gen), packed(lq, H, D, dtype, gen)
    k, v = packed(lk, H_kv, D, dtype, gen, pad=5), packed(lk, H_kv, D, dtype, gen, pad=5)
    cu_q, cu_k = cu(lq), cu(lk)
    got, scale = grad_check.emulate(grad_check.BackwardInputs(q, k, v, dout, causal=causal, varlen=(cu_q, cu_k,
                                                              max(lq), max(lk))))
    summary = grad_check.check(got, grad_check.BackwardInputs(q, k, v, dout, causal=causal, scale=scale,
                                                              varlen=(cu_q, cu_k)))
    assert summary
    n_q, n_k = sum(lq), sum(lk)
    for name, rows in (("out", n_q), ("dq", n_q), ("dk", n_k), ("dv", n_k)):
        assert (got[name][rows:] == 0).all(), f"{name} written past the last sequence"
    assert (got["lse"][:, n_q:] == float("-inf")).all()
    for b, (a, e) in enumerate(zip(cu_q.tolist(), cu_q.tolist()[1:])):
        if lk[b] == 0:  # queries with no keys: zeros and LSE -inf
            assert (got["out"][a:e] == 0).all() and (got["lse"][:, a:e] == float("-inf")).all()
    for b, (a, e) in enumerate(zip(cu_k.tolist(), cu_k.tolist()[1:])):
        if lq[b] == 0:  # keys no query sees: no gradient
            assert (got["dk"][a:e] == 0).all() and (got["dv"][a:e] == 0).all()


def test_varlen_matches_the_batched_kernels_on_equal_lengths():
    """One sequence per batch entry, all of one length: the packed plan gives the batched bits."""
    gen = torch.Generator().manual_seed(11)
    B, H, n, D = 3, 2, 21, 32
    q, k, v, dout = (torch.randn(B, n, H, D, generator=gen).to(torch.bfloat16) for _ in range(4))
    flat = [t.reshape(B * n, H, D) for t in (q, k, v, dout)]
    lengths = cu([n] * B)
    mine, _ = grad_check.emulate(grad_check.BackwardInputs(*flat, causal=True, varlen=(lengths, lengths, n, n)))
    batched, _ = grad_check.emulate(grad_check.BackwardInputs(*(t.transpose(1, 2) for t in (q, k, v, dout)),
                                                              causal=True))
    for name in ("out", "dq", "dk", "dv"):
        want = batched[name].transpose(1, 2).reshape(B * n, H, D)
        assert torch.equal(mine[name].view(torch.int16), want.contiguous().view(torch.int16)), name
    assert torch.equal(mine["lse"], batched["lse"].permute(1, 0, 2).reshape(H, B * n))


# -- the autograd formula, in float64 through the operator's CPU reference --------------------------------------

@pytest.mark.parametrize("causal,gqa", [(False, 1), (True, 2)])
def test_gradcheck_through_the_varlen_operator(causal, gqa):
    gen = torch.Generator().manual_seed(2)
    lq, lk = (0, 1, 3, 2), (2, 1, 3, 0)
    H = 2
    q = torch.randn(sum(lq), H, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(lk), H // gqa, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(lk), H // gqa, 4, generator=gen, dtype=torch.float64, requires_grad=True)

    def fn(q, k, v):
        out, lse = A.varlen_op(q, k, v, A.PackedDocs(cu(lq), cu(lk), max(lq), max(lk)), causal, 0.7, return_lse=True)
        return out, lse.masked_fill(torch.isinf(lse), 0.0)  # rows without keys: -inf, no gradient

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_varlen_reference_matches_batched_sdpa():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    flat = [t.transpose(1, 2).reshape(10, 3, 8) for t in (q, k, v)]
    out, lse = A.reference_varlen_forward(*flat, cu([5, 5]), cu([5, 5]), True, 0.5)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    torch.testing.assert_close(out, want.transpose(1, 2).reshape(10, 3, 8))
    assert lse.shape == (3, 10)


# -- input checks --------------------------------------------------------------------------------------------

def _args(**change):
    q = torch.zeros(10, 4, 32, dtype=torch.bfloat16)
    args = dict(q=q, k=q.clone(), v=q.clone(), cu_seqlens_q=cu([4, 6]), cu_seqlens_k=cu([4, 6]), max_seqlen_q=6,
                max_seqlen_k=6)
    args.update(change)
    return args


BAD = [
    ("q 4-D", dict(q=torch.zeros(1, 10, 4, 32, dtype=torch.bfloat16)), ValueError, "q"),
    ("q float32", dict(q=torch.zeros(10, 4, 32)), TypeError, "q"),
    ("k dtype", dict(k=torch.zeros(10, 4, 32, dtype=torch.float16)), TypeError, "k/v"),
    ("v shape", dict(v=torch.zeros(9, 4, 32, dtype=torch.bfloat16)), ValueError, "v"),
    ("head dim 48", dict(q=torch.zeros(10, 4, 48, dtype=torch.bfloat16), k=torch.zeros(10, 4, 48, dtype=torch.bfloat16),
                         v=torch.zeros(10, 4, 48, dtype=torch.bfloat16)), ValueError, "head_dim"),
    ("fewer kv heads", dict(k=torch.zeros(10, 2, 32, dtype=torch.bfloat16),
                            v=torch.zeros(10, 2, 32, dtype=torch.bfloat16)), ValueError, "heads"),
    ("cu int64", dict(cu_seqlens_q=torch.tensor([0, 4, 10])), TypeError, "cu_seqlens_q"),
    ("cu 2-D", dict(cu_seqlens_k=cu([4, 6])[None]), TypeError, "cu_seqlens_k"),
    ("cu lengths", dict(cu_seqlens_k=cu([4, 3, 3])), ValueError, "cu_seqlens_k"),
    ("max negative", dict(max_seqlen_q=-1), TypeError, "max_seqlen_q"),
    ("max float", dict(max_seqlen_k=6.0), TypeError, "max_seqlen_k"),
    ("causal int", dict(is_causal=1), TypeError, "is_causal"),
    ("scale nan", dict(scale=float("nan")), ValueError, "scale"),
    ("scale str", dict(scale="1"), TypeError, "scale"),
    ("gqa flag", dict(enable_gqa=1), TypeError, "enable_gqa"),
    ("cpu", dict(), ValueError, "CUDA"),
]


@pytest.mark.parametrize("change,exc,arg", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_varlen_input_is_rejected_naming_the_argument(change, exc, arg):
    with pytest.raises(exc) as info:
        tylopy.attention_varlen(**_args(**change))
    text = str(info.value)
    assert arg in text and "expects" in text and "but got" in text, text


def test_grouped_heads_need_enable_gqa_and_a_divisor():
    k = torch.zeros(10, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):  # passes the checks, then needs a GPU
        tylopy.attention_varlen(**_args(k=k, v=k.clone()), enable_gqa=True)
    k3 = torch.zeros(10, 3, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="divides"):
        tylopy.attention_varlen(**_args(k=k3, v=k3.clone()), enable_gqa=True)


def test_meta_tensors_give_shapes_through_the_operator():
    q = torch.zeros(10, 4, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    k = torch.zeros(12, 2, 64, dtype=torch.bfloat16, device="meta")
    c = torch.zeros(3, dtype=torch.int32, device="meta")
    out, lse = tylopy.attention_varlen(q, k, k, c, c, 6, 6, enable_gqa=True, return_lse=True)
    assert out.shape == (10, 4, 64) and out.dtype == torch.bfloat16 and lse.shape == (4, 10)
    assert out.grad_fn is not None and lse.dtype == torch.float32
    out.float().sum().backward()
    assert q.grad.shape == q.shape
