"""wgmma.mma_async m64nNk16 (SS and RS), its fence, commit groups and waits.

wgmma is collective over the 4 warps of a warpgroup: each warp waits at the instruction until
all four have issued it (a warp that never does leaves the others in a reported deadlock);
then the 64 x N product is computed once, from shared memory as it is at that moment.

Accumulator layout, from the PTX ISA (docs/hopper.md, "Register layouts"), g = lane >> 2, t = lane & 3,
warp w of the warpgroup: d_i holds row 16w + g + 8((i >> 1) & 1), column 8(i >> 2) + 2t + (i & 1).
The RS A operand of warp w is the mma.sync A table on rows 16w..16w+15.

Shared-memory operands come from the 64-bit matrix descriptor, decoded as the PTX ISA defines it
(start address, LBO, SBO, base offset, swizzle mode), through the canonical layouts of the
ISA's "Shared Memory Matrix Layout" section, in 16-bit elements (T = 8 elements = 16 bytes;
S = 16-byte chunks per swizzle row: 2, 4, 8 for 32B, 64B, 128B):

    K-major,  no swizzle:  ((8,m),(T,2k)):((1T,SBO),(1,LBO))
    K-major,  swizzled:    ((8,m),(T,2k)):((S*T,SBO),(1,T))
    MN-major, no swizzle:  ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))
    MN-major, swizzled:    ((T,S,m),(8,k)):((1,T,LBO),(S*T,SBO))

then Swizzle<B,4,3> on the absolute byte address. imm-trans-b = 1 reads B MN-major and
imm-trans-a = 1 (SS only) reads A MN-major; register A (RS) is always K-major. Each wgmma accumulates in f32
the way the hardware does (``tensorcore.py``).

8-bit operands (e4m3/e5m2, k32) occupy the same bytes as a k16 tile of 16-bit elements: byte 2j
and 2j + 1 of "element" j are k 2j and 2j + 1 (both K-major, the only layout the ISA allows for
them); the RS A register holds four codes, k 4t + h + 16(r >> 1). f16 accumulators are n/4 b32
words, word j holding elements 2j (low half) and 2j + 1.

Results are ``Pending`` in the warp's open commit group until a wgmma_wait passes them through
(``program.pending_read_error`` for readers that do not wait).
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryAccessError, ProtocolError, UnsupportedOpError, where
from .ops_hopper import swizzle
from .ops_mma import _G, _T, a_tile
from .ops_scalar import check_converged
from .compiled import handler
from .sync import Wait
from ..semantics.fp8 import fp8_to_f32
from ..semantics.tensorcore import mma_f32, mma_fp8, round_toward_zero_f16
from .values import Pending, half_to_f32

SWIZZLE_MODES = {0: 0, 1: 128, 2: 64, 3: 32}
FP8 = ("e4m3", "e5m2")


def wgmma_d_index(n: int):
    """(register, lane) -> (row within the warp's 16 rows, col) of the m64nNk16 accumulator."""
    i = np.arange(n // 2)[:, None]
    rows = _G[None, :] + 8 * ((i >> 1) & 1)
    cols = 8 * (i >> 2) + 2 * _T[None, :] + (i & 1)
    return rows, cols


def decode_descriptor(desc: int) -> dict:
    """The fields of a wgmma shared-memory matrix descriptor (PTX ISA 'Matrix Descriptor Format')."""
    return {"start": (desc & 0x3FFF) << 4, "lbo": ((desc >> 16) & 0x3FFF) << 4,
            "sbo": ((desc >> 32) & 0x3FFF) << 4, "base_offset": (desc >> 49) & 7,
            "swizzle": SWIZZLE_MODES[(desc >> 62) & 3], "bit46": (desc >> 46) & 1}


def operand_addresses(desc: int, rows: int, k_major: bool) -> np.ndarray:
    """Byte addresses (rows, 16) of a rows x k16 operand of 16-bit elements in shared memory."""
    f = decode_descriptor(desc)
    mn = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    sw = f["swizzle"]
    S = sw // 16
    if k_major:
        if sw == 0:
            off = (mn % 8) * 16 + (mn // 8) * f["sbo"] + (k % 8) * 2 + (k // 8) * f["lbo"]
        else:
            off = (mn % 8) * (S * 16) + (mn // 8) * f["sbo"] + (k % 8) * 2 + (k // 8) * 16
    elif sw == 0:
        off = (mn % 8) * 2 + (mn // 8) * f["sbo"] + (k % 8) * 16 + (k // 8) * f["lbo"]
    else:
        off = (mn % 8) * 2 + ((mn // 8) % S) * 16 + (mn // (8 * S)) * f["lbo"] + (k % 8) * (S * 16) \
            + (k // 8) * f["sbo"]
    return swizzle((f["start"] + off).astype(np.int64), sw)


def _uniform(x: np.ndarray, op, w, what: str) -> int:
    if not (x == x[0]).all():
        raise ProtocolError(f"wgmma at {where(op)} ({w.describe()}): {what} differs between lanes; it must be "
                            "the same in every thread of the warpgroup")
    return int(x[0])


def read_operand(w, op, desc: int, rows: int, k_major: bool, dtype: str, what: str):
    """The (rows, 16) f32 operand a descriptor names, and the byte indices read."""
    f = decode_descriptor(desc)
    if f["bit46"]:
        raise ProtocolError(f"wgmma at {where(op)}: {what} descriptor {desc:#x} sets bit 46, which belongs to the "
                            "Blackwell tcgen05 descriptor; sm_90 descriptors keep it 0")
    if f["base_offset"] and f["swizzle"]:
        raise UnsupportedOpError(f"wgmma at {where(op)}: {what} descriptor {desc:#x} has base offset "
                                 f"{f['base_offset']}; the emulator supports swizzle patterns that start on their "
                                 "repeat boundary (base offset 0) only")
    cache = w.cta.launch.desc_cache
    key = (desc, rows, k_major)
    addrs = cache.get(key)
    if addrs is None:
        addrs = cache[key] = operand_addresses(desc, rows, k_major)
    smem = w.cta.smem
    if int(addrs.max()) + 2 > smem.size:
        raise MemoryAccessError(f"wgmma at {where(op)} ({w.describe()}): {what} descriptor {desc:#x} reaches shared "
                                f"byte {int(addrs.max()) + 2}, past the CTA's {smem.size} bytes")
    flat = addrs.ravel()
    bi = np.concatenate([flat, flat + 1])
    smem.check_async_read(bi, op, w, f"wgmma ({what})")
    if dtype in FP8:
        codes = np.stack([smem.buf[addrs], smem.buf[addrs + 1]], axis=-1).reshape(rows, 32)  # k 2j, 2j + 1
        return fp8_to_f32(codes, dtype), bi
    bits = smem.buf.view(np.uint16)[flat >> 1]
    return half_to_f32(bits, dtype).reshape(addrs.shape), bi


def a_tile_fp8(words, dtype: str) -> np.ndarray:
    """The 16x32 A tile (f32) from the four A words (four codes each) of each lane."""
    w = np.stack(words).astype(np.uint32)  # (4, 32)
    r, h = np.arange(4)[:, None, None], np.arange(4)[None, None, :]
    rows = np.broadcast_to(_G[None, :, None] + 8 * (r & 1), (4, 32, 4))
    cols = 4 * _T[None, :, None] + h + 16 * (r >> 1)
    codes = ((w[:, :, None] >> (8 * h).astype(np.uint32)) & 0xFF).astype(np.uint8)
    a = np.empty((16, 32), dtype=np.float32)
    a[rows.ravel(), cols.ravel()] = fp8_to_f32(codes.ravel(), dtype)
    return a


def _unpack_f16_acc(words) -> np.ndarray:
    """n/4 words (each (32,)) of f16 pairs -> (n/2, 32) f32, element 2j from word j's low half."""
    w = np.stack(words).astype(np.uint32)
    lo = (w & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
    hi = (w >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
    return np.stack([lo, hi], axis=1).reshape(-1, w.shape[1])


def _pack_f16_acc(vals: np.ndarray) -> np.ndarray:
    """(n/2, 32) f16-exact f32 values -> (n/4, 32) uint32 words."""
    h = vals.astype(np.float16).view(np.uint16).astype(np.uint32)
    return h[0::2] | (h[1::2] << np.uint32(16))


@handler("wgmma")
def make_wgmma(prog, op):
    n, dtype, kind = op.attr("n"), op.attr("dtype"), op.attr("a_kind")
    b_dtype, acc_f16 = op.attr("b_dtype") or dtype, op.attr("acc", "f32") == "f16"
    trans_b, zero = int(op.attr("trans_b")), bool(op.attr("zero_init", False))
    trans_a = int(op.attr("trans_a", 0) or 0)
    fp8 = dtype in FP8
    nacc = n // 4 if acc_f16 else n // 2
    s = [prog.slot(v) for v in op.operands]
    acc = [] if zero else s[:nacc]
    rest = s[(0 if zero else nacc):]
    a_slots = rest[:4] if kind == "rs" else rest[:1]
    b_slot = rest[len(a_slots)]
    scale_slot = None if zero else rest[len(a_slots) + 1]
    res = [prog.slot(v) for v in op.results]
    d_rows, d_cols = wgmma_d_index(n)

    def compute(w, inst, desc_a, desc_b, scale):
        """The whole warpgroup's product, once all 4 warps have issued the instruction."""
        b, b_bytes = read_operand(w, op, desc_b, n, not trans_b, b_dtype, "B")  # (N, K)
        reads = [b_bytes]
        if kind == "ss":
            a_all, a_bytes = read_operand(w, op, desc_a, 64, not trans_a, dtype, "A")
            reads.append(a_bytes)
        bt = np.ascontiguousarray(b.T)
        for q, (accs, words) in inst.inputs.items():
            if kind == "ss":
                a = a_all[16 * q:16 * q + 16]
            else:
                a = a_tile_fp8(words, dtype) if fp8 else a_tile(words, dtype)
            c = None
            if not zero and scale:
                c = np.empty((16, n), dtype=np.float32)
                c[d_rows, d_cols] = _unpack_f16_acc(accs) if acc_f16 else np.stack(accs)
            if fp8:
                d = mma_fp8(a, bt, c, (dtype, b_dtype), "f16" if acc_f16 else "f32")[d_rows, d_cols]
            else:
                d = mma_f32(a, bt, c, dtype)[d_rows, d_cols]
                if acc_f16:
                    d = round_toward_zero_f16(d)
            inst.outputs[q] = _pack_f16_acc(d) if acc_f16 else d
        inst.reads = np.concatenate(reads)
        cta = w.cta
        warps = list(range(4 * inst.wg, 4 * inst.wg + 4))
        if cta.smem.check_races:  # the read follows every warp's issue: any of them may order a write before it
            cta.smem.check_raw(inst.reads, -1, cta.clock[warps].max(axis=0), op, w, "(its wgmma) reads")
        cta.smem.async_read_begin(inst.reads, inst.wg, inst.uid, op)
        cta.wg_reads.setdefault(inst.wg, []).append(inst)
        cta.recent_wgmma[inst.uid] = inst
        if len(cta.recent_wgmma) > 256:
            del cta.recent_wgmma[next(iter(cta.recent_wgmma))]
        inst.done = True

    def run(w):
        check_converged(w, op, "wgmma.mma_async")
        env = w.env
        regs = [env[x] for x in acc] + ([env[x] for x in a_slots] if kind == "rs" else [])
        ordinary = any(type(v) is not Pending for v in regs)
        if not w.ever_fenced or (ordinary and not w.fence_ok):
            since = ("the start of the kernel" if not w.ever_fenced
                     else f"the last wgmma_wait at {where(w.last_wait_op)}")
            raise ProtocolError(
                f"wgmma at {where(op)} ({w.describe()}) without wgmma_fence(): a wgmma.fence must come before the "
                "first wgmma and between ordinary accesses to accumulator or A registers and the wgmma that uses "
                f"them (no fence since {since})")
        if kind == "rs" and any(type(v) is Pending for v in regs[-4:]):
            raise ProtocolError(f"wgmma at {where(op)} ({w.describe()}): the register A operand is a pending wgmma "
                                "result; pass it through wgmma_wait first")
        desc_b = _uniform(env[b_slot], op, w, "desc_b")
        desc_a = _uniform(env[a_slots[0]], op, w, "desc_a") if kind == "ss" else None
        scale = True if zero else bool(_uniform(env[scale_slot].astype(np.uint64), op, w, "scale_d"))
        inst = w.cta.collective(w, op, ("wgmma", desc_a, desc_b, scale))
        q = w.wid % 4
        accs = [v.value if type(v) is Pending else v for v in regs[:len(acc)]]
        inst.inputs[q] = (accs, regs[len(acc):] if kind == "rs" else None)
        inst.issue_epochs[w.wid] = int(w.cta.vc[w.wid, w.wid])
        if len(inst.inputs) == 4:
            compute(w, inst, desc_a, desc_b, scale)
        else:
            yield Wait(lambda: inst.done, op,
                       lambda: f"wgmma (warpgroup-collective): warps {inst.missing()} of warpgroup {inst.wg} have "
                               "not issued it", inst)
        out = inst.outputs[q]
        group = w.committed
        for i, r in enumerate(res):
            env[r] = Pending(out[i], group, op)
        inst.group = group

    return True, run


@handler("wgmma_fence")
def make_wgmma_fence(prog, op):
    def run(w):
        check_converged(w, op, "wgmma.fence")
        w.cta.collective(w, op, ("wgmma_fence",))
        w.fence_ok = w.ever_fenced = True
    return False, run


@handler("wgmma_commit")
def make_wgmma_commit(prog, op):
    def run(w):
        check_converged(w, op, "wgmma.commit_group")
        w.cta.collective(w, op, ("wgmma_commit",))
        w.committed += 1
    return False, run


def _retire_reads(w):
    """This wait covers some wgmmas of w's warpgroup: w has seen their shared-memory reads finish."""
    cta = w.cta
    wg, q = w.wid // 4, w.wid % 4
    pending = cta.wg_reads.get(wg)
    if not pending:
        return
    keep = []
    for inst in pending:
        if inst.group is not None and inst.group < w.waited and q not in inst.retired:
            cta.smem.async_read_done(inst.reads, wg, q, inst.uid, cta.vc[w.wid, w.wid])
            inst.retired.add(q)
        if len(inst.retired) < 4:
            keep.append(inst)
    cta.wg_reads[wg] = keep


@handler("wgmma_wait")
def make_wgmma_wait(prog, op):
    n = op.attr("n")
    pairs = [(prog.slot(a), prog.slot(b)) for a, b in zip(op.operands, op.results)]

    def run(w):
        check_converged(w, op, f"wgmma.wait_group {n}")
        w.cta.collective(w, op, ("wgmma_wait", n))
        w.waited = max(w.waited, w.committed - n)
        w.fence_ok = False
        w.last_wait_op = op
        _retire_reads(w)
        env = w.env
        for src, dst in pairs:
            v = env[src]
            env[dst] = v.value if type(v) is Pending and v.group < w.waited else v
    return False, run


@handler("fence_operand")
def make_fence_operand(prog, op):
    pairs = [(prog.slot(a), prog.slot(b)) for a, b in zip(op.operands, op.results)]

    def run(w):
        env = w.env
        for src, dst in pairs:
            env[dst] = env[src]
    return False, run
