"""The IR's building blocks: values, ops, blocks and kernels.

A kernel is one ``Block`` of ``Op``s in SSA form. Structured control flow (``for``, ``if``,
``while``) holds nested blocks whose arguments are the loop-carried or merged values and
which end in a ``yield``. Everything here is immutable once built: a ``Value`` is defined
exactly once, an ``Op`` lists its operands, results, attributes and regions as tuples.

Example (what ``tylopy dump --ir`` prints for ``out[i] = x[i] + 1.0``)::

    %3 = special() {reg='tid.x'} : i32
    %4 = ptr_add(%0, %3) : ptr<f32, global>
    %5 = load(%4) : f32
    %6 = const() {value=1.0} : f32
    %7 = add(%5, %6) : f32
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from ..errors import SourceLoc
from .types import Type

_ids = itertools.count()


class Value:
    """An SSA value: defined once, by an op result or a block argument.

    Values support Python's arithmetic and comparison operators while a kernel is being
    traced; those build ops through the active builder (see ``builder.py``).
    """

    __slots__ = ("type", "id", "hint")

    def __init__(self, type: Type, hint: str = ""):
        self.type = type
        self.id = next(_ids)
        self.hint = hint

    def __repr__(self) -> str:
        return f"%{self.id}:{self.type}"

    def __bool__(self):
        from .builder import current_builder

        current_builder().error(
            "a run-time value was used where Python needs a compile-time bool "
            "(and/or/not, or a condition outside a rewritten if/while)",
            hint="use ty.select(c, a, b), the & | ~ operators, or make the value a ty.constexpr",
        )

    def __index__(self):
        from .builder import current_builder

        current_builder().error(
            "a run-time value was used where a compile-time integer is needed",
            hint="declare the parameter as ty.constexpr, or compute the value from constexprs",
        )

    def __iter__(self):
        from .builder import current_builder

        current_builder().error("a run-time scalar cannot be iterated")

    def __hash__(self):
        return self.id

    def __eq__(self, other):  # builds a comparison, like every other operator
        from . import builder

        return builder.compare("eq", self, other)

    def __ne__(self, other):
        from . import builder

        return builder.compare("ne", self, other)


def _binop(op, reverse=False):
    def method(self, other):
        from . import builder

        return builder.binary(op, other, self) if reverse else builder.binary(op, self, other)

    method.__name__ = f"__{'r' if reverse else ''}{op}__"
    return method


def _cmpop(pred):
    def method(self, other):
        from . import builder

        return builder.compare(pred, self, other)

    return method


for _name, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"),
                   ("floordiv", "div"), ("mod", "rem"), ("and", "and"), ("or", "or"),
                   ("xor", "xor"), ("lshift", "shl"), ("rshift", "shr")):
    setattr(Value, f"__{_name}__", _binop(_op))
    setattr(Value, f"__r{_name}__", _binop(_op, reverse=True))
for _name, _pred in (("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge")):
    setattr(Value, f"__{_name}__", _cmpop(_pred))


def _neg(self):
    from . import builder

    return builder.unary("neg", self)


def _invert(self):
    from . import builder

    return builder.unary("not", self)


Value.__neg__ = _neg
Value.__invert__ = _invert


@dataclass(frozen=True, eq=False)
class Block:
    """A straight-line list of ops with block arguments (loop-carried or merged values)."""

    args: tuple[Value, ...]
    ops: tuple["Op", ...]


@dataclass(frozen=True, eq=False)
class Op:
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
    """A kernel parameter: its name, IR type, and the IR value that stands for it."""

    name: str
    type: Type
    value: Value


@dataclass(frozen=True)
class LaunchBounds:
    """What the PTX tells ptxas about the launch: ``.maxntid``, ``.minnctapersm``, ``.maxnreg``."""

    max_threads: int
    min_blocks_per_sm: int | None = None
    max_registers: int | None = None


@dataclass(frozen=True)
class SharedAlloc:
    name: str
    nbytes: int
    align: int


@dataclass(frozen=True, eq=False)
class KernelIR:
    """A whole traced kernel, ready for verification and code generation."""

    name: str
    params: tuple[Param, ...]
    body: Block
    launch: LaunchBounds
    arch: str
    shared: tuple[SharedAlloc, ...] = ()
    dynamic_shared_bytes: int = 0
    dynamic_shared_align: int = 16
    source_file: str = ""
    meta: tuple[tuple[str, Any], ...] = field(default=())

    def walk(self):
        """Every op, nested regions included, in program order."""
        yield from walk_block(self.body)


def walk_block(block: Block):
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from walk_block(region)


def format_ir(kernel: KernelIR) -> str:
    """A readable listing of the IR, one op per line, regions indented."""
    lines = [f"kernel {kernel.name}(" + ", ".join(f"%{p.value.id} {p.name}: {p.type}" for p in kernel.params) + ")"]
    lines.append(f"  // threads={kernel.launch.max_threads} arch={kernel.arch} "
                 f"dynamic_shared={kernel.dynamic_shared_bytes}")

    def fmt_block(block: Block, depth: int):
        pad = "  " * depth
        for op in block.ops:
            res = ", ".join(f"%{r.id}" for r in op.results)
            head = f"{res} = " if res else ""
            args = ", ".join(f"%{v.id}" for v in op.operands)
            attrs = ", ".join(f"{k}={v!r}" for k, v in op.attrs if k not in ("template",))
            attrs = f" {{{attrs}}}" if attrs else ""
            types = ", ".join(str(r.type) for r in op.results)
            loc = f"  // line {op.loc.lineno}" if op.loc else ""
            lines.append(f"{pad}{head}{op.opcode}({args}){attrs}{' : ' + types if types else ''}{loc}")
            for i, region in enumerate(op.regions):
                bargs = ", ".join(f"%{a.id}:{a.type}" for a in region.args)
                lines.append(f"{pad}  ^region{i}({bargs}):")
                fmt_block(region, depth + 2)

    fmt_block(kernel.body, 1)
    return "\n".join(lines)
