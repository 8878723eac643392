"""``ty.printf`` and ``ty.device_assert``: off without the debug option, C formats, emulation, PTX.

With the option off the kernel's IR and PTX hold nothing of them; with ``TYLOPY_DEBUG=1`` the
PTX calls CUDA's ``vprintf`` (format string, then a buffer of the values laid out as a C
struct, f32 promoted to double) and ``__assertfail`` (message, file, line, function, char
size), and ptxas assembles it for sm_90a and sm_80. Kernels are defined inside the tests: the
emulator caches a program per kernel object, and the option is read when a kernel is traced.
"""
import re

import numpy as np
import pytest

import tylopy as ty
from tylopy.emulate.ops_debug import DeviceAssertError
from tylopy.semantics.printf import format_c
from emulate_dsl import line_of

HERE = __file__


def make_printer():
    @ty.kernel(threads=64)
    def printer(x: ty.ptr(ty.f32), k: ty.ptr(ty.i64), h: ty.ptr(ty.f16), b: ty.ptr(ty.u8)):
        t = ty.thread_idx()
        if t % 16 == 3:
            ty.printf("t=%d x=%.3f k=%lld h=%g b=%u ok=%d hex=%08x %%\n", t, x[t], k[t], h[t], b[t], x[t] > 0.0, t * 7)
    return printer


def make_asserter():
    @ty.kernel(threads=64)
    def asserter(x: ty.ptr(ty.f32)):
        t = ty.thread_idx()
        ty.device_assert(x[t] < 10.0, "x must stay below 10")  # <- the_assert
        x[t] = x[t] + 1.0
    return asserter


def args(n=64):
    rng = np.random.default_rng(5)
    return (rng.standard_normal(n).astype(np.float32), rng.integers(-2**40, 2**40, n).astype(np.int64),
            rng.standard_normal(n).astype(np.float16), rng.integers(0, 256, n).astype(np.uint8))


def test_without_the_debug_option_nothing_is_compiled(monkeypatch):
    monkeypatch.delenv("TYLOPY_DEBUG", raising=False)
    printer, asserter = make_printer(), make_asserter()
    for k in (printer, asserter):
        kir = k.trace()
        assert not any(op.opcode in ("printf", "device_assert") for op in kir.walk())
        ptx = k.compile().ptx
        assert "vprintf" not in ptx and "__assertfail" not in ptx
    x = np.full(64, 50.0, np.float32)  # the assert would fail: it is not there
    asserter.emulate(x, grid=1)
    assert (x == 51.0).all()


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_debug_build_calls_vprintf_and_assertfail(monkeypatch, arch):
    monkeypatch.setenv("TYLOPY_DEBUG", "1")
    ptx = make_printer().with_arch(arch).compile().ptx  # ptxas assembles it
    assert re.search(r"call\.uni \(retval0\),\s*vprintf", ptx)
    fmt = re.search(r"\.global \.align 1 \.b8 (tylopy_str\d+)\[(\d+)\]", ptx)
    assert fmt and int(fmt.group(2)) == len("t=%d x=%.3f k=%lld h=%g b=%u ok=%d hex=%08x %%\n") + 1
    assert "cvt.f64.f32" in ptx  # f32 promoted to double
    ptx = make_asserter().with_arch(arch).compile().ptx
    assert re.search(r"call\.uni\s*__assertfail", ptx)
    assert f".b32 {line_of(HERE, 'the_assert')}" in ptx or str(line_of(HERE, "the_assert")) in ptx


def test_emulated_printf_prints_what_c_prints(monkeypatch, capsys):
    monkeypatch.setenv("TYLOPY_DEBUG", "1")
    x, k, h, b = args()
    report = make_printer().emulate(x, k, h, b, grid=1)
    lanes = [t for t in range(64) if t % 16 == 3]
    want = [f"t={t} x={x[t]:.3f} k={int(k[t])} h={float(h[t]):g} b={int(b[t])} ok={int(x[t] > 0)} "
            f"hex={t * 7:08x} %\n" for t in lanes]
    assert sorted(report.prints) == sorted(want)  # lanes in order within a warp; warps in scheduling order
    assert capsys.readouterr().out.count("\n") == len(want)


def test_emulated_assert_names_the_line_and_the_threads(monkeypatch):
    monkeypatch.setenv("TYLOPY_DEBUG", "1")
    x = np.zeros(64, np.float32)
    x[[5, 6, 40]] = 11.0
    with pytest.raises(DeviceAssertError) as e:
        make_asserter().emulate(x, grid=(2,), ctas=[(1, 0, 0)])
    msg = str(e.value)
    assert f"device_assert failed at {HERE}:{line_of(HERE, 'the_assert')}" in msg
    assert "x must stay below 10" in msg and "block (1, 0, 0)" in msg and "thread(s) 5-6" in msg
    x[:] = 1.0
    make_asserter().emulate(x, grid=1)  # a passing assert changes nothing
    assert (x == 2.0).all()


def test_format_errors_are_reported_at_the_line(monkeypatch):
    monkeypatch.delenv("TYLOPY_DEBUG", raising=False)  # checked even when the print compiles to nothing

    @ty.kernel(threads=32)
    def bad(x: ty.ptr(ty.f32), k: ty.ptr(ty.i64), WHICH: ty.constexpr):
        if WHICH == 0:
            ty.printf("%d\n", x[0])
        elif WHICH == 1:
            ty.printf("%d %d\n", 1)
        elif WHICH == 2:
            ty.printf("%d\n", k[0])
        elif WHICH == 3:
            ty.printf("%s\n", 1)
        elif WHICH == 4:
            ty.device_assert(x[0], "not a condition")
        else:
            ty.printf("%f\n", x)
    texts = ["printf value 0 is f32, but its conversion '%d' expects an integer",
             "printf format '%d %d\\n' has 2 conversion(s), but got 1 value(s)",
             "printf value 0 is i64, but '%d' reads 32 bits: write '%ld' or '%lld'",
             "printf conversion '%s' is not supported",
             "device_assert expects an i1 condition (a comparison), but got a f32 value",
             "printf value 0 expects a scalar, but got a ptr<f32, global> value"]
    for which, text in enumerate(texts):
        with pytest.raises(ty.KernelSourceError) as e:
            bad.trace(WHICH=which)
        assert text in str(e.value) and "test_primitives_debug.py" in str(e.value)


def test_c_format_oracle():
    from tylopy.ir.types import f32, f64, i32, i64, u32
    assert format_c("%5d|%-4u|%x|%X|%o|%c", [-42, 7, -1, 255, 8, 65], [i32, u32, i32, i32, i32, i32]) == \
        "  -42|7   |ffffffff|FF|10|A"
    assert format_c("%e %g %.2f %a", [1234.5, 1e-5, np.float32(2.004), 3.0], [f64, f64, f32, f64]) == \
        "1.234500e+03 1e-05 2.00 0x1.8p+1"
    assert format_c("%lld %llx %f %f", [-2**40, -1, float("inf"), float("nan")], [i64, i64, f64, f64]) == \
        "-1099511627776 ffffffffffffffff inf nan"
