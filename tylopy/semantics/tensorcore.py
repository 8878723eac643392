"""The tensor cores' accumulation, as measured on an H200 (mma.sync and wgmma, 16-bit and FP8 inputs).

16-bit inputs (``mma_f32``; mma.sync m16n8k16 and wgmma k16), f32 accumulator. Each output
element is c + sum_k a_k b_k over the 16 products of one instruction, computed as:

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

FP8, wgmma k32 (``mma_fp8``): the same steps over the 32 products and c, with the products'
exponents from each input's own format (e4m3 and e5m2 may mix) and terms truncated to multiples
of 2**(emax - 13) (FP8_PRECISION). Then, by the accumulator's type:

* f32: the exact sum is truncated toward zero to 13 fraction bits (FP8_RESULT_BITS; an e8m13
  accumulator) and stored as f32;
* f16: the exact sum is rounded to nearest even f16, once (c is read exactly from f16).

FP8, mma.sync m16n8k32 (``mma_sync_fp8``): sm_90 has no FP8 mma.sync unit; ptxas (CUDA 13)
converts the codes to f16 (exact) and issues two HMMA.16816.F32, the first over k with
k % 4 in {0, 1} from zero, the second over k % 4 in {2, 3} onto the first's result, then adds
c with one f32 FADD (round to nearest even). Each HMMA is the 16-bit model above with f16
exponents (an e4m3 subnormal is a normal f16). A chain of mma.sync keeps this per instruction.

Measured on an H200 (tools/fp8_oracle_dump.py, random codes over the formats' whole range with
subnormals, signed zeros and cancellation, every e4m3/e5m2 mix): mma.sync 4,096 outputs, wgmma
with f32 accumulators 65,536 and with f16 accumulators 65,536 (chains of four k32 steps, c
given and zero): all bit-identical to these models (tests/test_fp8_tensorcore_replay.py replays
a subset; tests/test_fp8_wgmma_gpu.py and tests/test_fp8_conversions_gpu.py re-check on a GPU).
Not measured for FP8: NaN and infinite inputs and results past the accumulator's range (f16:
the model gives infinity).
"""
from __future__ import annotations

import numpy as np

EMIN = {"bf16": -126, "f16": -14, "e4m3": -6, "e5m2": -14}
PRECISION = 25
FP8_PRECISION = 13     # wgmma FP8: terms truncated to multiples of 2**(emax - 13)
FP8_RESULT_BITS = 13   # wgmma FP8, f32 accumulator: the sum truncated to 13 fraction bits
# mma.sync m16n8k32 FP8 on sm_90: the k of each of the two f16 HMMAs it is compiled into, in order
MMA_SYNC_FP8_HALVES = (np.flatnonzero(np.arange(32) % 4 < 2), np.flatnonzero(np.arange(32) % 4 >= 2))
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


def mma_fp8(a, b, c, dtypes: tuple, acc: str = "f32") -> np.ndarray:
    """wgmma k32: D (M, N) = A (M, 32) B (32, N) + C for fp8 inputs (``dtypes`` = (A's, B's) format names).

    ``acc`` "f32" gives f32; "f16" gives f16 values (as float32), C read exactly.
    """
    total = _aligned_sum(a, b, c, dtypes, FP8_PRECISION)
    if acc == "f16":
        return round_nearest_f16(total)
    return _round_toward_zero_f32(truncate_bits(total, FP8_RESULT_BITS))


def mma_sync_fp8(a, b, c) -> np.ndarray:
    """mma.sync m16n8k32: D (M, N) f32 = A (M, 32) B (32, N) + C (f32) for fp8 inputs, as sm_90 runs it:
    two chained f16 MMAs from zero (k % 4 < 2, then the rest), then one f32 addition of C.

    ``a`` and ``b`` hold the decoded codes (every fp8 value is exact in f16, so the formats do not
    matter past decoding).
    """
    d = None
    for ks in MMA_SYNC_FP8_HALVES:
        d = mma_f32(a[:, ks], b[ks], d, "f16")
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.asarray(c, np.float32) + d).astype(np.float32)


def round_nearest_f16(x: np.ndarray) -> np.ndarray:
    """float64 values to f16, once, to nearest even (past the largest finite: infinity), as float32."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float16).astype(np.float32)


def round_toward_zero_f16(x: np.ndarray) -> np.ndarray:
    """f32 values to f16 toward zero (overflow: the largest finite f16), as float32."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        r = x.astype(np.float16)
    over = np.abs(r.astype(np.float32)) > np.abs(x)
    r = np.where(over & np.isfinite(x), np.nextafter(r, np.float16(0)), r)
    return r.astype(np.float32)
