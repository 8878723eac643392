"""The opcode table: for each opcode, the rule that checks its operands and gives its results.

Each family of ops has its own module with a ``RULES`` table and the set of its ops with
``SIDE_EFFECTS`` (never removed, never reordered by us): ``scalar`` (arithmetic, comparisons,
conversions), ``memory`` (pointers, loads, stores, special registers, inline PTX), ``sync``
(barriers, shuffles), ``warp`` (votes, matches, warp reductions), ``atomics``, ``hopper``
(mbarriers, TMA loads, wgmma), ``async_copy`` (cp.async, TMA stores and bulk groups),
``matrix`` (mma.sync, ldmatrix, stmatrix), ``debug`` (printf, device asserts),
``cluster`` (the cluster barrier, mapa) and ``structure`` (for, if, while). The builder calls the rule as each op is built (so an error
points at the kernel line that built it); the verifier calls it again over a finished kernel.

Adding an op: its rule here, its lowering in ``tylopy/codegen``, its semantics in
``tylopy/emulate`` (and ``tylopy/semantics`` for the arithmetic), its ``ty.*`` wrapper in the
frontend, and a test against the PTX ISA (docs/design.md, "adding a primitive").
"""
from __future__ import annotations

from typing import Callable

from . import async_copy, atomics, cluster, debug, hopper, matrix, memory, scalar, structure, sync, warp
from .base import OpTypeError

Rule = Callable[[tuple, dict], tuple]
FAMILIES = (scalar, memory, sync, warp, atomics, hopper, async_copy, matrix, debug, structure, cluster)

OPS: dict[str, Rule] = {}
SIDE_EFFECTS: frozenset = frozenset()
for _family in FAMILIES:
    _clash = set(OPS) & set(_family.RULES)
    if _clash:
        raise RuntimeError(f"opcodes defined twice: {sorted(_clash)}")
    OPS.update(_family.RULES)
    SIDE_EFFECTS = SIDE_EFFECTS | _family.SIDE_EFFECTS

TERMINATORS = frozenset({"yield", "condition"})


def result_types(opcode: str, operand_types: tuple, attrs: dict) -> tuple:
    try:
        rule = OPS[opcode]
    except KeyError:
        raise OpTypeError(f"unknown opcode {opcode!r}") from None
    return rule(tuple(operand_types), attrs)


__all__ = ["OPS", "SIDE_EFFECTS", "TERMINATORS", "OpTypeError", "result_types"]
