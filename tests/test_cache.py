"""The on-disk cache: what its key covers, what a corrupt entry does, and what ``cache_explain`` says.

Every test here gets an empty cache folder (the ``cache_dir`` fixture) and fresh Kernel objects,
so the in-memory cache of a Kernel never hides the disk.
"""
import importlib.util
import os
import sys

import pytest

from tylopy.jit import cache
from tylopy_kernels.examples.vector_add import vector_add

import kernels_for_tests as K
from conftest import fresh

SOURCE_V1 = '''\
import tylopy as ty


@ty.func
def combine(a, b):
    return a + b


@ty.kernel(threads=64)
def edited(x: ty.ptr(ty.f32), n: ty.i32):
    i = ty.thread_idx()
    if i < n:
        x[i] = combine(x[i], 1.0)
'''


def load_kernel_source(folder, text: str, module_name: str = "cache_edited_mod"):
    """Import ``text`` as a module file under a fixed module name; returns its kernel ``edited``."""
    path = folder / f"{module_name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module.edited


@pytest.fixture
def unload():
    yield
    sys.modules.pop("cache_edited_mod", None)


def differing(a: dict, b: dict) -> list[str]:
    return sorted(k for k in a if a[k] != b.get(k))


# -- the key ------------------------------------------------------------------------------------------

def base_key(kernel, constexprs=None):
    return cache.base_key(kernel, kernel._constexprs(constexprs or {}), kernel.options())


def test_key_changes_with_the_kernel_source(tmp_path, unload):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    v1 = load_kernel_source(tmp_path / "a", SOURCE_V1)
    key1, comps1 = base_key(v1)
    v2 = load_kernel_source(tmp_path / "b", SOURCE_V1.replace("x[i] = combine(x[i], 1.0)", "x[i] = combine(x[i], 2.0)"))
    key2, comps2 = base_key(v2)
    assert key1 != key2
    assert differing(comps1, comps2) == ["source"]


def test_key_changes_with_a_helper_source(tmp_path, unload, cache_dir):
    """The helper is read by the trace: its code is part of the key through the recorded read."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    v1 = load_kernel_source(tmp_path / "a", SOURCE_V1)
    v2 = load_kernel_source(tmp_path / "b", SOURCE_V1.replace("return a + b", "return a - b"))
    assert base_key(v1) == base_key(v2)  # the kernel's own code is the same
    ck1, ck2 = v1.compile(), v2.compile()
    assert ck1.cache_key != ck2.cache_key and not ck2.from_cache
    assert "sub" in ck2.ir_text and "sub" not in ck1.ir_text


def test_key_is_stable():
    assert base_key(vector_add) == base_key(fresh(vector_add))


def test_key_changes_with_a_constexpr():
    kernel = K.reverse_through_smem
    key1, comps1 = base_key(kernel)
    key2, comps2 = base_key(kernel, {"NBYTES": 32768})
    assert key1 != key2
    assert differing(comps1, comps2) == ["constexprs"]
    assert comps2["constexprs"] == {"NBYTES": "int:32768"}


def test_key_changes_with_the_arch():
    key1, comps1 = base_key(vector_add)
    key2, comps2 = base_key(vector_add.with_arch("sm_80"))
    assert key1 != key2
    assert differing(comps1, comps2) == ["options"]
    assert comps2["options"]["arch"] == "sm_80"


def test_key_covers_the_tools_and_options(monkeypatch):
    _, comps = base_key(vector_add)
    for part in ("tylopy", "llvmlite", "llvm", "ptxas", "launch_bounds", "options"):
        assert comps[part], part
    assert comps["ptxas"].startswith("V13"), comps["ptxas"]
    monkeypatch.setenv("TYLOPY_DEBUG_WAITS", "1")
    monkeypatch.setenv("TYLOPY_DEBUG_WAIT_SECONDS", "3")
    _, debug = base_key(vector_add)
    assert debug["options"]["debug_waits"] is True and debug["options"]["debug_wait_seconds"] == 3.0


# -- entries ------------------------------------------------------------------------------------------

def entry_files(cache_dir, key):
    return {ext: cache_dir / f"{key}.{ext}" for ext in ("json", "ptx", "cubin")}


def test_store_writes_a_complete_entry(cache_dir):
    ck = fresh(vector_add).compile()
    files = entry_files(cache_dir, ck.cache_key)
    assert all(p.exists() for p in files.values())
    assert not [p for p in os.listdir(cache_dir) if p.startswith(".tmp-")]


def test_warm_load_gives_identical_ptx(cache_dir):
    cold = fresh(vector_add).compile()
    warm = fresh(vector_add).compile()
    assert not cold.from_cache and warm.from_cache
    assert warm.ptx == cold.ptx
    assert warm.cubin == cold.cubin
    assert warm.report == cold.report
    assert warm.cache_key == cold.cache_key
    # The IR is retraced on demand; value ids are numbered per kernel, so the text is identical.
    assert warm.ir_text == cold.ir_text


def test_warm_load_keeps_dynamic_shared_size(cache_dir):
    cold = fresh(K.reverse_through_smem).compile()
    warm = fresh(K.reverse_through_smem).compile()
    assert warm.from_cache and warm.dynamic_shared_bytes == cold.dynamic_shared_bytes == 65536


@pytest.mark.parametrize("ext", ["cubin", "ptx", "json"])
def test_truncated_file_is_rebuilt_not_trusted(cache_dir, ext):
    cold = fresh(vector_add).compile()
    path = entry_files(cache_dir, cold.cache_key)[ext]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert cache.load(cold.cache_key) is None
    assert "corrupt" in fresh(vector_add).cache_explain()
    rebuilt = fresh(vector_add).compile()
    assert not rebuilt.from_cache
    assert rebuilt.ptx == cold.ptx and rebuilt.cubin == cold.cubin
    assert cache.load(cold.cache_key) is not None  # the rebuild rewrote the entry
    assert fresh(vector_add).compile().from_cache


def test_flipped_byte_is_rebuilt(cache_dir):
    cold = fresh(vector_add).compile()
    path = entry_files(cache_dir, cold.cache_key)["cubin"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    rebuilt = fresh(vector_add).compile()
    assert not rebuilt.from_cache and rebuilt.cubin == cold.cubin


def test_missing_file_is_rebuilt(cache_dir):
    cold = fresh(vector_add).compile()
    entry_files(cache_dir, cold.cache_key)["ptx"].unlink()
    assert not fresh(vector_add).compile().from_cache


def test_cache_can_be_turned_off(cache_dir, monkeypatch):
    monkeypatch.setenv("TYLOPY_CACHE", "0")
    fresh(vector_add).compile()
    assert not fresh(vector_add).compile().from_cache
    assert os.listdir(cache_dir) == []


# -- explain --------------------------------------------------------------------------------------------

def test_explain_empty_cache(cache_dir):
    assert fresh(vector_add).cache_explain().startswith("miss: no entry for kernel 'vector_add'")


def test_explain_hit(cache_dir):
    ck = fresh(vector_add).compile()
    assert fresh(vector_add).cache_explain() == f"hit: {ck.cache_key}"


def test_explain_names_the_constexpr(cache_dir):
    fresh(K.reverse_through_smem).compile(NBYTES=32768)
    text = fresh(K.reverse_through_smem).cache_explain(NBYTES=16384)
    assert text.startswith("miss: differs from the newest entry of 'reverse_through_smem' in constexprs (NBYTES)"), text


def test_explain_names_the_arch(cache_dir):
    fresh(vector_add).compile()
    text = vector_add.with_arch("sm_80").cache_explain()
    assert "options (arch)" in text, text
    assert "constexprs" not in text and "source" not in text


def test_explain_names_the_source(cache_dir, tmp_path, unload):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    load_kernel_source(tmp_path / "a", SOURCE_V1).compile()
    edited = load_kernel_source(tmp_path / "b", SOURCE_V1.replace("1.0)", "3.0)"))
    text = edited.cache_explain()
    assert "in source" in text, text
