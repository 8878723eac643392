"""mma.sync (m16n8k16, m16n8k8), ldmatrix and stmatrix from their per-lane fragments.

The fragment tables below are written from the PTX ISA ("Matrix Fragments for mma.m16n8k16 /
mma.m16n8k8", "ldmatrix", "stmatrix"), with g = lane >> 2 and t = lane & 3; the low half of a
b32 word holds the lower column (or k):

    m16n8k16 A (16x16)  a_r[h]: row g + 8*(r & 1),        col 2t + h + 8*(r >> 1)
    m16n8k16 B (16x8)   b_r[h]: k 2t + h + 8r,            n g
    m16n8k8 A (16x8)    a_r[h]: row g + 8r,               col 2t + h
    m16n8k8 B (8x8)     b0[h]:  k 2t + h,                 n g
    mma.sync C/D        c_i:    row g + 8*(i >> 1),       col 2t + (i & 1)
    ldmatrix/stmatrix   lane 8j + i gives the address of row i of matrix j; word j of lane l is
                        row l >> 2, cols 2(l & 3), 2(l & 3) + 1 of matrix j (.trans: transposed)

The f32 accumulation follows the hardware's (``tensorcore.py``: alignment to the largest
exponent, truncation, rounding toward zero; bit-identical to an H200 on the measured tiles).
The wgmma RS A operand uses the same A table per warp (``ops_wgmma``).
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryAccessError, UnsupportedOpError, where
from .ops_scalar import check_converged
from .compiled import handler
from ..semantics.fp8 import fp8_to_f32
from ..semantics.tensorcore import mma_f32, mma_sync_fp8
from .values import WARP, half_to_f32

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
# m16n8k8: (register, lane, half) -> row/col of the 16x8 A tile, k/n of the 8x8 B tile
A8_ROW = np.array([[[_g + 8 * r for h in (0, 1)] for _g in _G] for r in range(2)])
A8_COL = np.array([[[2 * _t + h for h in (0, 1)] for _t in _T] for r in range(2)])
B8_K = np.array([[[2 * _t + h for h in (0, 1)] for _t in _T]])
B8_N = np.array([[[_g for h in (0, 1)] for _g in _G]])
# shape -> (A rows/cols tables, B k/n tables, K)
TABLES = {"m16n8k16": (A_ROW, A_COL, B_K, B_N, 16), "m16n8k8": (A8_ROW, A8_COL, B8_K, B8_N, 8)}


def unpack_words(words: np.ndarray) -> np.ndarray:
    """uint32 words (..., 32) -> uint16 halves (..., 32, 2), low half first."""
    w = np.asarray(words, dtype=np.uint32)
    return np.stack([(w & 0xFFFF).astype(np.uint16), (w >> 16).astype(np.uint16)], axis=-1)


def a_tile(words, dtype: str, shape: str = "m16n8k16") -> np.ndarray:
    """The 16xK A tile (f32) from the A words of each lane."""
    rows, cols, _, _, k = TABLES[shape]
    a = np.empty((16, k), dtype=np.float32)
    a[rows.ravel(), cols.ravel()] = half_to_f32(unpack_words(np.stack(words)).ravel(), dtype)
    return a


def b_tile(words, dtype: str, shape: str = "m16n8k16") -> np.ndarray:
    """The Kx8 B tile (f32) from the B words of each lane."""
    _, _, ks, ns, k = TABLES[shape]
    b = np.empty((k, 8), dtype=np.float32)
    b[ks.ravel(), ns.ravel()] = half_to_f32(unpack_words(np.stack(words)).ravel(), dtype)
    return b


# -- mma.sync -------------------------------------------------------------------------------------------

@handler("mma_sync")
def make_mma_sync(prog, op):
    dtype = op.attr("dtype")
    shape = op.attr("shape", "m16n8k16")
    if shape == "m16n8k32":
        return _make_mma_fp8(prog, op, dtype, op.attr("b_dtype") or dtype)
    if dtype not in ("bf16", "f16"):
        raise UnsupportedOpError(f"mma_sync dtype {dtype!r} at {where(op)}: the emulator knows bf16 and f16")
    if shape not in TABLES:
        raise UnsupportedOpError(f"mma_sync shape {shape!r} at {where(op)}: the emulator knows {', '.join(TABLES)}")
    s = [prog.slot(v) for v in op.operands]
    res = [prog.slot(v) for v in op.results]
    na = 4 if shape == "m16n8k16" else 2
    nb = na // 2

    def run(w):
        check_converged(w, op, "mma.sync.aligned")
        env = w.env
        a = a_tile([env[x] for x in s[:na]], dtype, shape)
        b = b_tile([env[x] for x in s[na:na + nb]], dtype, shape)
        c = np.empty((16, 8), dtype=np.float32)
        c[C_ROW, C_COL] = np.stack([env[x] for x in s[na + nb:na + nb + 4]])
        out = mma_f32(a, b, c, dtype)[C_ROW, C_COL]
        for i, r in enumerate(res):
            env[r] = out[i]
    return False, run


def _fp8_tile(words, fmt: str, rows, cols, shape) -> np.ndarray:
    """A (16x32) or B (32x8) tile of an fp8 mma from its words: element 4r + h at (rows, cols)[r, lane, h]."""
    w = np.stack(words).astype(np.uint32)  # (registers, 32)
    codes = np.stack([(w >> np.uint32(8 * h)) & np.uint32(0xFF) for h in range(4)], axis=-1).astype(np.uint8)
    out = np.empty(shape, dtype=np.float32)
    out[rows.ravel(), cols.ravel()] = fp8_to_f32(codes.ravel(), fmt)
    return out


_H4 = np.arange(4)[None, None, :]
_R4 = np.arange(4)[:, None, None]
_R2 = np.arange(2)[:, None, None]
A32_ROW = np.broadcast_to(_G[None, :, None] + 8 * (_R4 & 1), (4, 32, 4))
A32_COL = 4 * _T[None, :, None] + _H4 + 16 * (_R4 >> 1)
B32_K = 4 * _T[None, :, None] + _H4 + 16 * _R2
B32_N = np.broadcast_to(_G[None, :, None], (2, 32, 4))


def _make_mma_fp8(prog, op, a_fmt: str, b_fmt: str):
    """mma.sync m16n8k32 with e4m3/e5m2 operands (sm_89+): as sm_90 runs it (two f16 MMAs, then + C)."""
    s = [prog.slot(v) for v in op.operands]
    res = [prog.slot(v) for v in op.results]

    def run(w):
        check_converged(w, op, "mma.sync.aligned")
        env = w.env
        a = _fp8_tile([env[x] for x in s[:4]], a_fmt, A32_ROW, A32_COL, (16, 32))
        b = _fp8_tile([env[x] for x in s[4:6]], b_fmt, B32_K, B32_N, (32, 8))
        c = np.empty((16, 8), dtype=np.float32)
        c[C_ROW, C_COL] = np.stack([env[x] for x in s[6:10]])
        out = mma_sync_fp8(a, b, c)[C_ROW, C_COL]
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
        addrs, lanes = row_addresses(w, op, p, num, "ldmatrix")
        rows = smem.load(addrs, np.dtype(np.uint16), 8, op, w, lanes).reshape(num, 8, 8)
        if trans:
            rows = rows.transpose(0, 2, 1)
        lo = rows[:, _G, 2 * _T].astype(np.uint32)
        hi = rows[:, _G, 2 * _T + 1].astype(np.uint32)
        words = lo | (hi << np.uint32(16))
        for j, r in enumerate(res):
            w.env[r] = words[j]
    return False, run


def row_addresses(w, op, p, num: int, what: str):
    """The shared row addresses lanes 0 .. 8 num - 1 give (lane 8j + i: row i of matrix j), checked."""
    addrs = w.env[p].astype(np.int64)[: 8 * num]
    lanes = np.arange(8 * num)
    if (addrs % 16).any():
        k = int(np.argmax(addrs % 16 != 0))
        raise MemoryAccessError(f"{what} at {where(op)} ({w.describe()}): lane {k} gives row address "
                                f"{int(addrs[k])}, which is not 16-byte aligned")
    return addrs, lanes


@handler("stmatrix")
def make_stmatrix(prog, op):
    num, trans = op.attr("num"), bool(op.attr("trans"))
    p = prog.slot(op.operands[0])
    src = [prog.slot(v) for v in op.operands[1:]]

    def run(w):
        check_converged(w, op, "stmatrix.sync.aligned")
        addrs, lanes = row_addresses(w, op, p, num, "stmatrix")
        words = np.stack([np.asarray(w.env[s], dtype=np.uint32) for s in src])  # (num, 32)
        rows = np.empty((num, 8, 8), dtype=np.uint16)
        rows[:, _G, 2 * _T] = (words & np.uint32(0xFFFF)).astype(np.uint16)
        rows[:, _G, 2 * _T + 1] = (words >> np.uint32(16)).astype(np.uint16)
        if trans:
            rows = rows.transpose(0, 2, 1)
        w.cta.smem.store(addrs, np.ascontiguousarray(rows.reshape(8 * num, 8)), np.dtype(np.uint16), op, w, lanes)
    return False, run
