"""Lowerings of atomics (``atom``) and reductions (``red``) to inline PTX with the exact spelling.

Inline PTX rather than LLVM's ``atomicrmw`` because the instruction must be the one written:
``red`` where the author asked for no result, the memory order and scope as given (LLVM's
NVPTX backend picks these itself), packed half adds and ``red.global.v4.f32.add``, which
have no LLVM form. ``.relaxed.gpu`` is PTX's default and is left implicit
(``atom.global.add.u32``, what nvcc emits for ``atomicAdd``). Registered in ``llvm.LOWER``.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.types import PointerType, ScalarType, f16
from ..ir.values import Op
from .llvm_types import llvm_type

I16, I32, I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)

_BITWISE = ("and", "or", "xor", "exch", "cas")


def ptx_type(op: str, t: ScalarType, packed: str | None) -> str:
    """The ``.type`` (with ``.noftz`` where PTX requires it) of ``atom/red.<op>`` on ``t`` values."""
    if packed:
        return f"noftz.{packed}"
    if t.name in ("f16", "bf16"):
        return f"noftz.{t.name}"
    if t.is_float and op != "exch":
        return t.name
    if op in _BITWISE:
        return f"b{t.bits}"
    return ("s" if t.is_signed else "u") + str(t.bits)


def qualifiers(op: Op) -> str:
    """``.sem.scope.space`` of an atomic op (empty sem and scope when relaxed at gpu scope)."""
    sem, scope = op.attr("sem", "relaxed"), op.attr("scope", "gpu")
    order = "" if (sem, scope) == ("relaxed", "gpu") else f".{sem}.{scope}"
    space = op.operands[0].type.space
    return order + {"global": ".global", "shared": ".shared", "generic": ""}[space]


def _constraint(t: ScalarType) -> str:
    if t.bits == 16:
        return "h"
    if t.is_float:
        return "f" if t.bits == 32 else "d"
    return "r" if t.bits == 32 else "l"


def _address(L, p):
    """The pointer operand as an integer register: 32-bit for shared memory, 64-bit otherwise."""
    pt: PointerType = p.type
    width = I32 if pt.space == "shared" else I64
    return L.b.ptrtoint(L.v(p), width), ("r" if pt.space == "shared" else "l")


def _operand(L, v):
    x = L.v(v)
    return L.b.bitcast(x, I16) if v.type == f16 else x  # "h" registers take i16


def lower_atomic(L, op: Op):
    ptr, *vals = op.operands
    t: ScalarType = ptr.type.pointee
    name = op.attr("op")
    addr, acons = _address(L, ptr)
    args = [addr] + [_operand(L, v) for v in vals]
    ins = ", ".join(f"${k + 2}" for k in range(len(vals)))
    text = f"atom{qualifiers(op)}.{name}.{ptx_type(name, t, op.attr('packed'))} $0, [$1], {ins};"
    cons = ",".join([f"={_constraint(t)}", acons] + [_constraint(t)] * len(vals) + ["~{memory}"])
    ret = I16 if t == f16 else llvm_type(t)
    r = L.asm(text, cons, args, ret=ret)
    L.set(op.result, L.b.bitcast(r, llvm_type(t)) if t == f16 else r)


def lower_reduce(L, op: Op):
    ptr, *vals = op.operands
    t: ScalarType = ptr.type.pointee
    name = op.attr("op")
    addr, acons = _address(L, ptr)
    args = [addr] + [_operand(L, v) for v in vals]
    vec = op.attr("vec", 1)
    if vec > 1:
        body = "{" + ", ".join(f"${k + 1}" for k in range(vec)) + "}"
        text = f"red{qualifiers(op)}.v{vec}.f32.add [$0], {body};"
    else:
        text = f"red{qualifiers(op)}.{name}.{ptx_type(name, t, op.attr('packed'))} [$0], $1;"
    cons = ",".join([acons] + [_constraint(t)] * len(vals) + ["~{memory}"])
    L.asm(text, cons, args)


LOWERINGS = {"atomic": lower_atomic, "reduce": lower_reduce}
