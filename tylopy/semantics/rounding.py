"""Float ops and conversions with an explicit IEEE rounding direction, bit for bit as PTX does them.

PTX's ``.rn`` (nearest even), ``.rz`` (toward zero), ``.rm`` (toward -inf) and ``.rp`` (toward
+inf) on ``add/sub/mul/div/fma/sqrt`` and ``cvt`` (``.rni/.rzi/.rmi/.rpi`` for float -> int).
Without ``.ftz`` subnormals are kept, inputs and results alike.

How (f32): the round-to-nearest result ``r`` is computed as the plain ops do (so an explicit
"rn" is bit-identical to the default), then the sign of ``exact - r`` decides whether a directed
mode moves ``r`` one step (``nextafter``). The sign is exact: the sum of two f32 is ``s + e``
(TwoSum in f64), a product of two f32 is exact in f64, the quotient's sign comes from the
residual ``a - r b`` (``r b`` exact in f64), the square root's from ``x - r r``. Rounding f64 to
f32 in between is innocuous for +, -, *, /, sqrt (53 >= 2 * 24 + 2). f64 ops use exact rationals
(``fractions.Fraction``) per element: slower, and only what a kernel asks for explicitly.

Special cases, as IEEE 754 and PTX give them: a finite exact result beyond the largest finite
value rounds to it (rz, and rm/rp toward zero) or to infinity; an exact zero sum is +0, or -0
under rm (x + x keeps x's sign); infinities and NaN pass through unchanged.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from .scalar import f32_to_bf16, f32_to_f16, fma_f32

MODES = ("rn", "rz", "rm", "rp")
_INF = {np.dtype(np.float16): np.float16(np.inf), np.dtype(np.float32): np.float32(np.inf),
        np.dtype(np.float64): np.float64(np.inf)}


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"rounding expects one of {', '.join(MODES)}, but got {mode!r}")
    return mode


def direct(r: np.ndarray, sign: np.ndarray, mode: str) -> np.ndarray:
    """Move the nearest-even result ``r`` one step where ``mode`` and ``sign = sign(exact - r)`` say.

    ``sign`` is -1, 0 or +1 per element (0 where ``r`` is exact or must not move).
    """
    if mode == "rn":
        return r
    inf = _INF[r.dtype]
    if mode == "rm":
        move, toward = sign < 0, -inf
    elif mode == "rp":
        move, toward = sign > 0, inf
    else:  # rz: only where r lies farther from zero than the exact value
        move = ((sign > 0) & (r < 0)) | ((sign < 0) & (r > 0))
        toward = np.zeros((), r.dtype)
    if not move.any():
        return r
    return np.where(move, np.nextafter(r, toward), r).astype(r.dtype)


def _sign(x) -> np.ndarray:
    return np.sign(x).astype(np.int8)


def _overflow_sign(r, finite_inputs) -> np.ndarray:
    """Where finite inputs rounded to +-inf, the exact value lies on the finite side."""
    return np.where(finite_inputs & np.isinf(r), -_sign(np.where(np.isinf(r), r, 0)), 0).astype(np.int8)


def _zero_sum_sign(r, x, y, mode, exact_zero):
    """An exact zero sum x + y is +0, or -0 under rm, unless both terms are zeros of one sign."""
    if mode != "rm":
        return r
    zero = exact_zero & (r == 0) & ~((x == 0) & (y == 0) & (np.signbit(x) == np.signbit(y)))
    return np.where(zero, np.float32(-0.0).astype(r.dtype), r).astype(r.dtype)


# -- f32 arithmetic -----------------------------------------------------------------------------------

def _f32(*xs):
    return tuple(np.asarray(x, dtype=np.float32) for x in xs)


def _sum_sign(s, e, r, finite):
    """sign(s + e - r) for the f64 pair (s, e) and the f32 result r (exact)."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = s - r.astype(np.float64)
        sign = np.where(finite & np.isfinite(r), _sign(d + e), 0).astype(np.int8)
    return sign | _overflow_sign(r, finite)


def add_f32(a, b, mode: str) -> np.ndarray:
    """add.{mode}.f32 (``sub`` is ``add(a, -b)``: IEEE defines it so)."""
    a, b = _f32(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        s = a64 + b64
        bb = s - a64
        e = (a64 - (s - bb)) + (b64 - bb)
        r = np.add(a, b)
    if mode == "rn":
        return r
    finite = np.isfinite(a) & np.isfinite(b)
    sign = _sum_sign(s, e, r, finite)
    return _zero_sum_sign(direct(r, sign, mode), a, b, mode, sign == 0)


def sub_f32(a, b, mode: str) -> np.ndarray:
    a, b = _f32(a, b)
    if mode == "rn":
        with np.errstate(invalid="ignore", over="ignore"):
            return np.subtract(a, b)
    return add_f32(a, -b, mode)


def mul_f32(a, b, mode: str) -> np.ndarray:
    a, b = _f32(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.multiply(a, b)
        if mode == "rn":
            return r
        p = a.astype(np.float64) * b.astype(np.float64)  # exact
        finite = np.isfinite(a) & np.isfinite(b)
        sign = np.where(finite & np.isfinite(r), _sign(p - r.astype(np.float64)), 0).astype(np.int8)
    return direct(r, sign | _overflow_sign(r, finite), mode)


def div_f32(a, b, mode: str) -> np.ndarray:
    a, b = _f32(a, b)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        r = np.divide(a, b)  # correctly rounded
        if mode == "rn":
            return r
        finite = np.isfinite(a) & np.isfinite(b) & (b != 0)
        resid = a.astype(np.float64) - r.astype(np.float64) * b.astype(np.float64)  # sign exact
        sign = np.where(finite & np.isfinite(r), _sign(resid) * _sign(b), 0).astype(np.int8)
    return direct(r, sign | _overflow_sign(r, finite), mode)


def fma_f32_rounded(a, b, c, mode: str) -> np.ndarray:
    a, b, c = _f32(a, b, c)
    r = fma_f32(a, b, c)
    if mode == "rn":
        return r
    with np.errstate(invalid="ignore", over="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)
        c64 = c.astype(np.float64)
        s = p + c64
        bb = s - p
        e = (p - (s - bb)) + (c64 - bb)
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    sign = _sum_sign(s, e, r, finite)
    return _zero_sum_sign(direct(r, sign, mode), p, c, mode, sign == 0)  # p: exact, signed


def sqrt_f32(x, mode: str) -> np.ndarray:
    (x,) = _f32(x)
    with np.errstate(invalid="ignore"):
        r = np.sqrt(x.astype(np.float64)).astype(np.float32)
        if mode == "rn":
            return r
        ok = np.isfinite(x) & (x > 0)
        r64 = r.astype(np.float64)
        sign = np.where(ok, _sign(x.astype(np.float64) - r64 * r64), 0).astype(np.int8)
    return direct(r, sign, mode)


# -- f64 arithmetic: exact rationals per element -------------------------------------------------------

def _round_fraction(q: Fraction, mode: str) -> float:
    """The f64 nearest ``q`` in ``mode`` (``float(Fraction)`` rounds to nearest even)."""
    try:
        r = float(q)
    except OverflowError:
        r = float("inf") if q > 0 else float("-inf")
    exact = Fraction(r) if np.isfinite(r) else None
    sign = (1 if q > exact else -1 if q < exact else 0) if exact is not None else (-1 if r > 0 else 1)
    return float(direct(np.array([r]), np.array([sign], np.int8), mode)[0])


def _f64_op(fn, arrays, mode: str, zero_terms=None):
    arrays = [np.asarray(x, dtype=np.float64) for x in arrays]
    shape = np.broadcast(*arrays).shape
    flat = [np.broadcast_to(x, shape).ravel() for x in arrays]
    out = np.empty(int(np.prod(shape)), dtype=np.float64)
    for i in range(out.size):
        xs = [float(x[i]) for x in flat]
        if not all(np.isfinite(xs)):
            out[i] = fn(*map(np.float64, xs), plain=True)
            continue
        q = fn(*map(Fraction, xs), plain=False)
        if q is None:  # division by zero
            out[i] = fn(*map(np.float64, xs), plain=True)
            continue
        r = _round_fraction(q, mode)
        if r == 0 and q == 0:
            r = _exact_zero(xs, zero_terms, mode, fn)
        out[i] = r
    return out.reshape(shape)


def _exact_zero(xs, zero_terms, mode, fn):
    if zero_terms is None:  # products, quotients: the sign of the plain result
        with np.errstate(all="ignore"):
            return float(fn(*map(np.float64, xs), plain=True))
    x, y = zero_terms(*xs)
    if mode == "rm":
        return 0.0 if (x == 0 and y == 0 and not np.signbit(x) and not np.signbit(y)) else -0.0
    return -0.0 if (x == 0 and y == 0 and np.signbit(x) and np.signbit(y)) else 0.0


def _add(a, b, plain):
    return np.float64(a) + np.float64(b) if plain else a + b


def _mul(a, b, plain):
    return np.float64(a) * np.float64(b) if plain else a * b


def _div(a, b, plain):
    if plain:
        with np.errstate(all="ignore"):
            return np.float64(a) / np.float64(b)
    return None if b == 0 else a / b


def _fma(a, b, c, plain):
    return np.float64(a) * np.float64(b) + np.float64(c) if plain else a * b + c


def binary_f64(opcode: str, a, b, mode: str) -> np.ndarray:
    if opcode == "sub":
        return binary_f64("add", a, -np.asarray(b, dtype=np.float64), mode)
    fn = {"add": _add, "mul": _mul, "div": _div}[opcode]
    terms = (lambda x, y: (x, y)) if opcode == "add" else None
    return _f64_op(fn, (a, b), mode, terms)


def fma_f64(a, b, c, mode: str) -> np.ndarray:
    return _f64_op(_fma, (a, b, c), mode, lambda x, y, z: (np.float64(x) * np.float64(y), z))


def binary(opcode: str, dtype: np.dtype, mode: str):
    """The numpy function of ``opcode`` (add/sub/mul/div) on ``dtype`` (f32/f64) with ``mode``.

    An explicit "rn" on f32 is the plain op (PTX's add.f32 is add.rn.f32); on f64 it is the
    exact-rational path, like the other modes."""
    check_mode(mode)
    if np.dtype(dtype) == np.float64:
        return lambda a, b: binary_f64(opcode, a, b, mode)
    fn = {"add": add_f32, "sub": sub_f32, "mul": mul_f32, "div": div_f32}[opcode]
    return lambda a, b: fn(a, b, mode)


def fma(dtype: np.dtype, mode: str):
    check_mode(mode)
    if np.dtype(dtype) == np.float64:
        return lambda a, b, c: fma_f64(a, b, c, mode)
    return lambda a, b, c: fma_f32_rounded(a, b, c, mode)


# -- conversions ----------------------------------------------------------------------------------------

def float_to_f16(x, mode: str) -> np.ndarray:
    """cvt.{mode}.f16.{f32,f64} as raw bits (NaN: the canonical 0x7FFF)."""
    x = np.asarray(x)
    nan = np.isnan(x)
    with np.errstate(over="ignore"):
        r = x.astype(np.float16) if x.dtype == np.float64 else f32_to_f16(x).view(np.float16)
    if mode != "rn":
        with np.errstate(invalid="ignore", over="ignore"):
            finite = np.isfinite(x)
            sign = np.where(finite & np.isfinite(r), _sign(x.astype(np.float64) - r.astype(np.float64)), 0)
            r = direct(r, sign.astype(np.int8) | _overflow_sign(r, finite), mode)
    bits = r.view(np.uint16)
    return np.where(nan, np.uint16(0x7FFF), bits).astype(np.uint16)


def f32_to_bf16_rounded(x, mode: str) -> np.ndarray:
    """cvt.{mode}.bf16.f32 as raw bits: directed modes truncate the low 16 bits, then step away
    from zero where the value was inexact and the direction asks for it."""
    x = np.asarray(x, dtype=np.float32)
    if mode == "rn":
        return f32_to_bf16(x)
    bits = x.view(np.uint32)
    hi = (bits >> np.uint32(16)).astype(np.uint16)
    inexact = (bits & np.uint32(0xFFFF)) != 0
    neg = np.signbit(x)
    up = inexact & ((mode == "rp") & ~neg | (mode == "rm") & neg)
    out = np.where(up, hi + np.uint16(1), hi).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FFF), out).astype(np.uint16)


def f64_to_f32(x, mode: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        r = x.astype(np.float32)
        if mode == "rn":
            return r
        finite = np.isfinite(x)
        sign = np.where(finite & np.isfinite(r), _sign(x - r.astype(np.float64)), 0).astype(np.int8)
    return direct(r, sign | _overflow_sign(r, finite), mode)


def f64_to_bf16(x, mode: str) -> np.ndarray:
    """cvt.{mode}.bf16.f64: directed modes compose through f32 exactly; rn rounds to f32 *to odd*
    first (which is innocuous for a second rounding to 8 bits), then to nearest even."""
    x = np.asarray(x, dtype=np.float64)
    if mode != "rn":
        return f32_to_bf16_rounded(f64_to_f32(x, mode), mode)
    r = f64_to_f32(x, "rz")
    with np.errstate(invalid="ignore"):
        inexact = np.isfinite(x) & (r.astype(np.float64) != x)
    bits = r.view(np.uint32) | inexact.astype(np.uint32)
    return f32_to_bf16(bits.view(np.float32))


def _to_objects(x) -> np.ndarray:
    return np.asarray(x).astype(object)


def int_to_float(x, dtype: np.dtype, mode: str) -> np.ndarray:
    """cvt.{mode}.{f16,f32,f64}.{s,u}{8..64} (f16 as raw bits)."""
    x = np.asarray(x)
    target = np.dtype(dtype)
    with np.errstate(over="ignore"):
        r = x.astype(np.float32).astype(np.float16) if target == np.float16 else x.astype(target)
    if mode != "rn":
        exact = _to_objects(x)
        approx = np.where(np.isinf(r), 0, r).astype(np.float64).astype(object)
        # every float in question is an integer (or the value is exact): compare as Python ints
        sign = np.array([(xi > int(ai)) - (xi < int(ai)) for xi, ai in zip(exact.ravel(), approx.ravel())],
                        dtype=np.int8).reshape(r.shape)
        sign = np.where(np.isinf(r), -_sign(r), sign).astype(np.int8)
        r = direct(r, sign, mode)
    return r.view(np.uint16) if target == np.float16 else r


def int_to_bf16(x, mode: str) -> np.ndarray:
    """cvt.{mode}.bf16.{s,u}{8..64}: through f64 exactly for |x| < 2**53, else through the exact value."""
    x = np.asarray(x)
    r = int_to_float(x, np.float64, "rz")
    inexact = np.array([int(xi) != int(ri) for xi, ri in zip(_to_objects(x).ravel(), r.ravel())]).reshape(r.shape)
    if mode == "rn":  # round to odd, then nearest: innocuous (53 >= 8 + 2)
        bits = r.view(np.uint64) | inexact.astype(np.uint64)
        return f64_to_bf16(bits.view(np.float64), "rn")
    r = np.where(inexact & (mode == "rp") & (x > 0) | inexact & (mode == "rm") & (x < 0),
                 np.nextafter(r, np.where(x > 0, np.inf, -np.inf)), r)
    return f64_to_bf16(r, mode)


def float_to_int(x, dtype: np.dtype, mode: str) -> np.ndarray:
    """cvt.{rni,rzi,rmi,rpi}.{s,u}{8..64}.{f32,f64}: round to an integer, saturate, NaN gives 0."""
    x = np.asarray(x)
    rnd = {"rn": np.rint, "rz": np.trunc, "rm": np.floor, "rp": np.ceil}[mode]
    y = rnd(x.astype(np.float64))
    dt = np.dtype(dtype)
    info = np.iinfo(dt)
    with np.errstate(invalid="ignore"):
        y = np.where(np.isnan(y), 0.0, np.clip(y, float(info.min), float(info.max)))
        big = y >= float(info.max)
        out = np.where(big, 0, y).astype(dt)
    return np.where(big, np.array(info.max, dtype=dt), out)


def convert(src, dst, mode: str):
    """The numpy function of ``cvt.{mode}`` from IR type ``src`` to ``dst`` on the emulator's
    representations (bf16 as uint16 bits, f16 as float16)."""
    from ..ir.types import bf16, f16, f32, f64
    from .scalar import bf16_to_f32, scalar_dtype
    check_mode(mode)
    if src == bf16:
        rest = convert(f32, dst, mode)
        return lambda x: rest(bf16_to_f32(x))
    if src == f16 and dst == bf16:
        return lambda x: f32_to_bf16_rounded(np.asarray(x).astype(np.float32), mode)
    if src.is_float and dst.is_float:
        if dst == f16:
            return lambda x: float_to_f16(x, mode).view(np.float16)
        if dst == bf16:
            return (lambda x: f64_to_bf16(x, mode)) if src == f64 else (lambda x: f32_to_bf16_rounded(x, mode))
        return lambda x: f64_to_f32(x, mode)  # f64 -> f32, the only narrowing left
    if src.is_float:
        return lambda x: float_to_int(x, scalar_dtype(dst), mode)
    if dst == bf16:
        return lambda x: int_to_bf16(x, mode)
    if dst == f16:
        return lambda x: int_to_float(x, np.float16, mode).view(np.float16)
    return lambda x: int_to_float(x, scalar_dtype(dst), mode)


def sqrt(mode: str):
    check_mode(mode)
    return lambda x: sqrt_f32(x, mode)
