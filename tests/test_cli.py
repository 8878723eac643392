"""The ``tylopy`` command: dump, cache, and dispatch of check/bench/emulate.

Most tests call ``main([...])`` in-process (fast, capsys sees the output); one runs the real
console script in a subprocess.
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import types

import pytest

import tylopy as ty
from tylopy import cli
from tylopy_kernels.examples import vector_add as vector_add_module
from tylopy_kernels.examples.vector_add import vector_add

from conftest import fresh

VECTOR_ADD = vector_add_module.__file__
COMMANDS = ("dump", "check", "bench", "emulate", "cache")

TWO_KERNELS = '''\
import tylopy as ty
from cli_sibling_consts import BLOCK   # a sibling import: the file's folder is on sys.path


@ty.kernel(threads=BLOCK)
def fill(out: ty.ptr(ty.f32), n: ty.i32, VALUE: ty.constexpr = 1.0):
    i = ty.block_idx() * BLOCK + ty.thread_idx()
    if i < n:
        out[i] = VALUE


@ty.kernel(threads=BLOCK)
def convert(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), DTYPE: ty.constexpr = ty.f32):
    i = ty.thread_idx()
    out[i] = ty.cast(ty.cast(x[i], DTYPE), ty.f32)
'''

BROKEN = '''\
import tylopy as ty


@ty.kernel(threads=32)
def broken(x: ty.ptr(ty.f32), n: ty.i32):
    x[0] = x[0] + n
'''


@pytest.fixture
def kernel_dir(tmp_path):
    (tmp_path / "cli_sibling_consts.py").write_text("BLOCK = 128\n")
    (tmp_path / "cli_two_kernels.py").write_text(TWO_KERNELS)
    (tmp_path / "cli_broken.py").write_text(BROKEN)
    return tmp_path


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# -- help -----------------------------------------------------------------------------------------

def test_help_lists_every_command(capsys):
    rc, out, _ = run_cli(capsys, "--help")
    assert rc == 0
    for command in COMMANDS:
        assert re.search(rf"^\s+{command}\s+\S", out, re.M), f"{command} missing from:\n{out}"


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_help(capsys, command):
    rc, out, _ = run_cli(capsys, command, "--help")
    assert rc == 0 and "usage: tylopy " + command in out


def test_no_command_prints_help(capsys):
    rc, out, _ = run_cli(capsys)
    assert rc == 2 and "dump" in out


# -- dump -------------------------------------------------------------------------------------------

def test_dump_prints_ptx_then_report(capsys):
    rc, out, err = run_cli(capsys, "dump", VECTOR_ADD)
    assert rc == 0, err
    target = out.index(".target sm_90a")
    report = re.search(r"^ptxas report \(sm_90a\): \d+ registers, 0 bytes spill stores, .*$", out, re.M)
    assert report and report.start() > target
    assert ".visible .entry vector_add(" in out
    assert "// vector_add.py:" in out


def test_dump_relative_path(capsys, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(VECTOR_ADD))))
    rc, out, err = run_cli(capsys, "dump", "tylopy_kernels/examples/vector_add.py")
    assert rc == 0, err
    assert ".target sm_90a" in out and "0 bytes spill stores" in out


def test_dump_arch(capsys):
    rc, out, _ = run_cli(capsys, "dump", VECTOR_ADD, "--arch", "sm_80")
    assert rc == 0
    assert re.search(r"^\.target sm_80$", out, re.M) and "ptxas report (sm_80)" in out


def test_dump_bad_arch_is_a_usage_error(capsys):
    rc, _, err = run_cli(capsys, "dump", VECTOR_ADD, "--arch", "sm_99")
    assert rc == 2 and "invalid choice: 'sm_99'" in err


def test_dump_llvm(capsys):
    rc, out, _ = run_cli(capsys, "dump", VECTOR_ADD, "--llvm")
    assert rc == 0
    assert 'target triple = "nvptx64-nvidia-cuda"' in out
    assert re.search(r"^define .*@\"?vector_add\"?\(", out, re.M)
    assert ".target sm_90a" not in out
    assert "ptxas report" in out


def test_dump_ir(capsys):
    rc, out, _ = run_cli(capsys, "dump", VECTOR_ADD, "--ir", "--no-report")
    assert rc == 0
    assert out.startswith("kernel vector_add(")
    assert "x: ptr<f32, global>" in out and "load(" in out and "store(" in out
    assert "ptxas report" not in out


def test_dump_llvm_and_ir_exclude_each_other(capsys):
    rc, _, err = run_cli(capsys, "dump", VECTOR_ADD, "--llvm", "--ir")
    assert rc == 2 and "not allowed with" in err


def test_dump_out_writes_file_and_prints_report(capsys, tmp_path):
    target = tmp_path / "va.ptx"
    rc, out, _ = run_cli(capsys, "dump", VECTOR_ADD, "--out", str(target))
    assert rc == 0
    text = target.read_text()
    assert ".target sm_90a" in text and ".visible .entry vector_add(" in text
    assert text == vector_add.compile().ptx
    assert ".target" not in out
    assert "0 bytes spill stores" in out and str(target) in out


def test_dump_every_kernel_of_a_file(capsys, kernel_dir):
    rc, out, err = run_cli(capsys, "dump", str(kernel_dir / "cli_two_kernels.py"))
    assert rc == 0, err
    assert out.index(".visible .entry fill(") < out.index(".visible .entry convert(")
    assert len(re.findall(r"ptxas report", out)) == 2
    assert ".maxntid 128" in out  # BLOCK came from the sibling module


def test_dump_one_kernel(capsys, kernel_dir):
    rc, out, _ = run_cli(capsys, "dump", f"{kernel_dir / 'cli_two_kernels.py'}:convert", "--ir")
    assert rc == 0
    assert "kernel convert(" in out and "kernel fill(" not in out


def test_dump_define_literal(capsys, kernel_dir):
    path = str(kernel_dir / "cli_two_kernels.py")
    rc, out, _ = run_cli(capsys, "dump", f"{path}:fill", "--ir", "-D", "VALUE=2.5")
    assert rc == 0 and "value=2.5" in out and "value=1.0" not in out


def test_dump_define_dtype_name(capsys, kernel_dir):
    path = str(kernel_dir / "cli_two_kernels.py")
    rc, out, _ = run_cli(capsys, "dump", f"{path}:convert", "--ir", "-D", "DTYPE=bf16")
    assert rc == 0 and "to=bf16" in out


def test_dump_define_applies_to_the_kernels_that_declare_it(capsys, kernel_dir):
    rc, out, err = run_cli(capsys, "dump", str(kernel_dir / "cli_two_kernels.py"), "--ir", "-D", "DTYPE=f16")
    assert rc == 0, err
    assert "to=f16" in out and "kernel fill(" in out


def test_dump_define_unknown_name(capsys, kernel_dir):
    rc, _, err = run_cli(capsys, "dump", f"{kernel_dir / 'cli_two_kernels.py'}:fill", "-D", "NOPE=1")
    assert rc == 2
    assert "-D NOPE: fill has no compile-time parameter of that name" in err and "Traceback" not in err


def test_dump_define_must_be_name_value(capsys):
    rc, _, err = run_cli(capsys, "dump", VECTOR_ADD, "-D", "oops")
    assert rc == 2 and "-D expects NAME=VALUE" in err


@pytest.mark.parametrize("text, value", [
    ("N=128", 128), ("S=0.5", 0.5), ("T=(64, 2)", (64, 2)), ("B=True", True), ("D=bf16", ty.bf16),
    ("D=f32", ty.f32), ("MODE='causal'", "causal"), ("MODE=causal", "causal"), ("E=", ""),
])
def test_parse_define(text, value):
    name, got = cli.parse_define(text)
    assert name == text.split("=")[0] and got == value and type(got) is type(value)


def test_dump_bad_kernel_name_lists_the_kernels(capsys, kernel_dir):
    rc, out, err = run_cli(capsys, "dump", f"{kernel_dir / 'cli_two_kernels.py'}:nope")
    assert rc == 2 and out == ""
    assert "has no kernel 'nope'; its kernels are: fill, convert" in err
    assert "Traceback" not in err


def test_dump_missing_file(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "dump", str(tmp_path / "absent.py"))
    assert rc == 2 and "no such file" in err


def test_dump_file_without_kernels(capsys, kernel_dir):
    rc, _, err = run_cli(capsys, "dump", str(kernel_dir / "cli_sibling_consts.py"))
    assert rc == 2 and "defines no tylopy kernels" in err


def test_dump_file_that_fails_to_import(capsys, tmp_path):
    bad = tmp_path / "cli_raises.py"
    bad.write_text("import tylopy\n\nraise RuntimeError('boom')\n")
    rc, _, err = run_cli(capsys, "dump", str(bad))
    assert rc == 2
    assert f"{bad}:3" in err and "RuntimeError: boom" in err and "Traceback" not in err


def test_dump_syntax_error(capsys, tmp_path):
    bad = tmp_path / "cli_syntax.py"
    bad.write_text("def f(:\n")
    rc, _, err = run_cli(capsys, "dump", str(bad))
    assert rc == 2 and "SyntaxError" in err and "Traceback" not in err


def test_dump_kernel_source_error(capsys, kernel_dir):
    path = kernel_dir / "cli_broken.py"
    rc, out, err = run_cli(capsys, "dump", str(path))
    assert rc == 2
    assert f"{path}:6: " in err and len(err.strip().splitlines()) == 1
    assert "add expects operands of one type, but got f32 and i32" in err
    assert "Traceback" not in err


# -- cache ------------------------------------------------------------------------------------------

def test_cache_path(capsys, cache_dir):
    rc, out, _ = run_cli(capsys, "cache", "path")
    assert rc == 0 and out.strip() == str(cache_dir)


def test_cache_explain_then_clear(capsys, cache_dir):
    rc, out, _ = run_cli(capsys, "cache", "explain", VECTOR_ADD)
    assert rc == 0 and out.startswith("vector_add: miss: no entry")
    fresh(vector_add).compile()
    rc, out, _ = run_cli(capsys, "cache", "explain", VECTOR_ADD)
    assert out.startswith("vector_add: hit: ")
    rc, out, _ = run_cli(capsys, "cache", "explain", VECTOR_ADD, "--arch", "sm_80")
    assert "miss: differs" in out and "options (arch)" in out
    (cache_dir / "keep-me.txt").write_text("not a cache entry")
    rc, out, _ = run_cli(capsys, "cache", "clear")
    assert rc == 0 and "removed 4 files" in out  # the entry (json, ptx, cubin) and its reads manifest
    assert os.listdir(cache_dir) == ["keep-me.txt"]


def test_cache_explain_needs_a_file(capsys):
    rc, _, err = run_cli(capsys, "cache", "explain")
    assert rc == 2 and "expects FILE.py" in err


# -- dispatch ----------------------------------------------------------------------------------------

@pytest.fixture
def registry(monkeypatch):
    """Replace the installed entry points with a dict: {(group, name): object}."""
    from tylopy import _plugins
    table = {}
    monkeypatch.setattr(_plugins, "load", lambda group, name: table.get((group, name)))
    monkeypatch.setattr(_plugins, "names", lambda group: sorted(n for g, n in table if g == group))
    return table


def test_check_dispatches_to_a_registered_check(capsys, registry):
    calls = []
    registry[("tylopy.checks", "attention")] = lambda argv: calls.append(argv) or 0
    rc, _, _ = run_cli(capsys, "check", "attention", "--quick", "-n", "3")
    assert rc == 0 and calls == [["--quick", "-n", "3"]]


def test_check_passes_the_exit_status_through(capsys, registry):
    registry[("tylopy.checks", "softmax")] = lambda argv: 1
    assert run_cli(capsys, "check", "softmax")[0] == 1


def test_check_not_registered(capsys, registry):
    registry[("tylopy.checks", "other")] = lambda argv: 0
    rc, _, err = run_cli(capsys, "check", "attention")
    assert rc == 2 and "no check 'attention'; available: other" in err


def test_installed_checks_and_benchmarks_are_registered():
    from tylopy import _plugins
    assert {"attention", "streaming_attention"} <= set(_plugins.names(_plugins.CHECKS))
    assert {"attention", "softmax"} <= set(_plugins.names(_plugins.BENCHMARKS))
    assert callable(_plugins.load(_plugins.BENCHMARKS, "attention"))


def test_bench_dispatches_to_a_registered_benchmark(capsys, registry):
    registry[("tylopy.benchmarks", "fake")] = lambda argv: print("bench args", argv) or 0
    rc, out, _ = run_cli(capsys, "bench", "fake", "--iters", "5")
    assert rc == 0 and "bench args ['--iters', '5']" in out


def test_bench_not_available(capsys, registry):
    registry[("tylopy.benchmarks", "other")] = lambda argv: 0
    rc, _, err = run_cli(capsys, "bench", "missing")
    assert rc == 2 and "no benchmark 'missing'" in err and "available: other" in err


def test_bench_rejects_paths(capsys):
    rc, _, err = run_cli(capsys, "bench", "../etc")
    assert rc == 2 and "expects a name" in err


def test_emulate_dispatches_to_cli_main(capsys, monkeypatch):
    from tylopy.cli import emulate
    calls = []
    monkeypatch.setattr(emulate, "cli_main", lambda argv: calls.append(argv) or 0)
    rc, _, _ = run_cli(capsys, "emulate", "tylopy_kernels/examples/vector_add.py:vector_add", "--grid", "4")
    assert rc == 0 and calls == [["tylopy_kernels/examples/vector_add.py:vector_add", "--grid", "4"]]


# -- the console script --------------------------------------------------------------------------------

def _console_script() -> list[str]:
    exe = shutil.which("tylopy") or os.path.join(sysconfig.get_path("scripts"), "tylopy")
    if not os.path.exists(exe):
        pytest.skip("the tylopy console script is not installed (pip install -e .)")
    return [exe]


def test_console_script_dump_matches_in_process_ptx(tmp_path):
    env = dict(os.environ, TYLOPY_CACHE="0")  # a fresh build in another process: determinism across processes
    proc = subprocess.run(_console_script() + ["dump", VECTOR_ADD, "--no-report"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == vector_add.compile().ptx


def test_console_script_error_exit_status(tmp_path):
    proc = subprocess.run(_console_script() + ["dump", f"{VECTOR_ADD}:nope"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "has no kernel 'nope'; its kernels are: vector_add" in proc.stderr
    assert "Traceback" not in proc.stderr
