"""``tylopy.create_block_mask``: which (query tile, key tile) pairs a mask_mod leaves anything in.

    bm = tylopy.create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=q.device)
    out = tylopy.attention(q, k, v, block_mask=bm)          # mask_mod comes with the block mask

``mask_mod(b, h, q_idx, kv_idx) -> bool`` is evaluated on every (b, h, q, kv) with torch
(broadcast index tensors, in chunks of query rows, on ``device``); each BLOCK_SIZE x BLOCK_SIZE
tile is then *empty* (no pair takes part: skipped), *full* (every pair inside the lengths takes
part: the kernel does not evaluate mask_mod there) or *partial*. As FlexAttention's BlockMask:

* ``kv_num_blocks`` int32 (B, H, Q tiles): how many partial key tiles each query tile visits,
  ``kv_indices`` int32 (B, H, Q tiles, KV tiles): which, ascending in the first
  ``kv_num_blocks`` entries (the rest hold the other tiles' numbers and are never read);
* ``full_kv_num_blocks`` / ``full_kv_indices`` the same for the full tiles.

B or H may be 1 (a mask the same for every batch entry or head; pass ``None`` for it, as
FlexAttention). The result is cached per (mask_mod's code and captured values, captured
tensors' identities and versions, shapes, BLOCK_SIZE, device): calling it again for the same
mask is a dictionary lookup. A block mask used with other lengths, batch or heads is an error
naming ``block_mask``.
"""
from __future__ import annotations

import torch

from tylopy.runtime.plancache import PlanCache, identity_key

from tylopy_kernels.attention import variants as _variants

CHUNK_ELEMENTS = 1 << 26   # mask_mod evaluations per chunk of query rows (bounds the memory)
_cache = PlanCache("block masks", capacity=32)   # (mask_mod, sizes, captured ids) -> (BlockMask, captured)


class BlockMask:
    """Lists of full and partial key tiles per (batch, head, query tile); see the module text."""

    def __init__(self, mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE, kv_num_blocks, kv_indices, full_kv_num_blocks,
                 full_kv_indices):
        self.mask_mod = mask_mod
        self.B, self.H, self.Q_LEN, self.KV_LEN, self.BLOCK_SIZE = B, H, Q_LEN, KV_LEN, BLOCK_SIZE
        self.kv_num_blocks, self.kv_indices = kv_num_blocks, kv_indices
        self.full_kv_num_blocks, self.full_kv_indices = full_kv_num_blocks, full_kv_indices

    @property
    def shape(self):
        return (self.B, self.H, self.Q_LEN, self.KV_LEN)

    @property
    def device(self):
        return self.kv_num_blocks.device

    def __repr__(self):
        return (f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, "
                f"sparsity={100 * self.sparsity():.1f}%)")

    def sparsity(self) -> float:
        """The share of tiles skipped (neither full nor partial)."""
        tiles = self.kv_indices.shape[-1] * self.kv_num_blocks.numel()
        used = int(self.kv_num_blocks.sum()) + int(self.full_kv_num_blocks.sum())
        return 1.0 - used / max(tiles, 1)

    def check_shapes(self, B, H, n_q, n_k, device=None):
        """Raise naming ``block_mask`` unless it was built for these lengths (B and H, or 1)."""
        ok = (self.Q_LEN == n_q and self.KV_LEN == n_k and self.B in (1, B) and self.H in (1, H))
        if not ok:
            raise ValueError(f"attention: block_mask expects a mask built for (B, H, Q_LEN, KV_LEN) = "
                             f"({B} or 1, {H} or 1, {n_q}, {n_k}), but got one built for {self.shape}")
        if device is not None and self.device != device:
            raise ValueError(f"attention: block_mask expects a mask on the query's device {device}, but got one on "
                             f"{self.device}")

    def to_dense(self) -> torch.Tensor:
        """bool (B, H, Q tiles, KV tiles): 1 where the tile is listed (full or partial)."""
        full, partial = _tile_flags(self)
        return full | partial


def _tile_flags(bm):
    return _variants.tile_flags(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices)


def _key(mask_mod, B, H, Q_LEN, KV_LEN, device, BLOCK_SIZE):
    """(key, the captured tensors): a captured tensor counts by identity and version. The cache entry
    keeps the tensors themselves, and a hit must find the same objects: an id is only unique while its
    object lives, and a new tensor at a freed one's id must not get that tensor's block mask."""
    ref, tensors = _variants.mod_ref(mask_mod, "mask_mod", 0, False)
    key = (ref.code, ref.captured, identity_key(tensors), B, H, Q_LEN, KV_LEN, str(device), BLOCK_SIZE)
    return key, tuple(tensors)


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128, _compile=False):
    """The BlockMask of ``mask_mod`` over (B, H, Q_LEN, KV_LEN) (B, H: None means 1)."""
    B = 1 if B is None else B
    H = 1 if H is None else H
    for name, val in (("B", B), ("H", H), ("Q_LEN", Q_LEN), ("KV_LEN", KV_LEN), ("BLOCK_SIZE", BLOCK_SIZE)):
        if isinstance(val, bool) or not isinstance(val, int) or val < (1 if name != "Q_LEN" else 0):
            raise ValueError(f"create_block_mask: {name} expects a positive int, but got {val!r}")
    if not callable(mask_mod):
        raise TypeError(f"create_block_mask: mask_mod expects a function, but got {type(mask_mod).__name__}")
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key, captured = _key(mask_mod, B, H, Q_LEN, KV_LEN, device, BLOCK_SIZE)
    hit = _cache.get_held(key, captured)
    if hit is not None:
        return hit
    bm = _build(mask_mod, B, H, Q_LEN, KV_LEN, device, BLOCK_SIZE)
    _cache.put_held(key, bm, captured)
    return bm


def _build(mask_mod, B, H, Q_LEN, KV_LEN, device, BLOCK):
    n_qt, n_kt = -(-Q_LEN // BLOCK), -(-KV_LEN // BLOCK)
    any_t = torch.zeros((B, H, n_qt, n_kt), dtype=torch.bool, device=device)
    all_t = torch.ones((B, H, n_qt, n_kt), dtype=torch.bool, device=device)
    b, h, _, j = _variants.index_grids(B, H, 1, KV_LEN, device)
    kv_pad = n_kt * BLOCK - KV_LEN
    rows = max(BLOCK, (CHUNK_ELEMENTS // max(B * H * KV_LEN, 1)) // BLOCK * BLOCK)
    for q0 in range(0, Q_LEN, rows):
        q1 = min(Q_LEN, q0 + rows)
        i = torch.arange(q0, q1, device=device, dtype=torch.int64).view(1, 1, q1 - q0, 1)
        try:
            got = mask_mod(b, h, i, j)
        except Exception as e:  # noqa: BLE001 - named with the argument and the user's line
            err = _variants.ModError.from_exception("mask_mod", mask_mod, e)
            raise _variants.ModError(str(err).replace("attention:", "create_block_mask:", 1)) from e
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            raise _variants.ModError(f"create_block_mask: mask_mod expects a function returning bool"
                                     f"{_variants._where(mask_mod)}, but got "
                                     f"{getattr(got, 'dtype', type(got).__name__)}")
        got = got.expand(B, H, q1 - q0, KV_LEN)
        # ragged edges: pairs past the lengths are "don't care" (the kernel masks them anyway)
        pad_q = -(q1 - q0) % BLOCK
        for fill, acc, op in ((False, any_t, torch.amax), (True, all_t, torch.amin)):
            g = torch.nn.functional.pad(got, (0, kv_pad, 0, pad_q), value=fill)
            g = g.view(B, H, -1, BLOCK, n_kt, BLOCK)
            t = op(op(g, dim=5), dim=3)
            sl = slice(q0 // BLOCK, q0 // BLOCK + t.shape[2])
            acc[:, :, sl] = t
    full = all_t & any_t
    partial = any_t & ~all_t
    return BlockMask(mask_mod, B, H, Q_LEN, KV_LEN, BLOCK, *_lists(partial), *_lists(full))


def _lists(flags):
    """(counts int32 (B, H, Q tiles), indices int32 (B, H, Q tiles, KV tiles)): listed tiles first, ascending."""
    n_kt = flags.shape[-1]
    counts = flags.sum(-1, dtype=torch.int32)
    order = torch.arange(n_kt, device=flags.device).expand(flags.shape)
    # listed tiles sort before the rest; a stable sort keeps them ascending
    keyed = torch.where(flags, order, order + n_kt)
    idx = torch.sort(keyed, dim=-1, stable=True).values
    idx = torch.where(idx >= n_kt, idx - n_kt, idx)
    return counts.contiguous(), idx.to(torch.int32).contiguous()


__all__ = ["BlockMask", "create_block_mask"]
