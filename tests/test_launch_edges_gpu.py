"""Launch edges on a GPU: every accepted form of ``stream`` queues the kernel on that stream (a
sleep queued first on it would otherwise let a wrong-stream kernel finish early and be
overwritten), unknown handles and other devices' streams are refused before the driver, a
strided last dimension is refused, a prepared launch keeps its tensors, and an autotuned
function called under CUDA graph capture runs its default config without timing (the graph
replays correctly) and tunes at the next call outside the capture."""
import gc

import pytest
import torch

import tylopy as ty
from tylopy.errors import LaunchValueError
from tylopy.jit.autotune import AutotuneWarning
from tylopy_kernels.examples.vector_add import BLOCK, vector_add

from conftest import for_this_gpu

pytestmark = pytest.mark.gpu
N = 1 << 20


@pytest.fixture(scope="module")
def add():
    return for_this_gpu(vector_add)


def _grid(n=N):
    return ((n + BLOCK - 1) // BLOCK,)


def _run_on(add, stream_arg, side):
    """Queue a long sleep, then NaN, on ``side``; launch with ``stream_arg``: correct only if the kernel
    ran on ``side`` after the poison."""
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        out.fill_(float("nan"))
    add[_grid()](x, y, out, N, stream=stream_arg)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


@pytest.mark.parametrize("form", ["stream", "external", "int_after_stream", "int_current"])
def test_each_accepted_stream_form_runs_on_that_stream(add, form):
    side = torch.cuda.Stream()
    if form == "stream":
        _run_on(add, side, side)
    elif form == "external":
        _run_on(add, torch.cuda.ExternalStream(side.cuda_stream), side)
    elif form == "int_after_stream":
        _run_on(add, side, side)  # passing the stream once makes its handle known
        _run_on(add, side.cuda_stream, side)
    else:
        with torch.cuda.stream(side):
            _run_on(add, side.cuda_stream, side)  # torch's current stream, as a handle


def test_an_unknown_handle_is_refused_before_the_driver(add):
    x = torch.randn(16, device="cuda")
    with pytest.raises(LaunchValueError, match="unknown handle 0x1234560; pass the torch.cuda.Stream itself"):
        add[(1,)](x, x, torch.empty_like(x), 16, stream=0x1234560)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_stream_of_another_device_is_refused(add):
    x = torch.randn(16, device="cuda:0")
    other = torch.cuda.Stream(device=1)
    with pytest.raises(LaunchValueError, match="stream expects a stream of the launch's device cuda:0"):
        add[(1,)](x, x, torch.empty_like(x), 16, stream=other)


def test_a_strided_last_dimension_is_refused(add):
    x = torch.randn(64, 64, device="cuda").t()
    with pytest.raises(LaunchValueError, match=r"pass x.contiguous\(\)"):
        add[(1,)](x, x, torch.empty(64 * 64, device="cuda"), 64 * 64)


def test_a_prepared_launch_keeps_its_tensors(add):
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    expect = x + y
    out = torch.full((N,), float("nan"), device="cuda")
    run = add[_grid()].prepare(x.clone(), y.clone(), out, N)
    gc.collect()
    torch.cuda.empty_cache()
    junk = [torch.full((N,), 1e30, device="cuda") for _ in range(4)]  # would reuse freed inputs' memory
    run.launch()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expect, rtol=0, atol=0)
    del junk


def test_autotune_under_graph_capture(add, cache_dir, monkeypatch):
    monkeypatch.delenv("TYLOPY_AUTOTUNE", raising=False)
    timed = []

    def timer(fn):
        timed.append(fn.keywords["SCALE"])
        return {1: 2.0, 2: 1.0}[fn.keywords["SCALE"]]

    @ty.autotune(configs=[ty.Config(SCALE=1), ty.Config(SCALE=2)], key=["n"], timer=timer, name="tests.graph")
    def scaled_add(x, y, out, n, SCALE=1):
        add[_grid(n)](x, y, out, n)
        if SCALE == 2:
            out.mul_(1.0)  # the same result: only the timing differs

    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    out = torch.full((N,), float("nan"), device="cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        add[_grid()](x, y, out, N)  # loads the module outside the capture
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with pytest.warns(AutotuneWarning, match="under CUDA graph capture"):
        with torch.cuda.graph(graph):
            scaled_add(x, y, out, N)
    assert timed == []
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    scaled_add(x, y, out, N)
    assert timed == [1, 2]
