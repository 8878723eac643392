"""Where a kernel's mistakes are reported: source positions of its parameters and ``def``, and the
conversion of failures from every stage (Python errors in kernel code, tile-library errors, IR
verification, code generation, ptxas) into errors at the user's line."""
from __future__ import annotations

import ast
import re
import sys
import textwrap
from typing import Callable

from ..errors import IRVerificationError, KernelSourceError, SourceLoc
from .builder import _is_tylopy_file, code_location
from .rewrite import source_of


def locate(fn: Callable, match: Callable[[ast.AST], bool]) -> SourceLoc:
    """The position of the first node in ``fn``'s source that ``match`` accepts (else its ``def``)."""
    code = getattr(fn, "__code__", None)
    filename = code.co_filename if code else "?"
    line = code.co_firstlineno if code else 0
    try:
        src, filename = source_of(fn)
        dedented = textwrap.dedent(src)
        indent = len(src.splitlines()[0]) - len(dedented.splitlines()[0])
        fdef = ast.parse(dedented).body[0]
        node = next((n for n in ast.walk(fdef) if match(n)), fdef)
        lineno = line + node.lineno - 1
        single = getattr(node, "end_lineno", None) == node.lineno
        end = node.end_col_offset + indent if single else node.col_offset + indent + 3
        return SourceLoc(filename, lineno, node.col_offset + indent, fn.__name__, end)
    except (KernelSourceError, SyntaxError, IndexError, AttributeError):
        return SourceLoc(filename, line, 0, getattr(fn, "__name__", ""))


def param_loc(fn: Callable, name: str) -> SourceLoc:
    return locate(fn, lambda n: isinstance(n, ast.arg) and n.arg == name)


def def_loc(fn: Callable) -> SourceLoc:
    return locate(fn, lambda n: False)


_TRACE_ERRORS: dict[type, type] = {}


def trace_error(e: Exception, message: str, loc) -> KernelSourceError:
    """A ``KernelSourceError`` for a Python exception raised by kernel code while tracing; it is
    also an instance of the original class where Python allows (``except ValueError`` still works)."""
    cls = type(e)
    wrapped = _TRACE_ERRORS.get(cls)
    if wrapped is None:
        try:
            wrapped = type(f"KernelSourceError[{cls.__name__}]", (KernelSourceError, cls), {})
        except TypeError:  # an exception class with its own layout cannot be mixed in
            wrapped = KernelSourceError
        _TRACE_ERRORS[cls] = wrapped
    try:
        return wrapped(message, loc)
    except TypeError:
        return KernelSourceError(message, loc)


def lowering_error(e: Exception) -> KernelSourceError:
    op = getattr(e, "tylopy_op", None)
    if op is None:
        return KernelSourceError(f"code generation failed: {type(e).__name__}: {e}")
    types = ", ".join(str(v.type) for v in op.operands) or "no operands"
    return KernelSourceError(f"{op.opcode} with operands ({types}) cannot be lowered: {type(e).__name__}: {e}", op.loc,
                             hint="this combination passed the op's type rule but has no lowering; use another "
                                  "type (e.g. ty.cast to f32) and report it as a tylopy bug")


_PTX_LINE = re.compile(r"\.ptx, line (\d+)")
_PTX_SOURCE = re.compile(r"^\s*// (\S+):(\d+)  ")


def with_ptx_source_line(e: Exception, ptx: str) -> Exception:
    """ptxas names a PTX line; add the kernel source line that produced it (from the PTX comments)."""
    m = _PTX_LINE.search(str(e))
    if m is None:
        return e
    lines = ptx.splitlines()[:int(m.group(1))]
    for line in reversed(lines):
        src = _PTX_SOURCE.match(line)
        if src:
            e.args = (f"{e.args[0] if e.args else e} (PTX line {m.group(1)} comes from {src.group(1)}:"
                      f"{src.group(2)})",) + tuple(e.args[1:])
            break
    return e


def relocated(e: KernelSourceError, loc) -> KernelSourceError:
    """The same error at ``loc`` (raised by library code that did not know the kernel line)."""
    try:
        new = type(e)(e.message, loc, e.hint)
    except TypeError:
        new = KernelSourceError(e.message, loc, e.hint)
    new.__cause__ = e.__cause__
    return new


def verification_error(e: IRVerificationError) -> KernelSourceError:
    detail = getattr(e, "detail", str(e))
    hint = None
    if "not defined in an enclosing scope" in detail:
        hint = ("a value made inside a run-time if or loop was kept in a Python object and used outside it; "
                "names, lists, tuples, dicts and tile objects are carried out of run-time regions, other objects "
                "(attributes of plain classes, globals) are not: assign the value to a name instead")
    return KernelSourceError(f"the traced IR is invalid: {detail}", getattr(e, "loc", None), hint)


def constexpr_note(cx: dict) -> str:
    return f" with {', '.join(f'{k}={v!r}' for k, v in cx.items())}" if cx else ""


def innermost_user_frame() -> SourceLoc | None:
    """The innermost frame of the exception being handled that is the user's code."""
    tb = sys.exc_info()[2]
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_tylopy_file(code.co_filename) and not code.co_filename.startswith("<"):
            found = code_location(code, tb.tb_lasti, tb.tb_lineno)
        tb = tb.tb_next
    return found
