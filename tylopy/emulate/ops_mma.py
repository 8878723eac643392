"""mma.sync m16n8k16 and ldmatrix from their per-lane fragments.

The fragment tables below are written from the PTX ISA (hopper-reference.md section 3), with
g = lane >> 2 and t = lane & 3; the low half of a b32 word holds the lower column (or k):

    mma.sync A (16x16)  a_r[h]: row g + 8*(r & 1),        col 2t + h + 8*(r >> 1)
    mma.sync B (16x8)   b_r[h]: k 2t + h + 8r,            n g
    mma.sync C/D        c_i:    row g + 8*(i >> 1),       col 2t + (i & 1)
    ldmatrix            lane l of matrix j: row l >> 2, cols 2(l & 3), 2(l & 3) + 1 (.trans: transposed)

The f32 accumulation follows the hardware's (``tensorcore.py``: alignment to the largest
exponent, truncation, rounding toward zero; bit-identical to an H200 on the measured tiles).
The wgmma RS A operand uses the same A table per warp (``ops_wgmma``).
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryAccessError, UnsupportedOpError, where
from .ops_scalar import check_converged
from .compiled import handler
from ..semantics.tensorcore import mma_f32
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
        c = np.empty((16, 8), dtype=np.float32)
        c[C_ROW, C_COL] = np.stack([env[x] for x in s[6:10]])
        out = mma_f32(a, b, c, dtype)[C_ROW, C_COL]
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
