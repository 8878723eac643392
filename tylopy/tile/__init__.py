"""The tile library: register tiles spread over lanes, and the operations that keep track of who owns what.

* ``layouts``: which lane and register hold which logical (row, col) of a tile, as tables
  built from one coordinate function (mma.sync A/B/C, the wgmma accumulator and register A);
* ``fragment``: ``Fragment`` (registers + layout + ownership), elementwise ops and reductions
  over exactly the lanes that share a row;
* ``softmax``: the online softmax state and its update, normalization, LSE and merge;
* ``collectives``: block-wide reduce and scan, warp scan, sort and top-k;
* ``mma_sync`` and ``wgmma``: the MMA atoms and the same-lane accumulator -> operand conversion;
* ``pipeline``: the stage/phase bookkeeping of a producer/consumer ring of mbarriers (public as
  ``ty.hopper.Ring``, ``ring_init``, ``ring_acquire``, ``ring_wait``, ``ring_release``).

Every operation runs traced inside a kernel (registers are ``RuntimeValue``s of the frontend)
or as the numpy reference semantics over every lane at once (``tylopy.semantics``).
"""
from .collectives import block_reduce, block_scan, warp_scan, warp_sort, warp_topk
from .fragment import Fragment
from .layouts import (MMA_SYNC_A, MMA_SYNC_A_K32, MMA_SYNC_B, MMA_SYNC_B_K32, MMA_SYNC_C, QUAD, WARP, WARPGROUP,
                      WGMMA_A_RS, WGMMA_A_RS_FP8, Layout, LocalOwnership, Ownership, tiled_mma_c, wgmma_acc)
from . import mma_sync, wgmma
from .mma_sync import MmaSyncAtom
from .softmax import SoftmaxState, SoftmaxUpdate, softmax_lse, softmax_merge, softmax_normalize, softmax_update
from .wgmma import WgmmaAtom


def pack_operand_a(atom, *args, **kwargs):
    """Same-lane f32 accumulator -> 16-bit A operand of the next MMA.

    ``pack_operand_a(MmaSyncAtom(...), left, right)`` or ``(atom, acc, m, k)`` for mma.sync;
    ``pack_operand_a(WgmmaAtom(...), acc, k)`` for the wgmma register-A form.
    """
    if isinstance(atom, MmaSyncAtom):
        return mma_sync.pack_operand_a(atom, *args, **kwargs)
    if isinstance(atom, WgmmaAtom):
        return wgmma.pack_operand_a(*args, dtype=atom.dtype, **kwargs)
    raise TypeError(f"pack_operand_a expects an MmaSyncAtom or WgmmaAtom, but got {atom!r}")


__all__ = ["Fragment", "Layout", "Ownership", "LocalOwnership", "QUAD", "WARP", "WARPGROUP", "MMA_SYNC_A",
           "MMA_SYNC_B", "MMA_SYNC_C", "WGMMA_A_RS", "tiled_mma_c", "wgmma_acc", "MmaSyncAtom", "WgmmaAtom",
           "SoftmaxState", "SoftmaxUpdate", "softmax_update", "softmax_normalize", "softmax_merge", "softmax_lse",
           "pack_operand_a", "block_reduce", "block_scan", "warp_scan", "warp_sort", "warp_topk", "MMA_SYNC_A_K32", "MMA_SYNC_B_K32", "WGMMA_A_RS_FP8"]
