"""The Hopper variant forward (``sm90/forward_variant.py``) in the emulator against the float64
reference of ``variants.py``, at sizes where the K/V ring wraps and the last query and key tiles
are ragged (N = 300, N_k = 430: 3 query tiles, 4 key tiles through 2 stages), D = 64 and 128,
grouped-query heads, with NaN in the memory past every end of K and V. Also: the three kinds of
bad mods and their messages, the dense kernel's PTX with the variant hooks, and ptxas (no spills)
for each builtin variant.
"""
import math

import pytest
import torch

import tylopy as ty
from tylopy.runtime.tensormap import TensorMapSpec
from tylopy_kernels.attention import variants as V
from tylopy_kernels.attention.sm90.forward_variant import attention_variant_fwd_sm90
from tylopy_kernels.attention.sm90.variant_launch import ForwardTensors, VariantCall, plan_variant_launch

N, NK = 300, 430


def _spec(t, dims, strides, box):
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "bf16" if t.dtype == torch.bfloat16 else "f16",
                         128)


def _nan_backed(shape, seed, dtype=torch.bfloat16, pad=64):
    """A fresh random (B, H, n, D) view whose storage holds NaN past the last row of each head."""
    B, H, n, D = shape
    g = torch.Generator().manual_seed(seed)
    buf = torch.full((B, H, n + pad, D), float("nan"), dtype=dtype)
    buf[:, :, :n] = torch.randn(B, H, n, D, generator=g).to(dtype)
    return buf[:, :, :n]


def emulate(q, k, v, scale=None, schedule=None, sched_seed=None, **kw):
    """(out, lse, variant, tensors): the kernel in the emulator; out and lse start NaN.
    ``sched_seed``: the emulator's random warp order (None: round robin)."""
    B, H, n, D = q.shape
    scale = 1 / math.sqrt(D) if scale is None else scale
    variant, tensors = V.make_variant(B, H, n, k.shape[2], q.device, **kw)
    out = torch.full((B, H, n, D), float("nan"), dtype=q.dtype)
    lse = torch.full((B, H, n), float("nan"))
    plan = plan_variant_launch(ForwardTensors(q, k, v, out, lse), VariantCall(variant, tensors, scale), make_map=_spec,
                               schedule=schedule)
    attention_variant_fwd_sm90.emulate(*plan.args, grid=plan.grid, seed=sched_seed, **plan.constexprs)
    return out, lse, variant, tensors


def check(q, k, v, scale=None, tol=2e-2, schedule=None, sched_seed=None, **kw):
    out, lse, variant, tensors = emulate(q, k, v, scale, schedule, sched_seed, **kw)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    want, want_lse = V.reference_forward(q.double(), k.double(), v.double(), variant, tensors, scale)
    assert not torch.isnan(out).any(), "NaN in the output"
    err = (out.double() - want).abs().max().item()
    assert err <= tol * v.double().abs().max().item(), f"max error {err:.3e}"
    same_inf = torch.isinf(want_lse) == torch.isinf(lse)
    assert same_inf.all() and (lse[torch.isinf(lse)] < 0).all(), "LSE -inf where no key takes part, only there"
    finite = ~torch.isinf(want_lse)
    lerr = (lse.double()[finite] - want_lse[finite]).abs().max().item() if finite.any() else 0.0
    assert lerr <= 2e-4 * max(1.0, want_lse[finite].abs().max().item()), f"LSE error {lerr:.3e}"
    return out, lse


def qkv(B=1, H=2, Hkv=1, n=N, nk=NK, D=64, seed=0):
    return (_nan_backed((B, H, n, D), seed), _nan_backed((B, Hkv, nk, D), seed + 1),
            _nan_backed((B, Hkv, nk, D), seed + 2))


def _doc_ids(n, bounds=(200, 300)):
    """Document ids of n packed tokens, documents starting at 0 and at ``bounds`` (ragged vs. the tiles)."""
    i = torch.arange(n)
    return sum((i >= x).to(torch.int32) for x in bounds)


# -- builtins --------------------------------------------------------------------------------------------

def test_window_causal_gqa_d64():
    """Window (100 back) under top-left causal masking: key tiles outside every row's range are not loaded."""
    check(*qkv(D=64), is_causal=True, window_size=(100, 0))


@pytest.mark.slow
def test_softcap_bottom_right_causal_d128():
    check(*qkv(D=128, H=2, Hkv=2, seed=3), is_causal=True, causal_align="bottom_right", softcap=5.0)


@pytest.mark.slow
def test_alibi_per_batch_and_head_with_sinks_d64():
    B, H = 2, 2
    slopes = torch.tensor([[0.5, 0.25], [0.125, 1.0]])
    check(*qkv(B=B, H=H, Hkv=1, D=64, seed=6), alibi_slopes=slopes, sinks=torch.tensor([0.3, 2.0]))


@pytest.mark.slow
def test_alibi_distances_convert_without_cvt_below_2_to_the_22():
    """ALiBi's |row + N_k - N - col| reaches the f32 score by the exponent trick (no cvt per score);
    sequences of 2^22 tokens or more take a specialization that converts with cvt. (Non-causal: the
    causal forward folds ALiBi instead, below.)"""
    from tylopy_kernels.attention.sm90.variant_launch import open_dtypes
    from tylopy_kernels.attention.sm90.variant_tiles import WIDE_POSITIONS, KernelVariant
    q = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    variant, tensors = V.make_variant(1, 2, 256, 256, q.device, alibi_slopes=torch.ones(2))
    plan = plan_variant_launch(ForwardTensors(q, q, q, q.clone(), torch.zeros(1, 2, 256)),
                               VariantCall(variant, tensors, 0.125), make_map=_spec)
    cx = dict(plan.constexprs)
    assert not cx["VARIANT"].wide_positions and not cx["VARIANT"].alibi_fold
    wide = KernelVariant.of(variant, [], n_q=256, n_k=WIDE_POSITIONS)
    assert wide.wide_positions and wide != cx["VARIANT"]
    assert wide.__tylopy_fingerprint__() != cx["VARIANT"].__tylopy_fingerprint__()
    counts = []
    for kv in (cx["VARIANT"], wide):
        cx["VARIANT"] = kv
        counts.append(attention_variant_fwd_sm90.compile(**cx, **open_dtypes(plan)).ptx.count("cvt.rn.f32.s32"))
    assert counts[0] == 0 and counts[1] >= 64


@pytest.mark.parametrize("causal, align, n, nk, window, fold", [
    (True, "top_left", 256, 256, None, True), (True, "top_left", 300, 200, None, False),
    (True, "bottom_right", 300, 200, None, True), (False, "top_left", 256, 256, (-1, 0), True),
    (False, "top_left", 256, 256, (-1, 3), False), (True, "top_left", 256, 256, (4096, 4096), True)])
def test_alibi_folds_where_every_visible_key_is_left_of_its_zero(causal, align, n, nk, window, fold):
    from tylopy_kernels.attention.sm90.variant_tiles import KernelVariant, alibi_foldable
    kw = dict(is_causal=causal, causal_align=align, alibi_slopes=torch.ones(2))
    if window is not None:
        kw["window_size"] = window
    variant, _ = V.make_variant(1, 2, n, nk, "cpu", **kw)
    assert alibi_foldable(variant, n, nk) is fold
    kv = KernelVariant.of(variant, [], n_q=n, n_k=nk, fold_alibi=True)
    assert kv.alibi_fold is fold and KernelVariant.of(variant, [], n_q=n, n_k=nk).alibi_fold is False


@pytest.mark.slow
@pytest.mark.parametrize("D, extra", [(64, {}), (128, dict(causal_align="bottom_right"))])
def test_alibi_folded_causal_with_sinks_lse_and_ragged_tiles(D, extra):
    """Causal ALiBi with the row part kept out of the softmax: the output, the LSE (the row part taken
    off again) and the sinks (compared with the shifted scores) match the float64 reference; the
    kernel has no cvt per score (one per tile and one per row at most)."""
    slopes = torch.tensor([[0.75, 0.0625]])
    q, k, v = qkv(H=2, Hkv=1, D=D, seed=21)
    check(q, k, v, is_causal=True, alibi_slopes=slopes, sinks=torch.tensor([0.5, -1.0]), **extra)
    out, lse, variant, tensors = emulate(q, k, v, is_causal=True, alibi_slopes=slopes, **extra)
    assert variant.alibi


@pytest.mark.slow
def test_alibi_folded_with_softcap_and_window_d64():
    check(*qkv(D=64, H=2, Hkv=2, seed=23), is_causal=True, window_size=(150, 0), softcap=4.0,
          alibi_slopes=torch.tensor([0.3, 0.05]))


def test_folded_alibi_takes_no_cvt_per_score():
    from tylopy_kernels.attention.sm90.variant_launch import open_dtypes
    q = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    variant, tensors = V.make_variant(1, 2, 256, 256, q.device, is_causal=True, alibi_slopes=torch.ones(2))
    plan = plan_variant_launch(ForwardTensors(q, q, q, q.clone(), torch.zeros(1, 2, 256)),
                               VariantCall(variant, tensors, 0.125), make_map=_spec)
    assert plan.constexprs["VARIANT"].alibi_fold
    ptx = attention_variant_fwd_sm90.compile(**plan.constexprs, **open_dtypes(plan)).ptx
    assert ptx.count("cvt.rn.f32.s32") <= 8


@pytest.mark.slow
def test_float_mask_broadcast_d64():
    g = torch.Generator().manual_seed(9)
    check(*qkv(D=64, seed=9), attn_mask=torch.randn(N, NK, generator=g))


@pytest.mark.slow
def test_bool_mask_per_head_window_both_sides_d128():
    g = torch.Generator().manual_seed(11)
    mask = torch.rand(1, 2, N, NK, generator=g) > 0.4
    check(*qkv(D=128, H=2, Hkv=2, seed=11), attn_mask=mask, window_size=(150, 40))


def test_rows_without_keys_give_zero_and_lse_minus_inf():
    """Bottom-right causal with N > N_k: the first N - N_k rows see no key (output 0, LSE -inf),
    and whole query tiles visit no key tile at all."""
    out, lse = check(*qkv(n=430, nk=100, D=64, seed=13), is_causal=True, causal_align="bottom_right")
    assert (out[:, :, :330] == 0).all() and torch.isinf(lse[:, :, :330]).all()


@pytest.mark.slow
def test_negative_scale_with_window_scales_first():
    check(*qkv(D=64, seed=15), scale=-0.1, window_size=(64, 64))


# -- user mods -------------------------------------------------------------------------------------------

def test_score_mod_with_captured_tensor_d64():
    """A score_mod reading a per-head bias it captures (a kernel tensor parameter), torch.where and tanh."""
    bias = torch.tensor([0.5, -1.5])

    def biased(score, b, h, q_idx, kv_idx):
        return 4.0 * torch.tanh(score / 4.0) + torch.where(q_idx >= kv_idx, bias[h], 0.0)
    check(*qkv(D=64, seed=17), score_mod=biased)


def test_document_mask_mod_with_block_mask_d64():
    """mask_mod over document ids (captured int32 tensor) with its block mask: only listed key tiles
    are visited, mask_mod runs on the partial ones."""
    doc = _doc_ids(NK)

    def document(b, h, q_idx, kv_idx):
        return doc[torch.clamp(q_idx, max=NK - 1)] == doc[kv_idx]
    bm = ty.create_block_mask(document, 1, 1, N, NK)
    assert bm.full_kv_num_blocks.sum() > 0 and bm.kv_num_blocks.sum() > 0
    check(*qkv(D=64, seed=19), mask_mod=document, block_mask=bm)


@pytest.mark.slow
def test_block_mask_with_empty_query_tiles_and_sinks_d128():
    """A block mask leaving query tile 1 without any key tile: its rows give 0 and LSE = the sink."""
    def checker(b, h, q_idx, kv_idx):
        return ((q_idx // 128) != 1) & (((q_idx // 128) + (kv_idx // 128)) % 2 == 0)
    bm = ty.create_block_mask(checker, None, 2, N, NK)
    assert int(bm.kv_num_blocks[0, 0, 1] + bm.full_kv_num_blocks[0, 0, 1]) == 0
    sinks = torch.tensor([0.3, -1.0])
    out, lse = check(*qkv(D=128, H=2, Hkv=2, seed=21), block_mask=bm, sinks=sinks)
    assert (out[:, :, 128:256] == 0).all()
    assert torch.allclose(lse[0, :, 128:256], sinks[:, None].expand(2, 128))


PERSISTENT = {"PERSISTENT": True, "SM_COUNT": 2}   # two CTAs: each loops over several tiles, the ring wraps


@pytest.mark.slow
def test_persistent_window_over_batches_and_heads_d64():
    """PERSISTENT: two CTAs walk 12 work tiles (2 batches x 2 heads x 3 query blocks), each tile a
    different key range, the ring and the Q buffer running on across tiles."""
    check(*qkv(B=2, D=64, seed=31), is_causal=True, window_size=(100, 20), schedule=PERSISTENT)


@pytest.mark.slow
@pytest.mark.parametrize("sched_seed", [None, 1])
def test_persistent_tiles_without_keys_between_others_d64(sched_seed):
    """PERSISTENT with a block mask leaving query tile 1 without keys: that tile writes zeros and the
    sink's LSE without a Q load, and still turns the Q buffer's barriers for the tiles after it (also
    under a random warp order, where a consumer's warps reach the skipped tile's wait at different
    times)."""
    def checker(b, h, q_idx, kv_idx):
        return ((q_idx // 128) != 1) & (((q_idx // 128) + (kv_idx // 128)) % 2 == 0)
    bm = ty.create_block_mask(checker, None, 2, N, NK)
    sinks = torch.tensor([0.3, -1.0])
    out, lse = check(*qkv(D=64, H=2, Hkv=1, seed=33), block_mask=bm, sinks=sinks, schedule=PERSISTENT,
                     sched_seed=sched_seed)
    assert (out[:, :, 128:256] == 0).all()
    assert torch.allclose(lse[0, :, 128:256], sinks[:, None].expand(2, 128))


def test_persistent_grid_and_unknown_schedule_keys():
    q = torch.zeros(1, 2, 300, 64, dtype=torch.bfloat16)
    variant, tensors = V.make_variant(1, 2, 300, 300, q.device, is_causal=True)
    io = ForwardTensors(q, q, q, q.clone(), torch.zeros(1, 2, 300))
    plan = plan_variant_launch(io, VariantCall(variant, tensors, 0.1), make_map=_spec, schedule=dict(PERSISTENT))
    assert plan.grid == (2,) and plan.constexprs["PERSISTENT"] is True and "SM_COUNT" not in plan.constexprs
    default = plan_variant_launch(io, VariantCall(variant, tensors, 0.1), make_map=_spec)
    assert default.grid == (2, 2, 1) and default.constexprs["CONSUMERS"] == 3  # D=64 causal: query tiles of 192
    two = plan_variant_launch(io, VariantCall(variant, tensors, 0.1), make_map=_spec, schedule={"CONSUMERS": 2})
    assert two.grid == (3, 2, 1)
    with pytest.raises(ValueError, match="schedule expects keys among"):
        plan_variant_launch(io, VariantCall(variant, tensors, 0.1), make_map=_spec, schedule={"STAGE": 3})


@pytest.mark.parametrize("case", [
    dict(is_causal=True, window_size=(100, 0)),
    dict(causal_align="bottom_right", window_size=(64, 32)),
    dict(window_size=(40, 300), schedule={"BLOCK_N": 64}),  # more tiles passed after a consumer's range than stages
    dict(n=430, nk=300, is_causal=True, causal_align="bottom_right", sinks=True),  # rows that see no key
    dict(B=2, seed=31, is_causal=True, window_size=(100, 20), schedule=PERSISTENT),
    dict(n=430, nk=300, is_causal=True, causal_align="bottom_right", window_size=(10, 0), schedule=PERSISTENT),
], ids=["window", "window-both", "long-pass", "no-key-rows", "persistent", "persistent-no-key-rows"])
def test_three_consumers_pass_tiles_their_rows_do_not_see(case):
    """Query tiles of 192 rows (D=64's default): each consumer computes only the key tiles its 64 rows
    see and passes the others (the turn goes on, the stages are given back once landed)."""
    case = dict(case)
    sched = dict(case.pop("schedule", {}), CONSUMERS=3)
    shape = {k: case.pop(k) for k in ("B", "n", "nk", "seed") if k in case}
    if case.pop("sinks", False):
        case["sinks"] = torch.randn(2, generator=torch.Generator().manual_seed(9))
    check(*qkv(D=64, **shape), schedule=sched, **case)


def test_default_schedules():
    """What each kind of variant launches with by default (``variant_launch.default_schedule``), and a
    block mask refusing query tiles of another size than its own."""
    from tylopy_kernels.attention.sm90.variant_launch import SCHEDULE, default_schedule

    def sched(D, **kw):
        return default_schedule(V.make_variant(1, 2, 300, 300, "cpu", **kw)[0], D, 300, 300)
    assert sched(64, is_causal=True, window_size=(100, 0)) == dict(SCHEDULE, CONSUMERS=3)
    assert sched(128, is_causal=True, window_size=(100, 0))["PERSISTENT"] is True
    assert sched(128, window_size=(100, 100))["PERSISTENT"] is True
    assert sched(128, is_causal=True, softcap=30.0) == {**sched(128, is_causal=True), "PERSISTENT": False}
    assert sched(64, is_causal=True, softcap=30.0, sinks=torch.zeros(2))["CONSUMERS"] == 3
    assert sched(128, is_causal=True, softcap=30.0)["CONSUMERS"] == 2
    for kw in (dict(alibi_slopes=torch.ones(2)), dict(attn_mask=torch.zeros(300, 300)),
               dict(score_mod=lambda s, b, h, q, k: s * 2.0)):
        assert sched(64, **kw)["CONSUMERS"] == 2, kw
    assert sched(64, is_causal=True, alibi_slopes=torch.ones(2))["CONSUMERS"] == 3  # (folded: no spills)
    unfolded = V.make_variant(1, 2, 300, 200, "cpu", is_causal=True, alibi_slopes=torch.ones(2))[0]
    assert default_schedule(unfolded, 64, 300, 200)["CONSUMERS"] == 2  # (top-left, N > N_k: keys right of 0)
    q = torch.zeros(1, 2, 300, 64, dtype=torch.bfloat16)
    mod = _doc_mod()
    variant, tensors = V.make_variant(1, 2, 300, 300, q.device, mask_mod=mod,
                                      block_mask=ty.create_block_mask(mod, 1, 1, 300, 300))
    io = ForwardTensors(q, q, q, q.clone(), torch.zeros(1, 2, 300))
    with pytest.raises(ValueError, match="a block mask expects CONSUMERS=2"):
        plan_variant_launch(io, VariantCall(variant, tensors, 0.1), make_map=_spec, schedule={"CONSUMERS": 3})


@pytest.mark.slow
def test_mods_reading_aux_tuple_d64():
    """score_mod and mask_mod taking ``aux`` as their last argument (a bool and a float tensor)."""
    g = torch.Generator().manual_seed(23)
    keep = torch.rand(NK, generator=g) > 0.2
    scale_h = torch.tensor([1.0, 0.5])

    def smod(score, b, h, q_idx, kv_idx, aux):
        return score * aux[1][h]

    def mmod(b, h, q_idx, kv_idx, aux):
        return aux[0][kv_idx] | (kv_idx == 0)
    check(*qkv(D=64, seed=23), score_mod=smod, mask_mod=mmod, aux=(keep, scale_h))


# -- bad mods --------------------------------------------------------------------------------------------

def _trace(**kw):
    q, k, v = qkv(n=64, nk=64, D=64)
    return emulate(q, k, v, **kw)


def test_untraceable_mod_names_the_argument_and_the_line():
    def branchy(b, h, q_idx, kv_idx):
        if q_idx > kv_idx:  # a Python if on run-time values
            return True
        return False
    with pytest.raises(Exception) as info:
        _trace(mask_mod=branchy)
    text = str(info.value)
    assert "mask_mod" in text and "if q_idx > kv_idx" in text and "expects" in text, text


def test_mod_returning_the_wrong_type_names_the_argument():
    def distance(b, h, q_idx, kv_idx):
        return q_idx - kv_idx  # an integer, not a bool
    with pytest.raises(Exception) as info:
        _trace(mask_mod=distance)
    text = str(info.value)
    assert "mask_mod expects a function returning bool" in text and "but got i32" in text, text


def test_mod_reading_past_its_tensor_names_the_argument_and_the_line():
    table = torch.zeros(10)

    def past(score, b, h, q_idx, kv_idx):
        return score + table[q_idx]
    q, k, v = (t.float() for t in qkv(n=64, nk=64, D=64))
    from tylopy_kernels.attention import autograd_variants
    autograd_variants._warned.clear()  # the reference path warns once per reason and process
    with pytest.warns(UserWarning, match="torch fp32 reference path"):
        with pytest.raises(V.ModError) as info:
            ty.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), score_mod=past, enable_gqa=True)
    text = str(info.value)
    assert "score_mod" in text and "table[q_idx]" in text and "IndexError" in text, text


def test_unknown_torch_function_in_a_mod_is_named():
    def erf_mod(score, b, h, q_idx, kv_idx):
        return torch.special.erf(score)
    with pytest.raises(Exception) as info:
        _trace(score_mod=erf_mod)
    assert "score_mod" in str(info.value) and "torch.special" in str(info.value)


# -- the dense kernel is untouched -------------------------------------------------------------------------

def _instructions(ptx):
    lines = (ln.split("//")[0].rstrip() for ln in ptx.splitlines())
    return [ln for ln in lines if ln and not ln.lstrip().startswith((".loc", ".file"))]


@pytest.mark.slow
def test_dense_ptx_does_not_change_with_the_variant_hooks(monkeypatch):
    """``tiles.key_row`` and ``Problem.variant`` emit for a dense problem what the producer did before."""
    from tylopy_kernels.attention.sm90 import forward, tiles
    from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90
    cx = dict(HEAD_DIM=64, PERSISTENT=False, ORDER="heads", EXPONENT="shared")
    with_hooks = attention_fwd_sm90.compile(**cx).ptx
    calls = []

    def plain_key_row(prob, tp, j, m0, h, b):
        calls.append(j)
        return tiles.shift(j * prob.block_n, tp.k_start)

    monkeypatch.setenv("TYLOPY_CACHE", "0")
    monkeypatch.setattr(forward, "key_row", plain_key_row)
    attention_fwd_sm90.clear_cache()
    try:
        without = attention_fwd_sm90.compile(**cx).ptx
    finally:
        monkeypatch.undo()
        attention_fwd_sm90.clear_cache()
    assert calls, "the replaced hook was not traced"
    assert _instructions(with_hooks) == _instructions(without)


# -- ptxas: no spills ------------------------------------------------------------------------------------

def _bias_mod():
    bias = torch.zeros(2)

    def biased(score, b, h, q_idx, kv_idx):
        return score + bias[h]
    return biased


def _doc_mod():
    doc = torch.zeros(NK, dtype=torch.int32)

    def document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]
    return document


SPILL_CASES = {
    "window": lambda: dict(is_causal=True, window_size=(100, 0)),
    "softcap": lambda: dict(is_causal=True, softcap=30.0),
    "alibi-sinks": lambda: dict(alibi_slopes=torch.ones(2), sinks=torch.zeros(2)),
    "alibi-causal": lambda: dict(is_causal=True, alibi_slopes=torch.ones(2)),
    "float-mask": lambda: dict(attn_mask=torch.zeros(N, NK)),
    "bool-mask": lambda: dict(attn_mask=torch.ones(N, NK, dtype=torch.bool)),
    "score_mod": lambda: dict(score_mod=_bias_mod()),
    "mask_mod-block": lambda: dict(mask_mod=_doc_mod(), block_mask=ty.create_block_mask(_doc_mod(), 1, 1, N, NK)),
}


@pytest.mark.slow
@pytest.mark.parametrize("D", [64, pytest.param(128, marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("name", list(SPILL_CASES))
def test_builtin_variants_compile_without_spills(name, D):
    B, H = 1, 2
    q = torch.zeros(B, H, N, D, dtype=torch.bfloat16)
    k = torch.zeros(B, H, NK, D, dtype=torch.bfloat16)
    variant, tensors = V.make_variant(B, H, N, NK, q.device, **SPILL_CASES[name]())
    out, lse = torch.zeros(B, H, N, D, dtype=torch.bfloat16), torch.zeros(B, H, N)
    plan = plan_variant_launch(ForwardTensors(q, k, k, out, lse), VariantCall(variant, tensors, 0.125), make_map=_spec)
    from tylopy_kernels.attention.sm90.variant_launch import open_dtypes
    report = attention_variant_fwd_sm90.compile(**plan.constexprs, **open_dtypes(plan)).report
    if not report.available:
        pytest.skip("ptxas is not installed")
    assert not report.has_local_memory, str(report)
