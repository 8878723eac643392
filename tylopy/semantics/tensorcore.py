"""The tensor cores' f32 accumulation, as measured on an H200 (mma.sync m16n8k16 and wgmma k16).

Each output element is c + sum_k a_k b_k over the 16 products of one instruction, computed as:

1. every product is exact; its alignment exponent is e(a_k) + e(b_k), the sum of the inputs'
   exponents (the product's significand is taken in [1, 4)); c's is e(c). e() is the exponent
   field's value (subnormals count as the smallest normal exponent); zero terms do not count;
2. all 17 terms are truncated toward zero to multiples of 2**(emax - 25), emax the largest
   alignment exponent;
3. the truncated terms are summed exactly and the sum is rounded toward zero to f32.

Fitted on 2.1 million outputs of random and adversarial tiles (wide exponent ranges, c large,
cancelling sums) of mma.sync bf16 and f16 and wgmma bf16: all bit-identical to the hardware
(tests/test_emulate_gpu.py re-checks it where a GPU is present). Not measured: NaN and infinite
inputs (the emulator falls back to the IEEE sum there) and overflow (rounding toward zero gives
the largest finite f32).
"""
from __future__ import annotations

import numpy as np

EMIN = {"bf16": -126, "f16": -14}
PRECISION = 25
_ZERO_EXP = -100_000


def _exponent(x: np.ndarray, emin: int) -> np.ndarray:
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(x)))
    return np.where(x == 0, _ZERO_EXP, np.maximum(e, emin))


def _round_toward_zero_f32(x: np.ndarray) -> np.ndarray:
    r = x.astype(np.float32)
    over = np.abs(r.astype(np.float64)) > np.abs(x)
    if over.any():
        r = np.where(over, np.nextafter(r, np.float32(0)), r)
    return r.astype(np.float32)


def mma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, dtype: str) -> np.ndarray:
    """D (M, N) f32 = A (M, 16) B (16, N) + C, with the hardware's alignment and truncation.

    ``a`` and ``b`` hold the 16-bit inputs as exact f32 values; ``c`` is f32 or None (D = A B).
    """
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    prods = a64[:, :, None] * b64[None, :, :]  # (M, K, N), exact
    emin = EMIN[dtype]
    ep = _exponent(a64, emin)[:, :, None] + _exponent(b64, emin)[None, :, :]
    ep = np.where(prods == 0, _ZERO_EXP, ep)
    emax = ep.max(axis=1)
    c64 = np.zeros(emax.shape) if c is None else c.astype(np.float64)
    emax = np.maximum(emax, _exponent(c64, -126))
    q = 2.0 ** np.maximum(emax - PRECISION, -1074)
    total = np.trunc(prods / q[:, None, :]).sum(axis=1) * q + np.trunc(c64 / q) * q
    finite = np.isfinite(prods).all(axis=1) & np.isfinite(c64)
    if not finite.all():
        total = np.where(finite, total, prods.sum(axis=1) + c64)
    return _round_toward_zero_f32(total)
