"""CPU tier of the Hopper GEMM (tylopy_kernels/gemm): every schedule assembles with ptxas without spills;
the kernel runs in the emulator bit-identical to the tensor-core accumulation model (ragged M, N
and K, both majors of A and B, bf16/fp16 in, bf16/fp16/fp32 out, bias, epilogues, cooperative
and pingpong, persistent CTAs with several tiles and a wrapping ring); the schedule geometry;
and the input checks of tylopy.matmul."""
import re

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy_kernels.gemm import epilogues
from tylopy_kernels.gemm import launch
from tylopy_kernels.gemm import check_inputs, matmul
from tylopy_kernels.gemm.hopper import gemm_sm90
from tylopy_kernels.gemm.plan import Plan
from tylopy_kernels.gemm.testing.reference import tensorcore_model
from tylopy_kernels.gemm.splitk import blocks as splitk_blocks
from tylopy_kernels.gemm.splitk import splitk_reduce

# -- ptxas ------------------------------------------------------------------------------------------


def _ptxas_specs():
    """Every launcher config twice (plain bf16; fp16 in, fp32 out, bias and GELU), and each pair of
    majors on the first config."""
    out = []
    for cfg in launch.CONFIGS:
        if cfg.get("SPLIT_K", 1) != 1:  # partial sums: f32, no bias or epilogue (the reduction has them)
            out.append(dict(cfg, SPLIT_K=3, OUT_DTYPE=ty.f32))
            continue
        out.append(dict(cfg))
        out.append(dict(cfg, DTYPE=ty.f16, OUT_DTYPE=ty.f32, HAS_BIAS=True, BIAS_DTYPE=ty.f16,
                        EPILOGUE=epilogues.gelu))
    for am in ("k", "m"):
        for bm in ("k", "n"):
            out.append(dict(launch.CONFIGS[0], A_MAJOR=am, B_MAJOR=bm))
    for cfg in launch.CONFIGS:  # the other store path of every tile shape
        if cfg.get("SPLIT_K", 1) != 1:
            continue
        other = "tma" if cfg["STORE"] == "direct" else "direct"
        alt = launch.schedule(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SCHEDULE"], cfg["GROUP_M"], store=other)
        out.append(dict(alt, OUT_DTYPE=ty.f32, HAS_BIAS=True, EPILOGUE=epilogues.silu))
    return out


PTXAS_SPECS = _ptxas_specs()


def _spec_id(cx):
    parts = [cx["SCHEDULE"][:4], f"{cx['BLOCK_M']}x{cx['BLOCK_N']}", f"s{cx['STAGES']}", cx["STORE"]]
    parts += [f"{cx.get('A_MAJOR', 'k')}{cx.get('B_MAJOR', 'n')}"]
    parts += [f"{cx.get('DTYPE', ty.bf16)}-{cx['OUT_DTYPE']}-bias-{cx['EPILOGUE'].__name__}"] if cx.get("HAS_BIAS") else []
    parts += [f"split{cx['SPLIT_K']}"] if cx.get("SPLIT_K", 1) != 1 else []
    return "-".join(parts)


@pytest.mark.parametrize("cx", PTXAS_SPECS, ids=[_spec_id(c) for c in PTXAS_SPECS])
def test_assembles_without_spills(cx):
    ck = gemm_sm90.compile(**cx)
    report = ck.report
    if not report.available:
        pytest.skip(report.note)
    assert report.arch == "sm_90a", str(report)
    assert report.spills == 0 and report.stack_frame == 0 and not report.has_local_memory, str(report)
    assert not report.codes() & {"C7508", "C7511", "C7515"}, str(report)
    ptx = ck.ptx
    for needle in ("wgmma.mma_async", "wgmma.wait_group.sync.aligned 1", "cp.async.bulk.tensor.2d",
                   "mbarrier.try_wait", "setmaxnreg.inc.sync.aligned.u32 232", "setmaxnreg.dec.sync.aligned.u32 40"):
        assert needle in ptx, f"{needle} missing from the PTX"
    assert f"m64n{cx['BLOCK_N']}k16" in ptx  # each consumer's share is BLOCK_N wide in both schedules
    if cx["STORE"] == "tma":
        assert "cp.async.bulk.tensor" in ptx and "cp.async.bulk.wait_group.read 1" in ptx


@pytest.mark.parametrize("out_dtype", [ty.bf16, ty.f16, ty.f32])
def test_split_k_reduction_assembles(out_dtype):
    report = splitk_reduce.compile(SPLITS=4, OUT_DTYPE=out_dtype, HAS_BIAS=True, BIAS_DTYPE=ty.bf16,
                                   EPILOGUE=epilogues.gelu).report
    assert report.spills == 0 and report.stack_frame == 0 or not report.available, str(report)


# -- emulator: bit-identical to the tensor-core model -----------------------------------------------

CO = dict(BLOCK_M=128, BLOCK_N=64, SCHEDULE="cooperative", GROUP_M=2, STORE="direct", STAGES=2)
PP = dict(BLOCK_M=64, BLOCK_N=64, SCHEDULE="pingpong", GROUP_M=2, STORE="direct", STAGES=3)


def _relu_np(x):
    return np.maximum(x, np.float32(0))


def _half_np(x):
    return (x * np.float32(0.5)).astype(np.float32)


EPILOGUES = {"relu": (epilogues.relu, _relu_np), "half": (epilogues.scale(0.5), _half_np)}

# (M, N, K, schedule, A major, B major, in dtype, out dtype, bias, epilogue, grid)
EMULATED = [
    (100, 72, 136, CO, "k", "n", torch.bfloat16, torch.bfloat16, None, None, 1),
    (100, 72, 136, CO, "m", "n", torch.bfloat16, torch.bfloat16, None, None, 1),
    (100, 72, 136, CO, "k", "k", torch.bfloat16, torch.float32, torch.float32, None, 1),
    (65, 130, 200, CO, "m", "k", torch.float16, torch.float16, torch.float16, "relu", 2),
    (130, 130, 70, PP, "k", "n", torch.float16, torch.float32, None, "half", 1),
    (130, 130, 200, PP, "m", "k", torch.bfloat16, torch.bfloat16, torch.bfloat16, None, 2),
    (200, 136, 64, dict(CO, BLOCK_M=256, BLOCK_N=128), "m", "n", torch.bfloat16, torch.bfloat16, None, None, 1),
    (70, 200, 100, dict(PP, BLOCK_M=128, BLOCK_N=128), "k", "k", torch.bfloat16, torch.float16, None, "relu", 1),
    (16, 90, 33, PP, "k", "n", torch.bfloat16, torch.bfloat16, torch.float32, None, 1),
    (3, 5, 1, CO, "k", "n", torch.bfloat16, torch.bfloat16, None, None, 1),
    # the TMA-store epilogue: staging buffers alternate across chunks and tiles, the TMA clips tails
    (100, 72, 136, dict(CO, STORE="tma"), "m", "k", torch.bfloat16, torch.bfloat16, torch.bfloat16, "relu", 1),
    (130, 130, 200, dict(PP, STORE="tma"), "k", "n", torch.bfloat16, torch.float32, None, None, 1),
    (70, 200, 100, dict(PP, BLOCK_M=128, BLOCK_N=128, STORE="tma"), "k", "k", torch.float16, torch.float16, None,
     "half", 2),
    (200, 300, 64, dict(CO, BLOCK_M=256, BLOCK_N=128, STORE="tma"), "m", "n", torch.bfloat16, torch.bfloat16, None,
     None, 1),
    (7, 9, 13, dict(CO, STORE="tma"), "k", "n", torch.bfloat16, torch.float32, torch.float32, None, 1),
]


def _case_id(case):
    m, n, k, cfg, am, bm, dt, odt, bias, epi, grid = case
    return (f"{m}x{n}x{k}-{cfg['SCHEDULE'][:4]}{cfg['BLOCK_M']}x{cfg['BLOCK_N']}-{cfg['STORE']}-{am}{bm}-"
            f"{str(dt)[6:]}-{str(odt)[6:]}{'-bias' if bias else ''}{'-' + epi if epi else ''}-grid{grid}")


def _operands(m, n, k, am, bm, dt, bias_dt, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dt)
    b = torch.randn(k, n, generator=g).to(dt)
    if am == "m":
        a = a.t().contiguous().t()
    if bm == "k":
        b = b.t().contiguous().t()
    bias = torch.randn(n, generator=g).to(bias_dt) if bias_dt is not None else None
    return a, b, bias


def emulate_gemm(a, b, bias, out_dtype, epilogue, cfg, grid, splits=1):
    """Run gemm_sm90 (and the split-K reduction) in the emulator as the launcher would; every
    output and workspace buffer starts as NaN (padding columns included)."""
    ops = launch.prepare(a, b)
    m, n = a.shape[0], b.shape[1]
    out = launch.output_buffer(m, n, out_dtype, "cpu")
    out.fill_(float("nan"))
    if splits == 1:
        args, cx = launch.kernel_args(ops, out, bias, epilogue, cfg, spec=True)
        return out, gemm_sm90.emulate(*args, grid=(grid,), **cx), (ops.a_major, ops.b_major)
    ws = launch.workspace(splits, m, n, "cpu").fill_(float("nan"))
    args, cx = launch.kernel_args(ops, ws, None, None, dict(cfg, SPLIT_K=splits), spec=True)
    report = gemm_sm90.emulate(*args, grid=(grid,), **cx)
    args, cx = launch.splitk_args(ws, out, bias, epilogue, m, n)
    splitk_reduce.emulate(*args, grid=(splitk_blocks(m, n),), **cx)
    return out, report, (ops.a_major, ops.b_major)


@pytest.mark.parametrize("case", EMULATED, ids=[_case_id(c) for c in EMULATED])
def test_emulated_gemm_is_the_tensor_core_model(case):
    m, n, k, cfg, am, bm, dt, odt, bias_dt, epi, grid = case
    a, b, bias = _operands(m, n, k, am, bm, dt, bias_dt, seed=m * 7 + n + k)
    epi_dsl, epi_np = EPILOGUES[epi] if epi else (None, None)
    out, report, majors = emulate_gemm(a, b, bias, odt, epi_dsl, cfg, grid)
    assert majors == (am, bm)
    expect = tensorcore_model(a, b, bias, odt, epi_np)
    assert torch.equal(out, expect), f"max |diff| {(out.float() - expect.float()).abs().max()}"
    assert not report.notes


# (M, N, K, schedule, splits, out dtype, bias, epilogue, grid): uneven k-block ranges (K = 600 is
# 10 k-blocks: 3 + 3 + 4 for S = 3), more units than CTAs, pingpong's alternating units
SPLIT = [
    (50, 70, 600, dict(PP, STAGES=2), 3, torch.bfloat16, torch.bfloat16, "relu", 2),
    (100, 130, 300, CO, 2, torch.float32, None, None, 1),
    (20, 64, 1000, dict(PP, BLOCK_N=128), 4, torch.float16, torch.float32, "half", 3),
    (70, 90, 640, dict(CO, STORE="tma"), 3, torch.bfloat16, None, None, 2),
]


@pytest.mark.parametrize("case", SPLIT, ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3]['SCHEDULE'][:4]}-{c[3]['STORE']}-S{c[4]}"
                                              for c in SPLIT])
def test_emulated_split_k_is_the_tensor_core_model(case):
    m, n, k, cfg, splits, odt, bias_dt, epi, grid = case
    a, b, bias = _operands(m, n, k, "k", "n", torch.bfloat16, bias_dt, seed=k)
    epi_dsl, epi_np = EPILOGUES[epi] if epi else (None, None)
    out, report, _ = emulate_gemm(a, b, bias, odt, epi_dsl, cfg, grid, splits)
    expect = tensorcore_model(a, b, bias, odt, epi_np, split_k=splits)
    assert torch.equal(out, expect), f"max |diff| {(out.float() - expect.float()).abs().max()}"


def test_emulated_gelu_is_close_to_float64():
    a, b, bias = _operands(70, 64, 64, "k", "n", torch.bfloat16, torch.float32, seed=3)
    out, _, _ = emulate_gemm(a, b, bias, torch.float32, epilogues.gelu, CO, 1)
    x = (a.double() @ b.double()) + bias.double()
    ref = 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))
    assert (out.double() - ref).abs().max() < 1e-5 * (1 + ref.abs().max())


# -- schedules and the launcher's choices -----------------------------------------------------------

def test_every_config_fits_and_the_heuristic_comes_first():
    for cfg in launch.CONFIGS:
        Plan(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["STAGES"], cfg["SCHEDULE"], "f32", cfg["STORE"])
    cfgs = [ty.Config(c) for c in launch.CONFIGS]
    big = launch.prune({"a": torch.empty(8192, 8192), "b": torch.empty(8192, 8192)}, cfgs)
    unsplit = [c for c in launch.CONFIGS if c.get("SPLIT_K", 1) == 1]
    assert big[0] == launch.CONFIGS[0] and len(big) == len(unsplit)  # split-K would not split here
    skinny = launch.prune({"a": torch.empty(16, 4096), "b": torch.empty(4096, 4096)}, cfgs)
    assert skinny[0]["BLOCK_M"] == 64 and len(skinny) == len(cfgs)
    assert launch.split_of(16, 4096, 4096, launch.schedule(64, 128, "pingpong", split_k="auto"), 132) == 4
    assert launch.split_of(16, 4096, 100, launch.schedule(64, 128, "pingpong", split_k="auto"), 132) == 1


@pytest.mark.parametrize("args, match", [
    ((128, 320, 4, "cooperative"), "BLOCK_N expects"),
    ((64, 256, 4, "cooperative"), "BLOCK_M expects 128 or 256"),
    ((256, 128, 4, "pingpong"), "BLOCK_M expects 64 or 128"),
    ((128, 256, 4, "pingpong"), "256 accumulator registers"),
    ((128, 256, 6, "cooperative"), "shared memory"),
    ((128, 128, 4, "stream-k"), "SCHEDULE expects"),
])
def test_plan_rejects_bad_schedules(args, match):
    with pytest.raises(ValueError, match=match):
        Plan(*args)


def test_smem_map_is_aligned_and_ordered():
    p = Plan(128, 256, 4, "cooperative", "bf16", "tma")
    assert p.a % 1024 == 0 and p.b % 1024 == 0 and p.epi % 1024 == 0
    assert p.b == 4 * p.a_bytes and p.epi == p.b + 4 * p.b_bytes and p.full % 8 == 0
    assert p.empty_count == 2 and Plan(64, 128, 4, "pingpong").empty_count == 1


def test_layouts_are_read_in_place():
    w = torch.randn(96, 64).to(torch.bfloat16)  # a Linear weight (N, K): B = w.t() is K-major
    x = torch.randn(40, 64).to(torch.bfloat16)
    a, b, am, bm = launch.prepare(x, w.t())
    assert (am, bm) == ("k", "k") and b.data_ptr() == w.data_ptr()
    a, b, am, bm = launch.prepare(x.t().contiguous().t(), w)
    assert (am, bm) == ("m", "n")
    odd = torch.randn(40, 63).to(torch.bfloat16)  # rows of 126 bytes: TMA needs 16-byte strides
    a, _, am, _ = launch.prepare(odd, torch.randn(63, 8).to(torch.bfloat16))
    assert am == "k" and a.stride(0) == 64 and torch.equal(a, odd)
    out = launch.output_buffer(5, 3, torch.bfloat16, "cpu")
    assert out.shape == (5, 3) and out.stride(0) == 8


# -- input checks -----------------------------------------------------------------------------------

def _inputs(**change):
    d = dict(a=torch.randn(8, 16).to(torch.bfloat16), b=torch.randn(16, 24).to(torch.bfloat16), bias=None,
             out_dtype=None, epilogue=None, schedule=None)
    d.update(change)
    return d


def _named_epilogue(x):
    return x


BAD = [
    (dict(a=[1, 2]), TypeError, "a expects a torch.Tensor"),
    (dict(a=torch.randn(8, 16)), TypeError, "a expects dtype torch.bfloat16 or torch.float16"),
    (dict(a=torch.randn(16).to(torch.bfloat16)), ValueError, "a expects a (..., M, K) tensor"),
    (dict(b=torch.randn(2, 16, 24).to(torch.bfloat16)), ValueError, "b expects a 2-D (K, N) tensor"),
    (dict(b=torch.randn(16, 24).to(torch.float16)), TypeError, "b expects a's dtype torch.bfloat16"),
    (dict(b=torch.randn(15, 24).to(torch.bfloat16)), ValueError, "b expects 16 rows"),
    (dict(bias=torch.randn(23)), ValueError, "bias expects a 1-D tensor of N = 24"),
    (dict(bias=torch.randn(24).to(torch.float16)), TypeError, "bias expects dtype torch.bfloat16"),
    (dict(bias=3.0), TypeError, "bias expects a torch.Tensor or None"),
    (dict(out_dtype=torch.int8), TypeError, "out_dtype expects torch.bfloat16"),
    (dict(epilogue=3), TypeError, "epilogue expects a function of one f32 value"),
    (dict(schedule=[1]), TypeError, "schedule expects a dict"),
    (dict(schedule={"TILE": 3}), ValueError, "schedule expects keys among"),
    (dict(schedule={"BLOCK_N": 320}), ValueError, "BLOCK_N expects"),
    (dict(schedule={"GROUP_M": 0}), ValueError, "GROUP_M expects a positive int"),
]


@pytest.mark.parametrize("change, exc, match", BAD, ids=[m for _, _, m in BAD])
def test_bad_input_is_rejected_naming_the_argument(change, exc, match):
    with pytest.raises(exc, match=re.escape(match)) as e:
        check_inputs(**_inputs(**change))
    assert str(e.value).startswith("matmul: ") and "but got" in str(e.value)


def test_check_inputs_returns_the_sizes():
    assert check_inputs(**_inputs()) == (8, 24, 16, torch.bfloat16)
    a = torch.randn(2, 3, 16).to(torch.float16)
    assert check_inputs(a, torch.randn(16, 5).to(torch.float16), torch.randn(5), torch.float32,
                        _named_epilogue, {"BLOCK_N": 128}) == (6, 5, 16, torch.float32)


def test_cpu_tensors_are_rejected_after_the_checks():
    with pytest.raises(ValueError, match="a expects a CUDA tensor, but got a tensor on cpu"):
        matmul(torch.randn(4, 8).to(torch.bfloat16), torch.randn(8, 4).to(torch.bfloat16))


def test_matmul_is_found_through_the_entry_point():
    assert ty.matmul is matmul
