"""Structured control flow over a warp's lanes: ``if``, ``for`` and ``while`` with lane masks.

A warp runs its lanes in lockstep. An ``if`` whose condition splits the active lanes runs
both regions, each under its own mask, and merges the yielded values per lane; a uniform
condition runs only the taken region. Loops run while any active lane still iterates; lanes
that finish keep the values of their last iteration. A loop whose bounds are the same in
every active lane (the common case) iterates on Python integers with no per-lane masks.
"""
from __future__ import annotations

import numpy as np

from .errors import EmulationError, where
from .compiled import handler, run_block
from .values import WARP, merge, np_dtype

def _loop_limit(w, op, n):
    if n > w.cta.launch.max_iterations:
        raise EmulationError(f"loop at {where(op)} ran {n} iterations in {w.describe()} without finishing "
                             f"(limit max_iterations={w.cta.launch.max_iterations})")


def _enter(w, op) -> list:
    """Push ``op`` on the warp's stack of running loops; the frame counts this run's iterations."""
    frame = [op, 0]
    w.loops.append(frame)
    return frame


def _step(w, frame):
    """One iteration of one loop by one warp: charged to the launch's step budget (``max_steps``)."""
    frame[1] += 1
    launch = w.cta.launch
    launch.steps += 1
    if launch.steps > launch.max_steps:
        raise _budget_error(w, launch)
    if frame[1] > launch.max_iterations:
        _loop_limit(w, frame[0], frame[1])


def _budget_error(w, launch) -> EmulationError:
    # The runaway is the running loop with the longest current run: an endless outer loop around a
    # bounded inner one restarts the inner one's count, not its own.
    op, n = max(w.loops, key=lambda f: f[1])
    others = [f"the loop at {where(o)} (iteration {k} of its current run)"
              for o, k in reversed(w.loops) if o is not op]
    also = f"; the other loops running in that warp: {'; '.join(others)}" if others else ""
    return EmulationError(
        f"{launch.prog.kir.name}: the emulated launch exhausted its step budget max_steps={launch.max_steps} "
        f"(loop iterations of all warps of all CTAs, plus one per CTA started): the loop at {where(op)} was in "
        f"iteration {n} of its current run in {w.describe()}{also}. A loop that never ends (or spins on a flag "
        f"nothing sets) would hang the GPU; if the kernel really needs more, pass max_steps= or set "
        f"TYLOPY_EMULATE_MAX_STEPS")


def _bind(env, slots, vals):
    for s, v in zip(slots, vals):
        env[s] = v


@handler("if")
def make_if(prog, op):
    c = prog.slot(op.operands[0])
    then_b, else_b = prog.block(op.regions[0]), prog.block(op.regions[1])
    res = [prog.slot(r) for r in op.results]
    mergef = merge if any(r.id in prog.pending for r in op.results) else np.where

    def run(w):
        env = w.env
        cond = env[c]
        m, n = w.mask, w.nactive
        tm = m & cond
        nt = int(np.count_nonzero(tm))
        if nt == n or nt == 0:
            blk = then_b if nt == n else else_b
            yield from run_block(w, blk)
            _bind(env, res, [env[s] for s in blk.term])
            return
        w.set_mask(tm, nt)
        yield from run_block(w, then_b)
        tv = [env[s] for s in then_b.term]
        w.set_mask(m & ~cond, n - nt)
        yield from run_block(w, else_b)
        ev = [env[s] for s in else_b.term]
        w.set_mask(m, n)
        _bind(env, res, [mergef(cond, a, b) for a, b in zip(tv, ev)])

    return True, run


def _uniform(x: np.ndarray, m: np.ndarray, full: bool):
    if full:
        return x[0] if (x == x[0]).all() else None
    xa = x[m]
    return xa[0] if (xa == xa[0]).all() else None


@handler("for")
def make_for(prog, op):
    lo, hi, st = (prog.slot(v) for v in op.operands[:3])
    init = [prog.slot(v) for v in op.operands[3:]]
    body = prog.block(op.regions[0])
    iv_slot, carried = body.args[0], body.args[1:]
    res = [prog.slot(r) for r in op.results]
    t = op.operands[0].type
    dt = np_dtype(t)
    bits = t.bits
    tmin = -(1 << (bits - 1)) if t.is_signed else 0
    mergef = merge if any(r.id in prog.pending for r in op.results) else np.where

    def wrap(i):
        return ((i - tmin) % (1 << bits)) + tmin

    def run(w):
        env = w.env
        L, H, S = env[lo], env[hi], env[st]
        vals = [env[s] for s in init]
        m, n = w.mask, w.nactive
        full = n == WARP
        l0, h0, s0 = _uniform(L, m, full), _uniform(H, m, full), _uniform(S, m, full)
        frame = _enter(w, op)
        if l0 is not None and h0 is not None and s0 is not None:
            i, h, s = int(l0), int(h0), int(s0)
            while (s > 0 and i < h) or (s < 0 and i > h):
                _step(w, frame)
                env[iv_slot] = np.full(WARP, i, dtype=dt)
                _bind(env, carried, vals)
                yield from run_block(w, body)
                vals = [env[x] for x in body.term]
                i = wrap(i + s)
        else:
            iv = L.copy()

            def going(iv):  # the step's sign decides the comparison; a zero step runs no iteration
                return ((S > 0) & (iv < H)) | ((S < 0) & (iv > H))

            active = m & going(iv)
            while active.any():
                _step(w, frame)
                w.set_mask(active)
                env[iv_slot] = iv
                _bind(env, carried, vals)
                yield from run_block(w, body)
                vals = [mergef(active, a, b) for a, b in zip((env[x] for x in body.term), vals)]
                iv = np.where(active, iv + S, iv).astype(dt)
                active = active & going(iv)
            w.set_mask(m, n)
        w.loops.pop()
        _bind(env, res, vals)

    return True, run


@handler("while")
def make_while(prog, op):
    init = [prog.slot(v) for v in op.operands]
    cond_b, body_b = prog.block(op.regions[0]), prog.block(op.regions[1])
    res = [prog.slot(r) for r in op.results]
    mergef = merge if any(r.id in prog.pending for r in op.results) else np.where

    def run(w):
        env = w.env
        vals = [env[s] for s in init]
        m, n0 = w.mask, w.nactive
        active, n = m, n0
        frame = _enter(w, op)
        while True:
            _bind(env, cond_b.args, vals)
            yield from run_block(w, cond_b)
            go = active & env[cond_b.term[0]]
            ng = int(np.count_nonzero(go))
            if ng == 0:
                break
            _step(w, frame)
            if ng != n:
                w.set_mask(go, ng)
            _bind(env, body_b.args, vals)
            yield from run_block(w, body_b)
            new = [env[s] for s in body_b.term]
            vals = new if ng == n0 else [mergef(go, a, b) for a, b in zip(new, vals)]
            active, n = go, ng
        w.loops.pop()
        w.set_mask(m, n0)
        _bind(env, res, vals)

    return True, run
