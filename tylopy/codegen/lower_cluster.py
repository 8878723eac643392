"""Lowerings of the thread-block cluster ops: ``barrier.cluster`` and ``mapa`` (inline PTX).

The barrier halves are ``.aligned`` (every thread of a warp executes them together), so the asm
is convergent; both order memory (``~{memory}``): arrive has release and wait acquire semantics
by default (PTX ISA, "barrier.cluster"). ``mapa.u64`` maps a generic address of this CTA's
shared memory to the generic address of the same offset in another CTA of the cluster.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.values import Op
from .llvm_types import llvm_type

I32, I64 = ir.IntType(32), ir.IntType(64)


def lower_cluster_barrier(L, op: Op):
    L.asm(f"barrier.cluster.{op.attr('mode')}.aligned;", "~{memory}", [], convergent=True)


def lower_mapa(L, op: Op):
    p, rank = (L.v(x) for x in op.operands)
    generic = L.b.ptrtoint(L.b.addrspacecast(p, ir.PointerType(addrspace=0)), I64)
    mapped = L.asm("mapa.u64 $0, $1, $2;", "=l,l,r", [generic, rank], ret=I64, side_effect=False)
    L.set(op.result, L.b.inttoptr(mapped, llvm_type(op.result.type)))


LOWERINGS = {"cluster_barrier": lower_cluster_barrier, "mapa": lower_mapa}
