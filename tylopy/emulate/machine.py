"""Warps, CTAs and the scheduler.

A warp is a Python generator over the compiled kernel body: it runs its 32 lanes in lockstep
(numpy arrays, a lane mask for divergence) until it reaches an instruction that must wait
(bar.sync, an mbarrier wait, setmaxnreg.inc, a wgmma that not all 4 warps of its warpgroup
have issued yet); then it yields a ``Wait``. The scheduler of a CTA resumes every warp whose
wait is over: round robin, or, with the launch option ``seed``, in a random order each round
(and asynchronous copies then land at random points before the waits that cover them; see
``asynccopy.py``). When every live warp is waiting and none can go on (after landing every copy
still in flight), the kernel would hang on a GPU: the emulator raises a ``ProtocolError`` that
names each waiting warp, the source line, the barrier or mbarrier (and its phase and missing
arrivals or bytes), and which warps have exited.

CTAs cannot synchronize with each other, so they run one after another (in a random order
with ``seed``).
"""
from __future__ import annotations

import itertools

import numpy as np

from . import diagnose
from .asynccopy import AsyncCopies
from .cluster import Cluster
from .deadlock import deadlock_error
from .errors import ProtocolError, where
from .memory import shared_layout
from .compiled import run_block
from .shared import SharedMemory
from .sync import AGENTS, MBarrier, NamedBarrier, RegisterPool, short_where, warps_text
from .values import LANES, WARP


class Warp:
    """One warp's registers (``env``: a list of lane arrays, by slot), lane mask and protocol state."""

    def __init__(self, cta: "CTA", wid: int, template: list):
        self.cta, self.wid = cta, wid
        self.env = list(template)
        self.tids = (wid * WARP + LANES).astype(np.int32)
        self.alive = self.tids < cta.threads
        self.nalive = int(np.count_nonzero(self.alive))
        self.mask, self.nactive = self.alive.copy(), self.nalive
        self.specials: dict[str, np.ndarray] = {}
        self.regs = cta.regpool.cap
        self.committed = 0  # wgmma commit groups closed
        self.waited = 0  # groups below this index are complete
        self.fence_ok = self.ever_fenced = False
        self.last_wait_op = None
        self.ncollective = 0
        self.wait = None
        self.exited = False
        self.cp_open = np.zeros(WARP, dtype=np.int64)  # per lane: cp.async groups committed so far
        self.bulk_open = np.zeros(WARP, dtype=np.int64)  # per lane: bulk (TMA store) groups committed
        self.mb_seen: dict = {}  # mbarrier address -> (phases it has seen completed, wait op, parity)
        self.mb_passes: dict = {}  # mbarrier address -> waits of this warp on it that completed
        self.wait_counts: dict = {}  # (wait op id, mbarrier address) -> times this warp executed it
        self.cluster_gen = None  # the cluster-barrier phase this warp arrived in and has not waited for
        self.cluster_arrive_gens: list = []  # the cluster-barrier phase of each of its arrives
        self.cluster_waited = -1  # the latest cluster-barrier phase whose wait it passed
        self.remote_seen: dict = {}  # CTA rank -> that CTA's clock this warp learned through remote arrives
        self.mb_arrived: dict = {}  # mbarrier address -> (phases this warp arrived in, its last arrive op)
        self.arrive_log: list = []  # (epoch, op, mbarrier) of this warp's latest mbarrier arrivals
        self.last_mb_wait = None  # (mbarrier, op, parity) of the latest completed mbarrier wait
        self.loops: list = []  # [loop op, iterations of its current run] of the loops running, outermost first
        self.gen = run_block(self, cta.prog.body)

    def note_arrive(self, mb, op):
        if all(wid != self.wid for wid, _ in mb.arrivals):  # its first arrival in this phase
            self.mb_arrived[mb.addr] = (self.mb_arrived.get(mb.addr, (0, None))[0] + 1, op)
        self.arrive_log.append((int(self.cta.vc[self.wid, self.wid]), op, mb))
        if len(self.arrive_log) > 16:
            del self.arrive_log[0]

    def note_wait(self, mb, op, parity: int):
        """This warp observed the phase of ``mb`` with ``parity``: how many phases it has seen done."""
        done = mb.phase if (mb.phase & 1) != parity else mb.phase - 1
        self.mb_seen[mb.addr] = (done, op, parity)
        self.mb_passes[mb.addr] = self.mb_passes.get(mb.addr, 0) + 1
        self.last_mb_wait = (mb, op, parity)

    def set_mask(self, mask: np.ndarray, n: int | None = None):
        self.mask = mask
        self.nactive = int(np.count_nonzero(mask)) if n is None else n

    def describe(self) -> str:
        return f"warp {self.wid} (warpgroup {self.wid // 4}) of CTA {self.cta.coord}"

    def groups_done(self) -> int:
        return self.waited

    def special(self, reg: str) -> np.ndarray:
        arr = self.specials.get(reg)
        if arr is None:
            arr = self.specials[reg] = self._special(reg)
        if reg in ("clock", "globaltimer_lo"):
            self.cta.ticks += 1
            return np.full(WARP, self.cta.ticks, dtype=np.uint32)
        return arr

    def _special(self, reg: str) -> np.ndarray:
        cta = self.cta
        axis = {"x": 0, "y": 1, "z": 2}
        base, _, ax = reg.partition(".")
        if base == "tid":
            v = self.tids if ax == "x" else np.zeros(WARP, dtype=np.int32)
        elif base == "ntid":
            v = np.full(WARP, cta.threads if ax == "x" else 1, dtype=np.int32)
        elif base == "ctaid":
            v = np.full(WARP, cta.coord[axis[ax]], dtype=np.int32)
        elif base == "nctaid":
            v = np.full(WARP, cta.launch.grid[axis[ax]], dtype=np.int32)
        elif base.startswith("cluster") or base == "nclusterid":
            v = np.full(WARP, cta.cluster.specials(cta.coord)[reg], dtype=np.int32)
        elif reg == "laneid":
            v = LANES.copy()
        elif reg == "warpid":
            v = np.full(WARP, self.wid, dtype=np.int32)
        else:
            v = np.zeros(WARP, dtype=np.uint32)
        v.flags.writeable = False
        return v


_uids = itertools.count()


def run_together(ctas) -> None:
    """Run the warps of ``ctas`` (one CTA, or the CTAs of one cluster) interleaved until all exit."""
    live = [w for c in ctas for w in c.warps]
    rng = ctas[0].rng
    while live:
        progressed = False
        for w in (live if rng is None else rng.sample(live, len(live))):
            copies = w.cta.copies
            if rng is not None and copies.pending:
                copies.land_some(rng)
            if w.wait is not None:
                if not w.wait.ready():
                    continue
                w.wait = None
            try:
                w.wait = next(w.gen)
            except StopIteration:
                w.exited = True
                if w.cta.exited():
                    w.cta.cluster.on_exit(w.cta)
            progressed = True
        live = [w for w in live if not w.exited]
        if live and not progressed:
            pending = [c for c in ctas if c.copies.pending]
            if pending:  # the latest point a copy can land: nothing else can happen first
                for c in pending:
                    c.copies.land_all()
                continue
            stuck = live[0].cta
            error = stuck.deadlock([w for w in live if w.cta is stuck])
            if len(ctas) > 1:
                error.args = (f"{error.args[0]}\n{ctas[0].cluster.describe()}",)
            raise error
    for c in ctas:
        c.copies.at_exit()
        c._check_exit()


class Collective:
    """One execution of a warpgroup-collective instruction by the 4 warps of a warpgroup."""

    __slots__ = ("op", "key", "wid", "wg", "arrived", "inputs", "outputs", "done", "group", "reads", "retired", "uid",
                 "issue_epochs")

    def __init__(self, op, key, wid: int, wg: int):
        self.op, self.key, self.wid, self.wg = op, key, wid, wg
        self.arrived: list[int] = []
        self.inputs: dict = {}
        self.outputs: dict = {}
        self.done = False
        self.group = None
        self.reads = None  # smem bytes an in-flight wgmma reads
        self.retired: set[int] = set()  # warps (0-3) whose wgmma_wait covered it
        self.uid = next(_uids)
        self.issue_epochs: dict[int, int] = {}  # warp -> its epoch when it issued the instruction

    def missing(self) -> str:
        return warps_text(set(range(4 * self.wg, 4 * self.wg + 4)) - set(self.arrived))


class CTA:
    """One thread block: its warps, shared memory, barriers, mbarriers and vector clocks."""

    def __init__(self, launch, coord: tuple[int, int, int], serial: int = 0, cluster=None):
        self.launch, self.prog, self.coord, self.serial = launch, launch.prog, coord, serial
        kir = self.prog.kir
        self.threads = kir.launch.max_threads
        self.nwarps = -(-self.threads // WARP)
        _, _, total, names = shared_layout(kir)
        self.smem = SharedMemory(total, names, launch.check_races, self.nwarps, self)
        self.width = self.nwarps + AGENTS
        self.clock = np.zeros((self.nwarps, self.width), dtype=np.int64)  # clock[w]: warp w's vector clock
        self.clock[:, :self.nwarps] = np.eye(self.nwarps, dtype=np.int64)
        self.vc = self.clock[:, :self.nwarps]  # the warp components (a view)
        self.agent_count = np.zeros(AGENTS, dtype=np.int64)  # phases completed by the mbarriers of each agent
        self.agent_mbar: dict[int, MBarrier] = {}  # agent column -> the mbarrier it stands for now
        self._agents_by_addr: dict[int, int] = {}
        self.barriers: dict[int, NamedBarrier] = {}
        self.bar_arrivers: dict[int, dict] = {}  # named barrier id -> {warp: op} of its bar.arrive arrivals
        self.mbars: dict[int, MBarrier] = {}
        self.wait_targets: dict = {}  # (warpgroup, wait op id, address) -> {n: the phase its n-th run waits for}
        self.remote_touches: dict = {}  # (CTA rank, warp) -> (op, its cluster arrives then, verb): DSMEM users
        self.regpool = RegisterPool(kir, self.nwarps)
        self.wg_logs: dict[int, dict] = {}
        self.wg_reads: dict[int, list] = {}  # warpgroup -> wgmma instances whose smem reads are in flight
        self.recent_wgmma: dict[int, Collective] = {}  # uid -> the latest wgmma instances (for messages)
        self.ticks = 0
        self.rng = launch.rng
        self.copies = AsyncCopies(self)
        self.warps = [Warp(self, i, launch.template) for i in range(self.nwarps)]
        if cluster is None:  # a launch without clusters: each CTA is a cluster of one
            cluster = Cluster((1, 1, 1), coord, launch.grid)
        self.cluster = cluster
        self.rank = cluster.add(self)

    # -- vector clocks --------------------------------------------------------------------------
    def release(self, wid: int, acc: np.ndarray):
        np.maximum(acc, self.clock[wid], out=acc)
        self.clock[wid, wid] += 1

    def acquire(self, wid: int, clock: np.ndarray):
        np.maximum(self.clock[wid], clock, out=self.clock[wid])

    def new_clock(self) -> np.ndarray:
        return np.zeros(self.width, dtype=np.int64)

    def agent_for(self, mb) -> int:
        """The clock column of ``mb``'s copies (one per mbarrier address while they last)."""
        col = self._agents_by_addr.get(mb.addr)
        if col is None:
            col = self._agents_by_addr[mb.addr] = self.nwarps + len(self._agents_by_addr) % AGENTS
        self.agent_mbar[col] = mb
        return col

    def agent_tick(self, col: int) -> int:
        self.agent_count[col - self.nwarps] += 1
        return int(self.agent_count[col - self.nwarps])

    def explain(self, kind: str, **facts) -> str:
        """The operation most likely at fault for a protocol error (``diagnose.py``)."""
        uid = facts.pop("inst_uid", None)
        if uid is not None:
            facts["inst"] = self.recent_wgmma.get(uid)
        return diagnose.explain(self, kind, **facts)

    def writer_text(self, idx: int) -> str:
        """Who wrote bytes whose last writer is clock component ``idx`` (a warp or an mbarrier agent)."""
        if idx < self.nwarps:
            return f"warp {idx}"
        mb = self.agent_mbar.get(idx)
        return f"the TMA copy completing on {mb.label()}" if mb is not None else "a TMA copy"

    def mbar_name(self, mb) -> str:
        """``k_full[1]``: the kernel's label (init or wait) and the index among the barriers initialized
        by the same line; without a label the shared-memory slot (``smem0[2]``)."""
        loc = getattr(mb.init_op, "loc", None)
        key = (loc.filename, loc.lineno) if loc is not None else None
        group = [(a, m) for a, m in sorted(self.mbars.items())
                 if (getattr(m.init_op, "loc", None) and (m.init_op.loc.filename, m.init_op.loc.lineno)) == key]
        # The barriers one line initializes share a label: any member's init or wait label names them all.
        label = mb.init_label or mb.wait_label or next((m.init_label or m.wait_label for _, m in group
                                                        if m.init_label or m.wait_label), "")
        if not label:
            return self.smem.slot_name(mb.addr, 8)
        addrs = [a for a, _ in group]
        return f"{label}[{addrs.index(mb.addr)}]" if len(addrs) > 1 and mb.addr in addrs else label

    def named_barrier(self, bid: int) -> NamedBarrier:
        b = self.barriers.get(bid)
        if b is None:
            b = self.barriers[bid] = NamedBarrier(bid, self.width)
        return b

    def collective(self, w: Warp, op, key) -> "Collective":
        """The instance of the k-th warpgroup-collective instruction of ``w``'s warpgroup.

        Each of the 4 warps must execute the same one (same op, same uniform operands) as its
        k-th; the instance carries what a rendezvous (wgmma) needs.
        """
        wg = w.wid // 4
        if 4 * wg + 4 > self.nwarps:
            raise ProtocolError(f"{op.opcode} at {where(op)} needs a whole warpgroup (4 warps), but the block has "
                                f"{self.threads} threads, so warpgroup {wg} is incomplete")
        log = self.wg_logs.setdefault(wg, {})
        k = w.ncollective
        w.ncollective += 1
        c = log.get(k)
        if c is None:
            c = log[k] = Collective(op, key, w.wid, wg)
        elif c.op is not op or c.key != key:
            raise ProtocolError(
                f"warps of warpgroup {wg} disagree at their warpgroup-collective instruction #{k + 1}: warp "
                f"{c.wid} executed {c.op.opcode} {c.key[1:]} at {where(c.op)}, but {w.describe()} executes "
                f"{op.opcode} {key[1:]} at {where(op)} (.sync.aligned: all 4 warps must run the same one)")
        c.arrived.append(w.wid)
        if len(c.arrived) == 4:
            del log[k]
        return c

    # -- scheduling --------------------------------------------------------------------------------
    def run(self):
        run_together([self])

    def exited(self) -> bool:
        return all(w.exited for w in self.warps)

    def _check_exit(self):
        for wg, log in self.wg_logs.items():
            counts = {w.wid: w.ncollective for w in self.warps[4 * wg:4 * wg + 4]}
            if len(set(counts.values())) > 1:
                most = max(counts, key=counts.get)
                few = min(counts, key=counts.get)
                op = log[counts[few]].op
                raise ProtocolError(
                    f"warp {few} of warpgroup {wg} in CTA {self.coord} exited after {counts[few]} "
                    f"warpgroup-collective instructions, but warp {most} executed {counts[most]}; warp {few} never "
                    f"reached {op.opcode} at {where(op)} (all 4 warps must execute it)")

    def deadlock(self, live) -> ProtocolError:
        return deadlock_error(self, live)
