"""Loading a kernel file from the command line and finding the kernels it defines.

A file "defines" every ``ty.kernel`` whose function lives in it: module globals, kernels kept
in module-level containers, and kernels made by factories while the module is imported
(``Kernel`` objects register themselves as they are made). ``-D NAME=VALUE`` values are
Python literals or tylopy type names.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
from typing import Sequence

from ..errors import TylopyError
from ..jit import kernel as kernel_module
from ..ir.types import SCALAR_TYPES


class CliError(Exception):
    """A mistake in the command line or its inputs: printed as one line, exit status 2."""


def split_target(spec: str) -> tuple[str, str | None]:
    """``FILE.py[:KERNEL]`` -> (path, kernel name or None)."""
    path, sep, name = spec.rpartition(":")
    if sep and path.endswith(".py"):
        if not name.isidentifier():
            raise CliError(f"FILE.py:KERNEL expects a kernel name after the colon, but got {name!r}")
        return path, name
    return spec, None


def _package_root(path: str) -> tuple[str, list[str]] | None:
    """The folder on sys.path and dotted parts for a file inside an installed package (tylopy_kernels)."""
    for top in ("tylopy_kernels",):
        spec = importlib.util.find_spec(top)
        for root in (spec.submodule_search_locations or []) if spec else []:
            rel = os.path.relpath(path, os.path.realpath(root))
            if rel.startswith(os.pardir):
                continue
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts.pop()
            if all(p.isidentifier() for p in parts):
                return top, parts
    return None


def _module_name(path: str) -> str:
    """The name to import ``path`` under: its package name inside tylopy_kernels, else its stem."""
    inside = _package_root(path)
    if inside is not None:
        return ".".join([inside[0], *inside[1]])
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() else "_tylopy_cli_" + re.sub(r"\W", "_", stem)
    other = sys.modules.get(name)
    if other is not None and os.path.realpath(getattr(other, "__file__", "") or "") != path:
        name = f"_tylopy_cli_{name}_{abs(hash(path)) % 10**8}"
    return name


def _import_error(path: str, e: BaseException) -> CliError:
    """One line for an exception raised while importing the user's file, pointing into it."""
    if isinstance(e, SyntaxError):
        return CliError(f"{e.filename or path}:{e.lineno}: SyntaxError: {e.msg}")
    frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.realpath(f.filename) == path]
    where = f"{path}:{frames[-1].lineno}" if frames else path
    return CliError(f"importing {where} failed: {type(e).__name__}: {e}")


def load_module(path: str):
    """Import a Python file by path; its folder goes on sys.path so sibling imports work."""
    if not os.path.isfile(path):
        raise CliError(f"no such file: {path}")
    if not path.endswith(".py"):
        raise CliError(f"expected a Python file (FILE.py[:KERNEL]), but got {path}")
    path = os.path.realpath(path)
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = _module_name(path)
    if name in sys.modules and os.path.realpath(getattr(sys.modules[name], "__file__", "") or "") == path:
        return sys.modules[name]
    try:
        if name.startswith("tylopy_kernels."):
            return importlib.import_module(name)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses, pickling and the cache key look modules up by name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    except TylopyError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module, not ours: report where it failed
        raise _import_error(path, e) from None


def _kernels_in(value, depth=0):
    if isinstance(value, kernel_module.Kernel):
        yield value
    elif depth < 2 and isinstance(value, (list, tuple, dict)):
        for v in (value.values() if isinstance(value, dict) else value):
            yield from _kernels_in(v, depth + 1)


def _is_dtype_factory(obj, module) -> bool:
    """A cached module-level function of one parameter named like a dtype (``streaming_kernel(dtype)``):
    the way kernels were made per element type before tensor parameters could leave it open."""
    if not callable(obj) or not hasattr(obj, "cache_info"):
        return False
    fn = getattr(obj, "__wrapped__", None)
    if getattr(fn, "__module__", None) != module.__name__ or not hasattr(fn, "__code__"):
        return False
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    required = [p for p in params if p.default is inspect.Parameter.empty]
    return len(required) == 1 and required[0].name.endswith("dtype")


def call_dtype_factories(module, dtype) -> None:
    """Make the kernels of the file's dtype factories for ``dtype`` (they register themselves)."""
    for obj in list(vars(module).values()):
        if _is_dtype_factory(obj, module):
            try:
                obj(dtype)
            except Exception:  # noqa: BLE001 - a factory that does not take this dtype makes no kernel
                pass


def find_kernels(module, dtype=None) -> dict:
    """Every kernel whose function lives in ``module``'s file, by name, each object once.

    Module globals come first (under their global names), then kernels in module-level lists,
    tuples and dicts, then kernels that factories made: while the module was imported, or now,
    when a cached factory of one dtype parameter is called with ``dtype`` (default f32).
    """
    here = os.path.realpath(getattr(module, "__file__", "") or "")
    call_dtype_factories(module, dtype or SCALAR_TYPES["f32"])
    out, seen = {}, set()

    def add(name, k):
        if id(k.fn) in seen:  # one kernel per function (copies such as a fresh Kernel over it are not listed)
            return
        seen.add(id(k.fn))
        key = name if name not in out else f"{name}#{len(out)}"
        out[key] = k

    for name, obj in vars(module).items():
        for k in _kernels_in(obj):
            add(name if k is obj else k.name, k)
    for k in kernel_module.kernels_defined_in(here):
        add(k.name, k)
    own = {n: k for n, k in out.items() if os.path.realpath(k.source_file) == here}
    return own or out


def select_kernels(spec: str, dtype=None) -> list:
    """The kernels ``FILE.py[:KERNEL]`` names: that one, or every kernel defined in the file."""
    path, wanted = split_target(spec)
    module = load_module(path)
    kernels = find_kernels(module, dtype)
    if wanted is not None:
        for name, k in kernels.items():
            if wanted in (name, k.name):
                return [k]
        have = ", ".join(kernels) or "none"
        raise CliError(f"{path} has no kernel {wanted!r}; its kernels are: {have}")
    if not kernels:
        raise CliError(f"{path} defines no tylopy kernels (functions decorated with @ty.kernel)")
    return list(kernels.values())


def parse_define(text: str) -> tuple[str, object]:
    """``NAME=VALUE``: a tylopy type name (bf16, f32, ...), a Python literal, or else the raw string."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise CliError(f"-D expects NAME=VALUE, but got {text!r}")
    raw = raw.strip()
    if raw in SCALAR_TYPES:
        return name, SCALAR_TYPES[raw]
    try:
        return name, ast.literal_eval(raw)
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        return name, raw


def constexprs_for(kernels: Sequence, defines: Sequence[tuple[str, object]], dtype=None) -> list[dict]:
    """Split the -D values over the kernels: each gets the ones it declares; unknown names are errors.

    A tensor parameter of open dtype takes ``-D NAME=dtype``, else ``dtype`` (``--dtype``, default f32).
    """
    given = dict(defines)
    declared = {n for k in kernels for n in k.constexpr_names}
    unknown = sorted(set(given) - declared)
    if unknown:
        which = kernels[0].name if len(kernels) == 1 else "no kernel in this file"
        raise CliError(f"-D {unknown[0]}: {which} has no compile-time parameter of that name "
                       f"(declared: {', '.join(sorted(declared)) or 'none'})")
    out = []
    for k in kernels:
        cx = {n: v for n, v in given.items() if n in k.constexpr_names}
        for _, n in getattr(k, "_open_tensors", ()):
            cx.setdefault(n, dtype or SCALAR_TYPES["f32"])
        out.append(cx)
    return out


def parse_dtype(text: str):
    """``--dtype NAME``: a tylopy scalar type name (f32, f16, bf16, ...)."""
    t = SCALAR_TYPES.get(text.strip())
    if t is None or t.is_bool:
        raise CliError(f"--dtype expects one of {', '.join(n for n in SCALAR_TYPES if n != 'i1')}, but got {text!r}")
    return t
