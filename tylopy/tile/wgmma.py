"""Hopper's warpgroup MMA ``wgmma.mma_async`` m64nNk16 (m64nNk32 for fp8): atom, shared-memory descriptors,
commit groups, and the same-lane conversion of an f32 accumulator into the register-A operand.

An accumulator returned by ``wgmma`` is *pending*: it belongs to a commit group and cannot be
read until ``wgmma_wait`` has waited that group out. The wait takes the pending fragments and
returns them, tied through the ``wait_group`` asm, so LLVM cannot move a read above the wait
(Triton's remedy; docs/hopper.md, "wgmma"). Reading a pending fragment is a trace-time error.

Same-lane conversion (docs/hopper.md, "register layouts"): for PV k-step kk, A register r of the RS form is
pack(d[8kk+2r], d[8kk+2r+1]) — S's register pairs become A's registers in order, no shuffles.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import KernelSourceError, LayoutError
from ..language.builder import current_builder, user_location
from ..language import lang
from ..language.proxy import RuntimeValue, as_value, emit, emit1
from ..ir.types import PointerType, ScalarType, b32, bf16, e4m3, e5m2, f16, f32, f64, i1, i32, i64, u16, u32, u64
from .fragment import Fragment
from .layouts import WARPGROUP, WGMMA_A_RS, WGMMA_A_RS_FP8, Ownership, wgmma_acc

RS_A_OWNERSHIP = Ownership("warpgroup", row_lanes=(1, 2), col_lanes=(4, 8, 16), col_warps=4)

SWIZZLE_MODE = {128: 1, 64: 2, 32: 3, 0: 0}


@dataclass(frozen=True)
class WgmmaAtom:
    """wgmma.mma_async.sync.aligned.m64n{n}k{k}.{acc_dtype}.{dtype}.{b_dtype} (sm_90a, one warpgroup).

    16-bit inputs (bf16, f16) take k16; 8-bit inputs (e4m3, e5m2, mixed freely between A and B)
    take k32 and read both operands K-major. ``acc_dtype`` f16 (f16 or fp8 inputs) accumulates in
    n/4 b32 registers of packed f16 pairs instead of n/2 f32.
    """

    n: int
    dtype: ScalarType = bf16
    a_source: str = "ss"  # "ss": A from shared memory; "rs": A from registers
    b_dtype: ScalarType | None = None  # None: the same as dtype
    acc_dtype: ScalarType = f32

    def __post_init__(self):
        if self.n % 8 or not 8 <= self.n <= 256:
            raise LayoutError(f"WgmmaAtom n expects a multiple of 8 in 8..256, but got {self.n}")
        if self.dtype not in (bf16, f16, e4m3, e5m2):
            raise LayoutError(f"WgmmaAtom dtype expects bf16, f16, e4m3 or e5m2, but got {self.dtype}")
        if self.b_dtype is None:
            object.__setattr__(self, "b_dtype", self.dtype)
        if self.dtype.is_fp8 != self.b_dtype.is_fp8 or (not self.dtype.is_fp8 and self.b_dtype != self.dtype):
            want = "e4m3 or e5m2" if self.dtype.is_fp8 else str(self.dtype)
            raise LayoutError(f"WgmmaAtom b_dtype expects {want} with dtype {self.dtype}, but got {self.b_dtype}")
        if self.acc_dtype not in (f32, f16) or (self.acc_dtype == f16 and self.dtype == bf16):
            raise LayoutError(f"WgmmaAtom acc_dtype expects f32 (or f16 for f16/e4m3/e5m2 inputs), but got "
                              f"{self.acc_dtype} with dtype {self.dtype}")
        if self.a_source not in ("ss", "rs"):
            raise LayoutError(f"WgmmaAtom a_source expects 'ss' or 'rs', but got {self.a_source!r}")

    arch = "sm_90a"

    @property
    def k(self) -> int:
        return 32 if self.dtype.is_fp8 else 16

    @property
    def acc_layout(self):
        return wgmma_acc(self.n)

    @property
    def acc_pack(self) -> int:
        """Accumulator elements per register: 1 (f32) or 2 (packed f16 pairs)."""
        return 2 if self.acc_dtype == f16 else 1

    @property
    def a_layout(self):
        return WGMMA_A_RS_FP8 if self.dtype.is_fp8 else WGMMA_A_RS

    @property
    def a_pack(self) -> int:
        return 4 if self.dtype.is_fp8 else 2

    def a_fragment(self, words) -> Fragment:
        """This thread's four b32 A registers (RS) as the atom's A fragment: two packed 16-bit values
        (``ty.pack2``) or four fp8 codes (``ty.pack_fp8x4``) each, in ``a_layout``."""
        ws = tuple(words)
        if len(ws) != 4 or not all(isinstance(w, RuntimeValue) and w.type == b32 for w in ws):
            raise LayoutError(f"{self} a_fragment expects four run-time b32 words, but got "
                              f"{[getattr(w, 'type', w) for w in ws]}")
        return Fragment(ws, RS_A_OWNERSHIP, self.a_layout, pack=self.a_pack, dtype=self.dtype)

    def zeros(self) -> Fragment:
        """A traced accumulator of zeros in this atom's layout: the start of a K loop.

        ``acc = atom.zeros()`` then ``acc = wgmma(atom, acc, ...)`` in every k-step, a run-time
        loop included (the zeros are the loop-carried value's entry). n/2 f32 registers of +0.0,
        or n/4 b32 words of packed f16 zeros with ``acc_dtype=ty.f16``. Not pending: it may be
        read at once. (``wgmma(atom, None, ...)`` is the other zero start: it does not read the
        accumulator at all, but only where the first k-step is separate code.)
        """
        if self.acc_dtype == f16:
            z = as_value(0, b32)
            return Fragment((z,) * (self.n // 4), WARPGROUP, self.acc_layout, pack=2, dtype=f16)
        z = as_value(0.0, f32)
        return Fragment((z,) * (self.n // 2), WARPGROUP, self.acc_layout)

    def __str__(self):
        return (f"wgmma.mma_async.sync.aligned.m64n{self.n}k{self.k}.{self.acc_dtype.name}.{self.dtype.name}."
                f"{self.b_dtype.name} ({self.a_source.upper()}, sm_90a)")


def descriptor_bits(addr: int, lbo: int = 16, sbo: int = 1024, swizzle: int = 128) -> int:
    """The 64-bit shared-memory matrix descriptor for a byte address (docs/hopper.md, "descriptors")."""
    for name, v in (("addr", addr), ("lbo", lbo), ("sbo", sbo)):
        if v % 16:
            raise LayoutError(f"descriptor {name} expects a multiple of 16 bytes, but got {v}")
    if swizzle not in SWIZZLE_MODE:
        raise LayoutError(f"descriptor swizzle expects 0, 32, 64 or 128, but got {swizzle}")
    return (((addr & 0x3FFFF) >> 4) | ((lbo >> 4) & 0x3FFF) << 16 | ((sbo >> 4) & 0x3FFF) << 32
            | SWIZZLE_MODE[swizzle] << 62)


def smem_descriptor(addr, lbo: int = 16, sbo: int = 1024, swizzle: int = 128):
    """A descriptor for a u32 shared address value (traced) or an int."""
    if isinstance(addr, int):
        return descriptor_bits(addr, lbo, sbo, swizzle)
    high = descriptor_bits(0, lbo, sbo, swizzle)
    low = emit1("convert", (((addr & 0x3FFFF) >> 4),), to=u64)
    return low | high


def _groups() -> dict:
    """This trace's count of closed wgmma commit groups (kept in the builder's library state)."""
    state = current_builder().state
    state.setdefault("wgmma_committed", 0)
    return state


def wgmma(atom: WgmmaAtom, acc: Fragment | None, a, desc_b, trans_b: int = 0, scale_d=True,
          trans_a: int = 0) -> Fragment:
    """Issue one m64n{n}k16 wgmma (k32 for fp8 atoms) into ``acc`` (None: D = A B, the accumulator is not read).

    ``a`` is a u64 descriptor (SS) or a packed ``WGMMA_A_RS`` fragment (RS). ``trans_a`` /
    ``trans_b`` = 1 read that shared-memory operand MN-major (imm-trans; register A is always
    K-major, so RS takes no ``trans_a``). The result is pending in the currently open commit group.
    """
    operands = []
    if acc is not None:
        if acc.layout != atom.acc_layout or acc.pack != atom.acc_pack:
            raise LayoutError(f"wgmma accumulator expects {atom.acc_layout} ({atom.acc_dtype}), but got {acc.layout}"
                              f"{' with %d elements per register' % acc.pack if acc.pack != 1 else ''}")
        operands += list(acc._cols)  # a pending accumulator may feed the next wgmma of the same chain
    if trans_a not in (0, 1) or trans_b not in (0, 1):
        raise LayoutError(f"wgmma trans_a/trans_b expect 0 or 1, but got {trans_a!r}/{trans_b!r}")
    if atom.dtype.is_fp8 and (trans_a or trans_b):
        raise LayoutError(f"wgmma with {atom.dtype}/{atom.b_dtype} operands expects trans_a=0 and trans_b=0 (8-bit "
                          f"operands are read K-major only), but got trans_a={trans_a}, trans_b={trans_b}")
    if atom.a_source == "rs" and trans_a:
        raise LayoutError("wgmma RS expects trans_a=0 (a register A operand is always K-major), but got 1")
    if atom.a_source == "rs":
        if not isinstance(a, Fragment) or a.layout != atom.a_layout or a.pack != atom.a_pack:
            raise LayoutError(f"wgmma RS expects a {atom.a_layout} fragment with {atom.a_pack} elements per register "
                              f"as A, but got {a!r}")
        if a.dtype is not None and a.dtype != atom.dtype:
            raise LayoutError(f"wgmma {atom.dtype} expects A packed as {atom.dtype}, but it holds {a.dtype}")
        operands += list(a.values)
    else:
        operands.append(as_value(a, u64))
    operands.append(as_value(desc_b, u64))
    if acc is not None:
        operands.append(as_value(scale_d, i1))
    extra = {"trans_a": 1} if trans_a else {}
    if atom.b_dtype != atom.dtype:
        extra["b_dtype"] = atom.b_dtype.name
    if atom.acc_dtype != f32:
        extra["acc"] = atom.acc_dtype.name
    out = emit("wgmma", operands, n=atom.n, dtype=atom.dtype.name, a_kind=atom.a_source, trans_b=int(trans_b),
               zero_init=acc is None, **extra)
    group = _groups()["wgmma_committed"] + 1
    if atom.acc_dtype == f16:
        return Fragment(out, WARPGROUP, atom.acc_layout, pack=2, group=group, dtype=f16)
    return Fragment(out, WARPGROUP, atom.acc_layout, group=group)


def wgmma_fence():
    """wgmma.fence: order earlier register writes (accumulators, A) before the next wgmma."""
    emit("wgmma_fence", ())


def wgmma_commit():
    """Close the open group of wgmmas (wgmma.commit_group)."""
    emit("wgmma_commit", ())
    _groups()["wgmma_committed"] += 1


def wgmma_wait(n: int, *args, after=()):
    """wgmma.wait_group n: wait until at most ``n`` of the most recent commit groups are pending.

    Returns ``args`` (fragments, or lists/tuples of fragments) tied through the wait: their
    registers are in/out operands of the wait's asm, so every read of the returned fragments
    comes after the wait (LLVM cannot move a read above it); those whose group completed
    become readable, the others stay pending.

    ``after``: values (run-time scalars, pointers, fragments, or lists of them) the wait must
    come after. They become inputs of the wait's asm, so LLVM computes them before the wait
    and cannot sink that work below it (or hoist the wait above it). Use it to pin the overlap
    you intend: ``o = ty.hopper.wgmma_wait(1, o, after=(row_max, p))`` keeps the softmax math
    that produces ``row_max`` and ``p`` between the wgmma issue and the wait. The wait is a
    ``volatile`` asm with a memory clobber, so loads, stores, fences and barriers keep their
    order with it. What happens below PTX is ptxas's: it does not move instructions across
    ``wgmma.wait_group`` in the kernels checked (docs/primitives.md, "Matrix and asynchronous
    copies").
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 7:
        raise KernelSourceError(f"wgmma_wait n expects an int in 0..7, but got {n!r}", user_location())
    frags = [f for a in args for f in (a if isinstance(a, (list, tuple)) else [a])]
    for f in frags:
        if not isinstance(f, Fragment):
            raise KernelSourceError(f"wgmma_wait expects fragments, but got {f!r}", user_location(),
                                    hint="pass scalars the wait must follow as after=(...)")
    pinned = _pinned_values(after)
    done = _groups()["wgmma_committed"] - n
    outs = emit("wgmma_wait", [v for f in frags for v in f._cols] + pinned, n=n)
    tied, i = [], 0
    for f in frags:
        k = len(f._cols)
        group = f.group if (f.group is not None and f.group > done) else None
        tied.append(Fragment(outs[i:i + k], f.ownership, f.layout, f.pack, group, f.dtype))
        i += k
    result, j = [], 0
    for a in args:
        if isinstance(a, (list, tuple)):
            result.append(type(a)(tied[j:j + len(a)]))
            j += len(a)
        else:
            result.append(tied[j])
            j += 1
    return result[0] if len(result) == 1 else tuple(result)


def _pinned_values(after) -> list:
    """``after`` flattened into 32/64-bit register values the wait's asm can take as inputs."""
    items = list(after) if isinstance(after, (list, tuple)) else [after]
    out = []
    for x in items:
        if isinstance(x, (list, tuple)):
            out += _pinned_values(x)
        elif isinstance(x, Fragment):
            out += [_register(v) for v in x._cols]  # pending or not: only its registers are named
        elif isinstance(x, RuntimeValue):
            out.append(_register(x))
        else:
            raise KernelSourceError(f"wgmma_wait after= expects run-time values or fragments, but got {x!r}",
                                    user_location(), hint="compile-time values need no pinning")
    return out


def _register(v: RuntimeValue) -> RuntimeValue:
    """``v`` as a 32- or 64-bit register value (the widths inline asm constraints take)."""
    t = v.type
    if isinstance(t, PointerType):
        return lang.address(v)
    if t in (f32, i32, u32, b32, i64, u64):
        return v
    if t == f64:
        return lang.bitcast(v, i64)
    if t == i1:
        return lang.select(v, 1, 0)
    if t.bits == 16:
        return lang.cast(lang.bitcast(v, u16), u32)
    return lang.cast(v, i32)


def fence_operand(frag: Fragment) -> Fragment:
    """A compiler-only barrier on the fragment's registers (CUTLASS warpgroup_fence_operand)."""
    outs = emit("fence_operand", list(frag._cols))
    return Fragment(outs, frag.ownership, frag.layout, frag.pack, frag.group, frag.dtype)


def pack_operand_a(acc: Fragment, k: int, dtype: ScalarType = bf16) -> Fragment:
    """The RS A operand for k-step ``k`` (columns 16k..16k+15) of an f32 wgmma accumulator."""
    n = acc.layout.shape[1]
    if acc.layout != wgmma_acc(n):
        raise LayoutError(f"wgmma pack_operand_a expects a wgmma accumulator, but got {acc.layout}")
    if not isinstance(k, int) or not 0 <= k < n // 16:
        raise LayoutError(f"pack_operand_a k expects 0..{n // 16 - 1} for N={n}, but got {k!r}")
    if dtype not in (bf16, f16):
        raise LayoutError(f"pack_operand_a dtype expects bf16 or f16, but got {dtype}"
                          + ("; the fp8 A operand's bytes sit in other lanes than the accumulator's columns (a "
                             "shuffle away): build its words with ty.pack_fp8x4 and atom.a_fragment" if getattr(
                                 dtype, "is_fp8", False) else ""))
    vals = acc.values[8 * k: 8 * k + 8]
    ops = acc.ops
    words = [ops.pack2(vals[2 * r], vals[2 * r + 1], dtype) for r in range(4)]
    return Fragment(tuple(words), RS_A_OWNERSHIP, WGMMA_A_RS, pack=2, dtype=dtype)
