"""The on-disk cache of compiled specializations, and the dump-everything debug hook.

The key is a SHA-256 over named components, each of which can change the PTX: the kernel's
source and the source of every function and user module it refers to, the constexpr values,
the launch bounds, the arch, tylopy's own source, llvmlite/LLVM and ptxas versions. An entry
stores its components, so ``explain`` can say which one differs when a lookup misses. Files
are written to a temporary name and renamed (atomic on POSIX); an entry whose hashes do not
match its metadata is treated as absent and rebuilt.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import inspect
import json
import os
import sys
import tempfile
import types
from dataclasses import dataclass

from .codegen.ptxas import PtxasReport, ptxas_version

_PKG = os.path.dirname(os.path.abspath(__file__))
FORMAT = 1


def cache_dir() -> str:
    d = os.environ.get("TYLOPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tylopy")
    os.makedirs(d, exist_ok=True)
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


def _is_user_module(mod) -> bool:
    f = getattr(mod, "__file__", None)
    if not f:
        return False
    f = os.path.abspath(f)
    return not (f.startswith(_PKG) or "site-packages" in f or "dist-packages" in f or f.startswith(sys.prefix + os.sep + "lib"))


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _source_digest(fn, seen: set) -> list[tuple[str, str]]:
    """Hash of ``fn``'s source and, recursively, of the functions and user modules it names."""
    fn = getattr(fn, "fn", fn)  # tylopy.func / Kernel wrap a plain function
    if id(fn) in seen or not isinstance(fn, types.FunctionType):
        return []
    seen.add(id(fn))
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = repr(fn.__code__.co_code)
    out = [(f"{fn.__module__}.{fn.__qualname__}", hashlib.sha256(src.encode()).hexdigest()[:16])]
    g = fn.__globals__
    closure = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    for name in sorted(_code_names(fn.__code__)):
        obj = closure.get(name, g.get(name))
        if obj is None:
            continue
        target = getattr(obj, "fn", obj)
        if isinstance(target, types.FunctionType) and _is_user_module(sys.modules.get(target.__module__)):
            out += _source_digest(target, seen)
        elif isinstance(obj, types.ModuleType) and _is_user_module(obj) and id(obj) not in seen:
            seen.add(id(obj))
            with open(obj.__file__, "rb") as f:
                out.append((obj.__name__, hashlib.sha256(f.read()).hexdigest()[:16]))
        elif isinstance(obj, (int, float, str, bool, tuple)) and not name.startswith("__"):
            out.append((f"global {name}", repr(obj)))
    return out


def _value_repr(x) -> str:
    """A stable description of a closure value (functions by source hash, the rest by repr)."""
    target = getattr(x, "fn", x)
    if isinstance(target, types.FunctionType):
        return ",".join(h for _, h in _source_digest(target, set()))
    text = repr(x)
    return text if " at 0x" not in text else type(x).__qualname__


def cache_key(kernel, constexprs: dict) -> tuple[str, dict]:
    import llvmlite
    import llvmlite.binding as llvm
    bounds = kernel._launch_bounds(constexprs)
    components = {
        "format": FORMAT,
        "kernel": kernel.name,
        # Parameter types and closure values: kernels made by a factory share their source text.
        "signature": [f"{n}: {k!r}" for n, k, _ in kernel.signature],
        "closure": {name: _value_repr(c.cell_contents)
                    for name, c in zip(kernel.fn.__code__.co_freevars, kernel.fn.__closure__ or ())},
        "source": dict(_source_digest(kernel.fn, set())),
        "constexprs": {k: repr(v) for k, v in sorted(constexprs.items())},
        "launch_bounds": [bounds.max_threads, bounds.min_blocks_per_sm, bounds.max_registers],
        "arch": kernel.arch,
        "debug_waits": os.environ.get("TYLOPY_DEBUG_WAITS", ""),
        "tylopy": tylopy_source_hash(),
        "llvmlite": llvmlite.__version__,
        "llvm": ".".join(map(str, llvm.llvm_version_info)),
        "ptxas": ptxas_version(),
    }
    blob = json.dumps(components, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32], components


@dataclass
class Entry:
    ptx: str
    cubin: bytes | None
    report: PtxasReport
    dynamic_shared_bytes: int


def _paths(key: str):
    d = cache_dir()
    return os.path.join(d, key + ".json"), os.path.join(d, key + ".ptx"), os.path.join(d, key + ".cubin")


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def load(key: str) -> Entry | None:
    if not enabled():
        return None
    meta_p, ptx_p, cubin_p = _paths(key)
    try:
        with open(meta_p) as f:
            meta = json.load(f)
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
        return Entry(ptx.decode(), cubin, report, int(meta["dynamic_shared_bytes"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or corrupt: rebuild


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


def store(key: str, components: dict, ck) -> None:
    if not enabled():
        return
    meta_p, ptx_p, cubin_p = _paths(key)
    ptx = ck.ptx.encode()
    rep = ck.report
    meta = {
        "components": components, "ptx_sha256": _sha(ptx),
        "cubin_sha256": _sha(ck.cubin) if ck.cubin else None,
        "dynamic_shared_bytes": ck.dynamic_shared_bytes,
        "report": {k: getattr(rep, k) for k in ("available", "arch", "registers", "spill_stores", "spill_loads",
                                                "stack_frame", "shared_bytes", "barriers", "warnings", "note", "log")},
    }
    try:
        _atomic_write(ptx_p, ptx)
        if ck.cubin:
            _atomic_write(cubin_p, ck.cubin)
        _atomic_write(meta_p, json.dumps(meta, sort_keys=True, indent=1).encode())  # last: marks the entry complete
    except OSError:
        pass  # a read-only or full cache directory must not break compilation


def explain(kernel, constexprs: dict) -> str:
    key, comps = cache_key(kernel, constexprs)
    meta_p, _, _ = _paths(key)
    if os.path.exists(meta_p) and load(key) is not None:
        return f"hit: {key}"
    if os.path.exists(meta_p):
        return f"miss: entry {key} exists but is corrupt (hash mismatch); it will be rebuilt"
    best = None
    for p in glob.glob(os.path.join(cache_dir(), "*.json")):
        try:
            with open(p) as f:
                other = json.load(f)["components"]
        except (OSError, ValueError, KeyError):
            continue
        if other.get("kernel") != kernel.name:
            continue
        if best is None or os.path.getmtime(p) > best[0]:
            best = (os.path.getmtime(p), other)
    if best is None:
        return f"miss: no entry for kernel {kernel.name!r} in {cache_dir()}"
    diffs = [k for k in sorted(comps) if comps[k] != best[1].get(k)]
    details = []
    for k in diffs:
        if isinstance(comps[k], dict) and isinstance(best[1].get(k), dict):
            sub = [s for s in sorted(set(comps[k]) | set(best[1][k])) if comps[k].get(s) != best[1][k].get(s)]
            details.append(f"{k} ({', '.join(sub)})")
        else:
            details.append(f"{k}: {best[1].get(k)!r} -> {comps[k]!r}")
    return f"miss: differs from the newest entry of {kernel.name!r} in " + "; ".join(details)


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
