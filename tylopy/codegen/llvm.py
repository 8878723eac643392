"""Lower a verified ``KernelIR`` to an LLVM module (llvmlite) for the NVPTX backend.

One function per op kind, found through the ``LOWER`` table; the Hopper and MMA instructions
are inline PTX from ``asm_templates``. Every instruction carries a debug location of the
kernel source line that built it, so the PTX has ``.loc`` directives that ``ptx.py`` annotates
with the source text.
"""
from __future__ import annotations

import os

import llvmlite.ir as ir

from ..ir.values import Block, KernelIR, Op, Value
from ..ir.types import PointerType, ScalarType, TensorMapType, bf16, f32
from . import asm_templates as T
from .llvm_async import (asm_op, lower_elect_one, lower_fence_operand, lower_mbarrier_try_wait,
                         lower_prefetch_tensormap, lower_remote_mbarrier_arrive, lower_setmaxnreg, lower_tma_load,
                         lower_wgmma, lower_wgmma_wait, set_asm_results)
from .lower_async_copy import LOWER_ASYNC_COPY
from .lower_matrix import LOWER_MATRIX
from .lower_rounding import rounding_lowerings
from .lower_fp8 import LOWER_FP8, convert_fp8
from .llvm_types import llvm_type, signed_constant
from .lower_atomics import LOWERINGS as ATOMIC_LOWERINGS
from .lower_control import LOWERINGS as CONTROL_LOWERINGS
from .lower_cluster import LOWERINGS as CLUSTER_LOWERINGS
from .lower_debug import LOWERINGS as DEBUG_LOWERINGS
from .lower_warp import LOWERINGS as WARP_LOWERINGS

I1, I16, I32, I64 = ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
SHARED_PTR = ir.PointerType(addrspace=3)


class _Lowering:
    def __init__(self, kernel: KernelIR, options=None):
        self.k = kernel
        self.options = options
        self.m = ir.Module(name=kernel.name)
        self.m.triple = "nvptx64-nvidia-cuda"
        self.m.data_layout = "e-p3:32:32-p4:32:32-p5:32:32-p6:32:32-p7:32:32-i64:64-i128:128-v16:16-v32:32-n16:32:64"
        self.vals: dict[int, ir.Value] = {}
        self.decls: dict[str, ir.Function] = {}
        self.globals: dict[str, ir.GlobalVariable] = {}
        self._debug_setup()

    # -- debug info: line tables only ---------------------------------------------------------
    def _debug_setup(self):
        m = self.m
        # The file name only: the same kernel gives the same PTX in every checkout.
        path = self.k.source_file or "<kernel>"
        self.di_file = m.add_debug_info("DIFile", {"filename": os.path.basename(path), "directory": ""})
        self.di_cu = m.add_debug_info("DICompileUnit", {
            "language": ir.DIToken("DW_LANG_C"), "file": self.di_file, "producer": "tylopy",
            "isOptimized": True, "runtimeVersion": 0, "emissionKind": ir.DIToken("DebugDirectivesOnly"),
        }, is_distinct=True)
        flags = m.add_named_metadata("llvm.module.flags")
        flags.add(m.add_metadata([I32(2), "Debug Info Version", I32(3)]))
        flags.add(m.add_metadata([I32(2), "Dwarf Version", I32(4)]))
        cus = m.add_named_metadata("llvm.dbg.cu")
        cus.add(self.di_cu)
        self._locs: dict[int, ir.Value] = {}

    def _loc(self, op: Op):
        if op.loc is None or op.loc.filename != self.k.source_file:
            return None
        line = op.loc.lineno
        loc = self._locs.get(line)
        if loc is None:
            loc = self.m.add_debug_info("DILocation", {"line": line, "column": 0, "scope": self.di_sub})
            self._locs[line] = loc
        return loc

    # -- helpers ------------------------------------------------------------------------------
    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = self.decls.get(name)
        if fn is None:
            fn = ir.Function(self.m, ir.FunctionType(ret, args), name)
            self.decls[name] = fn
        return fn

    def call(self, name, ret, args):
        return self.b.call(self.intrinsic(name, ret, [a.type for a in args]), args)

    def asm(self, text: str, constraints: str, args, ret: ir.Type = ir.VoidType(), side_effect=True, convergent=False):
        fty = ir.FunctionType(ret, [a.type for a in args])
        attrs = ("convergent",) if convergent else ()
        return self.b.call(ir.InlineAsm(fty, text, constraints, side_effect=side_effect), list(args), attrs=attrs)

    def v(self, value: Value) -> ir.Value:
        return self.vals[value.id]

    def set(self, value: Value, llv: ir.Value):
        self.vals[value.id] = llv

    # -- the kernel ---------------------------------------------------------------------------
    def run(self) -> ir.Module:
        k = self.k
        arg_types = [llvm_type(p.type) for p in k.params]
        self.fn = ir.Function(self.m, ir.FunctionType(ir.VoidType(), arg_types), k.name)
        self.fn.calling_convention = "ptx_kernel"
        line = min((op.loc.lineno for op in k.walk() if op.loc and op.loc.filename == k.source_file), default=1)
        sub_type = self.m.add_debug_info("DISubroutineType", {"types": self.m.add_metadata([])})
        self.di_sub = self.m.add_debug_info("DISubprogram", {
            "name": k.name, "file": self.di_file, "line": line, "type": sub_type, "unit": self.di_cu,
            "spFlags": ir.DIToken("DISPFlagDefinition | DISPFlagOptimized"), "scopeLine": line,
        }, is_distinct=True)
        self.fn.set_metadata("dbg", self.di_sub)
        for i, (p, a) in enumerate(zip(k.params, self.fn.args)):
            a.name = p.name
            if isinstance(p.type, TensorMapType):
                a.attributes.add("byval")
                a.attributes.align = 64
            elif isinstance(p.type, PointerType) and p.noalias:
                a.attributes.add("noalias")  # only where the author promised it (ty.ptr(..., noalias=True))
            self.set(p.value, a)
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self._annotations()
        self.block(k.body)
        self.b.ret_void()
        return self.m

    def _annotations(self):
        k, m = self.k, self.m
        ann = m.add_named_metadata("nvvm.annotations")
        ann.add(m.add_metadata([self.fn, "maxntidx", I32(k.launch.max_threads)]))
        if k.launch.min_blocks_per_sm:
            ann.add(m.add_metadata([self.fn, "minctasm", I32(k.launch.min_blocks_per_sm)]))
        if k.launch.max_registers:
            ann.add(m.add_metadata([self.fn, "maxnreg", I32(k.launch.max_registers)]))
        if k.launch.cluster:  # .reqnctapercluster: the launch must use exactly this cluster shape
            for axis, n in zip("xyz", k.launch.cluster):
                ann.add(m.add_metadata([self.fn, f"cluster_dim_{axis}", I32(n)]))
        for i, p in enumerate(k.params):
            if isinstance(p.type, TensorMapType):
                ann.add(m.add_metadata([self.fn, "grid_constant", m.add_metadata([I32(i + 1)])]))

    def block(self, block: Block):
        for op in block.ops:
            self.b.debug_metadata = self._loc(op)
            try:
                LOWER[op.opcode](self, op)
            except Exception as e:
                if not hasattr(e, "tylopy_op"):
                    e.tylopy_op = op  # the innermost op that failed: the frontend reports its source line
                raise

    # -- shared memory ------------------------------------------------------------------------
    def shared_global(self, name: str) -> ir.GlobalVariable:
        g = self.globals.get(name)
        if g is None:
            alloc = next(a for a in self.k.shared if a.name == name)
            g = ir.GlobalVariable(self.m, ir.ArrayType(ir.IntType(8), alloc.nbytes), name, addrspace=3)
            g.type = SHARED_PTR  # llvmlite types globals as [N x i8]*; loads/stores need an opaque ptr
            g.align = alloc.align
            g.linkage = "internal"
            g.initializer = ir.Constant(g.value_type, ir.Undefined)
            self.globals[name] = g
        return g

    def dynamic_shared_global(self) -> ir.GlobalVariable:
        g = self.globals.get("__dsmem")
        if g is None:
            g = ir.GlobalVariable(self.m, ir.ArrayType(ir.IntType(8), 0), "tylopy_dynamic_smem", addrspace=3)
            g.type = SHARED_PTR
            g.align = self.k.dynamic_shared_align
            g.linkage = "external"
            self.globals["__dsmem"] = g
        return g


# ---- op lowerings ------------------------------------------------------------------------------

def _ty(v: Value) -> ScalarType:
    return v.type


def lower_const(L: _Lowering, op: Op):
    t = op.result.type
    val = op.attr("value")
    if t == bf16:
        import struct
        bits = struct.unpack("<I", struct.pack("<f", val))[0]
        # round to nearest even on the upper 16 bits, as cvt.rn.bf16.f32 does for finite values
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        L.set(op.result, ir.Constant(I16, bits & 0xFFFF))
    elif t.is_bool:
        L.set(op.result, ir.Constant(I1, int(val)))
    elif t.is_int:
        L.set(op.result, ir.Constant(llvm_type(t), int(val) & ((1 << t.bits) - 1)))
    else:
        L.set(op.result, ir.Constant(llvm_type(t), float(val)))


def _float_op(t):
    return t.is_float and t != bf16


def lower_binary(L: _Lowering, op: Op):
    a, b = (L.v(x) for x in op.operands)
    t = _ty(op.operands[0])
    B = L.b
    name = op.opcode
    if t == bf16:
        raise NotImplementedError("arithmetic on bf16 values: convert to f32 with ty.cast first")
    if t.is_float:
        fn = {"add": B.fadd, "sub": B.fsub, "mul": B.fmul, "div": B.fdiv, "rem": B.frem}.get(name)
        if fn is not None:
            r = fn(a, b)
        else:
            intr = {"min": "llvm.minnum", "max": "llvm.maxnum"}[name]
            suffix = {"f32": "f32", "f64": "f64", "f16": "f16"}[t.name]
            r = L.call(f"{intr}.{suffix}", a.type, [a, b])
    else:
        signed = t.is_signed
        if name in ("min", "max"):
            pred = ("<" if name == "min" else ">")
            c = B.icmp_signed(pred, a, b) if signed else B.icmp_unsigned(pred, a, b)
            r = B.select(c, a, b)
        elif name in ("shl", "shr"):
            r = _shift(L, name, a, b, t)
        elif name in ("div", "rem"):
            r = _divide(L, name, a, b, t)
        else:
            fn = {"add": B.add, "sub": B.sub, "mul": B.mul, "and": B.and_, "or": B.or_, "xor": B.xor}[name]
            r = fn(a, b)
    L.set(op.result, r)


def _shift(L: _Lowering, name: str, a, b, t: ScalarType):
    """PTX's clamped shifts (LLVM leaves a shift by the width or more undefined): shl and lshr give
    0, ashr gives the sign. A constant in-range amount needs no clamp."""
    B = L.b
    signed = t.is_signed
    if isinstance(b, ir.Constant) and 0 <= int(b.constant) < t.bits:
        return B.shl(a, b) if name == "shl" else (B.ashr(a, b) if signed else B.lshr(a, b))
    big = B.icmp_unsigned(">=", b, ir.Constant(b.type, t.bits))
    safe = B.select(big, ir.Constant(b.type, t.bits - 1), b)
    if name == "shl":
        return B.select(big, ir.Constant(a.type, 0), B.shl(a, safe))
    if signed:
        return B.ashr(a, safe)  # shifting by width-1 already gives the sign
    return B.select(big, ir.Constant(a.type, 0), B.lshr(a, safe))


def _divide(L: _Lowering, name: str, a, b, t: ScalarType):
    """Truncating division with PTX's results where LLVM's would be undefined: x / 0 gives all ones
    (x % 0 gives x), and MIN / -1 wraps to MIN (remainder 0). Constant divisors need no guard."""
    B = L.b
    signed = t.is_signed
    div = B.sdiv if signed else B.udiv
    rem = B.srem if signed else B.urem
    if isinstance(b, ir.Constant) and int(b.constant) != 0 and not (signed and signed_constant(b) == -1):
        return div(a, b) if name == "div" else rem(a, b)
    zero = B.icmp_unsigned("==", b, ir.Constant(b.type, 0))
    bad = zero
    if signed:
        minus_one = B.icmp_signed("==", b, ir.Constant(b.type, -1))
        bad = B.or_(zero, minus_one)
    safe = B.select(bad, ir.Constant(b.type, 1), b)
    if name == "div":
        q = div(a, safe)  # by 1: a
        if signed:
            q = B.select(B.and_(B.not_(zero), bad), B.neg(a), q)  # a / -1 = -a (wraps for MIN)
        return B.select(zero, ir.Constant(a.type, -1 if signed else (1 << t.bits) - 1), q)
    r = rem(a, safe)  # by 1: 0, which is a % -1 too
    return B.select(zero, a, r)


def lower_unary(L: _Lowering, op: Op):
    a = L.v(op.operands[0])
    t = _ty(op.operands[0])
    B = L.b
    name = op.opcode
    if name == "neg":
        r = B.fneg(a) if t.is_float else B.neg(a)
    elif name == "not":
        r = B.not_(a)
    elif name == "abs":
        r = L.call(f"llvm.fabs.{t.name}", a.type, [a]) if t.is_float else L.call(f"llvm.abs.i{t.bits}", a.type, [a, ir.Constant(I1, 0)])
    elif name == "exp2":
        r = L.call("llvm.nvvm.ex2.approx.ftz.f", F32, [a])
    elif name == "log2":
        r = L.call("llvm.nvvm.lg2.approx.ftz.f", F32, [a])
    elif name == "sqrt":
        r = L.call("llvm.sqrt.f32", F32, [a])
    elif name == "rsqrt":
        r = L.call("llvm.nvvm.rsqrt.approx.ftz.f", F32, [a])
    elif name == "rcp":
        r = L.call("llvm.nvvm.rcp.rn.f", F32, [a])
    else:
        raise NotImplementedError(name)
    L.set(op.result, r)


def lower_fma(L: _Lowering, op: Op):
    a, b, c = (L.v(x) for x in op.operands)
    L.set(op.result, L.call(f"llvm.fma.{_ty(op.operands[0]).name}", a.type, [a, b, c]))


_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def lower_cmp(L: _Lowering, op: Op):
    a, b = (L.v(x) for x in op.operands)
    t = _ty(op.operands[0])
    pred = _FCMP[op.attr("pred")]
    if t.is_float:
        r = L.b.fcmp_unordered(pred, a, b) if pred == "!=" else L.b.fcmp_ordered(pred, a, b)
    elif t.is_signed:
        r = L.b.icmp_signed(pred, a, b)
    else:
        r = L.b.icmp_unsigned(pred, a, b)
    L.set(op.result, r)


def lower_select(L: _Lowering, op: Op):
    c, a, b = (L.v(x) for x in op.operands)
    L.set(op.result, L.b.select(c, a, b))


def _bf16_to_f32(L, x):
    return L.b.bitcast(L.b.shl(L.b.zext(x, I32), I32(16)), F32)


def lower_convert(L: _Lowering, op: Op):
    x = L.v(op.operands[0])
    src, dst = _ty(op.operands[0]), op.attr("to")
    if src == bf16 and dst.is_fp8:
        x, src = _bf16_to_f32(L, x), f32
    if dst.is_fp8 or (src.is_fp8 and dst.name in ("f16", "f32")):
        return L.set(op.result, convert_fp8(L, x, src, dst, _convert_scalar))
    if src.is_fp8:  # to bf16 or f64: widen to f32 (exact), then as from f32
        x, src = convert_fp8(L, x, src, f32, _convert_scalar), f32
    if src == bf16:
        x, src = _bf16_to_f32(L, x), f32
        if dst == f32:
            return L.set(op.result, x)
    if dst == bf16:
        if src != f32:
            x = _convert_scalar(L, x, src, f32)
        return L.set(op.result, L.asm(*T.SIMPLE["cvt_bf16_f32"], [x], ret=I16, side_effect=False))
    L.set(op.result, _convert_scalar(L, x, src, dst))


def _convert_scalar(L, x, src: ScalarType, dst: ScalarType):
    B = L.b
    lt = llvm_type(dst)
    if src.is_float and dst.is_float:
        return B.fpext(x, lt) if dst.bits > src.bits else B.fptrunc(x, lt)
    if src.is_float:
        return B.fptosi(x, lt) if dst.is_signed else B.fptoui(x, lt)
    if dst.is_float:
        return B.sitofp(x, lt) if src.is_signed else B.uitofp(x, lt)
    if dst.bits > src.bits:
        return B.sext(x, lt) if src.is_signed else B.zext(x, lt)
    if dst.bits < src.bits:
        return B.trunc(x, lt)
    return x


def lower_bitcast(L: _Lowering, op: Op):
    x = L.v(op.operands[0])
    L.set(op.result, L.b.bitcast(x, llvm_type(op.attr("to"))))


def lower_pack2(L: _Lowering, op: Op):
    lo, hi = (L.v(x) for x in op.operands)
    key = "cvt_bf16x2" if op.attr("dtype") == bf16 else "cvt_f16x2"
    L.set(op.result, L.asm(*T.SIMPLE[key], [lo, hi], ret=I32, side_effect=False))


def lower_unpack2(L: _Lowering, op: Op):
    w = L.v(op.operands[0])
    B = L.b
    if op.attr("dtype") == bf16:
        lo = B.bitcast(B.shl(w, I32(16)), F32)
        hi = B.bitcast(B.and_(w, I32(0xFFFF0000)), F32)
    else:
        half = ir.HalfType()
        lo = B.fpext(B.bitcast(B.trunc(w, I16), half), F32)
        hi = B.fpext(B.bitcast(B.trunc(B.lshr(w, I32(16)), I16), half), F32)
    L.set(op.results[0], lo)
    L.set(op.results[1], hi)


def lower_ptr_add(L: _Lowering, op: Op):
    p, i = (L.v(x) for x in op.operands)
    pointee = llvm_type(op.operands[0].type.pointee)
    L.set(op.result, L.b.gep(p, [i], source_etype=pointee))


def lower_ptr_cast(L: _Lowering, op: Op):
    p = L.v(op.operands[0])
    src, dst = op.operands[0].type, op.attr("to")
    L.set(op.result, p if src.space == dst.space else L.b.addrspacecast(p, llvm_type(dst)))


def lower_ptr_to_int(L: _Lowering, op: Op):
    p = L.v(op.operands[0])
    L.set(op.result, L.b.ptrtoint(p, llvm_type(op.result.type)))


def _align(t: ScalarType, vec: int) -> int:
    return t.nbytes * vec


def lower_load(L: _Lowering, op: Op):
    p = L.v(op.operands[0])
    t = op.operands[0].type.pointee
    vec = op.attr("vec", 1)
    et = llvm_type(t)
    lt = et if vec == 1 else ir.VectorType(et, vec)
    B = L.b
    if len(op.operands) == 2:  # masked: lanes with mask false read nothing and get zero
        mask = L.v(op.operands[1])
        pre = B.block
        then = L.fn.append_basic_block("mload")
        merge = L.fn.append_basic_block("mload.end")
        B.cbranch(mask, then, merge)
        B.position_at_end(then)
        x = B.load(p, typ=lt, align=_align(t, vec))
        B.branch(merge)
        B.position_at_end(merge)
        phi = B.phi(lt)
        phi.add_incoming(x, then)
        phi.add_incoming(ir.Constant(lt, None), pre)
        x = phi
    else:
        x = B.load(p, typ=lt, align=_align(t, vec))
    if vec == 1:
        L.set(op.result, x)
    else:
        for i, r in enumerate(op.results):
            L.set(r, B.extract_element(x, I32(i)))


def lower_store(L: _Lowering, op: Op):
    p = L.v(op.operands[0])
    vals = [L.v(x) for x in op.operands[1:]]
    t = op.operands[0].type.pointee
    if len(vals) == 1:
        L.b.store(vals[0], p, align=_align(t, 1))
        return
    vt = ir.VectorType(llvm_type(t), len(vals))
    vec = ir.Constant(vt, None)
    for i, v in enumerate(vals):
        vec = L.b.insert_element(vec, v, I32(i))
    L.b.store(vec, p, align=_align(t, len(vals)))


def lower_special(L: _Lowering, op: Op):
    reg = op.attr("reg")
    name = "llvm.nvvm.read.ptx.sreg." + reg.replace("globaltimer_lo", "globaltimer")
    if reg == "globaltimer_lo":
        L.set(op.result, L.b.trunc(L.call(name, I64, []), I32))
    else:
        L.set(op.result, L.call(name, I32, []))


def lower_barrier(L: _Lowering, op: Op):
    args = [L.v(x) for x in op.operands]
    L.asm(*T.barrier(None if args else op.attr("id"), op.attr("count"), arrive=op.opcode == "barrier_arrive"), args,
          convergent=True)


def lower_shfl(L: _Lowering, op: Op):
    v, lane = (L.v(x) for x in op.operands)
    t = _ty(op.operands[0])
    mode = op.attr("mode")
    suffix = "f32" if t == f32 else "i32"
    clamp = 0 if mode == "up" else 0x1F
    fn = L.intrinsic(f"llvm.nvvm.shfl.sync.{mode}.{suffix}", v.type, [I32, v.type, I32, I32])
    L.set(op.result, L.b.call(fn, [I32(0xFFFFFFFF), v, lane, I32(clamp)], attrs=("convergent",)))


def lower_asm(L: _Lowering, op: Op):
    results = op.attr("results")
    args = [L.v(x) for x in op.operands]
    if not results:
        ret = ir.VoidType()
    elif len(results) == 1:
        ret = llvm_type(results[0])
    else:
        ret = ir.LiteralStructType([llvm_type(t) for t in results])
    r = L.asm(op.attr("template"), op.attr("constraints"), args, ret=ret, side_effect=op.attr("side_effect"),
              convergent=op.attr("convergent"))
    set_asm_results(L, op, r)


def lower_shared_ptr(L: _Lowering, op: Op):
    g = L.shared_global(op.attr("name"))
    L.set(op.result, L.b.bitcast(g, ir.PointerType(addrspace=3)))


DEBUG_RECORD = "tylopy_debug_record"
DEBUG_RECORD_WORDS = 4


def lower_debug_record(L: _Lowering, op: Op):
    g = L.globals.get(DEBUG_RECORD)
    if g is None:
        g = ir.GlobalVariable(L.m, ir.ArrayType(I32, DEBUG_RECORD_WORDS), DEBUG_RECORD, addrspace=1)
        g.initializer = ir.Constant(g.value_type, [I32(0)] * DEBUG_RECORD_WORDS)
        g.align = 16
        g.type = ir.PointerType(addrspace=1)
        L.globals[DEBUG_RECORD] = g
    L.set(op.result, g)


def lower_dynamic_shared_ptr(L: _Lowering, op: Op):
    g = L.dynamic_shared_global()
    L.set(op.result, L.b.bitcast(g, ir.PointerType(addrspace=3)))


LOWER = {
    "const": lower_const,
    **{k: lower_binary for k in ("add", "sub", "mul", "div", "rem", "and", "or", "xor", "shl", "shr", "min", "max")},
    **{k: lower_unary for k in ("neg", "not", "abs", "exp2", "log2", "sqrt", "rsqrt", "rcp")},
    "fma": lower_fma, "cmp": lower_cmp, "select": lower_select, "convert": lower_convert, "bitcast": lower_bitcast,
    "pack2": lower_pack2, "unpack2": lower_unpack2, "ptr_add": lower_ptr_add, "ptr_cast": lower_ptr_cast,
    "ptr_to_int": lower_ptr_to_int, "load": lower_load, "store": lower_store, "special": lower_special,
    "barrier": lower_barrier, "barrier_arrive": lower_barrier, "shfl": lower_shfl, "asm": lower_asm,
    "shared_ptr": lower_shared_ptr, "dynamic_shared_ptr": lower_dynamic_shared_ptr,
    "debug_record": lower_debug_record,
    "mbarrier_init": asm_op("mbarrier_init"), "mbarrier_arrive": asm_op("mbarrier_arrive"),
    "mbarrier_arrive_cluster": lower_remote_mbarrier_arrive,
    "mbarrier_arrive_expect_tx_cluster": lower_remote_mbarrier_arrive,
    "mbarrier_arrive_expect_tx": asm_op("mbarrier_arrive_expect_tx"), "mbarrier_try_wait": lower_mbarrier_try_wait,
    "fence_proxy_async": asm_op("fence_proxy_async"), "fence_mbarrier_init": asm_op("fence_mbarrier_init"),
    "wgmma_fence": asm_op("wgmma_fence"), "wgmma_commit": asm_op("wgmma_commit"),
    "prefetch_tensormap": lower_prefetch_tensormap, "tma_load": lower_tma_load, "setmaxnreg": lower_setmaxnreg,
    "wgmma_wait": lower_wgmma_wait, "fence_operand": lower_fence_operand, "wgmma": lower_wgmma,
    "elect_one": lower_elect_one, **LOWER_MATRIX, **LOWER_ASYNC_COPY,
    "membar": lambda L, op: L.asm("fence.acq_rel.gpu;", "~{memory}", []),
    **WARP_LOWERINGS, **ATOMIC_LOWERINGS, **DEBUG_LOWERINGS, **CONTROL_LOWERINGS, **CLUSTER_LOWERINGS,
}

LOWER.update(LOWER_FP8)
LOWER.update(rounding_lowerings(LOWER))  # add/sub/mul/div/fma/sqrt/convert with an explicit rounding


def lower_kernel(kernel: KernelIR, options=None) -> ir.Module:
    """The kernel as an llvmlite module (call ``str()`` on it for LLVM IR text)."""
    return _Lowering(kernel, options).run()
