"""The on-disk cache of compiled specializations, and the dump-everything debug hook.

A specialization's key has two parts:

* the **base key**, a SHA-256 over named components known before tracing: the kernel's name,
  signature and source (the content of its module's file), the constexpr values, the launch
  bounds, the compile options (arch, debug switches, noalias policy), tylopy's own source
  hash, and the llvmlite, LLVM and ptxas versions;
* the **reads**: every value the trace read from outside the kernel (``capture.py``) as a
  recipe to find it again plus its fingerprint.

The full key hashes both. Each base key has a manifest listing the read recipes of the
entries stored under it; a lookup resolves each recipe set against the current process,
fingerprints the values it finds and looks for the entry under the resulting full key. A
changed value gives a different key, never a stale kernel. Entries are written to a
temporary name and renamed (atomic on POSIX), metadata last; an entry whose hashes do not
match its metadata, or whose files cannot be parsed, is treated as absent and rebuilt. A cache
path that is a file, or a folder that cannot be created, is an error (``CacheUnavailable``,
naming ``TYLOPY_CACHE_DIR`` and ``TYLOPY_CACHE=0``); a folder that can be read but not written
serves what it has and warns once that new entries are not stored.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass

from ..codegen.ptxas import PtxasReport, ptxas_version
from ..errors import TylopyError
from ..ir.values import WaitSite
from . import capture

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT = 2
MAX_META_BYTES = 1 << 22  # a metadata file larger than this is not ours


class CacheUnavailable(TylopyError, OSError):
    """The cache folder cannot be used (a file is in the way, it cannot be created)."""


_warned: set = set()


def cache_dir() -> str:
    """$TYLOPY_CACHE_DIR or ~/.cache/tylopy, created if needed; ``CacheUnavailable`` if that fails."""
    d = os.environ.get("TYLOPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tylopy")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise CacheUnavailable(f"the compile cache folder {d} cannot be created ({e.strerror or e}); "
                               "set TYLOPY_CACHE_DIR to a writable folder, or TYLOPY_CACHE=0") from None
    if not os.path.isdir(d):
        raise CacheUnavailable(f"the compile cache path {d} is not a folder; set TYLOPY_CACHE_DIR to a writable "
                               "folder, or TYLOPY_CACHE=0")
    return d


def enabled() -> bool:
    return os.environ.get("TYLOPY_CACHE", "1") != "0"


@functools.lru_cache(maxsize=None)
def tylopy_source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(_PKG, "**", "*.py"), recursive=True)):
        h.update(os.path.relpath(path, _PKG).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _tool_versions() -> dict:
    import llvmlite
    import llvmlite.binding as llvm
    return {"llvmlite": llvmlite.__version__, "llvm": ".".join(map(str, llvm.llvm_version_info)),
            "ptxas": ptxas_version()}


def base_key(kernel, constexprs: dict, options) -> tuple[str, dict]:
    """The key part known before tracing, and its named components (for ``explain``)."""
    bounds = kernel._launch_bounds(constexprs)
    components = {
        "format": FORMAT,
        "kernel": kernel.name,
        "signature": [f"{n}: {k!r}" for n, k, _ in kernel.signature],
        "source": f"{kernel.fn.__qualname__} {capture.code_digest(kernel.fn.__code__)}",
        "constexprs": {k: capture.fingerprint(v, f"constexpr {k}", kernel.name) for k, v in sorted(constexprs.items())},
        "launch_bounds": [bounds.max_threads, bounds.min_blocks_per_sm, bounds.max_registers],
        "options": options.key(),
        "tylopy": tylopy_source_hash(),
        **_tool_versions(),
    }
    blob = json.dumps(components, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32], components


def full_key(base: str, reads: list) -> str:
    blob = json.dumps([base, reads], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


@dataclass
class Entry:
    ptx: str
    cubin: bytes | None
    report: PtxasReport
    dynamic_shared_bytes: int
    wait_sites: tuple = ()


def _paths(d: str, key: str):
    return os.path.join(d, key + ".json"), os.path.join(d, key + ".ptx"), os.path.join(d, key + ".cubin")


def _manifest_path(d: str, base: str) -> str:
    return os.path.join(d, base + ".reads.json")


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _read_json(path: str):
    """Parse one of our JSON files; None when absent, too large or not valid (including NaN/Infinity)."""
    try:
        if os.path.getsize(path) > MAX_META_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return json.loads(text, parse_constant=_reject_constant)
    except (OSError, ValueError, RecursionError, UnicodeDecodeError):
        return None


def _reject_constant(name):
    raise ValueError(f"non-finite number {name} in a cache file")


def load(key: str) -> Entry | None:
    if not enabled():
        return None
    d = cache_dir()
    meta_p, ptx_p, cubin_p = _paths(d, key)
    meta = _read_json(meta_p)
    if not isinstance(meta, dict):
        return None
    try:
        with open(ptx_p, "rb") as f:
            ptx = f.read()
        if _sha(ptx) != meta["ptx_sha256"]:
            return None
        cubin = None
        if meta.get("cubin_sha256"):
            with open(cubin_p, "rb") as f:
                cubin = f.read()
            if _sha(cubin) != meta["cubin_sha256"]:
                return None
        rep = meta["report"]
        report = PtxasReport(**{k: (tuple(v) if k == "warnings" else v) for k, v in rep.items()})
        sites = tuple(WaitSite(str(a), str(b)) for a, b in meta.get("wait_sites", []))
        smem = meta["dynamic_shared_bytes"]
        if isinstance(smem, bool) or not isinstance(smem, int) or not 0 <= smem <= 1 << 20:
            return None
        return Entry(ptx.decode(), cubin, report, smem, sites)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent or corrupt: rebuild


def _manifest(d: str, base: str) -> list:
    """The read-recipe sets stored under ``base`` (each a list of [kind, owner, name])."""
    data = _read_json(_manifest_path(d, base))
    if not isinstance(data, list):
        return []
    out = []
    for recipe in data:
        if isinstance(recipe, list) and all(isinstance(r, list) and len(r) == 3 and all(isinstance(x, str) for x in r)
                                            for r in recipe):
            out.append([capture.Read(*r) for r in recipe])
    return out


def _resolve_recipe(recipe, closure: dict):
    """[(Read, current value, fingerprint)] for a recipe, or None when a read cannot be resolved."""
    out = []
    try:
        for r in recipe:
            value = capture.resolve(r, closure)
            out.append((r, value, capture.fingerprint(value, r.describe())))
    except (capture.Unresolvable, capture.CaptureError):
        return None
    return out


def _key_of(base: str, resolved) -> str:
    return full_key(base, [[*r.as_json(), fp] for r, _, fp in resolved])


def lookup(base: str, kernel_fn):
    """(full key, entry, [(Read, value, fingerprint)]) of the entry whose recorded reads have the
    same values now, or None."""
    if not enabled():
        return None
    d = cache_dir()
    closure = _closure_of(kernel_fn)
    for recipe in _manifest(d, base):
        resolved = _resolve_recipe(recipe, closure)
        if resolved is None:
            continue
        key = _key_of(base, resolved)
        entry = load(key)
        if entry is not None:
            return key, entry, resolved
    return None


def _atomic_write(path: str, data: bytes):
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def store(key: str, base: str, components: dict, reads: list, ck) -> None:
    if not enabled():
        return
    d = cache_dir()
    meta_p, ptx_p, cubin_p = _paths(d, key)
    ptx = ck.ptx.encode()
    rep = ck.report
    meta = {
        "components": components, "base_key": base, "reads": reads, "ptx_sha256": _sha(ptx),
        "cubin_sha256": _sha(ck.cubin) if ck.cubin else None,
        "dynamic_shared_bytes": ck.dynamic_shared_bytes,
        "wait_sites": [[s.label, s.where] for s in ck.wait_sites],
        "report": {k: getattr(rep, k) for k in ("available", "arch", "registers", "spill_stores", "spill_loads",
                                                "stack_frame", "shared_bytes", "barriers", "warnings", "note", "log")},
    }
    recipe = [r[:3] for r in reads]
    try:
        _atomic_write(ptx_p, ptx)
        if ck.cubin:
            _atomic_write(cubin_p, ck.cubin)
        _atomic_write(meta_p, json.dumps(meta, sort_keys=True, indent=1).encode())  # last: marks the entry complete
        recipes = [[r.as_json() for r in rs] for rs in _manifest(d, base)]
        if recipe not in recipes:
            recipes = [recipe] + recipes[:15]
            _atomic_write(_manifest_path(d, base), json.dumps(recipes).encode())
    except OSError as e:
        if str(e) not in _warned:  # a read-only or full cache folder must not break compilation
            _warned.add(str(e))
            warnings.warn(f"tylopy: cannot write the compile cache in {d} ({e}); compiling without it",
                          RuntimeWarning, stacklevel=3)


def explain(kernel, constexprs: dict, options) -> str:
    """Whether this specialization would hit the disk cache, and if not, which component differs."""
    base, comps = base_key(kernel, constexprs, options)
    if not enabled():
        return "miss: the disk cache is off (TYLOPY_CACHE=0)"
    d = cache_dir()
    found = lookup(base, kernel.fn)
    if found is not None:
        return f"hit: {found[0]}"
    closure = _closure_of(kernel.fn)
    for recipe in _manifest(d, base):
        resolved = _resolve_recipe(recipe, closure)
        if resolved is None:
            continue
        key = _key_of(base, resolved)
        if any(os.path.exists(p) for p in _paths(d, key)):
            return f"miss: entry {key} exists but is corrupt (unreadable or a hash mismatch); it will be rebuilt"
    metas = []
    for p in glob.glob(os.path.join(d, "*.json")):
        if p.endswith(".reads.json"):
            continue
        meta = _read_json(p)
        if isinstance(meta, dict) and isinstance(meta.get("components"), dict) and \
                meta["components"].get("kernel") == kernel.name:
            metas.append((os.path.getmtime(p), meta))
    if not metas:
        return f"miss: no entry for kernel {kernel.name!r} in {d}"
    metas.sort(key=lambda x: x[0], reverse=True)
    same_base = [m for _, m in metas if m.get("base_key") == base]
    if same_base:
        return "miss: " + _reads_diff(same_base[0].get("reads") or [], kernel.fn)
    other = metas[0][1]["components"]
    details = []
    for k in sorted(comps):
        if comps[k] == other.get(k):
            continue
        if isinstance(comps[k], dict) and isinstance(other.get(k), dict):
            sub = [s for s in sorted(set(comps[k]) | set(other[k])) if comps[k].get(s) != other[k].get(s)]
            details.append(f"{k} ({', '.join(sub)})")
        else:
            details.append(f"{k}: {other.get(k)!r} -> {comps[k]!r}")
    return f"miss: differs from the newest entry of {kernel.name!r} in " + "; ".join(details)


def _closure_of(fn) -> dict:
    return {name: c.cell_contents for name, c in zip(fn.__code__.co_freevars, fn.__closure__ or ())
            if capture._cell_filled(c)}


def _reads_diff(reads: list, kernel_fn) -> str:
    closure = _closure_of(kernel_fn)
    for item in reads:
        if not (isinstance(item, list) and len(item) == 4):
            continue
        r = capture.Read(*item[:3])
        try:
            now = capture.fingerprint(capture.resolve(r, closure), r.describe())
        except (capture.Unresolvable, capture.CaptureError):
            return f"the value the trace read from {r.describe()} is not there any more"
        if now != item[3]:
            return f"the value the trace read from {r.describe()} changed: {_short(item[3])} -> {_short(now)}"
    return "the entry's files are missing or corrupt; it will be rebuilt"


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def maybe_dump(ck) -> None:
    """With TYLOPY_DUMP_DIR set, write every compiled kernel's PTX, LLVM IR and report there."""
    d = os.environ.get("TYLOPY_DUMP_DIR")
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    stem = os.path.join(d, f"{ck.name}-{ck.cache_key[:12]}")
    with open(stem + ".ptx", "w") as f:
        f.write(ck.ptx)
    with open(stem + ".report.txt", "w") as f:
        f.write(str(ck.report) + "\n")
    if ck._llvm_ir is not None:
        with open(stem + ".ll", "w") as f:
            f.write(ck._llvm_ir)
