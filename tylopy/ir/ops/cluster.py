"""Type rules of thread-block cluster ops (sm_90): the cluster barrier and ``mapa``.

``cluster_barrier`` {mode: "arrive" | "wait"}: ``barrier.cluster.arrive.aligned`` (release) /
``barrier.cluster.wait.aligned`` (acquire), no operands. ``mapa`` (ptr<T, shared>, rank i32) ->
ptr<T, generic>: the address of the same shared-memory location in CTA ``rank`` of the cluster
(distributed shared memory), usable by ordinary generic loads, stores and atomics.
"""
from __future__ import annotations

from ..types import PointerType, i32, u32
from .base import expect


def _cluster_barrier(ts, attrs):
    expect(not ts, "cluster_barrier takes no operands")
    expect(attrs.get("mode") in ("arrive", "wait"), f"cluster_barrier mode expects 'arrive' or 'wait', but got "
                                                     f"{attrs.get('mode')!r}")
    return ()


def _mapa(ts, attrs):
    expect(len(ts) == 2, "mapa expects (shared pointer, rank)")
    p = ts[0]
    expect(isinstance(p, PointerType) and p.space == "shared", f"mapa expects a shared-memory pointer, but got {p}")
    expect(ts[1] in (i32, u32), f"mapa rank expects i32, but got {ts[1]}")
    return (PointerType(p.pointee, "generic"),)


RULES = {"cluster_barrier": _cluster_barrier, "mapa": _mapa}
SIDE_EFFECTS = frozenset({"cluster_barrier"})
