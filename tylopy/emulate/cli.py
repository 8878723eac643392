"""``tylopy emulate FILE.py[:KERNEL] [--grid X[,Y[,Z]]] [-D NAME=VALUE ...]``

Runs the module's ``emulate_example()``: a function the kernel file defines that builds its
arguments, calls ``kernel.emulate(...)`` and returns what to print. It receives, by keyword
and only if its signature names them, ``grid``, ``kernel`` (the name after the colon),
``check_races`` and the ``-D`` values. The return value may be:

* ``(result, reference)`` or ``(result, reference, tolerance)``: the maximum absolute
  difference is printed; the exit status is 1 when it exceeds the tolerance (default 1e-2);
* a dict: printed one ``key: value`` per line;
* an ``EmulationReport`` or None: the report (or "ok") is printed.

Exit status: 0 success, 1 an emulation error (protocol, memory) or a mismatch, 2 bad input.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import os
import sys

import numpy as np

from ..errors import TylopyError
from .errors import EmulationError


def _grid(text: str):
    try:
        vals = tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--grid expects X[,Y[,Z]] integers, but got {text!r}") from None
    if not 1 <= len(vals) <= 3:
        raise argparse.ArgumentTypeError(f"--grid expects 1 to 3 integers, but got {text!r}")
    return vals


def _define(text: str):
    try:
        from ..cli import parse_define
        return parse_define(text)
    except ImportError:  # pragma: no cover - the main CLI module is optional here
        name, sep, raw = text.partition("=")
        if not sep or not name.strip().isidentifier():
            raise argparse.ArgumentTypeError(f"-D expects NAME=VALUE, but got {text!r}") from None
        try:
            return name.strip(), ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            return name.strip(), raw.strip()


def _load(path: str):
    try:
        from ..cli import load_module
        return load_module(path)
    except ImportError:  # pragma: no cover
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


def _to_numpy(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float64)


def _print_result(out) -> int:
    if isinstance(out, tuple) and len(out) in (2, 3):
        got, want = _to_numpy(out[0]), _to_numpy(out[1])
        tol = float(out[2]) if len(out) == 3 else 1e-2
        if got.shape != want.shape:
            print(f"mismatch: result shape {got.shape}, reference shape {want.shape}")
            return 1
        err = float(np.max(np.abs(got - want))) if got.size else 0.0
        ok = err <= tol
        print(f"max |result - reference| = {err:.3g} over {got.size} values ({'ok' if ok else 'MISMATCH'}, "
              f"tolerance {tol:g})")
        return 0 if ok else 1
    if isinstance(out, dict):
        for k, v in out.items():
            print(f"{k}: {v}")
        return 0
    print(out if out is not None else "ok")
    return 0


def cli_main(argv) -> int:
    p = argparse.ArgumentParser(prog="tylopy emulate",
                                description="Run a kernel file's emulate_example() on the CPU emulator.")
    p.add_argument("target", help="FILE.py[:KERNEL]")
    p.add_argument("--grid", type=_grid, default=None, help="grid X[,Y[,Z]] passed to emulate_example(grid=...)")
    p.add_argument("-D", dest="define", metavar="NAME=VALUE", action="append", type=_define, default=[])
    p.add_argument("--no-race-check", action="store_true", help="skip the shared-memory race check")
    try:
        args = p.parse_args(list(argv))
    except SystemExit as e:
        return int(e.code or 0) and 2
    path, sep, kname = args.target.rpartition(":")
    if not (sep and path.endswith(".py")):
        path, kname = args.target, None
    try:
        module = _load(path)
    except Exception as e:  # noqa: BLE001 - the CLI's loader raises its own error class
        print(f"tylopy emulate: {e}", file=sys.stderr)
        return 2
    example = getattr(module, "emulate_example", None)
    if example is None:
        what = kname or "the kernel"
        print(f"tylopy emulate: {path} defines no emulate_example(); add one that builds the arguments, calls "
              f"{what}.emulate(*args, grid=...) and returns (result, reference)", file=sys.stderr)
        return 2
    offered = dict(args.define)
    offered.update({"grid": args.grid, "kernel": kname, "check_races": not args.no_race_check})
    params = inspect.signature(example).parameters
    takes_all = any(q.kind == q.VAR_KEYWORD for q in params.values())
    kwargs = {k: v for k, v in offered.items() if (k in params or (takes_all and k in dict(args.define)))
              and not (v is None and k in ("grid", "kernel"))}
    try:
        out = example(**kwargs)
    except EmulationError as e:
        print(f"tylopy emulate: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except TylopyError as e:
        print(f"tylopy emulate: {e}", file=sys.stderr)
        return 2
    return _print_result(out)
