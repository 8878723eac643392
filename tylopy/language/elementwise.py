"""Elementwise math built from the hardware ops (``exp2``, ``log2``, ``rcp``, ``fma``, conversions).

They are compositions traced into ordinary IR, so the emulator runs them exactly as the GPU does
and nothing new is lowered. All take and give f32 (a compile-time number becomes an f32
constant). The error bounds below leave room for ``ex2.approx``/``lg2.approx``'s own error on
the GPU (PTX ISA: 2**-22.5 relative; the emulator computes them exactly) and are checked
against float64 in tests/test_elementwise.py.

* ``exp(x)``: e**x as ``ex2.approx`` of x log2(e) carried in two parts (the product's rounding
  error corrected with one FMA): relative error below 2**-21 for results in the normal range.
  Results below 2**-126 flush to zero (``ex2.approx.ftz``); exp(-inf) = 0, exp(+inf) = inf.
* ``log(x)``: natural log, ``lg2.approx`` times ln 2: absolute error below 2**-21 on [0.5, 2],
  relative error below 2**-21 elsewhere; log(0) = -inf, log(x < 0) = NaN.
* ``sigmoid(x)``: 1 / (1 + exp(-x)), correctly rounded reciprocal; 0 and 1 at the infinities.
* ``tanh(x)``: odd; (1 - e) / (1 + e) with e = exp(-2|x|), and a Taylor series for |x| < 2**-4
  (where 1 - e would cancel). Absolute error below 2**-22; relative error below 2**-21 except
  for 2**-4 <= |x| < 0.5, where it stays below 2**-18 (the cancellation in 1 - e).
* ``floor(x)``, ``ceil(x)``: exact, through a conversion to i32 with the rounding direction;
  values of 2**23 and more (already integers), infinities and NaN pass through, and a zero result
  keeps x's sign (floor(-0.0) = -0.0, ceil(-0.5) = -0.0).
* ``where(cond, a, b)``: ``select`` under the name numpy and Triton use.
"""
from __future__ import annotations

import math

from ..ir.types import f32, i32
from .lang import abs, cast, exp2, fma, log2, rcp, select  # noqa: A004 - the kernel language's abs
from .builder import current_builder
from .proxy import RuntimeValue, as_value

LOG2E = 1.4426950408889634
LOG2E_HI = 1.4426950216293335      # LOG2E rounded to f32
LOG2E_LO = LOG2E - LOG2E_HI        # what the f32 constant misses (about 1.9e-8)
LN2 = math.log(2.0)
TWO_23 = float(1 << 23)            # from here on every f32 is an integer
SMALL_TANH = 2.0 ** -4             # below: tanh from its Taylor series


def _f32(fn: str, x) -> RuntimeValue:
    if isinstance(x, RuntimeValue) and x.type != f32:
        current_builder().error(f"ty.{fn} expects an f32 value, but got {x.type}",
                                hint=f"convert it first: ty.{fn}(ty.cast(x, ty.f32))")
    if not isinstance(x, (RuntimeValue, int, float)) or isinstance(x, bool):
        current_builder().error(f"ty.{fn} expects an f32 value or a Python number, but got {type(x).__name__}")
    return as_value(x, f32)


def exp(x) -> RuntimeValue:
    """e**x for f32 (module docstring: error, flushing, infinities)."""
    x = _f32("exp", x)
    t = x * LOG2E_HI
    # the exact rounding error of x * LOG2E_HI, plus the part of log2(e) the constant misses
    e = fma(x, LOG2E_HI, -t) + x * LOG2E_LO
    r = exp2(t)
    corrected = fma(r, e * LN2, r)  # 2**(t + e) = 2**t (1 + e ln 2 + ...)
    return select((r == 0.0) | (r == math.inf), r, corrected)  # there e may be NaN (inf - inf)


def log(x) -> RuntimeValue:
    """The natural logarithm of an f32 (module docstring)."""
    return log2(_f32("log", x)) * LN2


def sigmoid(x) -> RuntimeValue:
    """1 / (1 + e**-x) for f32."""
    return rcp(exp(-_f32("sigmoid", x)) + 1.0)


def tanh(x) -> RuntimeValue:
    """The hyperbolic tangent of an f32 (module docstring: error bounds)."""
    x = _f32("tanh", x)
    a = abs(x)
    e = exp(a * -2.0)
    t = (1.0 - e) * rcp(e + 1.0)
    t = select(x < 0.0, -t, t)
    # near 0, 1 - e cancels: the odd Taylor series x (1 - x^2/3 + 2x^4/15 - 17x^6/315) instead,
    # whose next term is below 2**-37 of x there (and -0.0 stays -0.0); NaN falls through to t
    a2 = a * a
    series = x * fma(a2, fma(a2, fma(a2, -17.0 / 315.0, 2.0 / 15.0), -1.0 / 3.0), 1.0)
    return select(a < SMALL_TANH, series, t)


def _round_integral(x, direction: str) -> RuntimeValue:
    x = _f32("floor" if direction == "rm" else "ceil", x)
    r = cast(cast(x, i32, rounding=direction), f32)
    r = select(r == 0.0, x * 0.0, r)  # a zero result keeps x's sign
    return select(abs(x) < TWO_23, r, x)  # large values, infinities and NaN pass through


def floor(x) -> RuntimeValue:
    """The largest integer not above x, as an f32 (exact)."""
    return _round_integral(x, "rm")


def ceil(x) -> RuntimeValue:
    """The smallest integer not below x, as an f32 (exact)."""
    return _round_integral(x, "rp")


def where(cond, a, b) -> RuntimeValue:
    """``a`` where ``cond`` holds, else ``b`` (``ty.select``)."""
    return select(cond, a, b)


__all__ = ["exp", "log", "sigmoid", "tanh", "floor", "ceil", "where"]
