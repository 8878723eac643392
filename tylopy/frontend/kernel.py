"""``@kernel`` and ``@func``: trace a Python function into IR, compile it, launch it.

The pipeline of one specialization (one set of constexpr values and compile options) is

    source --rewrite--> traceable function --trace--> KernelIR --verify--> LLVM IR
           --LLVM O3 + NVPTX--> PTX --ptxas--> cubin + report --driver--> CUfunction

Each stage's output is an attribute of ``CompiledKernel`` (``.ir``, ``.llvm_ir``, ``.ptx``,
``.report``). The disk cache keys a specialization by everything that can change its PTX,
the values its trace reads from outside the kernel included (``cache.py``, ``capture.py``), so
a warm start skips tracing and LLVM entirely.
"""
from __future__ import annotations

import ast
import functools
import inspect
import os
import re
import sys
import textwrap
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from ..codegen.targets import SUPPORTED_ARCHS
from ..errors import (CompileError, IRVerificationError, KernelSourceError, LaunchTypeError, LayoutError, ResourceLimitError,
                      SourceLoc, TylopyError)
from ..ir.printer import format_ir
from ..ir.types import PointerType, ScalarType, TensorMapType, Type
from ..ir.values import KernelIR, LaunchBounds, Param
from ..ir.verify import verify
from . import capture, tracing
from .builder import Builder, _is_tylopy_file, code_location, user_location
from .lang import NoAliasPointer, _Constexpr
from .options import CompileOptions, environment_snapshot, from_environment
from .proxy import RuntimeValue
from .rewrite import rewrite_function, source_of

__version__ = "0.2.0"
DEFAULT_ARCH = "sm_90a"
# PTX identifiers: what LLVM and ptxas accept as a kernel's symbol without aborting.
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_FUNC_DEPTH = 64
MAX_SPECIALIZATIONS_PER_KEY = 8  # in-memory entries per base key (one per set of read values)


def _locate(fn: Callable, match: Callable[[ast.AST], bool]) -> SourceLoc:
    """The position of the first node in ``fn``'s source that ``match`` accepts (else its ``def``)."""
    code = getattr(fn, "__code__", None)
    filename = code.co_filename if code else "?"
    line = code.co_firstlineno if code else 0
    try:
        src, filename = source_of(fn)
        dedented = textwrap.dedent(src)
        indent = len(src.splitlines()[0]) - len(dedented.splitlines()[0])
        fdef = ast.parse(dedented).body[0]
        node = next((n for n in ast.walk(fdef) if match(n)), fdef)
        lineno = line + node.lineno - 1
        single = getattr(node, "end_lineno", None) == node.lineno
        end = node.end_col_offset + indent if single else node.col_offset + indent + 3
        return SourceLoc(filename, lineno, node.col_offset + indent, fn.__name__, end)
    except (KernelSourceError, SyntaxError, IndexError, AttributeError):
        return SourceLoc(filename, line, 0, getattr(fn, "__name__", ""))


def _param_loc(fn: Callable, name: str) -> SourceLoc:
    return _locate(fn, lambda n: isinstance(n, ast.arg) and n.arg == name)


def _def_loc(fn: Callable) -> SourceLoc:
    return _locate(fn, lambda n: False)


def _param_kind(fn: Callable, name: str, ann) -> Any:
    if isinstance(ann, (_Constexpr, ScalarType, PointerType, TensorMapType, NoAliasPointer)):
        return ann
    raise KernelSourceError(
        f"kernel parameter {name!r} expects an annotation such as ty.ptr(ty.f32), ty.i32, ty.f32, "
        f"ty.tensormap or ty.constexpr, but got {ann!r}", _param_loc(fn, name))


class func:
    """A helper traced inline into the kernel that calls it; its if/for/while may use run-time values."""

    def __init__(self, fn: Callable):
        if not callable(fn) or not hasattr(fn, "__code__"):
            raise TypeError(f"ty.func expects a Python function, but got {fn!r}")
        self.fn = fn
        functools.update_wrapper(self, fn)
        self._traceable = None
        self._depth = 0

    def __call__(self, *args, **kwargs):
        if self._traceable is None:
            self._traceable = rewrite_function(self.fn)
        if self._depth >= MAX_FUNC_DEPTH:
            raise KernelSourceError(f"@ty.func {self.fn.__qualname__!r} calls itself more than {MAX_FUNC_DEPTH} "
                                    "levels deep while tracing; functions are inlined, so recursion must stop at "
                                    "compile time", user_location(),
                                    hint="end the recursion on a compile-time value, or write a loop")
        self._depth += 1
        try:
            return self._traceable.make(tracing)(*args, **kwargs)
        finally:
            self._depth -= 1


@dataclass
class CompiledKernel:
    """One specialization: its IR, LLVM IR, PTX, ptxas report and (once launched) its CUfunction."""

    name: str
    arch: str
    threads: int
    params: tuple[tuple[str, Type], ...]
    constexprs: dict
    ptx: str
    cubin: bytes | None
    report: Any
    dynamic_shared_bytes: int
    cache_key: str = ""
    compile_seconds: float = 0.0
    from_cache: bool = False
    options: CompileOptions | None = None
    wait_sites: tuple = ()
    _ir: KernelIR | None = None
    _llvm_ir: str | None = None
    _llvm_ir_optimized: str | None = None
    _retrace: Callable | None = field(default=None, repr=False)
    _launcher: Any = field(default=None, repr=False)
    _guards: Any = field(default=None, repr=False)  # capture.Guards: the reads this process must still see
    _env: tuple = field(default=(), repr=False)  # the environment options it was compiled under

    @property
    def ir(self) -> KernelIR:
        if self._ir is None and self._retrace is not None:
            self._ir = self._retrace()
        return self._ir

    @property
    def ir_text(self) -> str:
        return format_ir(self.ir)

    @property
    def llvm_ir(self) -> str:
        if self._llvm_ir is None:
            from ..codegen.llvm import lower_kernel
            self._llvm_ir = str(lower_kernel(self.ir, self.options))
        return self._llvm_ir

    def launcher(self):
        if self._launcher is None:
            from ..runtime.launch import Launcher
            self._launcher = Launcher(self)
        return self._launcher

    def __call__(self, grid, *args, stream=None):
        return self.launcher().launch(grid, args, stream)


class Kernel:
    """A kernel written in tylopy; ``kernel[grid](*args, **constexprs)`` compiles and launches it."""

    def __init__(self, fn: Callable, threads, arch: str = DEFAULT_ARCH, min_blocks_per_sm: int | None = None,
                 max_registers: int | None = None, name: str | None = None, noalias: bool = False,
                 _register: bool = True):
        if not callable(fn) or not hasattr(fn, "__code__"):
            raise TypeError(f"ty.kernel expects a Python function, but got {fn!r}")
        self.fn = fn
        self.name = fn.__name__ if name is None else name
        if not isinstance(self.name, str) or not _SYMBOL.match(self.name):
            raise KernelSourceError(
                f"kernel name expects letters, digits and underscores, not starting with a digit (a PTX "
                f"symbol), but got {self.name!r}", _def_loc(fn), hint="pass name='my_kernel' to @ty.kernel")
        if arch not in SUPPORTED_ARCHS:
            raise KernelSourceError(f"arch expects one of {', '.join(SUPPORTED_ARCHS)}, but got {arch!r}",
                                    _def_loc(fn))
        self.threads = threads
        self.arch = arch
        self.min_blocks_per_sm = min_blocks_per_sm
        self.max_registers = max_registers
        self.noalias = bool(noalias)
        source_of(fn)  # no source, no tracing: say so at the decorator, not at the first launch
        self.signature = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise KernelSourceError(f"kernel {self.name!r}: parameter {p.name!r} expects a plain positional "
                                        f"parameter, but it is {p.kind.description}", _param_loc(fn, p.name),
                                        hint="kernel parameters are passed by position at launch; constexprs "
                                             "are ordinary parameters annotated ty.constexpr")
            if p.name.startswith("__ty"):
                raise KernelSourceError(f"kernel {self.name!r}: parameter names starting with '__ty' are reserved "
                                        f"for tylopy's rewritten code, but got {p.name!r}", _param_loc(fn, p.name))
            if p.annotation is inspect.Parameter.empty:
                raise KernelSourceError(f"kernel {self.name!r}: parameter {p.name!r} needs a type annotation "
                                        "(ty.ptr(ty.f32), ty.i32, ty.constexpr, ...)", _param_loc(fn, p.name))
            self.signature.append((p.name, _param_kind(fn, p.name, p.annotation), p.default))
        self.source_file = inspect.getsourcefile(fn) or fn.__code__.co_filename
        self._traceable = None
        self._compiled: dict[str, list[CompiledKernel]] = {}
        self._fast: dict[tuple, CompiledKernel] = {}
        functools.update_wrapper(self, fn)
        if _register:
            _defined.setdefault(os.path.realpath(self.source_file), weakref.WeakSet()).add(self)

    def __repr__(self):
        return f"<tylopy kernel {self.name} ({self.arch}) from {self.source_file}>"

    def with_arch(self, arch: str) -> "Kernel":
        """The same kernel compiled for another target (``sm_80``, ``sm_90a``, ...); a new object."""
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(f"arch expects one of {', '.join(SUPPORTED_ARCHS)}, but got {arch!r}")
        return Kernel(self.fn, self.threads, arch, self.min_blocks_per_sm, self.max_registers, self.name,
                      self.noalias, _register=False)

    def clear_cache(self) -> None:
        """Forget the specializations compiled in this process (the disk cache stays)."""
        self._compiled.clear()
        self._fast.clear()

    # -- specialization ---------------------------------------------------------------------
    @property
    def runtime_params(self):
        return [(n, k.type if isinstance(k, NoAliasPointer) else k) for n, k, _ in self.signature
                if not isinstance(k, _Constexpr)]

    @property
    def constexpr_names(self):
        return [n for n, k, _ in self.signature if isinstance(k, _Constexpr)]

    def options(self) -> CompileOptions:
        """The compile options of a compile started now (the environment is read here)."""
        return from_environment(self.arch, "all" if self.noalias else "declared")

    def _constexprs(self, given: dict) -> dict:
        out = {}
        for n, k, default in self.signature:
            if not isinstance(k, _Constexpr):
                continue
            if n in given:
                out[n] = given[n]
            elif default is not inspect.Parameter.empty:
                out[n] = default
            else:
                raise LaunchTypeError(f"kernel {self.name!r}: compile-time parameter {n!r} needs a value "
                                      f"(pass {n}=... at launch or compile); declared at {_param_loc(self.fn, n)}")
        unknown = set(given) - set(out)
        if unknown:
            raise LaunchTypeError(f"kernel {self.name!r} has no compile-time parameter {sorted(unknown)[0]!r}; "
                                  f"its constexprs are {self.constexpr_names} (kernel defined at {_def_loc(self.fn)})")
        return out

    def _launch_bounds(self, constexprs: dict) -> LaunchBounds:
        def resolve(what, x):
            try:
                return x(**constexprs) if callable(x) else x
            except TylopyError:
                raise
            except Exception as e:  # noqa: BLE001 - the user's function: report it at the kernel
                raise trace_error(e, f"kernel {self.name!r}: computing {what} from the constexprs raised "
                                     f"{type(e).__name__}: {e}", _def_loc(self.fn)) from None
        threads = resolve("threads", self.threads)
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
            raise ResourceLimitError(f"kernel {self.name!r}: threads per block expects 1..1024, but got {threads!r}")
        mb = resolve("min_blocks_per_sm", self.min_blocks_per_sm)
        mr = resolve("max_registers", self.max_registers)
        for what, x, lo, hi in (("min_blocks_per_sm", mb, 1, 32), ("max_registers", mr, 24, 255)):
            if x is not None and (isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi):
                raise ResourceLimitError(f"kernel {self.name!r}: {what} expects an int in {lo}..{hi}, but got {x!r}")
        return LaunchBounds(threads, mb, mr)

    def trace(self, options: CompileOptions | None = None, recorder: capture.Recorder | None = None,
              **constexprs) -> KernelIR:
        """The verified IR of one specialization."""
        cx = self._constexprs(constexprs)
        options = options or self.options()
        if self._traceable is None:
            self._traceable = rewrite_function(self.fn, record_closure=True)
        bounds = self._launch_bounds(cx)
        bld = Builder(options.arch, options)
        params, args = [], []
        for n, k, _ in self.signature:
            if isinstance(k, _Constexpr):
                args.append(cx[n])
                continue
            noalias = isinstance(k, NoAliasPointer) or (options.noalias == "all" and isinstance(k, PointerType))
            t = k.type if isinstance(k, NoAliasPointer) else k
            v = bld.new_value(t, n)
            params.append(Param(n, t, v, noalias))
            args.append(RuntimeValue(v))
        recorder = recorder or capture.Recorder(self.name)
        with bld, recorder:
            try:
                out = self._traceable.make(tracing)(*args)
            except KernelSourceError as e:
                if e.loc is not None:
                    raise
                raise _relocated(e, _innermost_user_frame()) from None
            except LayoutError as e:  # tile-library misuse: report it at the kernel line that did it
                raise trace_error(e, str(e), _innermost_user_frame()) from None
            except TylopyError:
                raise
            except RecursionError:
                raise KernelSourceError(f"kernel {self.name!r}: tracing recursed too deeply (a function that calls "
                                        "itself without a compile-time end?)", _innermost_user_frame()) from None
            except Exception as e:  # noqa: BLE001 - Python code in the kernel failed while tracing
                raise trace_error(e, f"{type(e).__name__} while tracing kernel {self.name!r}{_constexpr_note(cx)}: "
                                     f"{e}", _innermost_user_frame()) from None
            if out is not None:
                raise KernelSourceError(f"kernel {self.name!r} returns {out!r}; kernels write their results "
                                        "through pointers and return nothing",
                                        _locate(self.fn, lambda n: isinstance(n, ast.Return) and n.value is not None))
        kir = KernelIR(name=self.name, params=tuple(params), body=bld.finish(), launch=bounds, arch=options.arch,
                       shared=tuple(bld.shared_allocs), dynamic_shared_bytes=bld.dynamic_shared_bytes,
                       dynamic_shared_align=bld.dynamic_shared_align, source_file=self.source_file,
                       constexprs=tuple(sorted((k, repr(v)) for k, v in cx.items())),
                       wait_sites=tuple(bld.wait_sites))
        try:
            verify(kir)
        except IRVerificationError as e:
            raise _verification_error(e) from None
        return kir

    def compile(self, **constexprs) -> CompiledKernel:
        """Compile (or fetch from the memory or disk cache) one specialization.

        The launch path: the same keyword arguments as last time find the last specialization
        without normalizing anything; it is used while the environment options and every value
        its trace read are unchanged (``capture.Guards``), else the key is computed again.
        """
        try:
            key = tuple(constexprs.items())
            fast = self._fast.get(key)
        except TypeError:  # an unhashable constexpr value
            key = fast = None
        if fast is not None and fast._env == environment_snapshot() and fast._guards.valid():
            return fast
        ck = self._compile(constexprs)
        if key is not None:
            try:
                self._fast[key] = ck
            except TypeError:
                pass
        return ck

    def _compile(self, constexprs: dict) -> CompiledKernel:
        from . import cache
        env = environment_snapshot()
        cx = self._constexprs(constexprs)
        options = self.options()
        t0 = time.perf_counter()
        base_key, components = cache.base_key(self, cx, options)
        for ck in self._compiled.get(base_key, ()):  # compiled in this process: still valid?
            if ck._guards.valid():
                return ck
        cells = dict(zip(self.fn.__code__.co_freevars, self.fn.__closure__ or ()))
        found = cache.lookup(base_key, self.fn)
        if found is not None:
            key, entry, resolved = found
            ck = CompiledKernel(self.name, options.arch, self._launch_bounds(cx).max_threads,
                                tuple(self.runtime_params), cx, entry.ptx, entry.cubin, entry.report,
                                entry.dynamic_shared_bytes, key, from_cache=True, options=options,
                                wait_sites=entry.wait_sites,
                                _retrace=functools.partial(self.trace, options, **cx))
            ck._guards = capture.Guards.build(resolved, cells)
        else:
            recorder = capture.Recorder(self.name)
            kir = self.trace(options, recorder, **cx)
            key = cache.full_key(base_key, recorder.key())
            ck = self._build(kir, cx, options, key)
            cache.store(key, base_key, components, recorder.key(), ck)
            ck._guards = capture.Guards.build(
                [(r, recorder.values[r], fp) for r, fp in recorder.reads.items()], cells)
        ck._env = env
        ck.compile_seconds = time.perf_counter() - t0
        entries = self._compiled.setdefault(base_key, [])
        entries.insert(0, ck)
        del entries[MAX_SPECIALIZATIONS_PER_KEY:]
        cache.maybe_dump(ck)
        return ck

    def _build(self, kir: KernelIR, cx: dict, options: CompileOptions, key: str) -> CompiledKernel:
        from ..codegen.llvm import lower_kernel
        from ..codegen.ptx import annotate_source_lines, optimize_and_emit
        from ..codegen.ptxas import assemble
        try:
            llvm_text = str(lower_kernel(kir, options))
        except TylopyError:
            raise
        except Exception as e:  # noqa: BLE001 - an op its type rule accepted but codegen cannot lower
            raise _lowering_error(e) from None
        optimized, ptx = optimize_and_emit(llvm_text, options.arch)
        ptx = annotate_source_lines(ptx, kir.source_file)
        try:
            cubin, report = assemble(ptx, options.arch, kernel=kir.name,
                                     dynamic_shared_bytes=kir.dynamic_shared_bytes)
        except (CompileError, ResourceLimitError) as e:
            raise _with_ptx_source_line(e, ptx) from None
        return CompiledKernel(self.name, options.arch, kir.launch.max_threads,
                              tuple((p.name, p.type) for p in kir.params), cx, ptx, cubin, report,
                              kir.dynamic_shared_bytes, key, options=options, wait_sites=kir.wait_sites,
                              _ir=kir, _llvm_ir=llvm_text, _llvm_ir_optimized=optimized)

    def cache_explain(self, **constexprs) -> str:
        """Why this specialization would miss (or hit) the disk cache."""
        from . import cache
        return cache.explain(self, self._constexprs(constexprs), self.options())

    # -- launch -------------------------------------------------------------------------------
    def __getitem__(self, grid):
        return _BoundLaunch(self, grid)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"kernel {self.name!r} is launched with a grid: {self.name}[grid](*args)")

    def emulate(self, *args, grid, **kwargs):
        """Run the kernel on the CPU, lane by lane (see ``tylopy.emulate``)."""
        from ..emulate import emulate_kernel
        return emulate_kernel(self, args, grid, **kwargs)


_defined: dict[str, weakref.WeakSet] = {}


def kernels_defined_in(path: str) -> list:
    """The live kernels whose function is in the file ``path`` (decorated there, or by a factory)."""
    return sorted(_defined.get(os.path.realpath(path), ()), key=lambda k: (k.fn.__code__.co_firstlineno, k.name))


_TRACE_ERRORS: dict[type, type] = {}


def trace_error(e: Exception, message: str, loc) -> KernelSourceError:
    """A ``KernelSourceError`` for a Python exception raised by kernel code while tracing; it is
    also an instance of the original class where Python allows (``except ValueError`` still works)."""
    cls = type(e)
    wrapped = _TRACE_ERRORS.get(cls)
    if wrapped is None:
        try:
            wrapped = type(f"KernelSourceError[{cls.__name__}]", (KernelSourceError, cls), {})
        except TypeError:  # an exception class with its own layout cannot be mixed in
            wrapped = KernelSourceError
        _TRACE_ERRORS[cls] = wrapped
    try:
        return wrapped(message, loc)
    except TypeError:
        return KernelSourceError(message, loc)


def _lowering_error(e: Exception) -> KernelSourceError:
    op = getattr(e, "tylopy_op", None)
    if op is None:
        return KernelSourceError(f"code generation failed: {type(e).__name__}: {e}")
    types = ", ".join(str(v.type) for v in op.operands) or "no operands"
    return KernelSourceError(f"{op.opcode} with operands ({types}) cannot be lowered: {type(e).__name__}: {e}", op.loc,
                             hint="this combination passed the op's type rule but has no lowering; use another "
                                  "type (e.g. ty.cast to f32) and report it as a tylopy bug")


_PTX_LINE = re.compile(r"\.ptx, line (\d+)")
_PTX_SOURCE = re.compile(r"^\s*// (\S+):(\d+)  ")


def _with_ptx_source_line(e: Exception, ptx: str) -> Exception:
    """ptxas names a PTX line; add the kernel source line that produced it (from the PTX comments)."""
    m = _PTX_LINE.search(str(e))
    if m is None:
        return e
    lines = ptx.splitlines()[:int(m.group(1))]
    for line in reversed(lines):
        src = _PTX_SOURCE.match(line)
        if src:
            e.args = (f"{e.args[0] if e.args else e} (PTX line {m.group(1)} comes from {src.group(1)}:"
                      f"{src.group(2)})",) + tuple(e.args[1:])
            break
    return e


def _relocated(e: KernelSourceError, loc) -> KernelSourceError:
    """The same error at ``loc`` (raised by library code that did not know the kernel line)."""
    try:
        new = type(e)(e.message, loc, e.hint)
    except TypeError:
        new = KernelSourceError(e.message, loc, e.hint)
    new.__cause__ = e.__cause__
    return new


def _verification_error(e: IRVerificationError) -> KernelSourceError:
    detail = getattr(e, "detail", str(e))
    hint = None
    if "not defined in an enclosing scope" in detail:
        hint = ("a value made inside a run-time if or loop was kept in a Python object and used outside it; "
                "names, lists, tuples, dicts and tile objects are carried out of run-time regions, other objects "
                "(attributes of plain classes, globals) are not: assign the value to a name instead")
    return KernelSourceError(f"the traced IR is invalid: {detail}", getattr(e, "loc", None), hint)


def _constexpr_note(cx: dict) -> str:
    return f" with {', '.join(f'{k}={v!r}' for k, v in cx.items())}" if cx else ""


def _innermost_user_frame() -> SourceLoc | None:
    """The innermost frame of the exception being handled that is the user's code."""
    tb = sys.exc_info()[2]
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_tylopy_file(code.co_filename) and not code.co_filename.startswith("<"):
            found = code_location(code, tb.tb_lasti, tb.tb_lineno)
        tb = tb.tb_next
    return found


class _BoundLaunch:
    __slots__ = ("kernel", "grid")

    def __init__(self, kernel: Kernel, grid):
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args, stream=None, **constexprs):
        ck = self.kernel.compile(**constexprs)
        grid = self.grid(constexprs) if callable(self.grid) else self.grid
        return ck.launcher().launch(grid, args, stream)


def kernel(fn=None, *, threads=128, arch: str = DEFAULT_ARCH, min_blocks_per_sm=None, max_registers=None, name=None,
           noalias: bool = False):
    """Decorate a function as a tylopy kernel.

    ``threads`` is the block size (an int, or a function of the constexprs); ``arch`` the
    target (``sm_90a`` for Hopper-only instructions, ``sm_80`` for portable kernels);
    ``noalias=True`` promises that no two pointer arguments of a launch overlap (LLVM
    ``noalias`` on every pointer parameter; per parameter: ``ty.ptr(ty.f32, noalias=True)``).
    """
    def wrap(f):
        return Kernel(f, threads, arch, min_blocks_per_sm, max_registers, name, noalias)
    return wrap(fn) if fn is not None else wrap
