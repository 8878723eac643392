"""The compile cache's trust model, from the outside: where it lives, which folders it refuses,
that entries are signed with the user's key (a planted or replayed entry is a miss, never run),
that reads are bounded (planted files cannot stall a compile), that dumps never follow a planted
symlink, and that the folder is pruned by size.
"""
import json
import os
import stat
import threading
import time

import pytest

from tylopy import cli
from tylopy.jit import cache, cachefs
from tylopy_kernels.examples.vector_add import vector_add

from conftest import fresh


@pytest.fixture
def own_key(tmp_path, monkeypatch):
    """A fresh per-user key folder for the test (the key is made on first use)."""
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setattr(cachefs, "_keys", {})
    monkeypatch.setattr(cachefs, "_warned", set())
    return config / "tylopy" / "cache.key"


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def entry(cache_dir):
    ck = fresh(vector_add).compile()
    return ck, cache_dir / f"{ck.cache_key}.json"


# -- location and folder trust -------------------------------------------------------------------------

def test_default_location_follows_xdg_cache_home(tmp_path, monkeypatch, own_key):
    monkeypatch.delenv("TYLOPY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cachefs.cache_dir() == str(tmp_path / "xdg" / "tylopy")
    assert mode(tmp_path / "xdg" / "tylopy") == 0o700
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cachefs.cache_dir() == str(tmp_path / "home" / ".cache" / "tylopy")
    assert mode(tmp_path / "home" / ".cache" / "tylopy") == 0o700


def test_key_file_is_made_private_on_first_use(cache_dir, own_key):
    fresh(vector_add).compile()
    assert own_key.exists() and mode(own_key) == 0o600 and mode(own_key.parent) == 0o700
    assert len(own_key.read_text().strip()) == 64


@pytest.mark.parametrize("problem", ["group-writable", "other-writable", "not-owned"])
def test_untrusted_folder_means_no_disk_cache_and_one_warning(problem, cache_dir, own_key, monkeypatch):
    if problem == "not-owned":
        uid = os.geteuid()
        monkeypatch.setattr(cachefs.os, "geteuid", lambda: uid + 1)
    else:
        os.chmod(cache_dir, 0o770 if problem == "group-writable" else 0o707)
    with pytest.warns(RuntimeWarning, match=f"not using the compile cache in {cache_dir}") as caught:
        first = fresh(vector_add).compile()
        second = fresh(vector_add).compile()
    assert len([w for w in caught if "not using the compile cache" in str(w.message)]) == 1
    assert not first.from_cache and not second.from_cache and first.ptx == second.ptx
    assert not [p for p in os.listdir(cache_dir) if p.endswith((".json", ".ptx", ".cubin"))]
    assert "not trusted" in fresh(vector_add).cache_explain()


def test_shared_folder_is_used_when_declared(cache_dir, own_key, monkeypatch):
    os.chmod(cache_dir, 0o777)
    monkeypatch.setenv("TYLOPY_CACHE_SHARED", "1")
    assert not fresh(vector_add).compile().from_cache
    assert fresh(vector_add).compile().from_cache


def test_key_readable_by_others_is_refused(cache_dir, own_key):
    fresh(vector_add).compile()
    os.chmod(own_key, 0o644)
    cachefs._keys.clear()
    with pytest.warns(RuntimeWarning, match=r"cache key .* cannot be used \(others may read it"):
        assert not fresh(vector_add).compile().from_cache


# -- signed entries --------------------------------------------------------------------------------------

def test_planted_cubin_with_fixed_up_hash_is_not_loaded(cache_dir, own_key):
    """The attack: replace the cubin and rewrite the hash beside it. The MAC no longer matches."""
    ck, meta_path = entry(cache_dir)
    cubin = cache_dir / f"{ck.cache_key}.cubin"
    evil = b"\x7fELF planted" + os.urandom(64)
    cubin.write_bytes(evil)
    data = meta_path.read_bytes()
    head, _, payload = data.partition(b"\n")
    meta = json.loads(payload)
    meta["cubin_sha256"] = cache._sha(evil)
    meta_path.write_bytes(head + b"\n" + json.dumps(meta, sort_keys=True, indent=1).encode())
    assert cache.load(ck.cache_key) is None
    assert "untrusted" in fresh(vector_add).cache_explain()
    again = fresh(vector_add).compile()
    assert not again.from_cache and again.cubin == ck.cubin


def test_entry_signed_with_another_key_is_untrusted(cache_dir, own_key, tmp_path, monkeypatch):
    ck, meta_path = entry(cache_dir)
    payload = cachefs.unseal(meta_path.name, meta_path.read_bytes())
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "attacker"))
    cachefs._keys.clear()
    forged = cachefs.seal(meta_path.name, payload)  # a valid MAC, under the attacker's own key
    monkeypatch.setenv("XDG_CONFIG_HOME", str(own_key.parent.parent))
    cachefs._keys.clear()
    meta_path.write_bytes(forged)
    assert cache.load(ck.cache_key) is None
    assert "untrusted" in fresh(vector_add).cache_explain()


def test_signed_entry_replayed_under_another_name_is_untrusted(cache_dir, own_key):
    ck, meta_path = entry(cache_dir)
    other = "0" * 32
    for ext in ("json", "ptx", "cubin"):
        (cache_dir / f"{other}.{ext}").write_bytes((cache_dir / f"{ck.cache_key}.{ext}").read_bytes())
    assert cache.load(other) is None  # the MAC covers the file name
    assert cache.load(ck.cache_key) is not None


def test_plain_json_entry_is_untrusted(cache_dir, own_key):
    ck, meta_path = entry(cache_dir)
    payload = cachefs.unseal(meta_path.name, meta_path.read_bytes())
    meta_path.write_bytes(payload)  # the format of older versions: no MAC line
    assert cache.load(ck.cache_key) is None


# -- bounded reads: planted files cannot stall a compile ------------------------------------------------

def compile_within(seconds: float):
    result = {}

    def run():
        result["ck"] = fresh(vector_add).compile()
    t = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"the compile took more than {seconds} s"
    return result["ck"], time.monotonic() - start


@pytest.mark.parametrize("plant", ["huge-manifest", "fifo-meta", "fifo-manifest", "symlink-meta"])
def test_planted_files_do_not_stall_a_compile(plant, cache_dir, own_key, tmp_path):
    ck, meta_path = entry(cache_dir)
    base, _ = cache.base_key(vector_add, {}, vector_add.options())
    manifest = cache_dir / f"{base}.reads.json"
    if plant == "huge-manifest":
        recipe = [["global", "tylopy_kernels.examples.vector_add", f"N{i}"] for i in range(40)]
        manifest.write_text(json.dumps([recipe] * 3000))  # ~4 MB
        meta_path.unlink()
    elif plant.startswith("fifo"):
        target = meta_path if plant == "fifo-meta" else manifest
        target.unlink()
        os.mkfifo(target)
    else:
        secret = tmp_path / "secret.json"
        secret.write_bytes(meta_path.read_bytes())
        meta_path.unlink()
        meta_path.symlink_to(secret)
    again, took = compile_within(30)
    assert took < 10 and again.ptx == ck.ptx and not again.from_cache
    assert not meta_path.is_symlink() and fresh(vector_add).compile().from_cache  # rebuilt over the planted file


def test_oversized_metadata_is_not_read(cache_dir, own_key):
    ck, meta_path = entry(cache_dir)
    meta_path.write_bytes(cachefs.seal(meta_path.name, b" " * (cachefs.MAX_META_BYTES + 1)))
    assert cache.load(ck.cache_key) is None


# -- dumps never follow planted symlinks ---------------------------------------------------------------

def test_dump_replaces_a_planted_symlink(cache_dir, own_key, tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    dump.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    ck = fresh(vector_add).compile()
    for ext in ("ptx", "report.txt", "ll"):
        (dump / f"{ck.name}-{ck.cache_key[:12]}.{ext}").symlink_to(victim)
    monkeypatch.setenv("TYLOPY_DUMP_DIR", str(dump))
    fresh(vector_add).compile()
    assert victim.read_text() == "precious"
    ptx = dump / f"{ck.name}-{ck.cache_key[:12]}.ptx"
    assert not ptx.is_symlink() and ".entry vector_add" in ptx.read_text()


def test_dump_folder_that_cannot_be_written_warns(cache_dir, own_key, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TYLOPY_DUMP_DIR", str(blocker / "sub"))
    with pytest.warns(RuntimeWarning, match="TYLOPY_DUMP_DIR"):
        assert fresh(vector_add).compile().ptx


# -- size ------------------------------------------------------------------------------------------------

def fake_entries(folder, count: int, size: int) -> list[str]:
    keys = []
    for i in range(count):
        key = f"{i:032x}"
        for ext in ("ptx", "json"):
            p = folder / f"{key}.{ext}"
            p.write_bytes(b"x" * size)
            os.utime(p, (1000.0 + i, 1000.0 + i))  # entry i last used at 1000 + i
        keys.append(key)
    return keys


def test_prune_removes_least_recently_used_first(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    keys = fake_entries(folder, 5, 1000)
    removed, freed, left = cachefs.prune(str(folder), 6000)
    assert (removed, freed, left) == (2, 4000, 6000)
    assert sorted(p.name[:32] for p in folder.iterdir()) == sorted(keys[2:] * 2)


def test_cli_prune(cache_dir, own_key, capsys):
    fake_entries(cache_dir, 4, 1000)
    assert cli.main(["cache", "prune", "--max-size", "3K"]) == 0
    assert "removed 3 entries (6000 bytes)" in capsys.readouterr().out
    assert cli.main(["cache", "prune", "--max-size", "lots"]) == 2
    assert "--max-size expects a size such as 500M, 2G or a number of bytes, but got 'lots'" in capsys.readouterr().err
    assert cli.main(["cache", "prune"]) == 2
    assert "cache prune expects --max-size SIZE" in capsys.readouterr().err


def test_size_cap_applies_after_each_store(cache_dir, own_key, monkeypatch):
    fake_entries(cache_dir, 3, 100_000)
    monkeypatch.setenv("TYLOPY_CACHE_MAX_SIZE", "150K")
    ck = fresh(vector_add).compile()
    names = os.listdir(cache_dir)
    assert f"{ck.cache_key}.json" in names and not [n for n in names if n.startswith("0" * 31)]
    assert fresh(vector_add).compile().from_cache


def test_hit_refreshes_the_entry_time(cache_dir, own_key):
    ck, meta_path = entry(cache_dir)
    os.utime(meta_path, (1000.0, 1000.0))
    assert fresh(vector_add).compile().from_cache
    assert meta_path.stat().st_mtime > 1000.0
