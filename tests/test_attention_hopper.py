"""The Hopper attention kernel without a GPU.

* ptxas (sm_90a) assembles every specialization the launcher picks, and a grid of tile
  schedules, with no spills, no stack frame and no C7508/C7515; the PTX holds the Hopper
  instructions (wgmma, TMA, mbarrier, setmaxnreg, named barriers).
* ``check_inputs`` / ``tylopy.attention`` reject bad input before touching a GPU, with a
  TypeError or ValueError that names the argument.
"""
import itertools
import math
import re

import pytest
import torch

import tylopy
import tylopy as ty
from tylopy_kernels.attention.sm90 import launch as launch
from tylopy_kernels.attention.testing import cases as C
from tylopy_kernels.attention.testing import check as check_attention
from tylopy_kernels.attention.testing import float32_model as F
from tylopy_kernels.attention.testing import reference as R
from tylopy_kernels.attention.testing import scenarios as S
from tylopy_kernels.attention import check_inputs
from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90

# -- ptxas and PTX --------------------------------------------------------------------------------

CONSTEXPRS = set(attention_fwd_sm90.constexpr_names)


def _unique(specs):
    out = {}
    for cx in specs:
        out.setdefault(repr(sorted(cx.items(), key=lambda kv: kv[0])), cx)
    return list(out.values())


def _launcher_specializations():
    """The constexpr sets ``launch_hopper`` compiles, found by planning launches on CPU tensors
    (no tensor maps, no GPU): (specializations, error or None)."""
    seen = []
    try:
        for dt, d, n_k, causal, masked, lse, bnhd, kv_heads in itertools.product(
                (torch.bfloat16, torch.float16), (64, 128), (128, 2048, 4096), (False, True), (False, True),
                (False, True), (False, True), (2, 1)):
            q = torch.zeros((1, 128, 2, d) if bnhd else (1, 2, 128, d), dtype=dt)
            k = torch.zeros((1, n_k, kv_heads, d) if bnhd else (1, kv_heads, n_k, d), dtype=dt)
            if bnhd:
                q, k = q.transpose(1, 2), k.transpose(1, 2)
            mask = torch.ones(128, n_k, dtype=torch.bool) if masked else None
            for out in (torch.empty(1, 2, 128, d, dtype=dt), torch.empty(1, 128, 2, d, dtype=dt).transpose(1, 2)):
                tensors = launch.ForwardTensors(q, k, k, out, torch.empty(1, 2, 128) if lse else None, mask)
                plan = launch.plan_launch(tensors, launch.HopperOptions(0.125, causal),
                                          launch.MapTarget(lambda *args: None, sm_count=132))
                seen.append(plan.constexprs)
    except Exception as e:  # noqa: BLE001 -- reported by test_launcher_specializations_found
        return [], f"{type(e).__name__}: {e}"
    return _unique(seen), None


LAUNCHER_SPECS, LAUNCHER_ERROR = _launcher_specializations()


DEFAULTS = {"HEAD_DIM": 64, "EXPONENT": "ffma", "RESCALE_THRESHOLD": 8.0, "PV_WAIT": "pinned", "POLY_EXP2": 0,
            "ORDER": "heads"}


def _spec_id(cx):
    parts = [str(cx.get("DTYPE")), f"D{cx.get('HEAD_DIM', 64)}", f"N{cx.get('BLOCK_N')}", f"C{cx.get('CONSUMERS')}",
             f"S{cx.get('STAGES')}"]
    parts += [name.lower() for name in ("HAS_MASK", "RETURN_LSE", "PERSISTENT", "SPLIT_S", "TMA_STORE") if cx.get(name)]
    parts += [f"{k.lower()}={cx[k]}" for k, v in DEFAULTS.items() if k != "HEAD_DIM" and k in cx and cx[k] != v]
    parts += ["bnhd"] if cx.get("COORD_ORDER", ("n",))[0] != "n" else []
    return "-".join(parts)


def _pick_launcher_specs():
    """All of them in bf16 (B, H, N, D); fp16 and the (B, N, H, D) order only plain and fully loaded
    (they change instruction types and TMA coordinates, not the register budget)."""
    out = []
    for cx in LAUNCHER_SPECS:
        bhnd = cx.get("COORD_ORDER", ("n",))[0] == "n"
        loaded = cx.get("HAS_MASK") == cx.get("RETURN_LSE") == cx.get("PERSISTENT")
        if (bhnd and cx["DTYPE"] == ty.bf16) or loaded:
            out.append(cx)
    return out


VARIANTS = [(ty.bf16, True, True, True), (ty.bf16, False, True, True), (ty.f16, False, False, False)]


def _launcher_picks(cx) -> bool:
    """Whether the launcher could run this: with a mask it overrides the consumer count
    (MASKED_SCHEDULE) because three consumers spill."""
    forced = launch.MASKED_SCHEDULE
    return not (cx.get("HAS_MASK") and any(cx.get(k) != v for k, v in forced.items() if k in cx))


def _grid_specs():
    """Tile shapes (BLOCK_N x CONSUMERS x STAGES per head dim), each with the most loaded flag set
    the launcher allows; the plain fp16 set too with two stages."""
    shapes = [(64, bn, c, st) for bn, c, st in itertools.product((64, 128), (2, 3), (2, 4))]
    shapes += [(64, 64, 4, 2), (128, 64, 2, 2), (128, 176, 2, 2), (128, 64, 3, 2)]
    out = []
    for d, bn, consumers, stages in shapes:
        picked = []
        for dt, mask, lse, persistent in VARIANTS:
            cx = dict(DTYPE=dt, HEAD_DIM=d, BLOCK_N=bn, CONSUMERS=consumers, STAGES=stages, HAS_MASK=mask,
                      RETURN_LSE=lse, PERSISTENT=persistent, COORD_ORDER=("n", "h", "b"))
            if _launcher_picks(cx) and (not picked or (stages == 2 and dt == ty.f16)):
                picked.append(cx)
        out += picked
    return out


# Schedule options (docs/performance.md, "v5"), on the default tile shape of each head dim.
OPTIONS = [dict(SPLIT_S=True), dict(POLY_EXP2=2), dict(POLY_EXP2=8, SPLIT_S=True), dict(EXPONENT="exact"),
           dict(EXPONENT="fast"), dict(EXPONENT="shared"), dict(EXPONENT="shared", POLY_EXP2=2),
           dict(RESCALE_THRESHOLD=None), dict(PV_WAIT="free"),
           dict(TMA_STORE=True, PERSISTENT=True, ORDER="lpt", RETURN_LSE=True),
           dict(TMA_STORE=True, RETURN_LSE=True)]


def _option_specs():
    out = []
    for d, consumers in ((64, 3), (128, 2)):
        for opt in OPTIONS:
            cx = dict(dict(DTYPE=ty.bf16, HEAD_DIM=d, BLOCK_N=128, CONSUMERS=consumers, STAGES=2), **opt)
            if d == 128 and cx.get("PERSISTENT") and cx.get("TMA_STORE"):
                cx["RETURN_LSE"] = False  # with LSE and the lpt order it spills 16 bytes (docs/performance.md)
            out.append(cx)
    return out


PTXAS_SPECS = _unique(_pick_launcher_specs() + _grid_specs() + _option_specs())
# What the launcher compiles is assembled in every run; the other tile shapes and schedule options
# (benchmark alternatives, ~2-5 s of ptxas each) under the exhaustive marker.
_LAUNCHED = {repr(sorted(cx.items(), key=lambda kv: kv[0])) for cx in _pick_launcher_specs()}
PTXAS_PARAMS = [pytest.param(cx, id=_spec_id(cx), marks=() if repr(sorted(cx.items(), key=lambda kv: kv[0]))
                             in _LAUNCHED else pytest.mark.exhaustive) for cx in PTXAS_SPECS]
# 192 x 128 tiles at D=128 (three consumers at 160 registers a thread) spill: O (64), S (64) and
# P (32) alone take 160 registers. The launcher uses two consumers at D=128.
KNOWN_SPILL = dict(DTYPE=ty.bf16, HEAD_DIM=128, BLOCK_N=128, CONSUMERS=3, STAGES=2)


def _assemble(cx):
    ck = attention_fwd_sm90.compile(**cx)
    if not ck.report.available:
        pytest.skip(ck.report.note)
    return ck


def test_launcher_specializations_found():
    assert LAUNCHER_ERROR is None, f"dry run of launch_hopper on CPU tensors failed: {LAUNCHER_ERROR}"
    assert LAUNCHER_SPECS


@pytest.mark.parametrize("D,causal,n_k,masked,lse,want", [
    (64, False, 1024, False, False, dict(PERSISTENT=True, CONSUMERS=2, ORDER="lpt", TMA_STORE=True)),
    (64, True, 512, True, True, dict(PERSISTENT=True, CONSUMERS=2, ORDER="lpt", TMA_STORE=True)),
    (64, False, 2048, False, False, dict(PERSISTENT=False, CONSUMERS=3, ORDER="heads", TMA_STORE=False)),
    (64, True, 2048, True, False, dict(PERSISTENT=False, CONSUMERS=2, TMA_STORE=False)),
    (128, False, 2048, False, False, dict(PERSISTENT=True, CONSUMERS=2, BLOCK_N=128, ORDER="lpt", TMA_STORE=True)),
    (128, False, 2048, False, True, dict(PERSISTENT=True, ORDER="heads", TMA_STORE=True)),
    (128, False, 4096, False, False, dict(PERSISTENT=False, TMA_STORE=False)),
    (128, True, 512, False, False, dict(PERSISTENT=True, ORDER="lpt", TMA_STORE=True)),
    (128, True, 1024, False, False, dict(PERSISTENT=False, ORDER="heads", TMA_STORE=False)),
])
def test_length_table_picks_the_measured_winners(D, causal, n_k, masked, lse, want):
    """The launcher's schedule per (head dim, causal, keys): the H200 sweep's winners
    (docs/performance.md, "v5"); at D=128 a persistent launch with LSE takes the "heads" order
    (lpt spills there)."""
    got = launch.resolve_schedule(D, n_k, causal, masked, None, lse)
    assert {k: got[k] for k in want} == want


def test_schedule_argument_overrides_the_tables():
    got = launch.resolve_schedule(64, 512, True, True, {"TMA_STORE": False, "ORDER": "heads"}, True)
    assert (got["PERSISTENT"], got["TMA_STORE"], got["ORDER"], got["CONSUMERS"]) == (True, False, "heads", 2)
    got = launch.resolve_schedule(128, 512, False, False, {"PERSISTENT": False}, True)
    assert (got["PERSISTENT"], got["TMA_STORE"], got["ORDER"]) == (False, False, "heads")


@pytest.mark.parametrize("cx", PTXAS_PARAMS)
def test_assembles_without_spills(cx):
    report = _assemble(cx).report
    assert report.arch == "sm_90a", str(report)
    assert report.spills == 0, str(report)
    assert report.stack_frame == 0 and not report.has_local_memory, str(report)
    assert not report.codes() & {"C7508", "C7515"}, str(report)
    assert report.registers is not None and report.registers <= 255, str(report)


@pytest.mark.xfail(strict=True, reason="D=128 with 3 consumers x 128-key tiles spills at 160 registers; the "
                                       "launcher uses 2 consumers at D=128")
def test_three_consumers_at_d128_spill():
    report = _assemble(KNOWN_SPILL).report
    assert report.spills == 0 and report.stack_frame == 0, str(report)


PTX_SPECS = [cx for cx in LAUNCHER_SPECS if cx.get("COORD_ORDER", ("n",))[0] == "n" and cx["DTYPE"] == ty.bf16
             and cx.get("HAS_MASK") == cx.get("RETURN_LSE")]


@pytest.mark.parametrize("cx", PTX_SPECS, ids=[_spec_id(cx) for cx in PTX_SPECS])
def test_ptx_holds_the_hopper_instructions(cx):
    ptx = _assemble(cx).ptx
    for needle in ("wgmma.mma_async", "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group",
                   "cp.async.bulk.tensor", "mbarrier.try_wait", "setmaxnreg.inc", "setmaxnreg.dec", "ex2.approx"):
        assert needle in ptx, f"{needle} missing from the PTX"
    # Consumers take tensor-core turns on named barriers: 128 threads sync and 128 arrive, so the
    # count is 256; the id may be a register (bar.sync %r7, 256). Consumer 1 opens with barrier 1.
    assert re.search(r"\b(?:bar|barrier)\.sync(?:\.aligned)?\s+(?:%r\d+|[1-9]\d*),\s*256;", ptx)
    assert re.search(r"\b(?:bar|barrier)\.arrive(?:\.aligned)?\s+1,\s*256;", ptx)
    assert ".target sm_90a" in ptx


# -- input checks -----------------------------------------------------------------------------------

def _qkv(B=1, H=2, n_q=8, n_k=8, D=64, dtype=torch.bfloat16):
    return (torch.randn(B, H, n_q, D).to(dtype), torch.randn(B, H, n_k, D).to(dtype),
            torch.randn(B, H, n_k, D).to(dtype))


def _args(**change):
    q, k, v = _qkv()
    args = dict(query=q, key=k, value=v, attn_mask=None, is_causal=False, scale=None)
    args.update(change)
    return args


def _strided_last_dim():
    return torch.randn(1, 2, 8, 128).to(torch.bfloat16)[..., ::2]


BAD_INPUTS = [
    ("query list", dict(query=[[1.0]]), TypeError, "query"),
    ("key None", dict(key=None), TypeError, "key"),
    ("value int", dict(value=3), TypeError, "value"),
    ("query 3-D", dict(query=torch.randn(2, 8, 64).to(torch.bfloat16)), ValueError, "query"),
    ("query float32", dict(query=torch.randn(1, 2, 8, 64)), TypeError, "query"),
    ("key float16", dict(key=torch.randn(1, 2, 8, 64).half()), TypeError, "key"),
    ("value float64", dict(value=torch.randn(1, 2, 8, 64).double()), TypeError, "value"),
    ("key on meta", dict(key=torch.empty(1, 2, 8, 64, dtype=torch.bfloat16, device="meta")), ValueError, "key"),
    ("head dim 96", dict(zip(("query", "key", "value"), _qkv(D=96))), ValueError, "head_dim"),
    ("head dim 48", dict(zip(("query", "key", "value"), _qkv(D=48))), ValueError, "head_dim"),
    ("batch mismatch", dict(key=torch.randn(2, 2, 8, 64).to(torch.bfloat16)), ValueError, "batch"),
    ("heads mismatch", dict(value=torch.randn(1, 3, 8, 64).to(torch.bfloat16)), ValueError, "heads"),
    ("fewer kv heads without gqa", dict(key=torch.randn(1, 1, 8, 64).to(torch.bfloat16),
                                        value=torch.randn(1, 1, 8, 64).to(torch.bfloat16)), ValueError, "heads"),
    ("gqa heads not dividing", dict(query=torch.randn(1, 3, 8, 64).to(torch.bfloat16), enable_gqa=True), ValueError,
     "heads"),
    ("gqa k/v heads differ", dict(key=torch.randn(1, 1, 8, 64).to(torch.bfloat16), enable_gqa=True), ValueError,
     "heads"),
    ("enable_gqa int", dict(enable_gqa=1), TypeError, "enable_gqa"),
    ("key head dim", dict(key=torch.randn(1, 2, 8, 32).to(torch.bfloat16)), ValueError, "head_dim"),
    ("value rows", dict(value=torch.randn(1, 2, 9, 64).to(torch.bfloat16)), ValueError, "value"),
    ("rectangular causal", dict(zip(("query", "key", "value"), _qkv(n_q=8, n_k=9)), is_causal=True), ValueError,
     "is_causal"),
    ("is_causal int", dict(is_causal=1), TypeError, "is_causal"),
    ("is_causal None", dict(is_causal=None), TypeError, "is_causal"),
    ("causal and mask", dict(is_causal=True, attn_mask=torch.ones(8, 8, dtype=torch.bool)), ValueError, "attn_mask"),
    ("mask list", dict(attn_mask=[[True]]), TypeError, "attn_mask"),
    ("mask float", dict(attn_mask=torch.zeros(8, 8)), TypeError, "attn_mask"),
    ("mask uint8", dict(attn_mask=torch.ones(8, 8, dtype=torch.uint8)), TypeError, "attn_mask"),
    ("mask shape", dict(attn_mask=torch.ones(9, 8, dtype=torch.bool)), ValueError, "attn_mask"),
    ("mask 5-D", dict(attn_mask=torch.ones(1, 1, 1, 8, 8, dtype=torch.bool)), ValueError, "attn_mask"),
    ("mask on meta", dict(attn_mask=torch.ones(8, 8, dtype=torch.bool, device="meta")), ValueError, "attn_mask"),
    ("strided query", dict(query=_strided_last_dim()), ValueError, "query"),
    ("strided value", dict(value=_strided_last_dim()), ValueError, "value"),
    ("scale str", dict(scale="0.5"), TypeError, "scale"),
    ("scale bool", dict(scale=True), TypeError, "scale"),
    ("scale tensor", dict(scale=torch.tensor(0.5)), TypeError, "scale"),
    ("scale nan", dict(scale=float("nan")), ValueError, "scale"),
    ("scale inf", dict(scale=float("inf")), ValueError, "scale"),
]


@pytest.mark.parametrize("entry", ["check_inputs", "tylopy.attention"])
@pytest.mark.parametrize("change,exc,arg", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_rejected_naming_the_argument(change, exc, arg, entry):
    if entry == "tylopy.attention" and (change.get("is_causal") is True and "key" in change
                                        or getattr(change.get("attn_mask"), "dtype", None) == torch.float32):
        pytest.skip("tylopy.attention runs these as variants (docs/attention-variants.md): a float mask is "
                    "added to the scores, a rectangular causal mask is aligned top-left as SDPA's")
    args = _args(**change)
    with pytest.raises(exc) as info:
        if entry == "check_inputs":
            check_inputs(*args.values())
        else:
            tylopy.attention(**args)
    text = str(info.value)
    assert re.search(rf"\b{re.escape(arg)}\b", text), text
    assert "expects" in text and "but got" in text, text


def test_grouped_query_heads_pass_the_checks():
    q = torch.randn(2, 8, 5, 128).to(torch.bfloat16)
    k = torch.randn(2, 2, 7, 128).to(torch.bfloat16)
    assert check_inputs(q, k, k, None, False, None, enable_gqa=True) == (2, 8, 5, 7, 128, 1 / math.sqrt(128))
    one = k[:, :1].expand(2, 8, 7, 128)  # an MQA view with a zero head stride
    assert check_inputs(q, one, one, None, False, None)[:4] == (2, 8, 5, 7)


def test_check_inputs_returns_sizes_and_scale():
    q, k, v = _qkv(B=2, H=3, n_q=5, n_k=7)
    assert check_inputs(q, k, v, None, False, None) == (2, 3, 5, 7, 64, 0.125)
    assert check_inputs(q, k, v, None, False, 1) == (2, 3, 5, 7, 64, 1.0)
    mask = torch.ones(3, 1, 7, dtype=torch.bool)  # broadcastable masks are fine
    assert check_inputs(q, k, v, mask, False, 0.5)[-1] == 0.5


@pytest.mark.parametrize("B,n_q,n_k", [(2, 5, 0), (2, 0, 5), (0, 5, 5)])
def test_empty_tensors_pass_the_checks(B, n_q, n_k):
    q, k, v = _qkv(B=B, n_q=n_q, n_k=n_k)
    assert check_inputs(q, k, v, None, False, None)[:4] == (B, 2, n_q, n_k)
    assert check_inputs(q, k, v, torch.ones(n_q, n_k, dtype=torch.bool), False, None)[:4] == (B, 2, n_q, n_k)


@pytest.mark.parametrize("n_k", [0, 8])
def test_cpu_tensors_are_rejected_after_the_checks(n_k):
    q, k, v = _qkv(n_k=n_k)
    with pytest.raises(ValueError, match=r"\bquery\b.*CUDA"):
        tylopy.attention(q, k, v)


def test_bnhd_view_passes_the_checks():
    q = torch.randn(1, 8, 2, 64).to(torch.bfloat16).transpose(1, 2)
    assert check_inputs(q, q, q, None, True, None)[:4] == (1, 2, 8, 8)


# -- tylopy check attention -----------------------------------------------------------------------------

def test_check_lists_its_cases(capsys):
    assert check_attention.main(["--list"]) == 0
    names = capsys.readouterr().out.splitlines()
    assert len(names) > 40 and "CUDA graph: bf16 1x2 300x300 causal lse" in names


def test_check_dry_run_on_the_cpu(capsys):
    assert check_attention.main(["--dry-run", "--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"\d+ passed, 0 failed", lines[-1]), lines[-1]
    assert all(line.startswith("PASS ") for line in lines[:-1]), lines


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_check_without_a_gpu_fails_with_a_reason(capsys):
    assert check_attention.main(["--quick"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "0 passed, 1 failed" and "GPU" in lines[0]


def test_former_failures_in_the_model():
    """Constant inputs pass now that the exponent is ex2((s - m) c); scale <= 0 still fails in the
    bare kernel arithmetic, which is why the entry point maps it to a positive scale."""
    for case in C.CONSTANT_CASES:
        S.run_case(case, F.fp32_model(128), device="cpu", block_n=128)
    for case in C.NONPOSITIVE_SCALE_CASES:
        with pytest.raises(AssertionError):
            S.run_case(case, F.fp32_model(128), device="cpu", block_n=128)
    assert math.isclose(R.resolve_scale(None, 64), 0.125)


# -- the benchmark's summaries and the PTX profile (no GPU) ---------------------------------------------

def test_bench_ratios_and_sweep_winners():
    from tylopy_kernels.attention.bench import forward as bench
    rows = [{"name": "tylopy", "d": 64, "causal": False, "n": 4096, "tflops": 500.0},
            {"name": "sdpa_cudnn", "d": 64, "causal": False, "n": 4096, "tflops": 450.0},
            {"name": "fa3_cute", "d": 64, "causal": False, "n": 4096, "error": "not supported"}]
    (row,) = bench.ratios(rows)
    assert row["vs_sdpa_cudnn"] == round(500 / 450, 3) and row["vs_fa3_cute"] is None
    sweep = [{"config": "default", "d": 64, "causal": True, "n": 2048, "tflops": 400.0},
             {"config": "split S", "d": 64, "causal": True, "n": 2048, "tflops": 410.0}]
    assert bench.sweep_summary(sweep) == {"D64 causal N=2048": "split S"}
    labels = [(label, d) for label, d, _, _ in bench.SWEEP]
    assert len(labels) == len(set(labels)) and ("default", 64) in labels and ("default", 128) in labels


def test_bench_variants_are_candidates_with_their_own_ratios():
    """``--variant EXPONENT=shared`` times tylopy under that schedule in the same process and
    gives it a ratio table of its own; a malformed change names the item."""
    from tylopy_kernels.attention.bench import forward as bench
    assert bench.parse_schedule("EXPONENT=shared,BLOCK_N=64,RESCALE_THRESHOLD=None") == {
        "EXPONENT": "shared", "BLOCK_N": 64, "RESCALE_THRESHOLD": None}
    with pytest.raises(SystemExit, match="KEY=VALUE.*'BLOCK_N'"):
        bench.parse_schedule("EXPONENT=shared,BLOCK_N")
    cands = bench.candidates(False, only=("tylopy",), variants=("EXPONENT=shared",))
    assert set(cands) == {"tylopy", "tylopy[EXPONENT=shared]"}
    rows = [{"name": "tylopy", "d": 64, "causal": False, "n": 4096, "tflops": 480.0},
            {"name": "tylopy[EXPONENT=shared]", "d": 64, "causal": False, "n": 4096, "tflops": 504.0},
            {"name": "fa3_cute", "d": 64, "causal": False, "n": 4096, "tflops": 520.0}]
    (row,) = bench.ratios(rows, "tylopy[EXPONENT=shared]")
    assert row["tylopy"] == 504 and row["vs_fa3_cute"] == round(504 / 520, 3) and row["vs_default"] == 1.05


def test_bench_calls_everything_once_before_timing(monkeypatch, capsys):
    """``tylopy bench attention``: every candidate is called (compiled, checked) on every shape
    before the first timing; a candidate that fails is reported, not timed; the final table holds
    each candidate's TFLOP/s and tylopy's ratios to the FA3-class kernel and to cuDNN."""
    from tylopy_kernels.attention.bench import forward as bench
    events = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def fake_candidates(causal, only=None, variants=()):
        def good(name):
            def fn(x):
                events.append(("call", name))
                return sdpa(x["q"].float(), x["k"].float(), x["v"].float(), is_causal=causal).bfloat16()
            return fn

        def broken(x):
            raise RuntimeError("no kernel for this shape")
        return {"tylopy": good("tylopy"), "fa3_cute": good("fa3_cute"), "sdpa_cudnn": broken if causal else
                good("sdpa_cudnn")}

    ms = {"tylopy": 1.0, "fa3_cute": 1.25, "sdpa_cudnn": 0.8}

    def fake_timer(fn):
        fn()
        events.append(("time", events[-1][1]))
        return ms[events[-1][1]]
    monkeypatch.setattr(bench, "candidates", fake_candidates)
    monkeypatch.setattr(bench, "TOKENS", 256)
    rows = bench.run((128, 256), (64,), bench=fake_timer, device="cpu")
    first_time = events.index(next(e for e in events if e[0] == "time"))
    # every working candidate called once on every shape before the first timed call
    assert sum(1 for e in events[:first_time - 1] if e[0] == "call") == 2 * 2 * 2 + 2
    assert len(rows) == 2 * 2 * 3 and all(r["max_err"] < 1e-2 for r in rows if "error" not in r)
    assert [r["error"][:12] for r in rows if "error" in r] == ["RuntimeError"] * 2
    bench.print_ratios(bench.ratios(rows))
    out = capsys.readouterr().out
    assert "| D | causal | N | tylopy | fa3_cute | sdpa_cudnn | tylopy / FA3-class | tylopy / cuDNN |" in out
    table = [line for line in out.splitlines() if line.startswith("| 64 | ")]
    assert len(table) == 4 and all(line.endswith(("| 1.25 | 0.80 |", "| - | 1.25 | - |")) for line in table), table
    assert "tylopy / FA3-class: geometric mean 1.250 over 4 shapes" in out


def test_ptx_profile_of_the_default_loop():
    """The steady-state loop issues one FMA-form exponent per score: 64 ex2 for the scores plus the
    two row rescale factors, and far fewer fp32 operations than the exact form's FADD + FMUL."""
    from tylopy_kernels.attention.bench import ptx_profile as ptx_profile
    cx = dict(DTYPE=ty.bf16, BLOCK_N=128, CONSUMERS=3, STAGES=2)
    ffma = ptx_profile.per_tile(_assemble(cx).ptx)
    exact = ptx_profile.per_tile(_assemble(dict(cx, EXPONENT="exact")).ptx, exact_form=True)
    assert ffma["ex2"] == exact["ex2"] == 66
    assert ffma["fp32 arith"] <= exact["fp32 arith"] - 50
