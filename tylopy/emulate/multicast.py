"""Cross-CTA mbarrier traffic in a cluster: remote arrives (``mbarrier_arrive(bar, cta=r)``) and TMA
multicast (``tma_load(..., multicast=mask)``), with the checks of their protocol.

Ordering across CTAs: each CTA has its own vector clocks (``sync.py``), so a remote arrive by warp
w of CTA a on a barrier of CTA b releases w's clock (in a's clock space) into the barrier's
``remote_acc[a]``; a warp of b that waits on that phase keeps it in ``remote_seen[a]``: what it
knows of CTA a's warps. A multicast into CTA a's shared memory is checked with the issuing warp's
``remote_seen[a]``: every read of the bytes by a's warps (loads, wgmmas) and the copy that wrote
them last must be ordered before it, which is what a consumer's remote release of the stage does.

Rules (PTX ISA "mbarrier", "cp.async.bulk.tensor", docs/hopper.md):

* the barrier at the same offset in the target CTA must be initialized and its initialization
  published to the cluster (``fence_mbarrier_init`` then a ``cluster_sync`` before the first
  remote use);
* each CTA in a multicast's mask receives the whole box at ``dst`` and has its bytes completed on
  its own barrier at ``bar``'s offset, so each must announce them (``expect_tx``) itself;
* a CTA must not exit while another may still touch its shared memory (``cluster.py``).
"""
from __future__ import annotations

import numpy as np

from .asynccopy import TmaLoad
from .compiled import handler
from .errors import ProtocolError, where
from .sync import mbarrier_lookup


def remote_barrier(target, w, op, addr: int, what: str):
    """The mbarrier at ``addr`` in CTA ``target`` of ``w``'s cluster, checked as a remote use."""
    mb = target.mbars.get(addr)
    if mb is None:
        raise ProtocolError(
            f"{what} at {where(op)} by {w.describe()} (CTA rank {w.cta.rank}) uses the mbarrier at "
            f"{target.smem.slot_name(addr, 8)} of CTA rank {target.rank} {target.coord}, which no thread of that CTA "
            f"initialized (every CTA of the cluster initializes its barriers at the same offsets)")
    if w.cluster_waited < mb.init_cluster_gen:
        raise ProtocolError(
            f"{what} at {where(op)} by {w.describe()} (CTA rank {w.cta.rank}) uses {mb.label()} of CTA rank "
            f"{target.rank} before its initialization is visible to the cluster: it was initialized at "
            f"{where(mb.init_op)}, and no cluster barrier after it (fence_mbarrier_init(), then ty.cluster_sync() in "
            f"every CTA) orders it before this use")
    return mb


def absorb(w, mb, parity: int):
    """``w`` observed the phase of ``mb`` with ``parity``: it learns what remote arrivers released."""
    for rank, clock in mb.remote_done[parity].items():
        seen = w.remote_seen.get(rank)
        if seen is None:
            w.remote_seen[rank] = clock.copy()
        else:
            np.maximum(seen, clock, out=seen)


def check_remote_write(target, w, op, bi: np.ndarray):
    """A multicast by ``w`` writes bytes ``bi`` of CTA ``target``: nothing of ``target`` may still use them."""
    smem = target.smem
    vc = w.remote_seen.get(target.rank)
    if vc is None:
        vc = target.new_clock()
    head = (f"shared-memory race across the cluster at {where(op)}: the TMA multicast of {w.describe()} "
            f"(CTA rank {w.cta.rank}) overwrites")
    tail = (f"; no mbarrier arrive of that CTA on a barrier of CTA rank {w.cta.rank} that this warp waited on orders it "
            f"before this copy (every CTA a multicast writes to must release the stage to the issuing producer: "
            f"mbarrier_arrive(empty, cta=rank) by its consumers, and the producer waits for all of them)")
    busy = smem.inflight_w[bi] >= 0
    if busy.any():
        j = int(np.argmax(busy))
        rec = smem.copies_w[int(smem.inflight_w[bi][j])]
        raise ProtocolError(f"{head} {smem.span(bi, j)} of CTA rank {target.rank} while {rec.describe()} is still "
                            f"writing it{tail}")
    if smem.read_epoch is not None:
        bad = smem.read_epoch[:, bi] > vc[:smem.nwarps, None]
        if bad.any():
            r, j = (int(x) for x in np.argwhere(bad)[0])
            rop = smem.ops[int(smem.read_op[r, int(bi[j])])]
            raise ProtocolError(f"{head} {smem.span(bi, j)} of CTA rank {target.rank}, which warp {r} of that CTA read "
                                f"at {where(rop)}{tail}")
    if smem.wg_epoch is not None:
        inst = smem.wg_inst[:, bi]
        clocks = vc[: 4 * smem.nwg].reshape(smem.nwg, 4, 1)
        bad = (inst >= 0) & ~(clocks >= smem.wg_epoch[:, :, bi]).any(axis=1)
        if bad.any():
            g, j = (int(x) for x in np.argwhere(bad)[0])
            rop = smem.ops[int(smem.wg_op[g, int(bi[j])])]
            raise ProtocolError(f"{head} {smem.span(bi, j)} of CTA rank {target.rank}, which the wgmma at {where(rop)} "
                                f"of warpgroup {g} of that CTA reads{tail}")
    prev = smem.writer_warp[bi]
    seen = prev >= 0
    if seen.any():
        racy = seen & (smem.writer_epoch[bi] > vc[np.maximum(prev, 0).astype(np.int64)])
        if racy.any():
            j = int(np.argmax(racy))
            wop = smem.ops[int(smem.writer_op[int(bi[j])])]
            raise ProtocolError(f"{head} {smem.span(bi, j)} of CTA rank {target.rank}, which "
                                f"{target.writer_text(int(prev[j]))} of that CTA wrote at {where(wop)}{tail}")


class RemoteTmaLoad(TmaLoad):
    """The part of a multicast that lands in another CTA of the cluster (checked at the issue)."""

    kind = "TMA multicast"

    def __init__(self, target, w, op, mb, bi, data):
        super().__init__(target, w, op, mb, bi, data)
        self.issuer = w.cta

    def describe(self) -> str:
        return (f"the TMA multicast at {where(self.op)} (issued by warp {self.wid} of CTA rank {self.issuer.rank} "
                f"{self.issuer.coord} into CTA rank {self.cta.rank})")

    def land(self):
        smem, mb = self.cta.smem, self.mb
        self.landed = True
        smem.unmark(self.bi, self)
        smem.writer_warp[self.bi] = mb.agent
        smem.writer_epoch[self.bi] = mb.copy_epoch()
        smem.writer_op[self.bi] = smem._op_index(self.op)
        smem.proxy_tid[self.bi] = -1
        smem.buf[self.bi] = self.data
        mb.complete_tx(self.op, len(self.data), self.wid)


def multicast_ranks(w, op, mask: int) -> list:
    size = w.cta.cluster.size
    ranks = [r for r in range(16) if mask >> r & 1]
    if not ranks or ranks[-1] >= size:
        raise ProtocolError(f"tma_load at {where(op)} ({w.describe()}): the multicast mask 0x{mask:04X} names "
                            f"CTA rank(s) {ranks or 'none'}, but the cluster has {size} CTA(s) (ranks 0..{size - 1})")
    return ranks


def issue_remote(w, op, target, dst: int, bar: int, info, data):
    """The multicast's copy into CTA ``target`` (not the issuing one) of the cluster."""
    target.cluster.touch(w, target.rank, op, "multicasts into")
    mb = remote_barrier(target, w, op, bar, "TMA multicast")
    target.smem.check(np.array([dst]), info.box_bytes, op, w, "write", np.array([0]))
    bi = info.smem_bytes(dst)
    if target.smem.check_races:
        check_remote_write(target, w, op, bi)
    if target.smem.multicast_op is None:
        target.smem.multicast_op = np.full(len(target.smem.buf), -1, dtype=np.int32)
    target.smem.multicast_op[bi] = target.smem._op_index(op)
    rec = RemoteTmaLoad(target, w, op, mb, bi, data.ravel())
    target.smem.mark(bi, rec)
    target.copies.issue(rec)


def _barrier_of(w, op, addr: int, rank: int, what: str):
    """The mbarrier at ``addr`` of CTA ``rank`` (this CTA's own through the local rules)."""
    target = w.cta.cluster.target(w, op, rank, "mbarrier arrive")
    if target is w.cta:
        return target, mbarrier_lookup(target, w, op, addr)
    target.cluster.touch(w, rank, op, "arrives on an mbarrier of")
    return target, remote_barrier(target, w, op, addr, what)


@handler("mbarrier_arrive_cluster")
def make_mbarrier_arrive_cluster(prog, op):
    b, r = (prog.slot(v) for v in op.operands)

    def run(w):
        lanes = np.flatnonzero(w.mask)
        keys = [(int(w.env[b][i]), int(w.env[r][i])) for i in lanes]
        for addr, rank in sorted(set(keys)):
            target, mb = _barrier_of(w, op, addr, rank, "mbarrier_arrive(cta=...)")
            mb.arrive(target, w, op, keys.count((addr, rank)))
    return False, run


@handler("mbarrier_arrive_expect_tx_cluster")
def make_mbarrier_arrive_expect_tx_cluster(prog, op):
    b, nb, r = (prog.slot(v) for v in op.operands)

    def run(w):
        for lane in np.flatnonzero(w.mask):
            target, mb = _barrier_of(w, op, int(w.env[b][lane]), int(w.env[r][lane]),
                                     "mbarrier_arrive_expect_tx(cta=...)")
            mb.arrive(target, w, op, 1, int(w.env[nb][lane]))
    return False, run
