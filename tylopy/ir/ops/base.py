"""What every family of type rules shares: the error class and small checks.

A rule takes the operand types and the attributes and returns the result types, or raises
``OpTypeError`` with a message in the form "X expects A, but got B".
"""
from __future__ import annotations

from ..types import ScalarType, Type


class OpTypeError(Exception):
    """An op was built with operands or attributes its rule rejects."""


def expect(cond: bool, message: str):
    if not cond:
        raise OpTypeError(message)


def same(op: str, ts) -> Type:
    expect(all(t == ts[0] for t in ts), f"{op} expects operands of one type, but got {', '.join(map(str, ts))}")
    return ts[0]


def scalar(op: str, t: Type, what: str = "operand") -> ScalarType:
    expect(isinstance(t, ScalarType), f"{op} expects a scalar {what}, but got {t}")
    return t




def none(n_operands: int = 0):
    """A rule for an op with ``n_operands`` operands and no results."""
    def rule(ts, attrs):
        expect(len(ts) == n_operands, f"expects {n_operands} operands, but got {len(ts)}")
        return ()
    return rule


def passthrough(ts, attrs):
    """Results of the operands' types (ops that tie values, such as wgmma_wait)."""
    return tuple(ts)
