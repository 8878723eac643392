"""Lowerings of warp votes, matches, integer reductions and ``activemask`` to NVVM intrinsics.

Every ``.sync`` intrinsic takes the full member mask ``0xffffffff`` (the frontend documents the
converged-warp requirement); LLVM treats them as convergent, so they are never moved into or
out of divergent code. Registered in ``llvm.LOWER``.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.values import Op

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
FULL = ir.Constant(I32, 0xFFFFFFFF)


def lower_vote(L, op: Op):
    p = L.v(op.operands[0])
    mode = op.attr("mode")
    ret = I32 if mode == "ballot" else I1
    L.set(op.result, L.call(f"llvm.nvvm.vote.{mode}.sync", ret, [FULL, p]))


def lower_match(L, op: Op):
    x = L.v(op.operands[0])
    width = op.operands[0].type.bits
    if op.attr("mode") == "any":
        L.set(op.result, L.call(f"llvm.nvvm.match.any.sync.i{width}", I32, [FULL, x]))
        return
    r = L.call(f"llvm.nvvm.match.all.sync.i{width}p", ir.LiteralStructType([I32, I1]), [FULL, x])
    L.set(op.results[0], L.b.extract_value(r, 0))
    L.set(op.results[1], L.b.extract_value(r, 1))


def lower_redux(L, op: Op):
    x = L.v(op.operands[0])
    kind = op.attr("op")
    if kind in ("min", "max") and not op.operands[0].type.is_signed:
        kind = "u" + kind  # redux.sync.umin: the .u32 form
    L.set(op.result, L.call(f"llvm.nvvm.redux.sync.{kind}", I32, [x, FULL]))


def lower_activemask(L, op: Op):
    L.set(op.result, L.call("llvm.nvvm.activemask", I32, []))


LOWERINGS = {"vote": lower_vote, "match": lower_match, "redux": lower_redux, "activemask": lower_activemask}
