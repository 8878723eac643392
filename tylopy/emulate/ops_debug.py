"""``printf`` and ``device_assert`` in the emulator (present only in kernels compiled with ``debug``).

``printf`` formats each active lane's values with C's rules (``tylopy.semantics.printf``) in
lane order, writes the text to standard output and appends it to the launch's ``prints`` list
(``EmulationReport.prints``). On a GPU the lines appear when the launch ends, in no promised
order. ``device_assert`` raises ``DeviceAssertError`` naming the kernel line, the message, the
block and the failing threads, where the GPU would print the assertion and stop the kernel.
"""
from __future__ import annotations

import sys

import numpy as np

from ..semantics.printf import format_c
from .compiled import handler
from .errors import EmulationError, lanes_text, where


class DeviceAssertError(EmulationError):
    """A ``ty.device_assert`` condition was false in some thread."""


def prints_of(launch) -> list:
    """The launch's list of printed texts (made at the first print)."""
    out = getattr(launch, "prints", None)
    if out is None:
        out = launch.prints = []
    return out


@handler("printf")
def make_printf(prog, op):
    fmt = op.attr("format")
    slots = [prog.slot(v) for v in op.operands]
    types = [v.type for v in op.operands]

    def run(w):
        if not w.nactive:
            return
        out = prints_of(w.cta.launch)
        vals = [np.asarray(w.env[s]) for s in slots]
        for lane in np.flatnonzero(w.mask):
            text = format_c(fmt, [v[lane] for v in vals], types)
            out.append(text)
            sys.stdout.write(text)
    return False, run


@handler("device_assert")
def make_device_assert(prog, op):
    c = prog.slot(op.operands[0])
    message = op.attr("message") or "device_assert"

    def run(w):
        failed = w.mask & ~np.asarray(w.env[c], dtype=bool)
        if failed.any():
            tids = w.tids[failed]
            raise DeviceAssertError(f"device_assert failed at {where(op)}: {message} (block {w.cta.coord}, "
                                    f"thread(s) {lanes_text(tids)} of {w.describe()})")
    return False, run
