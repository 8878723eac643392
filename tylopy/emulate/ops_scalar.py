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
from .compiled import handler
from ..semantics.fp8 import pack_fp8, unpack_fp8
from ..semantics.scalar import (CMP, UnsupportedScalarOp, bf16_to_f32, binary_fn, convert_fn, f16_to_f32,
                                f32_to_bf16, f32_to_f16, fma_fn, unary_fn)
from .values import LANES, WARP, np_dtype


@handler("add", "sub", "mul", "div", "rem", "and", "or", "xor", "shl", "shr", "min", "max")
def make_binary(prog, op):
    try:
        fn = binary_fn(op.opcode, op.operands[0].type)
    except UnsupportedScalarOp as e:
        raise UnsupportedOpError(f"{e} (at {where(op)})") from None
    a, b = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = fn(env[a], env[b])
    return False, run


@handler("neg", "abs", "not", "exp2", "log2", "sqrt", "rsqrt", "rcp")
def make_unary(prog, op):
    t = op.operands[0].type
    try:
        fn = unary_fn(op.opcode, t)
    except UnsupportedScalarOp as e:
        raise UnsupportedOpError(f"{e} (at {where(op)})") from None
    a, r = prog.slot(op.operands[0]), prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = fn(env[a])
    return False, run


@handler("fma")
def make_fma(prog, op):
    a, b, c = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)
    fn = fma_fn(op.operands[0].type)

    def run(w):
        env = w.env
        env[r] = fn(env[a], env[b], env[c])
    return False, run


@handler("cmp")
def make_cmp(prog, op):
    if op.operands[0].type == bf16:
        raise UnsupportedOpError(f"cmp on bf16 at {where(op)}: convert to f32 with ty.cast first")
    fn = CMP[op.attr("pred")]
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


@handler("pack_fp8")
def make_pack_fp8(prog, op):
    fmt = op.attr("dtype").name
    srcs = [prog.slot(v) for v in op.operands]
    r = prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = pack_fp8([env[s] for s in srcs], fmt)
    return False, run


@handler("unpack_fp8")
def make_unpack_fp8(prog, op):
    fmt = op.attr("dtype").name
    a = prog.slot(op.operands[0])
    outs = [prog.slot(v) for v in op.results]

    def run(w):
        env = w.env
        for r, v in zip(outs, unpack_fp8(env[a], len(outs), fmt)):
            env[r] = v
    return False, run
