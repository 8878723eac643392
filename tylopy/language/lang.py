"""The kernel language: what a kernel body calls, and the types its parameters declare.

Everything here builds IR through the active builder. Run-time scalars and pointers are
``RuntimeValue``s (``ty.Value``) and take Python's operators; pointers index like arrays
(``x[i]`` loads, ``x[i] = v`` stores) and offset with ``+``. Types never change silently:
mixing i32 and f32, or f32 and bf16, is an error that names the line; use ``cast``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..ir.types import (PointerType, ScalarType, b32, bf16, f16, f32, f64, i1, i8, i16, i32, i64,
                        tensormap, u8, u16, u32, u64)
from ..ir.values import SharedAlloc
from .builder import KernelResourceError, current_builder
from .proxy import RuntimeValue, _same_pair, as_value, emit, emit1, maximum, minimum  # noqa: F401
from .tensor import TensorArg, tensor  # noqa: F401  (tensor parameters)
from .tracing import range, static_range  # noqa: F401  (kernel-visible)

Value = RuntimeValue  # what kernel code holds for a run-time value
STATIC_SHARED_LIMIT = 48 * 1024  # what ptxas allows statically on every target; more needs dynamic shared memory

__all__ = [
    "i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "b32", "f16", "bf16", "f32", "f64",
    "ptr", "NoAliasPointer", "Value", "RuntimeValue", "constexpr", "tensormap", "thread_idx", "block_idx",
    "block_dim", "grid_dim", "lane_id", "warp_idx", "warpgroup_idx", "exp2", "log2", "sqrt", "rsqrt", "rcp", "fma", "minimum", "maximum", "abs",
    "select", "cast", "bitcast", "pack2", "unpack2", "load", "store", "shared", "dynamic_shared",
    "add", "sub", "mul", "div", "ROUNDINGS",
    "ptr_cast", "address", "syncthreads", "barrier_sync", "barrier_arrive", "shfl_xor", "shfl_idx",
    "shfl_down", "shfl_up", "inline_ptx", "range", "static_range", "elect_one", "tensor", "TensorArg",
]


# -- parameter annotations ----------------------------------------------------------------------

@dataclass(frozen=True)
class NoAliasPointer:
    """A pointer parameter the author promises no other pointer parameter of the launch overlaps.

    The promise becomes LLVM's ``noalias``: loads may be reordered across stores through other
    pointers and kept in registers. Breaking it gives undefined results.
    """

    type: PointerType

    def __repr__(self):
        return f"ptr({self.type.pointee}, noalias=True)"


def ptr(pointee: ScalarType, space: str = "global", noalias: bool = False):
    """A pointer parameter or value: ``ptr(f32)`` is a global ``float*``.

    ``noalias=True`` (parameters only) promises that no other pointer argument overlaps this
    one's memory, like C's ``restrict``; without it tylopy assumes pointers may alias.
    """
    if not isinstance(pointee, ScalarType):
        raise TypeError(f"ptr expects a scalar element type such as ty.f32, but got {pointee!r}")
    if space not in ("global", "shared", "generic"):
        raise ValueError(f"ptr space expects 'global', 'shared' or 'generic', but got {space!r}")
    t = PointerType(pointee, space)
    return NoAliasPointer(t) if noalias else t


class _Constexpr:
    """Annotation for a compile-time parameter: each distinct value compiles its own kernel."""

    def __repr__(self):
        return "constexpr"


constexpr = _Constexpr()


# -- indices ----------------------------------------------------------------------------------

_AXES = {0: "x", 1: "y", 2: "z", "x": "x", "y": "y", "z": "z"}


def _special(base: str, axis) -> Value:
    if axis not in _AXES:
        current_builder().error(f"{base} axis expects 0, 1, 2 or 'x', 'y', 'z', but got {axis!r}")
    return emit1("special", (), reg=f"{base}.{_AXES[axis]}")


def thread_idx(axis=0) -> Value:
    """%tid: this thread's index in its block."""
    return _special("tid", axis)


def block_idx(axis=0) -> Value:
    """%ctaid: this block's index in the grid."""
    return _special("ctaid", axis)


def block_dim(axis=0) -> Value:
    return _special("ntid", axis)


def grid_dim(axis=0) -> Value:
    return _special("nctaid", axis)


def lane_id() -> Value:
    return emit1("special", (), reg="laneid")


def warp_idx() -> Value:
    """tid.x // 32, broadcast from lane 0 so ptxas can prove it warp-uniform."""
    return shfl_idx(thread_idx(0) >> 5, 0)


def warpgroup_idx() -> Value:
    """tid.x // 128, warp-uniform (CUTLASS's canonical_warp_group_idx)."""
    return shfl_idx(thread_idx(0) >> 7, 0)


# -- math ---------------------------------------------------------------------------------------

def exp2(x) -> Value:
    """2**x with PTX ex2.approx.ftz.f32 (max relative error 2**-22.5; ex2(-inf) = +0)."""
    return emit1("exp2", (as_value(x, f32),))


def log2(x) -> Value:
    """log2(x) with PTX lg2.approx.ftz.f32."""
    return emit1("log2", (as_value(x, f32),))


def sqrt(x, rounding: str | None = None) -> Value:
    """Square root of an f32, correctly rounded (``sqrt.rn``; ``rounding``: "rz", "rm", "rp")."""
    return emit1("sqrt", (as_value(x, f32),), **_rounding_attr("sqrt", rounding))


def rsqrt(x) -> Value:
    return emit1("rsqrt", (as_value(x, f32),))


def rcp(x) -> Value:
    """1/x, correctly rounded (rcp.rn.f32)."""
    return emit1("rcp", (as_value(x, f32),))


def fma(a, b, c, rounding: str | None = None) -> Value:
    """a*b + c with one rounding (to nearest even, or ``rounding``: "rn", "rz", "rm", "rp")."""
    like = next((v.type for v in (a, b, c) if isinstance(v, Value)), f32)
    return emit1("fma", tuple(as_value(v, like) for v in (a, b, c)), **_rounding_attr("fma", rounding))


# -- float arithmetic with an explicit rounding direction ------------------------------------------------

ROUNDINGS = ("rn", "rz", "rm", "rp")
"""IEEE rounding directions PTX names: to nearest even, toward zero, toward -inf, toward +inf."""


def _rounding_attr(op: str, rounding) -> dict:
    if rounding is None:
        return {}
    if rounding not in ROUNDINGS:
        current_builder().error(f"{op} rounding expects one of {', '.join(map(repr, ROUNDINGS))}, but got {rounding!r}",
                                hint="rn: to nearest even, rz: toward zero, rm: toward -inf, rp: toward +inf")
    return {"rounding": rounding}


def _arith(op: str, a, b, rounding):
    a, b = _same_pair(op, a, b)
    return emit1(op, (a, b), **_rounding_attr(op, rounding))


def add(a, b, rounding: str | None = None) -> Value:
    """a + b; ``rounding`` ("rn", "rz", "rm", "rp", f32/f64 only) picks PTX's add.{rnd} explicitly.

    With an explicit rounding the op is never contracted into an fma. Emulated bit for bit
    (``tylopy/semantics/rounding.py``).
    """
    return _arith("add", a, b, rounding)


def sub(a, b, rounding: str | None = None) -> Value:
    """a - b, optionally with an explicit rounding (see ``add``)."""
    return _arith("sub", a, b, rounding)


def mul(a, b, rounding: str | None = None) -> Value:
    """a * b, optionally with an explicit rounding (see ``add``)."""
    return _arith("mul", a, b, rounding)


def div(a, b, rounding: str | None = None) -> Value:
    """a / b (floats: ``div.rn``; integers truncate like ``//``), optionally with an explicit
    rounding for floats (see ``add``)."""
    return _arith("div", a, b, rounding)


def abs(x) -> Value:  # noqa: A001
    return emit1("abs", (as_value(x),))


def select(cond, a, b) -> Value:
    """``a if cond else b`` without a branch (PTX selp)."""
    cond = as_value(cond, i1)
    if cond.type != i1:
        current_builder().error(f"select expects an i1 condition, but got {cond.type}")
    a, b = _same_pair("select", a, b)
    return emit1("select", (cond, a, b))


def cast(x, to: ScalarType, rounding: str | None = None) -> Value:
    """Convert the value: floats round to nearest even, float to int truncates toward zero.

    ``rounding`` ("rn", "rz", "rm", "rp") picks the direction of a conversion that rounds: a
    float to a narrower float (f32 -> f16/bf16, f64 -> f32/f16/bf16), an int to a float, or a
    float to an int ("rn" rounds to the nearest integer, ties to even: cvt.rni).
    """
    if not isinstance(to, ScalarType):
        current_builder().error(f"cast expects a scalar type such as ty.f32, but got {to!r}")
    x = as_value(x, f32 if to.is_fp8 and not isinstance(x, RuntimeValue) else to)  # no fp8 constants
    if x.type == to:
        if rounding is not None:
            current_builder().error(f"cast to {to} with rounding={rounding!r}: the value is already {to}, "
                                    "nothing rounds")
        return x
    if rounding is not None and to == bf16 and (x.type == f64 or x.type.is_int):
        from ..codegen.targets import family
        if family(current_builder().arch) < (9, 0):
            current_builder().error(f"cast from {x.type} to bf16 with an explicit rounding expects a kernel for "
                                    f"sm_90 or newer (PTX cvt.rnd.bf16.{x.type.name}), but it targets "
                                    f"{current_builder().arch}",
                                    hint="cast to f32 first with the same rounding (exact for rz/rm/rp), then to bf16")
    if to.is_fp8 or x.type.is_fp8:
        from .fp8 import require_fp8_target
        require_fp8_target(f"cast from {x.type} to {to}")
    return emit1("convert", (x,), to=to, **_rounding_attr("cast", rounding))


def bitcast(x, to: ScalarType) -> Value:
    return emit1("bitcast", (as_value(x),), to=to)


def pack2(lo, hi, dtype: ScalarType) -> Value:
    """Round two f32 to ``dtype`` (f16 or bf16, nearest even) and pack them; ``lo`` in bits 0-15."""
    return emit1("pack2", (as_value(lo, f32), as_value(hi, f32)), dtype=dtype)


def unpack2(word, dtype: ScalarType) -> tuple[Value, Value]:
    """The two f16/bf16 halves of a b32 word as f32: (bits 0-15, bits 16-31)."""
    lo, hi = emit("unpack2", (as_value(word),), dtype=dtype)
    return lo, hi


# -- memory -------------------------------------------------------------------------------------

def load(p: Value, vec: int = 1, mask=None):
    """Load ``vec`` consecutive elements as one access; a tuple if vec > 1.

    ``vec`` is 1, 2, 4, 8 or 16 with ``vec * element size <= 16`` bytes: 4 for f32, 8 for
    bf16/f16, 16 for 8-bit types (u8, i8, e4m3, e5m2), each a single 16-byte ``ld.v4.b32``. The
    address must be aligned to the whole access (``vec * size`` bytes). With ``mask``, lanes
    whose mask is false read nothing and get zero.
    """
    ops = (p,) if mask is None else (p, as_value(mask, i1))
    res = emit("load", ops, vec=vec)
    return res[0] if vec == 1 else res


def store(p: Value, value) -> None:
    """Store one value, or a tuple of 2/4/8 (16 of 8-bit elements) as one vector access."""
    vals = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    pointee = p.type.pointee if isinstance(p.type, PointerType) else None
    emit("store", (p, *[as_value(v, pointee) for v in vals]))


def shared(dtype: ScalarType, count: int, align: int = 16) -> Value:
    """A static shared-memory array of ``count`` elements; returns its ptr<dtype, shared>."""
    bld = current_builder()
    if isinstance(count, Value):
        bld.error("shared expects a compile-time element count, but got a run-time value",
                  hint="use dynamic_shared for sizes known at launch")
    if isinstance(count, bool) or not hasattr(type(count), "__index__") or int(count) <= 0:
        bld.error(f"shared expects a positive int element count, but got {count!r}")
    name = f"smem{len(bld.shared_allocs)}"
    bld.shared_allocs.append(SharedAlloc(name, int(count) * dtype.nbytes, int(align)))
    total = sum(a.nbytes for a in bld.shared_allocs)
    if total > STATIC_SHARED_LIMIT:
        bld.error(f"static shared memory expects at most {STATIC_SHARED_LIMIT} bytes per block, but this kernel "
                  f"asks for {total}", hint="allocate large buffers with ty.dynamic_shared (up to 227 KB on "
                                            "Hopper, opted in at launch)", cls=KernelResourceError)
    _check_shared_total(bld)
    return emit1("shared_ptr", (), type=PointerType(dtype, "shared"), name=name)


def _check_shared_total(bld) -> None:
    """Static plus dynamic shared memory within what one block of the target may have (else the
    kernel could compile, dump and emulate but never launch): an error at the line that asks."""
    from ..codegen.targets import SHARED_MEMORY_PER_BLOCK
    limit = SHARED_MEMORY_PER_BLOCK.get(bld.arch)
    static = sum(a.nbytes for a in bld.shared_allocs)
    total = static + bld.dynamic_shared_bytes
    if limit is not None and total > limit:
        who = f"kernel {bld.kernel_name!r}" if bld.kernel_name else "this kernel"
        parts = f" ({static} static + {bld.dynamic_shared_bytes} dynamic)" if static and bld.dynamic_shared_bytes else ""
        bld.error(f"shared memory expects at most {limit} bytes ({limit // 1024} KB) per block on {bld.arch}, but "
                  f"{who} asks for {total} bytes ({total / 1024:.1f} KB){parts}",
                  hint="use fewer pipeline stages or smaller tiles", cls=KernelResourceError)


def dynamic_shared(dtype: ScalarType, nbytes: int, align: int = 16) -> Value:
    """The dynamic shared-memory window (``nbytes`` compile-time), as ptr<dtype, shared>."""
    bld = current_builder()
    if isinstance(nbytes, Value):
        bld.error("dynamic_shared expects a compile-time byte count, but got a run-time value")
    if isinstance(nbytes, bool) or not hasattr(type(nbytes), "__index__") or int(nbytes) <= 0:
        bld.error(f"dynamic_shared expects a positive int byte count, but got {nbytes!r}")
    bld.dynamic_shared_bytes = max(bld.dynamic_shared_bytes, int(nbytes))
    bld.dynamic_shared_align = max(bld.dynamic_shared_align, int(align))
    _check_shared_total(bld)
    return emit1("dynamic_shared_ptr", (), type=PointerType(dtype, "shared"))


def ptr_cast(p: Value, dtype: ScalarType | None = None, space: str | None = None) -> Value:
    """The same address seen as another element type and/or state space."""
    if not isinstance(p, Value) or not isinstance(p.type, PointerType):
        current_builder().error(f"ptr_cast expects a pointer, but got {p!r}")
    to = PointerType(dtype or p.type.pointee, space or p.type.space)
    if to == p.type:
        return p
    return emit1("ptr_cast", (p,), to=to)


def address(p: Value) -> Value:
    """The integer address: u32 for shared pointers (the shared window), u64 otherwise."""
    return emit1("ptr_to_int", (p,))


# -- synchronization and warp collectives ---------------------------------------------------------

def syncthreads() -> None:
    """bar.sync 0 over the whole block."""
    emit("barrier", (), id=0, count=None)


def _check_named(id, count):
    bld = current_builder()
    if isinstance(count, Value):
        bld.error("named barriers expect a compile-time thread count")
    if not isinstance(id, Value) and not 0 <= id <= 15:
        bld.error(f"barrier id expects 0..15, but got {id}")
    if count is not None and (count <= 0 or count % 32):
        bld.error(f"barrier thread count expects a positive multiple of 32, but got {count}")


def barrier_sync(id, count: int | None = None) -> None:
    """bar.sync id, count: wait until ``count`` threads arrived or synced on barrier ``id``.

    ``id`` may be a run-time (warp-uniform) value, e.g. a warpgroup's own barrier.
    """
    _check_named(id, count)
    if isinstance(id, Value):
        emit("barrier", (as_value(id, i32),), count=count)
    else:
        emit("barrier", (), id=int(id), count=count)


def barrier_arrive(id, count: int) -> None:
    """bar.arrive id, count: count this thread in without waiting."""
    _check_named(id, count)
    if isinstance(id, Value):
        emit("barrier_arrive", (as_value(id, i32),), count=int(count))
    else:
        emit("barrier_arrive", (), id=int(id), count=int(count))


def _shfl(mode, v, lane):
    return emit1("shfl", (as_value(v), as_value(lane, i32)), mode=mode)


def shfl_xor(v, lane_mask) -> Value:
    """shfl.sync.bfly over the full warp."""
    return _shfl("bfly", v, lane_mask)


def shfl_idx(v, src_lane) -> Value:
    return _shfl("idx", v, src_lane)


def shfl_down(v, delta) -> Value:
    return _shfl("down", v, delta)


def shfl_up(v, delta) -> Value:
    return _shfl("up", v, delta)


def elect_one() -> Value:
    """True in exactly one lane of the (fully active) warp (elect.sync)."""
    return emit1("elect_one", ())


def inline_ptx(template: str, inputs: Sequence = (), constraints: str = "", results: Sequence[ScalarType] = (),
               side_effect: bool = True, convergent: bool = False):
    """Escape hatch: a PTX snippet with LLVM constraints (``=r,=f`` outputs first, then inputs).

    Operands are ``$0``, ``$1``... in the template. Returns a value, a tuple, or None.
    """
    vals = tuple(as_value(x) for x in inputs)
    _check_asm(template, constraints, vals, tuple(results), inputs)
    res = emit("asm", vals, template=template, constraints=constraints,
                                 results=tuple(results), side_effect=side_effect, convergent=convergent)
    if not res:
        return None
    return res[0] if len(res) == 1 else res


# The NVPTX inline-assembly constraint letters tylopy passes to LLVM, and the types each takes.
# Anything else (or a type that does not match) would abort the process inside LLVM.
_ASM_CONSTRAINTS = {"h": (16,), "r": (32,), "l": (64,), "f": ("f32",), "d": ("f64",), "n": ("imm",)}


def _asm_fits(letter: str, t) -> bool:
    if isinstance(t, PointerType):
        return letter == "l" and t.space != "shared" or letter == "r" and t.space == "shared"
    if not isinstance(t, ScalarType) or t.is_bool:
        return False
    if letter in "fd":
        return t.name == _ASM_CONSTRAINTS[letter][0]
    return not t.is_float and t.bits == _ASM_CONSTRAINTS[letter][0] or letter == "h" and t.bits == 16


def _check_asm(template: str, constraints: str, vals, results, raw_inputs):
    """Reject what LLVM would abort on: unknown letters, counts or types that do not match, $N out of range."""
    import re
    bld = current_builder()
    if not isinstance(template, str) or not isinstance(constraints, str):
        bld.error("inline_ptx expects a template string and a constraint string")
    parts = [c.strip() for c in constraints.split(",")] if constraints.strip() else []
    outs = [c for c in parts if c.startswith("=")]
    clobbers = [c for c in parts if c.startswith("~")]
    ins = [c for c in parts if not c.startswith(("=", "~"))]
    if parts != outs + ins + clobbers:
        bld.error(f"inline_ptx constraints expect outputs (=r...) first, then inputs, then clobbers (~{{memory}}), "
                  f"but got {constraints!r}")
    for c in clobbers:
        if not re.fullmatch(r"~\{[a-z]+\}", c):
            bld.error(f"inline_ptx clobber expects ~{{memory}}, but got {c!r}")
    if len(outs) != len(results):
        bld.error(f"inline_ptx has {len(results)} result type(s) but {len(outs)} output constraint(s) in "
                  f"{constraints!r}", hint="give one =letter per result type, in order")
    if len(ins) != len(vals):
        bld.error(f"inline_ptx has {len(vals)} input(s) but {len(ins)} input constraint(s) in {constraints!r}")
    for what, cs, types in (("output", [c[1:] for c in outs], results), ("input", ins, [v.type for v in vals])):
        for i, (c, t) in enumerate(zip(cs, types)):
            if c not in _ASM_CONSTRAINTS:
                bld.error(f"inline_ptx {what} {i} has the constraint {c!r}; tylopy supports "
                          f"{', '.join(sorted(_ASM_CONSTRAINTS))} (h: 16-bit, r: 32-bit, l: 64-bit, f: f32, "
                          "d: f64, n: an integer constant)")
            if c == "n":
                if what == "output" or isinstance(raw_inputs[i], RuntimeValue) or not isinstance(raw_inputs[i], int):
                    bld.error(f"inline_ptx {what} {i}: the 'n' constraint expects a Python int constant")
            elif not _asm_fits(c, t):
                bld.error(f"inline_ptx {what} {i}: constraint {c!r} does not take a {t} value")
    count = len(outs) + len(ins)
    for m in re.finditer(r"\$(\d+)", template):
        if int(m.group(1)) >= count:
            bld.error(f"inline_ptx template uses ${m.group(1)}, but there are only {count} operands "
                      f"($0..${count - 1})" if count else f"inline_ptx template uses ${m.group(1)}, but there are "
                      "no operands")

