"""Which operation most likely caused a protocol error: the text after "Most likely at fault:".

A race is detected where it shows (a read, a write, a copy landing), but the bug is usually
elsewhere: a wait that is missing or waits for the wrong phase or stage, a release (mbarrier
arrive) that comes before the last read of a buffer, a producer that refills a buffer without
waiting for its release, an arrival count that lets a phase complete too early. These
functions read what the warps did (their mbarrier waits and arrivals, kept by ``Warp``) and
name the likeliest culprit; they return "" when nothing stands out.
"""
from __future__ import annotations

from .errors import where


def explain(cta, kind: str, **facts) -> str:
    if kind == "raw":
        return _raw(cta, **facts)
    if kind == "unseen_phase":
        return unseen_phase(cta, facts["reader"], facts["mb"], facts["phase"])
    if kind == "war":
        return _war(cta, **facts)
    return ""


def _raw(cta, reader, writer, epoch, op, clock=None) -> str:
    """A read (or write) of bytes whose last writer is not ordered before it."""
    if writer < cta.nwarps:
        return ""
    mb = cta.agent_mbar.get(writer)
    if mb is None:
        return ""
    return unseen_phase(cta, reader, mb, epoch - mb.agent_base - 1)


def _last_wait(w) -> str:
    if w.last_mb_wait is None:
        return f"warp {w.wid} has not waited on any mbarrier"
    mb, op, parity = w.last_mb_wait
    return f"its last mbarrier wait was on {mb.label()} (parity {parity}) at {where(op)}"


def unseen_phase(cta, reader: int, mb, phase: int) -> str:
    """Warp ``reader`` accessed bytes that become visible with ``phase`` of ``mb`` without observing it."""
    if not 0 <= reader < cta.nwarps:
        return ""
    w = cta.warps[reader]
    seen = w.mb_seen.get(mb.addr)
    if seen is None:
        others = [cta.mbars[a] for a in w.mb_seen if a in cta.mbars and a != mb.addr]
        same = [m for m in others if m.init_op is mb.init_op or (getattr(m.init_op, "loc", None) is not None and
                getattr(mb.init_op, "loc", None) is not None and m.init_op.loc.lineno == mb.init_op.loc.lineno and
                m.init_op.loc.filename == mb.init_op.loc.filename)]
        if same:
            done, op, parity = w.mb_seen[same[0].addr]
            return (f"warp {reader} never waited on {mb.label()}, whose phase {phase} makes these bytes visible; it "
                    f"waited on {same[0].label()} at {where(op)} instead (the wrong stage?)")
        return (f"warp {reader} never waited on {mb.label()}, whose phase {phase} makes these bytes visible (a "
                f"missing mbarrier_wait?); {_last_wait(w)}")
    done, op, parity = seen
    if done > phase:
        return ""
    passed = ("passed at once on the fresh barrier" if done == 0 else
              f"passed on phase {done - 1}")
    return (f"the wait on {mb.label()} at {where(op)} (parity {parity}) {passed}, but these bytes belong to phase "
            f"{phase}: that wait's parity (or the ring position it uses) is wrong, or it comes too early")


def _writer_view(cta, writer, mb):
    """(what the writer had seen of ``mb``: (done, op, parity) or None, the writer's warp id)."""
    seen = getattr(writer, "seen", None)
    if seen is None:
        w = getattr(writer, "cta", None) and cta.warps[writer.wid]
        seen = w.mb_seen if w is not None else {}
    return seen.get(mb.addr), writer.wid


def _war(cta, readers, clock, writer, read_epoch=None, wgmma=None, inst=None) -> str:
    """Bytes read by ``readers`` overwritten by ``writer`` (clock ``clock``) with nothing ordering the read first."""
    issue = {}
    if inst is not None:
        issue = getattr(inst, "issue_epochs", {}) or {}
    seen_arrives, unseen_arrives = [], []
    for r in readers:
        for a, op, mb in cta.warps[r].arrive_log:
            (seen_arrives if a <= clock[r] else unseen_arrives).append((a, op, mb, r))
    for a, op, mb, r in sorted(seen_arrives, key=lambda t: -t[0]):
        start = issue.get(r) if wgmma is not None else None
        if wgmma is not None and start is not None and a >= start:
            return (f"the release at {where(op)} (mbarrier_arrive on {mb.label()} by warp {r}) came before a "
                    f"wgmma_wait covered the wgmma at {where(wgmma)}, so the buffer was refilled while the wgmma "
                    "still read it")
        if wgmma is None and read_epoch is not None and a < read_epoch and not any(
                u[2] is mb and u[3] == r and u[0] >= read_epoch for u in unseen_arrives):
            return (f"the release at {where(op)} (mbarrier_arrive on {mb.label()} by warp {r}) came before this "
                    "read; release a buffer only after its last read")
        break
    if not unseen_arrives and not seen_arrives:
        return ""
    mb = (unseen_arrives or seen_arrives)[-1][2]
    view, wid = _writer_view(cta, writer, mb)
    if view is None:
        how = f"warp {wid} never waited on {mb.label()}"
    else:
        done, op, parity = view
        how = (f"warp {wid}'s last wait on {mb.label()} was at {where(op)} (parity {parity}, after {done} completed "
               "phase(s))")
        missing = [r for r in readers if r not in {a for a, _ in mb.history.get(done - 1, [])}]
        if done > 0 and missing and any(m is mb for _, _, m in cta.warps[missing[0]].arrive_log):
            return (f"the phase of {mb.label()} that {how.split(' was at ')[0].replace('last wait', 'wait')} waited "
                    f"for completed without an arrival from warp {missing[0]}, which releases the buffer there: the "
                    f"arrival count of its mbarrier_init at {where(mb.init_op)} ({mb.count}) is too small, or an "
                    "arrival was counted twice")
    return (f"the writer was not ordered after the readers' release on {mb.label()}: {how}; the wait before the "
            "refill is missing, or waits for the wrong phase or stage")
