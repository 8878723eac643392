"""Errors from every stage point at the user's file, line and expression: tracing (a caret
under the expression, also in indented kernels), the tile library (fragment and atom misuse),
IR verification, code generation (an op without a lowering), ptxas (a PTX line mapped back to
the kernel line; shared-memory overflow with the dynamic-shared-memory hint), and a kernel
whose source Python did not keep."""
import os
import subprocess
import sys
import textwrap

import pytest

import tylopy as ty
from tylopy.codegen import llvm as codegen_llvm
from tylopy.codegen.ptxas import assemble, find_ptxas
from tylopy.errors import (CompileError, KernelSourceError, LayoutError, OwnershipError, ResourceLimitError,
                           SourceLoc)

import kernels_for_tests as K

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="needs ptxas")


def located(kernel, marker, exc=KernelSourceError, compile=False):
    with pytest.raises(exc) as info:
        kernel.compile() if compile else kernel.trace()
    err = info.value
    assert err.loc is not None and os.path.samefile(err.loc.filename, K.__file__), str(err)
    assert err.loc.lineno == K.line_of(marker), str(err)
    return err


def caret(err) -> str:
    return str(err).split("\n")[2].strip()


def test_caret_spans_the_expression():
    err = located(K.bad_type_mismatch, "type_mismatch")
    line = err.loc.source_line()
    assert line[err.loc.col:err.loc.end_col] == "x[0] + n"
    assert caret(err) == "^" * len("x[0] + n")


def test_caret_in_an_indented_kernel_uses_the_file_columns():
    err = located(K.Nested.bad_indented, "indented")
    assert err.loc.source_line()[err.loc.col:err.loc.end_col] == "x[1] +   n"


def test_error_inside_a_runtime_branch_names_the_kernel_function():
    err = located(K.bad_in_helper, "helper_mixes")
    assert err.loc.function == "helper_mixes_types"


def test_fragment_register_count_error_is_located_and_still_a_layout_error():
    err = located(K.bad_fragment_registers, "fragment_registers", LayoutError)
    assert isinstance(err, ValueError) and "holds 4 values per thread" in str(err)
    assert "ty.Fragment((x[0], x[1]), ty.MMA_SYNC_C)" in str(err)


def test_fragment_ownership_error_is_located():
    err = located(K.bad_fragment_ownership, "fragment_ownership", OwnershipError)
    assert "different ownership" in str(err)
    assert err.loc.source_line()[err.loc.col:err.loc.end_col] == "a + b"


def test_atom_dtype_error_is_located():
    err = located(K.bad_atom_dtype, "atom_dtype", LayoutError)
    assert "MmaSyncAtom dtype expects" in str(err)


def test_value_leaking_through_a_plain_object_is_a_verification_error_at_the_line():
    err = located(K.bad_leak_through_attribute, "leak")
    assert "not defined in an enclosing scope" in str(err) and "assign the value to a name" in err.hint


def test_integer_true_division_is_rejected():
    err = located(K.bad_int_true_division, "int_truediv")
    assert "write // for integer division" in err.hint


def test_python_abs_on_a_runtime_value():
    @ty.kernel(threads=32)
    def uses_abs(x: ty.ptr(ty.f32)):
        x[0] = abs(x[1])
    assert "abs(" in ty.ir.format_ir(uses_abs.trace())


def test_static_shared_memory_over_the_limit_is_an_error_at_the_line():
    err = located(K.bad_static_shared, "static_shared", ResourceLimitError)
    assert "ty.dynamic_shared" in err.hint and "65536" in str(err)


@needs_ptxas
def test_ptxas_static_shared_overflow_becomes_a_resource_error_with_the_hint():
    ptx = textwrap.dedent("""\
        .version 8.0
        .target sm_80
        .address_size 64
        .visible .entry big(.param .u64 p)
        {
            .shared .align 16 .b8 buf[65536];
            .reg .b64 %rd<3>;
            .reg .f32 %f<2>;
            mov.u64 %rd1, buf;
            ld.shared.f32 %f1, [%rd1];
            ld.param.u64 %rd2, [p];
            st.global.f32 [%rd2], %f1;
            ret;
        }
        """)
    with pytest.raises(ResourceLimitError) as info:
        assemble(ptx, "sm_80", kernel="big")
    assert "65536 bytes of static shared memory" in str(info.value) and "ty.dynamic_shared" in str(info.value)


@needs_ptxas
def test_ptxas_error_names_the_kernel_line(no_disk_cache):
    with pytest.raises(CompileError) as info:
        K.bad_ptx.compile()
    assert f"comes from kernels_for_tests.py:{K.line_of('bad_ptx')}" in str(info.value)


def test_an_op_without_a_lowering_is_reported_at_its_line(monkeypatch, no_disk_cache):
    def broken(L, op):
        raise NotImplementedError("no lowering for this case")
    monkeypatch.setitem(codegen_llvm.LOWER, "add", broken)
    with pytest.raises(KernelSourceError) as info:
        ty.Kernel(K.copy_vec4.fn, 128, "sm_80", _register=False).compile()
    err = info.value
    assert "add with operands (i32, i32) cannot be lowered: NotImplementedError" in str(err)
    assert err.loc is not None and os.path.samefile(err.loc.filename, K.__file__)
    assert "i = (ty.block_idx() * 128 + ty.thread_idx()) * 4" in err.loc.source_line()


def test_kernel_without_source_gives_a_clear_error():
    script = textwrap.dedent("""\
        import tylopy as ty
        try:
            @ty.kernel(threads=32)
            def k(x: ty.ptr(ty.f32)):
                x[0] = 1.0
        except ty.KernelSourceError as e:
            print("ERROR", e)
        """)
    proc = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ERROR tylopy cannot read the source of 'k'" in proc.stdout
    assert "define kernels and @ty.func helpers in a .py file" in proc.stdout


def test_caret_width_is_clamped_to_the_line(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("a = 1\n")
    assert SourceLoc(str(f), 1, 4, "", 99).excerpt().endswith("    ^")


def test_source_that_no_longer_matches_the_loaded_code(tmp_path):
    import importlib.util
    path = tmp_path / "edited_after_import.py"
    path.write_text("import tylopy as ty\n\n\n@ty.kernel(threads=32)\ndef k(x: ty.ptr(ty.f32)):\n    x[0] = 1.0\n")
    spec = importlib.util.spec_from_file_location("edited_after_import", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path.write_text("import tylopy as ty\n\n\n@ty.kernel(threads=32)\ndef renamed(x: ty.ptr(ty.f32), n: ty.i32):\n"
                    "    x[0] = 2.0\n")
    with pytest.raises(KernelSourceError, match="does not match the code Python loaded"):
        module.k.trace()
