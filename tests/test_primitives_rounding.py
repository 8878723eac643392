"""Float ops and conversions with an explicit rounding direction: ``ty.add/sub/mul/div/fma/sqrt(...,
rounding=)`` and ``ty.cast(x, t, rounding=)``.

The oracle is IEEE 754 written here from its definition with exact rationals (``Fraction``): the
exact result, rounded to the format's grid (precision p, minimum exponent emin, maximum emax) in
the direction asked, overflow to infinity or to the largest finite value as the direction says,
an exact zero sum +0 (-0 under rm). It checks the numpy semantics on many values (subnormals,
near-overflow, ties, exact zeros), the emulator on a kernel, the PTX instructions and ptxas.
"""
import math
from fractions import Fraction

import numpy as np
import pytest

import tylopy as ty
from tylopy.errors import KernelSourceError
from tylopy.semantics import rounding as R
from tylopy.semantics.scalar import bf16_to_f32

MODES = ("rn", "rz", "rm", "rp")
FORMATS = {"f16": (11, -14, 15), "bf16": (8, -126, 127), "f32": (24, -126, 127), "f64": (53, -1022, 1023)}


def exact_round(q: Fraction, fmt: str, mode: str):
    """IEEE rounding of the exact value ``q`` to ``fmt`` in ``mode``: a Fraction, or +-inf."""
    p, emin, emax = FORMATS[fmt]
    if q == 0:
        return Fraction(0)
    sign = 1 if q > 0 else -1
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    ulp = Fraction(2) ** (max(e, emin) - p + 1)
    n = a / ulp
    lo = math.floor(n)
    rest = n - lo
    up = {"rn": rest > Fraction(1, 2) or (rest == Fraction(1, 2) and lo % 2 == 1), "rz": False,
          "rp": rest > 0 and sign > 0, "rm": rest > 0 and sign < 0}[mode]
    m = (lo + up) * ulp
    largest = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if m > largest:
        away = mode == "rn" or (mode == "rp" and sign > 0) or (mode == "rm" and sign < 0)
        return sign * math.inf if away else sign * largest
    return sign * m


def same(got: float, want, q: Fraction | None = None, terms=None, mode="rn") -> bool:
    """Bit-level agreement of a float result with the oracle, signed zeros included for sums."""
    if isinstance(want, float) and math.isinf(want):
        return got == want
    if got != float(want):
        return False
    if got == 0 and q is not None and q != 0:  # a nonzero value rounded to zero keeps its sign
        return math.copysign(1, got) == (1 if q > 0 else -1)
    if got == 0 and terms is not None:
        x, y = terms
        both = x == 0 and y == 0 and math.copysign(1, x) == math.copysign(1, y)
        want_sign = math.copysign(1, x) if both else (-1.0 if mode == "rm" else 1.0)
        return math.copysign(1, got) == want_sign
    return True


def f32_samples(n, seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    raw = bits.view(np.float32)
    raw = np.where(np.isfinite(raw), raw, np.float32(3.0))
    near = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    tiny = (rng.standard_normal(n) * 2.0 ** -140).astype(np.float32)  # subnormals
    huge = (rng.choice([-1, 1], n) * rng.uniform(1.0, 2.0, n) * 2.0 ** 127).astype(np.float32)
    pick = rng.integers(0, 4, n)
    return np.choose(pick, [raw, near, tiny, huge]).astype(np.float32)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_f32_arithmetic_matches_exact_rounding(op):
    a, b = f32_samples(2500, 1), f32_samples(2500, 2)
    b[:200] = -a[:200] if op == "add" else a[:200]  # exact zeros (and x / x)
    b[200:260] = 0.0
    for mode in MODES:
        got = R.binary(op, np.float32, mode)(a, b)
        for x, y, g in zip(a.tolist(), b.tolist(), got.tolist()):
            if op == "div" and y == 0:
                assert math.isnan(g) if x == 0 else g == math.copysign(math.inf, x) * math.copysign(1, y)
                continue
            X, Y = Fraction(x), Fraction(y)
            q = {"add": X + Y, "sub": X - Y, "mul": X * Y, "div": X / Y if Y else None}[op]
            terms = (x, y) if op == "add" else (x, -y) if op == "sub" else None
            assert same(g, exact_round(q, "f32", mode), q, terms, mode), (op, mode, x, y, g)


def test_f32_fma_and_sqrt_match_exact_rounding():
    a, b, c = f32_samples(2000, 3), f32_samples(2000, 4), f32_samples(2000, 5)
    with np.errstate(over="ignore"):
        near = -(a[:100].astype(np.float64) * b[:100]).astype(np.float32)  # near-cancellation
    c[:100] = np.where(np.isfinite(near), near, np.float32(1.0))
    a[100:150], c[100:150] = 0.0, -0.0
    for mode in MODES:
        got = R.fma(np.float32, mode)(a, b, c)
        for x, y, z, g in zip(a.tolist(), b.tolist(), c.tolist(), got.tolist()):
            q = Fraction(x) * Fraction(y) + Fraction(z)
            assert same(g, exact_round(q, "f32", mode), q, (x * y, z), mode), (mode, x, y, z, g)
        s = np.abs(a)
        got = R.sqrt(mode)(s)
        for x, g in zip(s.tolist(), got.tolist()):
            want = exact_sqrt(Fraction(x), mode)
            assert g == float(want), (mode, x, g)


def exact_sqrt(x: Fraction, mode: str):
    """The f32 rounding of sqrt(x): bisect the f32 grid with exact squares."""
    if x == 0:
        return Fraction(0)
    r = Fraction(float(np.sqrt(np.float64(float(x)))))  # a close start; the oracle decides by squares
    cands = [Fraction(float(v)) for v in np.nextafter(np.float32(float(r)), np.float32([-np.inf, np.inf]))]
    cands.append(Fraction(float(np.float32(float(r)))))
    cands = [c for c in cands if c >= 0]
    below = max(c for c in cands if c * c <= x)
    above = min(c for c in cands if c * c >= x)
    if below == above:
        return below
    if mode == "rn":
        mid = (below + above) / 2
        return below if mid * mid > x else above  # a tie is impossible for a square root of an f32
    return {"rz": below, "rm": below, "rp": above}[mode]


def test_f64_arithmetic_matches_exact_rounding():
    rng = np.random.default_rng(6)
    a = rng.standard_normal(300) * 2.0 ** rng.integers(-60, 60, 300)
    b = rng.standard_normal(300) * 2.0 ** rng.integers(-60, 60, 300)
    b[:20] = -a[:20]
    c = rng.standard_normal(300)
    for mode in MODES:
        for op in ("add", "sub", "mul", "div"):
            got = R.binary(op, np.float64, mode)(a, b)
            for x, y, g in zip(a.tolist(), b.tolist(), got.tolist()):
                X, Y = Fraction(x), Fraction(y)
                q = {"add": X + Y, "sub": X - Y, "mul": X * Y, "div": X / Y}[op]
                terms = (x, y) if op == "add" else (x, -y) if op == "sub" else None
                assert same(g, exact_round(q, "f64", mode), q, terms, mode), (op, mode, x, y)
        got = R.fma(np.float64, mode)(a, b, c)
        for x, y, z, g in zip(a.tolist(), b.tolist(), c.tolist(), got.tolist()):
            assert g == float(exact_round(Fraction(x) * Fraction(y) + Fraction(z), "f64", mode))


def _bits_value(bits, fmt):
    if fmt == "bf16":
        return bf16_to_f32(np.asarray(bits, np.uint16)).astype(np.float64)
    return np.asarray(bits, np.uint16).view(np.float16).astype(np.float64)


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_f32_to_16_bit_conversions(fmt):
    x = f32_samples(3000, 7)
    x[:300] = (np.random.default_rng(8).standard_normal(300) * 60000).astype(np.float32)  # f16 overflow edge
    for mode in MODES:
        bits = R.float_to_f16(x, mode) if fmt == "f16" else R.f32_to_bf16_rounded(x, mode)
        for v, g in zip(x.tolist(), _bits_value(bits, fmt).tolist()):
            assert same(g, exact_round(Fraction(v), fmt, mode)), (fmt, mode, v, g)


def test_f64_to_narrower_conversions():
    rng = np.random.default_rng(9)
    x = rng.standard_normal(1500) * 2.0 ** rng.integers(-150, 130, 1500)
    for mode in MODES:
        f32 = R.f64_to_f32(x, mode)
        f16 = _bits_value(R.float_to_f16(x, mode), "f16")
        bf = _bits_value(R.f64_to_bf16(x, mode), "bf16")
        for v, a, b, c in zip(x.tolist(), f32.tolist(), f16.tolist(), bf.tolist()):
            q = Fraction(v)
            assert same(a, exact_round(q, "f32", mode)), (mode, v, a)
            assert same(b, exact_round(q, "f16", mode)), (mode, v, b)
            assert same(c, exact_round(q, "bf16", mode)), (mode, v, c)


@pytest.mark.parametrize("src", ["int32", "int64", "uint64"])
def test_int_to_float_conversions(src):
    rng = np.random.default_rng(10)
    info = np.iinfo(src)
    x = np.concatenate([rng.integers(info.min, info.max, 400, dtype=src, endpoint=True),
                        rng.integers(-70000 if info.min else 0, 70000, 200).astype(src)])
    for mode in MODES:
        outs = {"f32": R.int_to_float(x, np.float32, mode), "f64": R.int_to_float(x, np.float64, mode),
                "f16": _bits_value(R.int_to_float(x, np.float16, mode), "f16"),
                "bf16": _bits_value(R.int_to_bf16(x, mode), "bf16")}
        for fmt, got in outs.items():
            for v, g in zip(x.tolist(), np.asarray(got, np.float64).tolist()):
                assert same(g, exact_round(Fraction(int(v)), fmt, mode)), (src, fmt, mode, v, g)


def test_float_to_int_conversions_round_saturate_and_zero_nan():
    x = np.array([2.5, 3.5, -2.5, -0.5, 0.49999997, 1e10, -1e10, np.nan, np.inf, -np.inf, 7.0, -7.25],
                 np.float32)
    want = {"rn": [2, 4, -2, 0, 0, 2 ** 31 - 1, -2 ** 31, 0, 2 ** 31 - 1, -2 ** 31, 7, -7],
            "rz": [2, 3, -2, 0, 0, 2 ** 31 - 1, -2 ** 31, 0, 2 ** 31 - 1, -2 ** 31, 7, -7],
            "rm": [2, 3, -3, -1, 0, 2 ** 31 - 1, -2 ** 31, 0, 2 ** 31 - 1, -2 ** 31, 7, -8],
            "rp": [3, 4, -2, 0, 1, 2 ** 31 - 1, -2 ** 31, 0, 2 ** 31 - 1, -2 ** 31, 7, -7]}
    for mode in MODES:
        assert R.float_to_int(x, np.int32, mode).tolist() == want[mode], mode
    assert R.float_to_int(np.array([-3.7, 300.2], np.float32), np.uint8, "rn").tolist() == [0, 255]


# -- the ops in kernels: emulator, PTX, ptxas ------------------------------------------------------------

@ty.kernel(threads=64)
def rounded_ops(a: ty.ptr(ty.f32), b: ty.ptr(ty.f32), c: ty.ptr(ty.f32), out: ty.ptr(ty.f32),
                halves: ty.ptr(ty.i16), ints: ty.ptr(ty.i32), MODE: ty.constexpr = "rz"):
    i = ty.thread_idx()
    x, y, z = a[i], b[i], c[i]
    out[i] = ty.add(x, y, rounding=MODE)
    out[64 + i] = ty.sub(x, y, rounding=MODE)
    out[128 + i] = ty.mul(x, y, rounding=MODE)
    out[192 + i] = ty.div(x, y, rounding=MODE)
    out[256 + i] = ty.fma(x, y, z, rounding=MODE)
    out[320 + i] = ty.sqrt(ty.abs(x), rounding=MODE)
    halves[i] = ty.bitcast(ty.cast(x, ty.f16, rounding=MODE), ty.i16)
    halves[64 + i] = ty.bitcast(ty.cast(x, ty.bf16, rounding=MODE), ty.i16)
    ints[i] = ty.cast(x * 1000.0, ty.i32, rounding=MODE)
    ints[64 + i] = ty.bitcast(ty.cast(ints[i] * 977, ty.f32, rounding=MODE), ty.i32)


def _inputs():
    rng = np.random.default_rng(11)
    a = (rng.standard_normal(64) * 2.0 ** rng.integers(-8, 8, 64)).astype(np.float32)
    b = (rng.standard_normal(64) * 2.0 ** rng.integers(-8, 8, 64)).astype(np.float32)
    c = (rng.standard_normal(64)).astype(np.float32)
    b[:4] = -a[:4]
    return a, b, c


def _expected(a, b, c, mode):
    out = np.concatenate([R.binary(op, np.float32, mode)(a, b) for op in ("add", "sub", "mul", "div")]
                         + [R.fma(np.float32, mode)(a, b, c), R.sqrt(mode)(np.abs(a))])
    halves = np.concatenate([R.float_to_f16(a, mode), R.f32_to_bf16_rounded(a, mode)])
    i0 = R.float_to_int((a * np.float32(1000.0)).astype(np.float32), np.int32, mode)
    i1 = R.int_to_float((i0.astype(np.int64) * 977).astype(np.int32), np.float32, mode).view(np.int32)
    return out, halves, np.concatenate([i0, i1])


@pytest.mark.parametrize("mode", MODES)
def test_emulated_kernel_is_bit_identical_to_the_semantics(mode):
    torch = pytest.importorskip("torch")
    a, b, c = _inputs()
    out = torch.full((384,), float("nan"))
    halves = torch.zeros(128, dtype=torch.int16)
    ints = torch.zeros(128, dtype=torch.int32)
    rounded_ops.emulate(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c), out, halves, ints, grid=(1,),
                        MODE=mode)
    want_out, want_halves, want_ints = _expected(a, b, c, mode)
    np.testing.assert_array_equal(out.numpy().view(np.uint32), want_out.view(np.uint32))
    np.testing.assert_array_equal(halves.numpy().view(np.uint16), want_halves)
    np.testing.assert_array_equal(ints.numpy(), want_ints)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptx_has_the_rounded_instructions_and_ptxas_assembles_them(arch):
    ck = rounded_ops.with_arch(arch).compile(MODE="rm")
    for ins in ("add.rm.f32", "mul.rm.f32", "div.rm.f32", "fma.rm.f32", "sqrt.rm.f32", "cvt.rm.f16.f32",
                "cvt.rm.bf16.f32", "cvt.rmi.s32.f32", "cvt.rm.f32.s32"):
        assert ins in ck.ptx, ins
    assert "sub.rm.f32" in ck.ptx  # lowered as add(a, -b); LLVM folds it back into sub.rm
    assert ck.report.available is False or ck.report.spills == 0


def test_explicit_rn_is_never_contracted_into_an_fma():
    @ty.kernel(threads=32)
    def mul_add(a: ty.ptr(ty.f32), out: ty.ptr(ty.f32), EXPLICIT: ty.constexpr = True):
        i = ty.thread_idx()
        if EXPLICIT:
            out[i] = ty.add(ty.mul(a[i], a[i + 32], rounding="rn"), a[i + 64], rounding="rn")
        else:
            out[i] = a[i] * a[i + 32] + a[i + 64]
    ptx = mul_add.compile(EXPLICIT=True).ptx
    assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx and "fma" not in ptx


@ty.kernel(threads=32)
def bad_rounding(a: ty.ptr(ty.f32), n: ty.ptr(ty.i32), CASE: ty.constexpr = 0):
    i = ty.thread_idx()
    if CASE == 0:
        n[i] = ty.add(n[i], 1, rounding="rz")  # <- case 0
    elif CASE == 1:
        a[i] = ty.add(a[i], 1.0, rounding="down")  # <- case 1
    elif CASE == 2:
        a[i] = ty.cast(a[i], ty.f32, rounding="rz")  # <- case 2
    elif CASE == 3:
        a[i] = ty.cast(ty.cast(n[i], ty.bf16, rounding="rz"), ty.f32)  # <- case 3
    else:
        a[i] = ty.cast(ty.cast(a[i], ty.f16), ty.f32, rounding="rz")  # <- case 4


@pytest.mark.parametrize("case, words", [(0, "expects f32 or f64"), (1, "rounding expects one of"),
                                         (2, "already f32"), (3, "sm_90"), (4, "exact or has no rounding")])
def test_rounding_misuse_is_an_error_at_the_user_line(case, words):
    with pytest.raises(KernelSourceError, match=words) as e:
        bad_rounding.with_arch("sm_80").compile(CASE=case)
    line = next(i for i, t in enumerate(open(__file__).read().splitlines(), 1) if t.endswith(f"# <- case {case}"))
    assert e.value.loc is not None and e.value.loc.lineno == line


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_gpu_rounded_ops_are_bit_identical_to_the_emulator(mode):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    a, b, c = _inputs()
    args = [torch.from_numpy(x).cuda() for x in (a, b, c)]
    out = torch.full((384,), float("nan"), device="cuda")
    halves = torch.zeros(128, dtype=torch.int16, device="cuda")
    ints = torch.zeros(128, dtype=torch.int32, device="cuda")
    rounded_ops[(1,)](*args, out, halves, ints, MODE=mode)
    torch.cuda.synchronize()
    want_out, want_halves, want_ints = _expected(a, b, c, mode)
    np.testing.assert_array_equal(out.cpu().numpy().view(np.uint32), want_out.view(np.uint32))
    np.testing.assert_array_equal(halves.cpu().numpy().view(np.uint16), want_halves)
    np.testing.assert_array_equal(ints.cpu().numpy(), want_ints)
