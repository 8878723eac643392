"""Builds IR while a kernel is traced: the active builder, its blocks, value numbering, errors.

The tracer makes one ``Builder`` per kernel specialization and makes it current; every
``ty.*`` function and every operator on a ``RuntimeValue`` appends ops through it. Each op
records the user's source line (the innermost stack frame outside the tylopy package), so a
rejection points at the kernel, not at tylopy. The builder speaks IR values only; the
``proxy`` module wraps them for kernel code.
"""
from __future__ import annotations

import contextvars
import functools
import os
import sys
from typing import Any, Sequence

from ..errors import KernelSourceError, ResourceLimitError, SourceLoc
from ..ir.ops import OpTypeError, result_types
from ..ir.types import Type
from ..ir.values import Block, Op, Value

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_current: contextvars.ContextVar["Builder | None"] = contextvars.ContextVar("tylopy_builder", default=None)

# A kernel whose trace builds more ops than this is almost always an unrolled loop that should
# run at run time: LLVM's optimizer grows faster than linearly with straight-line code.
MAX_OPS = 400_000


class KernelResourceError(KernelSourceError, ResourceLimitError):
    """A kernel line asks for more of a resource (shared memory, ...) than the target allows."""


def current_builder() -> "Builder":
    b = _current.get()
    if b is None:
        raise KernelSourceError("tylopy operations can only be used inside a kernel being traced "
                                "(a function decorated with @ty.kernel or @ty.func)", user_location())
    return b


def tracing() -> bool:
    """Is a kernel being traced on this thread?"""
    return _current.get() is not None


def _is_tylopy_file(fname: str) -> bool:
    return fname.startswith(_PACKAGE_DIR + os.sep) and not fname.startswith("<")


@functools.lru_cache(maxsize=2048)
def _positions(code) -> tuple:
    return tuple(code.co_positions())


def frame_location(frame) -> SourceLoc:
    """The line and the column span of the expression ``frame`` is evaluating (a call, an operator)."""
    return code_location(frame.f_code, frame.f_lasti, frame.f_lineno)


def code_location(code, lasti: int, lineno: int) -> SourceLoc:
    """The source span of the instruction at byte offset ``lasti`` of ``code`` (on ``lineno``)."""
    col, end_col = 0, 0
    try:
        start, end, c0, c1 = _positions(code)[lasti // 2]
        if start == lineno and c0 is not None:
            col, end_col = c0, (c1 if end == start and c1 is not None else 0)
    except (IndexError, ValueError, TypeError):
        pass
    return SourceLoc(code.co_filename, lineno, col, _function_name(code), end_col)


def _function_name(code) -> str:
    """The user's name for a frame's function: the rewritten kernel is ``__ty_fn_<n>_<name>`` and the
    bodies of its if/for/while are functions nested in it."""
    name = code.co_name
    if not name.startswith("__ty_"):
        return name
    for part in reversed(code.co_qualname.split(".<locals>.")):
        if part.startswith("__ty_fn_"):
            return part.split("_", 5)[-1]
        if not part.startswith("__ty_"):
            return part
    return name


_skip_file: dict[str, bool] = {}  # file name -> is it tylopy's own code (or a generated "<...>" file)?
_loc_cache: dict[tuple[int, int], tuple[Any, SourceLoc]] = {}  # (id(code), lasti) -> (code, location)


def _skipped(fname: str) -> bool:
    skip = _skip_file.get(fname)
    if skip is None:
        skip = _skip_file[fname] = _is_tylopy_file(fname) or (
            fname.startswith("<") and not fname.startswith(("<stdin", "<ipython")))
    return skip


def user_location(frame=None) -> SourceLoc | None:
    """The innermost stack frame that is not tylopy's own code (the kernel line being traced).

    Called for every op a trace builds, so file classifications and locations are memoized.
    """
    frame = frame or sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not _skipped(code.co_filename):
            key = (id(code), frame.f_lasti)
            hit = _loc_cache.get(key)
            if hit is not None and hit[0] is code:
                return hit[1]
            if len(_loc_cache) > 200_000:
                _loc_cache.clear()
            loc = code_location(code, frame.f_lasti, frame.f_lineno)
            _loc_cache[key] = (code, loc)
            return loc
        frame = frame.f_back
    return None


class _BlockBuilder:
    __slots__ = ("args", "ops")

    def __init__(self, args=()):
        self.args = tuple(args)
        self.ops: list[Op] = []

    def freeze(self) -> Block:
        return Block(self.args, tuple(self.ops))


class Builder:
    """Appends ops to the innermost block under construction and numbers the values it makes.

    ``state`` holds per-trace bookkeeping of libraries built on the frontend (e.g. the tile
    library's count of committed wgmma groups); ``wait_sites`` the debug-mode mbarrier waits.
    """

    def __init__(self, arch: str, options=None):
        self.arch = arch
        self.options = options
        self.threads = None  # threads per block (the kernel's launch bound), for block-wide library code
        self.kernel_name = ""
        self._next_id = 0
        self._blocks: list[_BlockBuilder] = [_BlockBuilder()]
        self.shared_allocs: list = []
        self.dynamic_shared_bytes = 0
        self.dynamic_shared_align = 16
        self.wait_sites: list = []
        self.state: dict[str, Any] = {}
        self.op_count = 0
        self.unrolling: list = []  # (source location, trip count) of the compile-time loops being unrolled now
        self._constants: dict[int, Any] = {}
        self._token = None

    # -- activation -----------------------------------------------------------------------
    def __enter__(self):
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc):
        _current.reset(self._token)

    # -- errors ---------------------------------------------------------------------------
    def error(self, message: str, hint: str | None = None, cls=KernelSourceError):
        raise cls(message, user_location(), hint)

    # -- values and ops -------------------------------------------------------------------
    def new_value(self, type: Type, hint: str = "") -> Value:
        v = Value(type, self._next_id, hint)
        self._next_id += 1
        return v

    def emit(self, opcode: str, operands: Sequence[Value] = (), regions: Sequence[Block] = (), **attrs) -> tuple[Value, ...]:
        """Append ``opcode(operands) {attrs}``; its type rule gives the result types (or the error)."""
        for v in operands:
            if not isinstance(v, Value):
                self.error(f"{opcode} expects IR values as operands, but got {type(v).__name__} {v!r}")
        try:
            types = result_types(opcode, tuple(v.type for v in operands), attrs)
        except OpTypeError as e:
            self.error(str(e))
        self.op_count += 1
        if self.op_count > MAX_OPS:
            self._too_many_ops()
        results = tuple(self.new_value(t) for t in types)
        if opcode == "const":
            self._constants[results[0].id] = attrs.get("value")
        op = Op(opcode, tuple(operands), results, tuple(sorted(attrs.items())), tuple(regions), user_location())
        self._blocks[-1].ops.append(op)
        return results

    def _too_many_ops(self):
        hint = "make the loop a run-time loop: ty.range(n, unroll=False), or give it a run-time bound"
        if self.unrolling and self.unrolling[0][0] is not None:
            loop = self.unrolling[0][0]
            raise KernelSourceError(f"the kernel's trace passed {MAX_OPS} ops while unrolling the compile-time loop "
                                    f"at {loop} (nested unrolled loops multiply)", loop, hint)
        self.error(f"the kernel's trace passed {MAX_OPS} ops: a compile-time loop unrolls too far", hint=hint)

    def definition_loc(self, v: Value) -> SourceLoc | None:
        """Where the op that made ``v`` was traced (searched in the blocks still open; for errors)."""
        def search(ops):
            for op in reversed(ops):
                if any(r is v for r in op.results):
                    return op.loc
                for region in op.regions:
                    found = search(region.ops)
                    if found is not None:
                        return found
            return None
        for blk in reversed(self._blocks):
            found = search(blk.ops)
            if found is not None:
                return found
        return None

    def constant_value(self, v: Value):
        """The Python value of ``v`` if a ``const`` op of this trace made it, else None."""
        return self._constants.get(v.id)

    def push_block(self, arg_types: Sequence[Type]) -> tuple[Value, ...]:
        blk = _BlockBuilder(self.new_value(t) for t in arg_types)
        self._blocks.append(blk)
        return blk.args

    def pop_block(self) -> Block:
        return self._blocks.pop().freeze()

    def discard_block(self):
        self._blocks.pop()

    def suspend_block(self) -> _BlockBuilder:
        """Take the innermost block off the stack unfinished (to append to it later)."""
        return self._blocks.pop()

    def resume_block(self, block: _BlockBuilder):
        self._blocks.append(block)

    def op_mark(self) -> tuple:
        """A position in the innermost block: ``ops_since`` gives what is appended after it."""
        blk = self._blocks[-1]
        return blk, len(blk.ops)

    def ops_since(self, mark: tuple) -> list[Op]:
        """The ops appended to the block of ``mark`` after it (ops in regions stay inside theirs)."""
        blk, n = mark
        if blk is not self._blocks[-1]:
            raise RuntimeError("ops_since: the block of the mark is no longer the innermost one")
        return blk.ops[n:]

    @property
    def next_id(self) -> int:
        """The id the next value will get (values made later have larger ids)."""
        return self._next_id

    @property
    def depth(self) -> int:
        return len(self._blocks)

    def finish(self) -> Block:
        if len(self._blocks) != 1:
            raise RuntimeError("unbalanced blocks at the end of tracing")
        return self._blocks[0].freeze()
