"""``tylopy emulate FILE.py[:KERNEL] [--grid X[,Y[,Z]]] [-D NAME=VALUE ...]``

Runs the module's ``emulate_example()``: a function the kernel file defines that builds its
arguments, calls ``kernel.emulate(...)`` and returns what to print. It receives by keyword
``grid`` (``--grid``), ``kernel`` (the name after the colon), ``check_races`` (False with
``--no-race-check``) and the ``-D`` values; an option the function does not take is an error,
never silently dropped. The return value may be:

* ``(result, reference)`` or ``(result, reference, tolerance)``: the maximum absolute
  difference is printed; the exit status is 1 when it exceeds the tolerance (default 1e-2);
* a dict: printed one ``key: value`` per line;
* an ``EmulationReport`` or None: the report (or "ok") is printed.

Exit status: 0 success, 1 an emulation error (protocol, memory) or a mismatch, 2 bad input.
"""
from __future__ import annotations

import argparse
import inspect
import sys

import numpy as np

from ..emulate.errors import EmulationError
from ..errors import TylopyError
from .files import CliError, load_module, parse_define, split_target


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
        return parse_define(text)
    except CliError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
        return 0 if not e.code else 2
    try:
        path, kname = split_target(args.target)
        module = load_module(path)
    except (CliError, TylopyError) as e:
        print(f"tylopy emulate: error: {e}", file=sys.stderr)
        return 2
    example = getattr(module, "emulate_example", None)
    if example is None:
        what = kname or "the kernel"
        print(f"tylopy emulate: error: {path} defines no emulate_example(); add one that builds the arguments, "
              f"calls {what}.emulate(*args, grid=...) and returns (result, reference)", file=sys.stderr)
        return 2
    params = inspect.signature(example).parameters
    takes_all = any(q.kind == q.VAR_KEYWORD for q in params.values())
    given = dict(args.define)
    if args.grid is not None:
        given["grid"] = args.grid
    if kname is not None:
        if "kernel" in params or takes_all:
            given["kernel"] = kname
        else:  # the example emulates one kernel: KERNEL must name it
            from .files import find_kernels
            kernels = find_kernels(module)
            names = {n for name, k in kernels.items() for n in (name, k.name)}
            if kname not in names:
                print(f"tylopy emulate: error: {path} has no kernel {kname!r}; its kernels are: "
                      f"{', '.join(kernels) or 'none'}", file=sys.stderr)
                return 2
            if len(kernels) > 1:
                print(f"tylopy emulate: error: FILE.py:KERNEL: {path}'s emulate_example() takes no 'kernel' "
                      f"parameter, so it cannot choose between the file's kernels ({', '.join(kernels)})",
                      file=sys.stderr)
                return 2
    if args.no_race_check:
        given["check_races"] = False
    # Every option asked for must reach the example: one it does not take would be silently ignored.
    refused = [k for k in given if k not in params and not (takes_all and k in dict(args.define))]
    if refused:
        flag = {"grid": "--grid", "kernel": "FILE.py:KERNEL", "check_races": "--no-race-check"}.get(refused[0],
                                                                                                     f"-D {refused[0]}")
        print(f"tylopy emulate: error: {flag}: {path}'s emulate_example() takes no {refused[0]!r} parameter "
              f"(it takes: {', '.join(params) or 'nothing'})", file=sys.stderr)
        return 2
    kwargs = given
    try:
        out = example(**kwargs)
    except EmulationError as e:
        print(f"tylopy emulate: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except TylopyError as e:
        print(f"tylopy emulate: error: {e}", file=sys.stderr)
        return 2
    return _print_result(out)
