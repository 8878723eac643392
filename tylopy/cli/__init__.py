"""The ``tylopy`` command line: dump a kernel's PTX with its ptxas report, manage the disk cache,
and run the checks, benchmarks and emulations that packages built on tylopy register.

    tylopy dump tylopy_kernels/examples/vector_add.py         # PTX, then the ptxas report
    tylopy dump tylopy_kernels/attention/sm90/forward.py -D BLOCK_N=64 --llvm
    tylopy cache explain tylopy_kernels/examples/vector_add.py
    tylopy cache prune --max-size 500M                 # least recently used entries out
    tylopy check attention --quick                     # a registered check (entry point tylopy.checks)
    tylopy bench attention                             # a registered benchmark (tylopy.benchmarks)
    tylopy emulate tylopy_kernels/examples/vector_add.py      # the file's emulate_example() on the CPU

``dump`` is a thin wrapper over ``Kernel.compile``: the same PTX, LLVM IR and tylopy IR that
``CompiledKernel`` holds, and the same text ``TYLOPY_DUMP_DIR`` writes. Mistakes in the input
(a kernel-source error, a missing file or kernel, a bad ``-D``) print one line to stderr and
exit with status 2. Anything else is a bug in tylopy: one line and status 1 (the traceback with
``TYLOPY_TRACEBACK=1``).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import traceback
from typing import Sequence

from .. import _plugins
from ..codegen.targets import SUPPORTED_ARCHS
from ..errors import KernelSourceError, LaunchTypeError, TylopyError
from .files import (CliError, constexprs_for, find_kernels, load_module, parse_define, parse_dtype, select_kernels,
                    split_target)

EXIT_USAGE = 2

__all__ = ["main", "build_parser", "CliError", "load_module", "find_kernels", "select_kernels", "split_target",
           "parse_define", "constexprs_for"]


# -- commands ------------------------------------------------------------------------------------

def _with_arch(kernel, arch: str | None):
    return kernel if arch is None or arch == kernel.arch else kernel.with_arch(arch)


def _dump_text(compiled, args) -> str:
    if args.llvm:
        return compiled.llvm_ir
    if args.ir:
        return compiled.ir_text
    return compiled.ptx


def _report_text(compiled) -> str:
    text = str(compiled.report)
    if compiled.dynamic_shared_bytes:
        text += f"\n  dynamic shared memory: {compiled.dynamic_shared_bytes} bytes"
    return text


def _check_out_path(path: str):
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"--out {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise CliError(f"--out {path}: is a folder; give a file name")


def _describe(kernel) -> str:
    """One line: the kernel, its arch, its compile-time parameters (with defaults) and open tensor dtypes."""
    import inspect
    parts = []
    for n, kind, default in kernel.signature:
        if n in kernel.constexpr_names:
            if default is inspect.Parameter.empty:
                parts.append(n if repr(kind) == "constexpr" else f"{n} (dtype of tensor {n})")
            else:
                parts.append(f"{n}={default!r}")
    return f"{kernel.name} ({kernel.arch}): " + (", ".join(parts) if parts else "no compile-time parameters")


def cmd_dump(args) -> int:
    if args.list:
        for k in select_kernels(args.target, args.dtype):
            print(_describe(_with_arch(k, args.arch)))
        return 0
    if args.out:
        _check_out_path(args.out)
    kernels = [_with_arch(k, args.arch) for k in select_kernels(args.target, args.dtype)]
    texts = []
    for kernel, cx in zip(kernels, constexprs_for(kernels, args.define, args.dtype)):
        try:
            compiled = kernel.compile(**cx)
        except LaunchTypeError as e:
            if "needs a value" not in str(e):
                raise
            raise CliError(f"{e}; 'tylopy dump {args.target.split(':')[0]} --list' shows what each kernel needs, "
                           "FILE.py:KERNEL dumps one") from None
        text = _dump_text(compiled, args)
        if len(kernels) > 1:
            text = f"// ===== kernel {kernel.name} ({kernel.arch}) =====\n{text}"
        text = text if text.endswith("\n") else text + "\n"
        texts.append(text)
        if not args.out:
            sys.stdout.write(text)
        if not args.no_report:
            print((f"{kernel.name}: " if len(kernels) > 1 else "") + _report_text(compiled))
    if args.out:
        try:
            with open(args.out, "w") as f:
                f.write("".join(texts))
        except OSError as e:
            raise CliError(f"--out {args.out}: cannot write it ({e.strerror or e})") from None
        print(f"wrote {args.out}")
    return 0


_CACHE_FILE = re.compile(r"^[0-9a-f]{32}\.(json|ptx|cubin|reads\.json)$|^\.tmp-")


def cmd_cache(args) -> int:
    from ..jit import cache, cachefs
    if args.action != "prune" and args.max_size is not None:
        raise CliError(f"--max-size is an option of 'cache prune', not of 'cache {args.action}'")
    if args.action == "prune":
        if args.max_size is None:
            raise CliError("cache prune expects --max-size SIZE (e.g. 500M, 2G)")
        try:
            limit = cachefs.parse_size(args.max_size, "--max-size")
            d = cache.cache_dir()
        except (ValueError, cache.CacheUnavailable) as e:
            raise CliError(str(e)) from None
        removed, freed, left = cachefs.prune(d, limit)
        print(f"removed {removed} entries ({freed} bytes) from {d}; {left} bytes left")
        return 0
    if args.action in ("path", "clear"):
        try:
            d = cache.cache_dir()
        except cache.CacheUnavailable as e:
            raise CliError(str(e)) from None
        if args.action == "path":
            print(d)
            return 0
        victims = [p for p in glob.glob(os.path.join(d, "*")) + glob.glob(os.path.join(d, ".tmp-*"))
                   if _CACHE_FILE.match(os.path.basename(p)) and (os.path.islink(p) or os.path.isfile(p))]
        for p in victims:
            try:
                os.unlink(p)
            except OSError as e:
                raise CliError(f"cannot remove {p} ({e.strerror or e})") from None
        print(f"removed {len(victims)} files from {d}")
        return 0
    if args.target is None:
        raise CliError("cache explain expects FILE.py[:KERNEL]")
    try:
        cache.cache_dir()
    except cache.CacheUnavailable as e:
        raise CliError(str(e)) from None
    kernels = [_with_arch(k, args.arch) for k in select_kernels(args.target, args.dtype)]
    for kernel, cx in zip(kernels, constexprs_for(kernels, args.define, args.dtype)):
        print(f"{kernel.name}: {kernel.cache_explain(**cx)}")
    return 0


def _registered(group: str, what: str, name: str):
    if not name.isidentifier():
        raise CliError(f"{what} expects a name such as 'attention', but got {name!r}")
    main = _plugins.load(group, name)
    if main is None:
        have = ", ".join(_plugins.names(group)) or "none installed"
        raise CliError(f"no {what} {name!r}; available: {have}")
    return main


_GROUPS = {"check": (_plugins.CHECKS, "check"), "bench": (_plugins.BENCHMARKS, "benchmark")}


def _available(command: str) -> str:
    group, what = _GROUPS[command]
    names = _plugins.names(group)
    if not names:
        return f"no {what}s are installed (packages register them as entry points in the group {group!r})"
    return f"available {what}s: " + ", ".join(names)


def _run_registered(args) -> int:
    group, what = _GROUPS[args.command]
    if args.name is None:  # `tylopy bench`: say what there is to run
        print(_available(args.command))
        print(f"run one with 'tylopy {args.command} NAME [ARGS...]'; 'tylopy {args.command} NAME --help' shows its "
              "options")
        return 0
    return _status(_registered(group, what, args.name)(list(args.rest)))


cmd_check = cmd_bench = _run_registered


def cmd_emulate(args) -> int:
    from .emulate import cli_main
    return cli_main(list(args.rest))


def _status(rc) -> int:
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0


# -- the parser -----------------------------------------------------------------------------------

def _define(text: str):
    try:
        return parse_define(text)
    except CliError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _dtype(text: str):
    try:
        return parse_dtype(text)
    except CliError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_kernel_options(p: argparse.ArgumentParser):
    p.add_argument("--arch", choices=SUPPORTED_ARCHS, default=None,
                   help="compile for this target instead of the kernel's own arch (default: the kernel's)")
    p.add_argument("-D", dest="define", metavar="NAME=VALUE", action="append", type=_define, default=[],
                   help="set a compile-time (ty.constexpr) parameter, or the dtype of a ty.tensor parameter "
                        "left open; VALUE is a Python literal, a tylopy type name such as bf16, or else a "
                        "string; repeatable")
    p.add_argument("--dtype", type=_dtype, default=None, metavar="DTYPE",
                   help="the element type for tensor parameters of open dtype and for the file's kernel "
                        "factories of one dtype parameter (default f32)")


def build_parser() -> argparse.ArgumentParser:
    from ..jit.kernel import __version__
    parser = argparse.ArgumentParser(
        prog="tylopy", description="tylopy: a Python DSL for NVIDIA GPU kernels, lowered through LLVM to PTX.",
        epilog="Run 'tylopy COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"tylopy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    dump = sub.add_parser(
        "dump", help="print a kernel's PTX (or LLVM IR, or tylopy IR) and its ptxas resource report",
        description="Compile the kernels of FILE.py (or only KERNEL) and print the PTX, then the ptxas report "
                    "(registers, spills, stack, shared memory). Needs no GPU.")
    dump.add_argument("target", metavar="FILE.py[:KERNEL]", help="a Python file defining @ty.kernel functions, "
                      "optionally with the name of one of them")
    _add_kernel_options(dump)
    what = dump.add_mutually_exclusive_group()
    what.add_argument("--llvm", action="store_true", help="print the LLVM IR handed to the NVPTX backend instead of PTX")
    what.add_argument("--ir", action="store_true", help="print the tylopy IR instead of PTX")
    dump.add_argument("--out", metavar="FILE", help="write the text to FILE; the report still goes to stdout")
    dump.add_argument("--no-report", action="store_true", help="do not print the ptxas report")
    dump.add_argument("--list", action="store_true", help="list the file's kernels and the compile-time values "
                      "each needs (-D NAME=VALUE), without compiling")
    dump.set_defaults(func=cmd_dump)

    cache = sub.add_parser(
        "cache", help="show, clear or explain the on-disk cache of compiled kernels",
        description="path: print the cache folder ($TYLOPY_CACHE_DIR, else $XDG_CACHE_HOME/tylopy or "
                    "~/.cache/tylopy). clear: delete its entries. prune --max-size SIZE: remove the least recently "
                    "used entries until the folder holds at most SIZE (500M, 2G, bytes). explain FILE.py[:KERNEL]: say whether each kernel would hit the cache, and if "
                    "not, which part of the key (source, constexprs, options, a value the trace read, tool "
                    "versions) differs.")
    cache.add_argument("action", choices=("path", "clear", "prune", "explain"))
    cache.add_argument("--max-size", metavar="SIZE", help="for prune: the size to prune the folder to")
    cache.add_argument("target", nargs="?", metavar="FILE.py[:KERNEL]", help="for explain: the kernel file")
    _add_kernel_options(cache)
    cache.set_defaults(func=cmd_cache)

    for name, helptext in (
            ("check", "run a registered numerical check of a kernel against its references (e.g. 'attention')"),
            ("bench", "run a registered benchmark (e.g. 'attention', 'softmax')")):
        p = sub.add_parser(name, help=helptext, description=f"{helptext[0].upper()}{helptext[1:]}; every argument "
                           "after the name is passed through. Without a name: list the names.",
                           epilog=_available(name) + ".")
        p.add_argument("name", metavar="NAME", nargs="?", default=None,
                       help="what to run; leave it out to list what is installed")
        p.add_argument("rest", nargs=argparse.REMAINDER, metavar="ARGS", help="passed through unchanged")
        p.set_defaults(func=_run_registered)
    emu = sub.add_parser("emulate", help="run a kernel on the CPU, lane by lane, with the protocol checks",
                         description="Run FILE.py's emulate_example() on the CPU emulator ('tylopy emulate --help' "
                                     "lists its options).", add_help=False)
    emu.add_argument("rest", nargs=argparse.REMAINDER, metavar="ARGS")
    emu.set_defaults(func=cmd_emulate)
    return parser


def _one_line(e: BaseException) -> str:
    if isinstance(e, KernelSourceError) and e.loc is not None:
        text = f"{e.loc}: {e.message}"
        return text + (f" (hint: {e.hint})" if e.hint else "")
    return " ".join(str(e).split("\n")[:1]) if not isinstance(e, TylopyError) else str(e).replace("\n", " | ")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tylopy`` console script; returns the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["emulate"]:  # its own parser: every option after the word belongs to it
        from .emulate import cli_main
        return cli_main(argv[1:])
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except (CliError, TylopyError) as e:
        print(f"tylopy {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `tylopy dump ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a bug in tylopy: one line, and the traceback on request
        if os.environ.get("TYLOPY_TRACEBACK"):
            traceback.print_exc()
        print(f"tylopy {args.command}: internal error: {type(e).__name__}: {e} (set TYLOPY_TRACEBACK=1 for the "
              "traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
