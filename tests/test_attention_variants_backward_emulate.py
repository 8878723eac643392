"""The Hopper backward of programmable attention (``sm90/backward_variant.py``) in the emulator.

Every variant's dq, dk, dv (and dsinks) from the emulated launches against float64 autograd of
the torch reference (``variants.reference_backward``), at sizes where every tile is ragged
(N = 300, N_k = 430), head dims 64 and 128, grouped-query heads, NaN-filled gradient buffers; a
user-written score_mod whose derivative the kernel derives itself (print it with ``-s``); the
explicit ``score_mod_bwd`` (reading captured tensors and ``aux`` as the mod does); the errors for
mods that cannot be differentiated; the sink and float mask gradients; and the dense backward's
PTX, unchanged by the variant hooks.
"""
import inspect
import math

import pytest
import torch

import tylopy as ty
from tylopy_kernels.attention import variants as V
from tylopy_kernels.attention.sm90.backward_variant_launch import (BackwardTensors, ForwardTensors, VariantCall,
                                                                   float_mask_grad, launch_backward_variant,
                                                                   plan_backward_variant, sink_grad,
                                                                   supports)
from tylopy_kernels.attention.testing.variant_backward import check, variant_cases



def gated_bias(score, b, h, q_idx, kv_idx):
    """A smooth cap plus a per-head distance bias: neither is a built-in keyword."""
    return 30.0 * torch.tanh(score / 30.0) * (1.0 + 0.25 * h) - 0.01 * (q_idx - kv_idx)


def gated_bias_bwd(score, grad, b, h, q_idx, kv_idx):
    """The same mod's gradient written by hand (FlexAttention's convention: d mod / d score * grad)."""
    t = torch.tanh(score / 30.0)
    return grad * (1.0 - t * t) * (1.0 + 0.25 * h)


OPEN_DTYPES = dict(mask=ty.f32, aux0=ty.f32, aux1=ty.f32, aux2=ty.f32, aux3=ty.f32)  # to compile without arguments


def kernel_variant(variant, tensors=None):
    """The VARIANT constexpr of the kernels for ``variant`` (its tensors give the aux slots' ranks)."""
    from tylopy_kernels.attention.sm90.variant_launch import variant_args
    from tylopy_kernels.attention.sm90.variant_tiles import KernelVariant
    meta = [] if tensors is None else variant_args(variant, tensors, 1, 1, 1, 1, None)[1]
    return KernelVariant.of(variant, meta)


def inputs(B, H, H_kv, n_q, n_k, D, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    mk = (lambda *s: torch.randn(*s, generator=g).to(dtype))
    return mk(B, H, n_q, D), mk(B, H_kv, n_k, D), mk(B, H_kv, n_k, D), mk(B, H, n_q, D), g


def emulate_backward(q, k, v, dout, variant, tensors, scale, score_mod_bwd=None):
    """The launcher's steps (and its sink gradient from the statistics kernel's delta) in the emulator."""
    out, lse = V.reference_forward(q, k, v, variant, tensors, scale)
    dq, dk, dv = (torch.full_like(t, math.nan) for t in (q, k, v))
    dsinks = torch.full((q.shape[1],), math.nan)
    launch_backward_variant(BackwardTensors(q, k, v, out, dout, lse.float(), dq, dk, dv), dsinks,
                            VariantCall(variant, tensors, scale), score_mod_bwd=score_mod_bwd, emulate=True)
    got = dict(dq=dq, dk=dk, dv=dv)
    if variant.sinks:
        got["dsinks"] = dsinks
        assert torch.allclose(dsinks, sink_grad(dout, out, lse, tensors[variant.index("sinks")]).float(), rtol=1e-4,
                              atol=1e-5)
    return got


FAST = ["softcap", "score_mod", "sinks", "alibi-causal"]
ALL = list(variant_cases(torch.Generator(), 1, 1, 1, 1))


@pytest.mark.parametrize("name", FAST)
def test_variant_backward_small(name):
    B, H, H_kv, n_q, n_k, D = 1, 2, 1, 150, 200, 64
    q, k, v, dout, g = inputs(B, H, H_kv, n_q, n_k, D)
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, **variant_cases(g, B, H, n_q, n_k)[name])
    got = emulate_backward(q, k, v, dout, variant, tensors, 1 / math.sqrt(D))
    print(name, check(got, q, k, v, dout, variant, tensors, 1 / math.sqrt(D)))


def test_sink_gradient_is_summed_by_the_conversion():
    """With fp32 sinks the statistics kernel zeroes dsinks and the dQ conversion adds every 64-row
    tile's terms (two batches, ragged rows, a head dim with two column tiles): no torch pass."""
    B, H, H_kv, n_q, n_k, D = 2, 2, 1, 70, 90, 128
    q, k, v, dout, g = inputs(B, H, H_kv, n_q, n_k, D, seed=3)
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, sinks=torch.randn(H, generator=g) * 2, is_causal=True)
    out, lse = V.reference_forward(q, k, v, variant, tensors, 0.125)
    io = BackwardTensors(q, k, v, out, dout, lse.float(), *(torch.empty_like(t) for t in (q, k, v)))
    dsinks = torch.full((H,), math.nan)
    steps = plan_backward_variant(io, VariantCall(variant, tensors, 0.125), encode=False, dsinks=dsinks)
    assert steps[0].constexprs["SINKS"] and steps[-1].constexprs["SINKS"]
    for step in steps:
        step.emulate()
    want = sink_grad(dout, out, lse, tensors[variant.index("sinks")])
    assert torch.allclose(dsinks, want.float(), rtol=1e-5, atol=1e-6), (dsinks, want)


# Every run takes these at the ragged size (the combined case covers softcap, ALiBi and sinks; the
# float mask stands for the Boolean one, the two-sided window for the bottom-right one); the rest,
# like head dim 128, under the exhaustive marker.
RAGGED_EVERY_RUN = ("softcap-alibi-sinks-causal", "score_mod", "mask_mod", "window-both-sides", "float-mask",
                    "alibi-causal")


@pytest.mark.slow
@pytest.mark.parametrize("D", [64, pytest.param(128, marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("name", [n if n in RAGGED_EVERY_RUN else pytest.param(n, marks=pytest.mark.exhaustive)
                                  for n in ALL])
def test_variant_backward_ragged_gqa(name, D):
    B, H, H_kv, n_q, n_k = (2 if name in ("alibi-bh", "alibi-causal") else 1), 2, 1, 300, 430
    q, k, v, dout, g = inputs(B, H, H_kv, n_q, n_k, D, seed=D)
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, **variant_cases(g, B, H, n_q, n_k)[name])
    got = emulate_backward(q, k, v, dout, variant, tensors, 1 / math.sqrt(D))
    print(name, D, check(got, q, k, v, dout, variant, tensors, 1 / math.sqrt(D)))


def test_user_score_mod_gradient_is_derived_automatically():
    """The quotable example: ``gated_bias`` (above) has no hand-written derivative; the kernel takes
    d mod / d score from ``ty.value_and_derivative`` of its trace. Printed with ``-s``."""
    B, H, H_kv, n_q, n_k, D = 1, 2, 2, 150, 200, 64
    q, k, v, dout, _ = inputs(B, H, H_kv, n_q, n_k, D, seed=3)
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, score_mod=gated_bias)
    scale = 1 / math.sqrt(D)
    auto = emulate_backward(q, k, v, dout, variant, tensors, scale)
    summary = check(auto, q, k, v, dout, variant, tensors, scale)
    print("\n" + inspect.getsource(gated_bias))
    print(f"its gradient, derived in the kernel, against float64 autograd: {summary}")
    explicit = emulate_backward(q, k, v, dout, variant, tensors, scale, score_mod_bwd=gated_bias_bwd)
    check(explicit, q, k, v, dout, variant, tensors, scale)
    for name in ("dq", "dk", "dv"):  # the two derivatives agree to f32 rounding, hence bf16 results nearly
        diff = (auto[name].float() - explicit[name].float()).abs().max().item()
        assert diff <= 2 ** -7 * auto[name].float().abs().max().item(), name


def dsl(x):
    """The DSL value under a traced mod's argument (a mod written with ty.* functions uses it)."""
    return getattr(x, "v", x)


def bitcast_mod(score, b, h, q_idx, kv_idx):
    return ty.bitcast(ty.bitcast(dsl(score), ty.u32) & 0xFFFF0000, ty.f32)


def neighbour_mod(score, b, h, q_idx, kv_idx):
    return (dsl(score) + ty.shfl_xor(dsl(score), 1)) * 0.5     # a shuffle: no derivative rule


def packing_mod(score, b, h, q_idx, kv_idx):
    lo, hi = ty.unpack2(ty.pack2(dsl(score), dsl(score), ty.bf16), ty.bf16)
    return lo


@pytest.mark.parametrize("mod, op", [(bitcast_mod, "the op 'bitcast'"), (neighbour_mod, "the op 'shfl'"),
                                     (packing_mod, "the op 'pack2'")], ids=["bitcast", "shuffle", "pack2"])
def test_mods_without_a_derivative_are_errors_naming_the_op_and_line(mod, op):
    from tylopy_kernels.attention.sm90.backward_variant import attention_bwd_variant_sm90
    variant, _ = V.make_variant(1, 2, 100, 100, None, score_mod=mod)
    with pytest.raises(ty.KernelSourceError) as e:
        attention_bwd_variant_sm90.traced(VARIANT=kernel_variant(variant), **OPEN_DTYPES)
    text = str(e.value)
    print("\n" + text)
    assert op in text and f"in {mod.__name__}" in text and "test_attention_variants_backward_emulate.py" in text


def test_sink_and_float_mask_gradients_are_exact():
    """d sink and d attn_mask (torch, from the LSE) against float64 autograd of the reference."""
    B, H, n_q, n_k, D = 2, 3, 37, 53, 64
    q, k, v, dout, g = inputs(B, H, H, n_q, n_k, D, dtype=torch.float64)
    sinks = torch.randn(H, generator=g, dtype=torch.float64)
    mask = torch.randn(1, H, 1, n_k, generator=g, dtype=torch.float64, requires_grad=True)
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, sinks=sinks.float(), attn_mask=mask.detach(),
                                      softcap=5.0, is_causal=False)
    tensors = [t.double() for t in tensors]
    out, lse = V.reference_forward(q, k, v, variant, tensors, 0.125)
    ds = sink_grad(dout, out, lse, tensors[variant.index("sinks")])
    dm = float_mask_grad(ForwardTensors(q, k, v, out, lse), dout, VariantCall(variant, tensors, 0.125))
    leaves = [tensors[variant.index("sinks")].clone().requires_grad_(), mask]
    ts = list(tensors)
    ts[variant.index("sinks")] = leaves[0]
    ts[variant.index("attn_mask")] = mask.expand(B, H, n_q, n_k)
    o, _ = V.reference_forward(q, k, v, variant, ts, 0.125)
    want_s, want_m = torch.autograd.grad((o * dout).sum(), leaves)
    assert torch.allclose(ds.double(), want_s, atol=1e-5, rtol=1e-4)
    assert torch.allclose(dm.double().sum(dim=(0, 2), keepdim=True), want_m, atol=1e-5, rtol=1e-4)


def _instructions(ptx):
    lines = (ln.split("//")[0].rstrip() for ln in ptx.splitlines())
    return [ln for ln in lines if ln and not ln.lstrip().startswith((".loc", ".file"))]


@pytest.mark.slow
@pytest.mark.parametrize("cx", [dict(HEAD_DIM=64, BLOCK_M=128), dict(HEAD_DIM=128, BLOCK_M=64, HAS_MASK=True,
                                                                         DQ="atomic", DQ_ORDER="serial")],
                         ids=["D64", "D128-mask-atomic"])
def test_dense_backward_ptx_does_not_change_with_the_variant_hooks(cx, monkeypatch, tmp_path):
    """The hooks (``Problem.variant`` branches) emit nothing for a dense problem: the kernel compiled
    from backward.py with every hook cut out of its source gives the same instructions."""
    import importlib.util
    import re
    from tylopy_kernels.attention.sm90 import backward
    monkeypatch.setenv("TYLOPY_CACHE", "0")
    with_hooks = backward.attention_bwd_sm90.compile(**cx).ptx
    src = inspect.getsource(backward)
    cut = re.sub(r"\n    if prob\.variant is not None:\n        return [^\n]*\n", "\n", src)
    cut = cut.replace("    if prob.variant is None:\n", "    if True:\n")
    cut = cut.replace('getattr(prob.variant, "early_stats", None)', "None")
    assert cut.count("prob.variant") == 1, "the hooks changed: update this test"  # the else branch is dead
    path = tmp_path / "backward_without_hooks.py"
    path.write_text(cut)
    spec = importlib.util.spec_from_file_location("backward_without_hooks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    without = mod.attention_bwd_sm90.compile(**cx).ptx
    assert _instructions(with_hooks) == _instructions(without)


SPILLS = pytest.mark.xfail(strict=True, reason="8-52 bytes of spills: float masks (a tile's mask values loaded ahead), "
                           "ALiBi with a two-sided window at head dim 128, and the Boolean mask at head dim 128 (dK "
                           "and dV hold 128 of the 240 registers)")


@pytest.mark.slow
@pytest.mark.parametrize("D", [64, pytest.param(128, marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("name", ["softcap", "alibi-window", "alibi-causal", "alibi-sinks-causal", "score_mod-sinks",
                                  "mask_mod-block", "bool-mask", "float-mask"])
def test_variant_backward_assembles_without_spills(name, D, request):
    """In the dQ order the launcher picks (``dq_order``): "early" for folded ALiBi at D=64."""
    if name == "float-mask" or (D == 128 and name in ("bool-mask", "alibi-window")):
        request.applymarker(SPILLS)
    from tylopy_kernels.attention.block_mask import create_block_mask
    from tylopy_kernels.attention.sm90.backward_variant import attention_bwd_variant_sm90
    kw = {"softcap": dict(softcap=10.0), "alibi-window": dict(alibi_slopes=torch.rand(2), window_size=(10, 10)),
          "alibi-causal": dict(alibi_slopes=torch.rand(2), is_causal=True),
          "alibi-sinks-causal": dict(alibi_slopes=torch.rand(2), sinks=torch.rand(2), is_causal=True),
          "score_mod-sinks": dict(score_mod=gated_bias, sinks=torch.rand(2)),
          "mask_mod-block": dict(block_mask=create_block_mask(lambda b, h, q, kv: kv <= q, 1, 1, 256, 256)),
          "bool-mask": dict(attn_mask=torch.rand(256, 256) > 0.5),
          "float-mask": dict(attn_mask=torch.randn(256, 256))}[name]
    variant, _ = V.make_variant(1, 2, 256, 256, None, **kw)
    from tylopy_kernels.attention.sm90.backward_variant_launch import dq_order
    bool_mask = variant.attn_mask == "bool"  # (the launcher's Boolean-mask schedule is "serial")
    cx = dict(HEAD_DIM=D, BLOCK_M=128 if D == 64 else 64, HAS_MASK=bool_mask,
              DQ_ORDER="serial" if bool_mask else dq_order(variant, D, 256, 256))
    from tylopy_kernels.attention.sm90.variant_tiles import KernelVariant
    kv = KernelVariant.of(variant, [], n_q=256, n_k=256, fold_alibi=D == 64)  # (as the launcher makes it)
    report = attention_bwd_variant_sm90.compile(VARIANT=kv, **cx, **OPEN_DTYPES).report
    assert report.spill_stores == 0 and report.spill_loads == 0, str(report)


def test_supports_names_what_the_kernel_takes():
    q = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)
    plain, _ = V.make_variant(1, 2, 8, 8, None, softcap=3.0)
    t = [torch.zeros(8) for _ in range(5)]
    too_many, _ = V.make_variant(1, 2, 8, 8, None, score_mod=lambda s, b, h, i, j: s + t[0][i], aux=tuple(t))
    assert supports(q, q, q, plain) and not supports(q, q, q, too_many)


BIAS = torch.randn(4, 64, generator=torch.Generator().manual_seed(9))   # a learned-looking (head, distance) table


def table_bias(score, b, h, q_idx, kv_idx):
    """A score_mod reading a captured tensor by index: a relative-position bias per head."""
    return score * 0.9 + BIAS[h, torch.clamp(q_idx - kv_idx, 0, 63)]


def test_score_mod_reading_a_captured_table():
    B, H, H_kv, n_q, n_k, D = 1, 4, 2, 150, 200, 64
    q, k, v, dout, _ = inputs(B, H, H_kv, n_q, n_k, D, seed=4)
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, score_mod=table_bias, is_causal=True,
                                      causal_align="bottom_right")
    got = emulate_backward(q, k, v, dout, variant, tensors, 1 / math.sqrt(D))
    print(check(got, q, k, v, dout, variant, tensors, 1 / math.sqrt(D)))


GAIN = torch.rand(2, generator=torch.Generator().manual_seed(7)) + 0.5   # per head: read by a mod and its derivative
GAIN_COPY = GAIN.clone()   # another tensor of the same values (its own slot)


def gain_mod(score, b, h, q_idx, kv_idx):
    return score * GAIN[h] - 0.01 * (q_idx - kv_idx)


def gain_bwd(score, grad, b, h, q_idx, kv_idx):
    """The derivative reads the mod's global tensor: it shares the mod's slot (and load)."""
    return grad * GAIN[h]


def gain_copy_bwd(score, grad, b, h, q_idx, kv_idx):
    return grad * GAIN_COPY[h]


def gain_mod_aux(score, b, h, q_idx, kv_idx, aux):
    return score * aux[0][h] - 0.01 * (q_idx - kv_idx)


def gain_bwd_aux(score, grad, b, h, q_idx, kv_idx, aux):
    return grad * aux[0][h]


@pytest.mark.parametrize("via", ["captured", "own-slot", "aux"])
def test_score_mod_bwd_reads_captured_tensors_and_aux(via):
    """The user's score_mod_bwd traced like the mod: a per-head gain read from the tensor the mod
    captures (the mod's slot), from another captured tensor (a slot of its own after the mod's) or
    from ``aux`` (the seventh argument); float64 gradients of the mod."""
    B, H, H_kv, n_q, n_k, D = 1, 2, 1, 150, 200, 64
    q, k, v, dout, _ = inputs(B, H, H_kv, n_q, n_k, D, seed=6)
    mods = {"captured": dict(score_mod=gain_mod, score_mod_bwd=gain_bwd),
            "own-slot": dict(score_mod=gain_mod, score_mod_bwd=gain_copy_bwd),
            "aux": dict(score_mod=gain_mod_aux, score_mod_bwd=gain_bwd_aux, aux=(GAIN,))}[via]
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, **mods)
    assert variant.tensor_names == (("aux0", "aux1") if via == "own-slot" else ("aux0",))
    assert len(V.with_captured(variant, tensors)) == len(variant.tensor_names)
    scale = 1 / math.sqrt(D)
    got = emulate_backward(q, k, v, dout, variant, tensors, scale, score_mod_bwd=variant.score_mod_bwd.function())
    plain, plain_tensors = V.make_variant(B, H, n_q, n_k, q.device, **{a: t for a, t in mods.items()
                                                                          if a != "score_mod_bwd"})
    print(via, check(got, q, k, v, dout, plain, plain_tensors, scale))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autograd_gives_sink_and_float_mask_gradients(compiled):
    """Through ``tylopy.attention`` (the CPU reference path): gradients of q, k, v, sinks and a
    broadcast float mask match float64 autograd of the reference, eager and under
    ``torch.compile(fullgraph=True, backend="aot_eager")``; ALiBi slopes get none (constants)."""
    import warnings
    B, H, n_q, n_k, D = 1, 2, 9, 13, 64
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=torch.float64).requires_grad_() for n in (n_q, n_k, n_k))
    sinks = torch.randn(H, generator=g).requires_grad_()
    mask = torch.randn(1, 1, n_q, n_k, generator=g).requires_grad_()
    slopes = torch.rand(H, generator=g)

    def f(q, k, v, sinks, mask):
        return ty.attention(q, k, v, attn_mask=mask, sinks=sinks, alibi_slopes=slopes, softcap=4.0)

    leaves = (q, k, v, sinks, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = torch.compile(f, fullgraph=True, backend="aot_eager") if compiled else f
        got = torch.autograd.grad(fn(*leaves).sum(), leaves)
    variant, tensors = V.make_variant(B, H, n_q, n_k, q.device, attn_mask=mask.detach().double(),
                                      sinks=sinks.detach(), alibi_slopes=slopes, softcap=4.0)
    ts = [t.double() for t in tensors]
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    ts[variant.index("sinks")] = ref_leaves[3]
    ts[variant.index("attn_mask")] = ref_leaves[4].expand(B, H, n_q, n_k)
    ts[variant.index("alibi_slopes")] = slopes.double()
    o, _ = V.reference_forward(*ref_leaves[:3], variant, ts, 1 / math.sqrt(D))
    want = torch.autograd.grad(o.sum(), ref_leaves)
    for name, b, w in zip(("dq", "dk", "dv", "dsinks", "dmask"), got, want):
        assert b is not None, name
        assert torch.allclose(b.double(), w, atol=1e-5, rtol=1e-4), name


def test_window_backward_reads_only_the_query_tiles_of_its_band():
    """A key tile walks only the query tiles its window reaches: with NaN in the Q and dO rows no
    key of the first tile can see, that tile's dK and dV stay finite (visiting one of those query
    tiles would add 0 x NaN), while the keys that do see them turn NaN."""
    B, H, n, D = 1, 1, 512, 64
    q, k, v, dout, g = inputs(B, H, H, n, n, D, seed=5)
    q[:, :, 320:] = math.nan
    dout[:, :, 320:] = math.nan
    variant, tensors = V.make_variant(B, H, n, n, q.device, is_causal=True, window_size=(64, 0))
    got = emulate_backward(q, k, v, dout, variant, tensors, 1 / math.sqrt(D))
    assert torch.isfinite(got["dk"][:, :, :128]).all() and torch.isfinite(got["dv"][:, :, :128]).all()
    assert not torch.isfinite(got["dk"][:, :, 384:]).all()


@pytest.mark.slow
def test_document_block_mask_backward_skips_masks_on_full_tiles():
    """Packed documents as a mask_mod with its block mask: full tiles (a document over two 128-tiles)
    take the plain element path, partial ones the masks, empty ones are never listed; the last
    query and key tiles are ragged (N = 392) and the ring wraps (several query tiles per key tile)."""
    from tylopy_kernels.attention.block_mask import create_block_mask
    B, H, H_kv, n, D = 1, 2, 1, 392, 64
    doc = torch.tensor([0] * 260 + [1] * 132)

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

    q, k, v, dout, g = inputs(B, H, H_kv, n, n, D, seed=3)
    bm = create_block_mask(document, 1, 1, n, n)
    variant, tensors = V.make_variant(B, H, n, n, q.device, mask_mod=document, block_mask=bm)
    got = emulate_backward(q, k, v, dout, variant, tensors, 1 / math.sqrt(D))
    print(check(got, q, k, v, dout, variant, tensors, 1 / math.sqrt(D)))


def test_work_lists_are_kept_per_block_mask_and_rebuilt_when_it_changes():
    """The backward's per-key-tile work list of a block mask is built once per mask (the same tensors,
    unmodified) and again when the mask's tensors change in place or are other tensors."""
    from tylopy_kernels.attention.sm90.backward_variant_launch import WorkShape, kept_work_list, work_list
    from tylopy_kernels.attention.block_mask import create_block_mask
    bm = create_block_mask(lambda b, h, q, kv: (q // 128) >= (kv // 128), 1, 1, 384, 384)
    variant, tensors = V.make_variant(1, 2, 384, 384, torch.device("cpu"), mask_mod=lambda b, h, q, kv: q >= kv,
                                      block_mask=bm)
    shape = WorkShape(1, 2, 1, 384, 384)
    first = kept_work_list(variant, tensors, shape, 64)
    again = kept_work_list(variant, tensors, shape, 64)
    assert again[0] is first[0] and again[1] is first[1]
    fresh = work_list(variant, tensors, shape, 64)
    assert torch.equal(fresh[0], first[0]) and torch.equal(fresh[1], first[1])
    assert kept_work_list(variant, tensors, WorkShape(1, 2, 1, 384, 384), 128)[0] is not first[0]  # other tiles
    counts = tensors[variant.index("full_kv_num_blocks")]
    counts[0, 0, 0] = 0                                  # an in-place change of the mask
    changed = kept_work_list(variant, tensors, shape, 64)
    assert changed[0] is not first[0] and not torch.equal(changed[1], first[1])
