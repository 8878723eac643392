"""Thread-block clusters in the emulator: the CTAs of one cluster run interleaved (``run_together``),
share the cluster barrier, and reach each other's shared memory through ``mapa`` addresses.

Cluster barrier (PTX ISA "barrier.cluster"): a phase completes when every thread of every CTA of
the cluster has arrived (``barrier.cluster.arrive``); ``barrier.cluster.wait`` blocks until the
phase of this thread's last arrive has completed. Arrive has release, wait acquire semantics: a
waiting warp acquires the clocks every warp of its CTA released into the phase (the CTA's
shared-memory race checks see the cluster barrier as a barrier). Arriving twice without a wait,
or waiting without an arrive, is a ``ProtocolError``.

Distributed shared memory: ``mapa`` gives ``DSMEM_WINDOW + (rank << 32) + offset``; loads and
stores at such generic addresses read and write CTA ``rank``'s shared memory (bounds checked;
not race checked), and fail once that CTA has exited.
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryAccessError, ProtocolError, where
from .sync import Wait, warps_text
from .values import SHARED_WINDOW

DSMEM_WINDOW = SHARED_WINDOW + (1 << 32)  # + (rank << 32): the shared memory of CTA ``rank`` of the cluster
MAX_RANKS = 16


class Cluster:
    def __init__(self, dims: tuple, first: tuple, grid: tuple):
        self.dims = dims
        self.size = dims[0] * dims[1] * dims[2]
        self.first = first  # the block index of rank 0
        self.grid = grid
        self.ctas: list = []  # by rank
        self.generation = 0
        self.arrived = 0
        self.arrivers: list = []  # (cta rank, warp) of the phase in progress
        self.acc: list = []  # per rank: the clock its warps released into the phase in progress
        self.done: dict = {}  # generation -> per-rank clocks of that completed phase

    def coords(self):
        """The block indices of the cluster's CTAs, by rank (x fastest)."""
        dx, dy, dz = self.dims
        fx, fy, fz = self.first
        return [(fx + x, fy + y, fz + z) for z in range(dz) for y in range(dy) for x in range(dx)]

    def add(self, cta) -> int:
        self.ctas.append(cta)
        self.acc.append(cta.new_clock())
        return len(self.ctas) - 1

    def specials(self, coord) -> dict:
        """The cluster special registers of the CTA at ``coord``."""
        local = tuple(c % d for c, d in zip(coord, self.dims))
        return {"cluster.ctarank": local[0] + self.dims[0] * (local[1] + self.dims[1] * local[2]),
                "cluster.nctarank": self.size,
                **{f"cluster.ctaid.{a}": local[i] for i, a in enumerate("xyz")},
                **{f"cluster.nctaid.{a}": self.dims[i] for i, a in enumerate("xyz")},
                **{f"clusterid.{a}": coord[i] // self.dims[i] for i, a in enumerate("xyz")},
                **{f"nclusterid.{a}": self.grid[i] // self.dims[i] for i, a in enumerate("xyz")}}

    def threads(self) -> int:
        return sum(c.threads for c in self.ctas)

    # -- the barrier ----------------------------------------------------------------------------------
    def arrive(self, w, op) -> None:
        if w.cluster_gen is not None:
            raise ProtocolError(f"barrier.cluster.arrive at {where(op)}: {w.describe()} arrives again before waiting "
                                f"for the phase it arrived in (each arrive needs a barrier.cluster.wait before the "
                                f"next)")
        cta = w.cta
        cta.release(w.wid, self.acc[cta.rank])
        w.cluster_gen = self.generation
        w.cluster_arrive_gens.append(self.generation)
        self.arrived += w.nactive
        self.arrivers.append((cta.rank, w.wid))
        if self.arrived >= self.threads():
            self.done[self.generation] = [a.copy() for a in self.acc]
            self.done.pop(self.generation - 2, None)
            for a in self.acc:
                a[:] = 0
            self.generation += 1
            self.arrived, self.arrivers = 0, []

    def wait(self, w, op):
        gen = w.cluster_gen
        if gen is None:
            raise ProtocolError(f"barrier.cluster.wait at {where(op)}: {w.describe()} waits without a "
                                "barrier.cluster.arrive before it (ty.cluster_sync does both)")
        if self.generation <= gen:
            yield Wait(lambda: self.generation > gen, op, lambda: self.describe(), self)
        w.cta.acquire(w.wid, self.done[gen][w.cta.rank])
        w.cluster_gen = None
        w.cluster_waited = max(w.cluster_waited, gen)

    def describe(self) -> str:
        by_rank: dict = {}
        for rank, wid in self.arrivers:
            by_rank.setdefault(rank, []).append(wid)
        who = "; ".join(f"CTA rank {r} ({self.ctas[r].coord}) warps {warps_text(ws)}" for r, ws in sorted(by_rank.items()))
        gone = [f"{r} {c.coord}" for r, c in enumerate(self.ctas) if c.exited()]
        tail = (f"; CTA rank {', '.join(gone)} exited without arriving (every thread of every CTA of the cluster "
                "arrives in each phase)" if gone and self.arrived else "")
        return (f"cluster barrier of the cluster at {self.first} ({self.size} CTAs): phase {self.generation} has "
                f"{self.arrived} of {self.threads()} threads arrived ({who or 'none'}){tail}")

    # -- distributed shared memory --------------------------------------------------------------------
    def target(self, w, op, rank: int, verb: str):
        if not 0 <= rank < self.size:
            raise MemoryAccessError(f"distributed shared-memory {verb} at {where(op)} by {w.describe()}: the address "
                                    f"names CTA rank {rank}, but the cluster has {self.size} CTAs")
        cta = self.ctas[rank]
        if cta is not w.cta:
            self.touch(w, rank, op, f"{verb}s")
        if cta.exited():
            raise ProtocolError(f"distributed shared-memory {verb} at {where(op)} by {w.describe()}: CTA rank {rank} "
                                f"{cta.coord} of the cluster has exited, and its shared memory with it (a "
                                "ty.cluster_sync before either side exits keeps it alive)")
        return cta


    def touch(self, w, rank: int, op, verb: str) -> None:
        """Warp ``w`` of another CTA uses CTA ``rank``'s shared memory (``verb`` says how), now."""
        self.ctas[rank].remote_touches[(w.cta.rank, w.wid)] = (op, len(w.cluster_arrive_gens), verb)

    def on_exit(self, cta) -> None:
        """The last warp of ``cta`` exited: no other CTA may use its shared memory from now on, which a
        cluster barrier after each remote use (completed before this CTA's warps left) guarantees."""
        for (rank, wid), (op, arrivals, verb) in sorted(cta.remote_touches.items()):
            peer = self.ctas[rank].warps[wid]
            later = peer.cluster_arrive_gens[arrivals:]
            if later and all(w.cluster_waited >= later[0] for w in cta.warps):
                continue
            raise ProtocolError(
                f"CTA rank {cta.rank} {cta.coord} of the cluster exits while CTA rank {rank} may still use its shared "
                f"memory: warp {wid} of that CTA {verb} it at {where(op)}, and no cluster barrier that both CTAs "
                f"passed after that use orders it before this exit (the shared memory goes with the CTA; end the "
                f"kernel with ty.cluster_sync() in every warp of every CTA, after the last remote access)")


def is_remote(addrs: np.ndarray) -> np.ndarray:
    base = np.uint64(DSMEM_WINDOW)
    return (addrs >= base) & (addrs < base + np.uint64(MAX_RANKS << 32))


def remote_parts(addrs: np.ndarray):
    """(rank, offset) arrays of distributed shared-memory addresses."""
    rel = addrs - np.uint64(DSMEM_WINDOW)
    return (rel >> np.uint64(32)).astype(np.int64), (rel & np.uint64(0xFFFFFFFF)).astype(np.int64)
