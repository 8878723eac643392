"""Python idioms a newcomer writes in a kernel: ``min``/``max`` of run-time values, run-time
arguments passed by name at launch, and a reversed ``warp_reduce`` call that says what it expects."""
import math

import pytest
import torch

import tylopy as ty
from tylopy.errors import KernelSourceError, LaunchTypeError


@ty.kernel(threads=64)
def clamp_mix(x: ty.tensor(ty.f32, 1), out: ty.tensor(ty.f32, 1), n: ty.i32, alpha: ty.f32, LO: ty.constexpr = -1.0):
    i = ty.block_idx() * 64 + ty.thread_idx()
    if i < n:
        v = x[i]
        width = max(2, 3)                          # compile-time: Python's max
        out[i] = max(v, 0.0) * alpha + min([v, 1.0, 2.0]) + max(LO, v) + width + math.sqrt(4.0)


def test_min_max_of_run_time_values_are_elementwise():
    x = torch.randn(100)
    x[3] = float("nan")
    out = torch.full_like(x, float("nan"))
    clamp_mix.emulate(x, out, 100, 0.5, grid=2)
    ref = x.clamp(min=0) * 0.5 + x.clamp(max=1.0) + x.clamp(min=-1.0) + 3 + 2.0
    keep = torch.arange(100) != 3
    torch.testing.assert_close(out[keep], ref[keep])
    assert out[3] == 0.0 * 0.5 + 1.0 + -1.0 + 5.0  # a NaN operand gives the other one (fmaxf / fminf)


def test_run_time_arguments_by_name():
    x = torch.randn(70)
    out = torch.full_like(x, float("nan"))
    clamp_mix.emulate(x, out=out, alpha=2.0, n=70, grid=2, LO=0.0)
    torch.testing.assert_close(out, x.clamp(min=0) * 2.0 + x.clamp(max=1.0) + x.clamp(min=0.0) + 5.0)


def test_an_argument_by_position_and_by_name_is_rejected():
    x = torch.randn(8)
    with pytest.raises(LaunchTypeError, match="argument 'x' is given by position and by name"):
        clamp_mix.emulate(x, x=x, out=x, n=8, alpha=1.0, grid=1)
    with pytest.raises(LaunchTypeError, match="argument 'alpha' is given by name, but 'n' before it is missing"):
        clamp_mix.emulate(x, x, alpha=1.0, grid=1)


@ty.kernel(threads=32)
def reversed_reduce(x: ty.ptr(ty.f32)):
    s = ty.warp_reduce(x[ty.thread_idx()], "sum")  # <- reversed
    x[0] = s


def test_reversed_warp_reduce_says_the_operation_comes_first():
    with pytest.raises(KernelSourceError, match=r"warp_reduce op \(its first argument\) expects one of 'sum'.*"
                                                r"but got a run-time f32 value") as e:
        reversed_reduce.compile()
    assert "# <- reversed" in str(e.value)
