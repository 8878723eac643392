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

FP8 (wgmma k32, mma.sync m16n8k32; ``mma_fp8``): the same steps over the 32 products and c,
with the products' exponents from each input's own format (e4m3 and e5m2 may mix), terms
truncated to multiples of 2**(emax - FP8_PRECISION) and the sum truncated toward zero to
FP8_RESULT_BITS fraction bits (an e8m13 accumulator, as published measurements of H100 FP8
GEMMs describe) before it is stored as f32. This model is NOT yet fitted on the H200:
tests/test_fp8_wgmma_gpu.py compares it with the GPU bit for bit and, when they differ, says
which (FP8_PRECISION, FP8_RESULT_BITS, FP8_GROUP) of the same family fit. f16 accumulators: the f32 model's value
(c read exactly from f16) truncated toward zero to f16, also unverified.
"""
from __future__ import annotations

import numpy as np

EMIN = {"bf16": -126, "f16": -14, "e4m3": -6, "e5m2": -14}
PRECISION = 25
FP8_PRECISION = 13
FP8_RESULT_BITS = 13
FP8_GROUP = 32   # k per aligned sum: 32 = the whole k32 step (16: two chained halves)
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


def _aligned_sum(a, b, c, dtypes, precision):
    """The exact sum of the truncated terms (M, N), before the final rounding."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    prods = a64[:, :, None] * b64[None, :, :]  # (M, K, N), exact
    ep = _exponent(a64, EMIN[dtypes[0]])[:, :, None] + _exponent(b64, EMIN[dtypes[1]])[None, :, :]
    ep = np.where(prods == 0, _ZERO_EXP, ep)
    emax = ep.max(axis=1)
    c64 = np.zeros(emax.shape) if c is None else c.astype(np.float64)
    emax = np.maximum(emax, _exponent(c64, -126))
    q = 2.0 ** np.maximum(emax - precision, -1074)
    with np.errstate(invalid="ignore", over="ignore"):
        total = np.trunc(prods / q[:, None, :]).sum(axis=1) * q + np.trunc(c64 / q) * q
        finite = np.isfinite(prods).all(axis=1) & np.isfinite(c64)
        if not finite.all():
            total = np.where(finite, total, prods.sum(axis=1) + c64)
    return total


def mma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, dtype: str) -> np.ndarray:
    """D (M, N) f32 = A (M, 16) B (16, N) + C, with the hardware's alignment and truncation.

    ``a`` and ``b`` hold the 16-bit inputs as exact f32 values; ``c`` is f32 or None (D = A B).
    """
    return _round_toward_zero_f32(_aligned_sum(a, b, c, (dtype, dtype), PRECISION))


def truncate_bits(x: np.ndarray, bits: int) -> np.ndarray:
    """float64 values truncated toward zero to ``bits`` fraction bits (normal range; inf/NaN kept)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.abs(x)))
        q = 2.0 ** np.maximum(e - bits, -1074)
        out = np.trunc(x / q) * q
    return np.where(np.isfinite(x) & (x != 0), out, x)


def mma_fp8(a, b, c, dtypes: tuple, acc: str = "f32", model: tuple | None = None) -> np.ndarray:
    """D (M, N) = A (M, K) B (K, N) + C for fp8 inputs (``dtypes`` = (A's, B's) format names).

    ``acc`` "f32" gives f32; "f16" gives f16 values (as float32), C read exactly. ``model`` =
    (precision, result bits[, group]) overrides (FP8_PRECISION, FP8_RESULT_BITS, FP8_GROUP): the GPU
    test's fitter; ``group`` < K sums the products in chained groups of that many k.
    """
    precision, result_bits, group = (tuple(model) + (FP8_GROUP,))[:3] if model else \
        (FP8_PRECISION, FP8_RESULT_BITS, FP8_GROUP)
    if group < a.shape[1]:
        d = c
        for k0 in range(0, a.shape[1], group):
            d = mma_fp8(a[:, k0:k0 + group], b[k0:k0 + group], d, dtypes, "f32", (precision, result_bits, group))
        return round_toward_zero_f16(d) if acc == "f16" else d
    total = truncate_bits(_aligned_sum(a, b, c, dtypes, precision), result_bits)
    d = _round_toward_zero_f32(total)
    if acc == "f16":
        return round_toward_zero_f16(d)
    return d


def round_toward_zero_f16(x: np.ndarray) -> np.ndarray:
    """f32 values to f16 toward zero (overflow: the largest finite f16), as float32."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        r = x.astype(np.float16)
    over = np.abs(r.astype(np.float32)) > np.abs(x)
    r = np.where(over & np.isfinite(x), np.nextafter(r, np.float16(0)), r)
    return r.astype(np.float32)
