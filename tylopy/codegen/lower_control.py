"""Lowerings of the structured control-flow ops (``for``, ``if``, ``while``) to LLVM basic blocks.

Region arguments and results become phi nodes: a ``for`` carries its induction variable and
loop-carried values through a header block, an ``if`` merges its two regions' yields, a ``while``
evaluates its condition region in the header. Registered in ``llvm.LOWER``.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.values import Block, Op
from .llvm_types import llvm_type, signed_constant


def _for_condition(B, signed: bool, iv, hi, step):
    """Go on while iv < hi for a positive step, iv > hi for a negative one; a zero step runs nothing."""
    if not signed:
        return B.icmp_unsigned("<", iv, hi)
    if isinstance(step, ir.Constant):
        return B.icmp_signed(">" if signed_constant(step) < 0 else "<", iv, hi)
    zero = ir.Constant(step.type, 0)
    up = B.and_(B.icmp_signed(">", step, zero), B.icmp_signed("<", iv, hi))
    down = B.and_(B.icmp_signed("<", step, zero), B.icmp_signed(">", iv, hi))
    return B.or_(up, down)


def _loop_metadata(L, op: Op, backedge) -> None:
    """``ty.range(..., unroll=N)``: ``!llvm.loop`` on the back edge asking LLVM's unroller for N copies of
    the body (a remainder loop takes the rest; runtime unrolling is on for a pragma count), or
    ``llvm.loop.unroll.disable`` for N = 1. A loop ID must refer to itself, so it is made with a
    unique placeholder operand and then pointed at itself."""
    n = op.attr("unroll")
    if n is None:
        return
    m = L.fn.module
    hint = (m.add_metadata(["llvm.loop.unroll.disable"]) if n == 1
            else m.add_metadata(["llvm.loop.unroll.count", ir.Constant(ir.IntType(32), n)]))
    loop_id = m.add_metadata([f"tylopy.loop.{len(m.metadata)}"])
    loop_id.operands = (loop_id, hint)
    backedge.set_metadata("llvm.loop", loop_id)


def lower_for(L, op: Op):
    B = L.b
    lo, hi, step, *init = (L.v(x) for x in op.operands)
    body = op.regions[0]
    pre = B.block
    header = L.fn.append_basic_block("for.header")
    loop = L.fn.append_basic_block("for.body")
    exit_ = L.fn.append_basic_block("for.exit")
    B.branch(header)
    B.position_at_end(header)
    iv = B.phi(lo.type)
    iv.add_incoming(lo, pre)
    phis = []
    for v in init:
        phi = B.phi(v.type)
        phi.add_incoming(v, pre)
        phis.append(phi)
    B.cbranch(_for_condition(B, op.operands[0].type.is_signed, iv, hi, step), loop, exit_)
    B.position_at_end(loop)
    L.set(body.args[0], iv)
    for a, phi in zip(body.args[1:], phis):
        L.set(a, phi)
    L.block(Block(body.args, body.ops[:-1]))
    outs = [L.v(x) for x in body.ops[-1].operands]
    nxt = B.add(iv, step)
    latch = B.block
    _loop_metadata(L, op, B.branch(header))
    iv.add_incoming(nxt, latch)
    for phi, o in zip(phis, outs):
        phi.add_incoming(o, latch)
    B.position_at_end(exit_)
    for r, phi in zip(op.results, phis):
        L.set(r, phi)


def lower_if(L, op: Op):
    B = L.b
    cond = L.v(op.operands[0])
    then_bb = L.fn.append_basic_block("if.then")
    else_bb = L.fn.append_basic_block("if.else")
    merge = L.fn.append_basic_block("if.end")
    B.cbranch(cond, then_bb, else_bb)
    incoming = []
    for region, bb in zip(op.regions, (then_bb, else_bb)):
        B.position_at_end(bb)
        L.block(Block(region.args, region.ops[:-1]))
        incoming.append(([L.v(x) for x in region.ops[-1].operands], B.block))
        B.branch(merge)
    B.position_at_end(merge)
    for i, r in enumerate(op.results):
        phi = B.phi(llvm_type(r.type))
        for vals, bb in incoming:
            phi.add_incoming(vals[i], bb)
        L.set(r, phi)


def lower_while(L, op: Op):
    B = L.b
    init = [L.v(x) for x in op.operands]
    cond_region, body_region = op.regions
    pre = B.block
    header = L.fn.append_basic_block("while.cond")
    body_bb = L.fn.append_basic_block("while.body")
    exit_ = L.fn.append_basic_block("while.end")
    B.branch(header)
    B.position_at_end(header)
    phis = []
    for v in init:
        phi = B.phi(v.type)
        phi.add_incoming(v, pre)
        phis.append(phi)
    for a, phi in zip(cond_region.args, phis):
        L.set(a, phi)
    L.block(Block(cond_region.args, cond_region.ops[:-1]))
    c = L.v(cond_region.ops[-1].operands[0])
    B.cbranch(c, body_bb, exit_)
    B.position_at_end(body_bb)
    for a, phi in zip(body_region.args, phis):
        L.set(a, phi)
    L.block(Block(body_region.args, body_region.ops[:-1]))
    outs = [L.v(x) for x in body_region.ops[-1].operands]
    latch = B.block
    _loop_metadata(L, op, B.branch(header))
    for phi, o in zip(phis, outs):
        phi.add_incoming(o, latch)
    B.position_at_end(exit_)
    for r, phi in zip(op.results, phis):
        L.set(r, phi)


LOWERINGS = {"for": lower_for, "if": lower_if, "while": lower_while}
