"""Hopper (sm_90a) instructions for kernels: mbarriers, TMA loads and stores, setmaxnreg, fences and wgmma.

The public ``ty.hopper`` namespace: the instruction wrappers of ``tylopy.language.hopper``, the
warpgroup MMA of the tile library (``tylopy.tile.wgmma``) and the stage/phase bookkeeping of a
producer/consumer ring of mbarriers (``tylopy.tile.pipeline``). docs/hopper.md has the facts
each relies on.
"""
from .language.hopper import *  # noqa: F401,F403
from .language.hopper import __all__ as _instructions
from .language.async_copy import bulk_commit, bulk_wait, tma_store
from .tile.pipeline import Ring, barrier_at, ring_acquire, ring_init, ring_release, ring_wait, stage_phase
from .tile.wgmma import (WgmmaAtom, descriptor_bits, fence_operand, smem_descriptor, wgmma, wgmma_commit,
                         wgmma_fence, wgmma_wait)

__all__ = [*_instructions, "tma_store", "bulk_commit", "bulk_wait", "WgmmaAtom", "descriptor_bits", "fence_operand", "smem_descriptor", "wgmma",
           "wgmma_commit", "wgmma_fence", "wgmma_wait", "Ring", "barrier_at", "stage_phase", "ring_init", "ring_acquire",
           "ring_wait", "ring_release"]
