"""Attention across ranks of a ``torch.distributed`` process group.

    from tylopy.distributed import ring_attention, shard_sequence
    out = ring_attention(q, k, v, is_causal=True)   # q, k, v: this rank's shard of the sequence

``ring_attention`` passes the K/V shards around the ring of ranks with functional collectives,
so ``torch.compile`` traces it into one graph; ``shard_sequence``/``unshard_sequence`` cut a full
sequence into the (zig-zag) shards it expects and put them back together. The implementation
is ``tylopy_kernels.attention.distributed.ring`` (its docstring has the algorithm).
"""
from __future__ import annotations

from tylopy_kernels.attention.distributed.ring import ring_attention, shard_sequence, unshard_sequence

__all__ = ["ring_attention", "shard_sequence", "unshard_sequence"]
