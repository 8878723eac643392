"""The message of a hang: every live warp waits and none can go on.

It names the waiting warps (grouped when several wait at the same line on the same thing), the
exited ones, and the likeliest cause, from what the barriers saw:

* an mbarrier phase whose expect_tx bytes never all arrive (the byte count of the expect_tx);
* an mbarrier phase that still needs arrivals: the warps that arrived in the previous phase
  and have not in this one (a missing arrive, e.g. a release skipped in the last iteration),
  or, in the first phase, a count larger than the arrivals that come;
* among those, a warp that *skipped* its arrive comes first: it has passed more waits on the
  barrier it waits on now than the phases it arrived in on the barrier that misses it (a
  consumer that consumed a stage twice but released it once), while a warp blocked before its
  arrive (the producer waiting for that release) is only its victim;
* a named barrier that no warp ever arrives on with bar.arrive, while bar.arrive goes to
  another id (a turn passed to the wrong barrier);
* a wait for the first phase of a barrier nothing has arrived on (a parity that may be inverted).
"""
from __future__ import annotations

from .errors import ProtocolError, where
from .sync import MBarrier, NamedBarrier, short_where, warps_text


def _mb_wait(w):
    obj = w.wait.obj
    return obj if isinstance(obj, tuple) and obj and isinstance(obj[0], MBarrier) else None


def _groups(live) -> str:
    """One line per (wait line, what it waits for), with the warps that wait there."""
    seen: dict = {}
    for w in live:
        key = (w.wait.op, w.wait.describe())
        seen.setdefault(key, []).append(w)
    lines = []
    for (op, what), ws in seen.items():
        wgs = sorted({x.wid // 4 for x in ws})
        who = f"warp {ws[0].wid}" if len(ws) == 1 else f"warps {warps_text(x.wid for x in ws)}"
        verb = "waits" if len(ws) == 1 else "wait"
        lines.append(f"  {who} (warpgroup {warps_text(wgs)}) of CTA {ws[0].cta.coord} {verb} at {where(op)}: {what}")
    return "\n".join(lines)


def _arrivals_text(arrivals) -> str:
    by_op: dict = {}
    for wid, op in arrivals:
        by_op.setdefault(op, []).append(wid)
    return "; ".join(f"warps {warps_text(ws)} at {short_where(op)}" for op, ws in by_op.items()) or "none"


def _mbarrier_cause(cta, mb: MBarrier, parity: int) -> str:
    if mb.pending == 0:
        return ""
    prev = mb.history.get(mb.phase - 1)
    now = {wid for wid, _ in mb.arrivals}
    if prev:
        missing = sorted({wid for wid, _ in prev} - now)
        if missing:
            states = []
            for wid in missing:
                w = cta.warps[wid]
                states.append(f"warp {wid} exited" if w.exited else
                              f"warp {wid} waits at {short_where(w.wait.op)}" if w.wait else f"warp {wid} runs")
            return (f"{mb.label()} still needs {mb.pending} arrival(s) in phase {mb.phase}; in phase {mb.phase - 1} "
                    f"they came from {_arrivals_text(prev)}, but {', '.join(states)} without arriving again (a "
                    f"missing arrive, e.g. a release skipped on the last iteration?)")
    if mb.arrivals:
        return (f"{mb.label()} got {len(mb.arrivals)} arrival(s) in phase {mb.phase} ({_arrivals_text(mb.arrivals)}) "
                f"and still needs {mb.pending}: the count of its mbarrier_init at {where(mb.init_op)} ({mb.count}) is "
                "larger than the arrivals that come, or an arrival is missing")
    if mb.phase == 0 and parity == 0:
        return (f"nothing has arrived on {mb.label()} yet and the wait is for its first phase (parity 0); if this "
                "warp is the first to use the buffer (a producer's first pass over a free stage) the wait should "
                "pass at once, with parity 1: is the parity inverted?")
    return ""


def _skipped_arrive(cta, mb: MBarrier) -> str:
    """The warp that owes ``mb`` an arrival although it went on past the point of paying it: it
    arrived on ``mb`` in fewer phases than the waits it passed on the barrier it now waits on."""
    if mb.pending == 0:
        return ""
    prev = mb.history.get(mb.phase - 1)
    loc = getattr(mb.init_op, "loc", None)
    siblings = {m.addr for m in cta.mbars.values() if getattr(m.init_op, "loc", None) == loc}
    if prev:
        owing = {wid for wid, _ in prev}
    else:  # its first phase: the warps that arrive on the barriers its init line made (the other stages)
        owing = {w.wid for w in cta.warps if any(a in w.mb_arrived for a in siblings)}
    now = {wid for wid, _ in mb.arrivals}
    for wid in sorted(owing - now):
        w = cta.warps[wid]
        mbw = _mb_wait(w) if w.wait and not w.exited else None
        if not mbw or mbw[0] is mb:
            continue
        waited = mbw[0]
        passes = w.mb_passes.get(waited.addr, 0)
        arrived, last = w.mb_arrived.get(mb.addr, (0, None))
        if last is None:  # never arrived on this one: where it arrives on the others of its init line
            last = next((op for a, (_, op) in w.mb_arrived.items() if a in siblings), None)
        if arrived >= passes:
            continue  # blocked before its arrive: a victim of the hang, not its cause
        victims = [x for x in cta.warps if x.wait and not x.exited and (_mb_wait(x) or (None,))[0] is mb]
        held = (f"; {', '.join(f'warp {x.wid} waits for it at {short_where(x.wait.op)}' for x in victims)}"
                if victims else "")
        at = f" (its arrive at {where(last)})" if last is not None else ""
        return (f"warp {wid} skipped an arrive on {mb.label()}{at}: it has passed {passes} wait(s) on "
                f"{waited.label()} and now waits for the next one at {short_where(w.wait.op)}, but arrived on "
                f"{mb.label()} in only {arrived} phase(s), so phase {mb.phase} of {mb.label()} never completes"
                f"{held} (a release skipped on some iteration, e.g. under a condition or an early continue?)")
    return ""


def _named_cause(cta, b: NamedBarrier) -> str:
    if any(not sync for _, _, sync in b.parts) or cta.bar_arrivers.get(b.id):
        return ""
    elsewhere = {bid: ops for bid, ops in cta.bar_arrivers.items() if bid != b.id}
    if not elsewhere:
        return ""
    where_to = "; ".join(f"barrier {bid} (warps {warps_text(ops)} at {short_where(next(iter(ops.values())))})"
                         for bid, ops in sorted(elsewhere.items()))
    return (f"bar.sync {b.id} waits for {b.expected - b.arrived} more threads, but no warp ever arrives on named "
            f"barrier {b.id} with bar.arrive; bar.arrive went to {where_to}: is the barrier id of that hand-off "
            "wrong?")


def deadlock_error(cta, live) -> ProtocolError:
    exited = [w.wid for w in cta.warps if w.exited]
    tail = _groups(live) + f"\n  exited warps: {warps_text(exited)}"
    for w in live:
        mbw = _mb_wait(w)
        if mbw:
            short = mbw[0].tx_shortfall()
            if short:
                return ProtocolError(f"{short}\nwaiting warps (the kernel would hang here):\n{tail}")
    # The likeliest first: a skipped arrive, a hand-off to the wrong barrier, then counts, then parities.
    skipped, named, mbarrier, parity = [], [], [], []
    for w in live:
        mbw = _mb_wait(w)
        if mbw:
            skipped.append(_skipped_arrive(cta, mbw[0]))
            c = _mbarrier_cause(cta, *mbw)
            (parity if "is the parity" in c else mbarrier).append(c)
        elif isinstance(w.wait.obj, NamedBarrier):
            named.append(_named_cause(cta, w.wait.obj))
    cause = next((c for c in skipped + named + mbarrier + parity if c), "")
    blame = f"\nMost likely at fault: {cause}" if cause else ""
    first = live[0]
    if all(_mb_wait(w) for w in live) and exited:
        mb, parity = _mb_wait(first)
        return ProtocolError(
            f"mbarrier phase can never complete: {first.describe()} waits at {where(first.wait.op)} on "
            f"{mb.label()} (parity {parity}, phase {mb.phase}), which still needs {mb.pending} arrival(s)"
            f"{' and ' + str(mb.tx) + ' bytes' if mb.tx > 0 else ''}, but only waiting warps remain "
            f"(warps {warps_text(exited)} exited){blame}\n{tail}")
    return ProtocolError(
        f"deadlock in CTA {cta.coord}: every live warp is waiting and none can continue (the GPU would hang); "
        f"first: {first.describe()} at {where(first.wait.op)}{blame}\n{tail}")
