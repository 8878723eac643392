"""Hostile inputs against the compile cache: every value a trace reads from outside the kernel is
part of the key by value, so an edit never loads stale PTX, and an equal value always hits.

Each "process" here is a fresh import of the kernel's module (same module name, new file) and a
fresh Kernel object, so nothing in memory carries over; one test runs real separate processes.
"""
import os
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

import tylopy as ty
from tylopy.jit import cache
from tylopy.errors import CaptureError, CompileOptionError

MODULE = "hostile_cache_mod"
_counter = iter(range(10**6))


def f32_hex(v: float) -> str:
    return "0f" + struct.pack(">f", v).hex().upper()


def load(tmp_path, text: str, name: str = MODULE, extra: dict | None = None):
    """Write ``text`` (and ``extra`` modules) into a new folder and import it as ``name``."""
    folder = tmp_path / f"v{next(_counter)}"
    folder.mkdir()
    for mod, src in (extra or {}).items():
        (folder / f"{mod}.py").write_text(textwrap.dedent(src))
        sys.modules.pop(mod, None)
    (folder / f"{name}.py").write_text(textwrap.dedent(text))
    sys.modules.pop(name, None)
    sys.path.insert(0, str(folder))
    try:
        import importlib
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(autouse=True)
def forget_modules():
    yield
    for name in (MODULE, "hostile_consts"):
        sys.modules.pop(name, None)


def compiled_scale(module) -> tuple:
    ck = module.k.compile()
    return ck, ck.ptx


HEADER = """\
import types
import tylopy as ty
"""

CASES = {
    "list": ("SCALE = [{v}]", "x[0] = x[0] * SCALE[0]"),
    "dict": ("PARAMS = {{'scale': {v}}}", "x[0] = x[0] * PARAMS['scale']"),
    "namespace": ("CFG = types.SimpleNamespace(scale={v})", "x[0] = x[0] * CFG.scale"),
    "helper_in_dict": ("def helper(v):\n    return v * {v}\nOPS = {{'f': helper}}", "x[0] = OPS['f'](x[0])"),
    "helper_in_class": ("class Ops:\n    @staticmethod\n    def f(v):\n        return v * {v}", "x[0] = Ops.f(x[0])"),
    "func_in_dict": ("@ty.func\ndef helper(v):\n    return v * {v}\nOPS = {{'f': helper}}", "x[0] = OPS['f'](x[0])"),
    "plain_helper_global": ("FACTOR = {v}\ndef helper(v):\n    return v * FACTOR", "x[0] = helper(x[0])"),
}


def kernel_source(case: str, value: float) -> str:
    setup, body = CASES[case]
    return HEADER + setup.format(v=value) + f"""

@ty.kernel(threads=32)
def k(x: ty.ptr(ty.f32)):
    {body}
"""


@pytest.mark.parametrize("case", sorted(CASES))
def test_edited_value_is_never_served_stale(case, tmp_path, cache_dir):
    v1 = load(tmp_path, kernel_source(case, 2.5))
    ck1, ptx1 = compiled_scale(v1)
    assert f32_hex(2.5) in ptx1
    v2 = load(tmp_path, kernel_source(case, 3.5))
    assert v2.k.cache_explain().startswith("miss")
    ck2, ptx2 = compiled_scale(v2)
    assert not ck2.from_cache and f32_hex(3.5) in ptx2 and f32_hex(2.5) not in ptx2
    again = load(tmp_path, kernel_source(case, 2.5))  # the old value again: the old entry
    ck3 = again.k.compile()
    assert ck3.from_cache and ck3.ptx == ptx1


def test_explain_names_the_value_that_changed(tmp_path, cache_dir):
    load(tmp_path, kernel_source("list", 2.5)).k.compile()
    text = load(tmp_path, kernel_source("list", 3.5)).k.cache_explain()
    assert "the value the trace read from hostile_cache_mod.SCALE changed" in text, text


@pytest.mark.parametrize("case", ["list", "dict", "namespace", "plain_helper_global"])
def test_value_changed_in_memory_recompiles(case, tmp_path, cache_dir):
    m = load(tmp_path, kernel_source(case, 2.5))
    assert f32_hex(2.5) in m.k.compile().ptx
    if case == "list":
        m.SCALE[0] = 3.5
    elif case == "dict":
        m.PARAMS["scale"] = 3.5
    elif case == "namespace":
        m.CFG.scale = 3.5
    else:
        m.FACTOR = 3.5
    assert f32_hex(3.5) in m.k.compile().ptx  # the launch path sees it too


DTYPE_SOURCE = HEADER + """
DT = ty.{dt}


@ty.kernel(threads=32)
def k(x: ty.ptr(ty.f32)):
    x[0] = ty.cast(ty.cast(x[0], DT), ty.f32)
"""


def test_dtype_global_changed(tmp_path, cache_dir):
    f32 = load(tmp_path, DTYPE_SOURCE.format(dt="f32")).k.compile()
    bf16 = load(tmp_path, DTYPE_SOURCE.format(dt="bf16")).k.compile()
    assert not bf16.from_cache and bf16.cache_key != f32.cache_key
    assert "bf16" in bf16.ptx and "bf16" not in f32.ptx


IMPORTING = HEADER + """
import hostile_consts as C
from hostile_consts import K


@ty.kernel(threads=32)
def k(x: ty.ptr(ty.f32)):
    x[0] = x[0] * K + x[1] * C.J
"""


def test_constant_imported_from_another_module(tmp_path, cache_dir):
    consts = "K = {k}\nJ = {j}\n"
    a = load(tmp_path, IMPORTING, extra={"hostile_consts": consts.format(k=2.5, j=4.5)}).k.compile()
    b = load(tmp_path, IMPORTING, extra={"hostile_consts": consts.format(k=3.5, j=4.5)}).k.compile()
    c = load(tmp_path, IMPORTING, extra={"hostile_consts": consts.format(k=2.5, j=5.5)}).k.compile()
    assert len({a.cache_key, b.cache_key, c.cache_key}) == 3
    assert f32_hex(3.5) in b.ptx and f32_hex(5.5) in c.ptx


CLOSURE_SOURCE = HEADER + """
def make():
    scale = 2.5

    @ty.kernel(threads=32)
    def k(x: ty.ptr(ty.f32)):
        x[0] = x[0] * scale

    def rebind(v):
        nonlocal scale
        scale = v
    return k, rebind


k, rebind = make()
"""


def test_closure_traced_then_rebound_then_compiled(tmp_path, cache_dir):
    m = load(tmp_path, CLOSURE_SOURCE)
    m.k.trace()  # traced with 2.5 ...
    m.rebind(3.5)
    ck = m.k.compile()  # ... compiled with 3.5: the PTX and the key are 3.5's
    assert f32_hex(3.5) in ck.ptx and f32_hex(2.5) not in ck.ptx
    fresh = load(tmp_path, CLOSURE_SOURCE)
    fresh.rebind(3.5)
    assert fresh.k.compile().from_cache and fresh.k.compile().ptx == ck.ptx
    m.rebind(2.5)
    assert f32_hex(2.5) in m.k.compile().ptx


FUNC_CONSTEXPR = HEADER + """
def triple(v):
    return v * 3.5


@ty.kernel(threads=32)
def k(x: ty.ptr(ty.f32), F: ty.constexpr):
    x[0] = F(x[0])
"""


def test_function_constexpr_hits_the_cache_by_value(tmp_path, cache_dir):
    m1 = load(tmp_path, FUNC_CONSTEXPR)
    ck1 = m1.k.compile(F=m1.triple)
    m2 = load(tmp_path, FUNC_CONSTEXPR)
    ck2 = m2.k.compile(F=m2.triple)
    assert ck2.from_cache and ck2.cache_key == ck1.cache_key
    _, comps = cache.base_key(m2.k, {"F": m2.triple}, m2.k.options())
    assert "0x" not in repr(comps["constexprs"])  # no memory address in the key


def test_function_constexpr_key_is_the_same_in_another_process(tmp_path):
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(FUNC_CONSTEXPR)
    script = (f"import sys; sys.path.insert(0, {str(folder)!r}); import {MODULE} as m; "
              "from tylopy.jit import cache; print(cache.base_key(m.k, {'F': m.triple}, m.k.options())[0])")
    keys = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                           check=True).stdout.strip() for _ in range(2)}
    assert len(keys) == 1 and len(keys.pop()) == 32


def test_edited_list_in_separate_processes(tmp_path):
    folder, cache_folder = tmp_path / "src", tmp_path / "cache"
    folder.mkdir()
    script = (f"import sys; sys.path.insert(0, {str(folder)!r}); import {MODULE} as m; "
              "ck = m.k.compile(); print(ck.from_cache, ck.ptx.count(sys.argv[1]))")
    env = dict(os.environ, TYLOPY_CACHE_DIR=str(cache_folder))

    def run(value, expect_hex):
        (folder / f"{MODULE}.py").write_text(kernel_source("list", value))
        out = subprocess.run([sys.executable, "-c", script, expect_hex], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert run(2.5, f32_hex(2.5)) == ["False", "1"]
    assert run(3.5, f32_hex(3.5)) == ["False", "1"]  # edited: recompiled, not the 2.5 entry
    assert run(2.5, f32_hex(2.5)) == ["True", "1"]


def test_debug_wait_seconds_is_part_of_the_key(monkeypatch, cache_dir):
    from tylopy_kernels.examples.vector_add import vector_add
    monkeypatch.setenv("TYLOPY_DEBUG_WAITS", "1")
    monkeypatch.setenv("TYLOPY_DEBUG_WAIT_SECONDS", "1")
    a = vector_add.compile()
    _, before = cache.base_key(vector_add, {}, vector_add.options())
    monkeypatch.setenv("TYLOPY_DEBUG_WAIT_SECONDS", "3")
    b = vector_add.compile()  # the launch path notices the environment changed
    assert a.cache_key != b.cache_key and b.options.debug_wait_seconds == 3.0
    _, after = cache.base_key(vector_add, {}, vector_add.options())
    assert [k for k in before if before[k] != after[k]] == ["options"]
    monkeypatch.setenv("TYLOPY_DEBUG_WAIT_SECONDS", "1")
    assert vector_add.compile() is a


@pytest.mark.parametrize("raw", ["abc", "nan", "0", "-1", "1e9"])
def test_bad_debug_wait_seconds_is_an_option_error(raw, monkeypatch):
    from tylopy_kernels.examples.vector_add import vector_add
    monkeypatch.setenv("TYLOPY_DEBUG_WAIT_SECONDS", raw)
    with pytest.raises(CompileOptionError, match="TYLOPY_DEBUG_WAIT_SECONDS expects"):
        ty.Kernel(vector_add.fn, 256, _register=False).compile()


UNHASHABLE = HEADER + """
import threading
LOCK = threading.Lock()


@ty.kernel(threads=32)
def k(x: ty.ptr(ty.f32)):
    if LOCK.locked():
        x[0] = 1.0
"""


def test_value_that_cannot_be_keyed_is_an_error_naming_it(tmp_path, cache_dir):
    m = load(tmp_path, UNHASHABLE)
    with pytest.raises(CaptureError) as info:
        m.k.compile()
    assert "hostile_cache_mod.LOCK" in str(info.value) and "__tylopy_fingerprint__" in info.value.hint
    assert info.value.loc is not None and info.value.loc.lineno == 10  # the line that read it


def test_equal_values_share_an_entry(tmp_path, cache_dir):
    a = load(tmp_path, kernel_source("namespace", 2.5)).k.compile()
    b = load(tmp_path, kernel_source("namespace", 2.5)).k.compile()
    assert b.from_cache and a.cache_key == b.cache_key
    assert threading.current_thread()  # (the module imports threading for the case above)


ARRAY = HEADER + """
import numpy as np
TABLE = np.array([2.5, 4.5], dtype=np.float32)


@ty.kernel(threads=32)
def k(x: ty.ptr(ty.f32)):
    x[0] = x[0] * float(TABLE[0])
"""


def test_numpy_array_global_changed_in_memory_and_on_disk(tmp_path, cache_dir):
    m = load(tmp_path, ARRAY)
    assert f32_hex(2.5) in m.k.compile().ptx
    m.TABLE[0] = 3.5
    assert f32_hex(3.5) in m.k.compile().ptx
    again = load(tmp_path, ARRAY)  # a new process sees the file's 2.5: the first entry
    assert again.k.compile().from_cache and f32_hex(2.5) in again.k.compile().ptx


ATTRIBUTE_SOURCE = HEADER + """
import hostile_consts as hc


@ty.kernel(threads=32)
def k(x: ty.ptr(ty.f32)):
    x[0] = x[0] * hc.box.scale + hc.SHIFT
"""


def test_an_attribute_read_through_a_module_is_guarded(tmp_path, cache_dir):
    """The launch path's generated check (``Guards.valid``) agrees with the loop it replaces when
    an attribute the trace read through another module is edited, removed or put back."""
    consts = {"hostile_consts": "import types\nbox = types.SimpleNamespace(scale=2.5)\nSHIFT = 1.0\n"}
    m = load(tmp_path, ATTRIBUTE_SOURCE, extra=consts)
    ck = m.k.compile()
    guards = ck._guards
    assert guards.valid() and guards.checked_one_by_one()
    hc = sys.modules["hostile_consts"]
    hc.box.scale = 3.5
    assert not guards.valid() and not guards.checked_one_by_one()
    assert f32_hex(3.5) in m.k.compile().ptx
    hc.box.scale = 2.5  # an equal value, another float object: identity says changed, compile() says equal
    assert guards.valid() == guards.checked_one_by_one()
    assert m.k.compile().ptx == ck.ptx
    del hc.box
    assert not guards.valid() and not guards.checked_one_by_one()  # gone: changed, never an exception
    hc.box = __import__("types").SimpleNamespace(scale=2.5)
    ck = m.k.compile()
    guards = ck._guards
    assert guards.valid() and guards.checked_one_by_one()
    hc.SHIFT = 2.0
    assert not guards.valid() and not guards.checked_one_by_one()
