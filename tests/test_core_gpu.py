"""The core on a GPU: numerics against torch, streams, CUDA graphs, >48 KB of dynamic shared
memory, and the host cost of a launch. Outputs are poisoned with NaN before every run, so a
kernel that writes nothing (or too little) fails instead of passing on stale memory.

Each kernel is compiled for the current device (sm_90a on Hopper, sm_80/86/89 on Ampere/Ada),
since a cubin for one major architecture does not load on another.
"""
import statistics
import time

import pytest
import torch

from tylopy_kernels.examples.vector_add import BLOCK, vector_add

import kernels_for_tests as K
from conftest import for_this_gpu

pytestmark = pytest.mark.gpu

def poisoned(n: int, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view of its first n elements), all NaN; the pad catches writes past the end."""
    buf = torch.full((n + pad,), float("nan"), device="cuda", dtype=torch.float32)
    return buf, buf[:n]


def blocks(n: int) -> tuple[int]:
    return ((n + BLOCK - 1) // BLOCK,)


@pytest.fixture(scope="module")
def add():
    return for_this_gpu(vector_add)


@pytest.mark.parametrize("n", [1, 255, 256, 257, 1_000_003])
def test_vector_add_matches_torch(add, n):
    gen = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(n, device="cuda", generator=gen)
    y = torch.randn(n, device="cuda", generator=gen)
    buf, out = poisoned(n, pad=BLOCK)
    add[blocks(n)](x, y, out, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)  # one f32 add, rounded the same way
    assert torch.isnan(buf[n:]).all(), "the kernel wrote past n"


def test_vector_add_special_values(add):
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e38, -0.0, 3.0], device="cuda")
    y = torch.tensor([1.0, float("inf"), 1.0, 1e38, -0.0, -3.0], device="cuda")
    _, out = poisoned(6)
    add[(1,)](x, y, out, 6)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0, equal_nan=True)


def test_empty_grid_launches_nothing(add):
    x = torch.ones(4, device="cuda")
    _, out = poisoned(4)
    add[(0,)](x, x, out, 4)
    torch.cuda.synchronize()
    assert torch.isnan(out).all()


def test_launch_on_a_side_stream(add):
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # The poison is queued behind a sleep on the side stream: a kernel that ran on another
        # stream would finish first and then be overwritten with NaN.
        torch.cuda._sleep(20_000_000)
        out.fill_(float("nan"))
        add[blocks(n)](x, y, out, n)
    side.synchronize()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_launch_with_an_explicit_stream(add):
    n = 4097
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        out.fill_(float("nan"))
    add[blocks(n)](x, y, out, n, stream=side)
    side.synchronize()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_cuda_graph_capture_and_replay(add):
    n = 100_003
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):  # load the module before capture, as torch recommends
        add[blocks(n)](x, y, out, n)
    torch.cuda.current_stream().wait_stream(warm)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add[blocks(n)](x, y, out, n)
    for _ in range(3):
        x.copy_(torch.randn(n, device="cuda"))
        y.copy_(torch.randn(n, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_dynamic_shared_memory_over_48k():
    kernel = for_this_gpu(K.reverse_through_smem)
    nbytes = K.SMEM_BYTES
    per_block = nbytes // 4
    n_blocks = 37
    ck = kernel.compile()
    assert ck.dynamic_shared_bytes == nbytes > 48 * 1024
    x = torch.randn(n_blocks * per_block, device="cuda")
    _, out = poisoned(x.numel())
    kernel[(n_blocks,)](x, out)
    torch.cuda.synchronize()
    expected = x.view(n_blocks, per_block).flip(1).reshape(-1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_vector_load_kernel():
    kernel = for_this_gpu(K.copy_vec4)
    n = 4 * 128 * 9
    x = torch.randn(n, device="cuda")
    _, out = poisoned(n)
    kernel[(9,)](x, out, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x, rtol=0, atol=0)


def test_launch_overhead():
    kernel = for_this_gpu(K.tiny)
    out = torch.full((32,), float("nan"), device="cuda")
    for _ in range(50):  # compile, load the module, warm every cache on the path
        kernel[(1,)](out)
    torch.cuda.synchronize()
    assert (out == 1.0).all()
    out.fill_(float("nan"))
    times = []
    for _ in range(1000):
        t0 = time.perf_counter_ns()
        kernel[(1,)](out)
        times.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    assert (out == 1.0).all()
    median_us = statistics.median(times) / 1000
    print(f"\nlaunch overhead: median host time of 1000 launches = {median_us:.2f} us "
          f"(p10 {sorted(times)[100] / 1000:.2f} us, p90 {sorted(times)[900] / 1000:.2f} us)")
    assert median_us < 50, f"median launch takes {median_us:.1f} us on the host"
