"""A one-line mistake in a kernel shows the short error: the caller's lines, the kernel's line and
the message, without tylopy's internal frames (``TYLOPY_TRACEBACK=1`` shows them all)."""
import os
import subprocess
import sys
import textwrap
import traceback

import numpy as np
import pytest

import tylopy as ty

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ty.__file__)))
PACKAGE = os.path.join(ROOT, "tylopy") + os.sep


@ty.kernel(threads=32)
def mixed_types(x: ty.ptr(ty.f32), n: ty.i32):
    i = ty.thread_idx()
    x[i] = x[i] + n   # <- f32 + i32


def tylopy_frames(e: BaseException) -> list:
    return [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(PACKAGE)]


@pytest.mark.parametrize("call", ["compile", "emulate", "trace", "launch"])
def test_each_entry_point_hides_its_internal_frames(call, monkeypatch):
    monkeypatch.delenv("TYLOPY_TRACEBACK", raising=False)
    ty.clear_caches()
    run = {"compile": lambda: mixed_types.compile(),
           "emulate": lambda: mixed_types.emulate(np.zeros(32, np.float32), 3, grid=(1,)),
           "trace": lambda: mixed_types.trace(),
           "launch": lambda: mixed_types[(1,)](np.zeros(32, np.float32), 3)}[call]
    with pytest.raises(ty.KernelSourceError) as e:
        run()
    inside = tylopy_frames(e.value)
    assert len(inside) == 1 and "user_facing" in inside[0].line, inside  # only the re-raise remains
    assert "add expects operands of one type, but got f32 and i32" in str(e.value)
    assert "x[i] = x[i] + n" in str(e.value)


def test_tylopy_traceback_keeps_every_frame(monkeypatch):
    monkeypatch.setenv("TYLOPY_TRACEBACK", "1")
    with pytest.raises(ty.KernelSourceError) as e:
        mixed_types.trace()
    assert len(tylopy_frames(e.value)) >= 5  # the tracing machinery down to builder.error


def test_a_script_prints_a_short_error(tmp_path):
    script = tmp_path / "one_mistake.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import tylopy as ty

        @ty.kernel(threads=32)
        def add(x: ty.ptr(ty.f32), n: ty.i32):
            i = ty.thread_idx()
            x[i] = x[i] + n

        add.emulate(np.zeros(32, np.float32), 3, grid=(1,))
        """))
    env = {k: v for k, v in os.environ.items() if k != "TYLOPY_TRACEBACK"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    short = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert short.returncode == 1
    lines = short.stderr.strip().splitlines()
    assert len(lines) <= 16, short.stderr
    assert lines[-2] == "add expects operands of one type, but got f32 and i32", short.stderr
    assert sum("tylopy" + os.sep in line and "File" in line for line in lines) == 1  # the re-raise only
    full = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "TYLOPY_TRACEBACK": "1"})
    assert len(full.stderr.splitlines()) > len(lines) + 10 and "builder.py" in full.stderr
