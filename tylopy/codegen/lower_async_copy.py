"""Lowerings of the asynchronous copies to inline PTX: ``cp.async`` with its commit groups
(sm_80+), TMA stores and reductions with their bulk groups (sm_90). Registered in ``llvm.LOWER``.

The copies themselves are ``sideeffect`` asm without a memory clobber (they only start a copy;
the ordering that matters is the wait's); commits and waits clobber memory, so LLVM keeps every
load and store on its side of them.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.values import Op
from .llvm_async import shared_u32

I32, I64 = ir.IntType(32), ir.IntType(64)
GLOBAL = 1


def cp_async_template(nbytes: int, cache: str, has_src_bytes: bool) -> tuple[str, str]:
    """``cp.async.{ca,cg}.shared.global [dst], [src], nbytes{, src_bytes};``: dst a 32-bit shared
    address, src a 64-bit global address, src_bytes a 32-bit register (zero fill past it)."""
    tail = ", $2" if has_src_bytes else ""
    return (f"cp.async.{cache}.shared.global [$0], [$1], {nbytes}{tail};",
            "r,l,r" if has_src_bytes else "r,l")


def tma_store_template(rank: int, reduce: str | None) -> tuple[str, str]:
    """Shared::cta -> global through a tensor map, completing on the bulk group."""
    coords = ", ".join(f"${2 + i}" for i in range(rank))
    head = (f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group" if reduce is None else
            f"cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.{reduce}.tile.bulk_group")
    return f"{head} [$0, {{{coords}}}], [$1];", ",".join(["l", "r"] + ["r"] * rank + ["~{memory}"])


def _global_u64(L, v):
    """A global (or generic) pointer as the 64-bit global address PTX's .global operand takes."""
    p = L.v(v)
    if v.type.space != "global":
        p = L.b.addrspacecast(p, ir.PointerType(addrspace=GLOBAL))
    return L.b.ptrtoint(p, I64)


def lower_cp_async(L, op: Op):
    dst, src, *rest = op.operands
    args = [shared_u32(L, dst), _global_u64(L, src)] + [L.v(x) for x in rest]
    L.asm(*cp_async_template(op.attr("nbytes"), op.attr("cache", "ca"), bool(rest)), args)


def lower_tma_store(L, op: Op):
    tmap, src, *coords = op.operands
    args = [L.b.ptrtoint(L.v(tmap), I64), shared_u32(L, src)] + [L.v(c) for c in coords]
    L.asm(*tma_store_template(op.attr("rank"), op.attr("reduce")), args)


def _fixed(text_of):
    def lower(L, op: Op):
        L.asm(text_of(op), "~{memory}", [])
    return lower


LOWER_ASYNC_COPY = {
    "cp_async": lower_cp_async,
    "cp_async_commit": _fixed(lambda op: "cp.async.commit_group;"),
    "cp_async_wait": _fixed(lambda op: f"cp.async.wait_group {op.attr('n')};"),
    "tma_store": lower_tma_store,
    "bulk_commit": _fixed(lambda op: "cp.async.bulk.commit_group;"),
    "bulk_wait": _fixed(lambda op: f"cp.async.bulk.wait_group{'.read' if op.attr('read', False) else ''} "
                                   f"{op.attr('n')};"),
}
