"""The host run of generated LLVM IR (``tylopy.codegen.host_llvm``): each scalar case agrees with the
emulator and numpy, what it cannot run is refused by name, and the bug it found stays fixed (a
run-time loop with a negative compile-time step was lowered as counting up)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import host_llvm_cases as cases
import tylopy as ty
from tylopy.codegen.host_llvm import HostKernel, HostLoweringError
from tylopy.codegen.llvm import lower_kernel


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.name)
def test_case_agrees_with_emulator_and_numpy(case):
    for seed in (10, 11):
        cases.check_case(case, seed)


@ty.kernel(threads=32)
def count_down(x: ty.ptr(ty.i32), out: ty.ptr(ty.i32), hi: ty.i32, lo: ty.i32):
    s = 0
    for t in ty.range(hi, lo, -2):
        s = s * 3 + x[t]
    out[ty.thread_idx()] = s


@ty.kernel(threads=32)
def uses_shared(x: ty.ptr(ty.f32)):
    buf = ty.shared(ty.f32, 32)
    buf[ty.thread_idx()] = x[0]
    x[0] = buf[0]


def test_negative_constant_step_counts_down():
    """``ty.range(hi, lo, -2)`` with run-time bounds runs while t > lo: the lowering compares with
    ``sgt`` (the step constant's bits read as signed, not as 0xFFFFFFFE)."""
    text = str(lower_kernel(count_down.trace()))
    assert "icmp sgt" in text and "icmp slt" not in text, text
    x = np.random.default_rng(0).integers(-9, 9, 40).astype(np.int32)
    for hi, lo in ((30, 3), (7, 6), (5, 5), (2, 9)):
        want = 0
        for t in range(hi, lo, -2):
            want = want * 3 + int(x[t])
        host, emu = np.full(32, -7, np.int32), np.full(32, -7, np.int32)
        HostKernel(count_down.trace()).run([x, host, hi, lo], grid=1)
        count_down.emulate(x, emu, hi, lo, grid=(1,))
        assert (host == np.int32(want)).all() and (emu == host).all(), (hi, lo, want, host[0], emu[0])


def test_refuses_shared_memory_by_name():
    with pytest.raises(HostLoweringError, match="uses_shared: .*scalar kernels only.*shared memory"):
        HostKernel(uses_shared.trace())


def _host_and_emulator(kernel, out_len, *scalars):
    host, emu = np.full(out_len, -7, np.int32), np.full(out_len, -7, np.int32)
    HostKernel(kernel.trace()).run([host, *scalars], grid=1)
    kernel.emulate(emu, *scalars, grid=1)
    return host, emu


def test_control_flow_kernels_with_negative_steps_agree():
    """The frontend's loop kernels (tests/kernels_control_flow.py) through code generation: a
    constant negative step with a run-time start, and run-time steps of either sign."""
    import kernels_control_flow as CF
    host, emu = _host_and_emulator(CF.reverse_walk, 32, 5)
    assert (host == emu).all() and (host != 0).all(), (host, emu)
    for lo, hi, step in ((0, 9, 2), (20, 3, -3), (5, 5, 1), (0, 7, -1), (3, 40, 7)):
        host, emu = _host_and_emulator(CF.runtime_step, 32, lo, hi, step)
        assert (host == emu).all(), (lo, hi, step, host, emu)
    host, emu = _host_and_emulator(CF.zero_runtime_step, 32, 0)
    assert (host == 0).all() and (emu == 0).all()


def test_a_constant_minus_one_divisor_is_guarded():
    """``a // -1`` and ``a % -1`` on i32: the constant's bits (0xFFFFFFFF) are read signed, so the
    lowering takes the guarded path (MIN // -1 wraps to MIN as PTX gives it) instead of a plain
    ``sdiv`` by -1, which LLVM leaves undefined for MIN (on the host it traps)."""
    text = str(lower_kernel(cases.int_division.trace()))
    assert re.search(r"(sdiv|srem) i32 %\S+, 4294967289", text), "a // -7 takes the plain division"
    assert not re.search(r"(sdiv|srem) i32 %\S+, 4294967295", text), text
    cases.check_case(cases.CASES[[c.name for c in cases.CASES].index("int_division")], 3)
