"""The cluster ops in the emulator: ``barrier.cluster.arrive/wait`` and ``mapa`` (``cluster.py`` has the
state and the rules)."""
from __future__ import annotations

import numpy as np

from .cluster import DSMEM_WINDOW
from .compiled import handler
from .errors import ProtocolError, where
from .ops_scalar import check_converged


@handler("cluster_barrier")
def make_cluster_barrier(prog, op):
    mode = op.attr("mode")

    def arrive(w):
        check_converged(w, op, "barrier.cluster.arrive.aligned")
        w.cta.cluster.arrive(w, op)

    def wait(w):
        check_converged(w, op, "barrier.cluster.wait.aligned")
        yield from w.cta.cluster.wait(w, op)

    return (False, arrive) if mode == "arrive" else (True, wait)


@handler("mapa")
def make_mapa(prog, op):
    p, rank = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)

    def run(w):
        env = w.env
        ranks = env[rank].astype(np.int64)
        lanes = np.flatnonzero(w.mask)
        size = w.cta.cluster.size
        bad = lanes[(ranks[lanes] < 0) | (ranks[lanes] >= size)]
        if len(bad):
            raise ProtocolError(f"mapa at {where(op)}: lane {int(bad[0])} of {w.describe()} asks for CTA rank "
                                f"{int(ranks[bad[0]])}, but the cluster has {size} CTA(s) (ranks 0..{size - 1})")
        out = np.uint64(DSMEM_WINDOW) + (np.clip(ranks, 0, 15).astype(np.uint64) << np.uint64(32)) \
            + env[p].astype(np.uint64)
        env[r] = out
    return False, run
