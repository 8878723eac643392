"""tylopy.matmul on an H100/H200 against FP64: ragged shapes, both majors of A and B, bf16/fp16
inputs and bf16/fp16/fp32 outputs, bias, epilogues, every launcher schedule; NaN-filled memory
past every edge of the operands changes nothing; repeatable bits; the current stream and CUDA
graphs; the autotuner's record. ``reference.within_bound`` holds the error bound (fp32 tensor-core
accumulation plus one output rounding).

    python -m pytest -q -m gpu tests/test_gemm_gpu.py --timeout=300 --timeout-method=thread
"""
import glob
import os

import pytest
import torch

import tylopy as ty
from conftest import requires_sm90
from tylopy_kernels.gemm import epilogues
from tylopy_kernels.gemm import launch
from tylopy_kernels.gemm import matmul
from tylopy_kernels.gemm.testing.reference import reference_fp64, within_bound

try:
    import pytest_timeout  # noqa: F401
    _TIMEOUT = [pytest.mark.timeout(300)]
except ImportError:  # CPU CI: the marker would be unknown there
    _TIMEOUT = []

pytestmark = [pytest.mark.gpu, requires_sm90, *_TIMEOUT]

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def nan_padded(rows, cols, dtype, major, seed, pad=37):
    """A (rows, cols) matrix with row- ('row') or column-major ('col') storage inside a buffer
    whose every other element is NaN (past the last row, the last column and the end)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    data = torch.randn(rows, cols, device="cuda", generator=g).to(dtype)
    if major == "row":
        ld = -(-(cols + pad) // 8) * 8
        buf = torch.full((rows + pad, ld), float("nan"), device="cuda", dtype=dtype)
        buf[:rows, :cols] = data
        return buf[:rows, :cols]
    ld = -(-(rows + pad) // 8) * 8
    buf = torch.full((cols + pad, ld), float("nan"), device="cuda", dtype=dtype)
    buf[:cols, :rows] = data.t()
    return buf[:cols, :rows].t()


def check(out, a, b, bias=None, epi64=None, slope=1.0):
    ref = reference_fp64(a, b, bias, epi64)
    ok, worst = within_bound(out, a, b, ref, slope)
    assert ok, f"error {worst:.3g} x the bound (max |out - ref| {(out.double() - ref).abs().max():.3g})"


SHAPES = [(1, 1, 1), (7, 9, 13), (64, 64, 64), (100, 72, 136), (129, 257, 65), (255, 513, 1000), (1000, 300, 77),
          (16, 4096, 4096), (128, 11008, 256), (2048, 2048, 2048), (3000, 1000, 4000)]
MAJORS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("majors", MAJORS, ids=["a%s-b%s" % m for m in MAJORS])
def test_shapes_and_majors(shape, majors):
    m, n, k = shape
    a = nan_padded(m, k, torch.bfloat16, majors[0], seed=m + k)
    b = nan_padded(k, n, torch.bfloat16, majors[1], seed=n + 3 * k)
    out = matmul(a, b)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16 and out.is_contiguous()
    check(out, a, b)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("out_dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("bias_dtype", [None, "same", "fp32"])
def test_dtypes_and_bias(dtype, out_dtype, bias_dtype):
    m, n, k = 333, 517, 250
    a = nan_padded(m, k, DT[dtype], "row", seed=1)
    b = nan_padded(k, n, DT[dtype], "col", seed=2)
    bias = None
    if bias_dtype is not None:
        bias = torch.randn(n, device="cuda").to(DT[dtype] if bias_dtype == "same" else torch.float32)
    out = matmul(a, b, bias, out_dtype=DT[out_dtype])
    assert out.dtype == DT[out_dtype]
    check(out, a, b, bias)


def _gelu64(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


EPILOGUES = [("relu", epilogues.relu, torch.relu, 1.0), ("gelu", epilogues.gelu, _gelu64, 1.3),
             ("silu", epilogues.silu, torch.nn.functional.silu, 1.2), ("scale", epilogues.scale(-0.25),
                                                                      lambda x: -0.25 * x, 0.25)]


@pytest.mark.parametrize("name, fn, fn64, slope", EPILOGUES, ids=[e[0] for e in EPILOGUES])
def test_epilogues(name, fn, fn64, slope):
    m, n, k = 300, 260, 512
    a = nan_padded(m, k, torch.bfloat16, "row", seed=5)
    b = nan_padded(k, n, torch.bfloat16, "row", seed=6)
    bias = torch.randn(n, device="cuda")
    out = matmul(a, b, bias, out_dtype=torch.float32, epilogue=fn)
    # the approximate ex2/rcp add about 2^-21 relative on top of the accumulation error
    ref = reference_fp64(a, b, bias, fn64)
    err = (out.double() - ref).abs()
    tol = slope * 2.0 ** -19 * (a.double().abs() @ b.double().abs()) + 2.0 ** -20 * ref.abs() + 1e-6
    assert bool((err <= tol).all()), f"max error {err.max():.3g}"


SCHEDULES = launch.CONFIGS + [dict(c, STORE="direct") for c in launch.CONFIGS if c.get("SPLIT_K", 1) == 1]


@pytest.mark.parametrize("cfg", SCHEDULES, ids=[f"{c['SCHEDULE']}-{c['BLOCK_M']}x{c['BLOCK_N']}-s{c['STAGES']}-"
                                                f"{c['STORE']}-split{c.get('SPLIT_K', 1)}" for c in SCHEDULES])
@pytest.mark.parametrize("shape", [(129, 257, 200), (1000, 1000, 1000), (2100, 300, 130)])
def test_every_schedule(cfg, shape):
    m, n, k = shape
    a = nan_padded(m, k, torch.bfloat16, "col", seed=m)
    b = nan_padded(k, n, torch.bfloat16, "row", seed=n)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    out = matmul(a, b, bias, schedule=dict(cfg))
    check(out, a, b, bias)


@pytest.mark.parametrize("splits", [2, 3, 8, "auto"])
@pytest.mark.parametrize("shape", [(16, 4096, 4096), (128, 1000, 3000), (77, 300, 520)])
def test_split_k(shape, splits):
    m, n, k = shape
    a = nan_padded(m, k, torch.bfloat16, "row", seed=k)
    b = nan_padded(k, n, torch.bfloat16, "col", seed=n)
    bias = torch.randn(n, device="cuda")
    sched = dict(launch.schedule(64, 128, "pingpong"), SPLIT_K=splits)
    out = matmul(a, b, bias, epilogue=epilogues.relu, schedule=sched)
    check(out, a, b, bias, torch.relu)
    assert torch.equal(matmul(a, b, bias, epilogue=epilogues.relu, schedule=sched), out)  # a fixed order


def test_large_square_matches_fp64_on_a_slice():
    a = torch.randn(4096, 4096, device="cuda").to(torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda").to(torch.bfloat16)
    out = matmul(a, b)
    check(out[:256], a[:256], b)


def test_leading_dimensions_flatten_into_m():
    a = torch.randn(3, 5, 64, device="cuda").to(torch.float16)
    b = torch.randn(64, 40, device="cuda").to(torch.float16)
    out = matmul(a, b)
    assert out.shape == (3, 5, 40)
    check(out.reshape(15, 40), a.reshape(15, 64), b)


def test_empty_sizes():
    a = torch.randn(0, 16, device="cuda").to(torch.bfloat16)
    assert matmul(a, torch.randn(16, 8, device="cuda").to(torch.bfloat16)).shape == (0, 8)
    out = matmul(torch.randn(4, 0, device="cuda").to(torch.bfloat16), torch.randn(0, 8, device="cuda").to(torch.bfloat16),
                 torch.arange(8.0, device="cuda"), out_dtype=torch.float32, epilogue=epilogues.relu)
    assert torch.equal(out, torch.arange(8.0, device="cuda").expand(4, 8))


def test_repeatable_bits():
    a = torch.randn(1500, 700, device="cuda").to(torch.bfloat16)
    b = torch.randn(700, 2100, device="cuda").to(torch.bfloat16)
    first = matmul(a, b)
    for _ in range(20):
        assert torch.equal(matmul(a, b), first)


def test_runs_on_the_current_stream():
    a = torch.randn(2000, 1000, device="cuda").to(torch.bfloat16)
    b = torch.randn(1000, 3000, device="cuda").to(torch.bfloat16)
    expect = matmul(a, b)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = matmul(a, b)
    s.synchronize()
    assert torch.equal(out, expect)


def test_cuda_graph_capture_and_replay():
    a = torch.randn(500, 300, device="cuda").to(torch.bfloat16)
    b = torch.randn(300, 700, device="cuda").to(torch.bfloat16)
    expect = matmul(a, b)  # compiles and tunes outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = matmul(a, b)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect)


def test_autotune_records_a_choice(cache_dir, monkeypatch):
    monkeypatch.setenv("TYLOPY_AUTOTUNE", "force")
    launch.run.clear()
    a = torch.randn(777, 512, device="cuda").to(torch.bfloat16)
    b = torch.randn(512, 999, device="cuda").to(torch.bfloat16)
    check(matmul(a, b), a, b)
    files = glob.glob(os.path.join(str(cache_dir), "autotune", "**", "*.json"), recursive=True)
    assert len(files) == 1
    monkeypatch.delenv("TYLOPY_AUTOTUNE")
    launch.run.clear()
    chosen = launch.run.best_config(*launch.prepare(a, b)[:2], launch.output_buffer(777, 999, a.dtype, a.device),
                                    None, None, "k", "n")
    assert chosen.kwargs in launch.CONFIGS


def test_off_hopper_message_names_the_device(monkeypatch):
    from tylopy_kernels import gemm
    monkeypatch.setattr(gemm, "_capability", lambda idx: (8, 0))
    a = torch.randn(4, 8, device="cuda").to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="matmul: the device expects a Hopper GPU"):
        matmul(a, a.t())


def test_ty_matmul_is_this_function():
    assert ty.matmul is matmul
