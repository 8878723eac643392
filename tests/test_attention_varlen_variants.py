"""``attention_varlen`` with variant keywords (``varlen_variants.py``) on the CPU: the packed route
(document table, generated mods, block mask of documents) against each document run alone through
the float64 definition, forward and backward; the variant kernel in the emulator on packed
documents (window + softcap + user mods, GQA, NaN past every end); ``score_mod_bwd``; the errors of
bad mods and keywords; torch.compile(fullgraph=True)."""
import math

import pytest
import torch

import tylopy as ty
from tylopy.runtime.tensormap import TensorMapSpec
from tylopy_kernels.attention import variants as V
from tylopy_kernels.attention import varlen_variants as VV

from attention_varlen_variant_cases import (LENS_K, LENS_Q, doc_bias, doc_bias_bwd, gain_mods, packed, per_document,
                                            prefix, stripes)

CU_Q, CU_K = prefix(LENS_Q), prefix(LENS_K)


def inputs(seed, D=16, H=4, H_kv=2, dtype=torch.float64, extra_q=3):
    g = torch.Generator().manual_seed(seed)
    return (packed(CU_Q[-1] + extra_q, H, D, g, dtype), packed(CU_K[-1], H_kv, D, g, dtype),
            packed(CU_K[-1], H_kv, D, g, dtype), g)


def run(q, k, v, is_causal=True, **kw):
    return ty.attention_varlen(q, k, v, CU_Q, CU_K, max(LENS_Q), max(LENS_K), is_causal=is_causal, enable_gqa=True,
                               return_lse=True, **kw)


CASES = {
    "window-softcap": dict(window_size=(20, 3), softcap=6.0),
    "mods-alibi-sinks": dict(score_mod=doc_bias, mask_mod=stripes, alibi_slopes="bh", sinks="h"),
    "window-both-sides-mask": dict(window_size=(9, 12), mask_mod=stripes, alibi_slopes="h"),
    "aux-alibi": dict(score_mod=lambda s, b, h, i, j, aux: s + aux[0][b, h] * aux[1][i % 3],
                      mask_mod=lambda b, h, i, j, aux: aux[1][(i + j) % 3] > -0.5, aux="aux", alibi_slopes="bh"),
}


def _tensors(kw, g, H):
    kw = dict(kw)
    n_docs = len(LENS_Q)
    if kw.get("alibi_slopes") == "bh":
        kw["alibi_slopes"] = torch.rand(n_docs, H, generator=g) * 0.2
    elif kw.get("alibi_slopes") == "h":
        kw["alibi_slopes"] = torch.rand(H, generator=g) * 0.2
    if kw.get("aux") == "aux":
        kw["aux"] = (torch.randn(n_docs, H, generator=g, dtype=torch.float64), torch.randn(3, generator=g))
    if kw.get("sinks") == "h":
        kw["sinks"] = torch.randn(H, generator=g)
    return kw


@pytest.mark.parametrize("name, causal", [("window-softcap", True), ("mods-alibi-sinks", True),
                                          pytest.param("mods-alibi-sinks", False, marks=pytest.mark.exhaustive),
                                          ("window-both-sides-mask", False), ("aux-alibi", True)])
def test_packed_documents_match_each_document_alone(name, causal):
    """Forward, LSE and dq/dk/dv in float64 (the torch path), ragged documents (length 1, no queries,
    no keys, rows past the last document), GQA."""
    q, k, v, g = inputs(seed=len(name) + causal)
    kw = _tensors(CASES[name], g, q.shape[1])
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = run(q, k, v, is_causal=causal, **kw)
    want, want_lse = per_document(q, k, v, CU_Q, CU_K, 1 / math.sqrt(q.shape[-1]), kw, causal)
    assert (out - want).abs().max().item() < 1e-12
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = ~torch.isinf(want_lse)
    assert (lse[finite] - want_lse[finite]).abs().max().item() < 1e-12
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out * dout).sum(), (q, k, v))
    ref = torch.autograd.grad((want * dout).sum(), (q, k, v))
    for name_, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert (a - b).abs().max().item() < 1e-10, name_


def _spec(t, dims, strides, box):
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "bf16", 128)


@pytest.mark.parametrize("backward", [False, pytest.param(True, marks=pytest.mark.exhaustive)])
def test_variant_kernel_on_packed_documents_emulated(backward):
    """The Hopper variant kernels (the forward; with TYLOPY_EXHAUSTIVE=1 also the backward, emulated) on
    the packed batch: bottom-right causal window + softcap + a user score_mod and mask_mod at
    document-relative positions, D = 64, GQA, NaN past the end of every tensor, against float64
    per-document references."""
    from tylopy_kernels.attention.sm90.backward_variant_launch import plan_backward_variant
    from tylopy_kernels.attention.sm90.forward_variant import attention_variant_fwd_sm90
    from tylopy_kernels.attention.sm90.variant_launch import ForwardTensors, VariantCall, plan_variant_launch
    q, k, v, g = inputs(seed=1, D=64, H=2, H_kv=1, dtype=torch.bfloat16)
    kw = dict(window_size=(40, 8), softcap=8.0, mask_mod=stripes, score_mod=doc_bias)
    opts = dict(dict.fromkeys(VV.KEYWORDS), **kw, is_causal=True, causal_align="bottom_right")
    cu = (CU_Q, CU_K, torch.tensor(CU_Q, dtype=torch.int32), torch.tensor(CU_K, dtype=torch.int32))
    q1, k1, v1, vid, tensors = VV.varlen_variant(q, k, v, cu, opts)
    variant = V.lookup_variant(vid)
    tensors = V.with_captured(variant, tensors)
    scale = 1 / math.sqrt(64)
    out = torch.full(q1.shape, float("nan"), dtype=q.dtype)
    lse = torch.full(q1.shape[:3], float("nan"))
    plan = plan_variant_launch(ForwardTensors(q1, k1, v1, out, lse), VariantCall(variant, tensors, scale),
                               make_map=_spec)
    attention_variant_fwd_sm90.emulate(*plan.args, grid=plan.grid, **plan.constexprs)
    qq, kk, vv = (t.double().requires_grad_() for t in (q, k, v))
    want, want_lse = per_document(qq, kk, vv, CU_Q, CU_K, scale, kw, True)
    got = out[0].transpose(0, 1).double()
    assert not torch.isnan(got).any()
    assert (got - want).abs().max().item() <= 2e-2 * v.double().abs().max().item()
    assert torch.equal(torch.isinf(lse[0]), torch.isinf(want_lse))
    finite = ~torch.isinf(want_lse)
    assert (lse[0].double()[finite] - want_lse[finite]).abs().max().item() < 2e-4 * want_lse[finite].abs().max()
    if not backward:
        return
    dout = packed(q.shape[0], 2, 64, g, torch.bfloat16)
    dq, dk, dv = (torch.full(t.shape, math.nan, dtype=t.dtype) for t in (q1, k1, v1))
    o_ref, l_ref = V.reference_forward(q1, k1, v1, variant, tensors, scale)
    from tylopy_kernels.attention.sm90.backward_variant_launch import BackwardTensors
    io = BackwardTensors(q1, k1, v1, o_ref, dout.unsqueeze(0).transpose(1, 2), l_ref.float(), dq, dk, dv)
    for step in plan_backward_variant(io, VariantCall(variant, tensors, scale), encode=False):
        step.emulate()
    ref = torch.autograd.grad((want * dout.double()).sum(), (qq, kk, vv))
    for name, mine, exact in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        mine = mine[0].transpose(0, 1).double()
        assert torch.isfinite(mine).all(), name
        assert (mine - exact).abs().max().item() <= 1.5e-2 * exact.abs().max().item(), name


def test_document_block_mask_lists_exactly_the_visible_tiles():
    """Tiles listed = tiles with a visible pair; full = every pair inside the lengths visible (brute force
    over the per-row intervals), with documents across tile edges."""
    lens_q, lens_k = (300, 1, 0, 129, 60), (250, 1, 7, 140, 0)
    cu_q, cu_k = torch.tensor(prefix(lens_q), dtype=torch.int32), torch.tensor(prefix(lens_k), dtype=torch.int32)
    tq, tk = int(cu_q[-1]) + 5, int(cu_k[-1])
    for flags in ((True, "bottom_right", 100, 0), (False, "bottom_right", -1, -1), (True, "top_left", -1, 30)):
        info = VV.doc_table(cu_q, cu_k, tq, flags)
        num, idx, fnum, fidx = VV.doc_block_mask(info, tq, tk, False)
        full, partial = V.tile_flags(num, idx, fnum, fidx)
        lo, hi = VV.key_interval(info, flags)
        j = torch.arange(tk)
        vis = (j >= lo[:, None]) & (j < hi[:, None])
        nq, nk = -(-tq // 128), -(-tk // 128)
        pad = torch.nn.functional.pad(vis, (0, nk * 128 - tk, 0, nq * 128 - tq))
        tiles = pad.view(nq, 128, nk, 128)
        any_t = tiles.any(3).any(1)
        inside = torch.nn.functional.pad(torch.ones(tq, tk, dtype=torch.bool), (0, nk * 128 - tk, 0, nq * 128 - tq))
        all_t = (tiles | ~inside.view(nq, 128, nk, 128)).all(3).all(1)
        assert torch.equal(full[0, 0] | partial[0, 0], any_t), flags
        assert torch.equal(full[0, 0], any_t & all_t), flags
        assert not (full & partial).any()


def test_tables_are_cached_per_prefix_sums():
    cu = torch.tensor(CU_Q, dtype=torch.int32)
    built = []

    def sums():
        built.append(1)
        return cu, cu
    args = (sums, (CU_Q[-1], CU_Q[-1]), (True, "bottom_right", 4, 0), False, "cpu")
    first = VV.packed_tables((CU_Q, CU_Q), *args)
    assert VV.packed_tables((list(CU_Q), cu.clone()), *args) is first   # the same values: reused
    assert len(built) == 1        # the device sums are made (repaired, copied) only to build the tables
    other = list(CU_Q)
    other[2] += 1
    assert VV.packed_tables((other, CU_Q), *args) is not first and len(built) == 2


def test_score_mod_bwd_replaces_the_derived_gradient():
    """A score_mod_bwd that says the mod is flat (zero) leaves dq = dk = 0 and dv unchanged; the true
    one gives autograd's gradients -- on the dense API and on packed documents."""
    q, k, v, g = inputs(seed=5, D=16, H=2, H_kv=1)
    for use in ("varlen", "dense"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]

        def call(bwd, leaves=leaves, use=use):
            if use == "varlen":
                return run(*leaves, score_mod=doc_bias, score_mod_bwd=bwd)[0]
            qd, kd, vd = (t[:CU_K[-1] if t is not leaves[0] else CU_Q[-1]].transpose(0, 1)[None] for t in leaves)
            return ty.attention(qd, kd, vd, score_mod=doc_bias, score_mod_bwd=bwd, enable_gqa=True)
        base = call(None)
        dout = torch.randn(base.shape, generator=g, dtype=torch.float64)
        auto = torch.autograd.grad((base * dout).sum(), leaves)
        true = torch.autograd.grad((call(doc_bias_bwd) * dout).sum(), leaves)
        flat = torch.autograd.grad((call(lambda s, grad, b, h, i, j: grad * 0.0) * dout).sum(), leaves)
        for a, b in zip(auto, true):
            assert (a - b).abs().max().item() < 1e-12, use
        assert flat[0].abs().max().item() == 0 and flat[1].abs().max().item() == 0, use
        assert (flat[2] - auto[2]).abs().max().item() < 1e-12, use


def test_packed_score_mod_bwd_reads_aux_at_document_positions():
    """A score_mod_bwd taking ``aux`` (a per-document, per-head gain) on packed documents: the float64
    torch path gives autograd's gradients of the mod (it sees b = the document, as the mod)."""
    q, k, v, g = inputs(seed=8, D=16, H=2, H_kv=1)
    gain = (torch.rand(len(LENS_Q), 2, generator=g, dtype=torch.float64) + 0.5,)
    kw = dict(score_mod=lambda s, b, h, i, j, aux: s * aux[0][b, h] - 0.02 * (i - j).abs(), aux=gain)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = run(*leaves, score_mod_bwd=lambda s, grad, b, h, i, j, aux: grad * aux[0][b, h], **kw)[0]
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out * dout).sum(), leaves)
    want = per_document(*leaves, CU_Q, CU_K, 1 / math.sqrt(16), kw, True)[0]
    for a, b in zip(got, torch.autograd.grad((want * dout).sum(), leaves)):
        assert (a - b).abs().max().item() < 1e-12


# small ragged documents for the emulated backward: a length-1 one, one with keys but no queries
SMALL_Q, SMALL_K = (60, 1, 0, 45, 23), (70, 1, 5, 40, 23)


def test_packed_score_mod_bwd_in_the_backward_kernel_emulated():
    """score_mod + score_mod_bwd on packed documents stay on the Hopper backward kernel: the generated
    document-relative wrapper of the user's derivative (which reads the per-head gain the mod captures,
    beside the document table) in the emulator, GQA, D = 64, bottom-right causal, NaN past
    every end, against float64 autograd of the mod per document."""
    from tylopy_kernels.attention.sm90.backward_variant_launch import BackwardTensors, VariantCall, plan_backward_variant
    from tylopy_kernels.attention.user_grad import VARLEN_RUN
    cu_q, cu_k = prefix(SMALL_Q), prefix(SMALL_K)
    g = torch.Generator().manual_seed(2)
    D, H = 64, 2
    q = packed(cu_q[-1] + 3, H, D, g, torch.bfloat16)   # (3 rows past the last document)
    k, v, dout = packed(cu_k[-1], 1, D, g, torch.bfloat16), packed(cu_k[-1], 1, D, g, torch.bfloat16), \
        packed(q.shape[0], H, D, g, torch.bfloat16)
    mod, bwd = gain_mods()
    opts = dict(dict.fromkeys(VV.KEYWORDS), score_mod=mod, score_mod_bwd=bwd, is_causal=True,
                causal_align="bottom_right")
    cu = (cu_q, cu_k, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32))
    q1, k1, v1, vid, tensors = VV.varlen_variant(q, k, v, cu, opts)
    variant = V.lookup_variant(vid)
    generated = variant.score_mod_bwd.function()
    # aux0 the document table, aux1 the gain (the derivative shares the mod's slot)
    assert hasattr(generated, VARLEN_RUN) and variant.tensor_names[-2:] == ("aux0", "aux1")
    tensors = V.with_captured(variant, tensors)
    scale = 1 / math.sqrt(D)
    dq, dk, dv = (torch.full(t.shape, math.nan, dtype=t.dtype) for t in (q1, k1, v1))
    o_ref, l_ref = V.reference_forward(q1, k1, v1, variant, tensors, scale)
    io = BackwardTensors(q1, k1, v1, o_ref, dout.unsqueeze(0).transpose(1, 2), l_ref.float(), dq, dk, dv)
    for step in plan_backward_variant(io, VariantCall(variant, tensors, scale), score_mod_bwd=generated, encode=False):
        step.emulate()
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    want, _ = per_document(*exact, cu_q, cu_k, scale, dict(score_mod=mod), True)
    ref = torch.autograd.grad((want * dout.double()).sum(), exact)
    for name, mine, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        mine = mine[0].transpose(0, 1).double()
        assert torch.isfinite(mine).all(), name
        assert (mine - r).abs().max().item() <= 1.5e-2 * r.abs().max().item(), name


@pytest.mark.parametrize("kw, text", [
    (dict(score_mod_bwd=doc_bias_bwd), "score_mod_bwd expects a score_mod beside it"),
    (dict(score_mod=doc_bias, score_mod_bwd=lambda s, g: g), "score_mod_bwd expects a function (score, grad, b, h"),
    (dict(score_mod=lambda s, b, h, i, j, aux: s, aux=(torch.ones(2),), score_mod_bwd=doc_bias_bwd),
     "score_mod_bwd expects a function (score, grad, b, h, q_idx, kv_idx, aux)"),
])
def test_score_mod_bwd_errors_name_the_keyword_and_the_line(kw, text):
    q, k, v, _ = inputs(seed=6)
    for call in (lambda: run(q, k, v, **kw),
                 lambda: ty.attention(q[None].transpose(1, 2), k[None].transpose(1, 2), v[None].transpose(1, 2),
                                      enable_gqa=True, **kw)):
        with pytest.raises((TypeError, ValueError)) as info:
            call()
        msg = str(info.value)
        assert text in msg and ("test_attention_varlen_variants.py:" in msg or "attention_varlen_variant_cases.py:" in msg), msg


def test_bad_mods_name_the_argument_and_the_line():
    q, k, v, _ = inputs(seed=7)
    table = torch.zeros(10)

    def past(score, b, h, q_idx, kv_idx):
        return score + table[q_idx + 100]

    def distance(b, h, q_idx, kv_idx):
        return q_idx - kv_idx  # an integer, not a bool
    with pytest.raises(V.ModError) as info:
        run(q, k, v, score_mod=past)
    assert "score_mod" in str(info.value) and "table[q_idx + 100]" in str(info.value), str(info.value)
    with pytest.raises(V.ModError) as info:
        run(q, k, v, mask_mod=distance)
    assert "mask_mod expects a function returning bool" in str(info.value)
    assert "test_attention_varlen_variants.py" in str(info.value)


def test_untraceable_mod_on_packed_documents_names_the_argument_and_the_line():
    from tylopy_kernels.attention.sm90.forward_variant import attention_variant_fwd_sm90
    from tylopy_kernels.attention.sm90.variant_launch import ForwardTensors, VariantCall, plan_variant_launch

    def branchy(b, h, q_idx, kv_idx):
        if q_idx > kv_idx:  # a Python if on run-time values
            return True
        return False
    q, k, v, _ = inputs(seed=8, D=64, H=2, H_kv=1, dtype=torch.bfloat16)
    opts = dict(dict.fromkeys(VV.KEYWORDS), mask_mod=branchy, is_causal=False, causal_align="bottom_right")
    cu = (CU_Q, CU_K, torch.tensor(CU_Q, dtype=torch.int32), torch.tensor(CU_K, dtype=torch.int32))
    q1, k1, v1, vid, tensors = VV.varlen_variant(q, k, v, cu, opts)
    variant = V.lookup_variant(vid)
    out, lse = torch.empty(q1.shape, dtype=q.dtype), torch.empty(q1.shape[:3])
    plan = plan_variant_launch(ForwardTensors(q1, k1, v1, out, lse), VariantCall(variant, tensors, 0.125),
                               make_map=_spec)
    with pytest.raises(Exception) as info:
        attention_variant_fwd_sm90.emulate(*plan.args, grid=plan.grid, **plan.constexprs)
    text = str(info.value)
    assert "mask_mod" in text and "if q_idx > kv_idx" in text and "expects" in text, text


@pytest.mark.parametrize("kw, arg", [
    (dict(alibi_slopes=torch.ones(3, 4)), "alibi_slopes"), (dict(window_size=(1,)), "window_size"),
    (dict(softcap=-1.0), "softcap"), (dict(aux=(torch.ones(2),)), "aux"), (dict(softcap=2.0, seqused_q=torch.ones(6)), "seqused"),
    (dict(causal_align="middle"), "causal_align"), (dict(mask_mod=3), "mask_mod"),
    (dict(score_mod=lambda s, b, h, i, j, aux: s, aux=tuple(torch.ones(2) for _ in range(4))), "at most 3 tensors"),
])
def test_bad_keywords_name_the_keyword(kw, arg):
    q, k, v, _ = inputs(seed=9)
    with pytest.raises((TypeError, ValueError)) as info:
        run(q, k, v, **kw)
    assert arg in str(info.value), str(info.value)


def test_torch_compile_fullgraph_forward_and_backward():
    q, k, v, g = inputs(seed=10)
    cq, ck = torch.tensor(CU_Q, dtype=torch.int32), torch.tensor(CU_K, dtype=torch.int32)

    def f(q, k, v, cq, ck):
        return ty.attention_varlen(q, k, v, cq, ck, max(LENS_Q), max(LENS_K), is_causal=True, enable_gqa=True,
                                   window_size=(30, 0), softcap=6.0, score_mod=doc_bias, mask_mod=stripes)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = f(*leaves, cq, ck)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(*leaves, cq, ck)
    assert (got - want).abs().max().item() < 1e-12
    dout = torch.randn(got.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad((got * dout).sum(), leaves), torch.autograd.grad((want * dout).sum(), leaves)):
        assert (a - b).abs().max().item() < 1e-12


def test_torch_compile_takes_new_document_lengths_without_recompiling():
    """Totals and document counts change every step: after the first graph, one dynamic graph serves
    them all (the variant holds no lengths; the tables are an operator of the graph)."""
    import torch._dynamo.testing
    counter = torch._dynamo.testing.CompileCounter()

    def f(q, k, cu):
        return ty.attention_varlen(q, k, k, cu, cu, 64, 64, is_causal=True, window_size=(9, 0), softcap=6.0,
                                   score_mod=doc_bias)
    compiled = torch.compile(f, fullgraph=True, backend=counter)
    g = torch.Generator().manual_seed(12)
    for lens in ((5, 9, 3), (7, 1, 0, 4), (11, 2, 6, 1, 1)):
        cu = torch.tensor(prefix(lens), dtype=torch.int32)
        q, k = (packed(sum(lens), 2, 16, g, torch.float64) for _ in range(2))
        assert (compiled(q, k, cu) - f(q, k, cu)).abs().max().item() < 1e-12
    assert counter.frame_count <= 2


def test_variant_operators_keep_the_packed_strides_their_fakes_promise():
    """Packed documents reach the operators as (1, H, N, D) views of (N, H, D): the gradients keep
    those strides in the real and the fake operator alike (torch.compile's generated code checks the
    real strides against the fake's)."""
    from tylopy_kernels.attention import autograd_variants as AV
    g = torch.Generator().manual_seed(13)
    q, k, v = (packed(40, h, 16, g, torch.float64).unsqueeze(0).transpose(1, 2) for h in (4, 4, 4))
    vid, tensors = V.make_variant_id(1, 4, 40, 40, "cpu", V.VariantKeywords(is_causal=True, window_size=(5, 0),
                                                                           softcap=6.0))
    out, lse = AV.attention_variant_fwd(q, k, v, tensors, vid, 0.25, True)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    args = (dout, q, k, v, out, lse, tensors, vid, 0.25, None)
    grads = AV.attention_variant_bwd(*args)
    assert [t.stride() for t in grads[:3]] == [t.stride() for t in (q, k, v)]
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake[6] = [mode.from_tensor(t) for t in tensors]
        promised = AV.attention_variant_bwd(*fake)
    assert [t.stride() for t in promised[:3]] == [t.stride() for t in grads[:3]]
