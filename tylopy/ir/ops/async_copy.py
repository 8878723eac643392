"""Type rules of asynchronous copies: ``cp.async`` (global -> shared, Ampere+) with its commit
groups, and TMA stores and reductions (shared -> global, Hopper) with their bulk groups.

``cp_async`` operands (dst: shared pointer, src: global pointer[, src_bytes: i32]); attributes
``nbytes`` (4, 8 or 16) and ``cache`` ("ca", or "cg" for 16 bytes). With ``src_bytes`` < nbytes
the rest of the destination is zero-filled. ``cp_async_wait`` waits until at most ``n`` of the
most recent groups are pending. ``tma_store`` operands (tensormap, src: shared pointer,
coordinates...), attributes ``rank`` and ``reduce`` (None, "add", "min", "max"); ``bulk_wait``
waits until at most ``n`` bulk groups are pending (``read``: only until their shared-memory
reads are done). PTX ISA: "cp.async", "cp.async.wait_group", "cp.async.bulk.tensor",
"cp.reduce.async.bulk.tensor", "cp.async.bulk.wait_group".
"""
from __future__ import annotations

from ..types import PointerType, TensorMapType, i32
from .base import expect


def _cp_async(ts, attrs):
    expect(len(ts) in (2, 3), f"cp_async expects (dst, src[, src_bytes]), but got {len(ts)} operands")
    dst, src = ts[0], ts[1]
    expect(isinstance(dst, PointerType) and dst.space == "shared", f"cp_async destination expects shared memory, "
                                                                   f"but got {dst}")
    expect(isinstance(src, PointerType) and src.space in ("global", "generic"),
           f"cp_async source expects global memory, but got {src}")
    n = attrs.get("nbytes")
    expect(n in (4, 8, 16), f"cp_async nbytes expects 4, 8 or 16, but got {n!r}")
    cache = attrs.get("cache", "ca")
    expect(cache in ("ca", "cg"), f"cp_async cache expects 'ca' or 'cg', but got {cache!r}")
    expect(cache == "ca" or n == 16, f"cp_async cache='cg' expects nbytes=16, but got {n}")
    if len(ts) == 3:
        expect(ts[2] == i32, f"cp_async src_bytes expects i32, but got {ts[2]}")
    return ()


def _group_wait(what):
    def rule(ts, attrs):
        expect(not ts, f"{what} takes no operands")
        expect(isinstance(attrs.get("read", False), bool), f"{what} read expects a bool, but got {attrs.get('read')!r}")
        n = attrs.get("n")
        expect(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 63,
               f"{what} n expects a compile-time int in 0..63, but got {n!r}")
        return ()
    return rule


def _tma_store(ts, attrs):
    rank = attrs.get("rank")
    expect(isinstance(rank, int) and 1 <= rank <= 5, f"tma_store rank expects 1..5, but got {rank!r}")
    expect(len(ts) == 2 + rank, f"tma_store expects (tensormap, src, {rank} coordinates), but got {len(ts)} operands")
    expect(isinstance(ts[0], TensorMapType), f"tma_store expects a tensormap, but got {ts[0]}")
    expect(isinstance(ts[1], PointerType) and ts[1].space == "shared",
           f"tma_store source expects shared memory, but got {ts[1]}")
    for t in ts[2:]:
        expect(t == i32, f"tma_store coordinates expect i32, but got {t}")
    red = attrs.get("reduce")
    expect(red in (None, "add", "min", "max"), f"tma_store reduce expects None, 'add', 'min' or 'max', but got {red!r}")
    return ()


RULES = {
    "cp_async": _cp_async, "cp_async_commit": lambda ts, a: (), "cp_async_wait": _group_wait("cp_async_wait"),
    "tma_store": _tma_store, "bulk_commit": lambda ts, a: (), "bulk_wait": _group_wait("bulk_wait"),
}
SIDE_EFFECTS = frozenset(RULES)
