"""``tylopy bench attention_variants``: argument parsing, the exact count of visible pairs each
variant's TFLOP/s are computed from (against brute force), its masks and modifiers against the
dense reference, the ratio table / JSON writers and the paths taken when flash_attn or CUDA is absent."""
import json
import math

import pytest
import torch

from tylopy_kernels.attention.bench import variant_cases as cases
from tylopy_kernels.attention.bench import variant_libs as libs
from tylopy_kernels.attention.bench import variants as bench


# -- arguments ------------------------------------------------------------------------------------

def test_defaults_cover_every_variant_shape_and_library():
    args = bench.parse_args([])
    assert args.variants == list(cases.VARIANTS) and args.libs == list(libs.LIBRARIES)
    assert args.d == [64, 128] and args.n == [1024, 2048, 4096, 8192, 16384] and args.direction == "both"


def test_quick_is_a_small_subset_and_tylopy_is_always_timed():
    args = bench.parse_args(["--quick", "--libs", "flex", "--direction", "bwd", "--variants", "alibi", "sinks"])
    assert args.d == [128] and args.n == [4096] and args.direction == "bwd"
    assert args.libs == ["tylopy", "flex"] and args.variants == ["alibi", "sinks"]
    assert bench.parse_args(["--quick", "--n", "2048"]).n == [2048]


@pytest.mark.parametrize("argv, words", [
    (["--n", "3000"], ["--n", "divide 16384", "3000"]),
    (["--direction", "sideways"], ["--direction", "sideways"]),
    (["--variants", "dilated"], ["dilated"]),
    (["--d", "96"], ["--d", "96"]),
])
def test_bad_arguments_name_the_argument_and_the_value(argv, words, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


# -- counting the work ----------------------------------------------------------------------------

@pytest.mark.parametrize("variant", list(cases.VARIANTS))
@pytest.mark.parametrize("n, tokens", [(64, 256), (200, 600), (1, 5)])
def test_visible_pairs_match_the_dense_mask(variant, n, tokens):
    spec = cases.make_spec(variant, 64, n, tokens=tokens, block=16)
    assert cases.visible_pairs(spec) == int(cases.dense_mask(spec).sum()) * spec.batch


def test_window_pairs_against_brute_force():
    for n in (1, 2, 5, 17, 40):
        for left in (0, 1, 3, 16, 39, 100):
            brute = sum(1 for i in range(n) for j in range(n) if i - left <= j <= i)
            assert cases.window_pairs(n, left) == brute, (n, left)
    spec = cases.make_spec("sliding_window", 64, 1500, tokens=1500)  # longer than the window
    assert cases.visible_pairs(spec) == int(cases.dense_mask(spec).sum())
    assert cases.visible_pairs(spec) < cases.causal_pairs(1500)


def test_ragged_block_table_counts_partial_edge_blocks():
    spec = cases.make_spec("block_sparse", 64, 100, tokens=100, block=32)  # 4 blocks, the last 4 rows
    assert len(spec.table) == 4 and all(spec.table[i][i] == 1 for i in range(4))
    assert cases.visible_pairs(spec) == int(cases.dense_mask(spec).sum())


def test_documents_fill_the_tokens_and_vary_in_length():
    lengths = cases.document_lengths(16384, 1024, seed=0)
    assert sum(lengths) == 16384 and len(set(lengths)) > 3
    assert all(512 <= length <= 1536 for length in lengths[:-1])
    assert cases.document_lengths(16384, 16384) == cases.document_lengths(16384, 16384)
    spec = cases.make_spec("document_varlen", 128, 1024)
    assert spec.batch == 1 and spec.seq == 16384 and spec.heads == 16
    assert cases.cu_seqlens(spec).tolist()[-1] == 16384


def test_flops_are_4d_per_pair_per_head_and_backward_two_and_a_half_times():
    spec = cases.make_spec("causal", 64, 1024)
    pairs = 16 * 1024 * 1025 // 2
    assert cases.visible_pairs(spec) == pairs
    assert cases.flops(spec, "fwd") == 4 * 64 * 32 * pairs
    assert cases.flops(spec, "bwd") == 2.5 * 4 * 64 * 32 * pairs
    with pytest.raises(ValueError, match="direction expects 'fwd' or 'bwd', but got 'up'"):
        cases.flops(spec, "up")
    with pytest.raises(ValueError, match="variant expects one of causal.*but got 'dilated'"):
        cases.make_spec("dilated", 64, 1024)


# -- masks, modifiers, the reference --------------------------------------------------------------

@pytest.mark.parametrize("variant", list(cases.VARIANTS))
def test_mask_mod_is_the_dense_mask(variant):
    spec = cases.make_spec(variant, 64, 96, tokens=384, block=32)
    i = torch.arange(spec.seq)[:, None]
    j = torch.arange(spec.seq)[None, :]
    zero = torch.zeros((), dtype=torch.int64)
    got = cases.mask_mod(spec)(zero, zero, i, j)
    assert torch.equal(got.expand(spec.seq, spec.seq), cases.dense_mask(spec))


def _inputs(spec, seed=3):
    return cases.make_inputs(spec, "cpu", seed=seed)


def test_reference_causal_is_sdpa_and_the_built_ins_reduce_to_it():
    spec = cases.make_spec("causal", 64, 48, tokens=48, heads=4)
    x = _inputs(spec)
    q, k, v = (x[n].float() for n in "qkv")
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (cases.reference(spec, x) - want).abs().max() < 1e-5
    alibi = cases.make_spec("alibi", 64, 48, tokens=48, heads=4)
    assert (cases.reference(alibi, dict(x, slopes=torch.zeros(4))) - want).abs().max() < 1e-5
    sinks = cases.make_spec("sinks", 64, 48, tokens=48, heads=4)
    assert (cases.reference(sinks, dict(x, sinks=torch.full((4,), -1e4))) - want).abs().max() < 1e-5
    # a sink takes a share of every row's mass: the output shrinks towards zero, never grows
    shrunk = cases.reference(sinks, dict(x, sinks=torch.full((4,), 3.0)))
    assert (shrunk.abs() <= want.abs() + 1e-6).all() and (shrunk.abs() < want.abs()).any()


@pytest.mark.parametrize("variant", ["softcap", "alibi"])
def test_score_mod_is_what_the_reference_applies(variant):
    spec = cases.make_spec(variant, 64, 40, tokens=40, heads=2)
    x = _inputs(spec)
    scores = torch.randn(1, 2, 40, 40) * 50
    h = torch.arange(2)[None, :, None, None]
    i = torch.arange(40)[None, None, :, None]
    j = torch.arange(40)[None, None, None, :]
    got = cases.score_mod(spec, x["slopes"])(scores, torch.zeros(()), h, i, j)
    if variant == "softcap":
        assert got.abs().max() <= cases.SOFTCAP and torch.allclose(got, 30 * torch.tanh(scores / 30))
    else:
        assert torch.allclose(got, scores - x["slopes"][h] * (i - j).abs())
    assert cases.score_mod(cases.make_spec("causal", 64, 40, tokens=40), None) is None


def test_alibi_slopes_are_the_geometric_sequence():
    slopes = cases.alibi_slopes(8)
    assert slopes.dtype == torch.float32 and math.isclose(slopes[0].item(), 0.5) and math.isclose(
        slopes[-1].item(), 2.0 ** -8)


def test_layouts_round_trip():
    spec = cases.make_spec("document_varlen", 64, 32, tokens=128, heads=2)
    x = _inputs(spec)
    for layout in ("bhnd", "bnhd", "thd"):
        (q, _, _), dout, to_common = libs._leaves(x, layout)
        assert q.requires_grad and torch.equal(to_common(q.detach()), x["q"])
        assert torch.equal(to_common(dout), x["dout"])


# -- ratios, table, JSON --------------------------------------------------------------------------

def _row(lib, tflops=None, variant="causal", n=1024, direction="fwd", **extra):
    row = {"library": lib, "variant": variant, "d": 64, "n": n, "direction": direction}
    if tflops:
        row.update(tflops=tflops, ms=1.0 / tflops)
    return dict(row, **extra)


def _rows():
    return [_row("tylopy", 400), _row("fa3_cute", 500), _row("flex", 200),
            _row("tylopy", 300, n=2048), _row("fa3_cute", unavailable="flash_attn.cute does not import", n=2048),
            _row("flex", error="RuntimeError: no", n=2048),
            _row("tylopy", error="TypeError: window_size", variant="sliding_window"),
            _row("flex", 100, "sliding_window")]


def test_ratios_are_against_tylopy_on_the_same_point():
    rows = bench.with_ratios(_rows())
    by = {(r["library"], r["variant"], r["n"]): r["ratio_vs_tylopy"] for r in rows}
    assert by[("tylopy", "causal", 1024)] == 1.0 and by[("fa3_cute", "causal", 1024)] == 1.25
    assert by[("flex", "causal", 1024)] == 0.5 and by[("flex", "sliding_window", 1024)] is None
    table = bench.ratio_table(rows)
    first = table[0]
    assert (first["variant"], first["n"]) == ("causal", 1024)
    assert (first["tylopy_vs_fa3_cute"], first["tylopy_vs_flex"]) == (0.8, 2.0)
    second = table[1]
    assert second["fa3_cute_why"] == "unavailable" and second["flex_why"] == "not supported"
    assert table[2]["variant"] == "sliding_window" and table[2]["tylopy_why"] == "not supported"


def test_markdown_shows_every_point_and_counts_the_losses():
    lines = bench.markdown(bench.ratio_table(bench.with_ratios(_rows())))
    text = "\n".join(lines)
    assert "| causal | 64 | 1024 | fwd | 400 | 500 | 200 | 0.80 (loss) | 2.00 |" in text
    assert "| causal | 64 | 2048 | fwd | 300 | unavailable | not supported | - | - |" in text
    assert "| sliding_window | 64 | 1024 | fwd | not supported | not run | 100 | - | - |" in text
    assert "| causal | 64 | fwd | 0.80 (1 of 1 below 1) | 2.00 (0 of 1 below 1) |" in text


def test_json_writer_and_merge(tmp_path, capsys):
    first, second = tmp_path / "a.json", tmp_path / "b" / "b.json"
    bench.write_json(str(first), {"rows": _rows()[:3], "checks": [{"library": "tylopy", "variant": "causal", "d": 64}]})
    bench.write_json(str(second), {"rows": [_row("flex", 250)], "checks": []})
    rows, checks = bench.merge([str(first), str(second)])
    assert len(rows) == 3 and {r["library"]: r.get("tflops") for r in rows}["flex"] == 250 and len(checks) == 1
    out = tmp_path / "merged.json"
    assert bench.main(["--merge", str(first), str(second), "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["ratios"][0]["tylopy_vs_flex"] == 1.6 and data["merged_from"] == [str(first), str(second)]
    assert any("tylopy / flex" in line for line in data["markdown"])
    assert "| causal | 64 | 1024 | fwd | 400 | 500 | 250 |" in capsys.readouterr().out


def test_each_variant_and_d_reports_progress_that_merge_reads(tmp_path, monkeypatch, capsys):
    """A run cut short by a time limit keeps the rows written after each (variant, D)."""
    monkeypatch.setattr(bench, "measure", lambda lib, spec, x, directions, timer: [
        dict(bench.base_row(lib, spec, d), ms=1.0, tflops=100.0) for d in directions])
    monkeypatch.setattr(cases, "make_inputs", lambda spec, device: {})
    partial = tmp_path / "run.partial.json"
    seen = []

    def progress(rows, checks):
        seen.append(len(rows))
        bench.write_json(str(partial), dict(rows=rows, checks=checks))
    rows, _ = bench.time_all(["causal", "softcap"], [64, 128], [1024], ["tylopy"], ("fwd",), bench=None,
                             checked=False, progress=progress)
    assert seen == [1, 2, 3, 4] and len(rows) == 4
    merged, _ = bench.merge([str(partial)])
    assert {(r["variant"], r["d"]) for r in merged} == {("causal", 64), ("causal", 128), ("softcap", 64), ("softcap", 128)}


def test_a_failed_numerics_check_is_marked_in_the_table_and_the_report(tmp_path, capsys):
    """An error past CHECK_LIMIT marks that library's timings "(check failed)" and lists the check under
    the table: a wrong kernel's speed is not a result."""
    checks = [dict(library="tylopy", variant="causal", d=64, n=1024, fwd_err=8e-3, bwd_err=15.1),
              dict(library="fa3_cute", variant="causal", d=64, n=1024, fwd_err=8e-3, bwd_err=1.7e-2)]
    assert bench.failed_checks(checks[0]) == ["bwd"] and bench.failed_checks(checks[1]) == []
    assert bench.failed_checks(dict(fwd_err=float("nan"))) == ["fwd"]
    assert "CHECK FAILED (bwd: past 0.1)" in bench.format_check(checks[0])
    where = dict(checks[0], bwd_worst={"dq": {"err": 15.1, "at": (0, 3, 100, 5)}})
    assert "dq 1.51e+01 at (0, 3, 100, 5)" in bench.format_check(where)
    diff = torch.zeros(1, 2, 5, 3)
    diff[0, 1, 3, 2] = -7.0
    assert bench._worst(diff) == (7.0, (0, 1, 3, 2))
    bench.report(_rows(), checks, str(tmp_path / "r.json"), str(tmp_path / "r.png"), cuda=False)
    data = json.loads((tmp_path / "r.json").read_text())
    text = "\n".join(data["markdown"])
    assert "| causal | 64 | 1024 | fwd | 400 (check failed) | 500 | 200 |" in text
    assert "Numerics checks that FAILED" in text and "CHECK FAILED" in capsys.readouterr().out
    flagged = {(r["library"], r["n"]): r.get("check_failed") for r in data["rows"] if r["variant"] == "causal"}
    assert flagged[("tylopy", 1024)] is True and flagged[("fa3_cute", 1024)] is False


# -- absent libraries, failing calls, no CUDA -----------------------------------------------------

def _cpu_case():
    spec = cases.make_spec("causal", 64, 64, tokens=128, heads=2)
    return spec, _inputs(spec)


def test_absent_flash_attn_is_unavailable_not_fatal(monkeypatch):
    monkeypatch.setattr(libs, "fa3_import", lambda: (None, "ModuleNotFoundError: No module named 'flash_attn'"))
    spec, x = _cpu_case()
    rows = bench.measure("fa3_cute", spec, x, ("fwd", "bwd"), bench=lambda fn: 1.0, synchronize=lambda: None)
    assert [r["direction"] for r in rows] == ["fwd", "bwd"]
    assert all("No module named 'flash_attn'" in r["unavailable"] and "tflops" not in r for r in rows)
    assert "unavailable (flash_attn.cute does not import" in bench.format_row(rows[0])
    assert rows[0]["pairs"] == 2 * 64 * 65 // 2 and rows[1]["flops"] == 2.5 * rows[0]["flops"]


def test_a_library_call_that_raises_is_reported_per_row(monkeypatch):
    def refuse(spec, x):
        def forward():
            raise TypeError("attention() got an unexpected keyword argument 'sinks'")
        return libs.Run(forward, [], None, lambda t: t)
    monkeypatch.setitem(libs.BUILDERS, "tylopy", refuse)
    spec, x = _cpu_case()
    rows = bench.measure("tylopy", spec, x, ("fwd", "bwd"), bench=lambda fn: 1.0, synchronize=lambda: None)
    assert all("unexpected keyword argument 'sinks'" in r["error"] for r in rows)
    assert "tylopy: not supported (TypeError: attention() got an unexpected keyword" in bench.format_row(rows[0])
    check = dict(bench.check_one("tylopy", spec, x, None, ("fwd", "bwd")), library="tylopy", variant="causal", d=64)
    assert "unexpected keyword argument" in check["fwd_error"] and "bwd_error" in check
    assert "fwd err not supported (TypeError: attention() got an unexpected" in bench.format_check(check)


def test_the_check_runs_where_the_variant_differs_from_causal():
    assert bench.check_n("sliding_window", [1024, 2048, 4096]) == 2048
    assert bench.check_n("sliding_window", [1024]) == 1024 and bench.check_n("causal", [4096, 1024]) == 1024


@pytest.mark.parametrize("variant", ["alibi", "sinks", "document_mask"])
def test_reference_in_head_chunks_is_the_whole_reference(variant):
    spec = cases.make_spec(variant, 64, 32 if variant == "document_mask" else 64, tokens=128, heads=5)
    x = _inputs(spec)
    whole = bench.reference_grads(spec, x)
    chunked = bench.reference_grads(spec, x, chunk=2 * spec.seq * spec.seq)  # heads 0-1, 2-3, 4
    assert all(w.shape == (1, 5, spec.seq, 64) for w in whole)
    assert all(torch.allclose(w, c, atol=1e-6) for w, c in zip(whole, chunked))
    assert torch.allclose(whole[0], cases.reference(spec, x)[:1], atol=1e-6)
    assert bench.reference_grads(spec, x, backward=False)[1:] == (None, None, None)


def test_a_working_library_is_timed_with_the_exact_flops(capsys):
    spec, x = _cpu_case()

    def sdpa(spec, x):
        (q, k, v), dout, to_common = libs._leaves(x, "bhnd")
        return libs.Run(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                        [q, k, v], dout, to_common)
    libs.BUILDERS["sdpa_test"] = sdpa
    try:
        rows = bench.measure("sdpa_test", spec, x, ("fwd", "bwd"), bench=lambda fn: (fn(), 2.0)[1],
                             synchronize=lambda: None)
        errs = bench.check(spec, x, ["sdpa_test"], ("fwd", "bwd"))[0]
    finally:
        del libs.BUILDERS["sdpa_test"]
    assert [r["ms"] for r in rows] == [2.0, 2.0]
    assert rows[0]["tflops"] == cases.flops(spec, "fwd") / 2.0 / 1e9
    assert errs["fwd_err"] < 2e-2 and errs["bwd_err"] < 5e-2 and errs["n"] == 64
    assert "| check: sdpa_test | causal | 64 | 64 | fwd err" in capsys.readouterr().out


def test_no_cuda_returns_2_with_a_message(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_unknown_library_names_the_argument():
    spec, x = _cpu_case()
    with pytest.raises(ValueError, match="library expects one of tylopy, fa3_cute, flex, but got 'xformers'"):
        libs.build("xformers", spec, x)


@pytest.mark.gpu
@pytest.mark.slow
def test_quick_run_on_gpu(tmp_path):
    """The bench end to end on two variants: every check that ran is close to fp32."""
    out = tmp_path / "v.json"
    assert bench.main(["--quick", "--variants", "causal", "softcap", "--output", str(out), "--rep-ms", "20"]) == 0
    data = json.loads(out.read_text())
    assert {r["library"] for r in data["rows"]} >= {"tylopy", "flex"}
    for c in data["checks"]:
        if "fwd_err" in c:
            assert c["fwd_err"] < 3e-2, c
        if "bwd_err" in c:
            assert c["bwd_err"] < 1e-1, c


@pytest.mark.parametrize("variant", list(cases.VARIANTS))
def test_flex_forms_of_the_variants_match_the_fp32_reference(variant, monkeypatch):
    """The masks, score_mods and the sink rescale the bench gives flex_attention compute the variant
    (eager flex on the CPU, forward only: flex has no CPU backward)."""
    flex_attention = pytest.importorskip("torch.nn.attention.flex_attention").flex_attention
    monkeypatch.setattr(libs, "_COMPILED", {"flex": flex_attention, "flex_sinks": libs._flex_with_sinks})
    leaves = libs._leaves

    def without_grad(x, layout):
        qkv, dout, to_common = leaves(x, layout)
        return [t.detach() for t in qkv], dout, to_common
    monkeypatch.setattr(libs, "_leaves", without_grad)
    n = 64 if variant in cases.DOCUMENT_VARIANTS else 256
    spec = cases.make_spec(variant, 64, n, tokens=256, heads=2)
    x = cases.make_inputs(spec, "cpu", seed=1)
    got = bench.check_one("flex", spec, x, (cases.reference(spec, x),), ("fwd",))
    assert got["fwd_err"] < 3e-2, got
