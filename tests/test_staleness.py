"""One staleness contract, tested from the outside: a compile's key covers everything its trace
read, so no change below ever gives stale PTX, in memory, on disk, or in the emulator.

Each case changes one input between two compiles: the kernel's file (edited after import, and
edited keeping its size and mtime), a global, a closure variable, a helper's default mutated in
place, an environment variable read while tracing, a value nested deep in a global, a long list
and a numpy array mutated in place. The checks compare the PTX (or the emulated result) with
what the new value must give.
"""
import os
import subprocess
import sys

import pytest
import torch

from tylopy.errors import CaptureError
from tylopy.language import capture

from module_files import f32_hex, import_file, import_path, write_module

MODULE = "staleness_mod"


@pytest.fixture(autouse=True)
def forget_module():
    yield
    sys.modules.pop(MODULE, None)


def scaled_kernel(setup: str, expression: str) -> str:
    return f"""\
import os
import numpy as np
import tylopy as ty
{setup}


@ty.kernel(threads=32)
def k(x: ty.ptr(ty.f32)):
    x[0] = x[0] * {expression}
"""


def fresh_kernel(module):
    import tylopy as ty
    k = module.k
    return ty.Kernel(k.fn, k.threads, k.arch, k.min_blocks_per_sm, k.max_registers, k.name)


# -- the kernel's source file ------------------------------------------------------------------------

def test_file_edited_after_import_is_traced_and_keyed_as_it_is_now(tmp_path, cache_dir):
    path = write_module(tmp_path, scaled_kernel("", "2.5"), MODULE)
    module = import_path(path, MODULE)
    path.write_text(path.read_text().replace("* 2.5", "* 3.5"))  # edited after import, before compiling
    ck = module.k.compile()
    assert f32_hex(3.5) in ck.ptx  # the trace reads the file as it is now
    original = import_file(tmp_path, scaled_kernel("", "2.5"), MODULE).k.compile()
    assert f32_hex(2.5) in original.ptx and not original.from_cache
    assert original.cache_key != ck.cache_key  # the new PTX is not stored under the old text's key


def test_edit_keeping_size_and_mtime_is_no_stale_hit_in_memory(tmp_path, cache_dir):
    path = write_module(tmp_path, scaled_kernel("", "2.5"), MODULE)
    module = import_path(path, MODULE)
    first = module.k.compile()
    stamp = os.stat(path)
    path.write_text(path.read_text().replace("* 2.5", "* 3.5"))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert os.stat(path).st_size == stamp.st_size
    again = fresh_kernel(module).compile()
    assert f32_hex(3.5) in again.ptx and not again.from_cache and again.cache_key != first.cache_key


def test_edit_keeping_size_and_mtime_is_no_stale_hit_across_processes(tmp_path, cache_dir):
    """The second process imports the stale .pyc (Python checks size and mtime too), but the
    trace reads the file's text, and so does the key."""
    path = write_module(tmp_path, scaled_kernel("", "2.5"), MODULE)
    script = (f"import sys; sys.path.insert(0, {str(path.parent)!r}); import {MODULE} as m; "
              "ck = m.k.compile(); print(ck.from_cache, ck.ptx.count('0f40200000'), ck.ptx.count('0f40600000'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # (the stale .pyc is the point)

    def run():
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()
    assert run() == ["False", "1", "0"]  # 2.5 = 0f40200000
    assert list((path.parent / "__pycache__").iterdir())
    stamp = os.stat(path)
    path.write_text(path.read_text().replace("* 2.5", "* 3.5"))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert run() == ["False", "0", "1"]  # 3.5 = 0f40600000, traced anew


def test_helper_file_edited_after_import(tmp_path, cache_dir):
    helper = write_module(tmp_path, "import tylopy as ty\n\n\n@ty.func\ndef scale(v):\n    return v * 2.5\n",
                          "staleness_helper")
    sys.path.insert(0, str(helper.parent))
    try:
        sys.modules.pop("staleness_helper", None)
        module = import_file(tmp_path, scaled_kernel("from staleness_helper import scale", "1.0")
                             .replace("x[0] * 1.0", "scale(x[0])"), MODULE)
        helper.write_text(helper.read_text().replace("2.5", "3.5"))
        ck = module.k.compile()
        assert f32_hex(3.5) in ck.ptx
        sys.modules.pop("staleness_helper", None)
        helper.write_text(helper.read_text().replace("3.5", "2.5"))
        back = import_file(tmp_path, scaled_kernel("from staleness_helper import scale", "1.0")
                           .replace("x[0] * 1.0", "scale(x[0])"), MODULE).k.compile()
        assert f32_hex(2.5) in back.ptx and back.cache_key != ck.cache_key
    finally:
        sys.path.remove(str(helper.parent))
        sys.modules.pop("staleness_helper", None)


# -- values the trace reads ---------------------------------------------------------------------------

def test_global_rebound(tmp_path, cache_dir):
    m = import_file(tmp_path, scaled_kernel("SCALE = 2.5", "SCALE"), MODULE)
    assert f32_hex(2.5) in m.k.compile().ptx
    m.SCALE = 3.5
    assert f32_hex(3.5) in m.k.compile().ptx
    assert f32_hex(3.5) in fresh_kernel(m).compile().ptx


CLOSURE = """\
import tylopy as ty


def make(scale):
    @ty.kernel(threads=32)
    def k(x: ty.ptr(ty.f32)):
        x[0] = x[0] * scale

    def rebind(v):
        nonlocal scale
        scale = v
    return k, rebind
"""


def test_closure_rebound(tmp_path, cache_dir):
    m = import_file(tmp_path, CLOSURE, MODULE)
    k, rebind = m.make(2.5)
    assert f32_hex(2.5) in k.compile().ptx
    rebind(3.5)
    assert f32_hex(3.5) in k.compile().ptx


@pytest.mark.parametrize("helper", ["plain", "func"])
def test_helper_default_mutated_in_place(helper, tmp_path, cache_dir):
    decorator = "@ty.func\n" if helper == "func" else ""
    setup = f"{decorator}def helper(v, s=[2.5]):\n    return v * s[0]"
    m = import_file(tmp_path, scaled_kernel(setup, "1.0").replace("x[0] * 1.0", "helper(x[0])"), MODULE)
    first = m.k.compile()
    assert f32_hex(2.5) in first.ptx
    fn = m.helper.fn if helper == "func" else m.helper
    fn.__defaults__[0][0] = 3.5
    assert f32_hex(3.5) in m.k.compile().ptx  # in memory
    disk = fresh_kernel(m).compile()
    assert f32_hex(3.5) in disk.ptx and disk.cache_key != first.cache_key


def test_environment_read_while_tracing(tmp_path, cache_dir, monkeypatch):
    m = import_file(tmp_path, scaled_kernel("", "(3.5 if os.environ.get('STALENESS_SCALE') == 'big' else 2.5)"),
                    MODULE)
    monkeypatch.delenv("STALENESS_SCALE", raising=False)
    small = m.k.compile()
    assert f32_hex(2.5) in small.ptx
    monkeypatch.setenv("STALENESS_SCALE", "big")
    big = m.k.compile()
    assert f32_hex(3.5) in big.ptx and big.cache_key != small.cache_key
    hit = fresh_kernel(m).compile()
    assert hit.from_cache and f32_hex(3.5) in hit.ptx
    monkeypatch.delenv("STALENESS_SCALE")
    back = fresh_kernel(m).compile()
    assert back.from_cache and f32_hex(2.5) in back.ptx
    assert "environment variable STALENESS_SCALE" in capture.Read("env", "", "STALENESS_SCALE").describe()


def nested(depth: int, leaf: float):
    value = [leaf]
    for _ in range(depth - 1):
        value = [value]
    return value


def test_nested_value_is_keyed_by_content_to_depth_32(tmp_path, cache_dir):
    m = import_file(tmp_path, scaled_kernel("DEEP = None", "ty.cast(DEEP_LEAF(DEEP), ty.f32)")
                    .replace("DEEP = None", "DEEP = None\n\n\ndef DEEP_LEAF(v):\n    while isinstance(v, list):\n"
                                            "        v = v[0]\n    return v"), MODULE)
    m.DEEP = nested(30, 2.5)
    first = m.k.compile()
    assert f32_hex(2.5) in first.ptx
    innermost = m.DEEP
    while isinstance(innermost[0], list):
        innermost = innermost[0]
    innermost[0] = 3.5  # 30 levels down
    assert f32_hex(3.5) in m.k.compile().ptx
    assert f32_hex(3.5) in fresh_kernel(m).compile().ptx


def test_value_nested_beyond_depth_32_is_refused(tmp_path, cache_dir):
    m = import_file(tmp_path, scaled_kernel("DEEP = None", "DEEP[0][0]"), MODULE)
    m.DEEP = [[2.5]] + [nested(40, 1.0)]
    with pytest.raises(CaptureError, match=r"staleness_mod\.DEEP.* nested more than 32 levels deep"):
        m.k.compile()


def test_cyclic_value_is_keyed(tmp_path, cache_dir):
    m = import_file(tmp_path, scaled_kernel("CFG = {'scale': 2.5}\nCFG['self'] = CFG", "CFG['scale']"), MODULE)
    assert f32_hex(2.5) in m.k.compile().ptx
    m.CFG["scale"] = 3.5
    assert f32_hex(3.5) in fresh_kernel(m).compile().ptx


def test_long_list_mutated_in_place(tmp_path, cache_dir):
    setup = "TABLE = [1.0] * 10000\n\n\ndef last(v):\n    return v * TABLE[-1]"
    m = import_file(tmp_path, scaled_kernel(setup, "1.0").replace("x[0] * 1.0", "last(x[0])"), MODULE)
    first = m.k.compile()
    m.TABLE[-1] = 3.5  # read by a plain helper, far down a long list
    again = m.k.compile()
    assert f32_hex(3.5) in again.ptx
    disk = fresh_kernel(m).compile()
    assert disk.cache_key not in (first.cache_key,) and f32_hex(3.5) in disk.ptx
    assert len(capture.fingerprint(m.TABLE, "TABLE")) <= capture.LONG_FINGERPRINT  # hashed, not spelled out


def test_numpy_arrays_by_content(tmp_path, cache_dir):
    setup = "WEIGHTS = np.array([2.5, 1.0], dtype=np.float32)\nOBJECTS = np.array([2.5, 'a'], dtype=object)"
    m = import_file(tmp_path, scaled_kernel(setup, "(float(WEIGHTS[0]) * float(OBJECTS[0]))"), MODULE)
    assert f32_hex(6.25) in m.k.compile().ptx
    m.WEIGHTS[0] = 3.5
    assert f32_hex(8.75) in m.k.compile().ptx
    m.OBJECTS[0] = 1.0  # an object array: by its elements, not their addresses
    assert f32_hex(3.5) in m.k.compile().ptx
    assert f32_hex(3.5) in fresh_kernel(m).compile().ptx


# -- the emulator traces again under the same rule -----------------------------------------------------

def emulated(kernel) -> float:
    x = torch.full((1,), 2.0)
    kernel.emulate(x, grid=1)
    return float(x[0])


def test_emulate_sees_a_changed_global(tmp_path):
    m = import_file(tmp_path, scaled_kernel("SCALE = 2.5", "SCALE"), MODULE)
    assert emulated(m.k) == 5.0
    m.SCALE = 3.5
    assert emulated(m.k) == 7.0


def test_emulate_sees_a_rebound_closure(tmp_path):
    m = import_file(tmp_path, CLOSURE, MODULE)
    k, rebind = m.make(2.5)
    assert emulated(k) == 5.0
    rebind(3.5)
    assert emulated(k) == 7.0


def test_emulate_sees_tylopy_debug(tmp_path, monkeypatch):
    text = scaled_kernel("", "2.5").replace("    x[0] = x[0] * 2.5", "    ty.printf(\"seen %f\\n\", x[0])")
    m = import_file(tmp_path, text, MODULE)
    monkeypatch.delenv("TYLOPY_DEBUG", raising=False)
    x = torch.full((1,), 2.0)
    assert not m.k.emulate(x, grid=1, ctas=[(0, 0, 0)]).prints
    monkeypatch.setenv("TYLOPY_DEBUG", "1")
    assert m.k.emulate(x, grid=1, ctas=[(0, 0, 0)]).prints


def test_emulate_sees_an_environment_read(tmp_path, monkeypatch):
    m = import_file(tmp_path, scaled_kernel("", "(3.5 if os.environ.get('STALENESS_SCALE') == 'big' else 2.5)"),
                    MODULE)
    monkeypatch.delenv("STALENESS_SCALE", raising=False)
    assert emulated(m.k) == 5.0
    monkeypatch.setenv("STALENESS_SCALE", "big")
    assert emulated(m.k) == 7.0
