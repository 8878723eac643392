"""Packed batches (varlen) on the Hopper attention forward: which work tile is which document's.

The forward kernel's roles ask ``Problem`` for their tile (``tiles.next_tile``) and for the
problem a tile sees (``tiles.tile_problem``); a dense problem answers itself. A packed one
carries a ``Varlen``, which answers from the prefix sums: document b's queries are rows
cu_q[b] .. cu_q[b] + n_q(b) of the (total_q, H, D) tensor (n_q(b) = cu_q[b + 1] - cu_q[b], or
seqused_q[b]), its keys likewise, and the causal diagonal sits at the bottom-right corner of
each document (key j takes part for query i when j <= i + n_k(b) - n_q(b)).

Lengths are read on the device and clamped, never trusted: a length below 0 counts as 0 and
one above max_seqlen as max_seqlen (the grid only covers that many rows). So a malformed
cu_seqlens never makes the kernel read or write outside the document it names -- but rows of a
document longer than max_seqlen are not computed (their output stays zero), as documented.
"""
import copy

import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90.tiles import key_tiles, tile_position, work_tile


class Varlen:
    """The run-time data of a packed batch. ``used_q``/``used_k`` are None without seqused."""

    def __init__(self, cu_q, cu_k, used_q, used_k, total_q, max_q, max_k):
        self.cu_q, self.cu_k, self.used_q, self.used_k = cu_q, cu_k, used_q, used_k
        self.total_q = ty.cast(total_q, ty.i64)  # the LSE's row stride, (H, total_q)
        self.max_q, self.max_k = max_q, max_k
        # called through the problem: tiles.py does not import this module
        self.next_tile = varlen_next_tile
        self.doc = doc_problem
        self.zero_v_tail = zero_v_tail


@ty.func
def _length(cu, used, b, most):
    start = cu[b]
    n = cu[b + 1] - start
    if used is not None:
        n = used[b]
    return start, ty.minimum(ty.maximum(n, 0), most)


@ty.func
def doc_problem(prob, b):
    """``prob`` as document b sees it: its lengths, first rows and causal diagonal."""
    vl = prob.varlen
    doc = copy.copy(prob)
    doc.q_start, doc.n_q = _length(vl.cu_q, vl.used_q, b, vl.max_q)
    doc.k_start, doc.n_k = _length(vl.cu_k, vl.used_k, b, vl.max_k)
    doc.diag = doc.n_k - doc.n_q
    return doc


@ty.func
def varlen_next_tile(prob, k, persistent, order):
    """(valid, first query row in the document, head, document, key tiles): as ``tiles.next_tile``
    over (query blocks of the longest document, heads, documents); a tile past its document's
    queries (block x >= the document's blocks), or whose rows see no key, is not valid (its output rows stay as the launcher set
    them: zeros, LSE -inf)."""
    if persistent:
        pos = tile_position(k)
        m0, h, b, _ = work_tile(prob, pos, order)
        inside = pos < prob.total
        b = ty.minimum(b, prob.n_batch - 1)  # past the last tile: read a real document, then drop it
        doc = doc_problem(prob, b)
    else:
        # Block x takes the x-th query block from its document's end: x = 0 is every document's
        # last (under causal masking its heaviest) block, and the hardware starts low x first.
        h, b = ty.block_idx(1), ty.block_idx(2)
        doc = doc_problem(prob, b)
        m0 = ((doc.n_q + (prob.block_m - 1)) // prob.block_m - 1 - ty.block_idx(0)) * prob.block_m
        inside = m0 >= 0
    n_tiles = key_tiles(doc, m0)
    return inside & (m0 < doc.n_q) & (n_tiles > 0), m0, h, b, n_tiles


@ty.func
def zero_v_tail(smem, plan, prob, wg, j, it_j):
    """Consumer 1 (the first to take the tensor-core turn of every key tile) zeroes the V rows of
    key tile j past the document's end, before its turn: every PV product reading the stage is
    issued after that turn. The scores of those keys are -inf already, their weights 0, but the
    rows hold the next document's values or whatever lies past the packed tensor's used rows
    (NaN, say), and 0 * NaN would poison the row."""
    if wg == 1:
        valid_rows = prob.n_k - j * plan.block_n
        if valid_rows < plan.block_n:
            stage = hopper.ring_wait(smem, plan.v_ring, it_j, "v_full (document end)")
            base = plan.v + stage * plan.tile_bytes
            t = ty.thread_idx() & 127
            zero = ty.cast(0, ty.u32)
            for c in range(plan.chunks):
                for step in range(plan.block_n // 4):  # a chunk row is 32 words; 128 threads a step
                    word = t + 128 * step
                    if (word >> 5) >= valid_rows:
                        ty.store(ty.ptr_cast(smem + (base + c * plan.kv_chunk + 4 * word), ty.u32), zero)
            hopper.fence_proxy_async()  # the generic stores before the wgmmas (async proxy) read the stage
