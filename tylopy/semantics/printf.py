"""C ``printf`` formats for ``ty.printf``: which conversions a format holds, and the text it prints.

The device's ``vprintf`` follows C: ``%[flags][width][.precision][length]conversion`` with the
integer conversions ``d i u x X o c`` (length ``l``/``ll`` for 64-bit values, none for 32-bit
ones) and the floating-point conversions ``f F e E g G a A`` (the argument is a double: f32
values are promoted, as C's variadic calls do). ``%%`` prints a percent sign. Strings
(``%s``), pointers (``%p``) and ``*`` widths are not supported.

``parse`` checks a format against the argument types (so a mismatch is an error at the kernel
line, not garbage on the device); ``format_c`` prints what the device prints.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SPEC = re.compile(r"%(?P<flags>[-+ #0]*)(?P<width>\d*)(?:\.(?P<prec>\d*))?(?P<length>hh|h|ll|l|j|z|t|L)?"
                   r"(?P<conv>[a-zA-Z%])")
INT_CONVERSIONS = "diuxXoc"
FLOAT_CONVERSIONS = "fFeEgGaA"


class FormatError(ValueError):
    """A printf format that the device would print wrongly with the given arguments."""


@dataclass(frozen=True)
class Conversion:
    text: str
    flags: str
    width: str
    prec: str | None
    length: str
    conv: str


def parse(fmt: str) -> list[Conversion]:
    """The conversions of ``fmt`` in order (``%%`` excluded); raises FormatError for unsupported ones."""
    out = []
    pos = 0
    while True:
        i = fmt.find("%", pos)
        if i < 0:
            return out
        m = _SPEC.match(fmt, i)
        if m is None:
            raise FormatError(f"printf format has an incomplete conversion at position {i}: {fmt[i:i + 8]!r}")
        pos = m.end()
        if m["conv"] == "%":
            if m.end() - i != 2:
                raise FormatError(f"printf format expects '%%' for a percent sign, but got {m.group(0)!r}")
            continue
        c = Conversion(m.group(0), m["flags"], m["width"], m["prec"], m["length"] or "", m["conv"])
        if c.conv not in INT_CONVERSIONS + FLOAT_CONVERSIONS:
            raise FormatError(f"printf conversion {c.text!r} is not supported (integers: %d %i %u %x %X %o %c, "
                              "floats: %f %e %g %a; no strings or pointers)")
        out.append(c)


def check_arguments(fmt: str, types: list) -> None:
    """Raise FormatError unless each conversion fits its argument (IR scalar types, 32 or 64 bits)."""
    convs = parse(fmt)
    if len(convs) != len(types):
        raise FormatError(f"printf format {fmt!r} has {len(convs)} conversion(s), but got {len(types)} value(s)")
    for k, (c, t) in enumerate(zip(convs, types)):
        if t.is_float:
            if c.conv not in FLOAT_CONVERSIONS:
                raise FormatError(f"printf value {k} is {t}, but its conversion {c.text!r} expects an integer "
                                  "(use %f, %e, %g or %a)")
            continue
        if c.conv not in INT_CONVERSIONS:
            raise FormatError(f"printf value {k} is {t}, but its conversion {c.text!r} expects a float "
                              "(use %d, %u or %x, or convert with ty.cast)")
        wide = c.length in ("l", "ll", "j", "z", "t")
        if t.bits == 64 and not wide:
            raise FormatError(f"printf value {k} is {t}, but {c.text!r} reads 32 bits: write "
                              f"'%l{c.conv}' or '%ll{c.conv}'")
        if t.bits == 32 and wide:
            raise FormatError(f"printf value {k} is {t}, but {c.text!r} reads 64 bits: drop the length modifier")


def _unsigned(x: int, bits: int) -> int:
    return x & ((1 << bits) - 1)


def _hex_float(x: float) -> str:
    """C's %a: the shortest hex digits (``0x1.8p+1``, ``0x1p+0``); flags and width are ignored."""
    if not math.isfinite(x):
        return "%f" % x
    head, _, exp = x.hex().partition("p")
    head = head.rstrip("0").rstrip(".")
    return f"{head}p{exp}"


def _one(c: Conversion, value, bits: int, signed: bool) -> str:
    spec = "%" + c.flags + c.width + ("." + c.prec if c.prec is not None else "")
    if c.conv in FLOAT_CONVERSIONS:
        x = float(value)
        if c.conv in "aA":
            s = _hex_float(x)
            return s.upper() if c.conv == "A" else s
        return (spec + c.conv) % x
    n = int(value)
    if c.conv in "uxXo":
        n = _unsigned(n, bits)
    elif c.conv in "di" and not signed:
        n = _unsigned(n, bits)
    if c.conv == "c":
        return (spec + "c") % chr(n & 0xFF)
    return (spec + ("d" if c.conv in "diu" else c.conv)) % n


def format_c(fmt: str, values: list, types: list) -> str:
    """The text C's printf prints for ``fmt`` with ``values`` (Python or numpy scalars of ``types``)."""
    convs = parse(fmt)
    out, pos, k = [], 0, 0
    while True:
        i = fmt.find("%", pos)
        if i < 0:
            out.append(fmt[pos:])
            return "".join(out)
        out.append(fmt[pos:i])
        m = _SPEC.match(fmt, i)
        pos = m.end()
        if m["conv"] == "%":
            out.append("%")
            continue
        t = types[k]
        out.append(_one(convs[k], values[k], t.bits, t.is_signed))
        k += 1


__all__ = ["FormatError", "Conversion", "parse", "check_arguments", "format_c", "INT_CONVERSIONS",
           "FLOAT_CONVERSIONS"]
