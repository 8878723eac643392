"""FP8 (e4m3, e5m2) conversions: the numpy semantics and the emulated kernel against an oracle
written here from the OCP 8-bit float spec (exact rationals, nearest-even by brute force over
all finite codes, satfinite clamping), all 256 codes of both formats; the PTX instructions and
ptxas; the misuse errors; float8 tensors and 16-byte vector accesses of 8-bit data."""
from fractions import Fraction

import numpy as np
import pytest
import torch

import tylopy as ty
import fp8_cases as F
from tylopy.errors import KernelSourceError, LaunchTypeError
from tylopy.semantics import fp8 as S

SPEC = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}  # exponent bits, mantissa bits, bias (OCP FP8 v1.0)


def oracle_value(code: int, fmt: str):
    """The OCP value of a code: a Fraction (with its sign), 'inf'/'-inf', or 'nan'."""
    ebits, mbits, bias = SPEC[fmt]
    sign = -1 if code & 0x80 else 1
    e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
    if fmt == "e4m3" and e == 15 and m == 7:
        return "nan"
    if fmt == "e5m2" and e == 31:
        return "nan" if m else ("inf" if sign > 0 else "-inf")
    if e == 0:
        return sign * Fraction(m, 1 << mbits) * Fraction(2) ** (1 - bias)
    return sign * (1 + Fraction(m, 1 << mbits)) * Fraction(2) ** (e - bias)


def finite_codes(fmt: str):
    """(code, value) of the non-negative finite codes."""
    return [(c, oracle_value(c, fmt)) for c in range(128) if not isinstance(oracle_value(c, fmt), str)]


def oracle_encode(x: float, fmt: str) -> int:
    """Round to nearest (ties to the even code), clamp to the largest finite (satfinite), keep the sign."""
    if x != x:
        return S.NAN_BITS
    sign = 0x80 if np.signbit(x) else 0
    codes = finite_codes(fmt)
    if abs(x) == float("inf"):
        return sign | codes[-1][0]
    q = abs(Fraction(x))
    best = min(codes, key=lambda cv: (abs(cv[1] - q), cv[0] & 1))
    return sign | best[0]


def oracle_f16_bits(code: int, fmt: str) -> int:
    v = oracle_value(code, fmt)
    if v == "nan":
        return 0x7FFF  # every NaN code: the canonical f16 NaN (measured on an H200)
    f = {"inf": float("inf"), "-inf": float("-inf")}.get(v) if isinstance(v, str) else float(v)
    if f == 0 and code & 0x80:
        f = -0.0
    return int(np.array([f], np.float16).view(np.uint16)[0])


def oracle_f32(code: int, fmt: str) -> np.float32:
    if oracle_value(code, fmt) == "nan":
        return np.array([0x7FFFFFFF], np.uint32).view(np.float32)[0]  # the canonical f32 NaN
    return np.array([oracle_f16_bits(code, fmt)], np.uint16).view(np.float16).astype(np.float32)[0]


FORMATS = ["e4m3", "e5m2"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_decoding_every_code_is_bit_exact(fmt):
    codes = np.arange(256, dtype=np.uint8)
    want16 = np.array([oracle_f16_bits(c, fmt) for c in range(256)], np.uint16)
    np.testing.assert_array_equal(S.fp8_to_f16_bits(codes, fmt), want16)
    want32 = np.array([oracle_f32(c, fmt) for c in range(256)], np.float32)
    np.testing.assert_array_equal(S.fp8_to_f32(codes, fmt).view(np.uint32), want32.view(np.uint32))
    nan = np.array([oracle_value(c, fmt) == "nan" for c in range(256)])
    assert nan.sum() == (2 if fmt == "e4m3" else 6)
    assert np.isnan(S.fp8_to_f64(codes, fmt)).tolist() == nan.tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_encoding_matches_the_oracle_on_ties_saturation_subnormals_and_specials(fmt):
    vals = F.interesting_values(fmt, seed=3)
    want = np.array([oracle_encode(float(v), fmt) for v in vals], np.uint8)
    np.testing.assert_array_equal(S.f32_to_fp8(vals, fmt), want)
    # every finite code rounds to itself; the largest finite saturates everything above it
    codes = np.array([c for c in range(256) if not isinstance(oracle_value(c, fmt), str)], np.uint8)
    np.testing.assert_array_equal(S.f32_to_fp8(S.fp8_to_f32(codes, fmt), fmt), codes)
    top = float(finite_codes(fmt)[-1][1])
    assert S.f32_to_fp8(np.float32([np.inf, -np.inf, top * 4, -top * 4]), fmt).tolist() == \
        [oracle_encode(top, fmt), oracle_encode(-top, fmt)] * 2
    assert S.f32_to_fp8(np.float32([-0.0, -1e-30]), fmt).tolist() == [0x80, 0x80]


@pytest.mark.parametrize("fmt", FORMATS)
def test_emulated_conversions_kernel_matches_the_oracle(fmt):
    r = F.run(fmt, "cpu")
    other = "e5m2" if fmt == "e4m3" else "e4m3"
    want32 = np.array([oracle_f32(c, fmt) for c in range(256)], np.float32)
    np.testing.assert_array_equal(r["wide"].view(np.uint32), want32.view(np.uint32))
    np.testing.assert_array_equal(r["halves"], [oracle_f16_bits(c, fmt) for c in range(256)])
    brains = [0x7FFF if np.isnan(v) else int(np.array([v], np.float32).view(np.uint32)[0] >> 16) for v in want32]
    np.testing.assert_array_equal(r["brains"], brains)  # exact: every fp8 value is a bf16 value
    np.testing.assert_array_equal(r["other"], [oracle_encode(float(v), other) for v in want32])
    vals = r["values"]
    np.testing.assert_array_equal(r["rounded"], [oracle_encode(float(v), fmt) for v in vals])
    with np.errstate(over="ignore"):  # the kernel rounds to f16 first (overflowing to inf), then to fp8
        halves = vals.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(r["from_half"], [oracle_encode(float(v), fmt) for v in halves])
    codes = r["rounded"].astype(np.uint32)[:1024].reshape(256, 4)
    np.testing.assert_array_equal(r["packed4"], codes[:, 0] | codes[:, 1] << 8 | codes[:, 2] << 16 | codes[:, 3] << 24)
    pairs = codes.reshape(512, 2)
    np.testing.assert_array_equal(r["packed2"], pairs[:, 0] | pairs[:, 1] << 8)
    decoded = np.array([oracle_f32(int(c), fmt) for c in codes.ravel()], np.float32).reshape(256, 4)
    u = r["unpacked"].reshape(256, 6)
    np.testing.assert_array_equal(u[:, :4].view(np.uint32), decoded.view(np.uint32))
    np.testing.assert_array_equal(u[:, 4:].view(np.uint32), decoded[:, 2:].view(np.uint32))


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_ptx_has_the_paired_conversions_and_ptxas_assembles_them(arch):
    for fmt, other in (("e4m3", "e5m2"), ("e5m2", "e4m3")):
        ck = F.convert_all.with_arch(arch).compile(FMT=F.DTYPE[fmt], OTHER=F.DTYPE[other])
        for ins in (f"cvt.rn.satfinite.{fmt}x2.f32", f"cvt.rn.f16x2.{fmt}x2", f"cvt.rn.satfinite.{other}x2.f32"):
            assert ins in ck.ptx, ins
        assert ck.report.available is False or ck.report.spills == 0


@ty.kernel(threads=32, arch="sm_90a")
def misuse(x: ty.ptr(ty.e4m3), y: ty.ptr(ty.f32), d: ty.ptr(ty.f64), n: ty.ptr(ty.i32), CASE: ty.constexpr = 0):
    i = ty.thread_idx()
    if CASE == 0:
        x[i] = x[i] + x[i + 1]  # <- case 0
    elif CASE == 1:
        x[i] = ty.cast(d[i], ty.e4m3)  # <- case 1
    elif CASE == 2:
        x[i] = ty.cast(y[i], ty.e4m3, rounding="rz")  # <- case 2
    elif CASE == 3:
        x[i] = ty.cast(n[i], ty.e4m3)  # <- case 3
    elif CASE == 4:
        y[i] = ty.select(x[i] < x[i + 1], 1.0, 0.0)  # <- case 4
    else:
        x[i] = ty.cast(y[i], ty.e4m3)  # <- case 5


@pytest.mark.parametrize("case, arch, words", [
    (0, "sm_90a", "add on e4m3 values is not supported"), (1, "sm_90a", "cast to f32 first"),
    (2, "sm_90a", "expects rounding 'rn'"), (3, "sm_90a", "expects an f16, bf16 or f32 value"),
    (4, "sm_90a", "comparisons of e4m3"), (5, "sm_80", "sm_89 or newer")])
def test_fp8_misuse_is_an_error_at_the_user_line(case, arch, words):
    with pytest.raises(KernelSourceError, match=words) as e:
        misuse.with_arch(arch).compile(CASE=case)
    assert f"# <- case {case}" in str(e.value)  # the message shows the kernel line that asked


def test_packed_conversions_check_their_arguments():
    @ty.kernel(threads=32, arch="sm_90a")
    def bad(out: ty.ptr(ty.b32), CASE: ty.constexpr = 0):
        i = ty.thread_idx()
        if CASE == 0:
            out[i] = ty.pack_fp8x4(1.0, 2.0, 3.0, 4.0, ty.f16)
        else:
            a, b, c, d = ty.unpack_fp8x4(ty.cast(i, ty.u32), ty.e4m3)
            out[i] = ty.bitcast(a + b + c + d, ty.b32)
    with pytest.raises(KernelSourceError, match="pack_fp8x4 dtype expects ty.e4m3 or ty.e5m2"):
        bad.compile(CASE=0)
    with pytest.raises(KernelSourceError, match="unpack_fp8x4 expects a b32 word"):
        bad.compile(CASE=1)


def test_float8_tensors_and_16_byte_vector_accesses():
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(512, generator=gen) * 30).to(torch.float8_e4m3fn)
    y = torch.full((512,), float("nan")).to(torch.float8_e4m3fn)
    F.copy16.emulate(x, y, 512, grid=(1,))
    assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))
    ck = F.copy16.compile()
    assert "ld.global.v4.b32" in ck.ptx or "ld.global.v4.u32" in ck.ptx or "ld.global.nc.v4" in ck.ptx, ck.ptx
    assert "st.global.v4" in ck.ptx
    with pytest.raises(LaunchTypeError, match="src"):
        F.copy16.emulate(x.float(), y, 512, grid=(1,))
    with pytest.raises(LaunchTypeError, match="float8_e4m3fn"):
        F.copy16.emulate(x, y.view(torch.uint8), 512, grid=(1,))


# -- mma.sync m16n8k32 with fp8 operands (sm_89+) --------------------------------------------------------

@pytest.mark.parametrize("a_fmt, b_fmt", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")])
def test_mma_sync_k32_fp8_emulated_is_the_model_and_ptxas_takes_it(a_fmt, b_fmt):
    from tylopy.semantics.tensorcore import mma_sync_fp8
    kern = F.mma_fp8_kernel(F.DTYPE[a_fmt], F.DTYPE[b_fmt])
    a, bt, c = F.mma_fp8_inputs(a_fmt, b_fmt, seed=len(a_fmt + b_fmt))
    d = torch.full((16, 8), float("nan"))
    kern.emulate(F.words_of(a), F.words_of(bt), c, d, grid=(1,))
    want = mma_sync_fp8(a.float().numpy(), bt.float().numpy().T, c.numpy())
    np.testing.assert_array_equal(d.numpy().view(np.uint32), want.view(np.uint32))
    exact = a.double() @ bt.double().T + c.double()
    scale = a.double().abs() @ bt.double().abs().T + c.double().abs()
    # two chained f16 MMAs (16 terms each truncated 25 bits below the largest, the sum toward zero
    # to f32), then C added to nearest: under 11 f32 ulps of the scale
    assert bool(((d.double() - exact).abs() <= 11 * 2.0 ** -23 * scale + 1e-30).all())
    for arch in ("sm_89", "sm_90a"):
        ptx = kern.with_arch(arch).compile().ptx
        assert f"mma.sync.aligned.m16n8k32.row.col.f32.{a_fmt}.{b_fmt}.f32" in ptx


def test_mma_sync_fp8_atoms_check_shape_types_and_target():
    from tylopy.errors import LayoutError
    with pytest.raises(LayoutError, match="with e4m3 expects shape m16n8k32"):
        ty.MmaSyncAtom(ty.e4m3)
    with pytest.raises(LayoutError, match="b_dtype expects e4m3 or e5m2 with dtype e5m2, but got f16"):
        ty.MmaSyncAtom(ty.e5m2, "m16n8k32", b_dtype=ty.f16)
    with pytest.raises(KernelSourceError, match="sm_89 or newer"):
        F.mma_fp8_kernel(ty.e4m3, ty.e4m3, arch="sm_80").compile()


def test_an_fp8_scalar_parameter_is_refused_at_launch():
    @ty.kernel(threads=32, arch="sm_90a")
    def takes_code(x: ty.e4m3, out: ty.ptr(ty.f32)):
        out[ty.thread_idx()] = ty.cast(x, ty.f32)
    with pytest.raises(LaunchTypeError, match="scalar parameter 'x' of type e4m3 cannot be passed"):
        takes_code.emulate(1.5, torch.zeros(32), grid=(1,))
