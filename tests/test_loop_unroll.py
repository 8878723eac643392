"""``ty.range(..., unroll=N)``: a run-time loop whose body the compiler repeats N times (LLVM's
``llvm.loop.unroll.count`` on the back edge), the same results in the emulator, and clear errors."""
import numpy as np
import pytest

import tylopy as ty


@ty.kernel(threads=32)
def strided_sum(x: ty.ptr(ty.f32), y: ty.ptr(ty.f32), n: ty.i32, U: ty.constexpr):
    acc = ty.cast(0.0, ty.f32)
    for i in ty.range(ty.thread_idx(), n, 32, unroll=U):
        acc = acc + x[i] * 3.0
    y[ty.thread_idx()] = acc


@ty.kernel(threads=32)
def counted_sum(x: ty.ptr(ty.f32), y: ty.ptr(ty.f32), n: ty.i32, U: ty.constexpr):
    acc = ty.cast(0.0, ty.f32)
    for i in ty.range(n, unroll=U):
        acc = ty.fma(acc, 0.5, x[i * 32 + ty.thread_idx()])
    y[ty.thread_idx()] = acc


@ty.kernel(threads=32)
def sum_until_negative(x: ty.ptr(ty.f32), y: ty.ptr(ty.f32), n: ty.i32, U: ty.constexpr):
    acc = ty.cast(0.0, ty.f32)
    for i in ty.range(n, unroll=U):
        v = x[i * 32 + ty.thread_idx()]
        if v < 0.0:
            break
        acc = acc + v
    y[ty.thread_idx()] = acc


@ty.kernel(threads=32)
def fixed_trip(x: ty.ptr(ty.f32), y: ty.ptr(ty.f32), U: ty.constexpr):
    acc = ty.cast(0.0, ty.f32)
    for i in ty.range(0, 12, unroll=U):     # compile-time bounds: still a run-time loop, unrolled U times
        acc = acc + x[i * 32 + ty.thread_idx()]
    y[ty.thread_idx()] = acc


def _code(ptx: str) -> str:
    return "\n".join(l for l in ptx.splitlines() if not l.strip().startswith(("//", ".loc")))


@pytest.mark.parametrize("unroll", [2, 4, 8])
def test_the_ptx_repeats_the_loop_body(unroll):
    rolled = _code(strided_sum.compile(U=1).ptx)  # compile runs ptxas
    unrolled = _code(strided_sum.compile(U=unroll).ptx)
    assert rolled.count("ld.global") == 1 and rolled.count("mul.rn.f32") == 1
    assert unrolled.count("ld.global") >= unroll and unrolled.count("mul.rn.f32") >= unroll
    ir = strided_sum.compile(U=unroll).llvm_ir
    assert f'!{{ !"llvm.loop.unroll.count", i32 {unroll} }}' in ir and "!llvm.loop" in ir
    counted = _code(counted_sum.compile(U=unroll).ptx)
    assert counted.count("ld.global") >= unroll  # (plus a remainder loop's copies)
    assert _code(fixed_trip.compile(U=unroll).ptx).count("ld.global") >= unroll


def test_unroll_one_keeps_the_loop_rolled():
    ir = counted_sum.compile(U=1).llvm_ir
    assert '!"llvm.loop.unroll.disable"' in ir
    assert _code(counted_sum.compile(U=1).ptx).count("ld.global") == 1
    assert "unroll=" not in counted_sum.compile(U=None).ir_text  # no hint: LLVM decides


def test_a_loop_with_a_break_is_unrolled_too():
    ir = sum_until_negative.compile(U=4).llvm_ir
    assert '!"llvm.loop.unroll.count", i32 4' in ir
    assert _code(sum_until_negative.compile(U=4).ptx).count("ld.global") >= 4


@pytest.mark.parametrize("n", [0, 1, 5, 13])
def test_unrolled_loops_compute_what_rolled_ones_do(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(32 * 16).astype(np.float32)
    for kernel, args in ((strided_sum, (32 * n + 7,)), (counted_sum, (n,)), (sum_until_negative, (n,))):
        outs = []
        for u in (None, 1, 3, 4):
            y = np.full(32, np.nan, dtype=np.float32)
            kernel.emulate(x, y, *args, grid=(1,), U=u)
            outs.append(y)
        for y in outs[1:]:
            assert np.array_equal(y, outs[0]), kernel.name
    y = np.full(32, np.nan, dtype=np.float32)
    fixed_trip.emulate(x, y, grid=(1,), U=5)
    assert np.allclose(y, x[:12 * 32].reshape(12, 32).astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad,text", [(0, "but got 0"), (-2, "but got -2"), (2.5, "but got 2.5"),
                                      (5000, "but got 5000"), ("4", "but got '4'")])
def test_a_bad_unroll_count_is_an_error_at_the_line(bad, text):
    with pytest.raises(ty.KernelSourceError) as e:
        counted_sum.compile(U=bad)
    msg = str(e.value)
    assert "range unroll expects True, False or a compile-time int count in 1..1024" in msg and text in msg
    assert "for i in ty.range(n, unroll=U)" in msg


@pytest.mark.gpu
def test_gpu_unrolled_loops_match_the_emulator():
    import torch
    rng = np.random.default_rng(3)
    x = rng.standard_normal(32 * 16).astype(np.float32)
    for kernel, args in ((strided_sum, (32 * 13 + 7,)), (counted_sum, (13,)), (sum_until_negative, (13,))):
        for u in (1, 4):
            want = np.zeros(32, np.float32)
            kernel.emulate(x, want, *args, grid=(1,), U=u)
            got = torch.full((64,), float("nan"), device="cuda")
            kernel[(1,)](torch.from_numpy(x).cuda(), got, *args, U=u)
            torch.cuda.synchronize()
            assert np.array_equal(got[:32].cpu().numpy(), want) and got[32:].isnan().all(), (kernel.name, u)
