"""mma.sync m16n8k16 and ldmatrix in the emulator, against torch and against fragment tables
written here from the PTX ISA (g = lane >> 2, t = lane & 3; low half = lower column)."""
import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.emulate import ProtocolError
from emulate_dsl import ldmatrix, line_of, mma_sync, word_of
from emulate_probes import MMA, mma_kernel  # noqa: F401

HERE = __file__


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
    magnitude = a.double().abs() @ b.double().abs() + c.double().abs()
    assert ((d.double() - want).abs() <= 2.0 ** -20 * magnitude).all()


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
    d, d_table = torch.zeros(16, 8), torch.zeros(16, 8)
    ldmatrix_then_mma.emulate(a, b, d, grid=1)
    MMA["bf16"].emulate(a, b, torch.zeros(16, 8), d_table, grid=1)  # A loaded lane by lane from the table
    assert torch.equal(d, d_table)


# Results of single dot products measured on an H200 (mma.sync m16n8k16, f32 accumulate): A's row
# and B's column as 16-bit words, C and the hardware's D as f32 bits. Each D differs from
# round-to-nearest(exact) or from round-toward-zero(exact): the products are aligned to the
# largest exponent and truncated before the sum (tylopy/emulate/tensorcore.py).
H200_DOTS = [
    ("bf16", "3b78 3af5 3cd5 be7c 3fc4 bc44 c1b2 c008 4142 c17f 43b0 3feb 3c9c c40d c0e2 4347",
     "3dcc 3c28 c128 3a26 bd2c bf8b bd13 bbc6 40fb bbb8 bbc9 c22b bdf4 bc59 be8f 3b2e", 0xc19a7863, 0x40b64a12),
    ("bf16", "3efd 3fd7 3f01 bb2d 3fd3 3f81 3f7e 3f04 3f9e be09 bfb4 4000 bf0a 3fdd becc 3fe5",
     "3d80 bf91 3fa0 be8d bdcb be44 bd3d bfad 3f46 3f72 bf8e beab bf25 3dc5 3f9e bf93", 0x4029c6c3, 0xb8c60000),
    ("bf16", "3d15 bf52 410f 4063 4087 bf05 424e 429c bf66 c212 bc55 bfe4 bff7 c36e bb49 c284",
     "406d c274 bda6 c2a3 bf3b 3b08 bc2b bb0a c1de 3b2c 3f13 3e14 422f 4193 bfe4 3cb5", 0xc0e61e88, 0xc5926937),
    ("bf16", "bea7 bf69 bf74 bf89 3e9f 3f9d 3f11 3f59 bf83 3f97 3ebf bf68 bf0d 3eb5 bda8 bfcf",
     "4011 bf83 bf96 bf1f 3fdf bce9 400b bf8b bf5b 3e58 3fc9 3f83 be97 3f93 be42 bf3b", 0xbe290504, 0x40a5886d),
    ("f16", "ae35 312f d5ee 1228 309b 3fe3 b130 9374 4155 a193 0e41 9f88 be14 c446 4a44 b68d",
     "c676 241f 2617 2c6e 3db4 9ea0 c08d b361 9c96 a7b5 a4fa bccd 174d 57fb 5536 b15d", 0xbdf82221, 0x43f90089),
    ("f16", "3392 bd52 b45d a54f 3c2b 38d7 b5ce bc66 b26d 3a5c b90e 3b12 3804 b99a b6cf bc94",
     "c056 3cc4 3c34 2e4f 398b 3a56 388f be63 bc52 3c2d 3ce0 b566 a189 bd10 37a8 b850", 0xbfd173b8, 0x39668800),
    ("f16", "ba87 acb7 3483 bf02 b4ec bdd1 3bb2 be42 bb3d 3827 bc86 bc68 3c27 b030 35d5 31cd",
     "3903 3e3d 371c bc22 3ae2 35c5 be69 b9d0 c066 34f8 382e 3098 3933 3e08 3640 3c7b", 0x00000000, 0x4015c891),
]


@pytest.mark.parametrize("case", range(len(H200_DOTS)))
def test_mma_sync_rounds_like_the_h200(case):
    dt, arow, bcol, c_bits, d_bits = H200_DOTS[case]
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dt]
    words = lambda text: torch.tensor([int(x, 16) - (1 << 16) * (int(x, 16) >> 15) for x in text.split()],
                                      dtype=torch.int16).view(tdt)
    a, b = torch.zeros(16, 16, dtype=tdt), torch.zeros(16, 8, dtype=tdt)
    a[5], b[:, 3] = words(arow), words(bcol)
    c = torch.zeros(16, 8)
    c[5, 3] = torch.tensor([c_bits], dtype=torch.int64).to(torch.int32).view(torch.float32)
    d = torch.zeros(16, 8)
    MMA[dt].emulate(a, b, c, d, grid=1)
    assert d[5, 3].view(torch.int32).item() & 0xFFFFFFFF == d_bits


def test_mma_sync_in_a_diverged_warp_is_an_error():
    with pytest.raises(ProtocolError, match=f"mma.sync.aligned at .*:{line_of(HERE, 'mma_diverged')}.*diverged"):
        mma_diverged.emulate(torch.zeros(32, dtype=torch.int32), torch.zeros(32), grid=1)
