"""Errors the emulator raises: each names the kernel source line (file, line and its text).

``EmulationError`` is the root; ``ProtocolError`` covers the asynchronous protocols that on a
GPU show up as hangs or silent corruption (deadlocks, mbarrier phases, expect_tx bytes, wgmma
groups, proxy fences, shared-memory races); ``MemoryAccessError`` is an access out of bounds
or misaligned; ``UnsupportedOpError`` an op the emulator cannot run (inline PTX).
"""
from __future__ import annotations

from ..errors import TylopyError


class EmulationError(TylopyError):
    """Something the emulated kernel did that the hardware would not do correctly."""


class ProtocolError(EmulationError):
    """A synchronization protocol was broken: deadlock, mbarrier misuse, missing fence or wait, race."""


class MemoryAccessError(EmulationError):
    """A global or shared access outside its buffer, or misaligned for its width."""


class UnsupportedOpError(EmulationError):
    """An op the emulator cannot execute (inline PTX)."""


def where(op) -> str:
    """``FILE:LINE `source text``` for an op, or its opcode when it has no location."""
    if op is None:
        return "<unknown location>"
    loc = getattr(op, "loc", None)
    if loc is None:
        return f"<{op.opcode} without a source location>"
    text = loc.source_line().strip()
    return f"{loc} `{text}`" if text else str(loc)


def lanes_text(lanes) -> str:
    """A short list of lane numbers: ``0-3, 8`` style."""
    lanes = sorted(int(x) for x in lanes)
    if not lanes:
        return "none"
    out, start, prev = [], lanes[0], lanes[0]
    for x in lanes[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)
