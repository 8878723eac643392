"""Atomic read-modify-write operations on the CPU, as PTX's ``atom`` and ``red`` define them.

``combine_fn(op, kind)`` is the update ``new = op(old, value)`` of one memory element:

* ``add``: integers wrap; ``f32`` rounds to nearest even and keeps subnormals (shared memory);
  ``f32_ftz`` also flushes subnormal inputs and results to sign-preserving zero, which is what
  the ISA documents for ``atom/red.add.f32`` on global memory; ``f64`` rounds to nearest even;
  ``f16``/``bf16`` and the packed ``f16x2``/``bf16x2`` words (``.noftz``: subnormals kept) add
  each 16-bit half exactly and round once to nearest even. A NaN result is the canonical NaN
  (0x7FFFFFFF, 0x7FFF).
* ``min``/``max`` (signed or unsigned by the dtype), ``and``/``or``/``xor``, ``exch`` (the new
  value), ``cas`` (``value if old == compare else old``, comparing bits), ``inc``
  (``0 if old >= value else old + 1``) and ``dec`` (``value if old == 0 or old > value else
  old - 1``), unsigned 32-bit.

``apply_in_order`` applies a whole instruction's updates one element after the other, in the
order given (the emulator passes lanes in increasing ``%laneid`` order, warps in scheduling
order): each element sees the value the previous update to its address left. Updates to
different addresses are independent. The hardware serializes same-address updates in an
unspecified order, so an integer result is order-independent but a float sum is not; this
order is the emulator's, documented so that a test can reproduce it.
"""
from __future__ import annotations

import numpy as np

from .scalar import bf16_to_f32, f32_to_bf16, ftz

KINDS = ("i32", "u32", "i64", "u64", "b32", "b64", "f32", "f32_ftz", "f64", "f16", "bf16", "f16x2", "bf16x2")
_CANON_F32 = np.uint32(0x7FFFFFFF)
_CANON_HALF = np.uint16(0x7FFF)


def _canonical_f32(x: np.ndarray) -> np.ndarray:
    nan = np.isnan(x)
    if nan.any():
        x = np.where(nan, _CANON_F32.view(np.float32), x).astype(np.float32)
    return x


def _f64_to_f32_odd(x: np.ndarray) -> np.ndarray:
    """f64 to f32 rounding to odd (truncate, then set the last bit if inexact): rounding the
    result once more to bf16 (fewer than 22 bits) is then the correctly rounded bf16 of ``x``."""
    r = x.astype(np.float32)
    r64 = r.astype(np.float64)
    over = np.abs(r64) > np.abs(x)
    r = np.where(over & np.isfinite(x), np.nextafter(r, np.float32(0)), r).astype(np.float32)
    inexact = (r.astype(np.float64) != x) & np.isfinite(x)
    bits = r.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def add_f16_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """add.rn.f16 on raw bits (uint16): the f64 sum of two f16 values is exact; one rounding."""
    s = a.view(np.float16).astype(np.float64) + b.view(np.float16).astype(np.float64)
    out = s.astype(np.float16).view(np.uint16)
    return np.where(np.isnan(s), _CANON_HALF, out).astype(np.uint16)


def add_bf16_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """add.rn.bf16 on raw bits (uint16), correctly rounded (f64 sum, round-to-odd f32, then bf16)."""
    s = bf16_to_f32(a).astype(np.float64) + bf16_to_f32(b).astype(np.float64)
    out = f32_to_bf16(_f64_to_f32_odd(s))
    return np.where(np.isnan(s), _CANON_HALF, out).astype(np.uint16)


def add_packed(a: np.ndarray, b: np.ndarray, half: str) -> np.ndarray:
    """add.noftz.f16x2 / bf16x2 on b32 words (uint32): each 16-bit half on its own."""
    add = add_bf16_bits if half == "bf16" else add_f16_bits
    lo16, hi16 = np.uint32(0xFFFF), np.uint32(16)
    lo = add((a & lo16).astype(np.uint16), (b & lo16).astype(np.uint16))
    hi = add((a >> hi16).astype(np.uint16), (b >> hi16).astype(np.uint16))
    return lo.astype(np.uint32) | (hi.astype(np.uint32) << hi16)


def _add(kind: str):
    if kind == "f32":
        return lambda a, b: _canonical_f32(a + b)
    if kind == "f32_ftz":
        return lambda a, b: _canonical_f32(ftz(ftz(a) + ftz(b)))
    if kind == "f64":
        return np.add
    if kind == "f16":
        return lambda a, b: add_f16_bits(a.view(np.uint16), b.view(np.uint16)).view(np.float16)
    if kind == "bf16":
        return add_bf16_bits
    if kind in ("f16x2", "bf16x2"):
        half = kind[:-2]
        return lambda a, b: add_packed(a, b, half)
    return np.add  # integers: numpy arrays wrap


def _cas(a, cmp, v):
    return np.where(a.view(_unsigned(a)) == cmp.view(_unsigned(cmp)), v, a)


def _unsigned(x: np.ndarray):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize]


def _inc(a, b):
    return np.where(a >= b, np.zeros_like(a), a + np.ones_like(a))


def _dec(a, b):
    return np.where((a == 0) | (a > b), b, a - np.ones_like(a))


def combine_fn(op: str, kind: str):
    """``new = f(old, value)`` (``f(old, compare, value)`` for cas) on numpy arrays of the kind's dtype."""
    if kind not in KINDS:
        raise ValueError(f"atomic kind expects one of {', '.join(KINDS)}, but got {kind!r}")
    table = {"add": _add(kind), "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
             "or": np.bitwise_or, "xor": np.bitwise_xor, "exch": lambda a, b: b, "cas": _cas,
             "inc": _inc, "dec": _dec}
    fn = table.get(op)
    if fn is None:
        raise ValueError(f"atomic op expects one of {', '.join(table)}, but got {op!r}")
    return fn


def occurrences(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unique keys, index of each element's key, how many earlier elements share its key)."""
    uniq, inv = np.unique(keys, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    sorted_inv = inv[order]
    starts = np.searchsorted(sorted_inv, np.arange(len(uniq)))
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys)) - starts[sorted_inv]
    return uniq, inv, rank


def apply_in_order(fn, keys: np.ndarray, memory: np.ndarray, values: np.ndarray, compare=None):
    """Apply ``fn`` element after element (index order) to the memory values at ``keys``.

    ``memory[k]`` is the value at unique key ``k`` (in ``np.unique(keys)`` order) before the
    instruction. Returns (old value seen by each element, memory after the instruction).
    """
    uniq, inv, rank = occurrences(keys)
    cur = np.array(memory, copy=True)
    olds = np.empty(len(keys), dtype=cur.dtype)
    for r in range(int(rank.max()) + 1 if len(keys) else 0):
        sel = rank == r  # at most one element per key: a vector step
        k = inv[sel]
        olds[sel] = cur[k]
        args = (cur[k], values[sel]) if compare is None else (cur[k], compare[sel], values[sel])
        cur[k] = fn(*args)
    return olds, cur


__all__ = ["KINDS", "combine_fn", "apply_in_order", "occurrences", "add_f16_bits", "add_bf16_bits", "add_packed"]
