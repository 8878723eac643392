"""The compiled form of a kernel that warps execute, and the table of op semantics.

Every op becomes an instruction ``(is_generator, fn)`` made by the handler registered for its
opcode (``@handler("add", ...)`` in the ``ops_*`` modules); a region becomes a ``CBlock``.
This module imports nothing of the emulator, so the op modules and ``program.py`` can both
import it without a circle.
"""
from __future__ import annotations

from typing import Callable

HANDLERS: dict[str, Callable] = {}


def handler(*opcodes):
    """Register ``make(prog, op) -> (is_generator, fn)`` for the opcodes."""
    def deco(make):
        for name in opcodes:
            HANDLERS[name] = make
        return make
    return deco


class CBlock:
    """A compiled region: its argument slots, instructions, and its terminator's operand slots."""

    __slots__ = ("args", "instrs", "term", "term_op", "blocking")

    def __init__(self, args, instrs, term, term_op, blocking):
        self.args, self.instrs, self.term, self.term_op, self.blocking = args, instrs, term, term_op, blocking


def run_block(w, block: CBlock):
    """Execute a compiled block for warp ``w`` (a generator: it yields where the warp blocks)."""
    for is_gen, fn in block.instrs:
        if is_gen:
            yield from fn(w)
        else:
            fn(w)
