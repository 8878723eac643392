"""Device-side debugging for kernels: ``ty.printf`` and ``ty.device_assert``.

Both compile to nothing unless the compile option ``debug`` is on (``@ty.kernel(debug=True)`` or
``kernel.with_debug(True)``, else ``TYLOPY_DEBUG=1`` in the environment when the kernel compiles): a release build pays
nothing, not even for the values passed (LLVM removes what only a print would have used).

* ``ty.printf(fmt, *values)``: C's printf through CUDA's ``vprintf``, once per thread that
  executes it. ``fmt`` is a Python string checked against the values at the kernel line:
  ``%d %i %u %x %X %o %c`` for 32-bit integers (``%ld``/``%lld``... for 64-bit ones),
  ``%f %e %g %a`` for floats (f32 is promoted to double, as C does; f16/bf16 and 8/16-bit
  integers are widened first, bools print as 0/1 integers). On the GPU the output appears
  when the launch completes, in no particular order across threads; the emulator prints each
  line as it runs (lanes in order) and keeps them in the launch report (``report.prints``).
* ``ty.device_assert(cond, message)``: where ``cond`` is false, print
  ``file:line: ... Assertion `message` failed`` (CUDA's ``__assertfail``) and stop the kernel:
  the launch fails with CUDA_ERROR_ASSERT and the context cannot run more work, as with a trap.
  The emulator raises ``DeviceAssertError`` naming the kernel line, the block and the threads.

docs/warp-atomics-debug.md has the rules and the facts from the PTX ISA behind them.
"""
from __future__ import annotations

from ..ir.types import ScalarType, bf16, f16, f32, i1, i32, u32
from ..semantics.printf import FormatError, check_arguments
from .builder import current_builder
from .proxy import RuntimeValue, as_value, emit, emit1

Value = RuntimeValue


def debug_enabled() -> bool:
    """Is the kernel being traced compiled with the ``debug`` option?"""
    options = current_builder().options
    return bool(options is not None and options.debug)


def _printable(k: int, x) -> Value:
    v = as_value(x)
    t = v.type
    if not isinstance(t, ScalarType):
        current_builder().error(f"printf value {k} expects a scalar, but got a {t} value",
                                hint="print its address with ty.address(p) and %llx")
    if t == i1:
        return emit1("select", (v, as_value(1, i32), as_value(0, i32)))
    if t in (f16, bf16):
        return emit1("convert", (v,), to=f32)
    if t.bits < 32:
        return emit1("convert", (v,), to=i32 if t.is_signed else u32)
    return v


def printf(fmt: str, *values) -> None:
    """Print ``fmt % values`` from every thread that runs it (C format; see the module doc)."""
    bld = current_builder()
    if not isinstance(fmt, str):
        bld.error(f"printf expects a format string as its first argument, but got {type(fmt).__name__} {fmt!r}")
    vals = [_printable(k, x) for k, x in enumerate(values)]
    try:
        check_arguments(fmt, [v.type for v in vals])
    except FormatError as e:
        bld.error(str(e))
    if not debug_enabled():
        return
    emit("printf", tuple(vals), format=fmt)


def device_assert(cond, message: str = "") -> None:
    """Stop the kernel where ``cond`` is false, printing the kernel line and ``message``."""
    bld = current_builder()
    c = as_value(cond, i1)
    if c.type != i1:
        bld.error(f"device_assert expects an i1 condition (a comparison), but got a {c.type} value",
                  hint="compare explicitly, e.g. x != 0")
    if not isinstance(message, str):
        bld.error(f"device_assert message expects a str, but got {type(message).__name__}")
    if not debug_enabled():
        return
    emit("device_assert", (c,), message=message)


__all__ = ["printf", "device_assert", "debug_enabled"]
