"""``@kernel`` and ``@func``: trace a Python function into IR, compile it, launch it.

The pipeline of one specialization (one set of constexpr values) is

    source --rewrite--> traceable function --trace--> KernelIR --verify--> LLVM IR
           --LLVM O3 + NVPTX--> PTX --ptxas--> cubin + report --driver--> CUfunction

Each stage's output is an attribute of ``CompiledKernel`` (``.ir``, ``.llvm_ir``, ``.ptx``,
``.report``). The disk cache keys a specialization by everything that can change its PTX
(see ``cache_key``), so a warm start skips tracing and LLVM entirely.
"""
from __future__ import annotations

import ast
import copy
import functools
import inspect
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import tracing
from .errors import KernelSourceError, LaunchTypeError, ResourceLimitError, SourceLoc
from .ir import builder as _b
from .ir.core import KernelIR, LaunchBounds, Param, Value, format_ir
from .ir.types import PointerType, ScalarType, TensorMapType, Type
from .ir.verify import verify
from .lang import _Constexpr
from .rewrite import rewrite_function

__version__ = "0.1.0"
DEFAULT_ARCH = "sm_90a"


def _locate(fn: Callable, match: Callable[[ast.AST], bool]) -> SourceLoc:
    """The line of the first node in ``fn``'s source that ``match`` accepts (else the ``def`` line)."""
    line = fn.__code__.co_firstlineno
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        node = next((n for n in ast.walk(tree.body[0]) if match(n)), None)
        if node is not None:
            line += node.lineno - 1
    except (OSError, TypeError, SyntaxError):
        pass
    return SourceLoc(inspect.getsourcefile(fn) or "<unknown>", line, 0, fn.__name__)


def _param_loc(fn: Callable, name: str) -> SourceLoc:
    return _locate(fn, lambda n: isinstance(n, ast.arg) and n.arg == name)


def _param_kind(fn: Callable, name: str, ann) -> Any:
    if isinstance(ann, _Constexpr):
        return ann
    if isinstance(ann, (ScalarType, PointerType, TensorMapType)):
        return ann
    raise KernelSourceError(
        f"kernel parameter {name!r} expects an annotation such as ty.ptr(ty.f32), ty.i32, ty.f32, "
        f"ty.tensormap or ty.constexpr, but got {ann!r}", _param_loc(fn, name))


class func:
    """A helper traced inline into the kernel that calls it; its if/for/while may use run-time values."""

    def __init__(self, fn: Callable):
        self.fn = fn
        functools.update_wrapper(self, fn)
        self._traceable = None

    def __call__(self, *args, **kwargs):
        if self._traceable is None:
            self._traceable = rewrite_function(self.fn, tracing)
        return self._traceable(*args, **kwargs)


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
    _ir: KernelIR | None = None
    _llvm_ir: str | None = None
    _llvm_ir_optimized: str | None = None
    _retrace: Callable | None = field(default=None, repr=False)
    _launcher: Any = field(default=None, repr=False)

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
            from .codegen.llvm import lower_kernel
            self._llvm_ir = str(lower_kernel(self.ir))
        return self._llvm_ir

    def launcher(self):
        if self._launcher is None:
            from .runtime.launch import Launcher
            self._launcher = Launcher(self)
        return self._launcher

    def __call__(self, grid, *args, stream=None):
        return self.launcher().launch(grid, args, stream)


class Kernel:
    """A kernel written in tylopy; ``kernel[grid](*args, **constexprs)`` compiles and launches it."""

    def __init__(self, fn: Callable, threads, arch: str = DEFAULT_ARCH, min_blocks_per_sm: int | None = None,
                 max_registers: int | None = None, name: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        self.threads = threads
        self.arch = arch
        self.min_blocks_per_sm = min_blocks_per_sm
        self.max_registers = max_registers
        sig = inspect.signature(fn)
        self.signature = []
        for p in sig.parameters.values():
            if p.annotation is inspect.Parameter.empty:
                raise KernelSourceError(f"kernel {self.name!r}: parameter {p.name!r} needs a type annotation "
                                        "(ty.ptr(ty.f32), ty.i32, ty.constexpr, ...)", _param_loc(fn, p.name))
            self.signature.append((p.name, _param_kind(fn, p.name, p.annotation), p.default))
        self.source_file = inspect.getsourcefile(fn) or "<unknown>"
        self._traceable = None
        self._compiled: dict[Any, CompiledKernel] = {}
        self._fast: dict[tuple, CompiledKernel] = {}
        functools.update_wrapper(self, fn)

    def with_arch(self, arch: str) -> "Kernel":
        """The same kernel compiled for another target (``sm_80``, ``sm_90a``, ...); a new object."""
        from .codegen.ptx import SUPPORTED_ARCHS
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(f"arch expects one of {', '.join(SUPPORTED_ARCHS)}, but got {arch!r}")
        other = copy.copy(self)
        other.arch = arch
        other._compiled = {}
        other._fast = {}
        return other

    # -- specialization ---------------------------------------------------------------------
    @property
    def runtime_params(self):
        return [(n, k) for n, k, _ in self.signature if not isinstance(k, _Constexpr)]

    @property
    def constexpr_names(self):
        return [n for n, k, _ in self.signature if isinstance(k, _Constexpr)]

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
                                  f"its constexprs are {self.constexpr_names} (kernel defined at "
                                  f"{_locate(self.fn, lambda n: isinstance(n, ast.FunctionDef))})")
        return out

    def _launch_bounds(self, constexprs: dict) -> LaunchBounds:
        threads = self.threads(**constexprs) if callable(self.threads) else self.threads
        if not isinstance(threads, int) or not 1 <= threads <= 1024:
            raise ResourceLimitError(f"kernel {self.name!r}: threads per block expects 1..1024, but got {threads!r}")
        mb = self.min_blocks_per_sm(**constexprs) if callable(self.min_blocks_per_sm) else self.min_blocks_per_sm
        mr = self.max_registers(**constexprs) if callable(self.max_registers) else self.max_registers
        return LaunchBounds(threads, mb, mr)

    def trace(self, **constexprs) -> KernelIR:
        """The verified IR of one specialization."""
        cx = self._constexprs(constexprs)
        if self._traceable is None:
            self._traceable = rewrite_function(self.fn, tracing)
        bounds = self._launch_bounds(cx)
        bld = _b.Builder(self.arch)
        params = []
        args = []
        for n, k, _ in self.signature:
            if isinstance(k, _Constexpr):
                args.append(cx[n])
            else:
                v = Value(k, n)
                params.append(Param(n, k, v))
                args.append(v)
        with bld:
            out = self._traceable(*args)
            if out is not None:
                raise KernelSourceError(f"kernel {self.name!r} returns {out!r}; kernels write their results "
                                        "through pointers and return nothing",
                                        _locate(self.fn, lambda n: isinstance(n, ast.Return) and n.value is not None))
        body = bld.finish()
        kir = KernelIR(self.name, tuple(params), body, bounds, self.arch, tuple(bld.shared_allocs),
                       bld.dynamic_shared_bytes, bld.dynamic_shared_align, self.source_file,
                       tuple(sorted((k, repr(v)) for k, v in cx.items()))
                       + (("wait_sites", tuple(bld.meta.get("wait_sites", ()))),))
        verify(kir)
        return kir

    def compile(self, **constexprs) -> CompiledKernel:
        """Compile (or fetch from the memory or disk cache) one specialization."""
        try:  # the launch path: the same keyword arguments as last time, no normalization
            fast = self._fast.get(tuple(constexprs.items()))
        except TypeError:  # an unhashable constexpr value
            fast = None
        if fast is not None:
            return fast
        ck = self._compile(constexprs)
        try:
            self._fast[tuple(constexprs.items())] = ck
        except TypeError:
            pass
        return ck

    def _compile(self, constexprs: dict) -> CompiledKernel:
        cx = self._constexprs(constexprs)
        mkey = tuple(sorted((k, _hashable(v)) for k, v in cx.items()))
        ck = self._compiled.get(mkey)
        if ck is not None:
            return ck
        from . import cache
        t0 = time.perf_counter()
        key, components = cache.cache_key(self, cx)
        entry = cache.load(key)
        if entry is not None:
            ck = CompiledKernel(self.name, self.arch, self._launch_bounds(cx).max_threads,
                                tuple((n, k) for n, k in self.runtime_params), cx, entry.ptx, entry.cubin, entry.report,
                                entry.dynamic_shared_bytes, key, from_cache=True,
                                _retrace=functools.partial(self.trace, **cx))
        else:
            ck = self._build(cx, key)
            cache.store(key, components, ck)
        ck.compile_seconds = time.perf_counter() - t0
        self._compiled[mkey] = ck
        cache.maybe_dump(ck)
        return ck

    def _build(self, cx: dict, key: str) -> CompiledKernel:
        from .codegen.llvm import lower_kernel
        from .codegen.ptx import annotate_source_lines, optimize_and_emit
        from .codegen.ptxas import assemble
        kir = self.trace(**cx)
        llvm_text = str(lower_kernel(kir))
        optimized, ptx = optimize_and_emit(llvm_text, self.arch)
        ptx = annotate_source_lines(ptx)
        cubin, report = assemble(ptx, self.arch)
        return CompiledKernel(self.name, self.arch, kir.launch.max_threads,
                              tuple((p.name, p.type) for p in kir.params), cx, ptx, cubin, report,
                              kir.dynamic_shared_bytes, key, _ir=kir, _llvm_ir=llvm_text,
                              _llvm_ir_optimized=optimized)

    def cache_explain(self, **constexprs) -> str:
        """Why this specialization would miss (or hit) the disk cache."""
        from . import cache
        return cache.explain(self, self._constexprs(constexprs))

    # -- launch -------------------------------------------------------------------------------
    def __getitem__(self, grid):
        return _BoundLaunch(self, grid)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"kernel {self.name!r} is launched with a grid: {self.name}[grid](*args)")

    def emulate(self, *args, grid, **kwargs):
        """Run the kernel on the CPU, lane by lane (see ``tylopy.emulate``)."""
        from .emulate import emulate_kernel
        return emulate_kernel(self, args, grid, **kwargs)


def _hashable(v):
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


class _BoundLaunch:
    __slots__ = ("kernel", "grid")

    def __init__(self, kernel: Kernel, grid):
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args, stream=None, **constexprs):
        ck = self.kernel.compile(**constexprs)
        grid = self.grid(constexprs) if callable(self.grid) else self.grid
        return ck.launcher().launch(grid, args, stream)


def kernel(fn=None, *, threads=128, arch: str = DEFAULT_ARCH, min_blocks_per_sm=None, max_registers=None, name=None):
    """Decorate a function as a tylopy kernel.

    ``threads`` is the block size (an int, or a function of the constexprs); ``arch`` the
    target (``sm_90a`` for Hopper-only instructions, ``sm_80`` for portable kernels).
    """
    def wrap(f):
        return Kernel(f, threads, arch, min_blocks_per_sm, max_registers, name)
    return wrap(fn) if fn is not None else wrap
