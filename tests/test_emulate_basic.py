"""The CPU emulator on plain kernels: vector add, a shuffle row reduction, divergence, shared
memory, vector and masked accesses, argument handling and timings."""
import time

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.emulate import EmulationReport, MemoryAccessError, ProtocolError, emulate_kernel
from tylopy_kernels.examples.vector_add import vector_add
from emulate_dsl import line_of

HERE = __file__
WARPS = 4


@ty.kernel(threads=WARPS * 32)
def row_sum(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), rows: ty.i32, cols: ty.i32):
    lane = ty.lane_id()
    row = ty.block_idx() * WARPS + (ty.thread_idx() >> 5)
    if row < rows:
        acc = ty.cast(0.0, ty.f32)
        for c in range(lane, cols, 32):
            acc = acc + x[row * cols + c]
        for off in (16, 8, 4, 2, 1):
            acc = acc + ty.shfl_xor(acc, off)
        if lane == 0:
            out[row] = acc


def row_sum_model(x: np.ndarray) -> np.ndarray:
    """The kernel's own order of f32 additions: per-lane strided sums, then the butterfly."""
    rows, cols = x.shape
    out = np.zeros(rows, dtype=np.float32)
    lanes = np.arange(32)
    for r in range(rows):
        p = np.zeros(32, dtype=np.float32)
        for c0 in range(0, cols, 32):
            chunk = x[r, c0:c0 + 32]
            p[: len(chunk)] = p[: len(chunk)] + chunk
        for off in (16, 8, 4, 2, 1):
            p = p + p[lanes ^ off]
        out[r] = p[0]
    return out


@ty.kernel(threads=64)
def divergent(out: ty.ptr(ty.i32), n: ty.i32):
    t = ty.thread_idx()
    acc = ty.cast(0, ty.i32)
    for k in range(t % 7):  # a different trip count in every lane
        if k % 2 == 0:
            acc = acc + k
        else:
            acc = acc * 3
    x = t + 1
    steps = ty.cast(0, ty.i32)
    while x != 1:  # Collatz: lanes leave the loop one by one
        if x % 2 == 0:
            x = x // 2
        else:
            x = 3 * x + 1
        steps = steps + 1
    if t < n:
        out[2 * t] = acc
        out[2 * t + 1] = steps


def divergent_model(n):
    out = []
    for t in range(64):
        acc = 0
        for k in range(t % 7):
            acc = acc + k if k % 2 == 0 else acc * 3
        x, steps = t + 1, 0
        while x != 1:
            x = x // 2 if x % 2 == 0 else 3 * x + 1
            steps += 1
        out += [acc, steps]
    return out[: 2 * n]


@ty.kernel(threads=128)
def reverse_block(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    buf = ty.shared(ty.f32, 128)
    t = ty.thread_idx()
    base = ty.block_idx() * 128
    buf[t] = x[base + t]
    ty.syncthreads()
    out[base + t] = buf[127 - t]


@ty.kernel(threads=32)
def vec4_masked(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    t = ty.thread_idx()
    a, b, c, d = ty.load(x + 4 * t, vec=4)
    ty.store(out + 4 * t, (d, c, b, a))
    v = ty.load(x + t, mask=t < n)
    out[128 + t] = v


@ty.kernel(threads=32)
def read_past_end(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    t = ty.thread_idx()
    out[t] = x[t + n]  # <- oob


@ty.kernel(threads=32)
def misaligned_vec(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    t = ty.thread_idx()
    a, b = ty.load(x + 2 * t + 1, vec=2)  # <- misaligned
    out[t] = a + b


@ty.kernel(threads=64)
def shfl_diverged(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    t = ty.thread_idx()
    v = x[t]
    if t % 2 == 0:
        v = ty.shfl_xor(v, 1)  # <- diverged_shfl
    out[t] = v


def test_vector_add_matches_torch():
    n = 1000
    x, y, out = torch.randn(n), torch.randn(n), torch.zeros(n)
    report = vector_add.emulate(x, y, out, n, grid=((n + 255) // 256,))
    assert isinstance(report, EmulationReport) and len(report.ctas) == 4
    assert torch.equal(out, x + y)


def test_vector_add_numpy_arrays_and_cta_subset():
    n = 600
    x, y = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    out = np.full(n, -1.0, dtype=np.float32)
    vector_add.emulate(x, y, out, n, grid=(3,), ctas=[(1,)])
    assert (out[:256] == -1).all() and (out[512:] == -1).all()
    assert (out[256:512] == x[256:512] + 1).all()


def test_row_sum_shuffles_and_loops_exact():
    torch.manual_seed(0)
    x = torch.randn(9, 1000)
    out = torch.zeros(9)
    row_sum.emulate(x, out, 9, 1000, grid=(3,))
    assert np.array_equal(out.numpy(), row_sum_model(x.numpy()))  # lane-exact order of additions
    assert torch.allclose(out, x.sum(1), atol=1e-4)


def test_divergent_loops_and_ifs():
    out = torch.zeros(2 * 50, dtype=torch.int32)
    divergent.emulate(out, 50, grid=(1,))
    assert out.tolist() == divergent_model(50)


def test_shared_memory_and_syncthreads():
    x, out = torch.randn(256), torch.zeros(256)
    reverse_block.emulate(x, out, grid=(2,))
    assert torch.equal(out, torch.cat([x[:128].flip(0), x[128:].flip(0)]))


def test_vector_and_masked_loads():
    x, out = torch.arange(128, dtype=torch.float32), torch.full((160,), -1.0)
    vec4_masked.emulate(x, out, 20, grid=1)
    assert torch.equal(out[:128], x.view(32, 4).flip(1).reshape(-1))
    assert torch.equal(out[128:148], x[:20]) and (out[148:] == 0).all()


def test_global_out_of_bounds_names_argument_and_line():
    x, out = torch.zeros(32), torch.zeros(32)
    with pytest.raises(MemoryAccessError) as e:
        read_past_end.emulate(x, out, 1, grid=1)
    msg = str(e.value)
    assert f"{HERE}:{line_of(HERE, 'oob')}" in msg and "out[t] = x[t + n]" in msg
    assert "lane 31" in msg and "'x' spans 128 bytes" in msg


def test_misaligned_vector_load():
    with pytest.raises(MemoryAccessError, match=f"misaligned load at .*:{line_of(HERE, 'misaligned')}"):
        misaligned_vec.emulate(torch.zeros(80), torch.zeros(32), grid=1)


def test_shuffle_in_diverged_warp_is_an_error():
    with pytest.raises(ProtocolError, match=f"shfl.sync.bfly at .*:{line_of(HERE, 'diverged_shfl')}.*diverged"):
        shfl_diverged.emulate(torch.zeros(64), torch.zeros(64), grid=1)


def test_argument_checks():
    with pytest.raises(TypeError, match="argument 'x' expects dtype torch.float32"):
        vector_add.emulate(torch.zeros(4, dtype=torch.float64), torch.zeros(4), torch.zeros(4), 4, grid=1)
    with pytest.raises(ValueError, match="argument 'n' expects a value in"):
        vector_add.emulate(torch.zeros(4), torch.zeros(4), torch.zeros(4), 2**40, grid=1)
    with pytest.raises(TypeError, match="unexpected keyword 'bogus'"):
        vector_add.emulate(torch.zeros(4), torch.zeros(4), torch.zeros(4), 4, grid=1, bogus=1)
    with pytest.raises(ValueError, match="ctas expects block indices inside the grid"):
        vector_add.emulate(torch.zeros(4), torch.zeros(4), torch.zeros(4), 4, grid=1, ctas=[(3,)])


def test_accepts_a_kernel_ir():
    n = 64
    x, y, out = torch.randn(n), torch.randn(n), torch.zeros(n)
    emulate_kernel(vector_add.trace(), (x, y, out, n), grid=1)
    assert torch.equal(out, x + y)


def test_timings(capsys):
    n = 1 << 16
    x, y, out = torch.randn(n), torch.randn(n), torch.zeros(n)
    t0 = time.perf_counter()
    vector_add.emulate(x, y, out, n, grid=(n // 256,))
    t_add = time.perf_counter() - t0
    assert torch.equal(out, x + y)
    rows = 64
    xr, outr = torch.randn(rows, 2048), torch.zeros(rows)
    t0 = time.perf_counter()
    row_sum.emulate(xr, outr, rows, 2048, grid=(rows // WARPS,))
    t_red = time.perf_counter() - t0
    assert torch.allclose(outr, xr.sum(1), atol=1e-3)
    with capsys.disabled():
        print(f"\n[emulate timings] vector add of {n} floats ({n // 256} CTAs): {t_add:.2f} s; "
              f"row sum of {rows} x 2048 floats: {t_red:.2f} s")
    assert t_add < 20 and t_red < 20
