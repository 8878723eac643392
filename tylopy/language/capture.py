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
Functions (plain helpers and ``@ty.func`` bodies) are fingerprinted by their compiled code (so
editing one changes the key) together with their defaults, closure and the current values of
the globals their code names; classes of user modules by their members. Library code (tylopy,
the standard library, installed packages) counts by name and version.

Each read is kept as a ``Read`` recipe (where to find the value again) with its fingerprint,
so a later process can resolve the same recipes and look the PTX up without tracing. Within a
process, ``guards.py`` re-checks the same reads on every launch.
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
    kernel function; ``owner`` is ""), "attr" (``name`` a dotted path from a module global) or
    "env" (an environment variable; its value, or None when unset) or "unbound" (a module global
    the trace looked for and did not find, so Python used the builtin: ``UNBOUND`` while it stays so)."""

    kind: str
    owner: str
    name: str

    def describe(self) -> str:
        if self.kind == "closure":
            return f"closure variable {self.name!r}"
        if self.kind == "env":
            return f"environment variable {self.name}"
        if self.kind == "unbound":
            return f"{self.owner}.{self.name} (unbound, so the builtin)"
        return f"{self.owner}.{self.name}"

    def as_json(self) -> list:
        return [self.kind, self.owner, self.name]


class _Unbound:
    """The value of a module global that is not bound (the name means the builtin)."""

    __slots__ = ()

    def __tylopy_fingerprint__(self):
        return "unbound"

    def __repr__(self):
        return "<unbound>"


UNBOUND = _Unbound()


class Unresolvable(LookupError):
    """A recorded read that cannot be found again in this process (a module not loaded, a name gone)."""


def resolve(read: Read, closure: dict):
    """The current value of a recorded read (``closure``: the kernel function's closure by name)."""
    if read.kind == "closure":
        if read.name not in closure:
            raise Unresolvable(read.name)
        return closure[read.name]
    if read.kind == "env":
        return os.environ.get(read.name)
    module = sys.modules.get(read.owner)
    if module is None:
        raise Unresolvable(read.owner)
    if read.kind == "unbound":
        return vars(module).get(read.name, UNBOUND)
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
        self.values: dict = {}  # the value each read found (for the in-memory cache's guards)
        self._token = None

    def __enter__(self):
        _record_environment()
        self._token = _active.set(self)
        return self

    def __exit__(self, *exc):
        _active.reset(self._token)

    def note(self, read: Read, value) -> None:
        if read not in self.reads:
            self.reads[read] = fingerprint(value, read.describe(), self.kernel_name)
            self.values[read] = value

    def key(self) -> list:
        return [[*r.as_json(), fp] for r, fp in self.reads.items()]


def _record(read: Read, value):
    rec = _active.get()
    if rec is not None:
        rec.note(read, value)
        if _is_recordable_namespace(value):
            return AttributeRecorder(value, read)
    return value


class _RecordingEnviron(type(os.environ)):
    """``os.environ`` with its reads recorded while a trace is active in this context (``get``,
    ``in`` and ``[]`` all read through ``__getitem__``): a kernel whose trace reads an environment
    variable is keyed by its value, like any other value read from outside."""

    def __getitem__(self, key):
        try:
            value = super().__getitem__(key)
        except KeyError:
            _note_env(key, None)
            raise
        _note_env(key, value)
        return value


def _note_env(key, value):
    rec = _active.get()
    if rec is not None and isinstance(key, str):
        rec.note(Read("env", "", key), value)


def _record_environment() -> None:
    """Install the recording ``os.environ`` class (once; outside a trace it only reads)."""
    env = os.environ
    if type(env) is not _RecordingEnviron and type(env) is _RecordingEnviron.__mro__[1]:
        env.__class__ = _RecordingEnviron


def note_closure(name: str, value):
    """Record a closure variable of the kernel being traced (and wrap a namespace value)."""
    return _record(Read("closure", "", name), value)


class RecordingGlobals(dict):
    """An empty globals mapping for rewritten kernel code: every lookup is read from the real
    module globals (live, so rebinding a global is seen) and recorded by the active trace."""

    def __init__(self, module_globals: dict, builtin_names: dict | None = None):
        super().__init__()
        self._globals = module_globals
        self._module = module_globals.get("__name__", "?")
        if builtin_names is not None:
            self["__builtins__"] = builtin_names
        elif "__builtins__" in module_globals:
            self["__builtins__"] = module_globals["__builtins__"]

    def __missing__(self, name):
        g = self._globals
        if name not in g:  # then Python looks in the builtins; a global bound later must be seen
            _record(Read("unbound", self._module, name), UNBOUND)
            raise KeyError(name)
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
    """Not tylopy, the standard library, a built-in module or an installed package (a module made
    without a file, such as one built by exec, counts as the user's)."""
    if getattr(module, "__name__", None) in sys.builtin_module_names:
        return False
    f = _module_file(module)
    if not f:
        return True
    return not (f.startswith(_PKG + os.sep) or f.startswith(_STDLIB + os.sep) or "site-packages" in f
                or "dist-packages" in f)


def module_fingerprint(module) -> str:
    """A module by name (and version for installed packages). What a trace reads from a user module
    is recorded attribute by attribute, so the module's file content adds nothing to the key."""
    name = getattr(module, "__name__", "?")
    f = _module_file(module)
    if f is None or f.startswith(_PKG + os.sep) or f.startswith(_STDLIB + os.sep) or _is_user_module(module) \
            or name in sys.builtin_module_names:
        return f"module {name}"
    return f"module {name} {getattr(module, '__version__', '')}"  # an installed package: its version says enough


def _library_function(fn) -> str | None:
    """tylopy's, the standard library's and installed packages' functions: by name (and version)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or _is_user_module(module):
        return None
    return f"{module_fingerprint(module)} {fn.__qualname__}"


def code_digest(code) -> str:
    """The function's compiled code as Python runs it (bytecode, constants, names, line table, nested
    code): it changes when the source changes, and is what the trace actually executes."""
    return _code_digest_cached(code, code.co_filename)  # code objects compare equal across files


@functools.lru_cache(maxsize=8192)
def _code_digest_cached(code, filename: str) -> str:
    h = hashlib.sha256()
    todo = [code]
    while todo:
        c = todo.pop()
        h.update(c.co_code)
        h.update(repr((c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars, c.co_firstlineno, c.co_argcount,
                       c.co_kwonlyargcount, os.path.basename(c.co_filename))).encode())
        h.update(c.co_linetable)
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                todo.append(k)
            else:
                h.update(repr(k).encode())
    return h.hexdigest()[:16]


def global_names(code) -> list[str]:
    """The names a function's code (with its nested functions and comprehensions) may read as globals."""
    names, todo = [], [code]
    while todo:
        c = todo.pop()
        names.extend(n for n in c.co_names if n not in names)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


_SIMPLE = (type(None), bool, int, float, complex, str, bytes)


class TooDeep(CaptureError):
    """A value nested deeper than fingerprints follow (refused even where other values count by type)."""


MAX_DEPTH = 32  # nesting a fingerprint follows; deeper values are refused (never keyed by a prefix)
LONG_FINGERPRINT = 512  # a longer fingerprint (a long list, a large dict) is kept as its SHA-256


def fingerprint(value, path: str, kernel: str = "", _seen: tuple = (), _depth: int = 0) -> str:
    """A string that changes when ``value`` changes, computed from the value, never its identity.

    Raises ``CaptureError`` naming ``path`` for a value tylopy cannot fingerprint, or one nested
    deeper than ``MAX_DEPTH``.
    """
    text = _fingerprint(value, path, kernel, _seen, _depth)
    if len(text) > LONG_FINGERPRINT:
        return f"{type(unwrap(value)).__name__} sha256:{hashlib.sha256(text.encode()).hexdigest()[:32]}"
    return text


def _fingerprint(value, path: str, kernel: str, _seen: tuple, _depth: int) -> str:
    value = unwrap(value)
    if isinstance(value, _SIMPLE):
        return f"{type(value).__name__}:{value!r}"
    if id(value) in _seen:  # a cycle: say which enclosing value it returns to
        return f"<cycle to level {_seen.index(id(value))}>"
    if _depth >= MAX_DEPTH:
        raise TooDeep(
            f"kernel {kernel!r} reads {path} while tracing, a value nested more than {MAX_DEPTH} levels deep; "
            "tylopy keys kernels by the content of the values a trace reads and does not follow it that far",
            None, hint="pass the part the kernel needs as a ty.constexpr or a flatter global")
    seen = _seen + (id(value),)

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
        # @ty.func / @ty.kernel: the function they wrap, and the source text they are traced from
        digest = getattr(value, "source_digest", None)
        inner = fingerprint(target, path, kernel, _seen, _depth)
        return f"{inner} text {digest()}" if callable(digest) else inner
    if isinstance(value, (staticmethod, classmethod)):
        return f"{type(value).__name__}({fp(value.__func__, path)})"
    if isinstance(value, property):
        return f"property({fp((value.fget, value.fset, value.fdel), path)})"
    if isinstance(value, functools.partial):
        return f"partial({fp(value.func, path)}, {fp(value.args, path)}, {fp(value.keywords, path)})"
    if isinstance(value, (types.FunctionType, types.MethodType)):
        fn = value.__func__ if isinstance(value, types.MethodType) else value
        bound = f" self={fp(value.__self__, path)}" if isinstance(value, types.MethodType) else ""
        library = _library_function(fn)
        if library is not None:
            return f"function {library}{bound}"
        return f"function {fn.__qualname__} {code_digest(fn.__code__)}{_function_inputs(fn, path, fp)}{bound}"
    if isinstance(value, (types.BuiltinFunctionType, type(len))):
        return f"builtin {getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"
    if isinstance(value, type):
        module = sys.modules.get(value.__module__)
        if module is None or not _is_user_module(module):
            return f"class {module_fingerprint(module) if module else value.__module__} {value.__qualname__}"
        members = sorted((k, v) for k, v in vars(value).items() if not (k.startswith("__") and k.endswith("__")))
        return f"class {value.__qualname__} {{" + ",".join(
            f"{k}:{_lenient(fp, v, f'{path}.{k}')}" for k, v in members) + "}"
    if isinstance(value, enum.Enum):
        return f"enum {type(value).__qualname__}.{value.name}"
    if type(value).__module__ == "numpy" or type(value).__module__.startswith("numpy."):
        import numpy as np
        if isinstance(value, np.ndarray) and value.dtype.hasobject:  # (its bytes would be addresses)
            return f"ndarray {value.dtype} {value.shape} {fp(value.tolist(), path)}"
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


def _function_inputs(fn, path: str, fp) -> str:
    """What a plain function reads besides its code: defaults, closure and the globals its code names.

    A kernel calls plain Python helpers without tracing their global reads, so their values are
    fingerprinted here. Such a value that cannot be fingerprinted counts by its type (a helper
    that only touches it outside the kernel must not stop compilation).
    """
    parts = []
    if fn.__defaults__:
        parts.append(f" defaults={fp(fn.__defaults__, path)}")
    if fn.__kwdefaults__:
        parts.append(f" kwdefaults={fp(fn.__kwdefaults__, path)}")
    cells = [c.cell_contents if _cell_filled(c) else None for c in (fn.__closure__ or ())]
    if cells:
        parts.append(f" closure={_lenient(fp, cells, f'{path} (closure of {fn.__qualname__})')}")
    g = fn.__globals__
    used = {n: g[n] for n in global_names(fn.__code__) if n in g and g[n] is not fn}
    if used:
        parts.append(" globals={" + ",".join(f"{n}:{_lenient(fp, v, f'{path} (global {n} of {fn.__qualname__})')}"
                                             for n, v in sorted(used.items())) + "}")
    return "".join(parts)


def _lenient(fp, value, path: str) -> str:
    try:
        return fp(value, path)
    except TooDeep:
        raise
    except CaptureError:
        return f"<{type(value).__module__}.{type(value).__qualname__}>"


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
