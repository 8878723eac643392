"""Epilogue functions for ``tylopy.matmul``: functions of one f32 value written with ``ty.*``.

They run in the GEMM kernel on every output element after the bias is added, before rounding to
the output dtype. Any function of that shape works (a ``@ty.func`` or a plain module-level
function: the compile cache keys it by its source); ``scale(alpha)`` shows how to pass a
number (a ``functools.partial``, keyed by its arguments).
"""
from __future__ import annotations

import functools

import tylopy as ty

SQRT_2_OVER_PI = 0.7978845608028654
GELU_CUBIC = 0.044715
TWO_LOG2E = 2.8853900817779268  # exp(2u) = ex2(2 log2(e) u)
LOG2E = 1.4426950408889634


@ty.func
def relu(x):
    return ty.maximum(x, 0.0)


@ty.func
def gelu(x):
    """GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh(u) = 1 - 2 / (1 + e^{2u}).

    ex2 and rcp are the approximate hardware forms (about 2 ulp); e^{2u} = inf gives tanh = 1.
    """
    u = x * (SQRT_2_OVER_PI + (SQRT_2_OVER_PI * GELU_CUBIC) * (x * x))
    tanh = 1.0 - 2.0 * ty.rcp(1.0 + ty.exp2(u * TWO_LOG2E))
    return (0.5 * x) * (1.0 + tanh)


@ty.func
def silu(x):
    """x * sigmoid(x) = x / (1 + e^{-x})."""
    return x * ty.rcp(1.0 + ty.exp2(x * -LOG2E))


def _scaled(x, alpha):
    return x * alpha


def scale(alpha: float):
    """An epilogue multiplying by ``alpha`` (one compiled kernel per value)."""
    return functools.partial(_scaled, alpha=float(alpha))


__all__ = ["relu", "gelu", "silu", "scale"]
