"""Warp-wide votes, matches and reductions on the CPU, as PTX defines them (numpy, 32 lanes).

Arrays hold one entry per lane (index = ``%laneid``); ``members`` is a bool array of the lanes
that take part (the non-exited lanes of the full member mask ``0xffffffff``).

* ``vote.sync.all/any/uni``: every member's predicate true / at least one true / all members
  agree. ``vote.sync.ballot.b32``: bit ``i`` of the result is lane ``i``'s predicate (0 for a
  lane that does not take part).
* ``match.any.sync``: for each member, the mask of the members whose value has the same bits.
  ``match.all.sync``: the member mask if every member holds the same bits (and the predicate
  true), else 0 (and false). Values compare as bits, so ``0.0`` and ``-0.0`` differ.
* ``redux.sync``: add (wrapping at 32 bits), min, max (signed or unsigned), and, or, xor.
* ``butterfly``: the reduction order of ``ty.warp_reduce``: for ``d`` in 16, 8, 4, 2, 1 each
  lane combines its value with lane ``lane ^ d``'s, ``op(own, partner)``. With a commutative
  ``op`` every lane ends with the same bits; for floats this order fixes the rounding.
"""
from __future__ import annotations

import numpy as np

WARP = 32
FULL_MASK = 0xFFFFFFFF
BUTTERFLY_OFFSETS = (16, 8, 4, 2, 1)
_BITS = np.left_shift(np.uint64(1), np.arange(WARP, dtype=np.uint64))


def lane_mask(lanes: np.ndarray) -> int:
    """The 32-bit mask with bit ``i`` set where ``lanes[i]`` is true."""
    return int(np.bitwise_or.reduce(np.where(np.asarray(lanes, bool), _BITS, np.uint64(0))))


def ballot(pred: np.ndarray, members: np.ndarray) -> int:
    return lane_mask(np.asarray(pred, bool) & members)


def vote(mode: str, pred: np.ndarray, members: np.ndarray):
    """``vote.sync.<mode>``: a bool for all/any/uni, the ballot word (int) for ballot."""
    p = np.asarray(pred, bool)[members]
    if mode == "all":
        return bool(p.all())
    if mode == "any":
        return bool(p.any())
    if mode == "uni":
        return bool(p.all() or not p.any())
    if mode == "ballot":
        return ballot(pred, members)
    raise ValueError(f"vote mode expects all/any/uni/ballot, but got {mode!r}")


def _as_bits(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values)
    return v.view(np.uint64 if v.dtype.itemsize == 8 else np.uint32)


def match_any(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Per lane (uint32): the mask of member lanes holding the same bits (0 for non-members)."""
    bits = _as_bits(values)
    out = np.zeros(WARP, dtype=np.uint32)
    for v in np.unique(bits[members]):
        same = members & (bits == v)
        out[same] = lane_mask(same)
    return out


def match_all(values: np.ndarray, members: np.ndarray) -> tuple[int, bool]:
    """(mask, predicate): (``FULL_MASK``, True) if every member holds the same bits, else (0, False)."""
    bits = _as_bits(values)[members]
    uniform = bits.size == 0 or bool((bits == bits[0]).all())
    return (FULL_MASK if uniform else 0), uniform


def redux(op: str, values: np.ndarray, members: np.ndarray):
    """``redux.sync.<op>`` over the members' values (int32 or uint32 array); a numpy scalar."""
    v = np.asarray(values)[members]
    dt = np.asarray(values).dtype
    if op == "add":
        return np.array(int(v.astype(np.int64).sum()) & 0xFFFFFFFF, dtype=np.uint32).view(dt)[()]
    fn = {"min": np.min, "max": np.max, "and": np.bitwise_and.reduce, "or": np.bitwise_or.reduce,
          "xor": np.bitwise_xor.reduce}.get(op)
    if fn is None:
        raise ValueError(f"redux op expects add/min/max/and/or/xor, but got {op!r}")
    return dt.type(fn(v))


def butterfly(op, values: np.ndarray) -> np.ndarray:
    """``ty.warp_reduce``'s order: ``v = op(v, v[lane ^ d])`` for d = 16, 8, 4, 2, 1 (all lanes)."""
    v = np.asarray(values).copy()
    lanes = np.arange(WARP)
    for d in BUTTERFLY_OFFSETS:
        v = op(v, v[lanes ^ d])
    return v


__all__ = ["WARP", "FULL_MASK", "BUTTERFLY_OFFSETS", "lane_mask", "ballot", "vote", "match_any", "match_all",
           "redux", "butterfly"]
