"""Atomics and reductions on global and shared memory: ``ty.atomic_add``, ``ty.red_add``, ...

``atomic_<op>(ptr, value, sem="relaxed", scope="gpu")`` updates ``*ptr`` atomically and returns
the value it held before (PTX ``atom``); ``red_<op>`` does the same update and returns nothing
(PTX ``red``, cheaper: no result travels back). ``ptr`` points into global, shared or generic
memory; each lane updates its own address, and lanes that hit the same address are all applied.

* ``sem``: the memory order, ``"relaxed"`` (default), ``"acquire"``, ``"release"``,
  ``"acq_rel"`` (reductions: ``"relaxed"`` or ``"release"``). ``scope``: the threads that
  observe it in that order, ``"cta"``, ``"cluster"`` (sm_90), ``"gpu"`` (default), ``"sys"``.
* Types (what ptxas accepts): add on f32, f64, f16, bf16 (sm_90), i32, u32, u64 and packed
  pairs of halves (``packed="f16x2"`` or ``"bf16x2"`` (sm_90) on a ``ty.b32`` pointer: each
  half added on its own, subnormals kept); min/max on i32, u32, i64, u64; and/or/xor on 32-
  and 64-bit integers; exch on 32- and 64-bit integers and floats; cas on 32- and 64-bit
  integers; inc/dec on u32 (``inc``: ``0 if old >= value else old + 1``; ``dec``:
  ``value if old == 0 or old > value else old - 1``).
* ``red_add(ptr, (a, b, c, d))``: four f32 added to ``ptr[0..3]`` with one
  ``red.global.v4.f32.add`` (two with a pair; sm_90, global memory, ``ptr`` aligned to the
  vector's size). Each element is atomic on its own, not the vector as a whole.
* f32 adds on global memory flush subnormal inputs and results to zero (the ISA documents
  this for ``atom``/``red.add.f32`` on global memory); on shared memory they do not.

Same-address updates from different lanes happen in an order the hardware does not specify;
the emulator applies them in lane order, warp after warp (``tylopy.semantics.atomics``), and
reports a race between an atomic and a plain access of shared memory by another warp with no
barrier ordering them.

docs/warp-atomics-debug.md has the rules and the facts from the PTX ISA behind them.
"""
from __future__ import annotations

from ..ir.types import PointerType, b32, bf16, f32
from ..ir.ops.atomics import ALLOWED, SCOPES, SEMANTICS
from .builder import current_builder
from .proxy import RuntimeValue, as_value, emit, emit1

Value = RuntimeValue


def _arch_number(arch: str) -> int:
    digits = "".join(ch for ch in arch[3:] if ch.isdigit())
    return int(digits) if digits else 0


def _needs_sm90(fn: str, what: str):
    bld = current_builder()
    if _arch_number(bld.arch) < 90:
        bld.error(f"{fn} with {what} needs sm_90 or newer, but the kernel compiles for {bld.arch}",
                  hint="compile for sm_90a (the default), or use another type or scope")


def _check(fn: str, ptr, op: str, sem: str, scope: str, packed, sems) -> PointerType:
    bld = current_builder()
    if not isinstance(ptr, RuntimeValue) or not isinstance(ptr.type, PointerType):
        bld.error(f"{fn} expects a pointer as its first argument, but got {ptr!r}",
                  hint="pass the element's address, e.g. ty.atomic_add(counts + i, 1)")
    pt = ptr.type
    if pt.space not in ("global", "shared", "generic"):
        bld.error(f"{fn} expects a pointer to global, shared or generic memory, but got {pt}")
    if sem not in sems:
        bld.error(f"{fn} sem expects one of {', '.join(map(repr, sems))}, but got {sem!r}")
    if scope not in SCOPES:
        bld.error(f"{fn} scope expects one of {', '.join(map(repr, SCOPES))}, but got {scope!r}")
    if scope == "cluster":
        _needs_sm90(fn, "scope='cluster'")
    if packed is not None:
        if packed not in ("f16x2", "bf16x2"):
            bld.error(f"{fn} packed expects 'f16x2' or 'bf16x2', but got {packed!r}")
        if op != "add":
            bld.error(f"{fn} does not take packed=: only adds of packed halves exist")
        if pt.pointee != b32:
            bld.error(f"{fn} with packed={packed!r} expects a pointer to b32 words, but got {pt}",
                      hint="view the memory as words: ty.ptr_cast(p, ty.b32)")
        if packed == "bf16x2":
            _needs_sm90(fn, "packed='bf16x2'")
        return pt
    allowed = ALLOWED[op]
    if pt.pointee not in allowed or (op == "add" and pt.pointee == b32):
        hint = "pass packed='f16x2' or 'bf16x2' for b32 words of two halves" if pt.pointee == b32 else None
        bld.error(f"{fn} expects a pointer to {', '.join(str(t) for t in allowed if t != b32 or op != 'add')}, "
                  f"but got {pt}", hint=hint)
    if op == "add" and pt.pointee == bf16:
        _needs_sm90(fn, "bf16 values")
    return pt


def _value(fn: str, what: str, x, pt: PointerType) -> Value:
    v = as_value(x, pt.pointee)
    if v.type != pt.pointee:
        current_builder().error(f"{fn} {what} expects a {pt.pointee} value (the pointer's element type), but got "
                                f"{v.type}", hint=f"convert with ty.cast(..., ty.{pt.pointee})")
    return v


def _atomic(op: str, ptr, value, sem: str, scope: str, packed=None) -> Value:
    fn = f"atomic_{op}"
    pt = _check(fn, ptr, op, sem, scope, packed, SEMANTICS)
    attrs = {"op": op, "sem": sem, "scope": scope}
    if packed is not None:
        attrs["packed"] = packed
    return emit1("atomic", (ptr, _value(fn, "value", value, pt)), **attrs)


def _reduce(op: str, ptr, value, sem: str, scope: str, packed=None) -> None:
    fn = f"red_{op}"
    bld = current_builder()
    pt = _check(fn, ptr, op, sem, scope, packed, ("relaxed", "release"))
    attrs = {"op": op, "sem": sem, "scope": scope}
    if packed is not None:
        attrs["packed"] = packed
    if isinstance(value, (tuple, list)):
        if len(value) not in (2, 4) or op != "add" or pt.pointee != f32 or pt.space != "global" or packed:
            bld.error(f"{fn} with a tuple expects 2 or 4 f32 values added to a global ptr<f32> "
                      f"(red.global.v4.f32.add), but got {len(value)} value(s) for {op} on {pt}")
        _needs_sm90(fn, "a vector of values")
        vals = tuple(_value(fn, f"value {k}", x, pt) for k, x in enumerate(value))
        emit("reduce", (ptr, *vals), vec=len(vals), **attrs)
        return
    emit("reduce", (ptr, _value(fn, "value", value, pt)), **attrs)


def atomic_add(ptr, value, sem="relaxed", scope="gpu", packed=None) -> Value:
    """``old = *ptr; *ptr = old + value`` atomically; returns ``old`` (``atom.add``)."""
    return _atomic("add", ptr, value, sem, scope, packed)


def atomic_min(ptr, value, sem="relaxed", scope="gpu") -> Value:
    return _atomic("min", ptr, value, sem, scope)


def atomic_max(ptr, value, sem="relaxed", scope="gpu") -> Value:
    return _atomic("max", ptr, value, sem, scope)


def atomic_and(ptr, value, sem="relaxed", scope="gpu") -> Value:
    return _atomic("and", ptr, value, sem, scope)


def atomic_or(ptr, value, sem="relaxed", scope="gpu") -> Value:
    return _atomic("or", ptr, value, sem, scope)


def atomic_xor(ptr, value, sem="relaxed", scope="gpu") -> Value:
    return _atomic("xor", ptr, value, sem, scope)


def atomic_exch(ptr, value, sem="relaxed", scope="gpu") -> Value:
    """Store ``value`` and return the previous contents (``atom.exch``)."""
    return _atomic("exch", ptr, value, sem, scope)


def atomic_inc(ptr, value, sem="relaxed", scope="gpu") -> Value:
    """``*ptr = 0 if old >= value else old + 1`` on u32 (a counter that wraps at ``value``)."""
    return _atomic("inc", ptr, value, sem, scope)


def atomic_dec(ptr, value, sem="relaxed", scope="gpu") -> Value:
    """``*ptr = value if old == 0 or old > value else old - 1`` on u32."""
    return _atomic("dec", ptr, value, sem, scope)


def atomic_cas(ptr, compare, value, sem="relaxed", scope="gpu") -> Value:
    """Compare-and-swap: ``*ptr = value if old == compare else old`` (bits); returns ``old``."""
    fn = "atomic_cas"
    pt = _check(fn, ptr, "cas", sem, scope, None, SEMANTICS)
    return emit1("atomic", (ptr, _value(fn, "compare", compare, pt), _value(fn, "value", value, pt)),
                 op="cas", sem=sem, scope=scope)


def red_add(ptr, value, sem="relaxed", scope="gpu", packed=None) -> None:
    """``*ptr += value`` atomically, no result (``red.add``); a tuple of 2/4 f32 is one vector add."""
    _reduce("add", ptr, value, sem, scope, packed)


def red_min(ptr, value, sem="relaxed", scope="gpu") -> None:
    _reduce("min", ptr, value, sem, scope)


def red_max(ptr, value, sem="relaxed", scope="gpu") -> None:
    _reduce("max", ptr, value, sem, scope)


def red_and(ptr, value, sem="relaxed", scope="gpu") -> None:
    _reduce("and", ptr, value, sem, scope)


def red_or(ptr, value, sem="relaxed", scope="gpu") -> None:
    _reduce("or", ptr, value, sem, scope)


def red_xor(ptr, value, sem="relaxed", scope="gpu") -> None:
    _reduce("xor", ptr, value, sem, scope)


def red_inc(ptr, value, sem="relaxed", scope="gpu") -> None:
    _reduce("inc", ptr, value, sem, scope)


def red_dec(ptr, value, sem="relaxed", scope="gpu") -> None:
    _reduce("dec", ptr, value, sem, scope)


__all__ = ["atomic_add", "atomic_min", "atomic_max", "atomic_and", "atomic_or", "atomic_xor", "atomic_exch",
           "atomic_inc", "atomic_dec", "atomic_cas", "red_add", "red_min", "red_max", "red_and", "red_or",
           "red_xor", "red_inc", "red_dec"]
