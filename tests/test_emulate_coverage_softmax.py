"""Every softmax kernel (``tylopy_kernels/softmax``) run in the emulator against an FP64 softmax.

The launchers need a GPU, so the kernels are called as the launchers call them: the row kernel,
the streaming kernel (both VEC forms, each dtype), the full-row kernel (one warp a row, and several
warps sharing a row through shared memory) and the three-pass kernel. Widths leave a ragged last
chunk, the row count a ragged last block; rows include an all -inf row (zeros) and logits near
+-3e4. ``tools/mutations.py`` runs these tests against planted bugs.
"""
import math

import pytest
import torch

import tylopy as ty

row_mod = pytest.importorskip("tylopy_kernels.softmax.row")
S = pytest.importorskip("tylopy_kernels.softmax.streaming")

DTYPES = {"f32": (torch.float32, ty.f32), "f16": (torch.float16, ty.f16), "bf16": (torch.bfloat16, ty.bf16)}
# |out - ref| <= RTOL |ref| + ATOL: the output rounding plus ex2.approx and rcp (2^-22 each) in float32;
# ATOL: float32 math flushes subnormals (ftz), and fp16 has a smallest subnormal of 2^-24.
RTOL = {torch.float32: 2e-6, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
ATOL = {torch.float32: 2.0 ** -126, torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -126}


def logits(rows, cols, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(rows, cols, generator=g)
    x[1] = float("-inf")  # an empty row: zeros
    if rows > 3:
        x[3] += 3e4 if dtype != torch.float16 else 6e4 / 2  # large logits lose no accuracy
    return x.to(dtype)


def reference(x):
    x64 = x.double()
    m = x64.amax(1, keepdim=True)
    p = torch.exp(x64 - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    s = p.sum(1, keepdim=True)
    return torch.where(s > 0, p / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(p))


def check(out, x):
    ref = reference(x)
    err = (out.double() - ref).abs()
    bound = RTOL[x.dtype] * ref.abs() + ATOL[x.dtype]
    assert torch.isfinite(out).all(), "NaN or inf in the output"
    worst = float((err - bound).max())
    assert worst <= 0, f"error {float(err.max()):.3e} exceeds the bound by {worst:.3e}"


def _grid(rows):
    return ((rows + S.WARPS - 1) // S.WARPS,)


def run_row(seed=None):
    x = logits(10, 300, torch.float32, 1)
    out = torch.full_like(x, float("nan"))
    row_mod.row_softmax.emulate(x, out, 10, 300, grid=((10 + row_mod.WARPS - 1) // row_mod.WARPS,), seed=seed)
    check(out, x)


def run_streaming(dt, vec, seed=None):
    cols = 2 * S.CHUNK + S.CHUNK + 40 + (vec == 1)  # a pair, one whole chunk, a ragged tail
    tdt, kdt = DTYPES[dt]
    x = logits(6, cols, tdt, 2)
    out = torch.full_like(x, float("nan"))
    S.streaming_kernel(kdt).emulate(x, out, 6, cols, grid=_grid(6), VEC=vec, seed=seed)
    check(out, x)


def run_full_row(dt, cols, vec, seed=None):
    tdt, kdt = DTYPES[dt]
    rows = 5 if cols <= S.MAX_ONE_WARP_COLS else 2
    x = logits(rows, cols, tdt, 3)
    out = torch.full_like(x, float("nan"))
    warps = S.full_row_warps(cols)
    grid = _grid(rows) if warps == 1 else (rows,)
    S.full_row_kernel(kdt).emulate(x, out, rows, grid=grid, COLS=cols, VEC=vec, WARPS_PER_ROW=warps, seed=seed)
    check(out, x)


def run_three_pass(dt, seed=None):
    tdt, kdt = DTYPES[dt]
    x = logits(7, 77, tdt, 4)
    out = torch.full_like(x, float("nan"))
    S.three_pass_kernel(kdt).emulate(x, out, 7, 77, grid=_grid(7), seed=seed)
    check(out, x)


CASES = {
    "row": lambda: run_row(),
    "streaming-f32-vec4": lambda: run_streaming("f32", 4),
    "streaming-f32-vec1": lambda: run_streaming("f32", 1),
    "streaming-bf16-vec4": lambda: run_streaming("bf16", 4),
    "streaming-f16-vec1": lambda: run_streaming("f16", 1),
    "full-row-f32": lambda: run_full_row("f32", 300, 4),
    "full-row-f16-vec1": lambda: run_full_row("f16", 301, 1),
    "full-row-4-warps": lambda: run_full_row("f32", 4100, 4),
    "three-pass-f32": lambda: run_three_pass("f32"),
    "three-pass-bf16": lambda: run_three_pass("bf16"),
}


@pytest.mark.parametrize("case_id", list(CASES))
def test_softmax(case_id):
    CASES[case_id]()


@pytest.mark.parametrize("seed", [1, 2])
def test_softmax_random_schedules(seed):
    run_full_row("f32", 4100, 4, seed=seed)
    run_streaming("f32", 4, seed=seed)


def test_reference_is_torch_softmax():
    x = logits(5, 50, torch.float32, 9)
    want = torch.softmax(x.double(), 1).nan_to_num(0.0)
    assert torch.allclose(reference(x), want, rtol=1e-12, atol=0)
    assert math.isclose(float(reference(x)[0].sum()), 1.0, rel_tol=1e-12)
