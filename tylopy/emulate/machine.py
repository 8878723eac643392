"""Warps, CTAs and the scheduler.

A warp is a Python generator over the compiled kernel body: it runs its 32 lanes in lockstep
(numpy arrays, a lane mask for divergence) until it reaches an instruction that must wait
(bar.sync, an mbarrier wait, setmaxnreg.inc, a wgmma that not all 4 warps of its warpgroup
have issued yet); then it yields a ``Wait``. The scheduler of a
CTA resumes, round robin, every warp whose wait is over. When every live warp is waiting and
none can go on, the kernel would hang on a GPU: the emulator raises a ``ProtocolError`` that
names each waiting warp, the source line, the barrier or mbarrier (and its phase and missing
arrivals or bytes), and which warps have exited.

CTAs cannot synchronize with each other, so they run one after another.
"""
from __future__ import annotations

import itertools

import numpy as np

from .errors import ProtocolError, where
from .memory import shared_layout
from .compiled import run_block
from .shared import SharedMemory
from .sync import MBarrier, NamedBarrier, RegisterPool, warps_text
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
        self.gen = run_block(self, cta.prog.body)

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
            self.cta.clock += 1
            return np.full(WARP, self.cta.clock, dtype=np.uint32)
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
        elif reg == "laneid":
            v = LANES.copy()
        elif reg == "warpid":
            v = np.full(WARP, self.wid, dtype=np.int32)
        else:
            v = np.zeros(WARP, dtype=np.uint32)
        v.flags.writeable = False
        return v


_uids = itertools.count()


class Collective:
    """One execution of a warpgroup-collective instruction by the 4 warps of a warpgroup."""

    __slots__ = ("op", "key", "wid", "wg", "arrived", "inputs", "outputs", "done", "group", "reads", "retired", "uid")

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

    def missing(self) -> str:
        return warps_text(set(range(4 * self.wg, 4 * self.wg + 4)) - set(self.arrived))


class CTA:
    """One thread block: its warps, shared memory, barriers, mbarriers and vector clocks."""

    def __init__(self, launch, coord: tuple[int, int, int]):
        self.launch, self.prog, self.coord = launch, launch.prog, coord
        kir = self.prog.kir
        self.threads = kir.launch.max_threads
        self.nwarps = -(-self.threads // WARP)
        _, _, total, names = shared_layout(kir)
        self.smem = SharedMemory(total, names, launch.check_races, self.nwarps)
        self.vc = np.eye(self.nwarps, dtype=np.int64)  # vc[w] is warp w's vector clock
        self.barriers: dict[int, NamedBarrier] = {}
        self.mbars: dict[int, MBarrier] = {}
        self.regpool = RegisterPool(kir, self.nwarps)
        self.wg_logs: dict[int, dict] = {}
        self.wg_reads: dict[int, list] = {}  # warpgroup -> wgmma instances whose smem reads are in flight
        self.clock = 0
        self.warps = [Warp(self, i, launch.template) for i in range(self.nwarps)]

    # -- vector clocks --------------------------------------------------------------------------
    def release(self, wid: int, acc: np.ndarray):
        np.maximum(acc, self.vc[wid], out=acc)
        self.vc[wid, wid] += 1

    def acquire(self, wid: int, clock: np.ndarray):
        np.maximum(self.vc[wid], clock, out=self.vc[wid])

    def named_barrier(self, bid: int) -> NamedBarrier:
        b = self.barriers.get(bid)
        if b is None:
            b = self.barriers[bid] = NamedBarrier(bid, self.nwarps)
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
        live = list(self.warps)
        while live:
            progressed = False
            for w in live:
                if w.wait is not None:
                    if not w.wait.ready():
                        continue
                    w.wait = None
                try:
                    w.wait = next(w.gen)
                except StopIteration:
                    w.exited = True
                progressed = True
            live = [w for w in live if not w.exited]
            if live and not progressed:
                raise self.deadlock(live)
        self._check_exit()

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
        lines = [f"  {w.describe()} waits at {where(w.wait.op)}: {w.wait.describe()}" for w in live]
        exited = [w.wid for w in self.warps if w.exited]
        tail = "\n".join(lines) + f"\n  exited warps: {warps_text(exited)}"
        for w in live:
            obj = w.wait.obj
            if isinstance(obj, tuple) and obj and isinstance(obj[0], MBarrier):
                short = obj[0].tx_shortfall()
                if short:
                    return ProtocolError(f"{short}\nwaiting warps (the kernel would hang here):\n{tail}")
        mb_waits = [w for w in live if isinstance(w.wait.obj, tuple) and isinstance(w.wait.obj[0], MBarrier)]
        first = live[0]
        if len(mb_waits) == len(live) and exited:
            mb, parity = first.wait.obj
            return ProtocolError(
                f"mbarrier phase can never complete: {first.describe()} waits at {where(first.wait.op)} on "
                f"{mb.label()} (parity {parity}, phase {mb.phase}), which still needs {mb.pending} arrival(s)"
                f"{' and ' + str(mb.tx) + ' bytes' if mb.tx > 0 else ''}, but only waiting warps remain "
                f"(warps {warps_text(exited)} exited)\n{tail}")
        return ProtocolError(
            f"deadlock in CTA {self.coord}: every live warp is waiting and none can continue (the GPU would hang); "
            f"first: {first.describe()} at {where(first.wait.op)}\n{tail}")
