"""Lowerings of Hopper's asynchronous instructions (mbarrier, TMA loads, wgmma, setmaxnreg) to
inline PTX from ``asm_templates``; registered in ``llvm.LOWER``. The matrix instructions
(mma.sync, ldmatrix, stmatrix) are in ``lower_matrix``, the asynchronous copies in
``lower_async_copy``."""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.values import Op, Value
from ..ir.types import PointerType, f32
from . import asm_templates as T

I32, I64 = ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()


def set_asm_results(L, op, r):
    """Bind an asm call's result (a value or a literal struct) to the op's results."""
    if len(op.results) == 1:
        L.set(op.results[0], r)
    else:
        for i, res in enumerate(op.results):
            L.set(res, L.b.extract_value(r, i))


def shared_u32(L, v: Value):
    x = L.v(v)
    if isinstance(v.type, PointerType):
        return L.b.ptrtoint(x, I32)
    return x


def asm_op(key):
    def lower(L, op: Op):
        args = [shared_u32(L, v) for v in op.operands]
        L.asm(*T.SIMPLE[key], args, convergent=True)
    return lower


def lower_remote_mbarrier_arrive(L, op: Op):
    """``mbarrier_arrive_cluster`` / ``mbarrier_arrive_expect_tx_cluster``: the release scope is the
    op's ``scope`` attribute (the frontend's default is "cluster")."""
    args = [shared_u32(L, v) for v in op.operands]
    tx = op.opcode == "mbarrier_arrive_expect_tx_cluster"
    L.asm(*T.remote_mbarrier_arrive(op.attr("scope", "cluster"), tx), args, convergent=True)


def lower_mbarrier_try_wait(L, op: Op):
    bar, parity = (shared_u32(L, v) for v in op.operands)
    r = L.asm(*T.SIMPLE["mbarrier_try_wait"], [bar, parity], ret=I32)
    L.set(op.result, L.b.icmp_unsigned("!=", r, I32(0)))


def lower_elect_one(L, op: Op):
    r = L.asm(*T.SIMPLE["elect_one"], [], ret=I32, convergent=True)
    L.set(op.result, L.b.icmp_unsigned("!=", r, I32(0)))


def lower_prefetch_tensormap(L, op: Op):
    tm = L.b.ptrtoint(L.v(op.operands[0]), I64)
    L.asm(*T.SIMPLE["prefetch_tensormap"], [tm])


def lower_tma_load(L, op: Op):
    dst, tmap, bar, *coords = op.operands
    multicast = bool(op.attr("multicast", False))
    mask = [L.b.trunc(L.v(coords.pop()), ir.IntType(16))] if multicast else []
    args = [shared_u32(L, dst), L.b.ptrtoint(L.v(tmap), I64), shared_u32(L, bar)] + [L.v(c) for c in coords] + mask
    L.asm(*T.tma_load(op.attr("rank"), multicast), args)


def lower_setmaxnreg(L, op: Op):
    L.asm(*T.setmaxnreg(op.attr("n"), op.attr("inc")), [], convergent=True)


def _kinds(values) -> str:
    return "".join("f" if v.type == f32 else ("l" if v.type.bits == 64 else "r") for v in values)


def _tied(L, op: Op, text_cons):
    vals = [L.v(x) for x in op.operands]
    if not vals:
        L.asm(text_cons[0], text_cons[1], [], convergent=True)
        return
    ret = ir.LiteralStructType([x.type for x in vals]) if len(vals) > 1 else vals[0].type
    r = L.asm(text_cons[0], text_cons[1], vals, ret=ret, convergent=True)
    set_asm_results(L, op, r)


def lower_wgmma_wait(L, op: Op):
    _tied(L, op, T.wgmma_wait(op.attr("n"), len(op.operands), _kinds(op.operands)))


def lower_fence_operand(L, op: Op):
    _tied(L, op, T.fence_operand(_kinds(op.operands)))


def lower_wgmma(L, op: Op):
    n = op.attr("n")
    zero = op.attr("zero_init", False)
    vals = [L.v(x) for x in op.operands]
    args = vals if zero else vals[:-1] + [L.b.zext(vals[-1], I32)]
    acc = op.attr("acc", "f32")
    text, cons = T.wgmma(n, op.attr("dtype"), op.attr("a_kind"), op.attr("trans_b"), zero,
                         op.attr("trans_a", 0), op.attr("b_dtype"), acc)
    ret = [I32] * (n // 4) if acc == "f16" else [F32] * (n // 2)
    r = L.asm(text, cons, args, ret=ir.LiteralStructType(ret), convergent=True)
    set_asm_results(L, op, r)
