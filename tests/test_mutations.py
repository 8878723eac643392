"""Mutation tests of code generation, on the CPU: plant one realistic lowering bug at a time and show
that the host check (``host_llvm_cases.check_all``: the generated LLVM IR run with MCJIT against the
emulator and numpy on random inputs with each type's edges) catches it, while the unmutated code
generation passes. ``pytest -s`` prints one line per mutation: "mutation X: caught by <check>".

Each mutation patches the lowering the way the bug would be written: a table entry, a lowering
function, or the emitted LLVM text. (A division that loses its guard against MIN / -1 is not among
them: the host traps on it, ending the process; ``test_host_llvm.py`` checks the guard in the text.)
"""
from __future__ import annotations

import llvmlite.ir as ir
import pytest

import host_llvm_cases as cases
from tylopy.codegen import host_llvm, llvm, lower_control


def _le_as_lt(monkeypatch):
    """``<=`` lowered as ``<`` (the predicate table's entry)."""
    monkeypatch.setitem(llvm._FCMP, "le", "<")


def _select_swapped(monkeypatch):
    """A select's two value operands swapped."""
    def lower_select(L, op):
        c, a, b = (L.v(x) for x in op.operands)
        L.set(op.result, L.b.select(c, b, a))
    monkeypatch.setitem(llvm.LOWER, "select", lower_select)


def _loop_bound_off_by_one(monkeypatch):
    """A run-time loop that also runs its bound (``<=`` / ``>=`` instead of ``<`` / ``>``)."""
    def condition(B, signed, iv, hi, step):
        if not signed:
            return B.icmp_unsigned("<=", iv, hi)
        zero = ir.Constant(step.type, 0)
        up = B.and_(B.icmp_signed(">", step, zero), B.icmp_signed("<=", iv, hi))
        down = B.and_(B.icmp_signed("<", step, zero), B.icmp_signed(">=", iv, hi))
        return B.or_(up, down)
    monkeypatch.setattr(lower_control, "_for_condition", condition)


def _convert_with(monkeypatch, change):
    original = llvm._convert_scalar

    def convert(L, x, src, dst):
        return change(L, x, src, dst) or original(L, x, src, dst)
    monkeypatch.setattr(llvm, "_convert_scalar", convert)


def _int_to_float_wrong_signedness(monkeypatch):
    """int -> float with the other signedness (``uitofp`` for a signed source, ``sitofp`` for unsigned)."""
    def change(L, x, src, dst):
        if src.is_int and dst.is_float:
            lt = llvm.llvm_type(dst)
            return L.b.uitofp(x, lt) if src.is_signed else L.b.sitofp(x, lt)
    _convert_with(monkeypatch, change)


def _float_to_unsigned_as_signed(monkeypatch):
    """float -> unsigned int lowered as a signed conversion (``fptosi``)."""
    def change(L, x, src, dst):
        if src.is_float and dst.is_int and not dst.is_signed:
            return L.b.fptosi(x, llvm.llvm_type(dst))
    _convert_with(monkeypatch, change)


def _float_to_int_rounds_to_nearest(monkeypatch):
    """float -> int rounded to the nearest integer (cvt.rni) instead of truncated (cvt.rzi)."""
    def change(L, x, src, dst):
        if src.is_float and dst.is_int:
            r = L.call(f"llvm.rint.{src.name}", x.type, [x])
            lt = llvm.llvm_type(dst)
            return L.b.fptosi(r, lt) if dst.is_signed else L.b.fptoui(r, lt)
    _convert_with(monkeypatch, change)


def _shift_not_clamped(monkeypatch):
    """Shifts lowered as LLVM's plain shl/ashr/lshr (PTX clamps an amount of the width or more; LLVM
    leaves it undefined and x86 takes it modulo the width)."""
    def shift(L, name, a, b, t):
        return L.b.shl(a, b) if name == "shl" else (L.b.ashr(a, b) if t.is_signed else L.b.lshr(a, b))
    monkeypatch.setattr(llvm, "_shift", shift)


def _text(old, new):
    """A mutation of the emitted LLVM text (every occurrence of ``old``)."""
    def plant(monkeypatch):
        original = host_llvm.HostKernel.__init__

        def init(self, kir, llvm_text=None):
            text = llvm_text if llvm_text is not None else str(llvm.lower_kernel(kir))
            original(self, kir, text.replace(old, new))
        monkeypatch.setattr(host_llvm.HostKernel, "__init__", init)
    return plant


MUTATIONS = {
    "le-as-lt": _le_as_lt,
    "float-ole-as-olt (IR text)": _text("fcmp ole", "fcmp olt"),
    "unsigned-uge-as-ugt (IR text)": _text("icmp uge", "icmp ugt"),
    "select-operands-swapped": _select_swapped,
    "loop-bound-off-by-one": _loop_bound_off_by_one,
    "int-to-float-wrong-signedness": _int_to_float_wrong_signedness,
    "float-to-unsigned-as-signed": _float_to_unsigned_as_signed,
    "float-to-int-rounds-to-nearest": _float_to_int_rounds_to_nearest,
    "shift-not-clamped": _shift_not_clamped,
}


def test_unmutated_codegen_passes():
    cases.check_all()


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutation_is_caught(name, monkeypatch):
    MUTATIONS[name](monkeypatch)
    with pytest.raises(cases.Caught) as info:
        cases.check_all()
    print(f"\nmutation {name}: caught by {info.value.check} ({info.value.detail})")
