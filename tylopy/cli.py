"""The ``tylopy`` command line: dump a kernel's PTX with its ptxas report, manage the disk cache,
and hand ``check``, ``bench`` and ``emulate`` to the modules that own them.

    tylopy dump kernels/vector_add.py                  # PTX, then the ptxas report
    tylopy dump kernels/attention.py:attention_fwd -D HEAD_DIM=128 -D DTYPE=bf16 --llvm
    tylopy cache explain kernels/vector_add.py         # why a specialization would miss the cache
    tylopy check attention --quick                     # tylopy_kernels.checks.run("attention", [...])
    tylopy bench attention                             # <repo>/tools/bench_attention.py main([...])
    tylopy emulate kernels/vector_add.py ...           # tylopy.emulate.cli_main([...])

``dump`` is a thin wrapper over ``Kernel.compile``: the same PTX, LLVM IR and tylopy IR that
``CompiledKernel`` holds, and the same text ``TYLOPY_DUMP_DIR`` writes. Mistakes in the input
(a kernel-source error, a missing file or kernel, a bad ``-D``) print one message to stderr and
exit with status 2; a traceback means a bug in tylopy.
"""
from __future__ import annotations

import argparse
import ast
import glob
import importlib
import importlib.util
import os
import re
import sys
import traceback
from dataclasses import dataclass
from typing import Callable, Sequence

from .errors import TylopyError

EXIT_USAGE = 2
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(_PKG_DIR)


class CliError(Exception):
    """A mistake in the command line or its inputs: printed as one line, exit status 2."""


class NotAvailable(CliError):
    """A subcommand whose implementing module is not there (yet)."""

    def __init__(self, what: str):
        super().__init__(f"not available: {what}")


# -- loading kernel files ----------------------------------------------------------------------

def split_target(spec: str) -> tuple[str, str | None]:
    """``FILE.py[:KERNEL]`` -> (path, kernel name or None)."""
    path, sep, name = spec.rpartition(":")
    if sep and path.endswith(".py") and name.isidentifier():
        return path, name
    return spec, None


def _module_name(path: str) -> str:
    """The name to import ``path`` under: its package name inside tylopy_kernels, else its stem."""
    spec = importlib.util.find_spec("tylopy_kernels")
    for root in (spec.submodule_search_locations or []) if spec else []:
        rel = os.path.relpath(path, os.path.realpath(root))
        parts = rel[:-3].split(os.sep)
        if parts[-1] == "__init__":
            parts.pop()
        if not rel.startswith(os.pardir) and all(p.isidentifier() for p in parts):
            return ".".join(["tylopy_kernels", *parts])
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


def find_kernels(module) -> dict:
    """The module's ``tylopy.Kernel`` globals, in definition order, each object once."""
    from .jit import Kernel
    out, seen = {}, set()
    for name, obj in vars(module).items():
        if isinstance(obj, Kernel) and id(obj) not in seen:
            seen.add(id(obj))
            out[name] = obj
    return out


def select_kernels(spec: str) -> list:
    """The kernels ``FILE.py[:KERNEL]`` names: that one, or every kernel defined in the file."""
    path, wanted = split_target(spec)
    module = load_module(path)
    kernels = find_kernels(module)
    if wanted is not None:
        for name, k in kernels.items():
            if wanted in (name, k.name):
                return [k]
        have = ", ".join(kernels) or "none"
        raise CliError(f"{path} has no kernel {wanted!r}; its kernels are: {have}")
    if not kernels:
        raise CliError(f"{path} defines no tylopy kernels (functions decorated with @ty.kernel)")
    here = os.path.realpath(module.__file__)
    own = [k for k in kernels.values() if os.path.realpath(k.source_file) == here]
    return own or list(kernels.values())


# -- -D NAME=VALUE -----------------------------------------------------------------------------

def parse_define(text: str) -> tuple[str, object]:
    """``NAME=VALUE``: a tylopy type name (bf16, f32, ...), a Python literal, or else the raw string."""
    from .ir.types import SCALAR_TYPES
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"-D expects NAME=VALUE, but got {text!r}")
    raw = raw.strip()
    if raw in SCALAR_TYPES:
        return name, SCALAR_TYPES[raw]
    try:
        return name, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return name, raw


def constexprs_for(kernels: Sequence, defines: Sequence[tuple[str, object]]) -> list[dict]:
    """Split the -D values over the kernels: each gets the ones it declares."""
    given = dict(defines)
    if len(kernels) == 1:
        return [given]
    declared = {n for k in kernels for n in k.constexpr_names}
    unknown = sorted(set(given) - declared)
    if unknown:
        raise CliError(f"-D {unknown[0]}: no kernel in this file has that compile-time parameter "
                       f"(they declare {sorted(declared) or 'none'})")
    return [{n: v for n, v in given.items() if n in k.constexpr_names} for k in kernels]


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


def cmd_dump(args) -> int:
    kernels = [_with_arch(k, args.arch) for k in select_kernels(args.target)]
    texts = []
    for kernel, cx in zip(kernels, constexprs_for(kernels, args.define)):
        compiled = kernel.compile(**cx)
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
        with open(args.out, "w") as f:
            f.write("".join(texts))
        print(f"wrote {args.out}")
    return 0


_CACHE_FILE = re.compile(r"^[0-9a-f]{32}\.(json|ptx|cubin)$|^\.tmp-")


def cmd_cache(args) -> int:
    from . import cache
    if args.action == "path":
        print(cache.cache_dir())
    elif args.action == "clear":
        d = cache.cache_dir()
        victims = [p for p in glob.glob(os.path.join(d, "*")) + glob.glob(os.path.join(d, ".tmp-*"))
                   if _CACHE_FILE.match(os.path.basename(p)) and os.path.isfile(p)]
        for p in victims:
            os.unlink(p)
        print(f"removed {len(victims)} files from {d}")
    else:
        if args.target is None:
            raise CliError("cache explain expects FILE.py[:KERNEL]")
        kernels = [_with_arch(k, args.arch) for k in select_kernels(args.target)]
        for kernel, cx in zip(kernels, constexprs_for(kernels, args.define)):
            print(f"{kernel.name}: {kernel.cache_explain(**cx)}")
    return 0


# -- dispatch to modules owned elsewhere ---------------------------------------------------------

def _import_optional(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name or (e.name is not None and name.startswith(e.name + ".")):
            raise NotAvailable(f"module {name} is not there yet") from None
        raise


def _checks_entry(args) -> Callable[[], object]:
    run = getattr(_import_optional("tylopy_kernels.checks"), "run", None)
    if run is None:
        raise NotAvailable("tylopy_kernels.checks has no run(name, argv)")
    return lambda: run(args.name, list(args.rest))


def _bench_entry(args) -> Callable[[], object]:
    if not args.name.isidentifier():
        raise CliError(f"bench expects a benchmark name such as 'attention', but got {args.name!r}")
    tools = os.path.join(REPO_ROOT, "tools")
    path = os.path.join(tools, f"bench_{args.name}.py")
    if not os.path.isfile(path):
        have = sorted(os.path.basename(p)[6:-3] for p in glob.glob(os.path.join(tools, "bench_*.py")))
        raise NotAvailable(f"no benchmark {args.name!r} ({path} does not exist; available: {', '.join(have) or 'none'})")
    for folder in (REPO_ROOT, tools):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    name = f"tools.bench_{args.name}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    main = getattr(module, "main", None)
    if main is None:
        raise NotAvailable(f"{path} has no main(argv)")
    return lambda: main(list(args.rest))


def _emulate_entry(args) -> Callable[[], object]:
    cli_main = getattr(_import_optional("tylopy.emulate"), "cli_main", None)
    if cli_main is None:
        raise NotAvailable("tylopy.emulate has no cli_main(argv)")
    return lambda: cli_main(list(args.rest))


@dataclass(frozen=True)
class Dispatch:
    """A subcommand implemented by another module, found when it runs (never at import)."""

    name: str
    help: str
    target: str
    entry: Callable  # args -> zero-argument callable; raises NotAvailable when the module is missing
    takes_name: bool = True


DISPATCH = {d.name: d for d in (
    Dispatch("check", "run a numerical check of a kernel against its references (e.g. 'attention')",
             "tylopy_kernels.checks.run(NAME, ARGS)", _checks_entry),
    Dispatch("bench", "run a benchmark from the repository's tools/ folder (tools/bench_NAME.py)",
             "tools/bench_NAME.py main(ARGS)", _bench_entry),
    Dispatch("emulate", "run a kernel on the CPU, lane by lane, with the reference semantics of each op",
             "tylopy.emulate.cli_main(ARGS)", _emulate_entry, takes_name=False),
)}


def cmd_dispatch(args) -> int:
    run = DISPATCH[args.command].entry(args)
    rc = run()
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0


# -- the parser -----------------------------------------------------------------------------------

def _add_kernel_options(p: argparse.ArgumentParser):
    from .codegen.ptx import SUPPORTED_ARCHS
    p.add_argument("--arch", choices=SUPPORTED_ARCHS, default=None,
                   help="compile for this target instead of the kernel's own arch (default: the kernel's)")
    p.add_argument("-D", dest="define", metavar="NAME=VALUE", action="append", type=parse_define, default=[],
                   help="set a compile-time (ty.constexpr) parameter; VALUE is a Python literal, a tylopy "
                        "type name such as bf16, or else a string; repeatable")


def build_parser() -> argparse.ArgumentParser:
    from .jit import __version__
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
    dump.set_defaults(func=cmd_dump)

    cache = sub.add_parser(
        "cache", help="show, clear or explain the on-disk cache of compiled kernels",
        description="path: print the cache folder ($TYLOPY_CACHE_DIR or ~/.cache/tylopy). clear: delete its "
                    "entries. explain FILE.py[:KERNEL]: say whether each kernel would hit the cache, and if "
                    "not, which part of the key (source, constexprs, arch, tool versions) differs.")
    cache.add_argument("action", choices=("path", "clear", "explain"))
    cache.add_argument("target", nargs="?", metavar="FILE.py[:KERNEL]", help="for explain: the kernel file")
    _add_kernel_options(cache)
    cache.set_defaults(func=cmd_cache)

    for d in DISPATCH.values():
        p = sub.add_parser(d.name, help=d.help, description=f"{d.help[0].upper()}{d.help[1:]}. Runs {d.target}; "
                           "every argument after the name is passed through.")
        if d.takes_name:
            p.add_argument("name", metavar="NAME")
        p.add_argument("rest", nargs=argparse.REMAINDER, metavar="ARGS", help="passed through unchanged")
        p.set_defaults(func=cmd_dispatch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tylopy`` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except (CliError, TylopyError) as e:
        print(f"tylopy {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `tylopy dump ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
