"""``tylopy emulate FILE.py[:KERNEL]``: runs the file's ``emulate_example()`` and prints its result."""
import textwrap

import pytest

from tylopy.cli.emulate import cli_main

EXAMPLE = '''
import torch
import tylopy as ty


@ty.kernel(threads=64)
def scale(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32, FACTOR: ty.constexpr):
    i = ty.block_idx() * 64 + ty.thread_idx()
    if i < n:
        out[i] = x[i] * FACTOR


def emulate_example(grid=(2,), FACTOR=2.0, BROKEN=False):
    n = 100
    x, out = torch.randn(n), torch.zeros(n)
    scale.emulate(x, out, n + (64 if BROKEN else 0), grid=grid, FACTOR=FACTOR)
    return out, x * 2.0
'''


@pytest.fixture
def example_file(tmp_path):
    path = tmp_path / "scale_kernel.py"
    path.write_text(textwrap.dedent(EXAMPLE))
    return str(path)


def test_runs_emulate_example_and_compares(example_file, capsys):
    assert cli_main([f"{example_file}:scale", "--grid", "2"]) == 0
    assert "max |result - reference| = 0 over 100 values (ok" in capsys.readouterr().out


def test_defines_reach_the_example_and_a_mismatch_fails(example_file, capsys):
    assert cli_main([example_file, "-D", "FACTOR=3.0"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_emulation_error_exit_status(example_file, capsys):
    assert cli_main([example_file, "-D", "BROKEN=True"]) == 1
    err = capsys.readouterr().err
    assert "MemoryAccessError: global read out of bounds" in err and "scale_kernel.py:10" in err


def test_file_without_example(tmp_path, capsys):
    path = tmp_path / "plain.py"
    path.write_text("import tylopy as ty\n")
    assert cli_main([str(path)]) == 2
    assert "defines no emulate_example()" in capsys.readouterr().err


def test_bad_grid(example_file, capsys):
    assert cli_main([example_file, "--grid", "a,b"]) == 2


def test_through_the_tylopy_command(example_file, capsys):
    from tylopy import cli
    assert cli.main(["emulate", f"{example_file}:scale", "--grid", "2"]) == 0
    assert "(ok, tolerance" in capsys.readouterr().out
