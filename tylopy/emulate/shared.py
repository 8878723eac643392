"""One CTA's shared memory: bytes addressed by u32 offsets, and per-byte bookkeeping for the checks.

Shared memory starts filled with ``POISON`` bytes (0xFF: NaN as f16, bf16 or f32, -1 as an
integer); with race checks on, reading a byte that nothing wrote is a ``ProtocolError``.

Per byte it remembers:

* the last writer (a warp, or the mbarrier agent of a TMA copy: see ``sync.py``), its
  vector-clock epoch and the op (write-after-write races: two writes with nothing ordering
  them; read-after-write races: a read of bytes another warp or a copy wrote, with nothing
  ordering the write before it);
* per warp, the epoch of its last read and the op (write-after-read races: bytes overwritten,
  by a store or a copy, before the warp that read them released them, e.g. a producer
  refilling a stage the consumers have not freed);
* per warpgroup, the wgmma that last read the bytes: they count as being read from the moment
  the warpgroup issues it until a wgmma_wait covers its commit group. The wgmma completes for
  the whole warpgroup at once, so a write is ordered after it once it is ordered after the
  covering wait of any one of the 4 warps (FA3's single elected thread releasing a stage);
* asynchronous copies in flight: the destination bytes of a TMA load until it lands and of a
  cp.async until a cp_async_wait covers it (any access is a race), the source bytes of a TMA
  store until a bulk_wait covers it (any write is a race);
* for ordinary stores, the writing thread until that thread executes ``fence.proxy.async``: an
  async-proxy read (wgmma, TMA store) of such a byte is a missing-fence error.
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryAccessError, ProtocolError, where
from .memory import gather, scatter

READ_PENDING = np.int64(1) << np.int64(60)  # read epoch of bytes an in-flight wgmma still reads
POISON = 0xFF  # what shared memory holds before anything writes it


class SharedMemory:
    def __init__(self, size: int, names: list, check_races: bool, nwarps: int, owner=None):
        self.size = size
        n = max(16, -(-size // 16) * 16)
        self.buf = np.full(n, POISON, dtype=np.uint8)
        self.names = names
        self.check_races = check_races
        self.nwarps = nwarps
        self.owner = owner  # the CTA: names writers and explains races (diagnose.py)
        self.writer_warp = np.full(n, -1, dtype=np.int16)  # a warp, an mbarrier agent (>= nwarps), or -1: never
        self.writer_epoch = np.zeros(n, dtype=np.int64)
        self.writer_op = np.full(n, -1, dtype=np.int32)
        self.proxy_tid = np.full(n, -1, dtype=np.int32)  # generic writer not yet fenced for the async proxy
        self.dirty = 0
        self.read_epoch = None  # (nwarps, n), allocated at the first tracked read
        self.read_op = None
        self.nwg = nwarps // 4
        self.wg_epoch = None  # (nwg, 4, n): per warp of the reading warpgroup, its covering wait's epoch
        self.wg_inst = None  # (nwg, n): id of the wgmma instance that last read the byte, -1 none
        self.wg_op = None
        self.inflight_w = np.full(n, -1, dtype=np.int32)  # async copy still writing the byte (its uid)
        self.inflight_r = np.full(n, -1, dtype=np.int32)  # TMA store still reading the byte (its uid)
        self.copies_w: dict = {}  # uid -> copy record, for the copies marked in inflight_w
        self.copies_r: dict = {}
        self.multicast_op = None  # per byte: the TMA multicast of another CTA that writes it (-1 none), for hints
        self.ops: list = []
        self._op_ids: dict = {}

    # -- names for messages -------------------------------------------------------------------------
    def name(self, off: int) -> str:
        for lo, hi, nm in self.names:
            if lo <= off < hi:
                return f"{nm}+{off - lo}"
        return f"shared+{off}"

    def span(self, bi: np.ndarray, j: int) -> str:
        """The contiguous run of ``bi`` around position ``j``, named: ``smem0+4..7``."""
        b = int(bi[j])
        s = set(int(x) for x in bi)
        lo = hi = b
        while lo - 1 in s:
            lo -= 1
        while hi + 1 in s:
            hi += 1
        if lo == hi:
            return self.name(lo)
        first, last = self.name(lo), self.name(hi)
        return f"{first}..{last.rsplit('+', 1)[1]}" if first.split("+")[0] == last.split("+")[0] else f"{first}..{last}"

    def slot_name(self, off: int, size: int) -> str:
        """``smem2[1]``: the index of a ``size``-byte object in its allocation (mbarriers: stages)."""
        for lo, hi, nm in self.names:
            if lo <= off < hi and (off - lo) % size == 0:
                return f"{nm}[{(off - lo) // size}]"
        return self.name(off)

    def _op_index(self, op) -> int:
        k = self._op_ids.get(op)
        if k is None:
            k = self._op_ids[op] = len(self.ops)
            self.ops.append(op)
        return k

    def _who(self, idx: int) -> str:
        return self.owner.writer_text(idx) if self.owner is not None else f"warp {idx}"

    def _explain(self, kind: str, **facts) -> str:
        text = self.owner.explain(kind, **facts) if self.owner is not None else ""
        return f" Most likely at fault: {text}" if text else ""

    # -- plain accesses ---------------------------------------------------------------------------------
    def check(self, offs, nbytes, op, who, verb, lanes):
        bad = (offs.astype(np.int64) + nbytes > self.size)
        if bad.any():
            i = int(np.argmax(bad))
            raise MemoryAccessError(
                f"shared-memory {verb} out of bounds at {where(op)}: lane {int(lanes[i])} of {who.describe()} {verb}s "
                f"{nbytes} bytes at offset {int(offs[i])}, but the CTA has {self.size} bytes of shared memory")

    def load(self, offs, dtype, vec, op, who, lanes):
        nb = dtype.itemsize * vec
        self.check(offs, nb, op, who, "read", lanes)
        if self.check_races:
            bi = (offs.astype(np.int64)[:, None] + np.arange(nb, dtype=np.int64)).ravel()
            vc = who.cta.clock[who.wid]
            self.check_raw(bi, who.wid, vc, op, who)
            self.note_read(bi, who.wid, vc[who.wid], op)
        return gather(self.buf, offs, dtype, vec)

    def store(self, offs, values, dtype, op, who, lanes):
        """A store by the warp ``who`` from its lanes ``lanes`` (the bytes' writer: that warp, those threads)."""
        n, vec = values.shape
        nb = dtype.itemsize * vec
        self.check(offs, nb, op, who, "write", lanes)
        bi = (offs.astype(np.int64)[:, None] + np.arange(nb, dtype=np.int64))
        warp = who.wid
        self.note_write(bi.ravel(), warp, who.cta.clock[warp], op, who, np.repeat(who.tids[lanes], nb))
        scatter(self.buf, offs, values, dtype)

    # -- read tracking --------------------------------------------------------------------------------
    def _reads(self):
        if self.read_epoch is None:
            self.read_epoch = np.zeros((self.nwarps, len(self.buf)), dtype=np.int64)
            self.read_op = np.full((self.nwarps, len(self.buf)), -1, dtype=np.int32)

    def _check_inflight(self, bi, table, records, op, who, what: str, reader: int):
        ids = table[bi]
        hit = ids >= 0
        if not hit.any():
            return
        j = int(np.argmax(hit))
        rec = records[int(ids[j])]
        raise ProtocolError(f"shared-memory race at {where(op)}: {who.describe()} {what} {self.span(bi, j)}, "
                            f"{rec.conflict_text(reader)}")

    def check_raw(self, bi, warp: int, vc, op, who, what: str = "reads"):
        """A read of ``bi`` by ``warp`` (full clock ``vc``): every other write must be ordered before it,
        no copy may still be writing it, and something must have written it."""
        if self.copies_w:
            self._check_inflight(bi, self.inflight_w, self.copies_w, op, who, what, warp if warp >= 0 else who.wid)
        prev = self.writer_warp[bi]
        never = prev < 0
        if never.any():
            raise ProtocolError(
                f"read of uninitialized shared memory at {where(op)}: {who.describe()} {what} {self.span(bi[never], 0)}"
                f", which nothing wrote before (no store, cp.async or TMA copy landed there; if another warp writes "
                f"it later, a barrier between that write and this read is missing). The emulator fills shared "
                f"memory with 0x{POISON:02X} bytes (NaN as a float){self.multicast_hint(bi[never], who)}")
        other = prev != warp
        if not other.any():
            return
        racy = self.writer_epoch[bi][other] > vc[prev[other].astype(np.int64)]
        if racy.any():
            j = int(np.flatnonzero(other)[int(np.argmax(racy))])
            b = int(bi[j])
            src = int(prev[j])
            wop = self.ops[int(self.writer_op[b])]
            why = self._explain("raw", reader=warp if warp >= 0 else who.wid, writer=src,
                                epoch=int(self.writer_epoch[b]), op=op)
            raise ProtocolError(
                f"shared-memory race at {where(op)}: {who.describe()} {what} {self.span(bi, j)}, which {self._who(src)} "
                f"wrote at {where(wop)} with no barrier or mbarrier ordering that write before this read.{why}"
                f"{self.multicast_hint(bi[j:j + 1], who)}")

    def multicast_hint(self, bi, who) -> str:
        """Why bytes a multicast from another CTA fills can be read too early: the phase completed without them."""
        mop = None
        if self.multicast_op is not None and (self.multicast_op[bi] >= 0).any():
            mop = self.ops[int(self.multicast_op[bi][int(np.argmax(self.multicast_op[bi] >= 0))])]
        last = getattr(who, "last_mb_wait", None)
        if mop is None and last is not None:  # the phase this warp waited for had multicast bytes
            mop = next((o for o, _, _ in getattr(last[0], "last_delivered", ()) if o.attr("multicast", False)), None)
        if mop is None:
            return ""
        return (f". These bytes come from another CTA's TMA multicast at {where(mop)}: if the mbarrier phase this read "
                f"waited for completed without them, this CTA's expect_tx does not count the bytes the multicasts of "
                f"the other CTAs deliver into its stage (every CTA in the mask must expect the whole stage)")

    def note_read(self, bi, warp: int, epoch, op):
        self._reads()
        self.read_epoch[warp, bi] = epoch
        self.read_op[warp, bi] = self._op_index(op)

    def async_read_begin(self, bi, wg: int, inst_id: int, op):
        """Warpgroup ``wg``'s wgmma instance ``inst_id`` reads ``bi`` until a wait covers it."""
        if not self.check_races:
            return
        if self.wg_epoch is None:
            n = len(self.buf)
            self.wg_epoch = np.zeros((self.nwg, 4, n), dtype=np.int64)
            self.wg_inst = np.full((self.nwg, n), -1, dtype=np.int64)
            self.wg_op = np.full((self.nwg, n), -1, dtype=np.int32)
        self.wg_epoch[wg][:, bi] = READ_PENDING
        self.wg_inst[wg, bi] = inst_id
        self.wg_op[wg, bi] = self._op_index(op)

    def async_read_done(self, bi, wg: int, q: int, inst_id: int, epoch):
        """Warp ``q`` of ``wg`` passed a wait that covers instance ``inst_id``: it saw the reads complete."""
        if not self.check_races:
            return
        own = bi[self.wg_inst[wg, bi] == inst_id]
        self.wg_epoch[wg, q, own] = epoch

    def _check_war_wgmma(self, bi, vc, op, who):
        inst = self.wg_inst[:, bi]  # (nwg, nb)
        if not (inst >= 0).any():
            return
        clocks = vc[: 4 * self.nwg].reshape(self.nwg, 4, 1)
        ordered = (clocks >= self.wg_epoch[:, :, bi]).any(axis=1)
        bad = (inst >= 0) & ~ordered
        if bad.any():
            g, j = (int(x) for x in np.argwhere(bad)[0])
            b = int(bi[j])
            rop = self.ops[int(self.wg_op[g, b])]
            pending = (self.wg_epoch[g, :, b] >= READ_PENDING).all()
            state = ("no wgmma_wait has covered its commit group yet" if pending else
                     "this write is not ordered after any of that warpgroup's wgmma_waits covering it")
            why = self._explain("war", readers=list(range(4 * g, 4 * g + 4)), clock=vc, writer=who, wgmma=rop,
                                inst_uid=int(self.wg_inst[g, b]))
            raise ProtocolError(
                f"shared-memory race at {where(op)}: {who.describe()} overwrites {self.span(bi, j)}, which the wgmma at "
                f"{where(rop)} of warpgroup {g} reads; {state} (was the stage released before the wgmma finished, "
                f"or refilled before it was released?).{why}")

    def _check_war(self, bi, vc, op, who):
        re = self.read_epoch[:, bi]
        bad = re > vc[:self.nwarps, None]
        if not bad.any():
            return
        r, j = (int(x) for x in np.argwhere(bad)[0])
        b = int(bi[j])
        rop = self.ops[int(self.read_op[r, b])]
        why = self._explain("war", readers=[r], clock=vc, writer=who, read_epoch=int(re[r, j]))
        raise ProtocolError(
            f"shared-memory race at {where(op)}: {who.describe()} overwrites {self.span(bi, j)}, which warp {r} read at "
            f"{where(rop)} with no barrier or mbarrier ordering that read before this write (was the buffer "
            f"released before it was refilled?).{why}")

    # -- write tracking ---------------------------------------------------------------------------------
    def check_write(self, bi: np.ndarray, warp: int, vc: np.ndarray, op, who):
        """The race checks of a write of ``bi`` by ``warp`` (clock ``vc``), without recording it."""
        if self.copies_w:
            self._check_inflight(bi, self.inflight_w, self.copies_w, op, who, "writes", warp)
        if self.copies_r:
            self._check_inflight(bi, self.inflight_r, self.copies_r, op, who, "overwrites", warp)
        if self.read_epoch is not None:
            self._check_war(bi, vc, op, who)
        if self.wg_epoch is not None:
            self._check_war_wgmma(bi, vc, op, who)
        prev = self.writer_warp[bi]
        other = (prev >= 0) & (prev != warp)
        if other.any():
            pw = prev[other].astype(np.int64)
            racy = self.writer_epoch[bi][other] > vc[pw]
            if racy.any():
                j = int(np.flatnonzero(other)[int(np.argmax(racy))])
                b = int(bi[j])
                prev_op = self.ops[int(self.writer_op[b])]
                why = self._explain("raw", reader=warp, writer=int(prev[j]), epoch=int(self.writer_epoch[b]), op=op,
                                    clock=vc)
                raise ProtocolError(
                    f"shared-memory race at {where(op)}: {who.describe()} writes {self.span(bi, j)}, which "
                    f"{self._who(int(prev[j]))} wrote at {where(prev_op)} with no barrier or mbarrier ordering the "
                    f"two writes.{why}")

    def note_write(self, bi: np.ndarray, warp: int, vc: np.ndarray, op, who, tids=None, writer=None, epoch=None):
        """Race checks and bookkeeping for a write of the flat byte indices ``bi`` by ``warp``; the bytes'
        writer becomes ``writer`` at ``epoch`` (default: ``warp`` at its current epoch)."""
        if self.check_races:
            self.check_write(bi, warp, vc, op, who)
        self.writer_warp[bi] = warp if writer is None else writer
        self.writer_epoch[bi] = vc[warp] if epoch is None else epoch
        self.writer_op[bi] = self._op_index(op)
        if tids is None:
            self.proxy_tid[bi] = -1
        else:
            self.proxy_tid[bi] = tids
            self.dirty += 1

    # -- copies in flight -------------------------------------------------------------------------------
    def mark(self, bi: np.ndarray, rec, reading: bool = False):
        """Copy ``rec`` writes (or, ``reading``, reads) ``bi`` until ``unmark``."""
        table, records = (self.inflight_r, self.copies_r) if reading else (self.inflight_w, self.copies_w)
        table[bi] = rec.uid
        records[rec.uid] = rec

    def unmark(self, bi: np.ndarray, rec, reading: bool = False):
        table, records = (self.inflight_r, self.copies_r) if reading else (self.inflight_w, self.copies_w)
        own = bi[table[bi] == rec.uid]
        table[own] = -1
        if rec.uid in records and not (table[bi] == rec.uid).any() and rec.done_with(reading):
            del records[rec.uid]

    # -- the async proxy --------------------------------------------------------------------------------
    def fence_proxy(self, tids: np.ndarray):
        """fence.proxy.async by threads ``tids``: their earlier generic writes become async-visible."""
        if not self.dirty:
            return
        lo, hi = int(tids.min()), int(tids.max())
        if hi - lo + 1 == len(tids):
            hit = (self.proxy_tid >= lo) & (self.proxy_tid <= hi)
        else:
            hit = np.isin(self.proxy_tid, tids)
        self.proxy_tid[hit] = -1
        if not (self.proxy_tid >= 0).any():
            self.dirty = 0

    def check_async_read(self, bi: np.ndarray, op, who, what: str):
        """An async-proxy read (wgmma, TMA store) of bytes ``bi``: every generic write must be fenced."""
        if not self.dirty:
            return
        t = self.proxy_tid[bi]
        if (t >= 0).any():
            j = int(np.argmax(t >= 0))
            b = int(bi[j])
            wop = self.ops[int(self.writer_op[b])]
            raise ProtocolError(
                f"missing fence.proxy.async: {what} at {where(op)} ({who.describe()}) reads {self.name(b)}, written by "
                f"thread {int(t[j])} with an ordinary store at {where(wop)}; that thread must execute "
                f"fence_proxy_async() after its stores and before the barrier that publishes them")
