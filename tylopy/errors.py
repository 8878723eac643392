"""One exception hierarchy for tylopy.

Kernel-source mistakes carry the user's file, line and a caret (``KernelSourceError``);
driver failures name the call and the decoded CUresult (``DriverError``). Input checks at
the launch boundary raise the built-in ``TypeError``/``ValueError`` subclasses below, so
callers can catch either the tylopy class or the standard one.
"""
from __future__ import annotations

import linecache
import os
import types
from dataclasses import dataclass

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
TRACEBACK_ENV = "TYLOPY_TRACEBACK"


class TylopyError(Exception):
    """Root of every error tylopy raises on purpose."""


def user_facing(e: BaseException) -> BaseException:
    """``e`` with tylopy's own frames cut out of its traceback, for the public entry points
    (``kernel[grid](...)``, ``compile``, ``emulate``, ``trace``) to re-raise: a mistake in a
    kernel then shows the caller's lines and the message (which names the kernel's line), not
    dozens of lines of tracing machinery. Frames of user code (a kernel body, a ``@ty.func``)
    stay. ``TYLOPY_TRACEBACK`` set to anything keeps the whole traceback."""
    if os.environ.get(TRACEBACK_ENV):
        return e
    kept = []
    tb = e.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
            kept.append(tb)
        tb = tb.tb_next
    trimmed = None
    for t in reversed(kept):
        trimmed = types.TracebackType(trimmed, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return e.with_traceback(trimmed)


@dataclass(frozen=True)
class SourceLoc:
    """A position in the user's kernel source."""

    filename: str
    lineno: int
    col: int = 0
    function: str = ""
    end_col: int = 0  # one past the expression's last column on this line (0: unknown)

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"

    def source_line(self) -> str:
        return linecache.getline(self.filename, self.lineno).rstrip("\n")

    def excerpt(self) -> str:
        """The source line with a caret under the column, as Python's tracebacks show it."""
        line = self.source_line()
        if not line:
            return ""
        width = self.end_col - self.col if self.end_col > self.col else 1
        width = max(1, min(width, len(line) - self.col))
        return f"    {line}\n    {' ' * self.col}{'^' * width}"


class KernelSourceError(TylopyError):
    """A mistake in a kernel's source: points at the file and line with a caret."""

    def __init__(self, message: str, loc: SourceLoc | None = None, hint: str | None = None):
        self.message = message
        self.loc = loc
        self.hint = hint
        text = message
        if loc is not None:
            where = f'File "{loc.filename}", line {loc.lineno}'
            if loc.function:
                where += f", in {loc.function}"
            excerpt = loc.excerpt()
            text = f"{where}\n{excerpt}\n{message}" if excerpt else f"{where}\n{message}"
        if hint:
            text += f"\nhint: {hint}"
        super().__init__(text)


class IRVerificationError(TylopyError):
    """The IR broke one of its own invariants (a bug in tylopy or in a hand-built IR)."""


class OwnershipError(KernelSourceError):
    """Two fragments whose ownership (which lanes share a row or column) disagree were combined."""


class LayoutError(TylopyError, ValueError):
    """A layout or atom was built with values that do not describe a valid mapping."""


class CompileError(TylopyError):
    """LLVM or ptxas rejected the generated code."""


class CompileOptionError(TylopyError, ValueError):
    """A compile option (from the decorator or the environment) has a value tylopy cannot use."""


class CaptureError(KernelSourceError):
    """A value the trace read from outside the kernel cannot be keyed by value in the compile cache."""


class ResourceLimitError(TylopyError):
    """A kernel asks for more registers, shared memory or threads than the target allows."""


class DriverError(TylopyError):
    """A CUDA driver call failed; the message names the call, the CUresult and the kernel."""

    def __init__(self, call: str, result_name: str, kernel: str | None = None, detail: str = ""):
        self.call = call
        self.result_name = result_name
        self.kernel = kernel
        msg = f"{call} failed with {result_name}"
        if kernel:
            msg += f" (kernel {kernel!r})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class NoDriverError(TylopyError):
    """Raised on the first driver call on a machine without the NVIDIA driver."""

    def __init__(self, detail: str = ""):
        msg = "no CUDA driver: compile and dump work, launch needs a GPU"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class LaunchTypeError(TylopyError, TypeError):
    """A launch argument has the wrong type or dtype; the message names the parameter."""


class LaunchValueError(TylopyError, ValueError):
    """A launch argument has a wrong value (device, size, shape); the message names the parameter."""


class ArchMismatchError(TylopyError):
    """A kernel's compiled target cannot run on the device it is launched on; the message says why."""


class MbarrierTimeoutError(TylopyError):
    """A bounded mbarrier wait (debug mode) ran out; names the barrier, stage and phase."""
