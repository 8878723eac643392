"""A user's binding of ``range``, ``min`` or ``max`` wins over tylopy's versions, wherever Python
would find it first (parameter, local, closure variable, module global, bound before or after the
kernel), and debug mode is an option of the compile, never guessed from a kernel's text.

The kernels run in the emulator on memory filled with a sentinel (-5), so a slot the user's
``range`` skips keeps it: ``[-5, -5, -5, 1]``, where tylopy's range would give ``[1, 1, 1, 1]``.
"""
import sys

import pytest
import torch

import tylopy as ty
from tylopy import hopper
from tylopy.runtime.launch import Launcher

from module_files import import_file

MODULE = "shadowing_mod"
EXPECTED = [-5, -5, -5, 1]


@pytest.fixture(autouse=True)
def forget_module():
    yield
    sys.modules.pop(MODULE, None)


def run(kernel, **constexprs) -> list:
    out = torch.full((4,), -5, dtype=torch.int32)
    kernel.emulate(out, grid=1, **constexprs)
    return out.tolist()


LOOP = """
@ty.kernel(threads=32)
def k(out: ty.ptr(ty.i32)):
    for i in range(4):
        out[i] = 1
"""
LAST_ONLY = "def range(n):\n    return [n - 1]\n"


@pytest.mark.parametrize("where", ["global-before", "global-after"])
def test_module_global_range_wins(where, tmp_path):
    text = "import tylopy as ty\n" + (LAST_ONLY + LOOP if where == "global-before" else LOOP + "\n\n" + LAST_ONLY)
    m = import_file(tmp_path, text, MODULE)
    assert run(m.k) == EXPECTED
    ck = m.k.compile()
    assert ck.ptx.count("st.global") == 1  # one store, to out[3]


def test_global_range_bound_after_the_first_trace_is_seen(tmp_path):
    m = import_file(tmp_path, "import tylopy as ty\n" + LOOP, MODULE)
    assert run(m.k) == [1, 1, 1, 1]
    m.range = lambda n: [n - 1]  # a global the trace read (as absent) is keyed like any other
    assert run(m.k) == EXPECTED
    assert m.k.compile().ptx.count("st.global") == 1
    del m.range
    assert run(m.k) == [1, 1, 1, 1]


def test_parameter_named_range_wins():
    @ty.kernel(threads=32)
    def k(out: ty.ptr(ty.i32), range: ty.constexpr):  # noqa: A002 - the point of the test
        for i in range(4):
            out[i] = 1
    assert run(k, range=lambda n: [n - 1]) == EXPECTED


def test_local_named_range_wins():
    @ty.kernel(threads=32)
    def k(out: ty.ptr(ty.i32)):
        range = lambda n: [n - 1]  # noqa: A001, E731
        for i in range(4):
            out[i] = 1
    assert run(k) == EXPECTED


def test_closure_variable_named_range_wins():
    range = lambda n: [n - 1]  # noqa: A001, E731

    @ty.kernel(threads=32)
    def k(out: ty.ptr(ty.i32)):
        for i in range(4):
            out[i] = 1
    assert run(k) == EXPECTED


def test_local_min_and_max_win():
    @ty.kernel(threads=32)
    def k(out: ty.ptr(ty.i32)):
        def max(a, b):  # noqa: A001
            return a

        def min(a, b):  # noqa: A001
            return b
        out[3] = max(1, 2) + 10 * min(3, 0)
    assert run(k) == [-5, -5, -5, 1]


def test_tylopy_range_and_max_without_a_user_binding():
    @ty.kernel(threads=32)
    def k(out: ty.ptr(ty.i32), n: ty.i32):
        for i in range(n):  # a run-time bound: tylopy's range
            out[i] = max(i, n - 3)  # a run-time value: tylopy's max
    out = torch.full((4,), -5, dtype=torch.int32)
    k.emulate(out, 3, grid=1)
    assert out.tolist() == [0, 1, 2, -5]


def test_a_global_named_locals_does_not_break_the_rewrite(tmp_path):
    text = """\
import tylopy as ty
locals = "not Python's"


@ty.kernel(threads=32)
def k(out: ty.ptr(ty.i32), n: ty.i32):
    acc = 0
    for i in range(n):
        acc = acc + i
    out[3] = acc
"""
    m = import_file(tmp_path, text, MODULE)
    out = torch.full((4,), -5, dtype=torch.int32)
    m.k.emulate(out, 3, grid=1)
    assert out.tolist() == [-5, -5, -5, 3]


# -- debug mode is a flag of the compile ----------------------------------------------------------------

def printing_kernel(debug=None, text="value %d\\n"):
    @ty.kernel(threads=32, debug=debug)
    def k(out: ty.ptr(ty.i32)):
        ty.printf(text, out[0])
    return k


def test_debug_flag_compiles_prints_in_whatever_the_environment_says(monkeypatch):
    monkeypatch.delenv("TYLOPY_DEBUG", raising=False)
    assert "vprintf" in printing_kernel(debug=True).compile().ptx
    assert "vprintf" not in printing_kernel().compile().ptx
    monkeypatch.setenv("TYLOPY_DEBUG", "1")
    assert "vprintf" not in printing_kernel(debug=False).compile().ptx
    assert "vprintf" in printing_kernel().compile().ptx


def test_debug_flag_expects_a_bool():
    with pytest.raises(ty.KernelSourceError, match="debug expects True, False or None, but got 'yes'"):
        printing_kernel(debug="yes")


def test_debug_record_text_in_a_kernel_is_not_debug_mode(monkeypatch):
    monkeypatch.delenv("TYLOPY_DEBUG_WAITS", raising=False)

    @ty.kernel(threads=32, name="tylopy_debug_record_lookalike")
    def k(out: ty.ptr(ty.i32)):
        out[0] = 1
    ck = k.compile()
    assert "tylopy_debug_record" in ck.ptx  # (the kernel's own name)
    assert Launcher(ck)._debug_record is None


def test_debug_waits_option_sets_the_launcher_up(monkeypatch):
    monkeypatch.setenv("TYLOPY_DEBUG_WAITS", "1")

    @ty.kernel(threads=32)
    def waits(out: ty.ptr(ty.i32)):
        bar = ty.shared(ty.u64, 1, align=8)
        if ty.thread_idx() == 0:
            hopper.mbarrier_init(bar, 1)
            hopper.fence_mbarrier_init()
        ty.syncthreads()
        hopper.mbarrier_arrive(bar)
        hopper.mbarrier_wait(bar, 0, label="full")
        out[ty.thread_idx()] = 1
    assert Launcher(waits.compile())._debug_record == "tylopy_debug_record"
    assert Launcher(printing_kernel().compile())._debug_record is None  # debug waits on, but no wait
