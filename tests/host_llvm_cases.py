"""Scalar kernels and a check that runs each one three ways: the generated LLVM IR on the host
(``tylopy.codegen.host_llvm``), the emulator, and numpy.

The emulator executes the IR's meaning; the host run executes what code generation made of it.
``check_case`` runs a case on fresh random inputs with the edges of each type mixed in (ties, the
extremes of the integer range, signed zeros, infinities, NaN, values near 2^31 and 2^32, halves)
and raises ``Caught`` naming the check that saw a difference:

* ``host_llvm vs emulator``: an output element differs bit for bit between the two runs;
* ``host_llvm vs numpy``: the host run differs from the numpy reference;
* ``guard past the end``: the host run wrote the NaN/sentinel padding past an output's end.

Every buffer is padded so that a lowering that runs one step too far writes inside the allocation
(the guard check sees it) instead of corrupting the host process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

import tylopy as ty
from tylopy.codegen.host_llvm import HostKernel

N = 2048  # elements per launch: each thread of the one warp handles N / 32 of them
PAD = 64  # elements past the end of every buffer, filled with NaN (floats) or a sentinel (ints)
SENTINEL = {np.int32: -0x5A5A5A5B, np.uint32: 0xA5A5A5A5, np.int64: -0x5A5A5A5A5A5A5A5B}


class Caught(AssertionError):
    """A check saw the host run disagree; ``check`` names which one."""

    def __init__(self, check: str, detail: str):
        super().__init__(f"{check}: {detail}")
        self.check, self.detail = check, detail


# -- the kernels: one warp, a loop over the elements (so the emulator runs them in a warp's steps) --

def _cmp_kernel(t):
    @ty.kernel(threads=32, name=f"compare_all_{t.name}")
    def compare_all(a: ty.ptr(t), b: ty.ptr(t), out: ty.ptr(ty.i32), n: ty.i32):
        for i in ty.range(ty.thread_idx(), n, 32):
            x = a[i]
            y = b[i]
            out[i] = (ty.select(x < y, 1, 0) | ty.select(x <= y, 2, 0) | ty.select(x > y, 4, 0)
                      | ty.select(x >= y, 8, 0) | ty.select(x == y, 16, 0) | ty.select(x != y, 32, 0))
    return compare_all


compare_i32, compare_u32, compare_f32 = _cmp_kernel(ty.i32), _cmp_kernel(ty.u32), _cmp_kernel(ty.f32)


@ty.kernel(threads=32)
def select_pairs(c: ty.ptr(ty.i32), a: ty.ptr(ty.f32), b: ty.ptr(ty.f32), k: ty.ptr(ty.i32), j: ty.ptr(ty.i32),
                 out_f: ty.ptr(ty.f32), out_i: ty.ptr(ty.i32), n: ty.i32):
    for i in ty.range(ty.thread_idx(), n, 32):
        out_f[i] = ty.select(c[i] > 0, a[i], b[i])
        out_i[i] = ty.select(c[i] > 0, k[i], j[i])


@ty.kernel(threads=32)
def range_sums(x: ty.ptr(ty.i32), lo: ty.ptr(ty.i32), hi: ty.ptr(ty.i32), step: ty.ptr(ty.i32),
               up: ty.ptr(ty.i32), down: ty.ptr(ty.i32), stepped: ty.ptr(ty.i32), n: ty.i32):
    """Weighted sums over [lo, hi) with step 1, over (hi, lo] downwards with step -1, and with a
    run-time step of either sign: each loop form of ``ty.range`` with run-time bounds."""
    for i in ty.range(ty.thread_idx(), n, 32):
        s = 0
        for t in ty.range(lo[i], hi[i]):
            s = s + x[t] * (t + 1)
        up[i] = s
        s = 0
        for t in ty.range(hi[i], lo[i], -1):
            s = s + x[t] * (t + 3)
        down[i] = s
        s = 0
        for t in ty.range(lo[i], hi[i], step[i]):
            s = s + x[t] * (t + 7)
        stepped[i] = s


@ty.kernel(threads=32)
def conversions(f: ty.ptr(ty.f32), i: ty.ptr(ty.i32), u: ty.ptr(ty.u32), fu: ty.ptr(ty.f32),
                f_to_i: ty.ptr(ty.i32), i_to_f: ty.ptr(ty.f32), u_to_f: ty.ptr(ty.f32), f_to_u: ty.ptr(ty.u32),
                i_to_d: ty.ptr(ty.f64), n: ty.i32):
    for k in ty.range(ty.thread_idx(), n, 32):
        f_to_i[k] = ty.cast(f[k], ty.i32)
        i_to_f[k] = ty.cast(i[k], ty.f32)
        u_to_f[k] = ty.cast(u[k], ty.f32)
        f_to_u[k] = ty.cast(fu[k], ty.u32)
        i_to_d[k] = ty.cast(i[k], ty.f64)


# -- inputs: random values with each type's edges mixed in -----------------------------------------

def _mix(rng, random, edges):
    """``random`` with about a quarter of its entries replaced by ``edges`` (so every edge appears)."""
    out = random.copy()
    idx = rng.choice(len(out), size=max(len(edges) * 3, len(out) // 4), replace=False)
    out[idx] = np.resize(np.asarray(edges, out.dtype), len(idx))
    return out


def _pad(x):
    fill = np.nan if x.dtype.kind == "f" else SENTINEL[x.dtype.type]
    return np.concatenate([x, np.full(PAD, fill, x.dtype)])


def _out(dtype):
    return _pad(np.full(N, np.nan if np.dtype(dtype).kind == "f" else SENTINEL[np.dtype(dtype).type], dtype))


def compare_inputs(dtype):
    def make(rng):
        if dtype is np.float32:
            edges = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4028235e38]
            a = rng.integers(-4, 4, N).astype(np.float32) * 0.5  # small values: many ties
        else:
            info = np.iinfo(dtype)
            edges = [info.min, info.max, 0, 1, info.max // 2, info.max // 2 + 1] + ([-1] if info.min else [])
            a = rng.integers(max(info.min, -3), 4, N).astype(dtype)
        a = _mix(rng, a, edges)
        b = _mix(rng, a[rng.permutation(N)].copy(), edges)
        b[::5] = a[::5]  # exact ties
        return [_pad(a), _pad(b), _out(np.int32), N]

    def reference(args):
        a, b = args[0][:N], args[1][:N]
        with np.errstate(invalid="ignore"):
            bits = [(a < b, 1), (a <= b, 2), (a > b, 4), (a >= b, 8), (a == b, 16), (a != b, 32)]
        return {2: sum(np.where(c, v, 0) for c, v in bits).astype(np.int32)}
    return make, reference


def select_inputs(rng):
    c = _mix(rng, rng.integers(-3, 4, N).astype(np.int32), [0, 1, -1, -2**31, 2**31 - 1])
    a = _mix(rng, rng.standard_normal(N).astype(np.float32), [0.0, -0.0, np.inf, np.nan])
    b = rng.standard_normal(N).astype(np.float32)
    k = rng.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32)
    j = rng.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32)
    return [_pad(c), _pad(a), _pad(b), _pad(k), _pad(j), _out(np.float32), _out(np.int32), N]


def select_reference(args):
    c = args[0][:N] > 0
    return {5: np.where(c, args[1][:N], args[2][:N]), 6: np.where(c, args[3][:N], args[4][:N])}


X_LEN = 64  # the loops index x[0 .. X_LEN - 1] (a loop one step too long reads the padding)


def range_inputs(rng):
    x = rng.integers(-1000, 1000, X_LEN).astype(np.int32)
    lo = rng.integers(0, X_LEN, N).astype(np.int32)
    hi = rng.integers(0, X_LEN, N).astype(np.int32)
    hi[::7] = lo[::7]  # empty ranges
    hi[1::11] = np.minimum(lo[1::11] + 1, X_LEN - 1)  # one-element ranges
    step = rng.choice(np.array([-5, -3, -2, -1, 1, 2, 3, 5, 0], np.int32), N)
    return [_pad(x), _pad(lo), _pad(hi), _pad(step), _out(np.int32), _out(np.int32), _out(np.int32), N]


def range_reference(args):
    x, lo, hi, step = (a for a in args[:4])
    up, down, stepped = (np.zeros(N, np.int64) for _ in range(3))
    for i in range(N):
        up[i] = sum(int(x[t]) * (t + 1) for t in range(lo[i], hi[i]))
        down[i] = sum(int(x[t]) * (t + 3) for t in range(hi[i], lo[i], -1))
        st = int(step[i])
        stepped[i] = sum(int(x[t]) * (t + 7) for t in range(lo[i], hi[i], st)) if st else 0
    return {4: up.astype(np.int32), 5: down.astype(np.int32), 6: stepped.astype(np.int32)}


def conversion_inputs(rng):
    # in range for every conversion: LLVM leaves an out-of-range float -> int conversion undefined
    f = _mix(rng, (rng.standard_normal(N) * 1000).astype(np.float32),
             [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.999999, -0.999999, 1e-40, -2147483648.0,
              2147483520.0, 16777217.0, 8388607.5])
    i = _mix(rng, rng.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32),
             [-2**31, 2**31 - 1, -1, 0, 1, 16777217, -16777217, 33554435])
    u = _mix(rng, rng.integers(0, 2**32, N, dtype=np.int64).astype(np.uint32),
             [0, 1, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1, 16777217, 4294967040])
    fu = _mix(rng, (rng.random(N) * 4.2e9).astype(np.float32),
              [0.0, 0.5, 1.5, 2147483648.0, 3e9, 4294967040.0, 0.999999, 2147483520.0])
    return [_pad(f), _pad(i), _pad(u), _pad(fu), _out(np.int32), _out(np.float32), _out(np.float32),
            _out(np.uint32), _out(np.float64), N]


def conversion_reference(args):
    f, i, u, fu = (a[:N] for a in args[:4])
    return {4: np.trunc(f).astype(np.int32), 5: i.astype(np.float32), 6: u.astype(np.float32),
            7: np.trunc(fu).astype(np.uint32), 8: i.astype(np.float64)}


@dataclass(frozen=True)
class Case:
    name: str
    kernel: object
    make: Callable  # rng -> the argument list (numpy arrays and ints)
    reference: Callable  # args -> {argument index: expected first N elements}


CASES = [
    Case("compare_i32", compare_i32, *compare_inputs(np.int32)),
    Case("compare_u32", compare_u32, *compare_inputs(np.uint32)),
    Case("compare_f32", compare_f32, *compare_inputs(np.float32)),
    Case("select_pairs", select_pairs, select_inputs, select_reference),
    Case("range_sums", range_sums, range_inputs, range_reference),
    Case("conversions", conversions, conversion_inputs, conversion_reference),
]


def _same(x, y):
    """Elementwise equality, bit for bit (NaN equals NaN of the same bits, -0.0 differs from 0.0)."""
    if x.dtype.kind == "f":
        return x.view(f"u{x.itemsize}") == y.view(f"u{y.itemsize}")
    return x == y


def _first(args, outputs, idx, mask, got, want, what):
    k = int(np.flatnonzero(~mask)[0])
    if k >= N:
        return (f"output arg{idx} written past its end at [{k}]: expects the padding {want[k]!r} ({what}), "
                f"but got {got[k]!r}")
    ins = ", ".join(f"arg{j}={a[k].item()!r}" for j, a in enumerate(args)
                    if isinstance(a, np.ndarray) and j not in outputs and len(a) > k)
    return (f"output arg{idx}: {int((~mask).sum())} of {N} elements differ; first at [{k}] ({ins}): "
            f"expects {want[k].item()!r} ({what}), but got {got[k].item()!r}")


def check_case(case: Case, seed: int) -> None:
    """One case on one seed's inputs: host run against the emulator, numpy and the padding."""
    rng = np.random.default_rng(seed)
    args = case.make(rng)
    host = HostKernel(case.kernel.trace())
    host_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    emu_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    host.run(host_args, grid=1)
    case.kernel.emulate(*emu_args, grid=(1,))
    expected = case.reference(args)
    for idx in expected:
        same = _same(host_args[idx], emu_args[idx])
        if not same.all():
            where = _first(args, expected, idx, same, host_args[idx], emu_args[idx], "emulator")
            raise Caught("host_llvm vs emulator", f"{case.name} (seed {seed}) {where}")
    for idx, want in expected.items():
        got = host_args[idx][:N]
        same = _same(got, want.astype(got.dtype))
        if not same.all():
            where = _first(args, expected, idx, same, got, want, "numpy")
            raise Caught("host_llvm vs numpy", f"{case.name} (seed {seed}) {where}")
        tail = _same(host_args[idx][N:], args[idx][N:])
        if not tail.all():
            raise Caught("guard past the end", f"{case.name} (seed {seed}): output arg{idx} written past its end "
                         f"at [{N + int(np.flatnonzero(~tail)[0])}]")


def check_all(seeds=(0, 1, 2)) -> None:
    """Every case on every seed; the first disagreement raises ``Caught``."""
    for case in CASES:
        for seed in seeds:
            check_case(case, seed)
