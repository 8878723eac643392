"""The bookkeeping of a warp-specialized ring: shared-memory stages, each with a *full* and an
*empty* mbarrier, filled by a producer (TMA) and drained by consumers, over a running count ``j``
of the loads it has carried.

    ring = ty.hopper.Ring(full=FULL_OFFSET, empty=EMPTY_OFFSET, stages=STAGES)
    ty.hopper.ring_init(smem, ring, consumers)                 # one thread, then a block barrier
    # producer, for each load j:
    stage, full = ty.hopper.ring_acquire(smem, ring, j, STAGE_BYTES)
    ty.hopper.tma_load(smem + (TILES + stage * TILE_BYTES), tmap, full, x, y)
    # each consumer, for each load j:
    stage = ty.hopper.ring_wait(smem, ring, j)               # the stage's bytes have landed
    ...                                                        # read the stage
    ty.hopper.ring_release(smem, ring, j)                    # one arrival per consumer

Load ``j`` uses stage ``j % stages`` in phase ``(j // stages) & 1``: the consumers wait for that
phase of the stage's full barrier, the producer for the opposite phase of its empty barrier (the
phase the consumers completed when they released load ``j - stages``; before the first lap that
is the phase an initialized barrier counts as complete). The barriers are 8-byte words at
``smem + full + 8 * stage`` and ``smem + empty + 8 * stage``; the full barrier takes one arrival
(the producer's ``arrive_expect_tx``) plus the transaction bytes, the empty one an arrival per
consumer. Every function here runs in the trace of the calling kernel and emits only the
mbarrier instructions named, so a kernel written with them compiles to the same PTX as one that
spells them out (docs/hopper.md, "mbarrier").
"""
from __future__ import annotations

from typing import NamedTuple

from ..language import hopper as _hw
from ..language import lang as _lang


class Ring(NamedTuple):
    """Where a ring's barriers lie (byte offsets from the shared-memory base) and how many stages
    it has: compile-time numbers."""

    full: int
    empty: int
    stages: int


def barrier_at(smem, offset):
    """The mbarrier at byte ``offset`` of shared memory ``smem``, as the u64 pointer the mbarrier
    instructions take."""
    return _lang.ptr_cast(smem + offset, _lang.u64)


def stage_phase(j, stages):
    """(stage, phase) of load ``j`` in a ring of ``stages`` stages."""
    return j % stages, (j // stages) & 1


def ring_init(smem, ring: Ring, consumers, producers=1):
    """Initialize every stage's barriers (full: ``producers`` arrivals, empty: ``consumers``) and
    make them visible to the async proxy. Call from one thread, then synchronize the block before
    any thread uses the ring."""
    for s in range(ring.stages):
        _hw.mbarrier_init(barrier_at(smem, ring.full + 8 * s), producers)
        _hw.mbarrier_init(barrier_at(smem, ring.empty + 8 * s), consumers)
    _hw.fence_mbarrier_init()
    _hw.fence_proxy_async()


def ring_acquire(smem, ring: Ring, j, tx_bytes, label: str = "stage empty"):
    """Producer: wait until load ``j``'s stage is free, then arm its full barrier for ``tx_bytes``
    of transactions. Returns (stage, full barrier): the TMA loads of the stage signal that barrier.
    ``label`` names the wait in ``debug_waits`` reports."""
    stage, phase = stage_phase(j, ring.stages)
    _hw.mbarrier_wait(barrier_at(smem, ring.empty + 8 * stage), phase ^ 1, label, stage)
    full = barrier_at(smem, ring.full + 8 * stage)
    _hw.mbarrier_arrive_expect_tx(full, tx_bytes)
    return stage, full


def ring_wait(smem, ring: Ring, j, label: str = "stage full"):
    """Consumer: wait until load ``j``'s bytes have landed in its stage; returns the stage."""
    stage, phase = stage_phase(j, ring.stages)
    _hw.mbarrier_wait(barrier_at(smem, ring.full + 8 * stage), phase, label, stage)
    return stage


def ring_release(smem, ring: Ring, j):
    """Consumer: give load ``j``'s stage back to the producer (one arrival on its empty barrier;
    call it from one thread per consumer, as the empty barrier counts consumers)."""
    _hw.mbarrier_arrive(barrier_at(smem, ring.empty + 8 * (j % ring.stages)))
