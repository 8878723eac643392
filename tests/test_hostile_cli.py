"""Hostile inputs against the command line and the cache folder: each gives one line on stderr
and exit status 2 from ``tylopy``, and a tylopy exception class from Python, or (for a corrupt
cache entry) a silent rebuild. Also ``tylopy.attention(scale=10**400)``."""
import json
import os

import pytest

import tylopy as ty
from tylopy import cli
from tylopy.errors import CompileOptionError, TylopyError
from tylopy.jit import cache, cachefs
from tylopy_kernels.examples import vector_add as vector_add_module
from tylopy_kernels.examples.vector_add import vector_add

from conftest import fresh

VECTOR_ADD = vector_add_module.__file__
HOPPER = os.path.join(os.path.dirname(os.path.dirname(vector_add_module.__file__)), "attention", "sm90", "forward.py")


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys, *argv) -> str:
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_out_to_a_missing_folder(capsys, tmp_path):
    line = one_line_error(capsys, "dump", VECTOR_ADD, "--out", str(tmp_path / "nope" / "x.ptx"))
    assert "does not exist" in line and "nope" in line


@pytest.mark.parametrize("define, message", [
    ("BLOCK_N=2.5", "BLOCK_N expects a multiple of 16"),
    ("STAGES=0", "remainder by the constant 0"),
    ("CONSUMERS=0", "CONSUMERS expects one of"),
    ("HEAD_DIM=48", "HEAD_DIM expects 64 or 128, but got 48"),
    ("B=2.5", "-D B: attention_fwd_sm90 has no compile-time parameter of that name"),
])
def test_bad_defines_on_the_hopper_attention(capsys, define, message, no_disk_cache):
    line = one_line_error(capsys, "dump", HOPPER, "-D", define, "--no-report")
    assert message in line, line


def test_cache_dir_that_is_a_file(capsys, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("TYLOPY_CACHE_DIR", str(blocker))
    monkeypatch.delenv("TYLOPY_CACHE", raising=False)
    never_compiled = tmp_path / "cli_cache_victim.py"  # (a kernel compiled earlier in this process is in memory)
    never_compiled.write_text("import tylopy as ty\n\n\n@ty.kernel(threads=32)\ndef victim(x: ty.ptr(ty.f32)):\n"
                              "    x[0] = 2.0\n")
    for argv in (("dump", str(never_compiled)), ("cache", "path"), ("cache", "explain", VECTOR_ADD)):
        line = one_line_error(capsys, *argv)
        assert str(blocker) in line and "TYLOPY_CACHE_DIR" in line, line
    with pytest.raises(cache.CacheUnavailable) as info:
        fresh(vector_add).compile()
    assert isinstance(info.value, TylopyError) and isinstance(info.value, OSError)


def test_cache_dir_that_cannot_be_created(capsys, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TYLOPY_CACHE_DIR", str(blocker / "sub"))
    monkeypatch.delenv("TYLOPY_CACHE", raising=False)
    line = one_line_error(capsys, "cache", "explain", VECTOR_ADD)
    assert "cannot be created" in line


def test_cache_dir_that_cannot_be_written(capsys, cache_dir, monkeypatch):
    """A read-only cache serves what it has and warns once that it cannot store (as a non-root
    user would see with chmod; simulated, since tests may run as root)."""
    def refuse(path, data):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(cachefs, "atomic_write", refuse)
    monkeypatch.setattr(cachefs, "_warned", set())
    with pytest.warns(RuntimeWarning, match="cannot write the compile cache"):
        assert fresh(vector_add).compile().ptx
    rc, out, err = run_cli(capsys, "dump", VECTOR_ADD, "--no-report")
    assert rc == 0 and ".entry vector_add" in out


def _entry(cache_dir) -> tuple[str, str]:
    ck = fresh(vector_add).compile()
    return ck.cache_key, ck.ptx


@pytest.mark.parametrize("poison", ["deep", "infinity", "nan", "not-a-dict", "huge-smem"])
def test_corrupt_cache_json_is_rebuilt(poison, capsys, cache_dir):
    key, ptx = _entry(cache_dir)
    meta_path = cache_dir / f"{key}.json"
    meta = json.loads(cachefs.unseal(meta_path.name, meta_path.read_bytes()))
    if poison == "deep":
        text = "[" * 200_000 + "]" * 200_000
    elif poison == "infinity":
        meta["dynamic_shared_bytes"] = float("inf")
        text = json.dumps(meta)
    elif poison == "nan":
        meta["report"]["registers"] = float("nan")
        text = json.dumps(meta)
    elif poison == "not-a-dict":
        text = "[1, 2, 3]"
    else:
        meta["dynamic_shared_bytes"] = 10**30
        text = json.dumps(meta)
    meta_path.write_bytes(cachefs.seal(meta_path.name, text.encode()))  # signed: the schema check must catch it
    manifests = list(cache_dir.glob("*.reads.json"))
    poisoned = "[" * 200_000 + "]" * 200_000 if poison == "deep" else "Infinity"
    manifests[0].write_bytes(cachefs.seal(manifests[0].name, poisoned.encode()))
    rc, out, err = run_cli(capsys, "cache", "explain", VECTOR_ADD)
    assert rc == 0 and "Traceback" not in err and "vector_add: miss" in out
    rebuilt = fresh(vector_add).compile()
    assert not rebuilt.from_cache and rebuilt.ptx == ptx
    assert fresh(vector_add).compile().from_cache  # the rebuild rewrote the entry


def test_bad_debug_wait_seconds_from_the_cli(capsys, monkeypatch, no_disk_cache):
    monkeypatch.setenv("TYLOPY_DEBUG_WAIT_SECONDS", "abc")
    line = one_line_error(capsys, "dump", VECTOR_ADD)
    assert "TYLOPY_DEBUG_WAIT_SECONDS expects a number of seconds, but got 'abc'" in line
    with pytest.raises(CompileOptionError):
        vector_add.options()


def test_attention_scale_beyond_the_float_range_names_the_argument():
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="attention: scale expects a finite number, but got an int of 401 digits"):
        ty.attention(q, q, q, scale=10**400)
