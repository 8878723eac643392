"""One CPU semantics: the tile library's reference mode and the emulator agree bit for bit.

A fragment op in reference mode (numpy over every lane) and the same op traced into a kernel
and run by the emulator must give identical bits, for random inputs mixed with subnormals,
infinities, NaN and signed zeros. Both go through ``tylopy.semantics``; this test keeps it so.
"""
import numpy as np
import pytest

import tylopy as ty
from tylopy.tile.fragment import _RefOps

N = 32
SPECIAL = np.array([0.0, -0.0, 1e-40, -1e-40, 1.4e-45, -1.17e-38, 1.1754944e-38, np.inf, -np.inf, np.nan,
                    3.4028235e38, -3.4028235e38, 1.0, -1.0, 0.5, 2.0 ** -126, 127.99, -149.5], dtype=np.float32)


def inputs(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(N) * rng.choice([1e-3, 1.0, 1e3, 1e30], N)).astype(np.float32)
    x[rng.permutation(N)[: len(SPECIAL)]] = rng.permutation(SPECIAL)
    return x


UNARY = ["exp2", "log2", "rcp"]
BINARY = ["add", "sub", "mul", "max", "min"]


def emulated(name, arity):
    @ty.kernel(threads=N, name=f"parity_{name}")
    def k(a: ty.ptr(ty.f32), b: ty.ptr(ty.f32), c: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
        i = ty.thread_idx()
        frag = ty.Fragment((a[i], b[i], c[i]), ty.LocalOwnership(2, 3))
        ops = frag.ops
        x, y, z = frag.values
        if arity == 1:
            out[i] = getattr(ops, name)(x)
        elif arity == 2:
            out[i] = getattr(ops, name)(x, y)
        else:
            out[i] = getattr(ops, name)(x, y, z)
    return k


def reference(name, arity, a, b, c):
    fn = getattr(_RefOps, name)
    with np.errstate(all="ignore"):
        return np.asarray(fn(*(a, b, c)[:arity]), dtype=np.float32)


def bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name,arity", [(n, 1) for n in UNARY] + [(n, 2) for n in BINARY] + [("fma", 3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_reference_mode_equals_emulator(name, arity, seed):
    a, b, c = inputs(seed), inputs(seed + 100), inputs(seed + 200)
    out = np.full(N, np.nan, dtype=np.float32)
    emulated(name, arity).emulate(a, b, c, out, grid=(1,))
    want = reference(name, arity, a, b, c)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan), name
    assert np.array_equal(bits(out)[~nan], bits(want)[~nan]), (name, a[bits(out) != bits(want)])


def _round_f32(q) -> np.float32:
    """An exact rational rounded once to f32, nearest even (finite normal range is enough here)."""
    from fractions import Fraction
    lo = np.float32(float(q))
    # candidates around the double rounding of q; pick the nearest (ties to even mantissa)
    cands = [np.nextafter(lo, np.float32(-np.inf)), lo, np.nextafter(lo, np.float32(np.inf))]
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - q), int(np.float32(c).view(np.uint32)) & 1))
    return np.float32(best)


def test_fma_rounds_once():
    """fma rounds a*b+c once: cases where rounding the f64 sum to f32 would round twice."""
    from fractions import Fraction
    rng = np.random.default_rng(7)
    a = (1 + rng.integers(0, 2 ** 23, 4000) * 2.0 ** -23).astype(np.float32)
    b = (1 + rng.integers(0, 2 ** 23, 4000) * 2.0 ** -23).astype(np.float32)
    c = (-(a.astype(np.float64) * b.astype(np.float64))).astype(np.float32)  # heavy cancellation
    c[::2] = np.float32(2.0 ** -30)  # and sums that land next to an f32 midpoint
    got = _RefOps.fma(a, b, c)
    for i in range(0, 4000, 7):
        want = _round_f32(Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i])))
        assert bits(got[i]) == bits(want), (a[i], b[i], c[i])


def test_exp2_flushes_subnormal_results():
    out = _RefOps.exp2(np.array([-127.5, -149.0, -126.0], np.float32))
    assert out[0] == 0.0 and out[1] == 0.0 and out[2] == np.float32(2.0 ** -126)
