"""``tylopy dump`` finds every kernel a file defines: module globals, kernels made by factories
(at import, or cached factories of one dtype parameter, called with ``--dtype``), and kernels
whose tensor parameters leave the dtype open (``-D NAME=dtype`` or ``--dtype`` selects it)."""
import os

import pytest

from tylopy import cli
from tylopy_kernels.softmax import streaming

STREAMING = streaming.__file__

OPEN = '''\
import tylopy as ty


@ty.kernel(threads=32)
def copy(x: ty.tensor(1), y: ty.tensor(1)):
    y[ty.thread_idx()] = x[ty.thread_idx()]
'''


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_list_finds_the_kernels_of_dtype_factories(capsys):
    rc, out, err = run_cli(capsys, "dump", STREAMING, "--list")
    assert rc == 0, err
    # (a factory's kernels of other dtypes that earlier code in this process made are listed too:
    # the CLI's own process starts with the f32 ones alone)
    assert [line for line in out.splitlines() if "_f32 " in line] == [
        "softmax_streaming_f32 (sm_90a): VEC", "softmax_full_row_f32 (sm_90a): COLS, VEC, WARPS_PER_ROW=1",
        "softmax_three_pass_f32 (sm_90a): no compile-time parameters"]


def test_dtype_selects_the_factory_specialization(capsys, no_disk_cache):
    rc, out, err = run_cli(capsys, "dump", f"{STREAMING}:softmax_streaming_bf16", "--dtype", "bf16", "-D", "VEC=4",
                           "--no-report")
    assert rc == 0, err
    assert ".entry softmax_streaming_bf16" in out


def test_dumping_all_kernels_that_need_values_points_at_list(capsys):
    rc, out, err = run_cli(capsys, "dump", STREAMING, "--no-report")
    assert rc == 2 and "needs a value" in err and "--list' shows what each kernel needs" in err


@pytest.fixture
def open_kernel(tmp_path):
    f = tmp_path / "cli_open_dtype.py"
    f.write_text(OPEN)
    return str(f)


@pytest.mark.parametrize("argv, load", [((), "ld.global.b32"), (("--dtype", "f16"), "ld.global.b16"),
                                        (("-D", "x=bf16", "-D", "y=bf16"), "ld.global.b16")])
def test_open_dtype_kernels_are_found_and_specialized(capsys, open_kernel, argv, load, no_disk_cache):
    rc, out, err = run_cli(capsys, "dump", open_kernel, "--no-report", *argv)
    assert rc == 0, err
    assert ".entry copy" in out and (load in out or load.replace("b16", "u16") in out), out


def test_list_shows_open_tensor_dtypes(capsys, open_kernel):
    rc, out, _ = run_cli(capsys, "dump", open_kernel, "--list")
    assert rc == 0 and out.strip() == "copy (sm_90a): x (dtype of tensor x), y (dtype of tensor y)"


def test_bad_dtype_is_one_line(capsys, open_kernel):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["dump", open_kernel, "--dtype", "float7"])
    rc, out, err = run_cli(capsys, "dump", open_kernel, "--dtype", "float7")
    assert rc == 2 and "--dtype expects one of" in err


def test_cache_explain_takes_the_same_options(capsys, open_kernel, cache_dir):
    rc, out, err = run_cli(capsys, "cache", "explain", open_kernel, "--dtype", "bf16")
    assert rc == 0 and out.startswith("copy: miss"), err
    assert os.path.isdir(cache_dir)
