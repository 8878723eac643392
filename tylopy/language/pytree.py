"""Structures of run-time values that control flow carries: flatten, rebuild, compare, fill.

A name that a run-time ``if`` merges or a run-time loop carries may hold a ``RuntimeValue``,
a tuple, list or dict of them, or any object with ``__tylopy_flatten__`` /
``__tylopy_unflatten__`` (fragments, softmax states). ``flatten`` splits such a value into
its run-time leaves and a static description; ``unflatten`` rebuilds it around new leaves
(block arguments, if results). Everything else is static: it must be the same on every path.
"""
from __future__ import annotations

from typing import Any

from ..errors import KernelSourceError
from ..ir.types import ScalarType, i1
from .builder import current_builder, user_location
from .proxy import RuntimeValue, as_value, python_type_of


class Undefined:
    """A name that has no value on this path (assigned in one branch only, or not yet)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def _fail(self, *args, **kwargs):
        raise KernelSourceError(
            f"{display(self.name)} has no value here: it is assigned on only one path of a run-time "
            "if, or only inside a run-time loop", user_location(),
            hint="assign it before the if/loop so every path defines it")

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):  # protocol probes (hasattr) are not uses
            raise AttributeError(attr)
        self._fail()

    undefined_error = _fail  # found on the class by proxy.handle/as_value, which cannot import this module
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _fail
    __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __index__ = __call__ = __getitem__ = _fail
    __iter__ = _fail


class _NoReturn:
    """The value of a function's return slot before any ``return`` ran (see ``jumps.py``)."""

    __slots__ = ()

    def __repr__(self):
        return "<no return yet>"


NORET = _NoReturn()


def display(name: str) -> str:
    """How the messages name a variable (the flags of ``jumps.py`` get words)."""
    if name == "__tyf_rv":
        return "the returned value"
    if name.startswith("__tyf_"):
        return {"brk": "a loop's break flag", "cont": "a loop's continue flag",
                "ret": "the function's return flag"}.get(name.split("_")[3], name)
    return repr(name)


def lookup(scope: dict, name: str) -> Any:
    return scope.get(name, Undefined(name))


def is_defined(x) -> bool:
    return not isinstance(x, Undefined)


def is_container(x) -> bool:
    return isinstance(x, (tuple, list, dict)) or hasattr(x, "__tylopy_flatten__")


def flatten(x) -> tuple[list[RuntimeValue], Any]:
    """Split ``x`` into its run-time values and a static description to rebuild it."""
    if isinstance(x, RuntimeValue):
        return [x], ("v",)
    if isinstance(x, (tuple, list)):
        leaves, auxes = [], []
        for e in x:
            l, a = flatten(e)
            leaves += l
            auxes.append((len(l), a))
        return leaves, ("seq", type(x), tuple(auxes))
    if isinstance(x, dict):
        keys = tuple(x)
        leaves, a = flatten([x[k] for k in keys])
        return leaves, ("dict", type(x), keys, a)
    if hasattr(x, "__tylopy_flatten__") and not isinstance(x, type):
        leaves, aux = x.__tylopy_flatten__()
        return list(leaves), ("obj", type(x), aux, len(leaves))
    return [], ("static", x)


def unflatten(aux, leaves: list[RuntimeValue]):
    kind = aux[0]
    if kind == "v":
        return leaves[0]
    if kind == "seq":
        out, i = [], 0
        for n, a in aux[2]:
            out.append(unflatten(a, leaves[i:i + n]))
            i += n
        return _rebuild_seq(aux[1], out)
    if kind == "dict":
        values = unflatten(aux[3], leaves)
        out = aux[1]() if aux[1] is not dict else {}
        out.update(zip(aux[2], values))
        return out
    if kind == "obj":
        return aux[1].__tylopy_unflatten__(aux[2], list(leaves))
    return aux[1]


def _rebuild_seq(cls, items):
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):  # a namedtuple takes its fields positionally
        return cls(*items)
    return cls(items)


def copy_tree(x):
    """A fresh container around the same leaves (so two branches never mutate one list)."""
    if not is_container(x):
        return x
    leaves, aux = flatten(x)
    return unflatten(aux, leaves)


def _static_equal(a, b) -> bool:
    if isinstance(a, RuntimeValue) or isinstance(b, RuntimeValue):  # comparing would build an op
        return a is b
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object whose == misbehaves is compared by identity
        return a is b


def same_static(a, b) -> bool:
    """Do two flatten() descriptions agree on everything that is not a run-time value?"""
    if a[0] != b[0]:
        return False
    if a[0] == "static":
        return type(a[1]) is type(b[1]) and _static_equal(a[1], b[1])
    if a[0] == "seq":
        return a[1] is b[1] and len(a[2]) == len(b[2]) and all(
            n1 == n2 and same_static(x, y) for (n1, x), (n2, y) in zip(a[2], b[2]))
    if a[0] == "dict":
        return a[1] is b[1] and a[2] == b[2] and same_static(a[3], b[3])
    if a[0] == "obj":
        return a[1] is b[1] and a[3] == b[3] and _static_equal(a[2], b[2])
    return True


def number_fits(x, t: ScalarType) -> bool:
    """May the Python number ``x`` stand for a value of ``t`` where two paths meet?"""
    if isinstance(x, bool):
        return t.is_bool or t.is_int
    if isinstance(x, float):
        return t.is_float  # 0.0 on one path never silently becomes an integer
    return isinstance(x, int) and not t.is_bool


def _is_number(x) -> bool:
    return isinstance(x, (bool, int, float))


def _merged_number_type(a, b, name: str):
    """The run-time type two different Python numbers from two paths become (same Python type only)."""
    if type(a) is not type(b):
        current_builder().error(
            f"{display(name)} is the Python {type(a).__name__} {a!r} on one path of a run-time if and the "
            f"{type(b).__name__} {b!r} on the other", hint="write both as floats (or both as ints), or convert "
                                                            "with ty.cast")
    if isinstance(a, bool):
        return i1
    if isinstance(a, float):
        return python_type_of(0.0)
    ta, tb = python_type_of(a), python_type_of(b)
    return ta if ta.bits >= tb.bits else tb


def promote(x, like, name: str):
    """``x`` with its Python numbers made run-time values where the other path (``like``) differs.

    A number facing a run-time scalar becomes a constant of its type (if it fits: ``0.0`` never
    becomes an integer); two different numbers of one Python type become run-time values.
    """
    if _is_number(x) and isinstance(like, RuntimeValue) and isinstance(like.type, ScalarType):
        if not number_fits(x, like.type):
            current_builder().error(
                f"{display(name)} is the Python {type(x).__name__} {x!r} on one path and a {like.type} value on "
                "the other", hint=f"write ty.cast({x!r}, ty.{like.type}) if that is what you mean")
        return as_value(x, like.type)
    if _is_number(x) and _is_number(like) and (type(x) is not type(like) or x != like):
        return as_value(x, _merged_number_type(x, like, name))
    if isinstance(x, (tuple, list)) and type(x) is type(like) and len(x) == len(like):
        return _rebuild_seq(type(x), [promote(a, b, name) for a, b in zip(x, like)])
    if isinstance(x, dict) and type(x) is type(like) and list(x) == list(like):
        out = copy_tree(x)
        for k in x:
            out[k] = promote(x[k], like[k], name)
        return out
    return x


def zero_like(x, name: str, boundary: int):
    """A stand-in with ``x``'s structure for the return slot on paths that did not return (it is
    never read there): leaves made before value id ``boundary`` (outside the branch or loop) are
    reused, other scalars become zeros."""
    leaves, aux = flatten(x)
    out = []
    for v in leaves:
        t = v.type
        if v.handle.id < boundary:
            out.append(v)
            continue
        if not isinstance(t, ScalarType):
            current_builder().error(
                f"{display(name)} is a {t} made inside a run-time if or loop on one path and not set on another; "
                "tylopy fills the missing path only for scalars and values made before the if or loop",
                hint="compute the pointer before the if or loop (e.g. with ty.select on the offset) and "
                     "return it after")
        out.append(as_value(False if t == i1 else (0.0 if t.is_float else 0), t))
    return unflatten(aux, out)
