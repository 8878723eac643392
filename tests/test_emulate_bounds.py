"""Bounded emulation: one step budget per launch (``max_steps`` / ``TYLOPY_EMULATE_MAX_STEPS``) that
stops an endless loop, however it is nested, with an error naming the loop's source line, and
grids that are walked lazily (a grid of 2**31 CTAs neither builds a list nor runs forever)."""
import time

import numpy as np
import pytest

import tylopy as ty
from tylopy.emulate import EmulationError
from tylopy.emulate.launch import GridOrder
from tylopy.errors import LaunchValueError
from emulate_dsl import line_of

HERE = __file__


@ty.kernel(threads=32)
def endless_outer(out: ty.ptr(ty.i32), n: ty.i32):
    t = ty.thread_idx()
    h = 0
    while n > 0:  # <- runaway
        for i in range(n + t % 2):  # a bounded inner loop (per-lane bounds: the masked path)
            h = h * 3 + i
    out[t] = h


@ty.kernel(threads=64)
def endless_for(out: ty.ptr(ty.i32), lo: ty.i32, hi: ty.i32, step: ty.i32):
    t = ty.thread_idx()
    h = 0
    for k in range(lo, hi, step):  # <- runaway for
        for i in range(t % 3 + 2):
            h = h + i
    out[t] = h


@ty.kernel(threads=32)
def bounded(out: ty.ptr(ty.i32), n: ty.i32):
    t = ty.thread_idx()
    h = 0
    for k in range(n):
        h = h + k
    out[ty.block_idx() * 32 + t] = h


@ty.kernel(threads=32)
def straight(out: ty.ptr(ty.i32)):
    t = ty.thread_idx()
    if ty.block_idx() == 0:
        out[t] = t


def _out():
    return np.full(128, -7, dtype=np.int32)


def test_endless_outer_loop_stops_and_names_the_outer_loop():
    t0 = time.perf_counter()
    with pytest.raises(EmulationError) as e:
        endless_outer.emulate(_out(), 3, grid=(1,), max_steps=20_000)
    msg = str(e.value)
    print(msg)
    assert time.perf_counter() - t0 < 20
    assert "max_steps=20000" in msg and f"test_emulate_bounds.py:{line_of(HERE, 'runaway')} " in msg
    runaway = msg.index("while n > 0")
    assert msg.index("for i in range") > runaway  # the inner loop is only named as also running
    assert "warp 0" in msg and "TYLOPY_EMULATE_MAX_STEPS" in msg


def test_default_budget_stops_a_runaway_within_seconds():
    t0 = time.perf_counter()
    with pytest.raises(EmulationError, match="max_steps=1000000"):
        endless_outer.emulate(_out(), 1, grid=(1,))
    assert time.perf_counter() - t0 < 60  # ~8 s on one free core


@pytest.mark.parametrize("lo,hi,step", [(0, 2**31 - 1, 2), (0, -2**31, -2)])  # wraps past the bound: endless
def test_budget_from_environment(monkeypatch, lo, hi, step):
    monkeypatch.setenv("TYLOPY_EMULATE_MAX_STEPS", "5_000")
    with pytest.raises(EmulationError) as e:
        endless_for.emulate(_out(), lo, hi, step, grid=(1,))
    assert "max_steps=5000" in str(e.value) and "<- runaway for" in str(e.value)


def test_budget_is_per_launch_across_ctas():
    out = _out()
    bounded.emulate(out, 100, grid=(4,), max_steps=4 * 100 + 4)  # 4 CTAs of one warp: 400 iterations, 4 starts
    assert (out == sum(range(100))).all()
    with pytest.raises(EmulationError, match="max_steps=403"):
        bounded.emulate(out, 100, grid=(4,), max_steps=403)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "10", True])
def test_bad_max_steps_names_the_option(bad):
    with pytest.raises(LaunchValueError, match=r"'max_steps' expects a positive int, but got"):
        bounded.emulate(_out(), 1, grid=(1,), max_steps=bad)


@pytest.mark.parametrize("bad", ["0", "many", "-3"])
def test_bad_environment_budget_names_the_variable(monkeypatch, bad):
    monkeypatch.setenv("TYLOPY_EMULATE_MAX_STEPS", bad)
    with pytest.raises(LaunchValueError, match=rf"TYLOPY_EMULATE_MAX_STEPS expects a positive int, but got '{bad}'"):
        bounded.emulate(_out(), 1, grid=(1,))


def test_huge_grid_is_lazy_and_bounded():
    out = _out()
    grid = (2**31 - 1, 65535, 65535)
    for seed in (None, 7):
        t0 = time.perf_counter()
        with pytest.raises(EmulationError) as e:
            straight.emulate(out, grid=grid, max_steps=40, seed=seed, check_races=False)
        assert time.perf_counter() - t0 < 10
        msg = str(e.value)
        assert "after starting 40 of the" in msg and "ctas=[...]" in msg, msg


def test_grid_order_matches_the_eager_order_and_shuffle():
    import random
    grid = (3, 4, 2)
    eager = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
    assert list(GridOrder(grid)) == eager and len(GridOrder(grid)) == 24
    # a seed gives the same order as shuffling the eager list did (seeded schedules stay reproducible)
    assert list(GridOrder(grid, random.Random(5))) == random.Random(5).sample(eager, len(eager))
    big = GridOrder((1 << 20, 3, 1), random.Random(1))  # beyond the shuffle size: an affine permutation
    first = [big[i] for i in range(2000)]
    assert len(set(first)) == 2000 and first != [GridOrder((1 << 20, 3, 1))[i] for i in range(2000)]
