"""Lane-wise arithmetic, comparisons, conversions, shuffles and special registers.

The semantics are those of the LLVM lowering (``codegen/llvm.py``) as the NVPTX backend
emits them: integers wrap; ``div`` truncates toward zero and ``shr`` is arithmetic for signed
types; shifts by the width or more give 0 (or the sign, for arithmetic right shifts) as PTX's
clamped shifts do; float ``min``/``max`` ignore NaN (fminf/fmaxf); float ``cmp`` is ordered
except ``ne``; float-to-int conversion truncates and saturates (cvt.rzi, NaN gives 0); 16-bit
float conversions round to nearest even. Integer division by zero gives all ones (PTX's
result for div.u32), remainder by zero the dividend.
"""
from __future__ import annotations

import numpy as np

from ..ir.types import bf16, f32
from .errors import ProtocolError, UnsupportedOpError, lanes_text, where
from .program import handler
from .values import (LANES, WARP, bf16_to_f32, ex2_approx_ftz, f16_to_f32, f32_to_bf16, f32_to_f16, fma_f32,
                     lg2_approx_ftz, np_dtype, rcp_rn, rsqrt_approx_ftz, unsigned_of)


def _nonzero(b):
    return np.where(b == 0, np.ones_like(b), b)


def _sdiv(a, b):
    bs = _nonzero(b)
    q = np.floor_divide(a, bs)
    q = q + ((np.remainder(a, bs) != 0) & ((a < 0) ^ (bs < 0))).astype(a.dtype)
    return np.where(b == 0, np.array(-1, dtype=a.dtype), q).astype(a.dtype)


def _udiv(a, b):
    q = np.floor_divide(a, _nonzero(b))
    return np.where(b == 0, np.array(np.iinfo(a.dtype).max, dtype=a.dtype), q)


def _srem(a, b):
    return np.where(b == 0, a, np.fmod(a, _nonzero(b))).astype(a.dtype)


def _urem(a, b):
    return np.where(b == 0, a, np.remainder(a, _nonzero(b)))


def _shift(kind, bits):
    def fn(a, b):
        ub = b.view(unsigned_of(b.dtype)) if b.dtype.kind == "i" else b
        big = ub >= bits
        sh = np.minimum(ub, bits - 1).astype(a.dtype)
        if kind == "shl":
            return np.where(big, np.zeros_like(a), np.left_shift(a, sh))
        r = np.right_shift(a, sh)
        if a.dtype.kind == "i":
            return np.where(big, np.where(a < 0, np.array(-1, a.dtype), np.array(0, a.dtype)), r)
        return np.where(big, np.zeros_like(a), r)
    return fn


_FLOAT_BIN = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "rem": np.fmod,
              "min": np.fmin, "max": np.fmax}
_INT_BIN = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and, "or": np.bitwise_or,
            "xor": np.bitwise_xor, "min": np.minimum, "max": np.maximum}


def binary_fn(opcode: str, t):
    if t == bf16:
        raise UnsupportedOpError(f"{opcode} on bf16 values (codegen rejects it too): convert to f32 with ty.cast first")
    if t.is_float:
        return _FLOAT_BIN[opcode]
    if t.is_bool:
        return {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[opcode]
    if opcode in _INT_BIN:
        return _INT_BIN[opcode]
    if opcode in ("shl", "shr"):
        return _shift(opcode, t.bits)
    signed = t.is_signed
    return {"div": _sdiv if signed else _udiv, "rem": _srem if signed else _urem}[opcode]


@handler("add", "sub", "mul", "div", "rem", "and", "or", "xor", "shl", "shr", "min", "max")
def make_binary(prog, op):
    fn = binary_fn(op.opcode, op.operands[0].type)
    a, b = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = fn(env[a], env[b])
    return False, run


_UNARY_F32 = {"exp2": ex2_approx_ftz, "log2": lg2_approx_ftz, "rsqrt": rsqrt_approx_ftz, "rcp": rcp_rn,
              "sqrt": np.sqrt}


@handler("neg", "abs", "not", "exp2", "log2", "sqrt", "rsqrt", "rcp")
def make_unary(prog, op):
    t = op.operands[0].type
    name = op.opcode
    if t == bf16:
        raise UnsupportedOpError(f"{name} on bf16 at {where(op)}: convert to f32 with ty.cast first")
    if name in _UNARY_F32:
        fn = _UNARY_F32[name]
    elif name == "neg":
        fn = np.negative
    elif name == "abs":
        fn = np.abs
    else:
        fn = np.logical_not if t.is_bool else np.invert
    a, r = prog.slot(op.operands[0]), prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = fn(env[a])
    return False, run


@handler("fma")
def make_fma(prog, op):
    a, b, c = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)
    fn = fma_f32 if op.operands[0].type == f32 else (lambda x, y, z: x * y + z)  # f64: not fused (documented)

    def run(w):
        env = w.env
        env[r] = fn(env[a], env[b], env[c])
    return False, run


_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
        "ne": np.not_equal}


@handler("cmp")
def make_cmp(prog, op):
    if op.operands[0].type == bf16:
        raise UnsupportedOpError(f"cmp on bf16 at {where(op)}: convert to f32 with ty.cast first")
    fn = _CMP[op.attr("pred")]
    a, b = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = fn(env[a], env[b])
    return False, run


@handler("select")
def make_select(prog, op):
    c, a, b = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = np.where(env[c], env[a], env[b])
    return False, run


def _float_to_int(x, dt):
    info = np.iinfo(dt)
    y = np.trunc(x.astype(np.float64))
    y = np.where(np.isnan(y), 0.0, np.clip(y, float(info.min), float(info.max)))
    # float(info.max) may round up past the maximum for 64-bit types: clamp in the integer domain
    out = y.astype(np.float64)
    big = out >= float(info.max)
    res = out.astype(dt)
    return np.where(big, np.array(info.max, dtype=dt), res)


def _scalar_convert(src, dst):
    sdt, ddt = np_dtype(src), np_dtype(dst)
    if dst.is_bool:
        return lambda x: (x != 0) if src.is_float else (x & 1).astype(np.bool_)
    if src.is_float and dst.is_float:
        return lambda x: x.astype(ddt)
    if src.is_float:
        return lambda x: _float_to_int(x, ddt)
    return lambda x: x.astype(ddt)


def convert_fn(src, dst):
    """The conversion the LLVM lowering emits (bf16 goes through f32, as cvt.rn.bf16.f32 does)."""
    if src == bf16:
        if dst == f32:
            return bf16_to_f32
        if dst == bf16:
            return lambda x: x
        rest = _scalar_convert(f32, dst)
        return lambda x: rest(bf16_to_f32(x))
    if dst == bf16:
        if src == f32:
            return f32_to_bf16
        first = _scalar_convert(src, f32)
        return lambda x: f32_to_bf16(first(x))
    return _scalar_convert(src, dst)


@handler("convert")
def make_convert(prog, op):
    fn = convert_fn(op.operands[0].type, op.attr("to"))
    a, r = prog.slot(op.operands[0]), prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = fn(env[a])
    return False, run


@handler("bitcast")
def make_bitcast(prog, op):
    dt = np_dtype(op.attr("to"))
    a, r = prog.slot(op.operands[0]), prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = env[a].view(dt)
    return False, run


@handler("pack2")
def make_pack2(prog, op):
    to_half = f32_to_bf16 if op.attr("dtype") == bf16 else f32_to_f16
    lo, hi = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = to_half(env[lo]).astype(np.uint32) | (to_half(env[hi]).astype(np.uint32) << np.uint32(16))
    return False, run


@handler("unpack2")
def make_unpack2(prog, op):
    to_f32 = bf16_to_f32 if op.attr("dtype") == bf16 else f16_to_f32
    a = prog.slot(op.operands[0])
    lo, hi = (prog.slot(v) for v in op.results)

    def run(w):
        env = w.env
        x = env[a]
        env[lo] = to_f32((x & np.uint32(0xFFFF)).astype(np.uint16))
        env[hi] = to_f32((x >> np.uint32(16)).astype(np.uint16))
    return False, run


@handler("special")
def make_special(prog, op):
    reg = op.attr("reg")
    r = prog.slot(op.result)

    def run(w):
        w.env[r] = w.special(reg)
    return False, run


def check_converged(w, op, what: str):
    """A .sync.aligned instruction needs every living lane of the warp active."""
    if w.nactive != w.nalive:
        off = np.flatnonzero(w.alive & ~w.mask)
        raise ProtocolError(
            f"{what} at {where(op)} executed by a diverged warp: {w.describe()} has lanes {lanes_text(off)} "
            f"inactive here, but the instruction needs the whole warp (full member mask)")


@handler("shfl")
def make_shfl(prog, op):
    mode = op.attr("mode")
    v, b = (prog.slot(x) for x in op.operands)
    r = prog.slot(op.result)

    def run(w):
        check_converged(w, op, f"shfl.sync.{mode}")
        env = w.env
        bval = env[b].astype(np.int64) & 31
        if mode == "bfly":
            j, ok = LANES ^ bval, None
        elif mode == "up":
            j = LANES - bval
            ok = j >= 0
        elif mode == "down":
            j = LANES + bval
            ok = j <= 31
        else:
            j, ok = bval, None
        if ok is not None:
            j = np.where(ok, j, LANES)
        if w.nalive != WARP:
            dead = w.mask & ~w.alive[j]
            if dead.any():
                raise ProtocolError(f"shfl.sync.{mode} at {where(op)} reads lanes that do not exist in "
                                    f"{w.describe()} (the block's last warp is partial)")
        env[r] = env[v][j]
    return False, run


@handler("elect_one")
def make_elect_one(prog, op):
    r = prog.slot(op.result)

    def run(w):
        check_converged(w, op, "elect.sync")
        out = np.zeros(WARP, dtype=np.bool_)
        if w.nactive:
            out[int(np.argmax(w.mask))] = True
        w.env[r] = out
    return False, run


@handler("asm")
def make_asm(prog, op):
    template = (op.attr("template") or "").strip().splitlines()
    first = template[0] if template else ""

    def run(w):
        raise UnsupportedOpError(f"cannot emulate inline PTX at {where(op)}: {first!r}; the emulator runs "
                                 "tylopy IR ops only (use the ty.* / ty.hopper functions instead of inline_ptx)")
    return False, run
