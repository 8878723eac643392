"""The opcode table: for each opcode, the rule that checks its operands and gives its results.

Each rule takes the operand types and the attributes and returns the result types, or raises
``OpTypeError`` with a message in the form "X expects A, but got B". The builder calls the
rule as each op is built (so the error points at the kernel line that built it); the verifier
calls it again over a finished kernel.
"""
from __future__ import annotations

from typing import Callable

from .types import (PointerType, ScalarType, TensorMapType, Type, b32, f16, bf16, f32, i1, i32, i64,
                    u32, u64)


class OpTypeError(Exception):
    """An op was built with operands or attributes its rule rejects."""


def _expect(cond: bool, message: str):
    if not cond:
        raise OpTypeError(message)


def _same(op: str, ts) -> Type:
    _expect(all(t == ts[0] for t in ts), f"{op} expects operands of one type, but got {', '.join(map(str, ts))}")
    return ts[0]


def _scalar(op: str, t: Type, what: str = "operand") -> ScalarType:
    _expect(isinstance(t, ScalarType), f"{op} expects a scalar {what}, but got {t}")
    return t


def _binary(op):
    def rule(ts, attrs):
        _expect(len(ts) == 2, f"{op} expects 2 operands, but got {len(ts)}")
        t = _scalar(op, _same(op, ts))
        if op in ("and", "or", "xor"):
            _expect(t.is_int or t.is_bool, f"{op} expects integer or bool operands, but got {t}")
        elif op in ("shl", "shr", "rem"):
            _expect(t.is_int, f"{op} expects integer operands, but got {t}")
        else:
            _expect(not t.is_bool and t.kind != "bits", f"{op} expects numeric operands, but got {t}")
            if t.is_float:
                _expect(t in (f32, f16, bf16) or t.bits == 64, f"{op} on {t}")
        return (t,)
    return rule


def _unary(op, float_only=False):
    def rule(ts, attrs):
        _expect(len(ts) == 1, f"{op} expects 1 operand, but got {len(ts)}")
        t = _scalar(op, ts[0])
        if float_only:
            _expect(t == f32, f"{op} expects an f32 operand, but got {t}")
        elif op == "not":
            _expect(t.is_int or t.is_bool, f"not expects an integer or bool operand, but got {t}")
        else:
            _expect(t.is_float or t.kind == "int", f"{op} expects a signed or float operand, but got {t}")
        return (t,)
    return rule


def _const(ts, attrs):
    _expect(not ts, "const takes no operands")
    t = attrs["type"]
    _expect(isinstance(t, ScalarType), f"const expects a scalar type, but got {t}")
    return (t,)


def _cmp(ts, attrs):
    _expect(len(ts) == 2, f"cmp expects 2 operands, but got {len(ts)}")
    t = _scalar("cmp", _same("compare", ts))
    _expect(attrs["pred"] in ("lt", "le", "gt", "ge", "eq", "ne"), f"cmp pred {attrs['pred']!r}")
    return (i1,)


def _select(ts, attrs):
    _expect(len(ts) == 3, "select expects (cond, a, b)")
    _expect(ts[0] == i1, f"select expects an i1 condition, but got {ts[0]}")
    return (_same("select", ts[1:]),)


def _fma(ts, attrs):
    _expect(len(ts) == 3, "fma expects 3 operands")
    t = _same("fma", ts)
    _expect(t in (f32,) or getattr(t, "bits", 0) == 64 and t.is_float, f"fma expects f32 operands, but got {t}")
    return (t,)


def _convert(ts, attrs):
    src = _scalar("convert", ts[0])
    dst = attrs["to"]
    _expect(isinstance(dst, ScalarType) and dst.kind != "bits", f"convert expects a numeric target type, but got {dst}")
    return (dst,)


def _bitcast(ts, attrs):
    src = _scalar("bitcast", ts[0])
    dst = attrs["to"]
    _expect(isinstance(dst, ScalarType) and dst.bits == src.bits,
            f"bitcast expects a target of {src.bits} bits, but got {dst}")
    return (dst,)


def _pack2(ts, attrs):
    _expect(len(ts) == 2 and all(t == f32 for t in ts), f"pack2 expects two f32 values, but got {', '.join(map(str, ts))}")
    _expect(attrs["dtype"] in (f16, bf16), f"pack2 expects dtype f16 or bf16, but got {attrs['dtype']}")
    return (b32,)


def _unpack2(ts, attrs):
    _expect(len(ts) == 1 and ts[0] == b32, f"unpack2 expects one b32 word, but got {', '.join(map(str, ts))}")
    _expect(attrs["dtype"] in (f16, bf16), f"unpack2 expects dtype f16 or bf16, but got {attrs['dtype']}")
    return (f32, f32)


def _ptr_add(ts, attrs):
    _expect(len(ts) == 2 and isinstance(ts[0], PointerType), f"pointer arithmetic expects (pointer, integer), but got {ts}")
    _expect(isinstance(ts[1], ScalarType) and ts[1].is_int, f"pointer offset expects an integer, but got {ts[1]}")
    return (ts[0],)


def _ptr_cast(ts, attrs):
    _expect(len(ts) == 1 and isinstance(ts[0], PointerType), f"ptr_cast expects a pointer, but got {ts}")
    to = attrs["to"]
    _expect(isinstance(to, PointerType), f"ptr_cast expects a pointer type, but got {to}")
    src = ts[0]
    _expect(src.space == to.space or "generic" in (src.space, to.space),
            f"ptr_cast from {src.space} to {to.space} memory is not allowed (only to and from generic)")
    return (to,)


def _ptr_to_int(ts, attrs):
    _expect(len(ts) == 1 and isinstance(ts[0], (PointerType, TensorMapType)), f"ptr_to_int expects a pointer, but got {ts}")
    t = ts[0]
    width = u32 if isinstance(t, PointerType) and t.space == "shared" else u64
    return (width,)


def _load(ts, attrs):
    _expect(len(ts) in (1, 2), "load expects (pointer[, mask])")
    p = ts[0]
    _expect(isinstance(p, PointerType), f"load expects a pointer, but got {p}")
    _expect(p.space in ("global", "shared", "generic"), f"load expects global, shared or generic memory, but got {p.space}")
    vec = attrs.get("vec", 1)
    _expect(vec in (1, 2, 4, 8), f"load vec expects 1, 2, 4 or 8, but got {vec}")
    _expect(p.pointee.bits * vec <= 128, f"load of {vec}x{p.pointee} exceeds 16 bytes")
    if len(ts) == 2:
        _expect(ts[1] == i1, f"load mask expects i1, but got {ts[1]}")
    return (p.pointee,) * vec


def _store(ts, attrs):
    _expect(len(ts) >= 2, "store expects (pointer, value...)")
    p = ts[0]
    _expect(isinstance(p, PointerType), f"store expects a pointer, but got {p}")
    _expect(p.space in ("global", "shared", "generic"), f"store expects global, shared or generic memory, but got {p.space}")
    for t in ts[1:]:
        _expect(t == p.pointee, f"store to {p} expects {p.pointee} values, but got {t}")
    _expect(len(ts) - 1 in (1, 2, 4, 8), "store vector width must be 1, 2, 4 or 8")
    return ()


SPECIAL_REGS = ("tid.x", "tid.y", "tid.z", "ntid.x", "ntid.y", "ntid.z", "ctaid.x", "ctaid.y", "ctaid.z",
                "nctaid.x", "nctaid.y", "nctaid.z", "laneid", "warpid", "clock", "globaltimer_lo")


def _special(ts, attrs):
    _expect(attrs["reg"] in SPECIAL_REGS, f"special register expects one of {SPECIAL_REGS}, but got {attrs['reg']!r}")
    return (u32,) if attrs["reg"] in ("clock", "globaltimer_lo") else (i32,)


def _shfl(ts, attrs):
    _expect(len(ts) == 2, "shfl expects (value, lane)")
    _expect(ts[0] in (i32, f32, u32, b32), f"shfl expects a 32-bit value, but got {ts[0]}")
    _expect(ts[1] in (i32, u32), f"shfl lane expects i32, but got {ts[1]}")
    _expect(attrs["mode"] in ("bfly", "idx", "up", "down"), f"shfl mode {attrs['mode']!r}")
    return (ts[0],)


def _none(n_operands=0):
    def rule(ts, attrs):
        _expect(len(ts) == n_operands, f"expects {n_operands} operands, but got {len(ts)}")
        return ()
    return rule


def _barrier(ts, attrs):
    _expect(len(ts) <= 1, "a barrier takes at most one operand (a run-time id)")
    if ts:
        _expect(ts[0] in (i32, u32), f"barrier id expects i32, but got {ts[0]}")
    else:
        _expect(isinstance(attrs.get("id"), int), "a barrier needs an id")
    return ()


def _asm(ts, attrs):
    return tuple(attrs["results"])


def _shared_ptr(ts, attrs):
    return (attrs["type"],)


def _passthrough(ts, attrs):
    return tuple(ts)


def _mbar(n, result=()):
    def rule(ts, attrs):
        _expect(len(ts) == n, f"expects {n} operands, but got {len(ts)}")
        _expect(isinstance(ts[0], PointerType) and ts[0].space == "shared" and ts[0].pointee == u64,
                f"mbarrier expects a ptr<u64, shared>, but got {ts[0]}")
        for t in ts[1:]:
            _expect(t in (i32, u32), f"mbarrier operand expects i32, but got {t}")
        return result
    return rule


def _tma_load(ts, attrs):
    rank = attrs["rank"]
    _expect(len(ts) == 3 + rank, f"tma_load expects (dst, tensormap, mbarrier, {rank} coordinates)")
    _expect(isinstance(ts[0], PointerType) and ts[0].space == "shared", f"tma_load destination expects shared memory, but got {ts[0]}")
    _expect(isinstance(ts[1], TensorMapType), f"tma_load expects a tensormap, but got {ts[1]}")
    _expect(isinstance(ts[2], PointerType) and ts[2].pointee == u64, f"tma_load expects an mbarrier ptr<u64, shared>, but got {ts[2]}")
    for t in ts[3:]:
        _expect(t == i32, f"tma_load coordinates expect i32, but got {t}")
    return ()


def _wgmma(ts, attrs):
    """Operands: [n/2 f32 accumulators unless zero_init], A (desc u64 or 4 b32), desc_b u64, [scale_d i1]."""
    n = attrs["n"]
    nacc = n // 2
    kind = attrs["a_kind"]
    _expect(kind in ("ss", "rs"), f"wgmma a_kind expects 'ss' or 'rs', but got {kind!r}")
    _expect(attrs["dtype"] in ("bf16", "f16"), f"wgmma dtype expects bf16 or f16, but got {attrs['dtype']!r}")
    _expect(n % 8 == 0 and 8 <= n <= 256, f"wgmma N expects a multiple of 8 in 8..256, but got {n}")
    zero = attrs.get("zero_init", False)
    na = 4 if kind == "rs" else 1
    want = (0 if zero else nacc) + na + 1 + (0 if zero else 1)
    _expect(len(ts) == want, f"wgmma m64n{n}k16 ({kind}{', zero_init' if zero else ''}) expects {want} operands, "
                             f"but got {len(ts)}")
    k = 0
    if not zero:
        _expect(all(t == f32 for t in ts[:nacc]), "wgmma accumulators expect f32")
        k = nacc
    if kind == "rs":
        _expect(all(t == b32 for t in ts[k:k + 4]), "wgmma register A expects four b32 words")
    else:
        _expect(ts[k] == u64, f"wgmma desc_a expects u64, but got {ts[k]}")
    _expect(ts[k + na] == u64, f"wgmma desc_b expects u64, but got {ts[k + na]}")
    if not zero:
        _expect(ts[-1] == i1, f"wgmma scale_d expects i1, but got {ts[-1]}")
    return (f32,) * nacc


def _mma_sync(ts, attrs):
    _expect(len(ts) == 10, "mma_sync m16n8k16 expects 4 A words, 2 B words and 4 accumulators")
    _expect(all(t == b32 for t in ts[:6]), "mma_sync A and B expect b32 words")
    _expect(all(t == f32 for t in ts[6:]), "mma_sync accumulators expect f32")
    return (f32,) * 4


def _ldmatrix(ts, attrs):
    _expect(len(ts) == 1 and isinstance(ts[0], PointerType) and ts[0].space == "shared",
            f"ldmatrix expects a shared pointer, but got {ts}")
    _expect(attrs["num"] in (1, 2, 4), "ldmatrix num expects 1, 2 or 4")
    return (b32,) * attrs["num"]


def _region_op(ts, attrs):
    return tuple(attrs["result_types"])


Rule = Callable[[tuple, dict], tuple]

OPS: dict[str, Rule] = {
    "const": _const,
    **{op: _binary(op) for op in ("add", "sub", "mul", "div", "rem", "and", "or", "xor", "shl", "shr", "min", "max")},
    "neg": _unary("neg"), "abs": _unary("abs"), "not": _unary("not"),
    "exp2": _unary("exp2", float_only=True), "log2": _unary("log2", float_only=True),
    "rcp": _unary("rcp", float_only=True), "sqrt": _unary("sqrt", float_only=True),
    "rsqrt": _unary("rsqrt", float_only=True),
    "fma": _fma, "cmp": _cmp, "select": _select, "convert": _convert, "bitcast": _bitcast,
    "pack2": _pack2, "unpack2": _unpack2,
    "ptr_add": _ptr_add, "ptr_cast": _ptr_cast, "ptr_to_int": _ptr_to_int,
    "load": _load, "store": _store, "special": _special, "shfl": _shfl,
    "barrier": lambda ts, a: _barrier(ts, a), "barrier_arrive": lambda ts, a: _barrier(ts, a), "membar": _none(0),
    "asm": _asm, "shared_ptr": _shared_ptr, "dynamic_shared_ptr": _shared_ptr,
    "debug_record": lambda ts, a: (PointerType(i32, "global"),),
    # Hopper
    "mbarrier_init": _mbar(2), "mbarrier_arrive": _mbar(1), "mbarrier_arrive_expect_tx": _mbar(2),
    "mbarrier_try_wait": _mbar(2, (i1,)), "fence_proxy_async": _none(0), "fence_mbarrier_init": _none(0),
    "tma_load": _tma_load, "prefetch_tensormap": _none(1), "setmaxnreg": _none(0),
    "wgmma_fence": _none(0), "wgmma_commit": _none(0), "wgmma_wait": _passthrough, "wgmma": _wgmma,
    "fence_operand": _passthrough, "elect_one": lambda ts, attrs: (i1,),
    # Ampere
    "mma_sync": _mma_sync, "ldmatrix": _ldmatrix,
    # structure
    "for": _region_op, "if": _region_op, "while": _region_op, "yield": lambda ts, a: (),
    "condition": lambda ts, a: (),
}

# Ops whose effect is not just their results: never removed, never reordered by us.
SIDE_EFFECTS = frozenset({
    "store", "barrier", "barrier_arrive", "membar", "mbarrier_init", "mbarrier_arrive",
    "mbarrier_arrive_expect_tx", "mbarrier_try_wait", "fence_proxy_async", "fence_mbarrier_init",
    "tma_load", "prefetch_tensormap", "setmaxnreg", "wgmma_fence", "wgmma_commit", "wgmma_wait",
    "wgmma", "mma_sync", "fence_operand",
})

TERMINATORS = frozenset({"yield", "condition"})


def result_types(opcode: str, operand_types: tuple, attrs: dict) -> tuple:
    try:
        rule = OPS[opcode]
    except KeyError:
        raise OpTypeError(f"unknown opcode {opcode!r}") from None
    return rule(tuple(operand_types), attrs)
