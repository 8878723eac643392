"""Builds IR while a kernel is traced: the active builder, constants, operators, regions.

The tracer makes one ``Builder`` per kernel specialization and makes it current; Python
operators on ``Value`` and every ``ty.*`` function build ops through it. Each op records the
user's source line (the first stack frame outside the tylopy package), so a rejection points
at the kernel, not at tylopy.
"""
from __future__ import annotations

import contextvars
import math
import os
import sys
from typing import Any, Callable, Sequence

from ..errors import KernelSourceError, SourceLoc
from .core import Block, Op, Value
from .ops import SIDE_EFFECTS, OpTypeError, result_types
from .types import PointerType, ScalarType, Type, f32, i1, i32, i64

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_current: contextvars.ContextVar["Builder | None"] = contextvars.ContextVar("tylopy_builder", default=None)


def current_builder() -> "Builder":
    b = _current.get()
    if b is None:
        raise KernelSourceError("tylopy operations can only be used inside a kernel being traced "
                                "(a function decorated with @ty.kernel or @ty.func)", user_location())
    return b


def user_location() -> SourceLoc | None:
    """The innermost stack frame that is not tylopy's own code."""
    frame = sys._getframe(1)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not fname.startswith(_PACKAGE_DIR) and not fname.startswith("<"):
            return SourceLoc(fname, frame.f_lineno, 0, frame.f_code.co_name)
        if fname.startswith("<tylopy"):
            return SourceLoc(fname, frame.f_lineno, 0, frame.f_code.co_name)
        frame = frame.f_back
    return None


class _BlockBuilder:
    __slots__ = ("args", "ops")

    def __init__(self, args=()):
        self.args = tuple(args)
        self.ops: list[Op] = []

    def freeze(self) -> Block:
        return Block(self.args, tuple(self.ops))


class Builder:
    """Appends ops to the innermost block under construction."""

    def __init__(self, arch: str):
        self.arch = arch
        self._blocks: list[_BlockBuilder] = [_BlockBuilder()]
        self.shared_allocs: list = []
        self.dynamic_shared_bytes = 0
        self.dynamic_shared_align = 16
        self.meta: dict[str, Any] = {}
        self._token = None

    # -- activation -----------------------------------------------------------------------
    def __enter__(self):
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc):
        _current.reset(self._token)

    # -- errors ---------------------------------------------------------------------------
    def error(self, message: str, hint: str | None = None, cls=KernelSourceError):
        raise cls(message, user_location(), hint)

    # -- ops ------------------------------------------------------------------------------
    def emit(self, opcode: str, operands: Sequence[Value] = (), regions: Sequence[Block] = (), **attrs) -> tuple[Value, ...]:
        for v in operands:
            if not isinstance(v, Value):
                undefined = getattr(type(v), "undefined_error", None)
                if undefined is not None:
                    undefined(v)
                self.error(f"{opcode} expects IR values as operands, but got {type(v).__name__} {v!r}")
        try:
            types = result_types(opcode, tuple(v.type for v in operands), attrs)
        except OpTypeError as e:
            self.error(str(e))
        results = tuple(Value(t) for t in types)
        op = Op(opcode, tuple(operands), results, tuple(sorted(attrs.items())), tuple(regions), user_location())
        self._blocks[-1].ops.append(op)
        return results

    def emit1(self, opcode: str, operands: Sequence[Value] = (), **attrs) -> Value:
        (r,) = self.emit(opcode, operands, **attrs)
        return r

    def push_block(self, arg_types: Sequence[Type]) -> tuple[Value, ...]:
        blk = _BlockBuilder(Value(t) for t in arg_types)
        self._blocks.append(blk)
        return blk.args

    def pop_block(self) -> Block:
        return self._blocks.pop().freeze()

    def discard_block(self):
        self._blocks.pop()

    def suspend_block(self) -> "_BlockBuilder":
        """Take the innermost block off the stack unfinished (to append to it later)."""
        return self._blocks.pop()

    def resume_block(self, block: "_BlockBuilder"):
        self._blocks.append(block)

    def finish(self) -> Block:
        if len(self._blocks) != 1:
            raise RuntimeError("unbalanced blocks at the end of tracing")
        return self._blocks[0].freeze()

    # -- constants and coercion -----------------------------------------------------------
    def const(self, value, type: ScalarType) -> Value:
        if type.is_float:
            value = float(value)
        elif type.is_bool:
            value = bool(value)
        else:
            value = int(value)
            lo, hi = int_range(type)
            if not lo <= value <= hi:
                self.error(f"constant {value} does not fit {type} (range {lo}..{hi})")
        return self.emit1("const", (), type=type, value=value)


def int_range(t: ScalarType) -> tuple[int, int]:
    if t.is_bool:
        return 0, 1
    if t.kind == "int":
        return -(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1
    return 0, (1 << t.bits) - 1


def python_type_of(x) -> ScalarType | None:
    if isinstance(x, bool):
        return i1
    if isinstance(x, int):
        return i32 if -(2**31) <= x < 2**31 else i64
    if isinstance(x, float):
        return f32
    return None


def as_value(x, like: Type | None = None) -> Value:
    """Turn a Python number into a constant of ``like``'s type (or its natural type)."""
    if isinstance(x, Value):
        return x
    b = current_builder()
    if isinstance(x, (bool, int, float)):
        if like is not None and isinstance(like, ScalarType):
            if isinstance(x, float) and not like.is_float and not math.isinf(x):
                if x != int(x):
                    b.error(f"the float literal {x} cannot be combined with a {like} value",
                            hint=f"convert explicitly with ty.cast(..., ty.{like})")
            return b.const(x, like)
        return b.const(x, python_type_of(x))
    undefined = getattr(type(x), "undefined_error", None)  # tracing._Undefined: a name with no value here
    if undefined is not None:
        undefined(x)
    b.error(f"expected a tylopy value or a Python number, but got {type(x).__name__} {x!r}")


def _coerce_pair(a, b):
    if isinstance(a, Value) and isinstance(b, Value):
        return a, b
    if isinstance(a, Value):
        return a, as_value(b, a.type if isinstance(a.type, ScalarType) else i64)
    if isinstance(b, Value):
        return as_value(a, b.type if isinstance(b.type, ScalarType) else i64), b
    return as_value(a), as_value(b)


def binary(op: str, a, b) -> Value:
    bld = current_builder()
    if op == "add" and isinstance(a, Value) and isinstance(a.type, PointerType):
        return bld.emit1("ptr_add", (a, as_value(b, i32 if not isinstance(b, Value) else b.type)))
    if op == "sub" and isinstance(a, Value) and isinstance(a.type, PointerType) and not isinstance(b, Value):
        return bld.emit1("ptr_add", (a, as_value(-b, i32)))
    if op == "add" and isinstance(b, Value) and isinstance(b.type, PointerType):
        return bld.emit1("ptr_add", (b, as_value(a, i32)))
    a, b = _coerce_pair(a, b)
    if a.type != b.type:
        bld.error(f"{op} expects operands of one type, but got {a.type} and {b.type}",
                  hint="convert one side explicitly with ty.cast")
    return bld.emit1(op, (a, b))


def compare(pred: str, a, b) -> Value:
    a, b = _coerce_pair(a, b)
    bld = current_builder()
    if a.type != b.type:
        bld.error(f"comparison expects operands of one type, but got {a.type} and {b.type}",
                  hint="convert one side explicitly with ty.cast")
    return bld.emit1("cmp", (a, b), pred=pred)


def unary(op: str, a) -> Value:
    return current_builder().emit1(op, (as_value(a),))


# -- structured control flow --------------------------------------------------------------

def _check_yield_types(what: str, expected: Sequence[Type], got: Sequence[Value], names: Sequence[str]):
    for name, t, v in zip(names, expected, got):
        if v.type != t:
            current_builder().error(
                f"{what}: {name!r} is {t} before and {v.type} after; a loop-carried value keeps its type",
                hint="convert it with ty.cast so both sides agree")


def for_loop(lo: Value, hi: Value, step: Value, init: Sequence[Value], names: Sequence[str],
             body: Callable[[Value, tuple[Value, ...]], Sequence[Value]]) -> tuple[Value, ...]:
    """``for iv in range(lo, hi, step)`` with loop-carried ``init``; ``body`` returns the next values."""
    bld = current_builder()
    types = [v.type for v in init]
    args = bld.push_block([lo.type, *types])
    try:
        out = tuple(body(args[0], args[1:]))
        _check_yield_types("for loop", types, out, names)
        bld.emit("yield", out)
    except BaseException:
        bld.discard_block()
        raise
    region = bld.pop_block()
    attrs = {"result_types": tuple(types)}
    return bld.emit("for", (lo, hi, step, *init), regions=(region,), **attrs)


def if_else(cond: Value, then_fn: Callable[[], Sequence[Value]], else_fn: Callable[[], Sequence[Value]],
            result_types: Sequence[Type] | None = None) -> tuple[Value, ...]:
    """Both branches are traced; they yield the values that are live after the ``if``."""
    bld = current_builder()
    regions = []
    outs = []
    for fn in (then_fn, else_fn):
        bld.push_block(())
        try:
            out = tuple(fn())
        except BaseException:
            bld.discard_block()
            raise
        bld.emit("yield", out)
        regions.append(bld.pop_block())
        outs.append(out)
    t_then = tuple(v.type for v in outs[0])
    t_else = tuple(v.type for v in outs[1])
    if t_then != t_else:
        bld.error(f"the two branches of an if produce different types: {t_then} and {t_else}")
    return bld.emit("if", (cond,), regions=tuple(regions), result_types=t_then)


def while_loop(init: Sequence[Value], names: Sequence[str], cond_fn: Callable[[tuple], Value],
               body_fn: Callable[[tuple], Sequence[Value]]) -> tuple[Value, ...]:
    bld = current_builder()
    types = [v.type for v in init]
    args = bld.push_block(types)
    try:
        c = cond_fn(args)
        if not isinstance(c, Value) or c.type != i1:
            bld.error(f"a while condition expects a run-time bool (i1), but got {c!r}")
        bld.emit("condition", (c,))
    except BaseException:
        bld.discard_block()
        raise
    cond_region = bld.pop_block()
    args = bld.push_block(types)
    try:
        out = tuple(body_fn(args))
        _check_yield_types("while loop", types, out, names)
        bld.emit("yield", out)
    except BaseException:
        bld.discard_block()
        raise
    body_region = bld.pop_block()
    return bld.emit("while", tuple(init), regions=(cond_region, body_region), result_types=tuple(types))


def has_side_effect(opcode: str) -> bool:
    return opcode in SIDE_EFFECTS
