"""The ``tylopy`` logger: quiet by default; compiles over a second, autotuning and emulation at
INFO, every compile and emulated block at DEBUG; TYLOPY_LOG prints it to stderr."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import tylopy as ty
from tylopy import _logging
from tylopy.runtime import hooks
from tylopy_kernels.examples.vector_add import vector_add

from conftest import fresh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ty.__file__)))
EMULATE_ONE = ("import numpy as np, tylopy as ty\n"
               "from tylopy_kernels.examples.vector_add import vector_add\n"
               "x = np.random.rand(300).astype(np.float32); out = np.full(300, np.nan, np.float32)\n"
               "vector_add.emulate(x, x, out, 300, grid=(2,))\n"
               "assert np.array_equal(out, x + x)\n")


@pytest.fixture(autouse=True)
def _default_log():
    """Each test starts (and leaves) the tylopy logger as importing tylopy without TYLOPY_LOG does."""
    _logging.configure(None)
    yield
    _logging.configure(None)


def run_python(code: str, **env):
    environ = {k: v for k, v in os.environ.items() if k != "TYLOPY_LOG"}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=300)


def emulate_vector_add(n=300):
    x, y = (np.random.default_rng(1).random(n, dtype=np.float32) for _ in range(2))
    out = np.full(n, np.nan, np.float32)
    vector_add.emulate(x, y, out, n, grid=((n + 255) // 256,))
    np.testing.assert_array_equal(out, x + y)


def test_quiet_by_default():
    proc = run_python(EMULATE_ONE)
    assert proc.returncode == 0, proc.stderr
    assert "tylopy:" not in proc.stderr


def test_tylopy_log_info_prints_to_stderr():
    proc = run_python(EMULATE_ONE, TYLOPY_LOG="info")
    assert proc.returncode == 0, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.startswith("tylopy: ")]
    assert any("emulating vector_add: 2 block(s) of grid (2, 1, 1)" in l for l in lines), proc.stderr
    assert any(l.startswith("tylopy: emulated vector_add: 2 CTA(s)") for l in lines), proc.stderr
    assert not any("block (0, 0, 0) done" in l for l in lines)  # per-block lines are DEBUG


def test_tylopy_log_debug_adds_blocks_and_compiles():
    proc = run_python(EMULATE_ONE, TYLOPY_LOG="debug", TYLOPY_CACHE="0")
    assert proc.returncode == 0, proc.stderr
    assert "tylopy: emulating vector_add: block (1, 0, 0) done (2/2)" in proc.stderr, proc.stderr


def test_bad_tylopy_log_warns_and_keeps_going():
    proc = run_python("import tylopy; print('imported')", TYLOPY_LOG="loud")
    assert proc.returncode == 0 and proc.stdout.strip() == "imported"
    assert "TYLOPY_LOG expects one of debug, info, warning, error, off, but got 'loud'" in proc.stderr


def test_configure_rejects_a_bad_level_by_name():
    with pytest.raises(ValueError, match="TYLOPY_LOG expects one of .* but got 'verbose'"):
        ty.configure_logging("verbose")


def test_configure_prints_and_undoes(capsys):
    logger = logging.getLogger("tylopy")
    ty.configure_logging("debug")
    assert logger.level == logging.DEBUG and not logger.propagate
    logging.getLogger("tylopy.compile").debug("probe %d", 7)
    assert "tylopy: probe 7" in capsys.readouterr().err
    ty.configure_logging(None)
    assert logger.level == logging.NOTSET and logger.propagate
    logging.getLogger("tylopy.compile").info("unseen")
    assert "unseen" not in capsys.readouterr().err


def test_emulation_reports_start_and_end(caplog):
    caplog.set_level(logging.INFO, logger="tylopy")
    emulate_vector_add()
    messages = [r.getMessage() for r in caplog.records if r.name == "tylopy.emulate"]
    assert messages[0] == "emulating vector_add: 2 block(s) of grid (2, 1, 1), 8 warps each"
    assert messages[-1].startswith("emulated vector_add: 2 CTA(s) of grid (2, 1, 1)")


def test_long_emulation_reports_progress(caplog, monkeypatch):
    from tylopy.emulate import launch
    monkeypatch.setattr(launch, "PROGRESS_SECONDS", 0.0)  # every block counts as "a second later"
    caplog.set_level(logging.INFO, logger="tylopy")
    emulate_vector_add(600)
    progress = [r.getMessage() for r in caplog.records if "blocks done" in r.getMessage()]
    assert [p.split(",")[0] for p in progress] == [f"emulating vector_add: {i}/3 blocks done" for i in (1, 2, 3)]


def test_every_compile_at_debug(caplog, no_disk_cache):
    caplog.set_level(logging.DEBUG, logger="tylopy")
    fresh(vector_add).compile()
    records = [r for r in caplog.records if r.name == "tylopy.compile"]
    assert len(records) == 1 and records[0].levelno == logging.DEBUG
    assert records[0].getMessage().startswith(f"compiled vector_add ({vector_add.arch}) in ")


def test_slow_compile_at_info(caplog, monkeypatch, no_disk_cache):
    monkeypatch.setattr(hooks, "SLOW_COMPILE_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="tylopy")
    fresh(vector_add).compile()
    (record,) = [r for r in caplog.records if r.name == "tylopy.compile"]
    assert record.levelno == logging.INFO
    from tylopy.codegen.ptxas import find_ptxas
    if find_ptxas() is not None:
        assert " registers, 0 bytes spilled, 0 bytes stack" in record.getMessage()


def test_compile_line_names_constexprs_and_cache_loads(caplog):
    report = types.SimpleNamespace(available=False)
    ck = types.SimpleNamespace(constexprs={"BLOCK_N": 64, "DTYPE": "bf16"}, from_cache=True, compile_seconds=1.5,
                               arch="sm_90a", report=report)
    caplog.set_level(logging.INFO, logger="tylopy")
    hooks.compiled("attn_fwd", ck)
    assert [r.getMessage() for r in caplog.records] == ["loaded attn_fwd (sm_90a; BLOCK_N=64, DTYPE='bf16') in 1.50 s"]


def test_autotuning_logs_each_candidate_and_the_choice(caplog, cache_dir, monkeypatch):
    monkeypatch.delenv("TYLOPY_AUTOTUNE", raising=False)
    monkeypatch.delenv("TYLOPY_AUTOTUNE_VERBOSE", raising=False)
    speed = {64: 2.0, 128: 1.0}
    tuned = ty.autotune(configs=[ty.Config(BLOCK=64), ty.Config(BLOCK=128)], key=["n"],
                        timer=lambda fn: speed[fn.keywords["BLOCK"]], name="tests.logged", device=lambda a: "fake")(
        lambda n, BLOCK=0: BLOCK)
    caplog.set_level(logging.INFO, logger="tylopy")
    assert tuned(3) == 128
    messages = [r.getMessage() for r in caplog.records if r.name == "tylopy.autotune"]
    assert "timing 2 configs" in messages[0]
    assert "1/2 Config(BLOCK=64) 2.0000 ms" in messages[1] and "2/2 Config(BLOCK=128) 1.0000 ms" in messages[2]
    assert "best Config(BLOCK=128)" in messages[3]
