"""Codegen without a GPU: deterministic PTX, the right target, ptxas's verdict, source-line
comments, and the key instructions of vector and shared-memory kernels."""
import re

import pytest

from tylopy.codegen.ptxas import find_ptxas
from tylopy_kernels.examples import vector_add as vector_add_module
from tylopy_kernels.examples.vector_add import vector_add

import kernels_for_tests as K
from conftest import fresh


def _line_starting(path: str, text: str) -> int:
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip().startswith(text):
                return n
    raise LookupError(text)


def test_ptxas_is_on_this_machine():
    assert find_ptxas() is not None, "ptxas (CUDA 13) is expected on every machine; set TYLOPY_PTXAS"


def test_same_ptx_twice(no_disk_cache):
    first = fresh(vector_add).compile()
    second = fresh(vector_add).compile()
    assert not first.from_cache and not second.from_cache
    assert first.ptx == second.ptx
    assert first.llvm_ir == second.llvm_ir


def test_same_ptx_for_a_kernel_with_control_flow(no_disk_cache):
    assert fresh(K.control_flow).compile().ptx == fresh(K.control_flow).compile().ptx


def test_default_target_is_sm_90a():
    ptx = vector_add.compile().ptx
    assert re.search(r"^\.target sm_90a$", ptx, re.M)


def test_sm_80_target():
    ck = vector_add.with_arch("sm_80").compile()
    assert re.search(r"^\.target sm_80$", ck.ptx, re.M)
    assert ck.report.arch == "sm_80" and ck.cubin
    assert vector_add.arch == "sm_90a"  # with_arch returns a new kernel


def test_with_arch_rejects_unknown_targets():
    with pytest.raises(ValueError, match=r"arch expects one of .*sm_90a.*, but got 'sm_99x'"):
        vector_add.with_arch("sm_99x")


def test_ptxas_assembles_vector_add_without_spills():
    ck = vector_add.compile()
    rep = ck.report
    assert rep.available, rep.note
    assert rep.registers is not None and 0 < rep.registers <= 32
    assert rep.spill_stores == rep.spill_loads == rep.stack_frame == 0
    assert not rep.has_local_memory
    assert ck.cubin and ck.cubin[:4] == b"\x7fELF"
    assert "registers" in str(rep) and "0 bytes spill stores" in str(rep)


def test_ptx_carries_source_line_comments():
    ptx = vector_add.compile().ptx
    path = vector_add_module.__file__
    index_line = _line_starting(path, "i = ty.block_idx() * BLOCK + ty.thread_idx()")
    add_line = _line_starting(path, "out[i] = x[i] + y[i]")
    assert f"// vector_add.py:{index_line}  i = ty.block_idx() * BLOCK + ty.thread_idx()" in ptx
    assert f"// vector_add.py:{add_line}  out[i] = x[i] + y[i]" in ptx


def test_vector_add_key_instructions():
    ptx = vector_add.compile().ptx
    assert re.search(r"ld\.global(\.nc)?\.(f32|b32)", ptx)
    assert re.search(r"add(\.rn)?\.f32", ptx)
    assert re.search(r"st\.global\.(f32|b32)", ptx)
    assert ".maxntid 256" in ptx


def test_control_flow_compiles():
    ck = K.control_flow.compile()
    assert ck.report.spills == 0
    assert "bra" in ck.ptx  # the run-time loops and the if are branches, not unrolled away
    ir = ck.ir_text
    for op in ("for(", "if(", "while("):
        assert op in ir, ir


def test_vector_load_and_store():
    ptx = K.copy_vec4.compile().ptx
    assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", ptx), ptx
    assert re.search(r"st\.global\.v4\.(f32|b32)", ptx), ptx


def test_dynamic_shared_memory_over_48k():
    ck = K.reverse_through_smem.compile()
    assert ck.dynamic_shared_bytes == K.SMEM_BYTES == 65536
    assert re.search(r"\.extern \.shared \.align \d+ \.b8 \w+\[\];", ck.ptx)
    assert re.search(r"st\.shared\.(f32|b32)", ck.ptx) and re.search(r"ld\.shared\.(f32|b32)", ck.ptx)
    assert "bar.sync" in ck.ptx or "barrier.sync" in ck.ptx
    assert ck.report.spills == 0 and ck.report.shared_bytes == 0  # all of it is dynamic


def test_dynamic_shared_size_follows_the_constexpr():
    assert K.reverse_through_smem.compile(NBYTES=32 * 1024).dynamic_shared_bytes == 32 * 1024


def test_sm_80_kernels_assemble_too():
    for kernel in (K.control_flow, K.copy_vec4, K.reverse_through_smem):
        ck = kernel.with_arch("sm_80").compile()
        assert re.search(r"^\.target sm_80$", ck.ptx, re.M)
        assert ck.report.available and ck.report.spills == 0
