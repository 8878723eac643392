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
import contextlib
import copy
import dataclasses
import functools
import inspect
import os
import re
import time
import weakref
from typing import Callable

from ..codegen.targets import SUPPORTED_ARCHS
from ..errors import (CompileError, IRVerificationError, KernelSourceError, LaunchTypeError, LayoutError,
                      ResourceLimitError, TylopyError, user_facing)
from ..ir.types import PointerType, ScalarType
from ..ir.values import KernelIR, LaunchBounds, Param
from ..ir.verify import verify
from ..runtime import hooks, plancache
from ..language import capture, tracing
from ..language.annotations import param_kind as _param_kind
from ..language.builder import Builder, user_location
from ..language.diagnostics import (constexpr_note, def_loc, innermost_user_frame, locate, lowering_error, param_loc,
                                    relocated, trace_error, verification_error, with_ptx_source_line)
from ..language.lang import NoAliasPointer, _Constexpr
from ..language.proxy import RuntimeValue
from ..language.rewrite import rewrite_function, source_of
from ..language.tensor import TensorArg, TensorSpec, argument_dtype, dtype_of, expand_tensor_args
from . import guards
from .compiled import CompiledKernel  # noqa: F401  (re-exported: ty.CompiledKernel)
from .launching import _BoundLaunch
from .options import CompileOptions, environment_snapshot, from_environment

__version__ = "0.2.0"
DEFAULT_ARCH = "sm_90a"
# PTX identifiers: what LLVM and ptxas accept as a kernel's symbol without aborting.
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_FUNC_DEPTH = 64
MAX_SPECIALIZATIONS_PER_KEY = 8  # in-memory entries per base key (one per set of read values)


class func:
    """A helper traced inline into the kernel that calls it; its if/for/while may use run-time values."""

    def __init__(self, fn: Callable):
        if not callable(fn) or not hasattr(fn, "__code__"):
            raise TypeError(f"ty.func expects a Python function, but got {fn!r}")
        self.fn = fn
        functools.update_wrapper(self, fn)
        self._traceable = None
        self._depth = 0

    def source_digest(self) -> str:
        """The digest of the source text this helper is traced from (read from its file when it is
        first traced or keyed; part of the key of every kernel that calls it)."""
        if self._traceable is None:
            try:
                self._traceable = rewrite_function(self.fn)
            except KernelSourceError:
                return "no source"  # (calling it says why)
        return self._traceable.source_digest

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


class Kernel:
    """A kernel written in tylopy; ``kernel[grid](*args, **constexprs)`` compiles and launches it."""

    def __init__(self, fn: Callable, threads, arch: str = DEFAULT_ARCH, min_blocks_per_sm: int | None = None,
                 max_registers: int | None = None, name: str | None = None, noalias: bool = False,
                 _register: bool = True, cluster=None):
        if not callable(fn) or not hasattr(fn, "__code__"):
            raise TypeError(f"ty.kernel expects a Python function, but got {fn!r}")
        self.fn = fn
        self.name = fn.__name__ if name is None else name
        if not isinstance(self.name, str) or not _SYMBOL.match(self.name):
            raise KernelSourceError(
                f"kernel name expects letters, digits and underscores, not starting with a digit (a PTX "
                f"symbol), but got {self.name!r}", def_loc(fn), hint="pass name='my_kernel' to @ty.kernel")
        if arch not in SUPPORTED_ARCHS:
            raise KernelSourceError(f"arch expects one of {', '.join(SUPPORTED_ARCHS)}, but got {arch!r}",
                                    def_loc(fn))
        self.threads = threads
        self.arch = arch
        self.cluster = _cluster_dims(fn, self.name, arch, cluster)
        self.min_blocks_per_sm = min_blocks_per_sm
        self.max_registers = max_registers
        self.noalias = bool(noalias)
        self._debug = None  # the compile option debug when set (with_debug), else TYLOPY_DEBUG decides
        source_of(fn)  # no source, no tracing: say so at the decorator, not at the first launch
        self.signature = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise KernelSourceError(f"kernel {self.name!r}: parameter {p.name!r} expects a plain positional "
                                        f"parameter, but it is {p.kind.description}", param_loc(fn, p.name),
                                        hint="kernel parameters are passed by position at launch; constexprs "
                                             "are ordinary parameters annotated ty.constexpr")
            if p.name.startswith("__ty"):
                raise KernelSourceError(f"kernel {self.name!r}: parameter names starting with '__ty' are reserved "
                                        f"for tylopy's rewritten code, but got {p.name!r}", param_loc(fn, p.name))
            if p.annotation is inspect.Parameter.empty:
                raise KernelSourceError(f"kernel {self.name!r}: parameter {p.name!r} needs a type annotation "
                                        "(ty.ptr(ty.f32), ty.i32, ty.constexpr, ...)", param_loc(fn, p.name))
            self.signature.append((p.name, _param_kind(fn, p.name, p.annotation), p.default))
        runtime = [(n, k) for n, k, _ in self.signature if not isinstance(k, _Constexpr)]
        self._runtime_names = frozenset(n for n, _ in runtime)  # a launch keyword in here is an argument
        # (position among the launch arguments, name) of the tensors whose dtype the argument decides
        self._open_tensors = tuple((i, n) for i, (n, k) in enumerate(runtime) if isinstance(k, TensorSpec) and k.open)
        self.source_file = inspect.getsourcefile(fn) or fn.__code__.co_filename
        self._traceable = None
        self._compiled: dict[str, list[CompiledKernel]] = {}
        self._fast: dict[tuple, CompiledKernel] = {}
        self._fast_by_dtype: dict[tuple, CompiledKernel] = {}
        self._kept: dict = {}  # kernel[grid].repeat()'s launch sites
        functools.update_wrapper(self, fn)
        if _register:
            _defined.setdefault(os.path.realpath(self.source_file), weakref.WeakSet()).add(self)

    def __repr__(self):
        return f"<tylopy kernel {self.name} ({self.arch}) from {self.source_file}>"

    def _rewritten(self):
        """The kernel rewritten for tracing, from its file's text when first needed (kept: the key and
        every trace of this object use that same text)."""
        if self._traceable is None:
            self._traceable = rewrite_function(self.fn, record_closure=True)
        return self._traceable

    def source_digest(self) -> str:
        """The digest of the source text this kernel is traced from (part of its cache key)."""
        return self._rewritten().source_digest

    def with_arch(self, arch: str) -> "Kernel":
        """The same kernel compiled for another target (``sm_80``, ``sm_90a``, ...); a new object."""
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(f"arch expects one of {', '.join(SUPPORTED_ARCHS)}, but got {arch!r}")
        # A copy, not a second decoration: the evaluated signature carries over (string annotations
        # naming a factory's locals can be evaluated only while the factory runs); compiles do not.
        other = copy.copy(self)
        other.arch = arch
        other.cluster = _cluster_dims(self.fn, self.name, arch, self.cluster)
        other._compiled, other._fast, other._fast_by_dtype, other._kept = {}, {}, {}, {}
        return other.with_debug(self._debug)

    def with_debug(self, debug: bool | None = True) -> "Kernel":
        """This kernel with the compile option ``debug`` (device asserts and prints) set: True or False
        whatever ``TYLOPY_DEBUG`` says, None to follow it. Returns ``self``."""
        if debug is not None and not isinstance(debug, bool):
            raise KernelSourceError(f"kernel {self.name!r}: debug expects True, False or None, but got {debug!r}",
                                    def_loc(self.fn))
        self._debug = debug
        self.clear_cache()
        return self

    def clear_cache(self) -> None:
        """Forget the specializations compiled in this process (the disk cache stays)."""
        self._compiled.clear()
        self._fast.clear()
        self._fast_by_dtype.clear()
        self._kept.clear()

    # -- specialization ---------------------------------------------------------------------
    @property
    def runtime_params(self):
        """The launch arguments: (name, type); a tensor's type is its ``TensorSpec``."""
        return [(n, k.type if isinstance(k, NoAliasPointer) else k) for n, k, _ in self.signature
                if not isinstance(k, _Constexpr)]

    def runtime_params_for(self, cx: dict):
        """The launch arguments of one specialization (open tensor dtypes filled in from ``cx``)."""
        return tuple((n, k.with_dtype(cx[n]) if isinstance(k, TensorSpec) and k.open else k)
                     for n, k in self.runtime_params)

    def bind_keywords(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """(positional launch arguments, the remaining keywords): run-time arguments given by name
        join the positional ones in signature order. A keyword naming a tensor of open dtype is the
        tensor when its value is not a ty dtype (``x=ty.f16`` still picks the specialization)."""
        runtime = [n for n, _ in self.runtime_params]
        named = {n: kwargs[n] for n in runtime if n in kwargs and not isinstance(kwargs[n], ScalarType)}
        if not named:
            return args, kwargs
        rest = {n: v for n, v in kwargs.items() if n not in named}
        pos = list(args)
        for i, n in enumerate(runtime):
            if i < len(args):
                if n in named:
                    raise LaunchTypeError(f"kernel {self.name!r}: argument {n!r} is given by position and by name")
            elif n in named:
                pos.append(named.pop(n))
            else:
                break
        if named:
            first = next(n for n in runtime[len(pos):])
            raise LaunchTypeError(f"kernel {self.name!r}: argument {next(iter(named))!r} is given by name, but "
                                  f"{first!r} before it is missing (arguments: {', '.join(runtime)})")
        return tuple(pos), rest

    @property
    def constexpr_names(self):
        """The compile-time parameters, and the tensors whose dtype is chosen per specialization."""
        return [n for n, k, _ in self.signature if isinstance(k, _Constexpr) or isinstance(k, TensorSpec) and k.open]

    def options(self) -> CompileOptions:
        """The compile options of a compile started now (the environment is read here)."""
        options = from_environment(self.arch, "all" if self.noalias else "declared")
        return options if self._debug is None else dataclasses.replace(options, debug=self._debug)

    def _constexprs(self, given: dict) -> dict:
        out = {}
        for n, k, default in self.signature:
            if isinstance(k, TensorSpec) and k.open:
                out[n] = self._tensor_dtype(n, given)
                continue
            if not isinstance(k, _Constexpr):
                continue
            if n in given:
                out[n] = given[n]
            elif default is not inspect.Parameter.empty:
                out[n] = default
            else:
                raise LaunchTypeError(f"kernel {self.name!r}: compile-time parameter {n!r} needs a value "
                                      f"(pass {n}=... at launch or compile); declared at {param_loc(self.fn, n)}")
        unknown = set(given) - set(out)
        if unknown:
            raise LaunchTypeError(f"kernel {self.name!r} has no compile-time parameter {sorted(unknown)[0]!r}; "
                                  f"its constexprs are {self.constexpr_names} (kernel defined at {def_loc(self.fn)})")
        return out

    def _tensor_dtype(self, n: str, given: dict) -> ScalarType:
        if n not in given:
            raise LaunchTypeError(f"kernel {self.name!r}: tensor parameter {n!r} takes its dtype from the argument; "
                                  f"to compile without arguments pass {n}=ty.f32 (or another dtype)")
        t = dtype_of(given[n])
        if t is None or t.is_bool or t.kind == "bits":
            raise LaunchTypeError(f"kernel {self.name!r}: tensor parameter {n!r} expects a dtype such as ty.f32 or "
                                  f"torch.bfloat16, but got {given[n]!r}")
        return t

    def _launch_bounds(self, constexprs: dict) -> LaunchBounds:
        open_names = {n for _, n in self._open_tensors}  # (tensor dtypes are not the user's functions' inputs)
        constexprs = {n: v for n, v in constexprs.items() if n not in open_names}

        def resolve(what, x):
            try:
                return x(**constexprs) if callable(x) else x
            except TylopyError:
                raise
            except Exception as e:  # noqa: BLE001 - the user's function: report it at the kernel
                raise trace_error(e, f"kernel {self.name!r}: computing {what} from the constexprs raised "
                                     f"{type(e).__name__}: {e}", def_loc(self.fn)) from None
        threads = resolve("threads", self.threads)
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
            raise ResourceLimitError(f"kernel {self.name!r}: threads per block expects 1..1024, but got {threads!r}")
        mb = resolve("min_blocks_per_sm", self.min_blocks_per_sm)
        mr = resolve("max_registers", self.max_registers)
        for what, x, lo, hi in (("min_blocks_per_sm", mb, 1, 32), ("max_registers", mr, 24, 255)):
            if x is not None and (isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi):
                raise ResourceLimitError(f"kernel {self.name!r}: {what} expects an int in {lo}..{hi}, but got {x!r}")
        return LaunchBounds(threads, mb, mr, self.cluster)

    def trace(self, options: CompileOptions | None = None, recorder: capture.Recorder | None = None,
              **constexprs) -> KernelIR:
        """The verified IR of one specialization."""
        try:
            return self._trace(options, recorder, **constexprs)
        except TylopyError as e:
            raise user_facing(e)  # tylopy's own frames hidden (TYLOPY_TRACEBACK=1 shows them)

    def _trace(self, options: CompileOptions | None = None, recorder: capture.Recorder | None = None,
               **constexprs) -> KernelIR:
        cx = self._constexprs(constexprs)
        options = options or self.options()
        traceable = self._rewritten()
        bounds = self._launch_bounds(cx)
        bld = Builder(options.arch, options)
        bld.threads = bounds.max_threads
        bld.kernel_name = self.name
        params, args = [], []
        for n, k, _ in self.signature:
            if isinstance(k, _Constexpr):
                args.append(cx[n])
                continue
            if isinstance(k, TensorSpec):
                args.append(self._tensor_param(bld, n, k.with_dtype(cx[n]) if k.open else k, options, params))
                continue
            noalias = isinstance(k, NoAliasPointer) or (options.noalias == "all" and isinstance(k, PointerType))
            t = k.type if isinstance(k, NoAliasPointer) else k
            v = bld.new_value(t, n)
            params.append(Param(n, t, v, noalias))
            args.append(RuntimeValue(v))
        with bld, (recorder or contextlib.nullcontext()):  # (only a compile records what the trace reads)
            try:
                out = traceable.make(tracing)(*args)
            except KernelSourceError as e:
                if e.loc is not None:
                    raise
                raise relocated(e, innermost_user_frame()) from None
            except LayoutError as e:  # tile-library misuse: report it at the kernel line that did it
                raise trace_error(e, str(e), innermost_user_frame()) from None
            except TylopyError:
                raise
            except RecursionError:
                raise KernelSourceError(f"kernel {self.name!r}: tracing recursed too deeply (a function that calls "
                                        "itself without a compile-time end?)", innermost_user_frame()) from None
            except Exception as e:  # noqa: BLE001 - Python code in the kernel failed while tracing
                if getattr(e, "names_user_line", False):  # a helper's error that already names the user's line
                    raise
                raise trace_error(e, f"{type(e).__name__} while tracing kernel {self.name!r}{constexpr_note(cx)}: "
                                     f"{e}", innermost_user_frame()) from None
            if out is not None:
                raise KernelSourceError(f"kernel {self.name!r} returns {out!r}; kernels write their results "
                                        "through pointers and return nothing",
                                        locate(self.fn, lambda n: isinstance(n, ast.Return) and n.value is not None))
        kir = KernelIR(name=self.name, params=tuple(params), body=bld.finish(), launch=bounds, arch=options.arch,
                       shared=tuple(bld.shared_allocs), dynamic_shared_bytes=bld.dynamic_shared_bytes,
                       dynamic_shared_align=bld.dynamic_shared_align, source_file=self.source_file,
                       constexprs=tuple(sorted((k, _stable_repr(v)) for k, v in cx.items())),
                       wait_sites=tuple(bld.wait_sites))
        try:
            verify(kir)
        except IRVerificationError as e:
            raise verification_error(e) from None
        return kir

    def traced(self, **constexprs) -> tuple[KernelIR, Callable[[], bool]]:
        """(the verified IR of one specialization, a test that it is still what a trace would give):
        the rule ``compile`` follows (same environment options, same values read), for the emulator."""
        env, recorder = environment_snapshot(), capture.Recorder(self.name)
        kir = self.trace(None, recorder, **constexprs)
        cells = dict(zip(self.fn.__code__.co_freevars, self.fn.__closure__ or ()))
        checks = guards.Guards.build([(r, recorder.values[r], fp) for r, fp in recorder.reads.items()], cells)
        return kir, lambda: env == environment_snapshot() and checks.valid()

    @staticmethod
    def _tensor_param(bld, name: str, spec: TensorSpec, options, params: list) -> TensorArg:
        values = []
        for i, (pname, t) in enumerate(spec.ir_params(name)):
            v = bld.new_value(t, pname)
            noalias = i == 0 and (spec.noalias or options.noalias == "all")
            params.append(Param(pname, t, v, noalias))
            values.append(RuntimeValue(v))
        n = spec.ndim
        strides = values[1 + n:] + ([1] if spec.contiguous else [])
        return TensorArg(name, spec, values[0], values[1:1 + n], strides)

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
        try:
            ck = self._compile(constexprs)
        except TylopyError as e:
            raise user_facing(e)  # tylopy's own frames hidden (TYLOPY_TRACEBACK=1 shows them)
        if key is not None:
            try:
                self._fast[key] = ck
            except TypeError:
                pass
        return ck

    def _compile_for_arguments(self, args, constexprs: dict) -> CompiledKernel:
        """The launch path of a kernel with tensors of open dtype: the arguments' dtypes (torch
        objects, cheap to hash) and the constexprs find the last specialization directly."""
        try:
            key = (tuple(constexprs.items()), *[args[i].dtype for i, _ in self._open_tensors])
            ck = self._fast_by_dtype.get(key)
        except (TypeError, IndexError, AttributeError):
            key = ck = None
        if ck is not None and ck._env == environment_snapshot() and ck._guards.valid():
            return ck
        for i, n in self._open_tensors:  # a tensor's dtype picks the specialization
            if i < len(args):
                constexprs[n] = argument_dtype(self.name, n, args[i])
        ck = self.compile(**constexprs)
        if key is not None:
            self._fast_by_dtype[key] = ck
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
                                self.runtime_params_for(cx), cx, entry.ptx, entry.cubin, entry.report,
                                entry.dynamic_shared_bytes, key, from_cache=True, options=options,
                                wait_sites=entry.wait_sites, cluster=self.cluster,
                                _retrace=functools.partial(self.trace, options, **cx))
            ck._guards = guards.Guards.build(resolved, cells)
        else:
            recorder = capture.Recorder(self.name)
            kir = self.trace(options, recorder, **cx)
            key = cache.full_key(base_key, recorder.key())
            ck = self._build(kir, cx, options, key)
            cache.store(key, base_key, components, recorder.key(), ck)
            ck._guards = guards.Guards.build(
                [(r, recorder.values[r], fp) for r, fp in recorder.reads.items()], cells)
        ck._env = env
        ck.compile_seconds = time.perf_counter() - t0
        entries = self._compiled.setdefault(base_key, [])
        entries.insert(0, ck)
        del entries[MAX_SPECIALIZATIONS_PER_KEY:]
        cache.maybe_dump(ck)
        hooks.compiled(self.name, ck)  # the observers and the log
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
            raise lowering_error(e) from None
        optimized, ptx = optimize_and_emit(llvm_text, options.arch)
        ptx = annotate_source_lines(ptx, kir.source_file)
        try:
            cubin, report = assemble(ptx, options.arch, kernel=kir.name,
                                     dynamic_shared_bytes=kir.dynamic_shared_bytes)
        except (CompileError, ResourceLimitError) as e:
            raise with_ptx_source_line(e, ptx) from None
        return CompiledKernel(self.name, options.arch, kir.launch.max_threads,
                              self.runtime_params_for(cx), cx, ptx, cubin, report,
                              kir.dynamic_shared_bytes, key, options=options, wait_sites=kir.wait_sites,
                              cluster=kir.launch.cluster, _ir=kir, _llvm_ir=llvm_text, _llvm_ir_optimized=optimized)

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
        """Run the kernel on the CPU, lane by lane (see ``tylopy.emulate``). Tensor arguments are CPU
        torch tensors (or numpy arrays); a tensor of open dtype specializes on the argument's dtype."""
        from ..emulate import emulate_kernel
        try:
            if not self._runtime_names.isdisjoint(kwargs):
                args, kwargs = self.bind_keywords(args, kwargs)
            if any(isinstance(k, TensorSpec) for _, k in self.runtime_params):
                kwargs = dict(kwargs)
                for i, n in self._open_tensors:
                    if n not in kwargs and i < len(args):
                        kwargs[n] = argument_dtype(self.name, n, args[i])
                spec = {n: v for n, v in kwargs.items() if n in self.constexpr_names}
                args = expand_tensor_args(self.name, self.runtime_params_for(self._constexprs(spec)), args)
            return emulate_kernel(self, args, grid, **kwargs)
        except TylopyError as e:
            raise user_facing(e)  # tylopy's own frames hidden (TYLOPY_TRACEBACK=1 shows them)


_defined: dict[str, weakref.WeakSet] = {}


def kernels_defined_in(path: str) -> list:
    """The live kernels whose function is in the file ``path`` (decorated there, or by a factory)."""
    return sorted(_defined.get(os.path.realpath(path), ()), key=lambda k: (k.fn.__code__.co_firstlineno, k.name))


def _stable_repr(v) -> str:
    """A constexpr as the IR prints it: the same text on every run (no memory addresses)."""
    text = repr(v)
    if " at 0x" in text:
        name = getattr(v, "__qualname__", None) or type(v).__qualname__
        return f"<{type(v).__name__} {getattr(v, '__module__', '')}.{name}>"
    return text


def kernel(fn=None, *, threads=128, arch: str = DEFAULT_ARCH, min_blocks_per_sm=None, max_registers=None, name=None,
           noalias: bool = False, debug: bool | None = None, cluster=None):
    """Decorate a function as a tylopy kernel.

    ``threads`` is the block size (an int, or a function of the constexprs); ``arch`` the
    target (``sm_90a`` for Hopper-only instructions, ``sm_80`` for portable kernels);
    ``noalias=True`` promises that no two pointer arguments of a launch overlap (LLVM
    ``noalias`` on every pointer parameter; per parameter: ``ty.ptr(ty.f32, noalias=True)``).
    ``debug=True``/``False`` compiles ``ty.device_assert``/``ty.printf`` in or out whatever
    ``TYLOPY_DEBUG`` says (None: as it says). ``cluster=(x, y, z)`` (sm_90) launches the grid in
    thread-block clusters of that shape (at most 8 CTAs; the grid a multiple of it): the CTAs of
    a cluster run at once and share ``ty.cluster_sync`` and each other's shared memory
    (``ty.cluster_map``).
    """
    def wrap(f):
        return Kernel(f, threads, arch, min_blocks_per_sm, max_registers, name, noalias,
                      cluster=cluster).with_debug(debug)
    return wrap(fn) if fn is not None else wrap


MAX_CLUSTER = 8  # the portable cluster size (larger ones need a non-portable opt-in)


def _cluster_dims(fn, name: str, arch: str, cluster):
    """``cluster`` as (x, y, z), or None; errors at the decorator."""
    if cluster is None:
        return None
    dims = (cluster,) if isinstance(cluster, int) and not isinstance(cluster, bool) else cluster
    if not isinstance(dims, (tuple, list)) or not 1 <= len(dims) <= 3 or \
            any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise KernelSourceError(f"kernel {name!r}: cluster expects 1 to 3 positive ints (x, y, z), but got "
                                f"{cluster!r}", def_loc(fn))
    dims = tuple(dims) + (1,) * (3 - len(dims))
    if dims[0] * dims[1] * dims[2] > MAX_CLUSTER:
        raise KernelSourceError(f"kernel {name!r}: cluster expects at most {MAX_CLUSTER} CTAs (x * y * z), but got "
                                f"{dims} = {dims[0] * dims[1] * dims[2]}", def_loc(fn))
    if not arch.startswith("sm_9"):
        raise KernelSourceError(f"kernel {name!r}: cluster expects a kernel for sm_90 or sm_90a (thread-block "
                                f"clusters are Hopper's), but it targets {arch}", def_loc(fn))
    return dims


def _clear_defined_kernels() -> None:
    for kernels in list(_defined.values()):
        for k in list(kernels):
            k.clear_cache()


plancache.on_clear(_clear_defined_kernels)
