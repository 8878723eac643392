"""Hostile inputs against the frontend: process aborts (symbol names, inline PTX), silent wrong
code (undefined shifts and divisions, overflowing constants, a float that became an int),
hangs (runaway unrolling) and tracebacks (recursion, keyword-only and reserved parameters,
range over a float, decorators). Each is a tylopy exception at the user's line, raised fast."""
import os
import time

import pytest

import tylopy as ty
from tylopy.errors import KernelSourceError, TylopyError

import kernels_hostile as H


def rejected(kernel_or_fn, marker, message, compile=False):
    with pytest.raises(KernelSourceError) as info:
        if callable(kernel_or_fn) and not isinstance(kernel_or_fn, ty.Kernel):
            kernel_or_fn()
        elif compile:
            kernel_or_fn.compile()
        else:
            kernel_or_fn.trace()
    err = info.value
    assert message in str(err), str(err)
    assert err.loc is not None and os.path.samefile(err.loc.filename, H.__file__), str(err)
    assert err.loc.lineno == H.line_of(marker), str(err)
    return err


# -- process aborts -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["my-kernel", "k 2", "kérnel", "2k", ""])
def test_kernel_names_llvm_would_abort_on_are_rejected_at_the_decorator(name):
    def k(x: ty.ptr(ty.f32)):
        x[0] = 1.0
    with pytest.raises(KernelSourceError, match="kernel name expects letters, digits and underscores"):
        ty.kernel(k, name=name)


@pytest.mark.parametrize("kernel, marker, message", [
    (H.asm_operand_out_of_range, "asm_range", "template uses $5, but there are only 3 operands"),
    (H.asm_unknown_constraint, "asm_letter", "has the constraint 'q'"),
    (H.asm_wrong_type, "asm_type", "constraint 'r' does not take a f32 value"),
    (H.asm_count_mismatch, "asm_count", "2 input(s) but 1 input constraint(s)"),
], ids=["operand-out-of-range", "unknown-letter", "wrong-type", "count"])
def test_inline_ptx_is_checked_before_llvm(kernel, marker, message, no_disk_cache):
    rejected(kernel, marker, message, compile=True)


def test_valid_inline_ptx_compiles(no_disk_cache):
    assert "add.f32" in H.asm_fine.compile().ptx


# -- silent wrong code ----------------------------------------------------------------------------

@pytest.mark.parametrize("kernel, marker, message", [
    (H.shift_left_40, "shl40", "shift by 40 is out of range for i32 (0..31)"),
    (H.shift_right_negative, "shr_neg", "shift by -1 is out of range for i32"),
    (H.divide_by_zero, "div0", "integer division by the constant 0"),
    (H.remainder_by_zero, "rem0", "integer remainder by the constant 0"),
    (H.f16_overflow, "f16_overflow", "constant 10000000000.0 does not fit f16"),
    (H.f32_overflow, "f32_overflow", "constant 1e+300 does not fit f32"),
    (H.i32_overflow, "i32_overflow", "constant 1099511627776 does not fit i32"),
    (H.float_then_int_value, "float_int_values", "'m' has type ['i32'] on one path of a run-time if and ['f32']"),
], ids=lambda x: getattr(x, "name", None) if isinstance(x, ty.Kernel) else None)
def test_undefined_or_overflowing_constants_are_errors(kernel, marker, message):
    rejected(kernel, marker, message)


# -- hangs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel, marker, message", [
    (H.huge_unroll, "huge_unroll", "this loop unrolls 1000000 iterations at trace time (limit 8192)"),
    (H.nested_unroll, "nested_unroll", "nested compile-time loops would unroll 16000000 iterations"),
    (H.endless_compile_time_while, "endless_while", "this while loop ran 8192 iterations at trace time"),
])
def test_runaway_unrolling_fails_fast_naming_the_loop(kernel, marker, message):
    t0 = time.perf_counter()
    err = rejected(kernel, marker, message)
    assert "run-time" in err.hint
    assert time.perf_counter() - t0 < 5.0


def test_nested_unroll_names_the_outer_loop():
    with pytest.raises(KernelSourceError) as info:
        H.nested_unroll.trace()
    assert f"kernels_hostile.py:{H.line_of('nested_unroll') - 1}" in str(info.value)


def test_a_runtime_loop_of_a_million_iterations_traces_at_once(no_disk_cache):
    t0 = time.perf_counter()
    ck = H.runtime_loop_of_a_million.with_arch("sm_80").compile()
    assert time.perf_counter() - t0 < 20 and ck.report.spill_stores == 0


# -- tracebacks -----------------------------------------------------------------------------------

def test_recursive_func_is_an_error():
    err = rejected(H.recursive_func, "recursion", "calls itself more than 64 levels deep")
    assert "compile-time" in err.hint


def test_range_over_a_float_is_an_error():
    rejected(H.range_of_a_float_load, "range_float", "range stop expects an integer, but got a f32 value")


def test_range_over_an_integer_load_is_a_runtime_loop():
    assert " for(" in ty.ir.format_ir(H.range_of_an_int_load.trace())


def test_decorator_between_kernel_and_def_is_rejected_at_the_def():
    rejected(H.define_wrapped_kernel, "wrapped_def", "is a wrapper made by another decorator")


def test_decorator_above_kernel_keeps_the_lines():
    assert H.register.seen == [H.stacked]
    rejected(H.stacked, "stacked_line", "add expects operands of one type")


def test_keyword_only_parameter_is_rejected_at_its_line():
    rejected(H.define_keyword_only, "kwonly", "parameter 'n' expects a plain positional parameter")


def test_reserved_parameter_name_is_rejected():
    rejected(H.define_reserved_parameter, "reserved_param", "parameter names starting with '__ty' are reserved")


def test_reserved_local_name_is_rejected():
    rejected(H.reserved_local, "reserved_local", "the name '__ty' is reserved for tylopy's rewritten code")


def test_every_rejection_is_a_tylopy_error():
    for k in (H.shift_left_40, H.huge_unroll, H.recursive_func, H.asm_unknown_constraint):
        with pytest.raises(TylopyError):
            k.compile()
