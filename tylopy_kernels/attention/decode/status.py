"""Device-side validation of ``block_table`` for ``attention_decode``, without a host synchronization.

Every paged decode launch passes the kernel a status buffer of its device (4 int32 words). A
``block_table`` entry the kernel needs (one of the pages holding a sequence's first
``cache_seqlens[b]`` keys) that is negative or not below the number of pages in the pool is never
dereferenced: that key block reads as zeros, so the output of that sequence is not meaningful, and
the kernel records the read in the status words (atomically: the count of such reads, the lowest
sequence index, the lowest and highest bad entry). Nothing waits for it: the host reads the words
when it chooses to synchronize::

    out = tylopy.attention_decode(q, k_pages, v_pages, lens, block_table=table)
    ...
    tylopy.attention_decode.check_block_table()      # raises ValueError naming block_table if any was bad
    status = tylopy.attention_decode.block_table_status()   # or look: BlockTableStatus(bad_reads=0, ...)

Both read (and by default reset) the words of the device, so they cover every launch on it since
the last reset, on every stream. ``attention_decode(..., check_inputs=True)`` instead checks the
table on the host before launching (it copies ``cache_seqlens`` and ``block_table`` to the host: a
synchronization).
"""
from __future__ import annotations

import dataclasses

import torch

INT32_MAX, INT32_MIN = 2**31 - 1, -2**31
_buffers: dict = {}


def _initial(device) -> torch.Tensor:
    return torch.tensor([0, INT32_MAX, INT32_MAX, INT32_MIN], dtype=torch.int32, device=device)


def status_buffer(device) -> torch.Tensor:
    """The status words of ``device`` (created zeroed on first use; every launch on it shares them)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    buf = _buffers.get(device)
    if buf is None:
        buf = _buffers[device] = _initial(device)
    return buf


@dataclasses.dataclass(frozen=True)
class BlockTableStatus:
    """What the decode kernels found in ``block_table`` since the last reset."""

    bad_reads: int                 # key-block reads that met an entry outside the page pool
    first_sequence: int | None     # the lowest sequence index with such an entry
    lowest_entry: int | None
    highest_entry: int | None

    @property
    def ok(self) -> bool:
        return self.bad_reads == 0

    def __str__(self):
        if self.ok:
            return "block_table: every entry read was inside the page pool"
        return (f"block_table: {self.bad_reads} key-block read(s) met an entry outside the page pool (entries "
                f"{self.lowest_entry}..{self.highest_entry}; the lowest sequence with one: {self.first_sequence}); "
                "those blocks read as zeros, so the outputs of those sequences are not meaningful")


def block_table_status(device=None, reset: bool = True) -> BlockTableStatus:
    """Read the status words of ``device`` (default: the current CUDA device); a synchronization.
    ``reset`` clears them for the next launches (queued on the current stream)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    buf = status_buffer(device)
    count, seq, lo, hi = (int(x) for x in buf.tolist())
    if reset:
        buf.copy_(_initial(buf.device))
    if count == 0:
        return BlockTableStatus(0, None, None, None)
    return BlockTableStatus(count, seq, lo, hi)


def check_block_table(device=None, reset: bool = True) -> BlockTableStatus:
    """``block_table_status``, raising ``ValueError`` (naming ``block_table``) when an entry was bad."""
    status = block_table_status(device, reset)
    if not status.ok:
        raise ValueError(f"attention_decode: block_table expects entries in 0..num_pages-1 for every page a "
                         f"sequence's keys occupy, but {status}")
    return status


def check_table_on_host(block_table, cache_seqlens, page_size: int, num_pages: int, capacity: int) -> None:
    """``check_inputs=True``: every entry the kernel will read, checked on the host (copies both tensors)."""
    lens = cache_seqlens.detach().to("cpu", torch.int64).clamp(0, capacity)
    table = block_table.detach().to("cpu", torch.int64)
    needed = (lens + page_size - 1) // page_size
    cols = torch.arange(table.shape[1])
    used = cols[None, :] < needed[:, None]
    bad = used & ((table < 0) | (table >= num_pages))
    if bad.any():
        b, p = (int(x) for x in bad.nonzero()[0])
        count = int(bad.sum())
        raise ValueError(f"attention_decode: block_table expects entries in 0..{num_pages - 1} (the page pool of "
                         f"k_cache) for the pages of each sequence's first cache_seqlens[b] keys, but got "
                         f"block_table[{b}, {p}] = {int(table[b, p])} (sequence {b} has {int(lens[b])} keys); "
                         f"{count} such entr{'y' if count == 1 else 'ies'} in all")
