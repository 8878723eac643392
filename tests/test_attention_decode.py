"""Split-KV decode on the CPU: the kernels in the emulator against an FP64 reference (ragged and
empty sequences, GQA, paged and contiguous caches, causal bottom-right alignment, both merges,
NaN past every sequence end and in unused pages), the schedule heuristic, ptxas reports (no
spills) and input checks. GPU tests: tests/test_attention_decode_gpu.py."""
import math

import pytest
import torch

import tylopy

from attention_decode_cases import DecodeCase, check_result, make_inputs, scale_of
from tylopy_kernels.attention.decode import kernel as kd
from tylopy_kernels.attention.decode import launch as dl

SMALL = dict(WARPS=2, WARP_KEYS=16, STAGES=2)

CASES = [
    DecodeCase("gqa2-ragged-split2", (37, 80), splits=2, schedule=SMALL),
    DecodeCase("gqa2-ragged-split2-atomic", (37, 80), splits=2, merge="atomic", schedule=SMALL),
    DecodeCase("no-split-direct-output", (37, 80), splits=1, schedule=SMALL),
    DecodeCase("lengths-0-and-1-atomic", (0, 1), n_q=3, h_q=8, h_kv=1, causal=True, cap=48, splits=3,
               merge="atomic", schedule=SMALL),
    DecodeCase("causal-nq3-shorter-than-queries", (5, 2, 33), n_q=3, causal=True, cap=48, splits=3,
               schedule=dict(SMALL, Q_SMEM=False)),
    DecodeCase("two-row-tiles-gqa4-nq5", (40, 17), n_q=5, h_q=8, h_kv=2, causal=True, cap=64, splits=2,
               schedule=SMALL),
    DecodeCase("two-row-blocks-gqa8-nq5", (40, 17), n_q=5, h_q=8, h_kv=1, causal=True, cap=64, splits=2,
               schedule=dict(SMALL, ROW_TILES=1)),
    DecodeCase("paged16-nan-pages", (37, 80), page_size=16, splits=2, schedule=SMALL),
    DecodeCase("paged32-d128-causal-4warps", (100, 129), n_q=2, head_dim=128, page_size=32, causal=True,
               splits=2, merge="atomic", schedule=dict(WARPS=4, WARP_KEYS=16, STAGES=3)),
    DecodeCase("bhsd-fp16-many-splits", (300, 1, 64), h_q=4, h_kv=4, layout="bhsd", dtype=torch.float16,
               splits=5, schedule=dict(WARPS=2, WARP_KEYS=32, STAGES=3)),
    DecodeCase("d128-default-schedule-mqa", (129, 250), h_q=8, h_kv=1, head_dim=128, splits=3),
    DecodeCase("more-splits-than-tiles", (20, 70), splits=7, merge="atomic", schedule=SMALL),
]


def _emulate(case, seed=None):
    q, k, v, lens, table = make_inputs(case)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    B, H_q = len(case.lens), case.h_q
    lse = torch.full((B, H_q, case.n_q), float("nan"))
    opts = dl.DecodeOptions(scale=scale_of(case), is_causal=case.causal, num_splits=case.splits, layout=case.layout,
                            merge=case.merge, schedule=case.schedule)
    steps = dl.plan_decode(dl.DecodeTensors(q, k, v, lens, table), out, lse, opts)
    for step in steps:
        step.emulate(**({} if seed is None else {"seed": seed}))
    ref_out, ref_lse = dl.reference_decode(q, k, v, lens, scale=scale_of(case), block_table=table,
                                           is_causal=case.causal, layout=case.layout)
    return out, lse, ref_out, ref_lse, steps


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_emulated_decode_matches_fp64(case):
    out, lse, ref_out, ref_lse, steps = _emulate(case)
    check_result(case, out, lse, ref_out, ref_lse)
    assert len(steps) == (2 if (case.splits or 1) > 1 and case.merge == "kernel" else 1)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_schedules_keep_the_pipeline_ordered(seed):
    """Warps in a random order and copies landing at random points before their waits: the per-warp
    rings (cp.async groups + named barriers) and the arrival counter still give the same answer."""
    case = DecodeCase("random-schedule", (37, 80), n_q=2, causal=True, page_size=16, splits=2, merge="atomic",
                      schedule=dict(WARPS=2, WARP_KEYS=16, STAGES=3))
    out, lse, ref_out, ref_lse, _ = _emulate(case, seed=seed)
    check_result(case, out, lse, ref_out, ref_lse)


def test_both_merges_give_the_same_bits():
    """The fused merge reads the partials in split order like the merge kernel: same bits."""
    base = DecodeCase("merge-bits", (90, 47), n_q=2, causal=True, splits=3, schedule=SMALL)
    outs = []
    for merge in dl.MERGES:
        case = DecodeCase(**{**base.__dict__, "merge": merge})
        out, lse, *_ = _emulate(case)
        outs.append((out.view(torch.int16), lse))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_counters_are_reset_for_the_next_launch():
    case = DecodeCase("counters", (50, 20), splits=3, merge="atomic", schedule=SMALL)
    q, k, v, lens, table = make_inputs(case)
    out = torch.empty_like(q)
    steps = dl.plan_decode(dl.DecodeTensors(q, k, v, lens), out, None,
                           dl.DecodeOptions(scale=scale_of(case), num_splits=3, merge="atomic", schedule=SMALL))
    counters = steps[0].args["counters"]
    counters.fill_(0)
    steps[0].emulate()
    assert (counters == 0).all()


def test_strided_lengths_and_tables():
    """The kernels take each tensor with its strides: cache_seqlens as a zero-stride expand view or a
    strided slice, a block table stored column by column (the launcher copies it: the kernel reads a
    row's entries at stride 1) and one shared by every sequence (batch stride 0)."""
    case = DecodeCase("strided", (40, 40, 40), n_q=2, causal=True, page_size=16, splits=2, merge="atomic",
                      schedule=SMALL)
    q, k, v, _, table = make_inputs(case)
    shared = table[:1].expand_as(table)
    for lens in (torch.tensor([40], dtype=torch.int32).expand(3),
                 torch.tensor([40, -7, 40, -7, 40, -7], dtype=torch.int32)[::2]):
        for tab in (table.t().contiguous().t(), shared):
            out = torch.full(q.shape, float("nan"), dtype=q.dtype)
            lse = torch.full((3, case.h_q, case.n_q), float("nan"))
            opts = dl.DecodeOptions(scale=scale_of(case), is_causal=True, num_splits=2, merge="atomic",
                                    schedule=SMALL)
            for step in dl.plan_decode(dl.DecodeTensors(q, k, v, lens, tab), out, lse, opts):
                step.emulate()
            ref_out, ref_lse = dl.reference_decode(q, k, v, lens.contiguous(), scale=scale_of(case),
                                                   block_table=tab.contiguous(), is_causal=True)
            check_result(case, out, lse, ref_out, ref_lse)


# -- the schedule ------------------------------------------------------------------------------------------

def test_split_heuristic():
    # one sequence, 8 kv heads, 132 SMs x 2 CTAs: fill the slots; a full batch needs no split
    cx, rb, s = dl.plan_schedule(dl.DecodeShape(1, 1, 32, 8, 128, 8192, 0), 132)
    assert rb == 1 and cx["ROW_TILES"] == 1 and 8 * s >= 0.85 * 132 * dl.max_ctas_per_sm(cx)
    assert dl.plan_schedule(dl.DecodeShape(64, 1, 32, 8, 128, 8192, 0), 132)[2] == 1
    assert dl.plan_schedule(dl.DecodeShape(1, 1, 32, 8, 128, 64, 0), 132)[2] == 1          # one tile: nothing to split
    assert dl.plan_schedule(dl.DecodeShape(1, 1, 32, 8, 128, 1 << 17, 0), 132, num_splits=7)[2] == 7
    cx, rb, _ = dl.plan_schedule(dl.DecodeShape(2, 8, 32, 8, 128, 4096, 48), 132)           # 32 rows: two M tiles
    assert cx["ROW_TILES"] == 2 and rb == 1 and cx["WARP_KEYS"] == 16       # 48-key pages: 16-key blocks
    assert dl.plan_schedule(dl.DecodeShape(2, 16, 32, 4, 64, 4096, 0), 132)[1] == 4         # 128 rows: four blocks of 32


@pytest.mark.parametrize("eff_base", [1, 3, 8, 40, 100])
def test_split_choice_fills_most_slots(eff_base):
    s = dl.choose_splits(eff_base, 10_000, 264)
    waves = eff_base * s / 264
    assert waves / math.ceil(waves) >= 0.8


# -- ptxas -----------------------------------------------------------------------------------------------

SPECS = [dict(dl.SCHEDULE[d], HEAD_DIM=d, ROW_TILES=rt, SPLIT=split, FUSED_MERGE=fused, PAGED=paged,
              RETURN_LSE=True)
         for d in kd.HEAD_DIMS for rt in (1, 2) for split, fused, paged in
         ((False, False, False), (True, False, True), (True, True, False))]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("cx", SPECS, ids=[f"d{c['HEAD_DIM']}-rt{c['ROW_TILES']}-split{int(c['SPLIT'])}"
                                           f"-fused{int(c['FUSED_MERGE'])}-paged{int(c['PAGED'])}" for c in SPECS])
def test_decode_assembles_without_spills(cx, arch):
    ck = kd.attention_decode_fwd.with_arch(arch).compile(**cx)
    report = ck.report
    if not report.available:
        pytest.skip(report.note)
    assert report.spills == 0 and report.stack_frame == 0, str(report)
    assert kd.smem_bytes(**cx) <= 227 * 1024


@pytest.mark.parametrize("d", kd.HEAD_DIMS)
def test_merge_kernel_assembles(d):
    report = kd.attention_decode_merge.compile(HEAD_DIM=d, RETURN_LSE=True).report
    if not report.available:
        pytest.skip(report.note)
    assert report.spills == 0 and report.registers <= 64, str(report)


# -- input checks (no GPU needed) ------------------------------------------------------------------------

def _inputs(**kw):
    case = DecodeCase("x", (10, 20), **kw)
    return make_inputs(case)


@pytest.mark.parametrize("change, exc, text", [
    (lambda a: a.update(q=a["q"].float()), TypeError, "q expects dtype torch.bfloat16 or torch.float16"),
    (lambda a: a.update(k_cache=a["k_cache"][..., :32]), ValueError, "v_cache expects k_cache's shape"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), TypeError, "cache_seqlens expects a torch.int32"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"][:1]), ValueError, "cache_seqlens expects"),
    (lambda a: a.update(layout="sbhd"), ValueError, "layout expects one of"),
    (lambda a: a.update(merge="tree"), ValueError, "merge expects one of"),
    (lambda a: a.update(num_splits=0), ValueError, "num_splits expects None or an int"),
    (lambda a: a.update(is_causal=1), TypeError, "is_causal expects a bool"),
    (lambda a: a.update(scale=float("nan")), ValueError, "scale expects a finite float"),
])
def test_bad_inputs_are_named(change, exc, text):
    q, k, v, lens, _ = _inputs()
    a = dict(q=q, k_cache=k, v_cache=v, cache_seqlens=lens)
    change(a)
    with pytest.raises(exc, match="attention_decode: " + text.replace("(", r"\(").replace(")", r"\)")):
        tylopy.attention_decode(**a)


def test_bad_heads_and_pages_are_named():
    q, k, v, lens, _ = _inputs(h_q=6, h_kv=4)
    with pytest.raises(ValueError, match="k_cache heads expects a divisor of the 6 query heads"):
        tylopy.attention_decode(q, k, v, lens)
    q, k, v, lens, table = _inputs(page_size=16)
    with pytest.raises(ValueError, match="page size"):
        tylopy.attention_decode(q, k[:, :8], v[:, :8], lens, block_table=table)
    with pytest.raises(TypeError, match="block_table expects dtype torch.int32"):
        tylopy.attention_decode(q, k, v, lens, block_table=table.long())


def test_cpu_tensors_are_refused_after_the_checks():
    q, k, v, lens, _ = _inputs()
    with pytest.raises(ValueError, match="q expects a CUDA tensor"):
        tylopy.attention_decode(q, k, v, lens)
