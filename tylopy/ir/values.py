"""The IR's building blocks: values, ops, blocks and kernels.

A kernel is one ``Block`` of ``Op``s in SSA form. Structured control flow (``for``, ``if``,
``while``) holds nested blocks whose arguments are the loop-carried or merged values and
which end in a ``yield``. Everything here is immutable once built: a ``Value`` is defined
exactly once, an ``Op`` lists its operands, results, attributes and regions as tuples.

Values are plain data: they have no Python operators (comparing two values compares their
identity, never builds an op). The frontend's ``RuntimeValue`` wraps one and carries the
operators a kernel author writes. Value ids are numbered per kernel, in the order the values
are made, so the printed IR of one kernel is the same on every run and machine.

Example (what ``tylopy dump --ir`` prints for ``out[i] = x[i] + 1.0``)::

    %3 = special() {reg='tid.x'} : i32
    %4 = ptr_add(%0, %3) : ptr<f32, global>
    %5 = load(%4) : f32
    %6 = const() {value=1.0} : f32
    %7 = add(%5, %6) : f32
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import SourceLoc
from .types import Type


class Value:
    """An SSA value: defined once, by an op result or a block argument.

    ``id`` is unique within one kernel; ``hint`` is a readable name (a parameter's) or empty.
    """

    __slots__ = ("type", "id", "hint")

    def __init__(self, type: Type, id: int, hint: str = ""):
        self.type = type
        self.id = id
        self.hint = hint

    def __repr__(self) -> str:
        return f"%{self.id}:{self.type}"


@dataclass(frozen=True, eq=False)
class Block:
    """A straight-line list of ops with block arguments (loop-carried or merged values)."""

    args: tuple[Value, ...]
    ops: tuple["Op", ...]


@dataclass(frozen=True, eq=False)
class Op:
    """One operation: ``results = opcode(operands) {attrs}`` with nested ``regions``.

    ``loc`` is the kernel source line that built it (errors and PTX ``.loc`` lines use it).
    """

    opcode: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    regions: tuple[Block, ...] = ()
    loc: SourceLoc | None = None

    def attr(self, name: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    @property
    def result(self) -> Value:
        (r,) = self.results
        return r


@dataclass(frozen=True)
class Param:
    """A kernel parameter: its name, IR type, and the IR value that stands for it.

    ``noalias`` marks a pointer the author promised no other pointer parameter overlaps.
    """

    name: str
    type: Type
    value: Value
    noalias: bool = False


@dataclass(frozen=True)
class LaunchBounds:
    """What the PTX tells ptxas about the launch: ``.maxntid``, ``.minnctapersm``, ``.maxnreg``."""

    max_threads: int
    min_blocks_per_sm: int | None = None
    max_registers: int | None = None
    cluster: tuple | None = None  # (x, y, z) CTAs per thread-block cluster: ``.reqnctapercluster``


@dataclass(frozen=True)
class SharedAlloc:
    """A static shared-memory array: its symbol name, size and alignment in bytes."""

    name: str
    nbytes: int
    align: int


@dataclass(frozen=True)
class WaitSite:
    """A bounded mbarrier wait of a debug build: its label and source line (for timeout reports)."""

    label: str
    where: str


@dataclass(frozen=True, eq=False, kw_only=True)
class KernelIR:
    """A whole traced kernel, ready for verification and code generation.

    ``constexprs`` holds the compile-time parameter values as ``(name, repr)`` pairs (for
    printing); ``wait_sites`` the debug-mode mbarrier waits, numbered from 1 in the order the
    kernel records them.
    """

    name: str
    params: tuple[Param, ...]
    body: Block
    launch: LaunchBounds
    arch: str
    shared: tuple[SharedAlloc, ...] = ()
    dynamic_shared_bytes: int = 0
    dynamic_shared_align: int = 16
    source_file: str = ""
    constexprs: tuple[tuple[str, str], ...] = ()
    wait_sites: tuple[WaitSite, ...] = field(default=())

    def walk(self):
        """Every op, nested regions included, in program order."""
        yield from walk_block(self.body)


def walk_block(block: Block):
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from walk_block(region)
