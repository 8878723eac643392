"""ty.jvp / ty.value_and_derivative (tylopy/language/derivative.py): the derivative of traced kernel
code, run in the emulator, against float64 analytic derivatives; the errors for code it cannot
differentiate name the op and the line."""
import math

import numpy as np
import pytest
import torch

import tylopy as ty


@ty.kernel(threads=128)
def value_and_slope(x: ty.tensor(ty.f32, 1), table: ty.tensor(ty.f32, 1), y: ty.tensor(ty.f32, 1),
                    dy: ty.tensor(ty.f32, 1), n: ty.i32, FN: ty.constexpr):
    for i in range(ty.thread_idx(), n, 128):
        v, d = ty.value_and_derivative(FN, x[i], i, table)
        y[i] = v
        dy[i] = d


def softcap(s, i, table):
    return 20.0 * ty.tanh(s / 20.0)


def alibi_and_bias(s, i, table):
    return s - 0.25 * ty.cast(i % 7, ty.f32) + table[i % 5]          # d/ds = 1


def scaled_bias(s, i, table):
    return s * table[i % 5] + ty.exp(s * 0.5) * 0.1                 # d/ds = t + 0.05 e^(s/2)


def gated(s, i, table):
    return ty.where(s > 0.0, ty.sigmoid(s) * s, ty.minimum(s * s, ty.abs(s) + 1.0))


def log_and_power(s, i, table):
    return ty.log(ty.abs(s) + 1.0) + 1.0 / (s * s + 2.0) + ty.maximum(s, -1.0)


def _sign(s):
    return np.where(s < 0, -1.0, 1.0)  # abs' derivative is taken as +1 at 0 (and -0)


CASES = {
    softcap: lambda s, t: 1 - np.tanh(s / 20) ** 2,
    alibi_and_bias: lambda s, t: np.ones_like(s),
    scaled_bias: lambda s, t: t + 0.05 * np.exp(s / 2),
    gated: lambda s, t: np.where(s > 0, (1 / (1 + np.exp(-s))) * (1 + s * (1 - 1 / (1 + np.exp(-s)))),
                                 np.where(s * s < np.abs(s) + 1, 2 * s, _sign(s))),
    log_and_power: lambda s, t: _sign(s) / (np.abs(s) + 1) - 2 * s / (s * s + 2) ** 2 + (s >= -1),  # a tie takes the first operand
}
VALUES = {
    softcap: lambda s, t: 20 * np.tanh(s / 20),
    alibi_and_bias: lambda s, t: s - 0.25 * (np.arange(len(s)) % 7) + t,
    scaled_bias: lambda s, t: s * t + 0.1 * np.exp(s / 2),
    gated: lambda s, t: np.where(s > 0, s / (1 + np.exp(-s)), np.minimum(s * s, np.abs(s) + 1)),
    log_and_power: lambda s, t: np.log(np.abs(s) + 1) + 1 / (s * s + 2) + np.maximum(s, -1),
}


def run(fn, x, table):
    n = x.numel()
    y, dy = torch.full_like(x, math.nan), torch.full_like(x, math.nan)
    value_and_slope.emulate(x, table, y, dy, n, grid=1, FN=fn)
    return y.double().numpy(), dy.double().numpy()


@pytest.mark.parametrize("fn", list(CASES), ids=[f.__name__ for f in CASES])
def test_derivative_matches_float64(fn):
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(600, generator=g) * 60 - 30).float()
    x[:10] = torch.tensor([0.0, -0.0, 1e-3, -1e-3, 0.04, -0.07, 1.0, -1.0, 29.5, -29.5])
    table = torch.randn(5, generator=g).float()
    y, dy = run(fn, x, table)
    s, t = x.double().numpy(), table.double().numpy()[np.arange(len(x)) % 5]
    want_y, want_dy = VALUES[fn](s, t), CASES[fn](s, t)
    assert np.abs(y - want_y).max() <= 1e-5 * max(1.0, np.abs(want_y).max())
    assert np.abs(dy - want_dy).max() <= 2e-5 * max(1.0, np.abs(want_dy).max()), fn.__name__
    # and the derivative is the finite difference of the emulated function itself (central, float64 steps)
    h = 1e-2
    xp, xm = x.double() + h, x.double() - h
    fd = (VALUES[fn](xp.numpy(), t) - VALUES[fn](xm.numpy(), t)) / (2 * h)
    smooth = np.abs(s) > 2 * h  # away from the kinks at 0
    if fn is gated or fn is log_and_power:
        smooth &= np.abs(s + 1) > 2 * h
        smooth &= np.abs(s * s - np.abs(s) - 1) > 0.1
    assert np.abs(dy - fd)[smooth].max() <= 1e-3 * max(1.0, np.abs(fd).max())


def test_jvp_of_several_inputs_and_outputs():
    @ty.kernel(threads=32)
    def two(x: ty.tensor(ty.f32, 1), out: ty.tensor(ty.f32, 1)):
        i = ty.thread_idx()
        (u, w), (du, dw) = ty.jvp(lambda a, b: (a * b, ty.exp2(a) - b), (x[i], x[i + 32]), (1.0, 2.0))
        out[i] = du
        out[i + 32] = dw
    x = torch.rand(64) + 0.5
    out = torch.full((64,), math.nan)
    two.emulate(x, out, grid=1)
    a, b = x[:32].double(), x[32:].double()
    assert torch.allclose(out[:32].double(), b + 2 * a, rtol=1e-6)
    assert torch.allclose(out[32:].double(), torch.exp2(a) * math.log(2) - 2, rtol=1e-5, atol=1e-6)


def bitcast_mod(s, i, table):
    return ty.bitcast(ty.bitcast(s, ty.u32) & 0xFFFFFFF0, ty.f32)


@ty.func
def branching_mod(s, i, table):
    out = s
    if s > 0.0:
        out = s * 0.5
    return out


@pytest.mark.parametrize("fn, expected", [
    (bitcast_mod, "the op 'bitcast' reads a value that depends on the differentiated input and it has no derivative rule"),
    (branching_mod, "run-time control flow"),
], ids=["bitcast", "runtime-loop"])
def test_ops_without_a_derivative_name_the_op_and_line(fn, expected):
    with pytest.raises(ty.KernelSourceError) as e:
        run(fn, torch.rand(8), torch.rand(5))
    text = str(e.value)
    assert expected in text and "test_jvp.py" in text, text
    assert f"in {fn.__name__}" in text, text
