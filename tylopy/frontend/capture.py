"""What a trace reads from outside the kernel, and fingerprints of those values for the cache key.

A kernel's PTX depends on its source, its constexprs and every value its trace reads from
outside: module globals, closure variables, attributes of modules and namespaces reached
through them. The trace records each such read (``Recorder``); the compile cache keys the PTX
by the *values* read (``fingerprint``), never by identity, so editing ``SCALE = [2.0]`` to
``[3.0]``, changing ``DT = ty.f32`` to ``ty.bf16`` or rebinding a closure variable gives a new
key. A value that cannot be fingerprinted by value is an error that names it.

How reads are seen: the rewritten kernel and ``@ty.func`` bodies run with a globals mapping
whose lookups go through ``RecordingGlobals.__missing__``; closure variables are read when the
traceable is made for a trace; user modules and ``SimpleNamespace`` objects reached through a
global are handed out wrapped in an ``AttributeRecorder`` that records each attribute read.
Plain (not ``@ty.func``) helper functions and classes are fingerprinted by the source file of
their module, so editing them changes the key; a value they read from a global and that is
mutated in memory without editing any file is not seen (docs/design.md, "compile cache").

Each read is kept as a ``Read`` recipe (where to find the value again) with its fingerprint,
so a later process can resolve the same recipes and look the PTX up without tracing.
"""
from __future__ import annotations

import contextvars
import enum
import functools
import hashlib
import os
import sys
import sysconfig
import types
from dataclasses import dataclass, fields, is_dataclass

from ..errors import CaptureError

_active: contextvars.ContextVar["Recorder | None"] = contextvars.ContextVar("tylopy_recorder", default=None)
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])


@dataclass(frozen=True)
class Read:
    """One value a trace read: ``kind`` is "global" (``owner`` a module name), "closure" (of the
    kernel function; ``owner`` is "") or "attr" (``name`` a dotted path from a module global)."""

    kind: str
    owner: str
    name: str

    def describe(self) -> str:
        if self.kind == "closure":
            return f"closure variable {self.name!r}"
        return f"{self.owner}.{self.name}"

    def as_json(self) -> list:
        return [self.kind, self.owner, self.name]


class Unresolvable(LookupError):
    """A recorded read that cannot be found again in this process (a module not loaded, a name gone)."""


def resolve(read: Read, closure: dict):
    """The current value of a recorded read (``closure``: the kernel function's closure by name)."""
    if read.kind == "closure":
        if read.name not in closure:
            raise Unresolvable(read.name)
        return closure[read.name]
    module = sys.modules.get(read.owner)
    if module is None:
        raise Unresolvable(read.owner)
    head, *rest = read.name.split(".")
    try:
        value = vars(module)[head]
        for part in rest:
            value = getattr(value, part)
    except (KeyError, AttributeError):
        raise Unresolvable(read.describe()) from None
    return value


class Recorder:
    """The reads of one trace, in first-read order, each with its fingerprint."""

    def __init__(self, kernel_name: str):
        self.kernel_name = kernel_name
        self.reads: dict[Read, str] = {}
        self._token = None

    def __enter__(self):
        self._token = _active.set(self)
        return self

    def __exit__(self, *exc):
        _active.reset(self._token)

    def note(self, read: Read, value) -> None:
        if read not in self.reads:
            self.reads[read] = fingerprint(value, read.describe(), self.kernel_name)

    def key(self) -> list:
        return [[*r.as_json(), fp] for r, fp in self.reads.items()]


def _record(read: Read, value):
    rec = _active.get()
    if rec is not None:
        rec.note(read, value)
        if _is_recordable_namespace(value):
            return AttributeRecorder(value, read)
    return value


def note_closure(name: str, value):
    """Record a closure variable of the kernel being traced (and wrap a namespace value)."""
    return _record(Read("closure", "", name), value)


class RecordingGlobals(dict):
    """An empty globals mapping for rewritten kernel code: every lookup is read from the real
    module globals (live, so rebinding a global is seen) and recorded by the active trace."""

    def __init__(self, module_globals: dict):
        super().__init__()
        self._globals = module_globals
        self._module = module_globals.get("__name__", "?")
        if "__builtins__" in module_globals:
            self["__builtins__"] = module_globals["__builtins__"]

    def __missing__(self, name):
        g = self._globals
        if name not in g:
            raise KeyError(name)  # then Python looks in the builtins
        return _record(Read("global", self._module, name), g[name])


class AttributeRecorder:
    """A user module or namespace handed to kernel code: attribute reads are recorded."""

    __slots__ = ("_target", "_read")

    def __init__(self, target, read: Read):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_read", read)

    def __getattr__(self, name):
        value = getattr(self._target, name)
        read = self._read
        return _record(Read("attr", read.owner, f"{read.name}.{name}"), value)

    def __setattr__(self, name, value):
        setattr(self._target, name, value)

    def __repr__(self):
        return repr(self._target)


def unwrap(x):
    return object.__getattribute__(x, "_target") if isinstance(x, AttributeRecorder) else x


def _is_recordable_namespace(value) -> bool:
    if isinstance(value, types.SimpleNamespace):
        return True
    return isinstance(value, types.ModuleType) and _is_user_module(value)


# -- fingerprints ------------------------------------------------------------------------------------

def _module_file(module) -> str | None:
    f = getattr(module, "__file__", None)
    return os.path.realpath(f) if f else None


def _is_user_module(module) -> bool:
    f = _module_file(module)
    if not f:
        return False
    return not (f.startswith(_PKG + os.sep) or f.startswith(_STDLIB + os.sep) or "site-packages" in f
                or "dist-packages" in f)


@functools.lru_cache(maxsize=4096)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def file_digest(path: str) -> str:
    """Content hash of a source file (cached by path, mtime and size)."""
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    return _file_digest(path, st.st_mtime_ns, st.st_size)


def module_fingerprint(module) -> str:
    """A module by its name, version and source file content (tylopy's own by name: its source
    hash is a key component of its own)."""
    name = getattr(module, "__name__", "?")
    f = _module_file(module)
    if f is None or f.startswith(_PKG + os.sep) or f.startswith(_STDLIB + os.sep):
        return f"module {name}"
    version = getattr(module, "__version__", "")
    if not _is_user_module(module):
        return f"module {name} {version}"  # an installed package: its version says enough
    return f"module {name} {version} {file_digest(f)}"


def _code_fingerprint(fn) -> str:
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    where = module_fingerprint(module) if module is not None else repr(fn.__code__.co_filename)
    if module is None or _module_file(module) is None:
        # No file to hash (a function made by exec): its bytecode and constants stand for its source.
        code = fn.__code__
        where += " " + hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:16]
    return f"{where} {fn.__qualname__}"


_SIMPLE = (type(None), bool, int, float, complex, str, bytes)


def fingerprint(value, path: str, kernel: str = "", _seen: frozenset = frozenset(), _depth: int = 0) -> str:
    """A string that changes when ``value`` changes, computed from the value, never its identity.

    Raises ``CaptureError`` naming ``path`` for a value tylopy cannot fingerprint.
    """
    value = unwrap(value)
    if isinstance(value, _SIMPLE):
        return f"{type(value).__name__}:{value!r}"
    if _depth > 32 or id(value) in _seen:
        return f"<cycle {type(value).__qualname__}>"
    seen = _seen | {id(value)}

    def fp(x, sub):
        return fingerprint(x, sub, kernel, seen, _depth + 1)

    custom = getattr(type(value), "__tylopy_fingerprint__", None)
    if custom is not None:
        return f"{type(value).__qualname__}({custom(value)})"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}[" + ",".join(fp(x, f"{path}[{i}]") for i, x in enumerate(value)) + "]"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}{{" + ",".join(sorted(fp(x, f"{path} element") for x in value)) + "}"
    if isinstance(value, dict):
        items = sorted((fp(k, f"{path} key"), fp(v, f"{path}[{k!r}]")) for k, v in value.items())
        return "dict{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    if isinstance(value, types.ModuleType):
        return module_fingerprint(value)
    target = getattr(value, "fn", None)
    if isinstance(target, types.FunctionType) and type(value).__module__.startswith("tylopy"):
        value = target  # @ty.func / @ty.kernel: the function they wrap
    if isinstance(value, functools.partial):
        return f"partial({fp(value.func, path)}, {fp(value.args, path)}, {fp(value.keywords, path)})"
    if isinstance(value, (types.FunctionType, types.MethodType)):
        fn = value.__func__ if isinstance(value, types.MethodType) else value
        cells = [c.cell_contents if _cell_filled(c) else None for c in (fn.__closure__ or ())]
        extra = f" closure={fp(cells, f'{path} (closure of {fn.__qualname__})')}" if cells else ""
        defaults = f" defaults={fp(fn.__defaults__, path)}" if fn.__defaults__ else ""
        bound = f" self={fp(value.__self__, path)}" if isinstance(value, types.MethodType) else ""
        return f"function {_code_fingerprint(fn)}{extra}{defaults}{bound}"
    if isinstance(value, (types.BuiltinFunctionType, type(len))):
        return f"builtin {getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"
    if isinstance(value, type):
        module = sys.modules.get(value.__module__)
        return f"class {module_fingerprint(module) if module else value.__module__} {value.__qualname__}"
    if isinstance(value, enum.Enum):
        return f"enum {type(value).__qualname__}.{value.name}"
    if type(value).__module__ == "numpy" or type(value).__module__.startswith("numpy."):
        import numpy as np
        if isinstance(value, np.ndarray):
            return f"ndarray {value.dtype} {value.shape} {hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:16]}"
        if isinstance(value, np.generic):
            return f"{type(value).__name__}:{value.item()!r}"
        if isinstance(value, np.dtype):
            return f"dtype {value}"
    cls = type(value)
    if cls.__module__ == "torch" and cls.__name__ == "dtype":
        return f"torch.{value}"
    if cls.__module__.startswith("tylopy.") and not is_dataclass(value):
        text = repr(value)
        if " at 0x" not in text:
            return f"{cls.__qualname__}:{text}"
    if is_dataclass(value):
        return f"{cls.__qualname__}(" + ",".join(
            f"{f.name}={fp(getattr(value, f.name), f'{path}.{f.name}')}" for f in fields(value)) + ")"
    if isinstance(value, types.SimpleNamespace) or (hasattr(value, "__dict__") and not _is_foreign(cls)):
        return f"{fp(cls, path)}{{" + fp(vars(value), path) + "}"
    raise CaptureError(
        f"kernel {kernel!r} reads {path} while tracing, a {cls.__module__}.{cls.__qualname__} that tylopy "
        "cannot fingerprint by value for the compile cache (it keys kernels by the values a trace reads)",
        None, hint="pass it as a kernel argument or a ty.constexpr of plain values (numbers, strings, tuples, "
                   "tylopy types), or give its class a __tylopy_fingerprint__(self) -> str method")


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _is_foreign(cls) -> bool:
    """Objects of installed packages (tensors, streams, devices...) have no value-based identity here."""
    module = sys.modules.get(cls.__module__)
    return module is None or not _is_user_module(module)


def active() -> Recorder | None:
    return _active.get()
