"""Scalar kernels and a check that runs each one three ways: the generated LLVM IR on the host
(``tylopy.codegen.host_llvm``), the emulator, and numpy.

The emulator executes the IR's meaning; the host run executes what code generation made of it.
``check_case`` runs a case on fresh random inputs with the edges of each type mixed in (ties, the
extremes of the integer range, signed zeros, infinities, NaN, values near 2^31 and 2^32, halves)
and raises ``Caught`` naming the check that saw a difference:

* ``host_llvm vs emulator``: an output element differs bit for bit between the two runs;
* ``host_llvm vs numpy``: the host run differs from the numpy reference;
* ``guard past the end``: the host run wrote the NaN/sentinel padding past an output's end.

A lowering that divides by -1 without its guard traps on the host (SIGFPE) for MIN / -1, which LLVM
leaves undefined: ``int_division`` then ends the process rather than failing.

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
SENTINEL = {np.int32: -0x5A5A5A5B, np.uint32: 0xA5A5A5A5, np.int64: -0x5A5A5A5A5A5A5A5B,
            np.uint64: 0xA5A5A5A5A5A5A5A5}


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
compare_i64, compare_u64, compare_f64 = _cmp_kernel(ty.i64), _cmp_kernel(ty.u64), _cmp_kernel(ty.f64)


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


@ty.kernel(threads=32)
def int_division(a: ty.ptr(ty.i32), b: ty.ptr(ty.i32), q: ty.ptr(ty.i32), r: ty.ptr(ty.i32),
                 q_by_minus_one: ty.ptr(ty.i32), r_by_minus_one: ty.ptr(ty.i32), q_by_seven: ty.ptr(ty.i32),
                 n: ty.i32):
    """Run-time divisors (0, -1 and MIN among them) and constant ones (-1 needs the same guard)."""
    for i in ty.range(ty.thread_idx(), n, 32):
        q[i] = a[i] // b[i]
        r[i] = a[i] % b[i]
        q_by_minus_one[i] = a[i] // -1
        r_by_minus_one[i] = a[i] % -1
        q_by_seven[i] = a[i] // -7


@ty.kernel(threads=32)
def int_shifts(a: ty.ptr(ty.i32), s: ty.ptr(ty.i32), shl: ty.ptr(ty.i32), sar: ty.ptr(ty.i32),
               shr: ty.ptr(ty.u32), n: ty.i32):
    """Run-time shift amounts, the type's width and more among them (PTX clamps, LLVM would not)."""
    for i in ty.range(ty.thread_idx(), n, 32):
        shl[i] = a[i] << s[i]
        sar[i] = a[i] >> s[i]
        shr[i] = ty.cast(a[i], ty.u32) >> ty.cast(s[i], ty.u32)


@ty.kernel(threads=32)
def float_arith(a: ty.ptr(ty.f32), b: ty.ptr(ty.f32), c: ty.ptr(ty.f32), mul_add: ty.ptr(ty.f32),
                quotient: ty.ptr(ty.f32), low: ty.ptr(ty.f32), high: ty.ptr(ty.f32), fused: ty.ptr(ty.f32),
                root: ty.ptr(ty.f32), negated: ty.ptr(ty.f32), n: ty.i32):
    """The correctly rounded float ops (the approximate ones are NVVM intrinsics the host cannot run)."""
    for i in ty.range(ty.thread_idx(), n, 32):
        mul_add[i] = a[i] + b[i] * c[i]
        quotient[i] = a[i] / b[i]
        low[i] = ty.minimum(a[i], b[i])
        high[i] = ty.maximum(a[i], b[i])
        fused[i] = ty.fma(a[i], b[i], c[i])
        root[i] = ty.sqrt(a[i])
        negated[i] = -ty.abs(a[i]) - b[i]


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
        if np.dtype(dtype).kind == "f":
            tiny = np.finfo(dtype).smallest_subnormal
            edges = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, tiny, -tiny, np.finfo(dtype).max]
            a = rng.integers(-4, 4, N).astype(dtype) * 0.5  # small values: many ties
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


INT_EDGES = [-2**31, 2**31 - 1, -1, 0, 1, 7, -7]


def division_inputs(rng):
    a = _mix(rng, rng.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32), INT_EDGES)
    b = _mix(rng, rng.integers(-50, 50, N).astype(np.int32), INT_EDGES)
    return [_pad(a), _pad(b)] + [_out(np.int32) for _ in range(5)] + [N]


def _c_division(a, b):
    """C's truncating a / b and a % b with PTX's results for b = 0 (all ones, a) and MIN / -1 (MIN, 0)."""
    a, b = a.astype(np.int64), b.astype(np.int64)
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe)
    q = np.where(b == 0, -1, q)
    r = np.where(b == 0, a, a - q * b)
    return q.astype(np.uint32).view(np.int32), r.astype(np.uint32).view(np.int32)  # wraps MIN / -1 to MIN


def division_reference(args):
    a, b = args[0][:N], args[1][:N]
    q, r = _c_division(a, b)
    qm, rm = _c_division(a, np.full(N, -1, np.int32))
    q7, _ = _c_division(a, np.full(N, -7, np.int32))
    return {2: q, 3: r, 4: qm, 5: rm, 6: q7}


def shift_inputs(rng):
    a = _mix(rng, rng.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32), INT_EDGES)
    s = _mix(rng, rng.integers(0, 40, N).astype(np.int32), [0, 1, 31, 32, 33, 64, 255])
    return [_pad(a), _pad(s), _out(np.int32), _out(np.int32), _out(np.uint32), N]


def shift_reference(args):
    a, s = args[0][:N].astype(np.int64), args[1][:N].astype(np.int64)
    big = s >= 32
    t = np.minimum(s, 31)
    shl = np.where(big, 0, (a << t) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    sar = (a >> t).astype(np.int32)  # by 31 or more: the sign
    shr = np.where(big, 0, (a & 0xFFFFFFFF) >> t).astype(np.uint32)
    return {2: shl, 3: sar, 4: shr}


FLOAT_EDGES = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38, 1e-38]


def float_inputs(rng):
    a, b, c = (_mix(rng, rng.standard_normal(N).astype(np.float32), FLOAT_EDGES) for _ in range(3))
    b[::9] = a[::9]  # ties for min/max, x / x
    b[1::9] = -a[1::9]
    # min/max of +0 and -0 left out: llvm.minnum/maxnum may return either zero (the host gives the
    # other one than the emulator); tests/test_host_llvm_gpu.py compares the device on them
    zeros = (a == 0) & (b == 0)
    b[zeros] = a[zeros]
    return [_pad(a), _pad(b), _pad(c)] + [_out(np.float32) for _ in range(7)] + [N]


def float_reference(args):
    a, b, c = (x[:N].astype(np.float64) for x in args[:3])
    f = np.float32
    with np.errstate(all="ignore"):
        return {3: (a + (b * c).astype(f)).astype(f), 4: (a / b).astype(f),
                5: np.fmin(a, b).astype(f), 6: np.fmax(a, b).astype(f),
                7: None,  # fma: float64 then float32 rounds twice; the emulator's fma is the reference
                8: np.sqrt(a).astype(f), 9: (-np.abs(a) - b).astype(f)}


@dataclass(frozen=True)
class Case:
    name: str
    kernel: object
    make: Callable  # rng -> the argument list (numpy arrays and ints)
    reference: Callable  # args -> {argument index: expected first N elements, or None: the emulator's only}
    nan_bits: bool = True  # compare NaN payloads (False: x86 and PTX make different NaNs from arithmetic)


CASES = [
    Case("compare_i32", compare_i32, *compare_inputs(np.int32)),
    Case("compare_u32", compare_u32, *compare_inputs(np.uint32)),
    Case("compare_f32", compare_f32, *compare_inputs(np.float32)),
    Case("compare_i64", compare_i64, *compare_inputs(np.int64)),
    Case("compare_u64", compare_u64, *compare_inputs(np.uint64)),
    Case("compare_f64", compare_f64, *compare_inputs(np.float64)),
    Case("select_pairs", select_pairs, select_inputs, select_reference),
    Case("range_sums", range_sums, range_inputs, range_reference),
    Case("conversions", conversions, conversion_inputs, conversion_reference),
    Case("int_division", int_division, division_inputs, division_reference),
    Case("int_shifts", int_shifts, shift_inputs, shift_reference),
    Case("float_arith", float_arith, float_inputs, float_reference, nan_bits=False),
]


def _same(x, y, nan_bits=True):
    """Elementwise equality, bit for bit (NaN equals NaN of the same bits, or any NaN without
    ``nan_bits``; -0.0 differs from 0.0)."""
    if x.dtype.kind == "f":
        same = x.view(f"u{x.itemsize}") == y.view(f"u{y.itemsize}")
        return same if nan_bits else same | (np.isnan(x) & np.isnan(y))
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


_EMULATED: dict = {}


def _emulated(case: Case, seed: int):
    """(inputs, the emulator's outputs, numpy's) of a case and seed, made once per process: code
    generation (what the mutation tests change) plays no part in them."""
    key = (case.name, seed)
    if key not in _EMULATED:
        args = case.make(np.random.default_rng(seed))
        emu_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        case.kernel.emulate(*emu_args, grid=(1,))
        _EMULATED[key] = (args, emu_args, case.reference(args))
    return _EMULATED[key]


def check_case(case: Case, seed: int) -> None:
    """One case on one seed's inputs: host run against the emulator, numpy and the padding."""
    args, emu_args, expected = _emulated(case, seed)
    host = HostKernel(case.kernel.trace())
    host_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    host.run(host_args, grid=1)
    for idx in expected:
        same = _same(host_args[idx], emu_args[idx], case.nan_bits)
        if not same.all():
            where = _first(args, expected, idx, same, host_args[idx], emu_args[idx], "emulator")
            raise Caught("host_llvm vs emulator", f"{case.name} (seed {seed}) {where}")
    for idx, want in expected.items():
        got = host_args[idx][:N]
        if want is None:
            want = emu_args[idx][:N]
        same = _same(got, want.astype(got.dtype), case.nan_bits)
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
