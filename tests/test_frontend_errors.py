"""Every way tracing and verification reject a kernel: the message says what was wrong, and it
points at the kernel source file and line (the ``# <- marker`` line of kernels_for_tests.py)."""
import os
import re

import pytest

import tylopy as ty
from tylopy.ir import format_ir
from tylopy.errors import KernelSourceError

import kernels_for_tests as K

SOURCE = os.path.basename(K.__file__)


def assert_points_at(err: BaseException, marker: str):
    """The message names kernels_for_tests.py and the marked line, as 'File ..., line N' or 'file.py:N'."""
    line = K.line_of(marker)
    text = str(err)
    assert re.search(rf'{re.escape(SOURCE)}(", line |:){line}\b', text), \
        f"expected {SOURCE} line {line} in the message:\n{text}"
    if isinstance(err, KernelSourceError) and err.loc is not None:
        assert err.loc.lineno == line
        assert os.path.samefile(err.loc.filename, K.__file__)


CASES = [
    # (kernel, marker, exception, what the message must say)
    ("bad_type_mismatch", "type_mismatch", KernelSourceError, r"add expects operands of one type, but got f32 and i32"),
    ("bad_float_literal", "float_literal", KernelSourceError, r"float literal 1\.5 cannot be combined with a i32"),
    ("bad_bool_and", "bool_and", KernelSourceError, r"run-time value was used where Python needs a compile-time bool"),
    ("bad_bool_call", "bool_call", KernelSourceError, r"run-time value was used where Python needs a compile-time bool"),
    ("bad_runtime_shared_size", "runtime_shared_size", KernelSourceError,
     r"shared expects a compile-time element count, but got a run-time value"),
    ("bad_runtime_static_range", "runtime_static_range", KernelSourceError,
     r"static_range expects compile-time bounds, but got a run-time value"),
    ("bad_address_space", "address_space", KernelSourceError, r"ptr_cast from global to shared memory is not allowed"),
    ("bad_one_branch", "one_branch", KernelSourceError, r"'y' has no value here: it is assigned on only one path"),
    ("bad_loop_only", "loop_only", KernelSourceError, r"'last' has no value here"),
    ("bad_for_carry_type", "for_carry_type", KernelSourceError, r"'acc' is i32 before and f32 after"),
    ("bad_while_carry_type", "while_carry_type", KernelSourceError, r"'j' is i32 before and f32 after"),
    ("bad_returns_value", "returns_value", KernelSourceError, r"kernel 'bad_returns_value' returns .*return nothing"),
    ("bad_in_helper", "helper_mixes", KernelSourceError, r"mul expects operands of one type, but got f32 and i32"),
]


@pytest.mark.parametrize("name, marker, exc, message", CASES, ids=[c[0] for c in CASES])
def test_trace_error_names_problem_and_line(name, marker, exc, message):
    kernel = getattr(K, name)
    with pytest.raises(exc) as info:
        kernel.trace()
    assert re.search(message, str(info.value)), str(info.value)
    assert_points_at(info.value, marker)


@pytest.mark.parametrize("name", ["bad_type_mismatch", "bad_address_space", "bad_one_branch"])
def test_compile_raises_the_same_error_as_trace(name, no_disk_cache):
    with pytest.raises(KernelSourceError):
        getattr(K, name).compile()


def test_source_error_shows_the_line_and_a_hint():
    with pytest.raises(KernelSourceError) as info:
        K.bad_type_mismatch.trace()
    text = str(info.value)
    assert "v = x[0] + n" in text  # the excerpt of the offending line
    assert "hint: convert one side explicitly with ty.cast" in text
    assert info.value.loc.function == "bad_type_mismatch"


def test_error_in_helper_points_at_the_helper_line():
    with pytest.raises(KernelSourceError) as info:
        K.bad_in_helper.trace()
    assert info.value.loc.function == "helper_mixes_types"


def test_missing_annotation_is_rejected_at_decoration():
    with pytest.raises(KernelSourceError) as info:
        K.define_unannotated()
    assert "parameter 'n' needs a type annotation" in str(info.value)
    assert_points_at(info.value, "missing_annotation")


def test_bad_annotation_is_rejected():
    def k(x: int):
        pass
    with pytest.raises(KernelSourceError, match=r"parameter 'x' expects an annotation such as ty.ptr\(ty.f32\)"):
        ty.kernel(k)


def test_unknown_constexpr_name():
    with pytest.raises(ty.LaunchTypeError) as info:
        K.with_constexpr.trace(SCALES=3.0)
    text = str(info.value)
    assert "has no compile-time parameter 'SCALES'" in text
    assert "its constexprs are ['SCALE']" in text
    assert_points_at(info.value, "constexpr_def")
    assert isinstance(info.value, TypeError)  # callers may catch the built-in class


def test_known_constexpr_specializes():
    ir2 = K.with_constexpr.trace(SCALE=2.0)
    ir3 = K.with_constexpr.trace(SCALE=3.0)
    assert "value=2.0" in format_ir(ir2) and "value=3.0" in format_ir(ir3)


def test_tylopy_ops_outside_a_kernel():
    with pytest.raises(KernelSourceError, match="only be used inside a kernel being traced"):
        ty.thread_idx()


def test_launching_without_a_grid():
    with pytest.raises(TypeError, match=r"launched with a grid: with_constexpr\[grid\]"):
        K.with_constexpr(None)


def test_kernel_errors_are_tylopy_errors():
    with pytest.raises(ty.TylopyError):
        K.bad_bool_and.trace()
