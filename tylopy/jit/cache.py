"""The on-disk cache of compiled specializations, and the dump-everything debug hook.

A specialization's key has two parts:

* the **base key**, a SHA-256 over named components known before tracing: the kernel's name,
  signature, compiled code and the digest of the source text it is traced from, the constexpr
  values, the launch bounds, the compile options (arch, debug switches, noalias policy), tylopy's
  own source hash, and the llvmlite, LLVM and ptxas versions;
* the **reads**: every value the trace read from outside the kernel (``capture.py``: globals,
  globals found unbound, closure variables, attributes, environment variables) as a recipe to
  find it again plus its fingerprint.

The full key hashes both. Each base key has a manifest listing the read recipes of the
entries stored under it; a lookup resolves each recipe set against the current process,
fingerprints the values it finds and looks for the entry under the resulting full key. A
changed value gives a different key, never a stale kernel. Entries are written to a
temporary name and renamed (atomic on POSIX), metadata last. Metadata and manifests are signed
(``cachefs.py``: HMAC under a per-user key, folder trust checks, bounded non-blocking reads);
an unsigned or corrupt file, a schema violation, or a hash mismatch is treated as absent and
rebuilt. A cache path that is a file, or a folder that cannot be created, is an error
(``CacheUnavailable``, naming ``TYLOPY_CACHE_DIR`` and ``TYLOPY_CACHE=0``); a folder that can be
read but not written serves what it has and warns once that new entries are not stored.
docs/cache.md is the user's view.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
from dataclasses import dataclass

from ..codegen.ptxas import PtxasReport, ptxas_version
from ..ir.values import WaitSite
from ..language import capture
from . import cachefs
from .cachefs import CacheUnavailable, cache_dir  # noqa: F401 - part of this module's interface

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT = 3
MAX_META_BYTES = cachefs.MAX_META_BYTES
MAX_RECIPES = 16  # read-recipe sets kept per base key
MAX_READS = 4096  # reads in one recipe
READ_KINDS = ("global", "closure", "attr", "env", "unbound")
EXPLAIN_SCAN = 256  # explain looks at the newest this many entries of the folder


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
        "source": f"{kernel.fn.__qualname__} {capture.code_digest(kernel.fn.__code__)} {kernel.source_digest()}",
        "constexprs": {k: capture.fingerprint(v, f"constexpr {k}", kernel.name) for k, v in sorted(constexprs.items())},
        "launch_bounds": [bounds.max_threads, bounds.min_blocks_per_sm, bounds.max_registers]
        + ([list(bounds.cluster)] if bounds.cluster else []),
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


def _read_sealed(path: str):
    """(status, parsed JSON): status "absent", "untrusted" (no valid MAC under this user's key:
    planted, another user's, or damaged) or "ok"; a sealed file that does not parse is "untrusted" too."""
    data = cachefs.read_bounded(path, MAX_META_BYTES)
    if data is None:
        return ("absent" if not os.path.lexists(path) else "untrusted"), None
    payload = cachefs.unseal(os.path.basename(path), data)
    if payload is None:
        return "untrusted", None
    try:
        return "ok", json.loads(payload.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return "untrusted", None


def _reject_constant(name):
    raise ValueError(f"non-finite number {name} in a cache file")


_REPORT_TYPES = {"available": bool, "arch": str, "registers": (int, type(None)), "spill_stores": int,
                 "spill_loads": int, "stack_frame": int, "shared_bytes": int, "barriers": int, "warnings": list,
                 "note": str, "log": str}


def _entry_of(meta, d: str, key: str) -> Entry | None:
    """The entry a verified metadata file describes, when its schema and its files' hashes hold."""
    _, ptx_p, cubin_p = _paths(d, key)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None
    rep, smem, sites = meta.get("report"), meta.get("dynamic_shared_bytes"), meta.get("wait_sites", [])
    if not (isinstance(rep, dict) and set(rep) <= set(_REPORT_TYPES)
            and all(isinstance(v, _REPORT_TYPES[k]) for k, v in rep.items())
            and all(isinstance(w, str) for w in rep.get("warnings", ()))):
        return None
    if isinstance(smem, bool) or not isinstance(smem, int) or not 0 <= smem <= 1 << 20:
        return None
    if not (isinstance(sites, list) and all(isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s)
                                            for s in sites)):
        return None
    ptx = cachefs.read_bounded(ptx_p, cachefs.MAX_BLOB_BYTES)
    if ptx is None or _sha(ptx) != meta.get("ptx_sha256"):
        return None
    cubin = None
    if meta.get("cubin_sha256"):
        cubin = cachefs.read_bounded(cubin_p, cachefs.MAX_BLOB_BYTES)
        if cubin is None or _sha(cubin) != meta["cubin_sha256"]:
            return None
    try:
        report = PtxasReport(**{k: (tuple(v) if k == "warnings" else v) for k, v in rep.items()})
        text = ptx.decode()
    except (TypeError, UnicodeDecodeError):
        return None
    return Entry(text, cubin, report, smem, tuple(WaitSite(a, b) for a, b in sites))


def _usable_dir() -> str | None:
    """The cache folder when the disk cache is on and the folder and key can be trusted."""
    if not enabled():
        return None
    return cachefs.trusted_dir()


def load(key: str) -> Entry | None:
    d = _usable_dir()
    if d is None:
        return None
    meta_p = _paths(d, key)[0]
    status, meta = _read_sealed(meta_p)
    if status != "ok":
        return None
    entry = _entry_of(meta, d, key)
    if entry is not None:
        cachefs.touch(meta_p)
    return entry


def _valid_read(r) -> bool:
    return (isinstance(r, list) and len(r) == 3 and all(isinstance(x, str) and len(x) <= 1024 for x in r)
            and r[0] in READ_KINDS)


def _manifest(d: str, base: str) -> list:
    """The read-recipe sets stored under ``base`` (each a list of [kind, owner, name])."""
    status, data = _read_sealed(_manifest_path(d, base))
    if status != "ok" or not isinstance(data, list):
        return []
    out = []
    for recipe in data[:MAX_RECIPES]:
        if isinstance(recipe, list) and len(recipe) <= MAX_READS and all(_valid_read(r) for r in recipe):
            out.append([capture.Read(*r) for r in recipe])
    return out


def _resolve_recipe(recipe, closure: dict, memo: dict | None = None):
    """[(Read, current value, fingerprint)] for a recipe, or None when a read cannot be resolved
    (``memo``: reads resolved for earlier recipes of the same lookup, each fingerprinted once)."""
    memo = {} if memo is None else memo
    out = []
    for r in recipe:
        if r not in memo:
            try:
                value = capture.resolve(r, closure)
                memo[r] = (r, value, capture.fingerprint(value, r.describe()))
            except (capture.Unresolvable, capture.CaptureError):
                memo[r] = None
        if memo[r] is None:
            return None
        out.append(memo[r])
    return out


def _key_of(base: str, resolved) -> str:
    return full_key(base, [[*r.as_json(), fp] for r, _, fp in resolved])


def lookup(base: str, kernel_fn):
    """(full key, entry, [(Read, value, fingerprint)]) of the entry whose recorded reads have the
    same values now, or None."""
    d = _usable_dir()
    if d is None:
        return None
    closure, memo = _closure_of(kernel_fn), {}
    for recipe in _manifest(d, base):
        resolved = _resolve_recipe(recipe, closure, memo)
        if resolved is None:
            continue
        key = _key_of(base, resolved)
        entry = load(key)
        if entry is not None:
            return key, entry, resolved
    return None


def store(key: str, base: str, components: dict, reads: list, ck) -> None:
    d = _usable_dir()
    if d is None:
        return
    meta_p, ptx_p, cubin_p = _paths(d, key)
    ptx = ck.ptx.encode()
    rep = ck.report
    meta = {
        "format": FORMAT, "components": components, "base_key": base, "reads": reads, "ptx_sha256": _sha(ptx),
        "cubin_sha256": _sha(ck.cubin) if ck.cubin else None,
        "dynamic_shared_bytes": ck.dynamic_shared_bytes,
        "wait_sites": [[s.label, s.where] for s in ck.wait_sites],
        "report": {k: (list(v) if k == "warnings" else v) for k in _REPORT_TYPES for v in [getattr(rep, k)]},
    }
    recipe = [r[:3] for r in reads]
    meta_bytes = json.dumps(meta, sort_keys=True, indent=1).encode()
    if len(meta_bytes) > MAX_META_BYTES - 1024 or len(recipe) > MAX_READS:
        cachefs.warn_once(f"tylopy: kernel {ck.name!r} is not stored in the compile cache: its metadata (the values "
                          f"its trace read) is larger than {MAX_META_BYTES} bytes", stacklevel=4)
        return
    try:
        cachefs.atomic_write(ptx_p, ptx)
        if ck.cubin:
            cachefs.atomic_write(cubin_p, ck.cubin)
        cachefs.atomic_write(meta_p, cachefs.seal(os.path.basename(meta_p), meta_bytes))  # last: marks it complete
        recipes = [[r.as_json() for r in rs] for rs in _manifest(d, base)]
        if recipe not in recipes:
            recipes = [recipe] + recipes[:MAX_RECIPES - 1]
            manifest = json.dumps(recipes).encode()
            while len(manifest) > MAX_META_BYTES - 1024 and len(recipes) > 1:
                recipes.pop()
                manifest = json.dumps(recipes).encode()
            path = _manifest_path(d, base)
            cachefs.atomic_write(path, cachefs.seal(os.path.basename(path), manifest))
    except OSError as e:  # a read-only or full cache folder must not break compilation
        cachefs.warn_once(f"tylopy: cannot write the compile cache in {d} ({e}); compiling without it", stacklevel=4)
        return
    cachefs.enforce_cap(d)


def explain(kernel, constexprs: dict, options) -> str:
    """Whether this specialization would hit the disk cache, and if not, which component differs."""
    base, comps = base_key(kernel, constexprs, options)
    if not enabled():
        return "miss: the disk cache is off (TYLOPY_CACHE=0)"
    d = cachefs.cache_dir()
    if _usable_dir() is None:
        problem = cachefs.dir_problem(d) if not cachefs.shared() else None
        why = f"the folder {d} is not trusted ({problem})" if problem else f"the cache key {cachefs.key_path()} " \
                                                                           "cannot be used"
        return f"miss: the disk cache is off: {why}"
    found = lookup(base, kernel.fn)
    if found is not None:
        return f"hit: {found[0]}"
    if _read_sealed(_manifest_path(d, base))[0] == "untrusted":
        return (f"miss: the read list {base}.reads.json is untrusted (its MAC does not match this user's cache key: "
                "planted, another user's, or corrupt); it is ignored and will be rewritten")
    closure = _closure_of(kernel.fn)
    for recipe in _manifest(d, base):
        resolved = _resolve_recipe(recipe, closure)
        if resolved is None:
            continue
        key = _key_of(base, resolved)
        if any(os.path.lexists(p) for p in _paths(d, key)):
            if _read_sealed(_paths(d, key)[0])[0] == "untrusted":
                return (f"miss: entry {key} is untrusted or corrupt (its MAC does not match this user's cache key: "
                        "planted, another user's, or damaged); it will not be loaded, and will be rebuilt")
            return f"miss: entry {key} exists but is corrupt (unreadable or a hash mismatch); it will be rebuilt"
    metas = []
    for mtime, p in _newest_metadata(d):
        status, meta = _read_sealed(p)
        if status == "ok" and isinstance(meta, dict) and isinstance(meta.get("components"), dict) and \
                meta["components"].get("kernel") == kernel.name:
            metas.append((mtime, meta))
    if not metas:
        return f"miss: no entry for kernel {kernel.name!r} in {d}"
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
            details.append(f"{k} ({', '.join(map(str, sub))})")
        else:
            details.append(f"{k}: {_short(repr(other.get(k)))} -> {_short(repr(comps[k]))}")
    return f"miss: differs from the newest entry of {kernel.name!r} in " + "; ".join(details)


def _newest_metadata(d: str) -> list:
    """[(mtime, path)] of the newest ``EXPLAIN_SCAN`` entry metadata files, newest first."""
    found = []
    for p in glob.glob(os.path.join(d, "*.json")):
        if p.endswith(".reads.json"):
            continue
        try:
            found.append((os.lstat(p).st_mtime, p))
        except OSError:
            pass
    found.sort(reverse=True)
    return found[:EXPLAIN_SCAN]


def _closure_of(fn) -> dict:
    return {name: c.cell_contents for name, c in zip(fn.__code__.co_freevars, fn.__closure__ or ())
            if capture._cell_filled(c)}


def _reads_diff(reads: list, kernel_fn) -> str:
    closure = _closure_of(kernel_fn)
    for item in reads:
        if not (isinstance(item, list) and len(item) == 4 and _valid_read(item[:3])):
            continue
        r = capture.Read(*item[:3])
        try:
            now = capture.fingerprint(capture.resolve(r, closure), r.describe())
        except (capture.Unresolvable, capture.CaptureError):
            return f"the value the trace read from {r.describe()} is not there any more"
        if now != item[3]:
            return f"the value the trace read from {r.describe()} changed: {_short(str(item[3]))} -> {_short(now)}"
    return "the entry's files are missing or corrupt; it will be rebuilt"


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def maybe_dump(ck) -> None:
    """With TYLOPY_DUMP_DIR set, write every compiled kernel's PTX, LLVM IR and report there (each file
    written to a new private name and renamed: a symlink planted at a predictable name is replaced,
    never followed)."""
    d = os.environ.get("TYLOPY_DUMP_DIR")
    if not d:
        return
    stem = f"{ck.name}-{ck.cache_key[:12]}"
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        cachefs.dump_file(d, stem + ".ptx", ck.ptx)
        cachefs.dump_file(d, stem + ".report.txt", str(ck.report) + "\n")
        if ck._llvm_ir is not None:
            cachefs.dump_file(d, stem + ".ll", ck._llvm_ir)
    except OSError as e:
        cachefs.warn_once(f"tylopy: TYLOPY_DUMP_DIR={d}: cannot write {stem}.* there ({e.strerror or e})",
                          stacklevel=4)
