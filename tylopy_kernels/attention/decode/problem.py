"""Shared pieces of the split-KV decode kernels (``kernel.py``): their tensor parameters, the
shared-memory layout, and the plain holders the ``@ty.func`` helpers read, built in the kernel: the
compile-time ``Config`` (the constexprs, by name) and the run-time ``Rows`` (the CTA's query rows),
``Cache`` (the K/V cache as the CTA reads it), ``KeyBlock`` (one warp block of keys) and ``Dest``
(where results go). Such holders are plain Python: they only group a helper's arguments (the trace
reads their fields as it read the arguments).
"""
import dataclasses
from typing import Any, NamedTuple

import tylopy as ty

# The tensor parameters. Tokens (q, the caches, out): 16-bit elements as int16 (the kernels copy 16-byte
# chunks and read 32-bit words, so bf16 and fp16 both travel as int16 and DTYPE says which), offsets in
# 64 bits (a cache passes 2^31 elements), the head dim contiguous (checked at launch; cp.async and the word
# loads need it). The fp32 LSE and partials are contiguous in their last dim too (the merge reads four
# columns of a partial as one 16-byte load). A row's partial outputs lie side by side in one row, split s
# at columns s * D ..: the merge's loads of a row then sit at constant offsets from one address, all
# ld.global.nc (with a run-time stride between splits, 8 of each 16 lost .nc in the merge kernel's PTX).
# The table is read one entry per key block: its last dim is contiguous (the launcher copies a table
# that is not); the lengths take any stride (read once per CTA).
TOKENS = ty.tensor(ty.i16, 4, index=ty.i64, contiguous=True)
ROW_LSE = ty.tensor(ty.f32, 3, index=ty.i64, contiguous=True)        # (B, H_q, n_q)
PARTIALS = ty.tensor(ty.f32, 2, index=ty.i64, contiguous=True)       # (rows, splits x D)
PARTIAL_LSE = ty.tensor(ty.f32, 2, index=ty.i64, contiguous=True)    # (rows, splits)
SEQLENS = ty.tensor(ty.i32, 1, index=ty.i64)
TABLE = ty.tensor(ty.i32, 2, index=ty.i64, contiguous=True)          # (B, max_pages)
COUNTERS = ty.tensor(ty.i32, 2, index=ty.i64, contiguous=True)       # (B, H_kv * row blocks)
STATUS = ty.tensor(ty.i32, 1, contiguous=True)                       # 4 words (decode/status.py)


def decode_swizzle(row, chunk, head_dim: int):
    """Byte offset of 16-byte chunk ``chunk`` of a K/V tile row: the chunk index XOR (row % 8), so
    the 8 rows one ``ldmatrix`` matrix reads sit in 8 different 16-byte bank groups."""
    return row * (head_dim * 2) + ((chunk ^ (row & 7)) << 4)


def stage_bytes(warp_keys: int, head_dim: int) -> int:
    """One warp's stage: a K and a V block of ``warp_keys`` rows."""
    return 2 * warp_keys * head_dim * 2


def merge_values(head_dim: int, row_tiles: int) -> int:
    """f32 values per lane that a warp leaves in shared memory for the merge: m, l (2 rows per M
    tile) and the O accumulators (head_dim / 2 per M tile)."""
    return row_tiles * (4 + head_dim // 2)


def smem_bytes(HEAD_DIM=128, WARPS=4, WARP_KEYS=16, STAGES=4, ROW_TILES=1, Q_SMEM=False, **_) -> int:
    """The rings (later the merge area), the Q tile (Q_SMEM), 16 bytes for the fused merge's flag."""
    ring = WARPS * STAGES * stage_bytes(WARP_KEYS, HEAD_DIM)
    merge = WARPS * merge_values(HEAD_DIM, ROW_TILES) * 32 * 4
    return max(ring, merge) + q_tile_bytes(HEAD_DIM, ROW_TILES, Q_SMEM) + 16


def q_tile_bytes(head_dim: int, row_tiles: int, q_smem: bool) -> int:
    return 16 * row_tiles * head_dim * 2 if q_smem else 0


# -- what the helpers read: plain holders built in the kernel ------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity, as the trace treats a plain holder
class Config:
    """The compile-time choices the helpers read (``attention_decode_fwd``'s constexprs, by name)."""

    dtype: Any
    head_dim: int
    warps: int = 4
    warp_keys: int = 16
    row_tiles: int = 1
    paged: bool = False
    split: bool = False

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def block_n(self) -> int:
        """Keys per CTA tile: every warp's block of it."""
        return self.warps * self.warp_keys


class Rows(NamedTuple):
    """The query rows of one CTA (IR values): row r = i * group + g is query position i of head
    h0 + g (the heads of one kv head's group), of batch entry b; the CTA has rows row0 ..
    row0 + 16 * ROW_TILES - 1 of n_rows = n_q * group (rows at or past n_rows do not exist)."""

    b: Any
    h0: Any
    group: Any
    n_q: Any
    n_rows: Any
    row0: Any
    n_heads: Any


class Cache(NamedTuple):
    """The K/V cache as one CTA reads it: ``k``, ``v`` (TensorArgs: (B, N_max, H_kv, D), or with
    PAGED pages (num_pages, page_size, H_kv, D)), the element offsets of the CTA's (batch entry, kv
    head) in each (PAGED: of its kv head in page 0), the block table, the batch entry b and the
    keys per page (i32; PAGED only)."""

    k: Any
    v: Any
    k_base: Any
    v_base: Any
    table: Any
    b: Any
    page_size: Any


class KeyBlock(NamedTuple):
    """A warp block of keys key0 .. key0 + WARP_KEYS - 1 of a sequence of kv_len keys, in source
    rows row0 .. (each clamped to row_cap)."""

    key0: Any
    row0: Any
    row_cap: Any
    kv_len: Any


class Dest(NamedTuple):
    """Where results go: ``out`` (B, n_q, H_q, D) in ``dtype``, ``lse`` (B, H_q, n_q) when
    ``return_lse``, the split partials ``o_part`` (rows, splits x D) and ``lse_part`` (rows, splits)."""

    out: Any
    lse: Any
    o_part: Any
    lse_part: Any
    dtype: Any
    return_lse: bool


def head_row(t, b, n, h):
    """The element offset of row (b, n, h) of a (B, N, H, D) tensor (64-bit; its column 0)."""
    return ty.cast(b, ty.i64) * t.stride[0] + ty.cast(n, ty.i64) * t.stride[1] + ty.cast(h, ty.i64) * t.stride[2]
