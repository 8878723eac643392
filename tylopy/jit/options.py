"""Compile options: everything besides the kernel's source and constexprs that changes its code.

One frozen, hashed value per compile, so the disk cache key sees every option and
``tylopy cache explain`` can name the one that differs. Options come from the kernel's
decorator (``arch``, ``noalias``) and from the environment, read once when a specialization is
compiled (never deep inside tracing):

=============================  ===============================================================
``TYLOPY_DEBUG_WAITS=1``       every mbarrier wait gives up after ``debug_wait_seconds`` and the
                               launcher raises ``MbarrierTimeoutError`` naming the wait
``TYLOPY_DEBUG_WAIT_SECONDS``  that bound in seconds (default 2)
``TYLOPY_DEBUG=1``             ``ty.device_assert`` and ``ty.printf`` are compiled in (otherwise
                               they compile to nothing)
=============================  ===============================================================
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace

from ..errors import CompileOptionError


@dataclass(frozen=True)
class CompileOptions:
    """``arch``: the target (sm_90a, sm_80, ...). ``debug_waits``/``debug_wait_seconds``: bounded
    mbarrier waits. ``debug``: device asserts and prints. ``noalias``: the pointer parameters
    with LLVM ``noalias`` ("declared": only those written ``ty.ptr(..., noalias=True)``; "all":
    every pointer parameter of the kernel, the ``@ty.kernel(noalias=True)`` flag)."""

    arch: str
    debug_waits: bool = False
    debug_wait_seconds: float = 2.0
    debug: bool = False
    noalias: str = "declared"

    def __post_init__(self):
        if self.noalias not in ("declared", "all"):
            raise CompileOptionError(f"noalias expects 'declared' or 'all', but got {self.noalias!r}")
        if not (isinstance(self.debug_wait_seconds, (int, float)) and math.isfinite(self.debug_wait_seconds)
                and 0 < self.debug_wait_seconds <= 4.0):
            raise CompileOptionError("TYLOPY_DEBUG_WAIT_SECONDS expects a number of seconds in (0, 4] (the wait "
                                     f"counts a 32-bit nanosecond timer), but got {self.debug_wait_seconds!r}")

    def key(self) -> dict:
        """The options as plain data for the cache key."""
        return asdict(self)

    def with_arch(self, arch: str) -> "CompileOptions":
        return replace(self, arch=arch)


ENVIRONMENT = ("TYLOPY_DEBUG_WAITS", "TYLOPY_DEBUG_WAIT_SECONDS", "TYLOPY_DEBUG")
_K0, _K1, _K2 = ENVIRONMENT


def environment_snapshot() -> tuple:
    """The raw values of the option variables, compared on every launch (a changed one compiles
    again). Read through ``os.environ`` like every other variable tylopy reads: 1.4-6 us per launch
    on a busy CI core (an unset variable costs a KeyError inside ``os.environ.get``), against
    0.1-0.4 us through CPython's private mapping behind it, which a replaced ``os.environ`` would
    silently bypass (docs/environment.md)."""
    get = os.environ.get
    return get(_K0), get(_K1), get(_K2)


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def from_environment(arch: str, noalias: str = "declared") -> CompileOptions:
    """The options for ``arch`` with the debug switches read from the environment now."""
    raw = os.environ.get("TYLOPY_DEBUG_WAIT_SECONDS", "2")
    try:
        seconds = float(raw)
    except ValueError:
        raise CompileOptionError(f"TYLOPY_DEBUG_WAIT_SECONDS expects a number of seconds, but got {raw!r}") from None
    return CompileOptions(arch=arch, debug_waits=_flag("TYLOPY_DEBUG_WAITS"), debug_wait_seconds=seconds,
                          debug=_flag("TYLOPY_DEBUG"), noalias=noalias)
