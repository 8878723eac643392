"""The Hopper backward over packed batches (``sm90/backward_varlen.py``) in the emulator: the
Hopper varlen forward's out and LSE, then the three backward launches, every gradient checked
with FlashAttention's rule against the float64 per-document reference (``grad_check``).

Ragged documents (empty, length 1, shorter than a query or key tile, several tiles), bottom-right
causal with more queries or more keys than the other side, grouped-query K/V, NaN in every row past
the last document (q, k, v and dout), D = 64 and 128; gradient rows outside every document stay
zero. Also: the dense backward's PTX does not change with the packed hooks.
"""
import math

import pytest
import torch

from tylopy.runtime.tensormap import TensorMapSpec
from tylopy_kernels.attention.sm90.backward_varlen_launch import (BackwardTensors, HopperBackwardOptions,
                                                                  plan_varlen_backward)
from tylopy_kernels.attention.sm90.varlen_forward import attention_varlen_fwd_sm90
from tylopy_kernels.attention.sm90.varlen_launch import (ForwardTensors, HopperOptions, MapTarget, PackedDocs,
                                                         plan_varlen_launch)
from tylopy_kernels.attention.testing import grad_check
from tylopy_kernels.attention.testing.packed import packed, prefix_sums


def _spec(t, dims, strides, box):
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "bf16" if t.dtype == torch.bfloat16 else "f16",
                         128)


def emulate_training_step(lens_q, lens_k, H, H_kv, D, causal, dtype=torch.bfloat16, seed=0, schedule=None):
    g = torch.Generator().manual_seed(seed)
    q, dout = packed(lens_q, lens_q, H, D, dtype, g), packed(lens_q, lens_q, H, D, dtype, g)
    k, v = packed(lens_k, lens_k, H_kv, D, dtype, g, pad=5), packed(lens_k, lens_k, H_kv, D, dtype, g, pad=5)
    cu_q, cu_k = prefix_sums(lens_q), prefix_sums(lens_k)
    scale = 1 / math.sqrt(D)
    out = torch.zeros(q.shape, dtype=dtype)
    lse = torch.full((H, q.shape[0]), float("-inf"))
    docs = PackedDocs(cu_q, cu_k, max(lens_q), max(lens_k))
    fwd = plan_varlen_launch(ForwardTensors(q, k, v, out, lse), docs, HopperOptions(scale, causal), MapTarget(_spec))
    attention_varlen_fwd_sm90.emulate(*fwd.args, grid=fwd.grid, **fwd.constexprs)
    # NaN to start with: every row is written (rows outside the documents zeroed by the conversion),
    # and the fp32 dQ accumulator too (its rows zeroed by the statistics kernel)
    dq, dk, dv = (torch.full_like(t, math.nan) for t in (q, k, v))
    steps = plan_varlen_backward(BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv), docs,
                                 HopperBackwardOptions(scale, causal, schedule=schedule), encode=False)
    steps[1].args[9].fill_(math.nan)
    for step in steps:
        step.emulate()
    return dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv), (q, k, v, dout, cu_q, cu_k, scale)


def test_rows_no_document_computes_are_zeroed():
    """Documents longer than max_seqlen (its rows past it are not computed) and rows after the last
    document: their gradient rows are zeros, whatever dq, dk, dv held (NaN here)."""
    lens_q, lens_k, H, H_kv, D = (40, 90, 30), (50, 100, 20), 2, 1, 64
    g = torch.Generator().manual_seed(4)
    q, dout = packed(lens_q, lens_q, H, D, torch.bfloat16, g, pad=7), packed(lens_q, lens_q, H, D, torch.bfloat16, g,
                                                                              pad=7)
    k, v = (packed(lens_k, lens_k, H_kv, D, torch.bfloat16, g, pad=9) for _ in range(2))
    cu_q, cu_k = prefix_sums(lens_q), prefix_sums(lens_k)
    out, lse = torch.randn(q.shape).to(torch.bfloat16), torch.randn(H, q.shape[0])
    dq, dk, dv = (torch.full_like(t, math.nan) for t in (q, k, v))
    docs = PackedDocs(cu_q, cu_k, 64, 64)  # the second document of each side is longer than 64
    steps = plan_varlen_backward(BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv), docs,
                                 HopperBackwardOptions(0.125, True), encode=False)
    for step in steps:
        step.emulate()
    for name, t, lens in (("dq", dq, lens_q), ("dk", dk, lens_k), ("dv", dv, lens_k)):
        first, computed = 0, []
        for n in lens:
            computed += range(first, first + min(n, 64))
            first += n
        rest = sorted(set(range(t.shape[0])) - set(computed))
        assert rest and (t[rest] == 0).all(), f"{name}: rows no document computes are not zero"
        assert not t[computed].isnan().any(), f"{name}: a computed row is NaN"


CASES = [
    # name, query lengths, key lengths, H, H_kv, D, causal, schedule
    ("D64-ragged-gqa", (0, 1, 17, 140, 300), (5, 1, 0, 200, 300), 2, 1, 64, False, None),
    ("D64-causal-bottom-right", (0, 1, 17, 140, 300, 200), (5, 1, 0, 200, 300, 50), 2, 2, 64, True, None),
    ("D128-causal-gqa", (33, 150, 1, 0), (33, 260, 7, 9), 4, 2, 128, True, None),
    ("D64-atomic-serial", (70, 129), (70, 300), 2, 2, 64, True, {"DQ": "atomic", "DQ_ORDER": "serial"}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_varlen_backward_passes_the_flash_attention_rule(case):
    _, lq, lk, H, H_kv, D, causal, schedule = case
    got, (q, k, v, dout, cu_q, cu_k, scale) = emulate_training_step(lq, lk, H, H_kv, D, causal, schedule=schedule)
    assert grad_check.check(got, grad_check.BackwardInputs(q, k, v, dout, None, causal, scale, varlen=(cu_q, cu_k)))
    n_q, n_k = sum(lq), sum(lk)
    for name, rows in (("dq", n_q), ("dk", n_k), ("dv", n_k)):
        assert (got[name][rows:] == 0).all(), f"{name} written past the last document"
    for b, (a, e) in enumerate(zip(cu_k.tolist(), cu_k.tolist()[1:])):
        if lq[b] == 0:  # keys no query sees: no gradient
            assert (got["dk"][a:e] == 0).all() and (got["dv"][a:e] == 0).all()


def _instructions(ptx):
    lines = (ln.split("//")[0].rstrip() for ln in ptx.splitlines())
    return [ln for ln in lines if ln and not ln.lstrip().startswith((".loc", ".file"))]


@pytest.mark.parametrize("cx", [dict(HEAD_DIM=64, BLOCK_M=128), dict(HEAD_DIM=128, BLOCK_M=64, HAS_MASK=True,
                                                                         DQ="atomic", DQ_ORDER="serial")],
                         ids=["D64", "D128-mask-atomic"])
def test_dense_backward_ptx_does_not_change_with_the_varlen_hooks(cx, monkeypatch):
    """The hooks (``shift``, ``batch_coord``, ``Problem.varlen``) emit nothing for a dense problem."""
    from tylopy_kernels.attention.sm90 import backward, backward_common
    from tylopy_kernels.attention.sm90.backward import attention_bwd_sm90
    with_hooks = attention_bwd_sm90.compile(**cx).ptx
    calls = []

    def plain_shift(x, offset):
        calls.append(offset)
        return x

    monkeypatch.setenv("TYLOPY_CACHE", "0")
    for mod in (backward, backward_common):
        monkeypatch.setattr(mod, "shift", plain_shift)
    monkeypatch.setattr(backward, "batch_coord", lambda prob, b: b)
    attention_bwd_sm90.clear_cache()
    try:
        without = attention_bwd_sm90.compile(**cx).ptx
    finally:
        monkeypatch.undo()
        attention_bwd_sm90.clear_cache()
    assert calls, "the replaced hooks were not traced"
    assert _instructions(with_hooks) == _instructions(without)
