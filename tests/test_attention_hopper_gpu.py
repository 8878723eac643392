"""The Hopper attention kernel on an H100/H200: numerics and behaviour.

Every numerics case goes through ``rules.check_output`` (the Hopper kernel's model): no NaN/inf
for finite inputs; rows with no key exactly 0 with LSE -inf; within 2 x torch's same-dtype error of an
FP64 oracle (+ 2^-10 max|v|); within one output rounding plus one P-rounding "flip" of a
same-boundary reference that rounds P per key tile of the launcher's BLOCK_N, and (over >= 256
rows) differing from that reference rounded in few outputs; LSE against the oracle. The
docstring of tylopy_kernels/attention/testing/rules.py derives the tolerances. Beyond numerics: NaN
padding past N and D changes no bit; the low-level launcher writes every element of a strided
output view and nothing around it; causal outputs ignore future keys bit-for-bit; 100 runs are
bit-identical; (B, N, H, D) memory works; empty inputs launch nothing; a CUDA graph and a side
stream; other tile schedules and every schedule option (SCHEDULE monkeypatched); head dim 128;
grouped-query and multi-query K/V (fewer heads, zero-stride ``expand`` views, batch broadcasts).
The same-boundary reference follows the launch's lazy rescale (RESCALE_THRESHOLD, recorded).

Formerly known failures, fixed and kept as tests: inputs all 133120 (bf16) or 54656 (fp16),
where every score is exactly 64 x value^2 and an unguarded exponent ex2(fma(s, c, -round(m c)))
missed by thousands (the kernel's FMA form now gives way to ex2((s - m) c), exact at the row
maximum, once |m c| >= 2^30 in a warp); and scale <= 0, which the entry point now maps to a
positive scale (negated or zeroed queries).

Run with a per-test time limit; use the thread method, because a hung kernel blocks the main
thread inside a CUDA call where the signal method cannot interrupt it (thread dumps the stacks
and ends the session):

    python -m pytest -q -m gpu tests/test_attention_hopper_gpu.py --timeout=120 --timeout-method=thread

``@pytest.mark.timeout(60)`` is applied only where pytest-timeout is installed, so CPU CI (which
lacks it) sees no unknown marker.
"""
import pytest
import torch

from conftest import requires_sm90
from tylopy_kernels.attention.sm90 import launch as launch
from tylopy_kernels.attention.testing import cases as C
from tylopy_kernels.attention.testing import rules as rules
from tylopy_kernels.attention.testing import scenarios as S
from tylopy_kernels.attention.testing.reference import HOPPER, AttentionInputs
from tylopy_kernels.attention import attention

try:
    import pytest_timeout  # noqa: F401
    _TIMEOUT = [pytest.mark.timeout(60)]
except ImportError:  # CPU CI: the marker would be unknown there
    _TIMEOUT = []

pytestmark = [pytest.mark.gpu, requires_sm90, *_TIMEOUT]

Case = C.Case


def _ids(cases):
    return [c.name.replace(" ", "-") for c in cases]


def _run(case):
    msg = S.run_case(case, attention)  # raises unless the Hopper kernel ran (recorded launch)
    torch.cuda.synchronize()
    return msg


# -- numerics --------------------------------------------------------------------------------------

SHAPES = C.shape_cases()


@pytest.mark.parametrize("case", SHAPES, ids=_ids(SHAPES))
def test_shapes(case):
    _run(case)


SPECIAL = C.special_cases()


@pytest.mark.parametrize("case", SPECIAL, ids=_ids(SPECIAL))
def test_special_inputs(case):
    """Uniform logits, logits up to +-3e4, more work tiles than SMs, non-default scales."""
    _run(case)


@pytest.mark.parametrize("case", C.CONSTANT_CASES, ids=_ids(C.CONSTANT_CASES))
def test_constant_inputs(case):
    _run(case)


@pytest.mark.parametrize("case", C.NONPOSITIVE_SCALE_CASES, ids=_ids(C.NONPOSITIVE_SCALE_CASES))
def test_nonpositive_scale(case):
    _run(case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_fully_masked_rows(dtype):
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(2, 3, 150, 64, generator=g, device="cuda").to(dtype) for _ in range(3))
    mask = torch.rand(150, 150, generator=g, device="cuda") > 0.5
    dead = [0, 5, 63, 64, 77, 127, 128, 149]
    mask[dead] = False
    with S.recorded_launches() as launches:
        out, lse = attention(q, k, v, attn_mask=mask, return_lse=True)
    assert bool((out[:, :, dead] == 0).all()) and bool((lse[:, :, dead] == float("-inf")).all())
    model = HOPPER.replace(block_n=launches[-1]["BLOCK_N"], lse=True,
                           rescale_threshold=launches[-1]["RESCALE_THRESHOLD"])
    rules.check_output(out, lse, AttentionInputs(q, k, v, mask), model=model)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_empty_inputs_launch_nothing(dtype):
    with S.recorded_launches() as launches:
        S.check_empty(attention, dtype)
    torch.cuda.synchronize()
    assert not launches


# -- memory: padding, canaries, layouts --------------------------------------------------------------

PADDING = [Case("bf16", 2, 3, 113, 203, mask="random", lse=True), Case("f16", 1, 2, 1024, 1024, causal=True),
           Case("bf16", 1, 1, 1, 239), Case("f16", 2, 2, 129, 127, lse=True)]


@pytest.mark.parametrize("case", PADDING, ids=_ids(PADDING))
def test_nan_padding_changes_nothing(case):
    S.check_nan_padding(case, attention)


CANARY = [Case("bf16", 1, 2, 300, 300, causal=True, lse=True), Case("f16", 2, 3, 113, 203, mask="transposed", lse=True),
          Case("bf16", 1, 1, 1, 239), Case("f16", 3, 2, 129, 127), Case("bf16", 2, 4, 1000, 777, mask="keys", lse=True)]


@pytest.mark.parametrize("case", CANARY, ids=_ids(CANARY))
def test_every_output_written_and_nothing_else(case):
    S.check_canary(case, launch.launch_hopper)


LAYOUTS = [Case("bf16", 2, 3, 113, 203, lse=True), Case("f16", 2, 4, 300, 300, causal=True),
           Case("bf16", 3, 2, 257, 129, mask="heads")]


@pytest.mark.parametrize("case", LAYOUTS, ids=_ids(LAYOUTS))
def test_bnhd_memory_viewed_as_bhnd(case):
    S.check_transposed_layout(case, attention)


# -- causality, repeatability, streams, graphs ------------------------------------------------------------

FUTURE = [(Case("bf16", 1, 2, 300, 300, causal=True, lse=True), (0, 1, 63, 64, 127, 128, 191, 192, 250, 298)),
          (Case("f16", 2, 1, 1000, 1000, causal=True), (100, 383, 384, 700, 998))]


@pytest.mark.parametrize("case,cuts", FUTURE, ids=_ids([c for c, _ in FUTURE]))
def test_causal_ignores_future_keys(case, cuts):
    S.check_future_perturbation(case, attention, cuts)


REPEAT = [Case("bf16", 2, 3, 1023, 1024), Case("f16", 1, 2, 2048, 2048, causal=True, lse=True),
          Case("bf16", 4, 8, 1024, 1024, causal=True), Case("bf16", 1, 1, 113, 203, mask="random", lse=True)]


@pytest.mark.parametrize("case", REPEAT, ids=_ids(REPEAT))
def test_100_runs_bit_identical(case):
    S.check_repeatable(case, attention, runs=100)


def test_cuda_graph_capture_and_replay():
    S.check_cuda_graph(Case("bf16", 2, 3, 300, 300, causal=True, lse=True), attention)
    S.check_cuda_graph(Case("f16", 1, 2, 200, 333, mask="keys"), attention)


def test_runs_on_the_current_stream():
    S.check_side_stream(Case("bf16", 2, 3, 1023, 1024, lse=True), attention)
    S.check_side_stream(Case("f16", 1, 2, 300, 257, mask="random"), attention)


# -- other tile schedules -----------------------------------------------------------------------------

SCHEDULES = [{"BLOCK_N": 64, "CONSUMERS": 2, "STAGES": 4}, {"BLOCK_N": 128, "CONSUMERS": 3, "STAGES": 2}]
if "PERSISTENT" in launch.SCHEDULE:
    SCHEDULES += [{"PERSISTENT": True}, {"PERSISTENT": False}]
SCHEDULE_CASES = [Case("bf16", 2, 3, 113, 203, lse=True), Case("f16", 1, 2, 1024, 1024, causal=True),
                  Case("bf16", 1, 1, 300, 257, mask="heads", lse=True), Case("bf16", 4, 8, 1024, 1024, causal=True),
                  Case("f16", 1, 2, 2048, 2048, lse=True)]


@pytest.mark.parametrize("override", SCHEDULES, ids=[",".join(f"{k}={v}" for k, v in s.items()) for s in SCHEDULES])
@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=_ids(SCHEDULE_CASES))
def test_other_schedules(case, override, monkeypatch):
    """SCHEDULE updated by ``override`` (the launcher may still adjust it for masks or persistence)."""
    monkeypatch.setattr(launch, "SCHEDULE", dict(launch.SCHEDULE, **override))
    msg = _run(case)
    if "BLOCK_N" in override:
        assert f"BLOCK_N={override['BLOCK_N']}" in msg, msg
    S.check_repeatable(case, attention, runs=5)


# -- schedule options (docs/performance.md, "v5") ---------------------------------------------------------

OPTIONS = [{"EXPONENT": "exact"}, {"EXPONENT": "exact", "RESCALE_THRESHOLD": None, "PV_WAIT": "free"},
           {"EXPONENT": "shared"},
           {"RESCALE_THRESHOLD": 0.0}, {"SPLIT_S": True}, {"TMA_STORE": True},
           {"PERSISTENT": True, "ORDER": "lpt", "TMA_STORE": True}, {"BLOCK_N": 64, "CONSUMERS": 4}]
OPTION_CASES = [Case("bf16", 2, 3, 113, 203, lse=True), Case("f16", 1, 2, 1024, 1024, causal=True, lse=True),
                Case("bf16", 1, 1, 300, 257, mask="heads", lse=True), Case("bf16", 2, 4, 777, 777, causal=True)]


def _label(override):
    return ",".join(f"{k}={v}" for k, v in override.items())


@pytest.mark.parametrize("override", OPTIONS, ids=[_label(o) for o in OPTIONS])
@pytest.mark.parametrize("case", OPTION_CASES, ids=_ids(OPTION_CASES))
def test_schedule_options(case, override, monkeypatch):
    monkeypatch.setattr(launch, "SCHEDULE", dict(launch.SCHEDULE, **override))
    with S.recorded_launches() as launches:
        _run(case)
    got = launches[-1]
    for key, val in override.items():
        # a mask keeps MASKED_SCHEDULE's consumer count, short keys the length table's
        if key != "CONSUMERS" or (case.mask is None and not got["PERSISTENT"]):
            assert got[key] == val, (key, got[key])


POLY_CASES = [Case("bf16", 2, 3, 513, 1000), Case("f16", 1, 2, 1024, 1024, causal=True)]


@pytest.mark.parametrize("poly", [2, 8])
@pytest.mark.parametrize("case", POLY_CASES, ids=_ids(POLY_CASES))
def test_polynomial_exp2(case, poly, monkeypatch):
    """Part of the exponentials on the FMA pipe (relative error 1e-4 in bf16, 3e-6 in fp16, below
    P's rounding): the same rules, with a same-boundary reference that applies the polynomial to
    the same scores (the launch's POLY_EXP2; without it 18% of outputs differ at poly = 8, from
    the polynomial's error alone); no LSE (the sum carries the polynomial's error)."""
    monkeypatch.setattr(launch, "SCHEDULE", dict(launch.SCHEDULE, POLY_EXP2=poly))
    _run(case)


# -- head dim 128 ----------------------------------------------------------------------------------------

D128 = [Case("bf16", 2, 3, 113, 203, head_dim=128, lse=True), Case("f16", 1, 2, 1024, 1024, causal=True, head_dim=128),
        Case("bf16", 1, 2, 300, 257, mask="heads", head_dim=128, lse=True),
        Case("bf16", 1, 4, 4096, 4096, causal=True, head_dim=128, lse=True),
        Case("f16", 2, 2, 1000, 2049, head_dim=128), Case("bf16", 1, 1, 1, 239, head_dim=128)]
D128_SCHEDULES = [{}, {"BLOCK_N": 176}, {"BLOCK_N": 64, "CONSUMERS": 3}, {"SPLIT_S": True}, {"PERSISTENT": True},
                  {"PERSISTENT": True, "ORDER": "lpt", "TMA_STORE": True}]


@pytest.mark.parametrize("override", D128_SCHEDULES, ids=[_label(o) or "default" for o in D128_SCHEDULES])
@pytest.mark.parametrize("case", D128, ids=_ids(D128))
def test_head_dim_128(case, override, monkeypatch):
    monkeypatch.setattr(launch, "SCHEDULE_128", dict(launch.SCHEDULE_128, **override))
    with S.recorded_launches() as launches:
        _run(case)
    assert launches[-1]["HEAD_DIM"] == 128


def test_head_dim_128_padding_and_canary():
    S.check_nan_padding(Case("bf16", 2, 3, 113, 203, head_dim=128, mask="random", lse=True), attention)
    S.check_canary(Case("f16", 2, 3, 113, 203, head_dim=128, mask="transposed", lse=True), launch.launch_hopper)
    S.check_future_perturbation(Case("bf16", 1, 2, 300, 300, causal=True, head_dim=128, lse=True), attention,
                                (0, 63, 64, 127, 128, 250, 298))


# -- grouped-query and multi-query K/V ---------------------------------------------------------------------

def _gqa_inputs(B, H, H_kv, n_q, n_k, D, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, n_q, D, generator=g, device="cuda").to(dtype)
    k, v = (torch.randn(B, H_kv, n_k, D, generator=g, device="cuda").to(dtype) for _ in range(2))
    return q, k, v


def _check_grouped(q, k, v, out, lse, launches, causal=False):
    """The pass rules against K/V repeated to the query heads (what SDPA with enable_gqa computes)."""
    H = q.shape[1]
    k_rep, v_rep = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
    model = HOPPER.replace(block_n=launches[-1]["BLOCK_N"], lse=lse is not None, dtype=q.dtype,
                           rescale_threshold=launches[-1]["RESCALE_THRESHOLD"])
    return rules.check_output(out, lse, AttentionInputs(q, k_rep, v_rep, None, causal), model)


GQA = [(2, 8, 2, 300, 300, 64, torch.bfloat16, True), (1, 8, 1, 1024, 1024, 64, torch.float16, False),
       (2, 4, 2, 129, 700, 128, torch.bfloat16, False), (1, 16, 4, 2048, 2048, 128, torch.bfloat16, True)]


@pytest.mark.parametrize("B,H,H_kv,n_q,n_k,D,dtype,causal", GQA)
def test_grouped_query_attention(B, H, H_kv, n_q, n_k, D, dtype, causal):
    q, k, v = _gqa_inputs(B, H, H_kv, n_q, n_k, D, dtype, seed=H * 7 + H_kv)
    with S.recorded_launches() as launches:
        out, lse = attention(q, k, v, is_causal=causal, return_lse=True, enable_gqa=True)
    _check_grouped(q, k, v, out, lse, launches, causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert (out.float() - ref.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("D", [64, 128])
def test_multi_query_views(D):
    """K/V as zero-stride views over one head (expand) and over one batch: the same bits as the
    materialized tensors, no error."""
    q, k1, v1 = _gqa_inputs(2, 6, 1, 500, 500, D, torch.bfloat16, seed=D)
    k_view, v_view = k1.expand(2, 6, 500, D), v1.expand(2, 6, 500, D)
    with S.recorded_launches() as launches:
        out_view = attention(q, k_view, v_view, is_causal=True)
    out_full = attention(q, k_view.contiguous(), v_view.contiguous(), is_causal=True)
    assert torch.equal(out_view, out_full)
    _check_grouped(q, k1, v1, out_view, None, launches, causal=True)
    kb, vb = k1[:1].expand(2, 1, 500, D), v1[:1].expand(2, 1, 500, D)  # one batch for both
    out_b = attention(q, kb, vb, enable_gqa=True)
    assert torch.equal(out_b, attention(q, kb.contiguous(), vb.contiguous(), enable_gqa=True))
