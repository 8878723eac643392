"""Forward-mode derivatives of traced code: ``ty.jvp`` and ``ty.value_and_derivative``.

    y, dy = ty.value_and_derivative(fn, x, *args)    # dy = d fn(x, *args) / dx, as run-time values

``fn`` is ordinary kernel code (Python operators, ``ty.exp``, ``ty.tanh``, ``ty.where``,
``ty.minimum``, loads from tensors, ...). It is traced once, as any call would be; then the ops it
appended are walked in order and, for every op a float input's tangent reaches, the op's tangent
(its derivative rule applied to the operands' tangents) is appended after them: the chain rule over
the very ops that compute the value, the dual-number method done on the trace. Derivatives are
thus of what the kernel computes (``ty.exp``'s ``ex2.approx`` composition, ``ty.tanh``'s series
near 0), not of the mathematical function it approximates; within f32 rounding they agree.

Rules (d: the tangent; r: the op's result):

=========================  ==========================================================
add, sub, neg, mul, fma    the sum and product rules
div, rcp                   (da - r db) / b; -r^2 da
exp2, log2, sqrt, rsqrt    r ln2 da; da / (a ln 2); da / (2 r); -r^3 da / 2
abs, min, max, select      the tangent of the operand chosen (abs: -da where a < 0; a tie of
                           min/max takes the first operand's)
rem (floats)               da (the quotient is an integer: a step function of b)
convert                    float -> float converts the tangent; to or from an integer: none
cmp, const, load, ...      no float result depends smoothly on the input: no tangent
=========================  ==========================================================

An op with no rule (``bitcast``, ``pack2``, a shuffle, an atomic, ...) that a tangent reaches is
an error naming the op and the line that traced it; so is run-time control flow (``if``/``for``
on run-time values) that reads a value carrying a tangent (write ``ty.where`` instead). Integer
and Boolean values never carry tangents, so index arithmetic and comparisons are free.
"""
from __future__ import annotations

import math

from ..errors import KernelSourceError
from ..ir.types import ScalarType, f32
from .builder import current_builder
from .proxy import RuntimeValue, as_value, emit1, handle

LN2 = math.log(2.0)
INV_LN2 = 1.0 / LN2


def _is_float(v) -> bool:
    return isinstance(v.type, ScalarType) and v.type.is_float


def _const_like(x: float, v) -> RuntimeValue:
    return as_value(float(x), v.type)


class _Tangents:
    """Tangents by value id (absent: zero), and the rules that extend them over one op."""

    def __init__(self):
        self.of: dict[int, RuntimeValue] = {}

    def get(self, v):
        return self.of.get(v.id)

    def rule(self, op):
        ins = [self.get(v) for v in op.operands]
        if not any(t is not None for t in ins):
            return None  # nothing differentiable flows in: the results carry no tangent
        a = [RuntimeValue(v) for v in op.operands]
        r = RuntimeValue(op.results[0]) if op.results else None
        name = op.opcode

        def t(i):  # operand i's tangent, a zero constant where it has none
            return ins[i] if ins[i] is not None else _const_like(0.0, op.operands[i])

        if name == "add":
            return t(0) + t(1) if ins[0] is not None and ins[1] is not None else (ins[0] if ins[0] is not None else ins[1])
        if name == "sub":
            return t(0) - t(1) if ins[0] is not None else -ins[1]
        if name == "neg":
            return -ins[0]
        if name == "mul":
            if ins[0] is None:
                return a[0] * ins[1]
            if ins[1] is None:
                return ins[0] * a[1]
            return _fma(ins[0], a[1], a[0] * ins[1])
        if name == "fma":  # a b + c
            parts = []
            if ins[0] is not None:
                parts.append(ins[0] * a[1])
            if ins[1] is not None:
                parts.append(a[0] * ins[1])
            if ins[2] is not None:
                parts.append(ins[2])
            out = parts[0]
            for p in parts[1:]:
                out = out + p
            return out
        if name == "div":
            num = t(0) if ins[1] is None else t(0) - r * ins[1]
            return num / a[1]
        if name == "rcp":
            return -(ins[0] * r * r)
        if name == "exp2":
            return ins[0] * r * LN2
        if name == "log2":
            return ins[0] * INV_LN2 / a[0]
        if name == "sqrt":
            return ins[0] * 0.5 / r
        if name == "rsqrt":
            return ins[0] * (r * r * r) * -0.5
        if name == "abs":
            return _select(a[0] < 0.0, -ins[0], ins[0])
        if name in ("min", "max"):  # the tangent of the operand chosen (NaN-ignoring: compare the result)
            return _select(r == a[0], t(0), t(1))
        if name == "select":
            return _select(a[0], t(1), t(2))
        if name == "rem":
            if ins[1] is not None:
                self._fail(op, "a float remainder is differentiated in its first operand only")  # noqa
            return ins[0]
        if name == "convert":
            to = op.attr("to")
            if to.is_float and _is_float(op.operands[0]):
                return emit1("convert", (ins[0],), to=to)
            return None
        if name == "cmp":
            return None
        self._fail(op, "it has no derivative rule")

    def _fail(self, op, why):
        what = ("run-time control flow (a run-time if, for or while) reads a value that depends on the "
                "differentiated input" if op.regions else f"the op '{op.opcode}' reads a value that depends on the differentiated input and {why}")
        raise KernelSourceError(f"ty.jvp expects differentiable operations, but {what}", op.loc,
                                "write the computation with +, -, *, /, ty.exp, ty.exp2, ty.log, ty.tanh, ty.sigmoid, "
                                "ty.where, ty.minimum/ty.maximum, abs and casts between float types"
                                if not op.regions else "select with ty.where(cond, a, b) instead of branching")

    def reads(self, ops) -> bool:
        """Does any op (regions included) read a value carrying a tangent?"""
        for op in ops:
            if any(v.id in self.of for v in op.operands):
                return True
            if any(self.reads(region.ops) for region in op.regions if hasattr(region, "ops")):
                return True
        return False


def _fma(a, b, c):
    return emit1("fma", (a, b, c))


def _select(c, a, b):
    return emit1("select", (c, a, b))


def jvp(fn, primals, tangents):
    """(outputs, output tangents) of ``fn(*primals)``: forward-mode differentiation of the trace.

    ``tangents`` gives one entry per primal: a run-time float value (or Python number), or None for
    an input held constant. ``fn`` may return one value or a tuple/list of values; the tangents
    come back in the same shape, 0.0 (an f32 constant of the output's type) where no input reaches
    an output. Integer outputs get None.
    """
    bld = current_builder()
    primals = tuple(primals)
    tangents = tuple(tangents)
    if len(primals) != len(tangents):
        bld.error(f"ty.jvp expects one tangent per primal, but got {len(tangents)} tangents for {len(primals)} primals")
    seeded = []
    for i, (p, d) in enumerate(zip(primals, tangents)):
        if d is None:
            seeded.append(p)
            continue
        p = as_value(p, f32)
        if not _is_float(p.handle):
            bld.error(f"ty.jvp expects a float primal where a tangent is given, but primal {i} is {p.type}")
        seeded.append((p, as_value(d, p.type)))
    start = bld.op_mark()
    tan = _Tangents()
    call_args = []
    for s in seeded:
        if isinstance(s, tuple):
            tan.of[s[0].handle.id] = s[1]
            call_args.append(s[0])
        else:
            call_args.append(s)
    out = fn(*call_args)
    for op in bld.ops_since(start):
        if op.regions:
            if tan.reads([op]) or any(v.id in tan.of for v in op.operands):
                tan._fail(op, "")
            continue
        d = tan.rule(op)
        if d is not None:
            tan.of[op.results[0].id] = as_value(d)
    single = not isinstance(out, (tuple, list))
    outs = (out,) if single else tuple(out)
    douts = []
    for o in outs:
        if isinstance(o, (int, float)) and not isinstance(o, bool):
            douts.append(0.0)
            continue
        v = handle(o)
        if not _is_float(v):
            douts.append(None)
            continue
        d = tan.of.get(v.id)
        douts.append(d if d is not None else _const_like(0.0, v))
    return (out, douts[0]) if single else (out, type(out)(douts) if isinstance(out, list) else tuple(douts))


def value_and_derivative(fn, x, *args):
    """(fn(x, *args), d fn / dx) for a float ``x``; the other arguments are held constant."""
    return jvp(fn, (x, *args), (1.0, *([None] * len(args))))


__all__ = ["jvp", "value_and_derivative"]
