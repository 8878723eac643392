"""Lowerings of ``printf`` (CUDA's ``vprintf``) and ``device_assert`` (CUDA's ``__assertfail``).

``vprintf(format, args)`` takes the format as a generic pointer to a C string and the values
packed in a local buffer laid out as a C struct (each value at its natural alignment), f32
promoted to double as C's variadic calls do. ``__assertfail(message, file, line, function,
char_size)`` prints ``file:line: function: block: [..], thread: [..] Assertion `message`
failed.`` and stops the kernel; it runs only in the threads whose condition is false. The
file is named without its directory, so the PTX is the same in every checkout. Both exist only
in kernels compiled with the ``debug`` option (the frontend emits nothing otherwise).
Registered in ``llvm.LOWER``.
"""
from __future__ import annotations

import os

import llvmlite.ir as ir

from ..ir.types import f32
from ..ir.values import Op

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
GENERIC = ir.PointerType()
GLOBAL = ir.PointerType(addrspace=1)


def c_string(L, text: str) -> ir.Value:
    """A generic pointer to a NUL-terminated constant holding ``text`` (one global per distinct text)."""
    key = "__str:" + text
    g = L.globals.get(key)
    if g is None:
        data = bytearray(text.encode("utf-8") + b"\0")
        name = f"tylopy_str{sum(k.startswith('__str:') for k in L.globals)}"
        g = ir.GlobalVariable(L.m, ir.ArrayType(I8, len(data)), name, addrspace=1)
        g.type = GLOBAL
        g.global_constant = True
        g.linkage = "internal"
        g.initializer = ir.Constant(ir.ArrayType(I8, len(data)), data)
        L.globals[key] = g
    return L.b.addrspacecast(g, GENERIC)


def _entry_alloca(L, nbytes: int) -> ir.Value:
    """An 8-aligned byte buffer made in the entry block, so a print inside a loop reuses one buffer."""
    b = ir.IRBuilder(L.fn.entry_basic_block)
    b.position_at_start(L.fn.entry_basic_block)
    buf = b.alloca(ir.ArrayType(I8, nbytes))
    buf.align = 8
    L.b.position_at_end(L.b.block)  # the insertion above shifted the block under the main builder
    return buf


def _c_layout(vals) -> tuple[list[int], int]:
    """Byte offsets of the values in a C struct (each at its natural alignment) and its size."""
    offsets, cur = [], 0
    for x in vals:
        size = x.type.width // 8 if isinstance(x.type, ir.IntType) else (8 if isinstance(x.type, ir.DoubleType) else 4)
        cur = -(-cur // size) * size
        offsets.append(cur)
        cur += size
    return offsets, -(-cur // 8) * 8


def lower_printf(L, op: Op):
    B = L.b
    vals = []
    for v in op.operands:
        x = L.v(v)
        vals.append(B.fpext(x, ir.DoubleType()) if v.type == f32 else x)
    if vals:
        offsets, size = _c_layout(vals)
        buf = _entry_alloca(L, size)
        for off, x in zip(offsets, vals):
            field = B.gep(buf, [I32(0), I32(off)], inbounds=True)
            B.store(x, B.bitcast(field, x.type.as_pointer()))
        args = B.bitcast(buf, GENERIC)
    else:
        args = ir.Constant(GENERIC, None)
    L.call("vprintf", I32, [c_string(L, op.attr("format")), args])


def lower_device_assert(L, op: Op):
    B = L.b
    cond = L.v(op.operands[0])
    fail = L.fn.append_basic_block("assert.fail")
    cont = L.fn.append_basic_block("assert.ok")
    B.cbranch(cond, cont, fail)
    B.position_at_end(fail)
    loc = op.loc
    message = op.attr("message") or (loc.source_line().strip() if loc else "") or "device_assert"
    fname = os.path.basename(loc.filename) if loc else "<kernel>"
    line = loc.lineno if loc else 0
    L.call("__assertfail", ir.VoidType(), [c_string(L, message), c_string(L, fname), I32(line),
                                           c_string(L, L.k.name), I64(1)])
    B.branch(cont)
    B.position_at_end(cont)


LOWERINGS = {"printf": lower_printf, "device_assert": lower_device_assert}
