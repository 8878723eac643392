"""Observers of compiles and launches: the supported way for tools and tests to see what tylopy
compiled and sent to the GPU, without patching anything::

    with ty.observe() as events:
        out = tylopy.attention(q, k, v)
    [e for e in events if e.kind == "launch"]   # every kernel launch inside, prepared ones too

Each event is a ``CompileEvent`` (a specialization was built, or loaded from the disk cache; one
found in the process's memory is not an event) or a ``LaunchEvent`` (one ``cuLaunchKernel``, by ``kernel[grid](...)``, a compiled kernel
or a ``PreparedLaunch``). Observers nest; events go to every observer open in any thread. With none
open, the only cost on a launch is one truth test of a module-level list.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field

_observers: list = []  # the open observers' event lists; read on every launch, so kept a plain list
_lock = threading.Lock()


@dataclass(frozen=True)
class CompileEvent:
    """A specialization built or loaded from the disk cache (by ``compile`` or a launch)."""
    kernel: str
    constexprs: dict = field(compare=False)
    source: str  # "disk" (the compile cache) or "build"
    seconds: float = 0.0
    kind: str = "compile"


@dataclass(frozen=True)
class LaunchEvent:
    """One launch sent to the driver."""
    kernel: str
    constexprs: dict = field(compare=False)
    grid: tuple
    device: int
    prepared: bool  # sent by a PreparedLaunch
    kind: str = "launch"


@contextlib.contextmanager
def observe():
    """Collect the compile and launch events that happen inside the block into a list."""
    events: list = []
    with _lock:
        _observers.append(events)
    try:
        yield events
    finally:
        with _lock:
            _observers[:] = [e for e in _observers if e is not events]


def emit(event) -> None:
    for events in tuple(_observers):
        events.append(event)


_compile_log = logging.getLogger("tylopy.compile")
SLOW_COMPILE_SECONDS = 1.0  # a compile at least this long is reported at INFO (the rest at DEBUG)


def compiled(kernel: str, ck) -> None:
    """A specialization ``ck`` (a ``CompiledKernel``) was built or loaded from the disk cache: an
    event for the observers, and a line in the ``tylopy.compile`` log."""
    source = "disk" if ck.from_cache else "build"
    if _observers:
        emit(CompileEvent(kernel, ck.constexprs, source, ck.compile_seconds))
    level = logging.INFO if ck.compile_seconds >= SLOW_COMPILE_SECONDS else logging.DEBUG
    if not _compile_log.isEnabledFor(level):
        return
    cx = ", ".join(f"{k}={v!r}" for k, v in ck.constexprs.items())
    report = ck.report
    usage = (f": {report.registers} registers, {report.spills} bytes spilled, {report.stack_frame} bytes stack"
             if getattr(report, "available", False) else "")
    _compile_log.log(level, "%s %s (%s%s) in %.2f s%s", "loaded" if ck.from_cache else "compiled", kernel, ck.arch,
                     f"; {cx}" if cx else "", ck.compile_seconds, usage if not ck.from_cache else "")
