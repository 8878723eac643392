"""GPU tier of the warp, atomic and debug primitives: the device against the emulator.

Where the result does not depend on the order in which the hardware serializes lanes (votes,
matches, reductions in their fixed butterfly order, atomics on distinct addresses,
commutative integer atomics on shared addresses) the device and the emulator must agree bit
for bit. Where it does (same-address returned values, float sums), the tests check what the
ISA promises: each counter ticket handed out once, one compare-and-swap winner. The float
adds on distinct addresses check the ISA's subnormal rules on the device (f32 on global
memory flushes, on shared memory does not; ``.noftz`` halves keep subnormals).
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import tylopy as ty
from primitive_probes import INT_KERNELS, LEGAL, NP, cas_lock, counters, to_words
from primitive_probes import REDUCERS, lanes_here, matches, partial_warp_votes, votes

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(2024)


def both(kernel, grid, *arrays, **cx):
    """Run ``kernel`` on the GPU and in the emulator on copies of ``arrays``; returns (gpu, cpu) lists."""
    gpu = [torch.from_numpy(a.copy()).cuda() for a in arrays]
    cpu = [a.copy() for a in arrays]
    kernel[grid](*gpu, **cx)
    kernel.emulate(*cpu, grid=grid, **cx)
    torch.cuda.synchronize()
    return [g.cpu().numpy() for g in gpu], cpu


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


# -- warp collectives ---------------------------------------------------------------------------------------

def test_votes_ballots_and_matches_agree_bit_for_bit():
    pred = RNG.integers(0, 2, 128).astype(np.int32)
    pred[32:64] = 1
    pred[64:96] = 0
    g, c = both(votes, (1,), pred, np.zeros(640, np.uint32))
    assert same_bits(g[1], c[1])
    g, c = both(partial_warp_votes, (1,), np.zeros(96, np.uint32))
    assert same_bits(g[0], c[0])
    v32 = RNG.integers(0, 4, 64).astype(np.uint32)
    v64 = RNG.integers(0, 3, 64).astype(np.uint64) << np.uint64(33)
    f = RNG.choice(np.array([1.5, 0.0, -0.0, np.nan], np.float32), 64)
    g, c = both(matches, (1,), v32, v64, f, np.zeros(320, np.uint32))
    assert same_bits(g[3], c[3])


def test_activemask_names_only_lanes_of_the_branch():
    g, _ = both(lanes_here, (1,), np.zeros(32, np.uint32))
    branch = sum(1 << i for i in range(32) if i % 3 == 0)
    for i in range(32):
        if i % 3 == 0:
            assert g[0][i] >> i & 1 and (int(g[0][i]) & ~branch) == 0  # itself, and lanes of its branch only
        else:
            assert g[0][i] == 7


@pytest.mark.parametrize("name", ["f32", "f64", "i32", "u32", "i64", "u64"])
def test_warp_reduce_agrees_bit_for_bit(name):
    dt = np.dtype(NP[name])
    ops = ["sum", "max", "min"] + (["and", "or", "xor"] if dt.kind in "iu" else [])
    for op in ops:
        if dt.kind == "f":
            x = (RNG.standard_normal(64) * 10.0 ** RNG.integers(-8, 9, 64)).astype(dt)
            x[5] = np.nan if op != "sum" else x[5]
        else:
            info = np.iinfo(dt)
            x = RNG.integers(info.min, info.max, 64, dtype=dt, endpoint=True)
        g, c = both(REDUCERS[name], (1,), x, np.zeros(64, dt), OP=op)
        assert same_bits(g[1], c[1]), (name, op)


# -- atomics ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,name", [(op, n) for op, names in LEGAL.items() for n in names])
def test_integer_atomics_on_distinct_addresses_agree_bit_for_bit(op, name):
    dt = np.dtype(NP[name])
    if op in ("inc", "dec"):
        x, mem = RNG.integers(0, 6, 32).astype(dt), RNG.integers(0, 8, 32).astype(dt)
    else:
        info = np.iinfo(dt)
        x = RNG.integers(info.min, info.max, 32, dtype=dt, endpoint=True)
        mem = RNG.integers(info.min, info.max, 32, dtype=dt, endpoint=True)
    g, c = both(INT_KERNELS[name], (1,), mem, x, np.zeros(32, dt), OP=op, SLOTS=32)
    assert same_bits(g[0], c[0]) and same_bits(g[2], c[2])


@pytest.mark.parametrize("op", ["add", "min", "max", "and", "or", "xor"])
def test_commutative_atomics_on_one_address_end_the_same(op):
    dt = np.dtype(np.int32)
    x = RNG.integers(-2**31, 2**31, 32, dtype=np.int64).astype(dt)
    mem = RNG.integers(-2**31, 2**31, 1, dtype=np.int64).astype(dt)
    g, c = both(INT_KERNELS["i32"], (1,), mem, x, np.zeros(32, dt), OP=op, SLOTS=1)
    assert same_bits(g[0], c[0])


def test_counter_tickets_and_a_single_cas_winner_on_the_device():
    g, _ = both(counters, (1,), np.zeros(3, np.uint32), np.full(128, 777, np.uint32), K=3)
    ctr, old = g
    for k in range(3):
        got = sorted(int(old[t]) for t in range(0, 128, 2) if t % 3 == k)
        assert got == list(range(int(ctr[k])))
    g, _ = both(cas_lock, (1,), np.zeros(1, np.int32), np.zeros(32, np.int32))
    lock, old = g
    winners = [t for t in range(32) if old[t] == 0]
    assert len(winners) == 1 and lock[0] == winners[0] + 1


@ty.kernel(threads=64)
def float_updates(gf: ty.ptr(ty.f32), xf: ty.ptr(ty.f32), sf_out: ty.ptr(ty.f32), gd: ty.ptr(ty.f64),
                  xd: ty.ptr(ty.f64), gh: ty.ptr(ty.f16), xh: ty.ptr(ty.f16), gb: ty.ptr(ty.bf16), xb: ty.ptr(ty.bf16),
                  w16: ty.ptr(ty.b32), wb16: ty.ptr(ty.b32), xw: ty.ptr(ty.b32), old: ty.ptr(ty.f32),
                  v4: ty.ptr(ty.f32)):
    t = ty.thread_idx()
    old[t] = ty.atomic_add(gf + t, xf[t])            # global f32: flushes subnormals
    s = ty.shared(ty.f32, 64)
    s[t] = sf_out[t]
    ty.red_add(s + t, xf[t])                         # shared f32: keeps them (own element: no race)
    sf_out[t] = s[t]
    ty.red_add(gd + t, xd[t])
    ty.red_add(gh + t, xh[t])
    ty.red_add(gb + t, xb[t])
    ty.red_add(w16 + t, xw[t], packed="f16x2")
    ty.red_add(wb16 + t, xw[t], packed="bf16x2")
    ty.red_add(v4 + 4 * t, (xf[t], xf[t] * 2.0, -xf[t], 1.0))


def test_float_adds_on_distinct_addresses_agree_bit_for_bit():
    n = 64
    tiny = np.float32(2.0 ** -130)
    xf = (RNG.standard_normal(n) * 10.0 ** RNG.integers(-3, 4, n)).astype(np.float32)
    gf = (RNG.standard_normal(n)).astype(np.float32)
    xf[:8], gf[:8] = tiny, np.float32(0.0)           # subnormal inputs
    gf[8:12], xf[8:12] = np.float32(1.5 * 2.0 ** -126), np.float32(-1.25 * 2.0 ** -126)  # normal inputs, a
    # subnormal sum (2**-128): flushed on global memory
    halves = (RNG.standard_normal(2 * n) * 100).astype(np.float32)
    halves[:4] = [6e-8, -6e-8, 1e-39, 3e-5]            # f16/bf16 subnormals
    arrays = [gf, xf, gf.copy(), RNG.standard_normal(n), RNG.standard_normal(n),
              RNG.standard_normal(n).astype(np.float16), RNG.standard_normal(n).astype(np.float16),
              torch.randn(n).bfloat16().view(torch.int16).numpy().view(np.uint16),
              torch.randn(n).bfloat16().view(torch.int16).numpy().view(np.uint16),
              to_words(halves, torch.float16), to_words(halves[::-1].copy(), torch.bfloat16),
              to_words((RNG.standard_normal(2 * n) * 100).astype(np.float32), torch.float16),
              np.zeros(n, np.float32), RNG.standard_normal(4 * n).astype(np.float32)]
    gpu = [torch.from_numpy(a.copy()).cuda() for a in arrays]
    gpu[7], gpu[8] = gpu[7].view(torch.bfloat16), gpu[8].view(torch.bfloat16)
    cpu = [a.copy() for a in arrays]
    float_updates[(1,)](*gpu)
    float_updates.emulate(*cpu, grid=(1,))
    torch.cuda.synchronize()
    names = ["gf", "xf", "sf", "gd", "xd", "gh", "xh", "gb", "xb", "w16", "wb16", "xw", "old", "v4"]
    for k, name in enumerate(names):
        got = gpu[k].cpu()
        got = got.view(torch.int16).numpy() if got.dtype == torch.bfloat16 else got.numpy()
        assert same_bits(got, cpu[k]), name
    assert (cpu[0][:12] == 0).all() and (cpu[2][:8] > 0).all()  # the documented flush, seen on the device too


# -- printf and device_assert -----------------------------------------------------------------------------------

def test_printf_prints_what_the_emulator_prints(monkeypatch, capfd):
    monkeypatch.setenv("TYLOPY_DEBUG", "1")

    @ty.kernel(threads=64)
    def show(x: ty.ptr(ty.f32), k: ty.ptr(ty.i64)):
        t = ty.thread_idx()
        if t % 9 == 0:
            ty.printf("lane %d of %u: %.4f %lld %x\n", ty.lane_id(), ty.cast(t, ty.u32), x[t], k[t], t * 3)

    x = RNG.standard_normal(64).astype(np.float32)
    k = RNG.integers(-2**50, 2**50, 64).astype(np.int64)
    show[(1,)](torch.from_numpy(x).cuda(), torch.from_numpy(k).cuda())
    torch.cuda.synchronize()
    device = capfd.readouterr().out.splitlines(keepends=True)
    report = show.emulate(x, k, grid=(1,))
    capfd.readouterr()
    assert sorted(device) == sorted(report.prints)


ASSERT_SCRIPT = textwrap.dedent('''
    import torch, tylopy as ty

    @ty.kernel(threads=64)
    def guarded(x: ty.ptr(ty.f32)):
        t = ty.thread_idx()
        ty.device_assert(x[t] < 10.0, "x must stay below 10")
        x[t] = x[t] + 1.0

    x = torch.zeros(64, device="cuda")
    x[FAIL] = 11.0
    guarded[(1,)](x)
    torch.cuda.synchronize()
    print("finished", float(x.sum()))
''')


@pytest.mark.parametrize("fail", [None, 5])
def test_device_assert_stops_the_kernel_and_names_the_line(tmp_path, fail):
    script = tmp_path / "guarded.py"
    script.write_text(ASSERT_SCRIPT.replace("x[FAIL] = 11.0", f"x[{fail}] = 11.0" if fail is not None else "pass"))
    env = dict(os.environ, TYLOPY_DEBUG="1")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    out = proc.stdout + proc.stderr
    if fail is None:
        assert proc.returncode == 0 and "finished 64.0" in out, out
        return
    assert proc.returncode != 0 and "finished" not in out, out
    line = 1 + next(k for k, text in enumerate(script.read_text().splitlines()) if "device_assert" in text)
    assert "x must stay below 10" in out and f"guarded.py:{line}" in out, out
