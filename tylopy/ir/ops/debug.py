"""Type rules of device-side debugging: ``printf`` (vprintf) and ``device_assert``.

The frontend emits them only when the compile option ``debug`` is on (``TYLOPY_DEBUG=1``);
otherwise they compile to nothing.
"""
from __future__ import annotations

from ..types import ScalarType, i1
from .base import expect


def _printf(ts, attrs):
    fmt = attrs.get("format")
    expect(isinstance(fmt, str), f"printf expects a format string, but got {fmt!r}")
    for t in ts:
        expect(isinstance(t, ScalarType) and t.bits in (32, 64) and t.kind != "bool",
               f"printf arguments expect 32- or 64-bit scalars, but got {t}")
    return ()


def _device_assert(ts, attrs):
    expect(len(ts) == 1 and ts[0] == i1, f"device_assert expects one i1 condition, but got {', '.join(map(str, ts))}")
    expect(isinstance(attrs.get("message"), str), "device_assert expects a message string")
    return ()


RULES = {"printf": _printf, "device_assert": _device_assert}
SIDE_EFFECTS = frozenset(RULES)
