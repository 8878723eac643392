"""Type rules of structured control flow: ``for``, ``if``, ``while`` and their terminators.

``for`` operands: (lo, hi, step, *carried); it iterates while ``iv < hi`` for a positive step and
``iv > hi`` for a negative one (a zero step runs nothing). ``if`` operands: (cond,). ``while``
operands: the carried values; its first region ends in ``condition``, its second in ``yield``.
"""
from __future__ import annotations


def _region_op(ts, attrs):
    return tuple(attrs["result_types"])


RULES = {
    "for": _region_op, "if": _region_op, "while": _region_op, "yield": lambda ts, a: (),
    "condition": lambda ts, a: (),
}
SIDE_EFFECTS: frozenset = frozenset()
