"""``RuntimeValue``: what kernel code holds for a run-time value, and the Python operators on it.

An IR ``Value`` is plain data; a ``RuntimeValue`` wraps one (its ``handle``) while a kernel is
traced and turns Python's operators into ops through the active builder, the split Triton
makes between ``tl.tensor`` and its IR handle::

    i = ty.block_idx() * 256 + ty.thread_idx()    # RuntimeValue i32: mul, add
    if i < n:                                     # cmp -> i1; the rewritten if takes it
        out[i] = x[i] + 1.0                       # ptr_add, load, add, store

Semantics of the integer operators (the same in codegen, the emulator and the docs): ``//``
and ``%`` truncate toward zero as C and PTX do (``-7 // 2 == -3``, ``-7 % 2 == -1``); a
run-time division by zero gives all ones (``%`` gives the dividend); a shift by the type's
width or more gives 0 (an arithmetic right shift of a negative value gives -1). A
compile-time shift amount out of range, or a compile-time zero divisor, is an error.
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

from ..ir.types import FLOAT_MAX, PointerType, ScalarType, Type, f32, i1, i32, i64, int_range
from ..ir.values import Value
from .builder import current_builder


class RuntimeValue:
    """A run-time scalar or pointer of a kernel being traced (wraps the IR value ``handle``)."""

    __slots__ = ("handle",)

    def __init__(self, handle: Value):
        self.handle = handle

    @property
    def type(self) -> Type:
        return self.handle.type

    def __repr__(self) -> str:
        return f"RuntimeValue(%{self.handle.id}: {self.handle.type})"

    __hash__ = object.__hash__  # identity: == builds a comparison op

    # -- what Python cannot do with a run-time value ----------------------------------------------
    def __bool__(self):
        current_builder().error(
            "a run-time value was used where Python needs a compile-time bool "
            "(and/or/not, a chained comparison, x if c else y, or bool())",
            hint="write a & b for `a and b`, a | b for `a or b`, ~a for `not a`, (a < b) & (b < c) for "
                 "`a < b < c`, ty.select(c, x, y) for `x if c else y`; or make the value a ty.constexpr")

    def __index__(self):
        current_builder().error(
            "a run-time value was used where a compile-time integer is needed",
            hint="declare the parameter as ty.constexpr, or compute the value from constexprs")

    def __iter__(self):
        current_builder().error("a run-time scalar cannot be iterated")

    def __float__(self):
        current_builder().error("a run-time value was used where Python needs a compile-time float",
                                hint="keep it a run-time value, or make it a ty.constexpr")

    __int__ = __index__

    # -- comparisons and arithmetic -------------------------------------------------------------------
    def __eq__(self, other):
        return compare("eq", self, other)

    def __ne__(self, other):
        return compare("ne", self, other)

    def __lt__(self, other):
        return compare("lt", self, other)

    def __le__(self, other):
        return compare("le", self, other)

    def __gt__(self, other):
        return compare("gt", self, other)

    def __ge__(self, other):
        return compare("ge", self, other)

    def __neg__(self):
        return unary("neg", self)

    def __invert__(self):
        return unary("not", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return unary("abs", self)

    # -- pointers index like arrays ----------------------------------------------------------------
    def __getitem__(self, index):
        if not isinstance(self.type, PointerType):
            current_builder().error(f"indexing expects a pointer, but got a {self.type} value")
        return emit1("load", (self + index,), vec=1)

    def __setitem__(self, index, value):
        if not isinstance(self.type, PointerType):
            current_builder().error(f"indexed store expects a pointer, but got a {self.type} value")
        p = self + index
        emit("store", (p, as_value(value, self.type.pointee)))


def _binop(op: str, reverse: bool = False):
    def method(self, other):
        return binary(op, other, self) if reverse else binary(op, self, other)
    method.__name__ = f"__{'r' if reverse else ''}{op}__"
    return method


def _truediv(reverse: bool):
    def method(self, other):
        if isinstance(self.type, ScalarType) and not self.type.is_float:
            current_builder().error(
                f"/ on {self.type} values: Python's / gives a float, but this is an integer value",
                hint="write // for integer division (it truncates toward zero, as C does), or convert with "
                     "ty.cast(..., ty.f32) for a float quotient")
        return binary("div", other, self) if reverse else binary("div", self, other)
    method.__name__ = f"__{'r' if reverse else ''}truediv__"
    return method


RuntimeValue.__truediv__, RuntimeValue.__rtruediv__ = _truediv(False), _truediv(True)
for _name, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("floordiv", "div"),
                   ("mod", "rem"), ("and", "and"), ("or", "or"), ("xor", "xor"), ("lshift", "shl"),
                   ("rshift", "shr")):
    setattr(RuntimeValue, f"__{_name}__", _binop(_op))
    setattr(RuntimeValue, f"__r{_name}__", _binop(_op, reverse=True))


# -- building ops from kernel code ----------------------------------------------------------------------

def handle(x) -> Value:
    """The IR value under a RuntimeValue (or an IR value itself)."""
    if isinstance(x, RuntimeValue):
        return x.handle
    if isinstance(x, Value):
        return x
    _not_a_value(x)


def _not_a_value(x):
    undefined = getattr(type(x), "undefined_error", None)  # tracing._Undefined: a name with no value here
    if undefined is not None:
        undefined(x)
    current_builder().error(f"expected a tylopy value or a Python number, but got {type(x).__name__} {x!r}")


def emit(opcode: str, operands: Sequence = (), regions=(), **attrs) -> tuple[RuntimeValue, ...]:
    """Build one op from RuntimeValues (or IR values); returns its results as RuntimeValues."""
    return tuple(RuntimeValue(r) for r in current_builder().emit(opcode, [handle(v) for v in operands],
                                                                  regions, **attrs))


def emit1(opcode: str, operands: Sequence = (), **attrs) -> RuntimeValue:
    (r,) = emit(opcode, operands, **attrs)
    return r


def const(value, type: ScalarType) -> RuntimeValue:
    """A constant of ``type``; a value that does not fit the type is an error at the kernel line."""
    bld = current_builder()
    if type.is_float:
        value = float(value)
        if math.isfinite(value) and abs(value) > FLOAT_MAX.get(type.name, math.inf):
            bld.error(f"constant {value!r} does not fit {type} (largest finite {FLOAT_MAX[type.name]:.6g})",
                      hint="use float('inf') for an infinity, or a wider type")
    elif type.is_bool:
        value = bool(value)
    else:
        value = int(value)
        lo, hi = int_range(type)
        if not lo <= value <= hi:
            bld.error(f"constant {value} does not fit {type} (range {lo}..{hi})")
    return emit1("const", (), type=type, value=value)


def python_type_of(x) -> ScalarType | None:
    if isinstance(x, bool):
        return i1
    if isinstance(x, int):
        return i32 if -(2**31) <= x < 2**31 else i64
    if isinstance(x, float):
        return f32
    return None


def as_value(x, like: Type | None = None) -> RuntimeValue:
    """A RuntimeValue for ``x``: itself, or a Python number as a constant of ``like``'s type."""
    if isinstance(x, RuntimeValue):
        return x
    if isinstance(x, Value):
        return RuntimeValue(x)
    if isinstance(x, numbers.Real) and not isinstance(x, (bool, int, float)):
        x = x.item() if hasattr(x, "item") else float(x)  # numpy scalars
    if isinstance(x, (bool, int, float)):
        if like is not None and isinstance(like, ScalarType):
            if isinstance(x, float) and not like.is_float and math.isfinite(x) and x != int(x):
                current_builder().error(f"the float literal {x} cannot be combined with a {like} value",
                                        hint=f"convert explicitly with ty.cast(..., ty.{like})")
            if isinstance(x, float) and not like.is_float and not math.isfinite(x):
                current_builder().error(f"the float literal {x} cannot be combined with a {like} value")
            return const(x, like)
        return const(x, python_type_of(x))
    _not_a_value(x)


def _coerce_pair(a, b):
    if isinstance(a, RuntimeValue) and isinstance(b, RuntimeValue):
        return a, b
    if isinstance(a, RuntimeValue):
        return a, as_value(b, a.type if isinstance(a.type, ScalarType) else i64)
    if isinstance(b, RuntimeValue):
        return as_value(a, b.type if isinstance(b.type, ScalarType) else i64), b
    return as_value(a), as_value(b)


def _check_constant_operand(op: str, t: ScalarType, b):
    """Compile-time shift amounts and divisors whose result the DSL leaves undefined are errors."""
    if not isinstance(b, (int, float)) or isinstance(b, bool) or not t.is_int:
        return
    if op in ("shl", "shr") and not 0 <= b < t.bits:
        current_builder().error(f"shift by {b} is out of range for {t} (0..{t.bits - 1})")
    if op in ("div", "rem") and b == 0:
        current_builder().error(f"integer {'division' if op == 'div' else 'remainder'} by the constant 0")


def binary(op: str, a, b) -> RuntimeValue:
    bld = current_builder()
    if isinstance(a, RuntimeValue) and isinstance(a.type, PointerType):
        if op == "add":
            return emit1("ptr_add", (a, as_value(b, b.type if isinstance(b, RuntimeValue) else i32)))
        if op == "sub" and not isinstance(b, RuntimeValue):
            return emit1("ptr_add", (a, as_value(-b, i32)))
    if op == "add" and isinstance(b, RuntimeValue) and isinstance(b.type, PointerType):
        return emit1("ptr_add", (b, as_value(a, i32)))
    if isinstance(a, RuntimeValue) and isinstance(a.type, ScalarType):
        _check_constant_operand(op, a.type, b)
    a, b = _coerce_pair(a, b)
    if a.type != b.type:
        bld.error(f"{op} expects operands of one type, but got {a.type} and {b.type}",
                  hint="convert one side explicitly with ty.cast")
    return emit1(op, (a, b))


def compare(pred: str, a, b) -> RuntimeValue:
    a, b = _coerce_pair(a, b)
    if a.type != b.type:
        current_builder().error(f"comparison expects operands of one type, but got {a.type} and {b.type}",
                                hint="convert one side explicitly with ty.cast")
    return emit1("cmp", (a, b), pred=pred)


def unary(op: str, a) -> RuntimeValue:
    return emit1(op, (as_value(a),))


def is_runtime(x) -> bool:
    return isinstance(x, RuntimeValue)


__all__ = ["RuntimeValue", "handle", "emit", "emit1", "const", "as_value", "binary", "compare", "unary",
           "python_type_of", "is_runtime", "f32"]


# -- min / max: kernel-visible as ty.minimum / ty.maximum, and behind min()/max() of run-time values

def _same_pair(op, a, b):
    like = a.type if isinstance(a, Value) else (b.type if isinstance(b, Value) else None)
    a, b = as_value(a, like), as_value(b, like)
    if a.type != b.type:
        current_builder().error(f"{op} expects operands of one type, but got {a.type} and {b.type}")
    return a, b


def minimum(a, b) -> Value:
    return emit1("min", _same_pair("minimum", a, b))


def maximum(a, b) -> Value:
    """max(a, b); for floats, NaN-ignoring like PTX max.f32 (a -inf operand gives the other)."""
    return emit1("max", _same_pair("maximum", a, b))
