"""ty.exp, log, sigmoid, tanh, floor, ceil, where (tylopy/language/elementwise.py): run in the
emulator (which gives the GPU's bits for every op they are built from) against float64, with
the error bounds the module documents, on random inputs and the special values."""
import math

import numpy as np
import pytest
import torch

import tylopy as ty

FUNCS = ("exp", "log", "sigmoid", "tanh", "floor", "ceil")


@ty.kernel(threads=128)
def apply(x: ty.tensor(ty.f32, 1), out: ty.tensor(ty.f32, 1), n: ty.i32, FN: ty.constexpr):
    for i in range(ty.block_idx() * 128 + ty.thread_idx(), n, 128 * ty.grid_dim()):
        out[i] = getattr(ty, FN)(x[i])


def run(fn, x):
    x = torch.as_tensor(np.asarray(x, dtype=np.float32))
    out = torch.full_like(x, float("nan"))
    apply.emulate(x, out, x.numel(), grid=4, FN=fn)
    return x.double().numpy(), out.double().numpy()


def rel_err(got, want):
    return np.abs(got - want) / np.maximum(np.abs(want), np.finfo(np.float32).tiny)


def test_exp():
    rng = np.random.default_rng(1)
    x, got = run("exp", rng.uniform(-87, 88.7, 4000))
    assert rel_err(got, np.exp(x)).max() < 2.0 ** -21
    x, got = run("exp", [-math.inf, math.inf, math.nan, 0.0, -0.0, 89.0, -104.0])
    assert got[0] == 0 and got[1] == math.inf and math.isnan(got[2]) and got[3] == got[4] == 1.0
    assert got[5] == math.inf and got[6] == 0.0  # past f32's range; below 2**-126 flushes


def test_log():
    rng = np.random.default_rng(2)
    x, got = run("log", np.concatenate([10.0 ** rng.uniform(-30, 30, 3000), rng.uniform(0.5, 2, 1000)]))
    want = np.log(x)
    near_one = (x >= 0.5) & (x <= 2)
    assert np.abs(got - want)[near_one].max() < 2.0 ** -21
    assert rel_err(got, want)[~near_one].max() < 2.0 ** -21
    x, got = run("log", [0.0, -1.0, math.inf, math.nan, 1.0])
    assert got[0] == -math.inf and math.isnan(got[1]) and got[2] == math.inf and math.isnan(got[3]) and got[4] == 0


def test_sigmoid():
    rng = np.random.default_rng(3)
    x, got = run("sigmoid", rng.uniform(-30, 30, 4000))
    assert rel_err(got, 1 / (1 + np.exp(-x))).max() < 2.0 ** -20
    _, got = run("sigmoid", [-math.inf, math.inf, 0.0])
    assert list(got) == [0.0, 1.0, 0.5]


def test_tanh():
    rng = np.random.default_rng(4)
    x, got = run("tanh", np.concatenate([rng.uniform(-20, 20, 2000), rng.uniform(-0.5, 0.5, 1000),
                                          2.0 ** rng.uniform(-30, -10, 500) * rng.choice([-1, 1], 500)]))
    want = np.tanh(x)
    assert np.abs(got - want).max() < 2.0 ** -22
    a = np.abs(x)
    assert rel_err(got, want)[(a >= 2 ** -4) & (a < 0.5)].max() < 2.0 ** -18
    assert rel_err(got, want)[(a < 2 ** -4) | (a >= 0.5)].max() < 2.0 ** -21
    assert np.all(np.sign(got) == np.sign(x))
    _, got = run("tanh", [-math.inf, math.inf, math.nan, -0.0])
    assert got[0] == -1 and got[1] == 1 and math.isnan(got[2]) and got[3] == 0 and math.copysign(1, got[3]) == -1


@pytest.mark.parametrize("fn", ["floor", "ceil"])
def test_floor_ceil_are_exact(fn):
    rng = np.random.default_rng(5)
    vals = np.concatenate([rng.uniform(-1e3, 1e3, 2000), rng.integers(-50, 50, 200) + 0.5,
                           [2.0 ** 23 + 1, -(2.0 ** 30), 3e9, -3e9, 0.5, -0.5, 0.0, -0.0, 1.0, -1.0]])
    x, got = run(fn, np.concatenate([vals, [math.inf, -math.inf, math.nan]]))
    want = getattr(np, fn)(x)
    np.testing.assert_array_equal(got[:-1], want[:-1])
    assert math.isnan(got[-1])
    assert np.array_equal(np.signbit(got[:-1]), np.signbit(want[:-1]))  # floor(-0.0) = -0.0, ceil(-0.5) = -0.0


@ty.kernel(threads=32)
def relu_where(x: ty.tensor(ty.f32, 1), out: ty.tensor(ty.f32, 1)):
    i = ty.thread_idx()
    out[i] = ty.where(x[i] > 0.0, x[i], 0.0)


def test_where():
    x = torch.randn(32)
    out = torch.full_like(x, float("nan"))
    relu_where.emulate(x, out, grid=1)
    assert torch.equal(out, x.clamp(min=0))


@pytest.mark.parametrize("fn", FUNCS)
def test_each_function_assembles_without_spills(fn):
    ck = apply.compile(FN=fn)
    assert ck.report.available is False or ck.report.spill_stores == 0
    assert ("ex2.approx" in ck.ptx) == (fn in ("exp", "sigmoid", "tanh"))


@pytest.mark.parametrize("name, hint", [("program_id", "ty.block_idx"), ("float32", "ty.f32"),
                                        ("erf", "ty.tanh")])
def test_names_from_other_kernel_languages_point_to_ours(name, hint):
    with pytest.raises(AttributeError, match=f"no attribute '{name}'; .*{hint}"):
        getattr(ty, name)


@ty.kernel(threads=32)
def exp_of_int(x: ty.ptr(ty.i32), y: ty.ptr(ty.f32)):
    y[ty.thread_idx()] = ty.exp(x[ty.thread_idx()])  # <- exp of i32


def test_a_non_f32_argument_names_the_function_and_the_type():
    with pytest.raises(ty.KernelSourceError, match=r"ty.exp expects an f32 value, but got i32") as e:
        exp_of_int.compile()
    assert "# <- exp of i32" in str(e.value) and "ty.cast(x, ty.f32)" in str(e.value)
