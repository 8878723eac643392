"""The Hopper attention kernel run in the emulator (bit-identical to an H200 except ex2.approx),
on small shapes, against an FP64 oracle.

* Every head dim, tile shape and schedule option the launcher or the sweep can pick: D = 64 and
  128, causal, masks, grouped-query and multi-query K/V (zero-stride ``expand`` views and batch
  broadcasts mapped over their storage), the (B, N, H, D) layout, split S, the polynomial exp2,
  the exact exponent, eager rescaling, the persistent loop (more work tiles than CTAs: the
  "lpt" order, TMA stores, each tile's output written under the next tile's first S product).
* The exponent's edge cases: inputs all 133120 (every score 1.1e12), scores near the float
  limits, a warp whose rows switch between the FMA and the exact form (one row with huge scores
  forces the whole warp to the exact form), fp16 weights near the FMA form's limit, a row
  maximum that keeps rising by more than the lazy threshold; EXPONENT="shared" gives the bits
  of "ffma".
* What the launcher picks for short sequences (persistent, TMA store, lpt or heads order).
* The GPU pass rules (``rules.check_output``) on emulated launches of the GPU tests' cases: large
  fp16 logits under a mask, a negative scale, the polynomial exp2.
"""
import math

import pytest
import torch

from tylopy.runtime.tensormap import TensorMapSpec
from tylopy_kernels.attention.sm90 import launch as launch
from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90


def _spec(t, dims, strides, box):
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "bf16" if t.dtype == torch.bfloat16 else "f16",
                         128)


def emulate(q, k, v, causal=False, mask=None, scale=None, schedule=None):
    """(out, lse, launch plan) of the kernel in the emulator; out and lse start NaN."""
    B, H, n, D = q.shape
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = torch.full((B, H, n, D), float("nan"), dtype=q.dtype)
    lse = torch.full((B, H, n), float("nan"))
    plan = launch.plan_launch(launch.ForwardTensors(q, k, v, out, lse, mask),
                              launch.HopperOptions(scale, causal, dict({"PERSISTENT": False}, **(schedule or {}))),
                              launch.MapTarget(_spec, sm_count=3))
    attention_fwd_sm90.emulate(*plan.args, grid=plan.grid, **plan.constexprs)
    return out, lse, plan


def oracle(q, k, v, causal=False, mask=None, scale=None):
    """FP64 softmax(scale q k^T) v and LSE, K/V heads repeated for grouped-query attention."""
    H = q.shape[1]
    k, v = (t.double().repeat_interleave(H // t.shape[1], 1) if t.shape[1] != H else t.double() for t in (k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.double() @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def check(out, lse, q, k, v, causal=False, mask=None, scale=None, tol=2e-2, lse_tol=1e-4):
    want, want_lse = oracle(q, k, v, causal, mask, scale)
    assert torch.isfinite(out).all(), "NaN/inf in the output"
    err = (out.double() - want).abs().max().item()
    vmax = v.double().abs().max().item()
    assert err <= tol * vmax, f"max error {err:.3e} > {tol} max|v|"
    lerr = (lse.double() - want_lse).abs().max().item()
    assert lerr <= lse_tol * max(1.0, want_lse.abs().max().item()), f"LSE error {lerr:.3e}"
    return err


def randn(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# -- shapes, layouts and schedule options ------------------------------------------------------------

CASES = [
    ("D64", dict(B=1, H=2, Hkv=2, n=200, D=64), {}),
    ("D128", dict(B=1, H=1, Hkv=1, n=256, D=128), {}),
    ("D128-causal-gqa", dict(B=1, H=4, Hkv=2, n=160, D=128, causal=True), {}),
    ("D128-BN176", dict(B=1, H=1, Hkv=1, n=300, D=128), {"BLOCK_N": 176}),
    ("D128-192x64", dict(B=1, H=1, Hkv=1, n=250, D=128, causal=True), {"BLOCK_N": 64, "CONSUMERS": 3}),
    ("D64-4-consumers", dict(B=1, H=1, Hkv=1, n=300, D=64), {"BLOCK_N": 64, "CONSUMERS": 4}),
    ("D64-split-poly", dict(B=2, H=2, Hkv=1, n=300, D=64, causal=True), {"SPLIT_S": True, "POLY_EXP2": 3}),
    ("D128-split-f16", dict(B=1, H=2, Hkv=2, n=200, D=128, dtype=torch.float16), {"SPLIT_S": True, "POLY_EXP2": 8}),
    ("D64-exact-eager", dict(B=1, H=2, Hkv=2, n=300, D=64), {"EXPONENT": "exact", "RESCALE_THRESHOLD": None,
                                                             "PV_WAIT": "free"}),
    ("D64-persistent-lpt-tma", dict(B=2, H=2, Hkv=1, n=200, D=64, causal=True),
     {"PERSISTENT": True, "ORDER": "lpt", "TMA_STORE": True}),
    ("D128-tma-mask", dict(B=1, H=2, Hkv=2, n=150, D=128, mask=True), {"TMA_STORE": True}),
    ("D64-persistent-epilogue-inline", dict(B=2, H=2, Hkv=2, n=300, D=64), {"PERSISTENT": True,
                                                                           "DEFER_EPILOGUE": False}),
    ("D128-persistent-causal", dict(B=1, H=3, Hkv=1, n=300, D=128, causal=True), {"PERSISTENT": True}),
]


@pytest.mark.parametrize("shape,schedule", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_against_the_oracle(shape, schedule):
    B, H, Hkv, n, D = (shape[k] for k in ("B", "H", "Hkv", "n", "D"))
    dtype = shape.get("dtype", torch.bfloat16)
    q, k, v = randn(B, H, n, D, dtype=dtype, seed=1), randn(B, Hkv, n, D, dtype=dtype, seed=2), \
        randn(B, Hkv, n, D, dtype=dtype, seed=3)
    mask = (torch.rand(n, n, generator=torch.Generator().manual_seed(4)) > 0.3) if shape.get("mask") else None
    if mask is not None:
        mask[:, 0] = True  # every row keeps a key
    out, lse, plan = emulate(q, k, v, shape.get("causal", False), mask, schedule=schedule)
    for key, val in schedule.items():
        assert plan.constexprs[key] == val, (key, plan.constexprs[key])
    check(out, lse, q, k, v, shape.get("causal", False), mask, lse_tol=1e-3 if schedule.get("POLY_EXP2") else 1e-4)


def test_mqa_expand_view_and_batch_broadcast_are_not_copied():
    """K/V as zero-stride views: heads (MQA through expand) and batch; the tensor maps cover the
    storage (one head, one batch) and the kernel indexes it."""
    q = randn(2, 4, 130, 64, seed=5)
    k1, v1 = randn(1, 1, 130, 64, seed=6), randn(1, 1, 130, 64, seed=7)
    k, v = k1.expand(2, 4, 130, 64), v1.expand(2, 4, 130, 64)
    out, lse, plan = emulate(q, k, v, causal=True)
    maps = plan.args[:3]
    assert maps[1].tensor.data_ptr() == k1.data_ptr() and maps[1].dims[1:] == (130, 1, 1)
    assert plan.args[11:13] == (4, 0)  # kv_group = 4 heads per K/V head, K/V shared over the batch
    check(out, lse, q, k, v, causal=True)


def test_bnhd_layout_with_grouped_kv():
    """(B, N, H, D) buffers viewed as (B, H, N, D), K/V with fewer heads: no copies, one order."""
    qb, kb, vb = randn(2, 100, 4, 128, seed=8), randn(2, 100, 2, 128, seed=9), randn(2, 100, 2, 128, seed=10)
    q, k, v = qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2)
    out, lse, plan = emulate(q, k, v)
    assert plan.constexprs["COORD_ORDER"] == ("h", "n", "b")
    assert plan.args[1].tensor.data_ptr() == kb.data_ptr()
    check(out, lse, q, k, v)


def test_unaligned_contiguous_views_are_copied():
    """A contiguous view whose first element is not 16-byte aligned (a slice one element into its
    storage): TMA cannot start there, and ``contiguous()`` would return the view itself; the
    launcher maps an aligned copy."""
    storage = randn(1 * 2 * 70 * 64 + 1, seed=11)
    q = storage[1:].view(1, 2, 70, 64)
    k, v = randn(1, 2, 70, 64, seed=12), randn(1, 2, 70, 64, seed=13)
    out, lse, plan = emulate(q, k, v, causal=True)
    assert plan.args[0].tensor.data_ptr() % 16 == 0
    check(out, lse, q, k, v, causal=True)


# -- the exponent's edge cases ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,value", [(torch.bfloat16, 133120.0), (torch.float16, 54656.0)])
def test_constant_inputs_with_huge_scores(dtype, value):
    """Every score is 64 value^2 (1.1e12 in bf16): the warp takes the exact form, every weight is 1."""
    q = torch.full((1, 1, 130, 64), value, dtype=dtype)
    v = randn(1, 1, 130, 64, dtype=dtype, seed=11)
    out, lse, _ = emulate(q, q, v)
    want = v.double().mean(2, keepdim=True).expand_as(out)
    assert torch.isfinite(out).all()
    assert (out.double() - want).abs().max().item() < 1e-2
    want_lse = 64 * value * value / 8 + math.log(130)
    assert abs(lse[0, 0, 0].item() - want_lse) <= 1e-6 * want_lse


def test_scores_near_the_float_limits():
    """Scores up to 3.2e38 and down to -3.2e38: differences overflow to -inf, weights to 0."""
    n = 140
    q = torch.zeros(1, 1, n, 64)
    k = torch.zeros(1, 1, n, 64)
    q[..., 0] = 1.875 * 2.0 ** 63
    k[..., 0] = torch.tensor([2.0 ** 64 * (1 if j % 3 else -1) * (1 - 2.0 ** -7 * (j % 5)) for j in range(n)])
    q, k = q.bfloat16(), k.bfloat16()
    v = randn(1, 1, n, 64, seed=12)
    out, lse, _ = emulate(q, k, v, scale=1.0)
    s = q.double() @ k.double().transpose(-1, -2)
    assert s.abs().max() > 3.1e38
    top = s == s.amax(-1, keepdim=True)
    want = (top.double() @ v.double()) / top.sum(-1, keepdim=True)  # only the maxima count
    assert torch.isfinite(out).all()
    assert (out.double() - want).abs().max().item() < 1e-2


def _rows_with_offsets(n, offsets_by_row, seed, split=1.0, integers=False):
    """q, k whose score for (row r, key j) is offsets_by_row[r](j) + a unit-scale random part
    (q holds ``split`` and k the offset / ``split``, so fp16 inputs can reach large scores). With
    ``integers`` the random part is an integer sum, so scores below 2^24 are exact in float32."""
    g = torch.Generator().manual_seed(seed)
    if integers:
        q = torch.randint(-1, 2, (1, 1, 64, 64), generator=g).float()
        k = torch.randint(-2, 3, (1, 1, n, 64), generator=g).float()
    else:
        q = torch.randn(1, 1, 64, 64, generator=g) * 0.3
        k = torch.randn(1, 1, n, 64, generator=g) * 0.3
    q[..., :, :8] = 0
    k[..., :, :8] = 0
    for col, (r, fn) in enumerate(offsets_by_row.items()):
        q[0, 0, r, col] = split
        for j in range(n):
            k[0, 0, j, col] = fn(j) / split
    return q, k


def test_warps_switching_between_exponent_forms():
    """Rows 0 and 16 score 11534336 + small integers (exact in float32), where m c ~ 2^21 and the
    FMA form rounds m c by up to 1/8. In warp 0, row 1 scores -1e10 in the first two key tiles (its
    m c is beyond 2^30: the warp takes the exact form) and small ones in the third (back to the
    FMA form); in warp 1, row 17 scores 2e10 from the second tile on (FMA form, then exact). Rows
    0 and 16 keep their maximum across each change of form: only the rescale between the forms'
    references (2^(lo_new - lo_old)) keeps their tiles' weights consistent. The value rows have
    means -1, 0, 1 per key tile, so a tile weighed wrong shows."""
    big = 11534336.0  # 1.375 * 2^23, exact in bf16
    offsets = {0: lambda j: big, 1: lambda j: -1.0e10 if j < 256 else 0.0,
               16: lambda j: big, 17: lambda j: 2.0e10 if j >= 128 else 0.0}
    q, k = _rows_with_offsets(384, offsets, seed=13, integers=True)
    q, k = q.bfloat16(), k.bfloat16()
    v = (torch.arange(384).div(128, rounding_mode="floor").sub(1.0)[None, None, :, None]
         + 0.1 * randn(1, 1, 384, 64, seed=14).float()).bfloat16()
    out, lse, _ = emulate(q, k, v, schedule={"CONSUMERS": 2})
    want, want_lse = oracle(q, k, v)
    assert torch.isfinite(out).all()
    for r in (0, 16, 30):  # rows 1 and 17 lose their small score differences to float32 rounding
        err = (out[0, 0, r].double() - want[0, 0, r]).abs().max().item()
        assert err < 1.5e-3, (r, err)  # measured 4e-4; 3.7e-3 without the rescale between forms
        assert abs(lse[0, 0, r].item() - want_lse[0, 0, r].item()) <= 1e-6 * abs(want_lse[0, 0, r].item()), r


def test_fp16_weights_near_the_ffma_limit():
    """fp16 P overflows past 65504: at |m c| just under 2^26 the FMA form's offset error stays < 4."""
    c = 0.125 * 1.4426950408889634
    offsets = {r: (lambda j, r=r: (2.0 ** 26 - 2.0 ** 20 * r) / c) for r in range(4)}
    q, k = _rows_with_offsets(200, offsets, seed=15, split=2.0 ** 14)
    q, k = q.half(), k.half()
    v = randn(1, 1, 200, 64, dtype=torch.float16, seed=16)
    out, lse, _ = emulate(q, k, v, schedule={"CONSUMERS": 2})
    assert torch.isfinite(out).all()
    want, _ = oracle(q, k, v)
    assert (out.double() - want).abs().max().item() < 3e-2


def _same_bits(a, b):
    return torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                       b.view(torch.int16 if b.element_size() == 2 else torch.int32))


def test_shared_exponent_sequence_gives_the_ffma_bits():
    """EXPONENT="shared" (one exponent sequence; a warp in the exact form shifts its scores first)
    computes what "ffma" computes, bit for bit: through warps switching forms, huge constant
    scores and an ordinary tile."""
    big = 11534336.0
    offsets = {0: lambda j: big, 1: lambda j: -1.0e10 if j < 256 else 0.0,
               16: lambda j: big, 17: lambda j: 2.0e10 if j >= 128 else 0.0}
    q, k = _rows_with_offsets(384, offsets, seed=13, integers=True)
    inputs = [(q.bfloat16(), k.bfloat16(), randn(1, 1, 384, 64, seed=14), {"CONSUMERS": 2})]
    huge = torch.full((1, 1, 130, 64), 133120.0, dtype=torch.bfloat16)
    inputs.append((huge, huge, randn(1, 1, 130, 64, seed=11), {}))
    inputs.append((randn(1, 2, 200, 128, seed=1), randn(1, 2, 200, 128, seed=2), randn(1, 2, 200, 128, seed=3), {}))
    for q, k, v, schedule in inputs:
        want = emulate(q, k, v, schedule=dict(schedule, EXPONENT="ffma"))
        got = emulate(q, k, v, schedule=dict(schedule, EXPONENT="shared"))
        assert _same_bits(got[0], want[0]) and _same_bits(got[1], want[1])


@pytest.mark.parametrize("threshold", [8.0, 0.0, None])
def test_rising_row_maximum(threshold):
    """Scores rise by 60 per key tile (about 11 in the log2 domain): every tile moves the reference
    past the threshold and rescales O; the result must not depend on the threshold."""
    offsets = {r: (lambda j: 60.0 * (j // 64)) for r in range(64)}
    q, k = _rows_with_offsets(320, offsets, seed=17)
    q, k = q.bfloat16(), k.bfloat16()
    v = randn(1, 1, 320, 64, seed=18)
    out, lse, _ = emulate(q, k, v, schedule={"BLOCK_N": 64, "CONSUMERS": 2, "RESCALE_THRESHOLD": threshold})
    check(out, lse, q, k, v)


def test_pass_rules_need_the_lazy_reference():
    """The GPU pass rules judge P's rounding against a same-boundary reference: with the launch's
    lazy maximum the emulated kernel differs from it in ~0.1% of outputs; the running-maximum
    reference, which the kernel no longer follows, differs in ~25% and is rejected."""
    from tylopy_kernels.attention.testing import cases as C
    from tylopy_kernels.attention.testing import reference as R
    from tylopy_kernels.attention.testing import rules as rules
    case = C.Case("bf16", 1, 2, 300, 300, lse=True)
    q, k, v, mask = C.make_inputs(case, "cpu")
    out, lse, plan = emulate(q, k, v, case.causal, mask, case.scale)
    model = R.HOPPER.replace(block_n=plan.constexprs["BLOCK_N"], lse=True, dtype=q.dtype,
                             rescale_threshold=plan.constexprs["RESCALE_THRESHOLD"])
    rules.check_output(out, lse, R.AttentionInputs(q, k, v, mask, case.causal, case.scale), model, stats=case.stats)
    with pytest.raises(AssertionError, match="differ from the same-boundary"):
        rules.check_output(out, lse, R.AttentionInputs(q, k, v, mask, case.causal, case.scale),
                           model.replace(rescale_threshold=None), stats=case.stats)


@pytest.mark.parametrize("D,causal,with_lse", [(64, False, True), (64, True, False), (128, False, True),
                                                (128, True, False)])
def test_launcher_schedule_for_short_sequences(D, causal, with_lse):
    """What the launcher picks at N <= 512 (persistent, "lpt" order or "heads" at D=128 with
    LSE, O through a TMA store), with more work tiles than CTAs."""
    q, k, v = (randn(2, 2, 300, D, seed=s) for s in (20, 21, 22))
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:3], float("nan")) if with_lse else None
    plan = launch.plan_launch(launch.ForwardTensors(q, k, v, out, lse), launch.HopperOptions(1 / math.sqrt(D), causal),
                              launch.MapTarget(_spec, sm_count=3))
    attention_fwd_sm90.emulate(*plan.args, grid=plan.grid, **plan.constexprs)
    cx = plan.constexprs
    assert cx["PERSISTENT"] and cx["TMA_STORE"] and cx["CONSUMERS"] == 2 and plan.grid == (3,), (cx, plan.grid)
    assert cx["ORDER"] == ("heads" if D == 128 and with_lse else "lpt")
    want, want_lse = oracle(q, k, v, causal)
    assert (out.double() - want).abs().max().item() <= 2e-2 * v.double().abs().max().item()
    if with_lse:
        assert (lse.double() - want_lse).abs().max().item() <= 1e-4 * want_lse.abs().max().item()


# -- the GPU pass rules on emulated launches -----------------------------------------------------------

def _check_emulated_case(case, schedule=None, model_change=None):
    """Run a GPU test's case in the emulator as ``tylopy.attention`` launches it (the launcher's own
    schedule, a nonpositive scale mapped as the entry point maps it) and apply the GPU pass rules
    with the launch's model (``model_change`` alters that model)."""
    from tylopy_kernels.attention.testing import cases as C
    from tylopy_kernels.attention.testing import rules as rules
    from tylopy_kernels.attention.testing import scenarios as S
    from tylopy_kernels.attention.testing.reference import AttentionInputs
    from tylopy_kernels.attention.dispatch import _nonpositive_scale
    q, k, v, mask = C.make_inputs(case, "cpu")
    query, scale = _nonpositive_scale(q, case.resolved_scale)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:3], float("nan")) if case.lse else None
    plan = launch.plan_launch(launch.ForwardTensors(query, k, v, out, lse, mask),
                              launch.HopperOptions(scale, case.causal, schedule), launch.MapTarget(_spec, sm_count=132))
    attention_fwd_sm90.emulate(*plan.args, grid=plan.grid, **plan.constexprs)
    model = S.hopper_model(case, plan.constexprs).replace(**(model_change or {}))
    return rules.check_output(out, lse, AttentionInputs(q, k, v, mask, case.causal, case.scale), model,
                              stats=case.stats)


def test_rules_on_large_fp16_logits_with_a_mask():
    """Logits up to 3e4 in fp16: with the lazy maximum measured in the wrong units (the threshold
    multiplied by the scale once more) the same-boundary reference let weights grow past fp16's
    65504 and judged the kernel against inf and NaN."""
    from tylopy_kernels.attention.testing import cases as C
    _check_emulated_case(C.Case("f16", 2, 1, 300, 257, inputs="large", mask="random", lse=True))


def test_rules_on_a_negative_scale():
    """scale = -0.125: the entry point negates Q; the reference's lazy maximum (over the scaled
    scores) moves where the kernel's does only when the threshold is compared in log2 units of the
    scaled scores, whatever the scale's sign (it was off by 0.89 here)."""
    from tylopy_kernels.attention.testing import cases as C
    _check_emulated_case(C.Case("bf16", 1, 2, 100, 300, scale=-0.125, lse=True))


@pytest.mark.parametrize("poly", [2, 8])
def test_rules_follow_the_polynomial_exp2(poly):
    """POLY_EXP2 of every 8 exponentials on the FMA pipe (degree 3 in bf16, relative error 1e-4):
    the same-boundary reference applies the same polynomial to the same accumulator registers and
    the emulated kernel differs from it in ~0.2% of outputs. A reference with plain exponentials
    sees 6-18% differ, which the statistical rule rejects at poly = 8."""
    from tylopy_kernels.attention.testing import cases as C
    case = C.Case("bf16", 1, 1, 256, 1000)
    summary = _check_emulated_case(case, {"POLY_EXP2": poly})
    assert float(summary.split("round(sb) in ")[1].split("%")[0]) < 1.0, summary
    if poly == 8:
        with pytest.raises(AssertionError, match="differ from the same-boundary"):
            _check_emulated_case(case, {"POLY_EXP2": poly}, {"poly_exp2": 0, "poly_coeffs": ()})
