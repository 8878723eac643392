"""Synchronization state of a CTA: named barriers, mbarriers, the setmaxnreg register pool.

Ordering between warps is tracked with vector clocks (``CTA.clock``, one row per warp): a warp
*releases* its clock into a barrier when it arrives (bar.sync/bar.arrive, mbarrier arrive) and
*acquires* the merged clock when its wait completes. Two events are ordered when the later
warp's clock has caught up with the earlier one's epoch; the shared-memory race checks and the
"mbarrier initialization not visible" check use this.

Besides one component per warp, a clock has one component per mbarrier (its *agent*): bytes a
TMA copy lands are written by the agent of the copy's mbarrier, with the epoch of the phase
the copy completes, and only a warp that (directly, or through other barriers) observed that
phase has caught up with it. So a TMA copy is ordered by its own mbarrier only, never by the
issuing warp's program order or by a later barrier the producer arrives on.

mbarrier semantics (PTX ISA "mbarrier"; docs/hopper.md): ``init(count)`` starts phase 0 with
``count`` pending arrivals and tx-count 0; ``arrive`` takes one arrival per thread;
``arrive.expect_tx(b)`` first adds ``b`` to the tx-count; a TMA copy's complete_tx subtracts its
bytes when the copy lands. A phase completes when both reach zero; then the next phase starts
with ``count`` arrivals. ``try_wait.parity(P)`` is true once the phase with parity P has
completed: on a fresh barrier parity 1 passes at once. The emulator treats the try_wait loop
as a blocking wait (it never returns false), which changes no result, only how long a hardware
spin takes.
"""
from __future__ import annotations

import os

import numpy as np

from .errors import ProtocolError, where

AGENTS = 64  # clock components for mbarriers; more mbarriers share them (only races can go unseen)


class Wait:
    """What a blocked warp waits for: ``ready()`` polls, ``describe()`` says what is missing."""

    __slots__ = ("ready", "op", "describe", "obj")

    def __init__(self, ready, op, describe, obj=None):
        self.ready, self.op, self.describe, self.obj = ready, op, describe, obj


def warps_text(wids) -> str:
    wids = sorted(set(wids))
    return ", ".join(str(x) for x in wids) if wids else "none"


def short_where(op) -> str:
    """``file.py:LINE`` of an op (for the second mention of a line in a message)."""
    loc = getattr(op, "loc", None)
    return f"{os.path.basename(loc.filename)}:{loc.lineno}" if loc is not None else f"<{op.opcode}>"


# -- named barriers (bar.sync / bar.arrive) ------------------------------------------------------------

class NamedBarrier:
    def __init__(self, bid: int, width: int):
        self.id = bid
        self.expected = 0
        self.arrived = 0
        self.parts: list = []  # (warp, op, is_sync) of the instance in progress
        self.generation = 0
        self.clock = np.zeros(width, dtype=np.int64)
        self.clocks: dict[int, np.ndarray] = {}

    def arrive(self, cta, w, op, count, sync: bool):
        """Count warp ``w`` in; returns the generation it waits for, or None if it completed the barrier."""
        expected = count if count is not None else cta.nwarps * 32
        if self.arrived == 0:
            self.expected = expected
        elif expected != self.expected:
            first = self.parts[0][1]
            raise ProtocolError(
                f"named barrier {self.id} used with two thread counts: {w.describe()} at {where(op)} expects "
                f"{expected} threads, but warp {self.parts[0][0]} arrived at {where(first)} expecting {self.expected}")
        cta.release(w.wid, self.clock)
        self.arrived += 32
        self.parts.append((w.wid, op, sync))
        if not sync:
            cta.bar_arrivers.setdefault(self.id, {})[w.wid] = op
        gen = self.generation
        if self.arrived >= self.expected:
            self.clocks[gen] = self.clock.copy()
            self.clock[:] = 0
            self.arrived, self.parts = 0, []
            self.generation += 1
            return None
        return gen

    def describe(self) -> str:
        who = warps_text(p[0] for p in self.parts)
        arrivers = [f"warp {wid} at {short_where(o)}" for wid, o, s in self.parts if not s]
        extra = f"; by bar.arrive: {', '.join(arrivers)}" if arrivers else ""
        return f"bar.sync {self.id} for {self.expected} threads: {self.arrived} arrived (warps {who}){extra}"


# -- mbarriers ------------------------------------------------------------------------------------------

class MBarrier:
    def __init__(self, cta, addr: int, count: int, op, w):
        self.cta = cta
        self.addr = addr
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0  # phases completed so far; the one in progress has parity phase & 1
        self.init_op, self.init_warp = op, w.wid
        self.init_epoch = int(cta.vc[w.wid, w.wid])
        self.init_label = str(op.attr("label", "") or "")
        self.wait_label = ""
        self.async_visible = False
        self.agent = cta.agent_for(self)  # clock column of the copies this barrier completes
        self.agent_base = cta.agent_count[self.agent - cta.nwarps]  # the agent's epoch before phase 0
        self.history: dict[int, list] = {}  # phase -> (warp, op) arrivals, for the last few phases
        self.clock = cta.new_clock()
        self.done_clock = {0: cta.new_clock(), 1: cta.new_clock()}
        self.expects: list = []  # (op, bytes, warp) announced in this phase
        self.delivered: list = []  # (op, bytes, warp) completed by copies in this phase
        self.arrivals: list = []  # (warp, op) that arrived in this phase
        self.last_arrivals: list = []  # (warp, op) of the last completed phase
        self.init_cluster_gen = cta.cluster.generation  # remote users wait for this cluster-barrier phase
        self.remote_acc: dict = {}  # CTA rank -> clock its warps released by remote arrives (multicast.py)
        self.remote_done: dict = {0: {}, 1: {}}  # parity -> remote_acc of the last phase with that parity

    def label(self) -> str:
        return f"mbarrier {self.cta.mbar_name(self)}"

    def _complete(self):
        cta = self.cta
        early = [r for r in cta.copies.pending if getattr(r, "mb", None) is self and not r.landed
                 and r.op.attr("multicast", False)]
        if early:
            raise ProtocolError(
                f"{self.label()} of CTA {cta.coord} (CTA rank {cta.rank}) completes phase {self.phase} while "
                f"{early[0].describe()} still has {len(early[0].data)} bytes to deliver to it: its expect_tx did not "
                f"count them, so they would land in the next phase (silent corruption on the GPU). Every CTA in a "
                f"multicast's mask receives the whole box and must expect it on its own barrier at that offset "
                f"(mbarrier_arrive_expect_tx with the bytes of every copy that lands in its stage).\n{self._tx_text()}")
        self.clock[self.agent] = cta.agent_tick(self.agent)
        self.done_clock[self.phase & 1] = self.clock.copy()
        self.clock[:] = 0
        self.remote_done[self.phase & 1], self.remote_acc = self.remote_acc, {}
        self.phase += 1
        self.pending, self.tx = self.count, 0
        self.last_arrivals = self.arrivals
        self.last_delivered = self.delivered
        self.history[self.phase - 1] = self.arrivals
        self.history.pop(self.phase - 17, None)
        self.expects, self.delivered, self.arrivals = [], [], []

    def _tx_text(self) -> str:
        ex = sum(b for _, b, _ in self.expects)
        de = sum(b for _, b, _ in self.delivered)
        parts = [f"expect_tx announced {ex} bytes"]
        parts += [f"  expect_tx({b}) at {where(o)} by warp {wid}" for o, b, wid in self.expects]
        parts.append(f"the copies delivered {de} bytes")
        parts += [f"  TMA of {b} bytes at {where(o)} issued by warp {wid}" for o, b, wid in self.delivered]
        return "\n".join(parts)

    def _check_over(self, op, who: str):
        if self.pending == 0 and self.tx < 0:
            culprit = self.expects[-1][0] if self.expects else op
            raise ProtocolError(
                f"expect_tx mismatch on {self.label()} (phase {self.phase}) at {where(op)} ({who}): the copies "
                f"delivered {-self.tx} more bytes than expect_tx announced; the extra bytes would complete the next "
                f"phase early (silent corruption on the GPU). Most likely at fault: the byte count of the "
                f"expect_tx at {where(culprit)}.\n{self._tx_text()}")

    def arrive(self, cta, w, op, k: int, tx_each: int = 0):
        """``k`` threads of ``w`` arrive, each after adding ``tx_each`` to the tx-count. A warp of
        another CTA of the cluster (a remote arrive) releases its clock into ``remote_acc``."""
        remote = w.cta is not self.cta
        if remote:
            mine = w.cta
            mine.release(w.wid, self.remote_acc.setdefault(mine.rank, mine.new_clock()))
        else:
            w.note_arrive(self, op)
            cta.release(w.wid, self.clock)
        while k > 0:
            if tx_each:
                self.tx += tx_each
                self.expects.append((op, tx_each, w.wid))
            if self.pending == 0:
                who = warps_text(a for a, _ in self.arrivals)
                ahead = (" A producer refilling a ring is a whole lap ahead: its wait for the stage to be free "
                         "(the empty barrier) is missing or passes too early (wrong parity); or the count of the "
                         "mbarrier_init is too small" if tx_each else
                         " This arrival comes a phase early (an extra release, or one before the wait it should "
                         "follow), or the count of the mbarrier_init is too small")
                raise ProtocolError(
                    f"too many arrivals on {self.label()} at {where(op)} ({w.describe()}): phase {self.phase} "
                    f"expects {self.count} arrivals (mbarrier_init at {where(self.init_op)}), all of which came "
                    f"(from warps {who}), and it is still waiting for {self.tx} transaction bytes. Most likely at "
                    f"fault:{ahead}")
            take = 1 if tx_each else min(k, self.pending)
            self.pending -= take
            k -= take
            self.arrivals.append((w.wid, op))
            if self.pending == 0 and self.tx == 0:
                self._complete()
                if not remote:
                    cta.release(w.wid, self.clock)
            else:
                self._check_over(op, w.describe())

    def complete_tx(self, op, nbytes: int, wid: int):
        """A TMA copy issued by warp ``wid`` landed ``nbytes``; its bytes belong to the phase in progress."""
        self.tx -= nbytes
        self.delivered.append((op, nbytes, wid))
        if op.attr("multicast", False) and self.pending == 0 and self.tx < 0:
            raise ProtocolError(
                f"the TMA multicast at {where(op)} delivers {nbytes} bytes to {self.label()} of CTA rank "
                f"{self.cta.rank} {self.cta.coord} (phase {self.phase}), whose arrivals all came and whose expect_tx "
                f"did not count them: every CTA in a multicast's mask must expect the bytes it receives on its own "
                f"barrier at that offset (mbarrier_arrive_expect_tx with its whole stage).\n{self._tx_text()}")
        if self.pending == 0 and self.tx == 0:
            self._complete()
        else:
            self._check_over(op, f"the TMA copy issued by warp {wid}")

    def copy_epoch(self) -> int:
        """The agent epoch of the phase in progress (what its copies' bytes are stamped with).
        ``agent`` is a clock column (after the warps' columns); ``agent_count`` is per agent."""
        return int(self.cta.agent_count[self.agent - self.cta.nwarps]) + 1

    def describe_wait(self, parity: int) -> str:
        msg = (f"{self.label()} parity {parity}: phase {self.phase} still needs {self.pending} of {self.count} "
               f"arrival(s)")
        if self.tx > 0:
            msg += f" and {self.tx} transaction bytes"
        elif self.tx < 0:
            msg += f" ({-self.tx} bytes already delivered ahead of expect_tx)"
        return msg

    def tx_shortfall(self) -> str | None:
        """Why the phase cannot complete if every arrival came but bytes are missing."""
        if self.pending == 0 and self.tx > 0:
            culprit = self.expects[-1][0] if self.expects else None
            blame = f" Most likely at fault: the byte count of the expect_tx at {where(culprit)}." if culprit else ""
            return (f"expect_tx mismatch on {self.label()} (phase {self.phase}): expect_tx announced {self.tx} "
                    f"more bytes than the copies delivered, so the phase never completes.{blame}\n{self._tx_text()}")
        return None


def mbarrier_lookup(cta, w, op, addr: int, async_use: bool = False) -> MBarrier:
    """The initialized mbarrier at ``addr``, checking its initialization is visible to ``w``."""
    mb = cta.mbars.get(addr)
    if mb is None:
        raise ProtocolError(
            f"mbarrier {cta.smem.slot_name(addr, 8)} used at {where(op)} by {w.describe()} before any mbarrier_init: "
            f"no thread initialized it")
    if mb.init_warp != w.wid and cta.vc[w.wid, mb.init_warp] < mb.init_epoch:
        raise ProtocolError(
            f"{mb.label()} used at {where(op)} by {w.describe()} before its initialization is visible: warp "
            f"{mb.init_warp} initialized it at {where(mb.init_op)}, and no barrier (syncthreads / bar.sync) "
            f"after the init orders it before this use")
    if async_use and not mb.async_visible:
        raise ProtocolError(
            f"{mb.label()} is used by TMA at {where(op)} ({w.describe()}), but its initialization at "
            f"{where(mb.init_op)} was never made visible to the async proxy: warp {mb.init_warp} must execute "
            f"fence_mbarrier_init() (or fence_proxy_async()) after mbarrier_init and before the barrier")
    return mb


def check_lap(cta, w, op, mb: MBarrier, parity: int) -> None:
    """Warps of one warpgroup that execute the same mbarrier wait the same number of times wait for
    the same phase. One that reaches its wait after the barrier completed two more phases finds
    the parity it waits for come round again: on the GPU it waits for a phase a lap later (a hang,
    or a pass in the wrong lap); the emulator's wait would too. Reported here, at the lagging
    warp's wait, with the warp that passed the phase it should have waited for."""
    target = mb.phase + 1 if (mb.phase & 1) == parity else mb.phase  # the completion it passes on
    key = (w.wid // 4, id(op), mb.addr)
    n = w.wait_counts.get(key[1:], 0)
    w.wait_counts[key[1:]] = n + 1
    seen = cta.wait_targets.setdefault(key, {})
    first = seen.get(n)
    if first is None:
        seen[n] = (target, w.wid, 1)
        seen.pop(n - 64, None)  # waits one warp of the warpgroup runs alone are never completed
        return
    want, wid, count = first
    if want != target:
        behind, ahead = ((w.wid, wid) if target > want else (wid, w.wid))
        raise ProtocolError(
            f"warps {ahead} and {behind} of warpgroup {w.wid // 4} in CTA {cta.coord} disagree on the phase of "
            f"{mb.label()} that their wait #{n + 1} at {where(op)} (parity {parity}) is for: warp {ahead} passed "
            f"it on completion {min(want, target)}, while warp {behind} reached it only after completion "
            f"{max(want, target) - 1}, when the parity had come round again, so it waits for completion "
            f"{max(want, target)}. On the GPU warp {behind} waits a lap late (a hang, or a pass in the wrong "
            f"phase). Most likely at fault: one thread of the warpgroup arrives on the barrier that lets "
            f"{mb.label()} move on right after its own wait, before the warpgroup's other warps have passed "
            f"theirs; sync the warpgroup (a named barrier over its 128 threads) between the wait and that "
            f"arrive.")
    if count == 3:
        del seen[n]
    else:
        seen[n] = (want, wid, count + 1)


# -- setmaxnreg ------------------------------------------------------------------------------------------

class RegisterPool:
    """The CTA's register budget: every thread starts with the entry cap; dec returns, inc takes."""

    def __init__(self, kir, nwarps: int):
        lb = kir.launch
        self.known = bool(lb.max_registers or lb.min_blocks_per_sm)
        if lb.max_registers:
            cap = lb.max_registers
        else:
            cap = 65536 // (lb.max_threads * (lb.min_blocks_per_sm or 1))
        self.cap = min(cap, 255) // 8 * 8
        self.total = self.cap * 32 * nwarps
        self.free = 0

    def describe_need(self, need: int) -> str:
        return f"needs {need} more registers for the warp, but the CTA's pool has {self.free} free"
