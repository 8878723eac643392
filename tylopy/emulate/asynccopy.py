"""Asynchronous copies in flight: TMA loads, cp.async and TMA stores complete after their issue.

A copy's data moves at a point between its issue and the wait that covers it, not when it is
issued. Without the launch option ``seed`` every copy moves at the latest point it can: a TMA
load when a warp waits on its mbarrier (or when nothing else can run), a cp.async at the
``cp_async_wait`` that covers its group, a TMA store at the ``bulk_wait`` that covers its group
(or when the CTA exits); with ``seed`` each copy also moves, with some probability, before each
scheduling step. So a missing wait reads stale (or never written, poisoned) bytes, and the race
checks report the access whatever the timing:

* TMA load (``cp.async.bulk.tensor``): its destination bytes are *in flight* from issue until
  they land; any access is a race. When they land, their writer is the agent of the copy's
  mbarrier at the epoch of the phase the copy completes (``sync.py``): only a warp that
  observed that phase may read them. The write itself is checked against earlier reads and
  writes with the issuing warp's clock at the issue (the copy follows its issue).
* cp.async: the destination bytes are in flight until a ``cp_async_wait`` of the issuing
  thread covers their group; then they count as written by that warp at the wait, so another
  warp may read them after a barrier that follows the wait.
* TMA store: the source bytes are read from shared memory when the copy moves (an earlier
  overwrite changes what lands in global memory) and count as being read until a
  ``bulk_wait`` of the issuing thread covers the group; writing them before is a race.
"""
from __future__ import annotations

import itertools

import numpy as np

from .errors import ProtocolError, where

LAND_PROBABILITY = 0.25  # with a seed: the chance a copy in flight moves before a scheduling step
_uids = itertools.count()


class Copy:
    """One asynchronous copy (one op executed by one warp)."""

    kind = "copy"

    def __init__(self, cta, w, op):
        self.cta, self.op, self.wid = cta, op, w.wid
        self.uid = next(_uids) & 0x3FFFFFFF
        self.clock = cta.clock[w.wid].copy()  # the issuing warp's clock at the issue
        self.landed = False

    def describe(self) -> str:
        return f"the {self.kind} at {where(self.op)} (issued by warp {self.wid} of CTA {self.cta.coord})"

    def done_with(self, reading: bool) -> bool:
        return True


class TmaLoad(Copy):
    kind = "TMA load"

    def __init__(self, cta, w, op, mb, bi, data):
        super().__init__(cta, w, op)
        self.mb, self.bi, self.data = mb, bi, data
        self.seen = dict(w.mb_seen)  # what the issuing warp had waited for (for messages)

    def conflict_text(self, reader: int) -> str:
        text = (f"which the TMA load at {where(self.op)} (issued by warp {self.wid}, completing on "
                f"{self.mb.label()}, phase {self.mb.phase}) has not finished writing: nothing orders this access "
                f"after that phase of {self.mb.label()}.")
        why = self.cta.explain("unseen_phase", reader=reader, mb=self.mb, phase=self.mb.phase)
        return text + (f" Most likely at fault: {why}" if why else "")

    def land(self):
        cta, smem, mb = self.cta, self.cta.smem, self.mb
        self.landed = True
        smem.unmark(self.bi, self)
        smem.note_write(self.bi, self.wid, self.clock, self.op, self, None, writer=mb.agent, epoch=mb.copy_epoch())
        smem.buf[self.bi] = self.data
        mb.complete_tx(self.op, len(self.data), self.wid)


class CpAsync(Copy):
    kind = "cp.async"

    def __init__(self, cta, w, op, lanes, bi, data, group):
        super().__init__(cta, w, op)
        self.lanes, self.bi, self.data, self.group = lanes, bi, data, group  # bi, data: (len(lanes), nbytes)
        self.open = np.ones(len(lanes), dtype=np.bool_)  # lanes whose group no wait has covered yet

    def conflict_text(self, reader: int) -> str:
        lane = int(self.lanes[int(np.argmax(self.open))])
        tid = self.wid * 32 + lane
        after = "" if reader == self.wid else " (then a barrier after that wait orders the bytes before other warps' accesses)"
        return (f"which the cp.async at {where(self.op)} (thread {tid}, warp {self.wid}) may still be writing: no "
                f"cp_async_wait of that thread has covered its commit group{after}.")

    def land(self):
        self.landed = True
        self.cta.smem.buf[self.bi.ravel()] = self.data.ravel()

    def cover(self, w, covered: np.ndarray):
        """Lanes ``covered`` of the issuing warp passed a wait covering their group: the bytes are theirs now."""
        if not self.landed:
            self.land()
        smem = self.cta.smem
        bi = self.bi[covered].ravel()
        smem.unmark(bi, self)
        smem.writer_warp[bi] = w.wid
        smem.writer_epoch[bi] = self.cta.vc[w.wid, w.wid]
        smem.writer_op[bi] = smem._op_index(self.op)
        smem.proxy_tid[bi] = -1
        self.open &= ~covered

    def done_with(self, reading: bool) -> bool:
        return not self.open.any()


class TmaStore(Copy):
    kind = "TMA store"

    def __init__(self, cta, w, op, info, coords, bi, group, reduce):
        super().__init__(cta, w, op)
        self.info, self.coords, self.bi, self.group, self.reduce = info, coords, bi, group, reduce
        self.read_done = False

    def conflict_text(self, reader: int) -> str:
        return (f"which the TMA store at {where(self.op)} (issued by warp {self.wid}) may still be reading: no "
                f"bulk_wait(n, read=True) of the issuing thread has covered its bulk group yet (and a barrier after "
                f"that wait must order it before writes by other warps).")

    def land(self):
        self.landed = True
        data = self.cta.smem.buf[self.bi].reshape(self.info.nelem, self.info.es)
        self.info.write(self.coords, data, self.reduce, self.op, self)

    def cover(self, w):
        if not self.landed:
            self.land()
        smem = self.cta.smem
        self.read_done = True
        smem.unmark(self.bi, self, reading=True)
        if smem.check_races:
            smem.note_read(self.bi, w.wid, self.cta.vc[w.wid, w.wid], self.op)


class AsyncCopies:
    """The copies of one CTA that have been issued and not yet landed or waited for."""

    def __init__(self, cta):
        self.cta = cta
        self.pending: list[Copy] = []  # not landed yet, in issue order
        self.cp_open: dict[int, list[CpAsync]] = {}  # warp -> cp.async copies with lanes not yet covered
        self.stores: dict[int, list[TmaStore]] = {}  # warp -> TMA stores not yet covered

    def issue(self, rec: Copy):
        self.pending.append(rec)
        if isinstance(rec, CpAsync):
            self.cp_open.setdefault(rec.wid, []).append(rec)
        elif isinstance(rec, TmaStore):
            self.stores.setdefault(rec.wid, []).append(rec)

    def _land(self, recs):
        for rec in recs:
            if not rec.landed:
                rec.land()
        self.pending = [r for r in self.pending if not r.landed]

    def land_for(self, mb):
        """A warp waits on ``mb``: every TMA load that completes on it lands now (the latest point)."""
        if self.pending:
            self._land([r for r in self.pending if isinstance(r, TmaLoad) and r.mb is mb])

    def land_some(self, rng):
        self._land([r for r in self.pending if rng.random() < LAND_PROBABILITY])

    def land_all(self):
        self._land(list(self.pending))

    def cp_wait(self, w, n: int, lanes: np.ndarray):
        """cp_async_wait(n) by the active ``lanes`` of ``w``: groups older than the n newest are complete."""
        recs = self.cp_open.get(w.wid)
        if not recs:
            return
        active = np.zeros(32, dtype=np.bool_)
        active[lanes] = True
        limit = w.cp_open - n
        keep = []
        for rec in recs:
            covered = rec.open & active[rec.lanes] & (rec.group < limit[rec.lanes])
            if covered.any():
                rec.cover(w, covered)
            if rec.open.any():
                keep.append(rec)
        self.cp_open[w.wid] = keep
        self.pending = [r for r in self.pending if not r.landed]

    def bulk_wait(self, w, n: int, lanes: np.ndarray):
        recs = self.stores.get(w.wid)
        if not recs:
            return
        limit = w.bulk_open - n
        keep = []
        for rec in recs:
            lane = int(rec.group[0])
            if rec.group[1] < limit[lane] and lane in set(lanes.tolist()):
                rec.cover(w)
            else:
                keep.append(rec)
        self.stores[w.wid] = keep
        self.pending = [r for r in self.pending if not r.landed]

    def at_exit(self):
        """The CTA ends: stores land (their results count), but copies still using shared memory are bugs."""
        loads = [r for r in self.pending if isinstance(r, TmaLoad)]
        stores = [r for recs in self.stores.values() for r in recs]
        self.land_all()
        if stores:
            rec = stores[0]
            raise ProtocolError(
                f"CTA {self.cta.coord} exits while {rec.describe()} may still read its shared memory: no "
                f"bulk_wait(n, read=True) of the issuing thread covered its bulk group (the shared memory is given "
                f"to the next CTA when this one exits)")
        if loads:
            rec = loads[0]
            raise ProtocolError(
                f"CTA {self.cta.coord} exits while {rec.describe()} is still writing its shared memory: no warp "
                f"waited on {rec.mb.label()} for the phase the copy completes (the shared memory is given to the "
                f"next CTA when this one exits)")
