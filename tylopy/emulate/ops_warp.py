"""Warp votes, matches, integer reductions and ``activemask`` (semantics: ``tylopy.semantics.warp``).

``vote``, ``match`` and ``redux`` are ``.sync`` instructions with the full member mask: the
warp must be converged (every living lane active), or the emulator raises a ``ProtocolError``
naming the inactive lanes, as the GPU's result would be undefined. Lanes past the end of the
block (its last, partial warp) count as exited: they take no part and contribute 0 to a ballot.
``activemask`` may run diverged: it reports the lanes executing it.
"""
from __future__ import annotations

import numpy as np

from ..semantics import warp as W
from .compiled import handler
from .ops_scalar import check_converged
from .values import WARP, np_dtype


def _full(value, dtype) -> np.ndarray:
    return np.full(WARP, value, dtype=dtype)


@handler("vote")
def make_vote(prog, op):
    mode = op.attr("mode")
    p, r = prog.slot(op.operands[0]), prog.slot(op.result)
    what = f"vote.sync.{mode}"

    def run(w):
        check_converged(w, op, what)
        out = W.vote(mode, w.env[p], w.alive)
        w.env[r] = _full(out, np.uint32 if mode == "ballot" else np.bool_)
    return False, run


@handler("match")
def make_match(prog, op):
    mode = op.attr("mode")
    x = prog.slot(op.operands[0])
    res = [prog.slot(v) for v in op.results]
    what = f"match.{mode}.sync"

    def run(w):
        check_converged(w, op, what)
        if mode == "any":
            w.env[res[0]] = W.match_any(w.env[x], w.alive)
            return
        mask, same = W.match_all(w.env[x], w.alive)
        w.env[res[0]] = _full(mask, np.uint32)
        w.env[res[1]] = _full(same, np.bool_)
    return False, run


@handler("redux")
def make_redux(prog, op):
    kind = op.attr("op")
    x, r = prog.slot(op.operands[0]), prog.slot(op.result)
    dt = np_dtype(op.result.type)
    what = f"redux.sync.{kind}"

    def run(w):
        check_converged(w, op, what)
        w.env[r] = _full(W.redux(kind, w.env[x], w.alive), dt)
    return False, run


@handler("activemask")
def make_activemask(prog, op):
    r = prog.slot(op.result)

    def run(w):
        w.env[r] = _full(W.lane_mask(w.mask), np.uint32)
    return False, run
