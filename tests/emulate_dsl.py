"""Helpers the emulator tests use to build Hopper and MMA ops straight from the IR opcodes.

The frontend functions for these ops are written elsewhere (``tylopy/language/hopper.py``); the
tests depend only on the IR ops, built here with ``tylopy.language.proxy.emit``. Each helper gives the
ops it builds the source line of the kernel that called it, so emulator messages point at
the test kernel, not at this file. ``line_of(path, marker)`` finds the line carrying the
comment ``# <- marker``. This module has no tests of its own.
"""
from __future__ import annotations

import dataclasses
import sys

import tylopy as ty
from tylopy.errors import SourceLoc
from tylopy.language import proxy, tracing
from tylopy.language.builder import current_builder
from tylopy.language.proxy import as_value
from tylopy.ir.types import PointerType, b32, f32, i1, i32, u32, u64


def line_of(path: str, marker: str) -> int:
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# <- {marker}"):
                return n
    raise LookupError(f"no line marked {marker!r} in {path}")


def _caller_loc(depth: int = 3) -> SourceLoc:
    f = sys._getframe(depth)
    return SourceLoc(f.f_code.co_filename, f.f_lineno, 0, f.f_code.co_name)


def _relocate(loc: SourceLoc):
    blk = current_builder()._blocks[-1]
    blk.ops[-1] = dataclasses.replace(blk.ops[-1], loc=loc)


def emit(opcode, operands=(), loc=None, **attrs):
    """Build one op; it gets the source line of the kernel code that called the helper."""
    loc = loc or _caller_loc()
    res = proxy.emit(opcode, tuple(operands), **attrs)
    _relocate(loc)
    return res


def _u64_ptr(bar):
    return ty.ptr_cast(bar, ty.u64) if bar.type.pointee != u64 else bar


def mbar_init(bar, count):
    emit("mbarrier_init", (_u64_ptr(bar), as_value(count, i32)))


def mbar_arrive(bar):
    emit("mbarrier_arrive", (_u64_ptr(bar),))


def mbar_expect_tx(bar, nbytes):
    emit("mbarrier_arrive_expect_tx", (_u64_ptr(bar), as_value(nbytes, i32)))


def mbar_wait(bar, parity, label=""):
    """Spin on try_wait until the phase with ``parity`` completed (an IR while loop)."""
    loc = _caller_loc(2)
    b, p = _u64_ptr(bar), as_value(parity, i32)

    def cond(args):
        (ok,) = emit("mbarrier_try_wait", (b, p), loc=loc, label=label)
        return ~ok

    tracing._while_op((), (), cond, lambda args: ())


def fence_proxy_async():
    emit("fence_proxy_async")


def fence_mbarrier_init():
    emit("fence_mbarrier_init")


def tma_load(dst, tmap, bar, *coords):
    emit("tma_load", (dst, tmap, _u64_ptr(bar), *[as_value(c, i32) for c in coords]), rank=len(coords))


def cp_async(dst, src, nbytes=16, src_bytes=None):
    ops = (dst, src) if src_bytes is None else (dst, src, as_value(src_bytes, i32))
    emit("cp_async", ops, nbytes=nbytes, cache="cg" if nbytes == 16 else "ca")


def cp_async_commit():
    emit("cp_async_commit")


def cp_async_wait(n):
    emit("cp_async_wait", n=n)


def tma_store(tmap, src, *coords, reduce=None):
    emit("tma_store", (tmap, src, *[as_value(c, i32) for c in coords]), rank=len(coords), reduce=reduce)


def bulk_commit():
    emit("bulk_commit")


def bulk_wait(n, read=False):
    emit("bulk_wait", n=n, read=read)


def setmaxnreg(n, inc):
    emit("setmaxnreg", (), n=n, inc=inc)


def wgmma_fence():
    emit("wgmma_fence")


def wgmma_commit():
    emit("wgmma_commit")


def wgmma_wait(n, values):
    return list(emit("wgmma_wait", tuple(values), n=n)) if values else emit("wgmma_wait", (), n=n)


def wgmma(n, acc, a, desc_b, trans_b=0, scale_d=True, dtype="bf16"):
    """m64n{n}k16; ``acc`` None means zero_init; ``a`` is a u64 descriptor (SS) or 4 b32 words (RS)."""
    rs = isinstance(a, (list, tuple))
    ops = [] if acc is None else list(acc)
    ops += list(a) if rs else [as_value(a, u64)]
    ops.append(as_value(desc_b, u64))
    if acc is not None:
        ops.append(as_value(scale_d, i1))
    return list(emit("wgmma", ops, n=n, dtype=dtype, a_kind="rs" if rs else "ss", trans_b=trans_b,
                     zero_init=acc is None))


def mma_sync(a, b, c, dtype="bf16"):
    return list(emit("mma_sync", (*a, *b, *[as_value(x, f32) for x in c]), dtype=dtype))


def ldmatrix(p, num, trans=False):
    res = emit("ldmatrix", (p,), num=num, trans=trans)
    return list(res)


def desc(addr, lbo=16, sbo=1024, swizzle=128):
    """The wgmma descriptor of a u32 shared address (docs/hopper.md, shared-memory matrix descriptors)."""
    mode = {128: 1, 64: 2, 32: 3, 0: 0}[swizzle]
    high = ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (mode << 62)
    low = ty.cast((addr & 0x3FFFF) >> 4, ty.u64)
    return low | _u64_const(high)


def _u64_const(x):
    return proxy.const(x, u64)


def word_of(lo_bf16, hi_bf16):
    """A b32 word from two bf16 values (lo in bits 0-15)."""
    lo = ty.cast(ty.bitcast(lo_bf16, ty.u16), u32)
    hi = ty.cast(ty.bitcast(hi_bf16, ty.u16), u32)
    return ty.bitcast(lo | (hi << 16), b32)


def smem_addr(p):
    return ty.address(p)


def is_pointer(v) -> bool:
    return isinstance(v.type, PointerType)
