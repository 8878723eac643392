"""Thread-block clusters (sm_90) for kernels: where a CTA sits in its cluster, the cluster barrier,
and distributed shared memory.

A kernel declared with ``@ty.kernel(cluster=(x, y, z))`` is launched in clusters of that shape
(``cuLaunchKernelEx`` with the cluster-dimension attribute; the PTX says ``.reqnctapercluster``).
The CTAs of one cluster run at the same time on one GPC, so they can wait for each other
(``cluster_sync``) and read and write each other's shared memory (``cluster_map``). A kernel
launched without clusters is one CTA per cluster: rank 0 of 1.
"""
from __future__ import annotations

from ..codegen.targets import family
from ..ir.types import PointerType, i32
from .builder import current_builder
from .lang import _AXES
from .proxy import RuntimeValue, as_value, emit, emit1


def _sm90(what: str):
    bld = current_builder()
    if family(bld.arch) < (9, 0):
        bld.error(f"{what} expects a kernel for sm_90 or sm_90a (thread-block clusters), but this kernel targets "
                  f"{bld.arch}", hint="declare the kernel with arch='sm_90a'")
    return bld


def _reg(what: str, reg: str, axis=None) -> RuntimeValue:
    bld = _sm90(what)
    if axis is not None:
        if axis not in _AXES:
            bld.error(f"{what} axis expects 0, 1, 2 or 'x', 'y', 'z', but got {axis!r}")
        reg = f"{reg}.{_AXES[axis]}"
    return emit1("special", (), reg=reg)


def cluster_ctarank() -> RuntimeValue:
    """%cluster_ctarank: this CTA's rank in its cluster, 0 .. cluster size - 1 (x fastest)."""
    return _reg("cluster_ctarank", "cluster.ctarank")


def cluster_nctarank() -> RuntimeValue:
    """%cluster_nctarank: the number of CTAs in a cluster (x * y * z of the cluster shape)."""
    return _reg("cluster_nctarank", "cluster.nctarank")


def cluster_block_idx(axis=0) -> RuntimeValue:
    """%cluster_ctaid: this CTA's position within its cluster along ``axis``."""
    return _reg("cluster_block_idx", "cluster.ctaid", axis)


def cluster_dim(axis=0) -> RuntimeValue:
    """%cluster_nctaid: the cluster's extent in CTAs along ``axis``."""
    return _reg("cluster_dim", "cluster.nctaid", axis)


def cluster_idx(axis=0) -> RuntimeValue:
    """%clusterid: this cluster's position in the grid along ``axis``."""
    return _reg("cluster_idx", "clusterid", axis)


def cluster_grid_dim(axis=0) -> RuntimeValue:
    """%nclusterid: the number of clusters in the grid along ``axis``."""
    return _reg("cluster_grid_dim", "nclusterid", axis)


def cluster_arrive() -> None:
    """``barrier.cluster.arrive.aligned`` (release): this thread arrives on the cluster barrier.
    Every thread of every CTA of the cluster arrives once per phase, whole warps at a time."""
    _sm90("cluster_arrive")
    emit("cluster_barrier", (), mode="arrive")


def cluster_wait() -> None:
    """``barrier.cluster.wait.aligned`` (acquire): wait until every thread of the cluster has arrived
    in the phase of this thread's last ``cluster_arrive``; then their writes before the arrive
    (shared memory of any CTA of the cluster included) are visible."""
    _sm90("cluster_wait")
    emit("cluster_barrier", (), mode="wait")


def cluster_sync() -> None:
    """``cluster_arrive()`` then ``cluster_wait()``: a barrier over every thread of the cluster."""
    cluster_arrive()
    cluster_wait()


def cluster_map(p, rank) -> RuntimeValue:
    """``mapa``: the generic pointer to the same shared-memory location in CTA ``rank`` of the cluster
    (distributed shared memory). Load, store and atomically update through it like any pointer;
    the other CTA must not have exited (a ``cluster_sync`` before either side exits) and its data
    is published by a ``cluster_sync`` (or an mbarrier) between the write and the read."""
    bld = _sm90("cluster_map")
    if not isinstance(p, RuntimeValue) or not isinstance(p.type, PointerType) or p.type.space != "shared":
        bld.error(f"cluster_map expects a shared-memory pointer (ty.shared / ty.dynamic_shared), but got {p!r}")
    r = as_value(rank, i32)
    if r.type != i32:
        bld.error(f"cluster_map rank expects an i32, but got {r.type}")
    return emit1("mapa", (p, r))


__all__ = ["cluster_ctarank", "cluster_nctarank", "cluster_block_idx", "cluster_dim", "cluster_idx",
           "cluster_grid_dim", "cluster_arrive", "cluster_wait", "cluster_sync", "cluster_map"]
