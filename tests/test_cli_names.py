"""`tylopy check` and `tylopy bench` without a name, or with --help, say which names there are."""
import subprocess
import sys

import pytest

from tylopy import _plugins, cli

COMMANDS = {"check": ("tylopy.checks", "checks"), "bench": ("tylopy.benchmarks", "benchmarks")}


@pytest.fixture
def registry(monkeypatch):
    """Replace the installed entry points with a dict: {(group, name): object}."""
    table = {}
    monkeypatch.setattr(_plugins, "load", lambda group, name: table.get((group, name)))
    monkeypatch.setattr(_plugins, "names", lambda group: sorted(n for g, n in table if g == group))
    return table


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("command", COMMANDS)
def test_without_a_name_lists_the_names(capsys, registry, command):
    group, plural = COMMANDS[command]
    registry[(group, "zeta")] = registry[(group, "alpha")] = lambda argv: 0
    registry[("tylopy.other", "hidden")] = lambda argv: 0
    rc, out, err = run_cli(capsys, command)
    assert rc == 0 and err == ""
    assert f"available {plural}: alpha, zeta\n" in out  # sorted, only this command's group
    assert "hidden" not in out and f"tylopy {command} NAME" in out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_the_names(capsys, registry, command):
    group, plural = COMMANDS[command]
    registry[(group, "beta")] = lambda argv: 0
    rc, out, _ = run_cli(capsys, command, "--help")
    assert rc == 0 and f"usage: tylopy {command}" in out and f"available {plural}: beta." in out


@pytest.mark.parametrize("command", COMMANDS)
def test_nothing_installed_says_so(capsys, registry, command):
    group, plural = COMMANDS[command]
    rc, out, _ = run_cli(capsys, command)
    assert rc == 0 and f"no {plural} are installed" in out and repr(group) in out


def test_a_name_still_runs_with_its_arguments(capsys, registry):
    calls = []
    registry[("tylopy.benchmarks", "fake")] = lambda argv: calls.append(argv) or 3
    assert run_cli(capsys, "bench", "fake", "--help")[0] == 3  # --help after the name is the benchmark's
    assert calls == [["--help"]]


def test_unknown_name_lists_the_names(capsys, registry):
    registry[("tylopy.checks", "other")] = lambda argv: 0
    rc, _, err = run_cli(capsys, "check", "missing")
    assert rc == 2 and "no check 'missing'; available: other" in err


def test_installed_console_script_lists_this_packages_names():
    """The real entry points, through the console script's code path in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", "import sys, tylopy.cli as c; sys.exit(c.main(['bench']))"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = proc.stdout.splitlines()[0].split(": ", 1)[1].split(", ")
    assert {"attention", "softmax", "gemm"} <= set(names)
