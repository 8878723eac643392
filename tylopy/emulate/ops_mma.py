"""Tensor-core ops from their per-lane fragments: mma.sync m16n8k16, ldmatrix, wgmma m64nNk16.

The fragment tables below are written from the PTX ISA (hopper-reference.md section 3), with
g = lane >> 2 and t = lane & 3; the low half of a b32 word holds the lower column (or k):

    mma.sync A (16x16)  a_r[h]: row g + 8*(r & 1),        col 2t + h + 8*(r >> 1)
    mma.sync B (16x8)   b_r[h]: k 2t + h + 8r,            n g
    mma.sync C/D        c_i:    row g + 8*(i >> 1),       col 2t + (i & 1)
    wgmma RS A          as mma.sync A, rows 16w + ... for warp w of the warpgroup
    wgmma D (64xN)      d_i:    row 16w + g + 8*((i >> 1) & 1), col 8*(i >> 2) + 2t + (i & 1)

Shared-memory operands of wgmma come from the 64-bit matrix descriptor, decoded as the PTX
ISA defines it (start address, LBO, SBO, base offset, swizzle mode), through the canonical
layouts of the ISA's "Shared Memory Matrix Layout" section, in elements of 16 bits
(T = 8 elements = 16 bytes; S = 16-byte chunks per swizzle row: 2, 4, 8 for 32B, 64B, 128B):

    K-major,  no swizzle:  ((8,m),(T,2k)):((1T,SBO),(1,LBO))
    K-major,  swizzled:    ((8,m),(T,2k)):((S*T,SBO),(1,T))
    MN-major, no swizzle:  ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))
    MN-major, swizzled:    ((T,S,m),(8,k)):((1,T,LBO),(S*T,SBO))

then Swizzle<B,4,3> on the absolute byte address. Products are exact and summed in float64,
then rounded once to f32; the tensor cores accumulate in their own order and precision, so
results can differ from the hardware in the last bits of f32.
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryAccessError, ProtocolError, UnsupportedOpError, where
from .ops_hopper import swizzle
from .ops_scalar import check_converged
from .program import handler
from .values import Pending, WARP, half_to_f32

_LANE = np.arange(WARP)
_G, _T = _LANE >> 2, _LANE & 3

# (register, lane, half) -> row/col of the 16x16 A tile (mma.sync A, wgmma RS A per warp)
A_ROW = np.array([[[_g + 8 * (r & 1) for h in (0, 1)] for _g in _G] for r in range(4)])
A_COL = np.array([[[2 * _t + h + 8 * (r >> 1) for h in (0, 1)] for _t in _T] for r in range(4)])
# (register, lane, half) -> k/n of the 16x8 B tile
B_K = np.array([[[2 * _t + h + 8 * r for h in (0, 1)] for _t in _T] for r in range(2)])
B_N = np.array([[[_g for h in (0, 1)] for _g in _G] for r in range(2)])
# (register, lane) -> row/col of the 16x8 C/D tile
C_ROW = np.array([[_g + 8 * (i >> 1) for _g in _G] for i in range(4)])
C_COL = np.array([[2 * _t + (i & 1) for _t in _T] for i in range(4)])


def wgmma_d_index(n: int):
    """(register, lane) -> (row within the warp's 16 rows, col) of the m64nNk16 accumulator."""
    i = np.arange(n // 2)[:, None]
    rows = _G[None, :] + 8 * ((i >> 1) & 1)
    cols = 8 * (i >> 2) + 2 * _T[None, :] + (i & 1)
    return rows, cols


def unpack_words(words: np.ndarray) -> np.ndarray:
    """uint32 words (..., 32) -> uint16 halves (..., 32, 2), low half first."""
    w = np.asarray(words, dtype=np.uint32)
    return np.stack([(w & 0xFFFF).astype(np.uint16), (w >> 16).astype(np.uint16)], axis=-1)


def a_tile(words, dtype: str) -> np.ndarray:
    """The 16x16 A tile (f32) from the four A words of each lane."""
    a = np.empty((16, 16), dtype=np.float32)
    a[A_ROW.ravel(), A_COL.ravel()] = half_to_f32(unpack_words(np.stack(words)).ravel(), dtype)
    return a


# -- mma.sync -------------------------------------------------------------------------------------------

@handler("mma_sync")
def make_mma_sync(prog, op):
    dtype = op.attr("dtype")
    if dtype not in ("bf16", "f16"):
        raise UnsupportedOpError(f"mma_sync dtype {dtype!r} at {where(op)}: the emulator knows bf16 and f16")
    s = [prog.slot(v) for v in op.operands]
    res = [prog.slot(v) for v in op.results]

    def run(w):
        check_converged(w, op, "mma.sync.aligned")
        env = w.env
        a = a_tile([env[x] for x in s[:4]], dtype)
        b = np.empty((16, 8), dtype=np.float32)
        b[B_K.ravel(), B_N.ravel()] = half_to_f32(unpack_words(np.stack([env[x] for x in s[4:6]])).ravel(), dtype)
        c = np.empty((16, 8), dtype=np.float64)
        c[C_ROW, C_COL] = np.stack([env[x] for x in s[6:10]])
        d = (a.astype(np.float64) @ b.astype(np.float64) + c).astype(np.float32)
        out = d[C_ROW, C_COL]
        for i, r in enumerate(res):
            env[r] = out[i]
    return False, run


@handler("ldmatrix")
def make_ldmatrix(prog, op):
    num, trans = op.attr("num"), bool(op.attr("trans"))
    p = prog.slot(op.operands[0])
    res = [prog.slot(v) for v in op.results]

    def run(w):
        check_converged(w, op, "ldmatrix.sync.aligned")
        smem = w.cta.smem
        addrs = w.env[p].astype(np.int64)[: 8 * num]
        lanes = np.arange(8 * num)
        if (addrs % 16).any():
            k = int(np.argmax(addrs % 16 != 0))
            raise MemoryAccessError(f"ldmatrix at {where(op)} ({w.describe()}): lane {k} gives row address "
                                    f"{int(addrs[k])}, which is not 16-byte aligned")
        rows = smem.load(addrs, np.dtype(np.uint16), 8, op, w, lanes).reshape(num, 8, 8)
        if trans:
            rows = rows.transpose(0, 2, 1)
        lo = rows[:, _G, 2 * _T].astype(np.uint32)
        hi = rows[:, _G, 2 * _T + 1].astype(np.uint32)
        words = lo | (hi << np.uint32(16))
        for j, r in enumerate(res):
            w.env[r] = words[j]
    return False, run


# -- wgmma ------------------------------------------------------------------------------------------------

SWIZZLE_MODES = {0: 0, 1: 128, 2: 64, 3: 32}


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


def _uniform_u64(x: np.ndarray, op, w, what: str) -> int:
    if not (x == x[0]).all():
        raise ProtocolError(f"wgmma at {where(op)} ({w.describe()}): {what} differs between lanes; it must be "
                            "the same in every thread of the warpgroup")
    return int(x[0])


def read_operand(w, op, desc: int, rows: int, k_major: bool, dtype: str, what: str) -> np.ndarray:
    """The (rows, 16) f32 operand the descriptor names, with the proxy-fence check."""
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
    smem.check_async_read(np.concatenate([flat, flat + 1]), op, w, f"wgmma ({what})")
    bits = smem.buf.view(np.uint16)[flat >> 1].reshape(addrs.shape)
    return half_to_f32(bits, dtype).reshape(addrs.shape)


@handler("wgmma")
def make_wgmma(prog, op):
    n, dtype, kind = op.attr("n"), op.attr("dtype"), op.attr("a_kind")
    trans_b, zero = int(op.attr("trans_b")), bool(op.attr("zero_init", False))
    nacc = n // 2
    s = [prog.slot(v) for v in op.operands]
    acc = [] if zero else s[:nacc]
    rest = s[(0 if zero else nacc):]
    a_slots = rest[:4] if kind == "rs" else rest[:1]
    b_slot = rest[len(a_slots)]
    scale_slot = None if zero else rest[len(a_slots) + 1]
    res = [prog.slot(v) for v in op.results]
    d_rows, d_cols = wgmma_d_index(n)

    def run(w):
        check_converged(w, op, "wgmma.mma_async")
        env = w.env
        regs = [env[x] for x in acc] + ([env[x] for x in a_slots] if kind == "rs" else [])
        ordinary = any(type(v) is not Pending for v in regs)
        if not w.ever_fenced or (ordinary and not w.fence_ok):
            raise ProtocolError(
                f"wgmma at {where(op)} ({w.describe()}) without wgmma_fence(): a wgmma.fence must come before the "
                "first wgmma and between ordinary accesses to accumulator or A registers and the wgmma that uses "
                "them (no fence since " + ("the start of the kernel)" if not w.ever_fenced else
                                           f"the last wgmma_wait at {where(w.last_wait_op)})"))
        desc_b = _uniform_u64(env[b_slot], op, w, "desc_b")
        desc_a = _uniform_u64(env[a_slots[0]], op, w, "desc_a") if kind == "ss" else None
        scale = True if zero else bool(_uniform_u64(env[scale_slot].astype(np.uint64), op, w, "scale_d"))
        w.cta.check_warpgroup_collective(w, op, ("wgmma", desc_a, desc_b, scale))
        q = w.wid % 4
        b = read_operand(w, op, desc_b, n, not trans_b, dtype, "B")  # (N, 16)
        if kind == "ss":
            a = read_operand(w, op, desc_a, 64, True, dtype, "A")[16 * q:16 * q + 16]
        else:
            if any(type(v) is Pending for v in regs[nacc if not zero else 0:]):
                raise ProtocolError(f"wgmma at {where(op)}: the register A operand is a pending wgmma result")
            a = a_tile(regs[-4:], dtype)
        d = a.astype(np.float64) @ b.T.astype(np.float64)
        if not zero and scale:
            c = np.empty((16, n), dtype=np.float64)
            c[d_rows, d_cols] = np.stack([v.value if type(v) is Pending else v for v in regs[:nacc]])
            d += c
        out = d.astype(np.float32)[d_rows, d_cols]
        group = w.committed
        w.wgmma_open = True
        for i, r in enumerate(res):
            env[r] = Pending(out[i], group, op)
    return False, run


@handler("wgmma_fence")
def make_wgmma_fence(prog, op):
    def run(w):
        check_converged(w, op, "wgmma.fence")
        w.cta.check_warpgroup_collective(w, op, ("wgmma_fence",))
        w.fence_ok = w.ever_fenced = True
    return False, run


@handler("wgmma_commit")
def make_wgmma_commit(prog, op):
    def run(w):
        check_converged(w, op, "wgmma.commit_group")
        w.cta.check_warpgroup_collective(w, op, ("wgmma_commit",))
        w.committed += 1
        w.wgmma_open = False
    return False, run


@handler("wgmma_wait")
def make_wgmma_wait(prog, op):
    n = op.attr("n")
    pairs = [(prog.slot(a), prog.slot(b)) for a, b in zip(op.operands, op.results)]

    def run(w):
        check_converged(w, op, f"wgmma.wait_group {n}")
        w.cta.check_warpgroup_collective(w, op, ("wgmma_wait", n))
        w.waited = max(w.waited, w.committed - n)
        w.fence_ok = False
        w.last_wait_op = op
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
