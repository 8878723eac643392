"""Hopper (sm_90a) instructions for kernels: mbarriers, TMA loads and stores, setmaxnreg, fences and wgmma.

The public ``ty.hopper`` namespace: the instruction wrappers of ``tylopy.language.hopper`` and
the warpgroup MMA of the tile library (``tylopy.tile.wgmma``). docs/hopper.md has the facts
each relies on.
"""
from .language.hopper import *  # noqa: F401,F403
from .language.hopper import __all__ as _instructions
from .language.async_copy import bulk_commit, bulk_wait, tma_store
from .tile.wgmma import (WgmmaAtom, descriptor_bits, fence_operand, smem_descriptor, wgmma, wgmma_commit,
                         wgmma_fence, wgmma_wait)

__all__ = [*_instructions, "tma_store", "bulk_commit", "bulk_wait", "WgmmaAtom", "descriptor_bits", "fence_operand", "smem_descriptor", "wgmma",
           "wgmma_commit", "wgmma_fence", "wgmma_wait"]
