"""Lowerings of the warp-level matrix instructions to inline PTX: ``mma.sync`` (m16n8k16 and
m16n8k8, f16/bf16 -> f32), ``ldmatrix`` and ``stmatrix``. Registered in ``llvm.LOWER``.

All three are ``.sync.aligned``, hence ``convergent``. mma.sync reads only registers, so its
asm has no side effect (LLVM may drop an unused one); ldmatrix/stmatrix touch shared memory and
keep theirs.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.ops.matrix import MMA_SHAPES
from ..ir.values import Op
from .llvm_async import set_asm_results, shared_u32

I32 = ir.IntType(32)
F32 = ir.FloatType()


def mma_sync_template(shape: str, dtype: str, b_dtype: str | None = None) -> tuple[str, str]:
    """``mma.sync.aligned.{shape}.row.col.f32.{dtype}.{b_dtype}.f32 {d}, {a}, {b}, {c}``, c tied to d."""
    na, nb = MMA_SHAPES[shape]
    regs = [f"${i}" for i in range(8 + na + nb)]
    d, a, b, c = regs[:4], regs[4:4 + na], regs[4 + na:4 + na + nb], regs[4 + na + nb:]
    text = (f"mma.sync.aligned.{shape}.row.col.f32.{dtype}.{b_dtype or dtype}.f32 "
            f"{{{', '.join(d)}}}, {{{', '.join(a)}}}, {{{', '.join(b)}}}, {{{', '.join(c)}}};")
    return text, ",".join(["=f"] * 4 + ["r"] * (na + nb) + ["0", "1", "2", "3"])


def ldmatrix_template(num: int, trans: bool) -> tuple[str, str]:
    outs = ", ".join(f"${i}" for i in range(num))
    text = f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16 {{{outs}}}, [${num}];"
    return text, ",".join(["=r"] * num + ["r"])


def stmatrix_template(num: int, trans: bool) -> tuple[str, str]:
    ins = ", ".join(f"${1 + i}" for i in range(num))
    text = f"stmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16 [$0], {{{ins}}};"
    return text, ",".join(["r"] * (1 + num) + ["~{memory}"])


def lower_mma_sync(L, op: Op):
    shape = op.attr("shape", "m16n8k16")
    vals = [L.v(x) for x in op.operands]  # a, b, then c (tied to the outputs)
    text, cons = mma_sync_template(shape, op.attr("dtype"), op.attr("b_dtype"))
    r = L.asm(text, cons, vals, ret=ir.LiteralStructType([F32] * 4), side_effect=False, convergent=True)
    set_asm_results(L, op, r)


def lower_ldmatrix(L, op: Op):
    num = op.attr("num")
    text, cons = ldmatrix_template(num, bool(op.attr("trans")))
    ret = ir.LiteralStructType([I32] * num) if num > 1 else I32
    r = L.asm(text, cons, [shared_u32(L, op.operands[0])], ret=ret, convergent=True)
    set_asm_results(L, op, r)


def lower_stmatrix(L, op: Op):
    p, *words = op.operands
    text, cons = stmatrix_template(op.attr("num"), bool(op.attr("trans")))
    L.asm(text, cons, [shared_u32(L, p)] + [L.v(w) for w in words], convergent=True)


LOWER_MATRIX = {"mma_sync": lower_mma_sync, "ldmatrix": lower_ldmatrix, "stmatrix": lower_stmatrix}
