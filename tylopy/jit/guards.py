"""Guards: is a specialization compiled earlier in this process still valid for the values now?

The disk cache keys PTX by the fingerprints of what a trace read (``capture.py``); in memory,
recomputing fingerprints on every launch would cost too much, so each compiled specialization
keeps ``Guards`` over the same reads and the launch path re-checks them.
"""
from __future__ import annotations

import enum
import functools
import keyword
import operator
import os
import sys
import types

from ..errors import CaptureError
from ..language.capture import _SIMPLE, UNBOUND, _is_user_module, _library_function, fingerprint, global_names, unwrap

_MISSING = object()


class Guards:
    """The checks that keep a compiled specialization in memory valid for its process.

    One check per value the trace read, and per global a plain helper function named (those
    are fingerprinted, not traced): the value must still be the same object, and a mutable one
    (list, dict, namespace, object) must still equal a copy taken when it was read. The checks
    run on every launch, as one generated function (``valid``): the immutable values of one module
    are a single ``itemgetter`` call and a tuple comparison, the others one expression each.
    """

    __slots__ = ("_batches", "_mutable", "_count", "valid")

    def __init__(self, batches=(), mutable=(), count=0):
        self._batches = tuple(batches)  # (itemgetter over names, mapping, tuple of the values seen)
        self._mutable = tuple(mutable)  # (getter, value seen, its snapshot or None, its fingerprint)
        self._count = count
        self.valid = _compiled_check(self._batches, self._mutable)

    def __len__(self) -> int:
        return self._count

    def checked_one_by_one(self) -> bool:
        """What ``valid()`` computes, as a loop (``valid`` is that loop compiled into one expression)."""
        try:
            for get, d, seen in self._batches:
                if get(d) != seen:
                    return False
            for get, witness, snap, fp in self._mutable:
                v = get()
                if snap is _EQUAL:
                    if v != witness:
                        return False
                elif v is not witness or not _same_content(v, snap, fp):
                    return False
        except Exception:  # noqa: BLE001 - a name or attribute that went away
            return False
        return True

    @staticmethod
    def build(reads, closure_cells: dict) -> "Guards":
        """``reads``: (Read, value, fingerprint) triples; ``closure_cells``: the kernel's cells by name."""
        checks = _GuardBuilder()
        for read, value, fp in reads:
            if read.kind == "closure":
                cell = closure_cells.get(read.name)
                if cell is not None:
                    checks.add(_cell_getter(cell), None, None, value, fp)
            elif read.kind == "unbound":  # still not bound (a global of that name now shadows the builtin)
                module = sys.modules.get(read.owner)
                if module is not None:
                    checks.mutable.append((functools.partial(vars(module).get, read.name, UNBOUND), UNBOUND,
                                           _IDENTITY, None))
            elif read.kind == "env":  # (a new str each read: compared by value)
                checks.mutable.append((functools.partial(os.environ.get, read.name), value, _EQUAL, None))
            elif read.kind == "global":
                module = sys.modules.get(read.owner)
                if module is not None:
                    checks.add(None, vars(module), read.name, value, fp)
            else:
                checks.add(_AttrRead(read), None, None, value, fp)
            checks.follow(value)
        return checks.finish()


class _AttrRead:
    """``resolve(read, {})`` for an attribute path, with the parsing done once (it runs per launch;
    a module or name gone raises, which ``Guards.valid`` counts as changed)."""

    __slots__ = ("owner", "head", "rest", "_tail")

    def __init__(self, read):
        self.owner = read.owner
        self.head, _, self.rest = read.name.partition(".")
        self._tail = operator.attrgetter(self.rest) if self.rest else None

    def __call__(self):
        value = vars(sys.modules[self.owner])[self.head]
        return self._tail(value) if self._tail is not None else value

    def expression(self, env: dict, i: int) -> str:
        """The same read as Python source over names it puts in ``env``."""
        env[f"o{i}"], env[f"h{i}"] = self.owner, self.head
        text = f"vars(modules[o{i}])[h{i}]"
        if self.rest:
            if not all(part.isidentifier() and not keyword.iskeyword(part) for part in self.rest.split(".")):
                env[f"a{i}"] = self._tail
                return f"a{i}({text})"
            text += "." + self.rest
        return text



def _compiled_check(batches, mutable):
    """``Guards.checked_one_by_one`` as one generated function: a chain of comparisons with no loop,
    no call per identity check and attribute reads inlined (the launch path runs it every time)."""
    env = {"modules": sys.modules, "vars": vars}
    terms = []
    for i, (get, d, seen) in enumerate(batches):
        env[f"g{i}"], env[f"d{i}"], env[f"s{i}"] = get, d, seen
        terms.append(f"g{i}(d{i}) == s{i}")
    for i, (get, witness, snap, fp) in enumerate(mutable):
        env[f"w{i}"] = witness
        if isinstance(get, _AttrRead):
            read = get.expression(env, i)
        else:
            env[f"m{i}"] = get
            read = f"m{i}()"
        if snap is _IDENTITY:
            terms.append(f"{read} is w{i}")
        elif snap is _EQUAL:
            terms.append(f"{read} == w{i}")
        else:
            env[f"n{i}"], env[f"f{i}"] = snap, fp
            terms.append(f"same_value({read}, w{i}, n{i}, f{i})")
    env["same_value"] = lambda v, witness, snap, fp: v is witness and _same_content(v, snap, fp)
    source = ("def valid():\n"
              "    try:\n"
              f"        return {' and '.join(terms) or 'True'}\n"
              "    except Exception:  # a name or attribute that went away\n"
              "        return False\n")
    exec(compile(source, "<tylopy guards>", "exec"), env)
    return env["valid"]


class _GuardBuilder:
    def __init__(self):
        self.by_dict: dict = {}  # id(mapping) -> (mapping, {name: value})
        self.mutable: list = []
        self.seen: set = set()
        self.keys: set = set()

    def add(self, getter, d, name, value, fp=None):
        """One check: the same object, and for a mutable one the same content (a long list or an array
        a helper names too: checked by content, as the disk key hashes it)."""
        if d is not None:
            if (id(d), name) in self.keys:
                return
            self.keys.add((id(d), name))
        if _immutable(value):
            if d is not None:
                self.by_dict.setdefault(id(d), (d, {}))[1][name] = value
            else:
                self.mutable.append((getter, value, _IDENTITY, None))
            return
        if getter is None:
            getter = functools.partial(d.__getitem__, name)
        if fp is None:
            fp = _fingerprint_or_none(value)
        self.mutable.append((getter, value, _snapshot(value), fp))

    def follow(self, value, depth: int = 0):
        """Add checks for what a plain function or user class refers to (fingerprinted, not traced)."""
        value = unwrap(value)
        target = getattr(value, "fn", None)
        if isinstance(target, types.FunctionType) and type(value).__module__.startswith("tylopy"):
            value = target
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if id(value) in self.seen or depth > 8:
            return
        if isinstance(value, types.FunctionType) and _library_function(value) is None:
            self.seen.add(id(value))
            fn = value
            for attr in ("__defaults__", "__kwdefaults__"):  # a default mutated in place is a new input
                if getattr(fn, attr):
                    self.add(functools.partial(getattr, fn, attr), None, None, getattr(fn, attr))
            for cell in fn.__closure__ or ():
                try:
                    contents = cell.cell_contents
                except ValueError:
                    continue
                self.add(_cell_getter(cell), None, None, contents)
                self.follow(contents, depth + 1)
            g = value.__globals__
            for name in global_names(value.__code__):
                if name in g:
                    self.add(None, g, name, g[name])
                    self.follow(g[name], depth + 1)
        elif isinstance(value, type) and _is_user_module(sys.modules.get(value.__module__) or types):
            self.seen.add(id(value))
            members = vars(value)
            for name, v in list(members.items()):
                if not (name.startswith("__") and name.endswith("__")):
                    self.add(None, members, name, v)
                    self.follow(v, depth + 1)

    def finish(self) -> Guards:
        batches = []
        for d, named in self.by_dict.values():
            names = tuple(named)
            get = operator.itemgetter(*names)
            seen = tuple(named.values()) if len(names) > 1 else named[names[0]]
            batches.append((get, d, seen))
        return Guards(batches, self.mutable, sum(len(n) for _, n in self.by_dict.values()) + len(self.mutable))


_IDENTITY = object()  # snapshot marker: the identity test is the whole check
_EQUAL = object()  # snapshot marker: the value read now must equal the one seen (environment variables)


def _same_content(value, snap, fp) -> bool:
    if snap is _IDENTITY:
        return True
    if snap is not None:
        try:
            if type(snap) is _ArraySnapshot:
                import numpy as np
                old = snap[0]
                if value.shape == old.shape and value.dtype == old.dtype and np.array_equal(value, old, equal_nan=True):
                    return True
            elif (vars(value) == snap[1]) if type(snap) is _VarsSnapshot else (value == snap):
                return True
        except Exception:  # noqa: BLE001 - a value whose comparison fails: its fingerprint decides
            pass
    # no fingerprint: a value a plain helper names that has none (the key counts it by its type), so
    # the same object is all there is to check
    return fp is None or _fingerprint_or_none(value) == fp


class _VarsSnapshot(tuple):
    """(class, copy of the instance's __dict__): an object compared by its attributes."""


class _ArraySnapshot(tuple):
    """(a copy of a numpy array,): compared element by element."""


def _snapshot(value):
    """A copy of a mutable value made of plain data (numbers, strings, tylopy types, functions,
    containers of them), compared with ``==`` later (at C speed); None when it holds something
    else (then its fingerprint decides)."""
    try:
        if type(value).__module__ == "numpy" and hasattr(value, "copy") and hasattr(value, "shape"):
            return _ArraySnapshot((value.copy(),))
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            return _plain_copy(value)
        if hasattr(value, "__dict__") and not isinstance(value, type):
            return _VarsSnapshot((type(value), _plain_copy(dict(vars(value)))))
    except _NotPlain:
        pass
    return None


class _NotPlain(Exception):
    pass


def _plain_copy(value, depth: int = 0):
    """A deep copy with the same container types (shared immutable leaves), or ``_NotPlain``."""
    if depth > 16:
        raise _NotPlain
    if _immutable(value):
        return value
    if isinstance(value, list):
        return [_plain_copy(x, depth + 1) for x in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(_plain_copy(x, depth + 1) for x in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: _plain_copy(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return type(value)(_plain_copy(x, depth + 1) for x in value)
    raise _NotPlain


def _cell_getter(cell):
    return lambda: cell.cell_contents


def _fingerprint_or_none(value):
    try:
        return fingerprint(value, "")
    except CaptureError:
        return None


def _immutable(value) -> bool:
    """Is the identity of ``value`` enough to know its fingerprint did not change?"""
    if isinstance(value, _SIMPLE) or isinstance(value, (types.ModuleType, types.FunctionType, type, enum.Enum,
                                                       types.BuiltinFunctionType, staticmethod, classmethod,
                                                       property)):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(x) for x in value)
    cls = type(value)
    if cls.__module__.startswith("tylopy"):
        params = getattr(cls, "__dataclass_params__", None)
        return params is None or params.frozen  # tylopy's types and wrappers are immutable values
    return cls.__module__ == "torch" and cls.__name__ == "dtype"
