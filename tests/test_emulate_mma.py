"""mma.sync m16n8k16 and ldmatrix in the emulator, against torch and against fragment tables
written here from the PTX ISA (g = lane >> 2, t = lane & 3; low half = lower column)."""
import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.emulate import ProtocolError
from test_emulate_dsl import ldmatrix, line_of, mma_sync, word_of

HERE = __file__


def mma_kernel(dt):
    @ty.kernel(threads=32, name=f"mma_tile_{dt}")
    def mma_tile(a: ty.ptr(dt), b: ty.ptr(dt), c: ty.ptr(ty.f32), d: ty.ptr(ty.f32)):
        lane = ty.lane_id()
        g, t = lane >> 2, lane & 3
        # A 16x16 row-major: a_r holds row g + 8(r&1), columns 2t + 8(r>>1) and the next one
        A = [word_of(a[(g + 8 * (r & 1)) * 16 + 2 * t + 8 * (r >> 1)],
                     a[(g + 8 * (r & 1)) * 16 + 2 * t + 8 * (r >> 1) + 1]) for r in range(4)]
        # B 16x8 (K x N) row-major: b_r holds k = 2t + 8r and 2t + 8r + 1 of column g
        B = [word_of(b[(2 * t + 8 * r) * 8 + g], b[(2 * t + 8 * r + 1) * 8 + g]) for r in range(2)]
        C = [c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] for i in range(4)]
        D = mma_sync(A, B, C, dtype=dt.name)
        for i in range(4):
            d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = D[i]
    return mma_tile


MMA = {"bf16": mma_kernel(ty.bf16), "f16": mma_kernel(ty.f16)}


@ty.kernel(threads=32)
def ldmatrix_tile(src: ty.ptr(ty.bf16), out: ty.ptr(ty.b32), TRANS: ty.constexpr):
    buf = ty.shared(ty.bf16, 256, align=16)
    lane = ty.lane_id()
    for k in ty.static_range(8):
        buf[lane * 8 + k] = src[lane * 8 + k]
    ty.syncthreads()
    j = lane >> 3  # matrix j: rows 8(j&1).., columns 8(j>>1)..
    row = (lane & 7) + 8 * (j & 1)
    regs = ldmatrix(buf + row * 16 + 8 * (j >> 1), 4, trans=TRANS)
    for r in range(4):
        out[r * 32 + lane] = regs[r]


@ty.kernel(threads=32)
def ldmatrix_then_mma(a: ty.ptr(ty.bf16), b: ty.ptr(ty.bf16), d: ty.ptr(ty.f32)):
    buf = ty.shared(ty.bf16, 256, align=16)
    lane = ty.lane_id()
    g, t = lane >> 2, lane & 3
    for k in ty.static_range(8):
        buf[lane * 8 + k] = a[lane * 8 + k]
    ty.syncthreads()
    j = lane >> 3
    A = ldmatrix(buf + ((lane & 7) + 8 * (j & 1)) * 16 + 8 * (j >> 1), 4)
    B = [word_of(b[(2 * t + 8 * r) * 8 + g], b[(2 * t + 8 * r + 1) * 8 + g]) for r in range(2)]
    zero = ty.cast(0.0, ty.f32)
    D = mma_sync(A, B, [zero, zero, zero, zero])
    for i in range(4):
        d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = D[i]


@ty.kernel(threads=32)
def mma_diverged(a: ty.ptr(ty.b32), d: ty.ptr(ty.f32)):
    lane = ty.lane_id()
    w = a[lane]
    zero = ty.cast(0.0, ty.f32)
    out = zero
    if lane < 16:
        out = mma_sync([w, w, w, w], [w, w], [zero, zero, zero, zero])[0]  # <- mma_diverged
    d[lane] = out


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_mma_sync_matches_torch(dt):
    torch.manual_seed(1)
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dt]
    a, b = torch.randn(16, 16).to(tdt), torch.randn(16, 8).to(tdt)
    c = torch.randn(16, 8)
    d = torch.zeros(16, 8)
    MMA[dt].emulate(a, b, c, d, grid=1)
    want = a.double() @ b.double() + c.double()
    assert torch.allclose(d.double(), want, atol=1e-5, rtol=1e-6)
    assert torch.equal(d, want.float())  # f64 sum rounded once


def oracle_ldmatrix(tile: np.ndarray, trans: bool) -> np.ndarray:
    """Words (4, 32) from the PTX ldmatrix table: lane l of matrix j holds row l//4, cols 2(l%4)+h."""
    bits = tile.view(np.uint16)
    out = np.zeros((4, 32), dtype=np.uint32)
    for j in range(4):
        m = bits[8 * (j & 1):8 * (j & 1) + 8, 8 * (j >> 1):8 * (j >> 1) + 8]
        if trans:
            m = m.T
        for lane in range(32):
            lo, hi = m[lane // 4, 2 * (lane % 4)], m[lane // 4, 2 * (lane % 4) + 1]
            out[j, lane] = int(lo) | (int(hi) << 16)
    return out


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_x4_against_ptx_table(trans):
    src = torch.arange(256, dtype=torch.float32).to(torch.bfloat16)
    out = torch.zeros(128, dtype=torch.int32)
    ldmatrix_tile.emulate(src, out, grid=1, TRANS=trans)
    want = oracle_ldmatrix(src.view(torch.int16).numpy().reshape(16, 16), trans)
    assert np.array_equal(out.numpy().view(np.uint32).reshape(4, 32), want)


def test_ldmatrix_x4_gives_the_mma_a_fragment():
    torch.manual_seed(2)
    a, b = torch.randn(16, 16).to(torch.bfloat16), torch.randn(16, 8).to(torch.bfloat16)
    d = torch.zeros(16, 8)
    ldmatrix_then_mma.emulate(a, b, d, grid=1)
    assert torch.equal(d, (a.double() @ b.double()).float())


def test_mma_sync_in_a_diverged_warp_is_an_error():
    with pytest.raises(ProtocolError, match=f"mma.sync.aligned at .*:{line_of(HERE, 'mma_diverged')}.*diverged"):
        mma_diverged.emulate(torch.zeros(32, dtype=torch.int32), torch.zeros(32), grid=1)
