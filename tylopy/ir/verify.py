"""Whole-kernel checks: every operand defined before use in an enclosing scope, every op's
types valid under its rule, regions shaped as their op expects."""
from __future__ import annotations

from ..errors import IRVerificationError
from .values import Block, KernelIR, Op
from .ops import TERMINATORS, OpTypeError, result_types


def _fail(op: Op | None, message: str):
    where = f" at {op.loc}" if op is not None and op.loc else ""
    err = IRVerificationError(f"{message}{where}")
    err.loc, err.detail = (op.loc if op is not None else None), message  # the frontend reports it at the line
    raise err


def verify(kernel: KernelIR) -> None:
    defined = {p.value.id for p in kernel.params}
    _block(kernel.body, defined, top=True)


def _block(block: Block, defined: set, top: bool = False):
    scope = set(defined)
    scope.update(a.id for a in block.args)
    for i, op in enumerate(block.ops):
        for v in op.operands:
            if v.id not in scope:
                _fail(op, f"{op.opcode} uses %{v.id}, which is not defined in an enclosing scope")
        attrs = dict(op.attrs)
        try:
            types = result_types(op.opcode, tuple(v.type for v in op.operands), attrs)
        except OpTypeError as e:
            _fail(op, f"{op.opcode}: {e}")
        if tuple(types) != tuple(r.type for r in op.results):
            _fail(op, f"{op.opcode} results {tuple(r.type for r in op.results)} differ from its rule {types}")
        if op.opcode in TERMINATORS and i != len(block.ops) - 1:
            _fail(op, f"{op.opcode} must end its block")
        _regions(op, scope)
        scope.update(r.id for r in op.results)
    if not top and (not block.ops or block.ops[-1].opcode not in TERMINATORS):
        _fail(None, "a region must end with yield or condition")


def _regions(op: Op, scope: set):
    n = {"for": 1, "if": 2, "while": 2}.get(op.opcode, 0)
    if len(op.regions) != n:
        _fail(op, f"{op.opcode} expects {n} regions, but has {len(op.regions)}")
    for r in op.regions:
        _block(r, scope)
    if op.opcode == "for":
        body = op.regions[0]
        carried = [v.type for v in op.operands[3:]]
        if [a.type for a in body.args[1:]] != carried or [v.type for v in body.ops[-1].operands] != carried:
            _fail(op, "for: body arguments and yield must match the carried values")
    elif op.opcode == "if":
        for r in op.regions:
            if [v.type for v in r.ops[-1].operands] != [x.type for x in op.results]:
                _fail(op, "if: each branch must yield the op's result types")
    elif op.opcode == "while":
        c, b = op.regions
        if c.ops[-1].opcode != "condition":
            _fail(op, "while: the first region must end with condition")
