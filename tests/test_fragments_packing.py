"""Operand packing and the MMA reference (CPU tier): the same-lane C -> A conversion against torch's
round-to-nearest-even and hand-written bit patterns (specials, NaN, subnormals), packing tiled and
wgmma accumulators at every k-step, the mma.sync reference as the float64 product of the rounded
operands, and the wgmma shared-memory descriptor bits.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.errors import LayoutError
from tylopy.tile import mma_sync, wgmma
from tylopy.tile.mma_sync import gather_tile

from fragment_oracles import (figure_wgmma_a, figure_wgmma_d, fragment_from_tile, isa_mma_a, isa_mma_b, isa_mma_c,
                              tiled_c_oracle)


# -- same-lane C -> A conversion ---------------------------------------------------------------------

def rne_bits(x, dtype: str) -> np.ndarray:
    """float32 -> bf16/fp16 bit patterns by torch's conversion (round to nearest even)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.to(torch.bfloat16 if dtype == "bf16" else torch.float16).view(torch.int16).numpy().view(np.uint16)


def is_nan_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    exp_mask, man_mask = (0x7F80, 0x007F) if dtype == "bf16" else (0x7C00, 0x03FF)
    bits = bits.astype(np.uint32)
    return ((bits & exp_mask) == exp_mask) & ((bits & man_mask) != 0)


def expected_words(tile16: np.ndarray, oracle: np.ndarray, dtype: str) -> np.ndarray:
    """Packed operand words per the ISA: register r = element 2r (bits 0-15) | element 2r+1 (bits 16-31)."""
    bits = rne_bits(tile16[oracle[..., 0], oracle[..., 1]], dtype).astype(np.uint32)
    return bits[:, 0::2] | (bits[:, 1::2] << 16)


def assert_words_equal(got, want, dtype):
    got = np.asarray(got, dtype=np.uint32)
    want = np.asarray(want, dtype=np.uint32)
    assert got.shape == want.shape
    for shift in (0, 16):
        g, w = (got >> shift) & 0xFFFF, (want >> shift) & 0xFFFF
        nan = is_nan_bits(w, dtype)
        assert is_nan_bits(g[nan], dtype).all(), "a NaN did not stay NaN"
        bad = np.argwhere((g != w) & ~nan)
        assert bad.size == 0, "first mismatches (thread, register): " + ", ".join(
            f"{tuple(b)} got {g[tuple(b)]:#06x} want {w[tuple(b)]:#06x}" for b in bad[:6])


def bits_to_f32(patterns) -> np.ndarray:
    return np.asarray(patterns, dtype=np.uint32).view(np.float32)


# (float32 bits, expected bits) written by hand from IEEE round-to-nearest-even.
BF16_SPECIALS = [
    (0x3F800000, 0x3F80),  # 1.0
    (0x3F808000, 0x3F80),  # halfway between 0x3F80 and 0x3F81: to even
    (0x3F818000, 0x3F82),  # halfway between 0x3F81 and 0x3F82: to even
    (0x3F808001, 0x3F81),  # just above halfway
    (0x3F807FFF, 0x3F80),  # just below halfway
    (0xBF818000, 0xBF82),  # negative halfway
    (0x80000000, 0x8000),  # -0.0 keeps its sign bit
    (0x7F800000, 0x7F80), (0xFF800000, 0xFF80),  # +-inf
    (0x00010000, 0x0001), (0x80010000, 0x8001),  # bf16 subnormals survive: no flush to zero
    (0x00018000, 0x0002), (0x00008000, 0x0000),  # subnormal halfway cases
    (0x007F0000, 0x007F),  # largest bf16 subnormal
    (0x7F7F0000, 0x7F7F),  # largest finite bf16
    (0x7F7FFFFF, 0x7F80),  # float32 max rounds to inf: no saturation
]
F16_SPECIALS = [
    (0x3F800000, 0x3C00),  # 1.0
    (0x3F801000, 0x3C00),  # 1 + 2^-11: halfway between 0x3C00 and 0x3C01, to even
    (0x3F803000, 0x3C02),  # 1 + 3*2^-11: halfway between 0x3C01 and 0x3C02, to even
    (0x80000000, 0x8000),  # -0.0
    (0x7F800000, 0x7C00), (0xFF800000, 0xFC00),  # +-inf
    (0x477FE000, 0x7BFF),  # 65504, the largest finite
    (0x477FF000, 0x7C00),  # 65520: halfway to 65536, to even = overflow to inf
    (0x33800000, 0x0001),  # 2^-24, the smallest fp16 subnormal: no flush to zero
    (0x33000000, 0x0000),  # 2^-25: halfway between 0 and 2^-24, to even
    (0x33C00000, 0x0002),  # 3*2^-25: halfway between 2^-24 and 2^-23, to even
    (0xB3800000, 0x8001),  # -2^-24
]
NANS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF]  # incl. a NaN whose payload is only in low bits


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_rne_oracle_agrees_with_the_hand_written_bits(dtype):
    cases = BF16_SPECIALS if dtype == "bf16" else F16_SPECIALS
    got = rne_bits(bits_to_f32([c[0] for c in cases]), dtype)
    assert [int(x) for x in got] == [c[1] for c in cases]


def c_pair(rng, tile16):
    """The two adjacent 16x8 C atoms (columns 0-7, 8-15) holding a 16x16 tile."""
    c = isa_mma_c()
    return (fragment_from_tile(tile16[:, :8], ty.MMA_SYNC_C, ty.QUAD, c),
            fragment_from_tile(tile16[:, 8:], ty.MMA_SYNC_C, ty.QUAD, c))


ATOM_DTYPES = {"bf16": ty.bf16, "f16": ty.f16}


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_pack_two_atoms_gives_the_isa_a_operand(dtype):
    rng = np.random.default_rng(21)
    tile = (rng.standard_normal((16, 16)) * 3).astype(np.float32)
    left, right = c_pair(rng, tile)
    atom = ty.MmaSyncAtom(ATOM_DTYPES[dtype])
    a = ty.pack_operand_a(atom, left, right)
    assert (a.layout, a.pack, a.dtype, a.ownership) == (ty.MMA_SYNC_A, 2, atom.dtype, mma_sync.A_OWNERSHIP)
    assert_words_equal(a.data, expected_words(tile, isa_mma_a(), dtype), dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_pack_special_values(dtype):
    cases = BF16_SPECIALS if dtype == "bf16" else F16_SPECIALS
    patterns = [c[0] for c in cases] + NANS
    flat = np.resize(np.asarray(patterns, np.uint32), 256)
    tile = flat.view(np.float32).reshape(16, 16)
    left, right = c_pair(None, tile)
    with np.errstate(over="ignore"):  # numpy warns on the float16 overflow to inf that RNE requires
        a = ty.pack_operand_a(ty.MmaSyncAtom(ATOM_DTYPES[dtype]), left, right)
    words = np.asarray(a.data, np.uint32)
    oracle = isa_mma_a()
    table = dict(cases)
    for lane, e in itertools.product(range(32), range(8)):
        r, c = oracle[lane, e]
        half = (int(words[lane, e // 2]) >> (16 * (e & 1))) & 0xFFFF
        src = int(tile.view(np.uint32)[r, c])
        if src in table:
            assert half == table[src], f"{src:#010x} -> {half:#06x}, want {table[src]:#06x}"
        else:
            assert is_nan_bits(np.array([half]), dtype)[0], f"NaN {src:#010x} -> {half:#06x}"
    assert_words_equal(words, expected_words(tile, oracle, dtype), dtype)


PACK_TILINGS = [(1, 2), (2, 4), (3, 2), (1, 8)]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("m_reps,n_reps", PACK_TILINGS)
def test_pack_tiled_accumulator_every_m_and_k(m_reps, n_reps, dtype):
    rng = np.random.default_rng(m_reps * 10 + n_reps)
    layout = ty.tiled_mma_c(m_reps, n_reps)
    tile = (rng.standard_normal(layout.shape) * 3).astype(np.float32)
    tile[0, 0], tile[-1, -1] = -0.0, np.inf
    acc = fragment_from_tile(tile, layout, ty.QUAD, tiled_c_oracle(m_reps, n_reps, 1, 1))
    atom = ty.MmaSyncAtom(ATOM_DTYPES[dtype])
    for m in range(m_reps):
        for k in range(n_reps // 2):
            a = ty.pack_operand_a(atom, acc, m, k)
            block = tile[16 * m:16 * m + 16, 16 * k:16 * k + 16]
            assert_words_equal(a.data, expected_words(block, isa_mma_a(), dtype), dtype)
            np.testing.assert_array_equal(mma_sync.pack_operand_a(atom, acc, m, k).data, a.data)


def test_pack_tiled_accumulator_errors():
    atom = ty.MmaSyncAtom(ty.bf16)

    def acc(*tiling):
        layout = ty.tiled_mma_c(*tiling)
        return fragment_from_tile(np.zeros(layout.shape, np.float32), layout, ty.QUAD, tiled_c_oracle(*tiling))

    with pytest.raises(LayoutError, match="2 N warps"):
        ty.pack_operand_a(atom, acc(1, 2, 1, 2), 0, 0)
    with pytest.raises(LayoutError, match="3 N atoms.*unpaired"):
        ty.pack_operand_a(atom, acc(1, 3, 1, 1), 0, 0)
    with pytest.raises(LayoutError, match=r"m expects 0\.\.1, but got 2"):
        ty.pack_operand_a(atom, acc(2, 2, 1, 1), 2, 0)
    with pytest.raises(LayoutError, match=r"m expects 0\.\.1, but got -1"):
        ty.pack_operand_a(atom, acc(2, 2, 1, 1), -1, 0)
    with pytest.raises(LayoutError, match=r"k expects 0\.\.1, but got 2"):
        ty.pack_operand_a(atom, acc(1, 4, 1, 1), 0, 2)
    with pytest.raises(LayoutError, match="expects a tiled mma.m16n8k16 accumulator"):
        ty.pack_operand_a(atom, fragment_from_tile(np.zeros((64, 16), np.float32), ty.wgmma_acc(16),
                                                   ty.WARPGROUP, figure_wgmma_d(16)), 0, 0)
    with pytest.raises(LayoutError, match="right expects"):
        wide = acc(1, 2, 1, 1)
        ty.pack_operand_a(atom, fragment_from_tile(np.zeros((16, 8), np.float32), ty.MMA_SYNC_C, ty.QUAD,
                                                   isa_mma_c()), wide)
    with pytest.raises(TypeError, match="MmaSyncAtom or WgmmaAtom"):
        ty.pack_operand_a("bf16", wide, 0, 0)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("n", [64, 128])
def test_pack_wgmma_accumulator_every_k_step(n, dtype):
    rng = np.random.default_rng(n)
    tile = (rng.standard_normal((64, n)) * 3).astype(np.float32)
    tile[5, 3], tile[40, n - 1], tile[63, 0] = -0.0, -np.inf, np.nan
    acc = fragment_from_tile(tile, ty.wgmma_acc(n), ty.WARPGROUP, figure_wgmma_d(n))
    atom = ty.WgmmaAtom(n, ATOM_DTYPES[dtype], "rs")
    for k in range(n // 16):
        a = ty.pack_operand_a(atom, acc, k)
        assert (a.layout, a.pack, a.dtype) == (ty.WGMMA_A_RS, 2, atom.dtype)
        assert_words_equal(a.data, expected_words(tile[:, 16 * k:16 * k + 16], figure_wgmma_a(), dtype), dtype)
    with pytest.raises(LayoutError, match=rf"k expects 0\.\.{n // 16 - 1} for N={n}, but got {n // 16}"):
        ty.pack_operand_a(atom, acc, n // 16)


# -- mma.sync reference --------------------------------------------------------------------------------

def packed_fragment(tile: np.ndarray, oracle: np.ndarray, dtype: str, ownership, layout) -> ty.Fragment:
    words = expected_words(tile, oracle, dtype)
    return ty.Fragment(words, ownership, layout, pack=2)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_mma_reference_is_the_float64_product_of_the_rounded_operands(dtype):
    rng = np.random.default_rng(31)
    a_tile = rng.standard_normal((16, 16)).astype(np.float32)
    b_tile = rng.standard_normal((16, 8)).astype(np.float32)
    c_tile = rng.standard_normal((16, 8)).astype(np.float32)
    atom = ty.MmaSyncAtom(ATOM_DTYPES[dtype])
    a = packed_fragment(a_tile, isa_mma_a(), dtype, mma_sync.A_OWNERSHIP, ty.MMA_SYNC_A)
    b = packed_fragment(b_tile, isa_mma_b(), dtype, mma_sync.B_OWNERSHIP, ty.MMA_SYNC_B)
    c = fragment_from_tile(c_tile, ty.MMA_SYNC_C, ty.QUAD, isa_mma_c())
    d = mma_sync.mma(atom, a, b, c)
    assert (d.layout, d.ownership) == (ty.MMA_SYNC_C, ty.QUAD)
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    a64 = torch.from_numpy(a_tile).to(tdt).double().numpy()
    b64 = torch.from_numpy(b_tile).to(tdt).double().numpy()
    want = a64 @ b64 + c_tile.astype(np.float64)
    oracle = isa_mma_c()
    np.testing.assert_allclose(d.data, want[oracle[..., 0], oracle[..., 1]], rtol=2.0 ** -23, atol=1e-12)


def test_mma_reference_then_pack_chains_two_products():
    """S = Q K (two n8 atoms), P = pack(S), O = P V: the same-lane chain of the attention kernels."""
    rng = np.random.default_rng(32)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((16, 16), (16, 16), (16, 8)))
    atom = ty.MmaSyncAtom(ty.bf16)
    qa = packed_fragment(q, isa_mma_a(), "bf16", mma_sync.A_OWNERSHIP, ty.MMA_SYNC_A)
    zero = fragment_from_tile(np.zeros((16, 8), np.float32), ty.MMA_SYNC_C, ty.QUAD, isa_mma_c())
    s = [mma_sync.mma(atom, qa, packed_fragment(k[:, 8 * j:8 * j + 8], isa_mma_b(), "bf16", mma_sync.B_OWNERSHIP,
                                                ty.MMA_SYNC_B), zero) for j in range(2)]
    p = ty.pack_operand_a(atom, s[0], s[1])
    o = mma_sync.mma(atom, p, packed_fragment(v, isa_mma_b(), "bf16", mma_sync.B_OWNERSHIP, ty.MMA_SYNC_B), zero)
    def r(x):  # bf16-rounded, as float64
        return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).double().numpy()

    s64 = (r(q) @ r(k)).astype(np.float32)
    np.testing.assert_array_equal(np.hstack([gather_tile(x) for x in s]), s64)
    np.testing.assert_allclose(gather_tile(o), r(s64) @ r(v), rtol=2.0 ** -23, atol=1e-12)


# -- wgmma shared-memory descriptor ----------------------------------------------------------------------

def test_descriptor_bits_match_the_reference_table():
    """docs/hopper.md ("Shared-memory matrix descriptors"): address >> 4 in bits 0-13, LBO >> 4 in
    16-29, SBO >> 4 in 32-45, swizzle 1 (128B) / 2 (64B) / 3 (32B) / 0 in bits 62-63; D = 64 bf16
    tiles give 0x4000004000010000 | ((addr & 0x3FFFF) >> 4)."""
    for addr in (0, 0x400, 0x8000, 0x3FFF0, 0x12340):
        assert wgmma.descriptor_bits(addr) == 0x4000004000010000 | ((addr & 0x3FFFF) >> 4)
        assert ty.hopper.descriptor_bits(addr, 16, 1024, 128) == 0x4000004000010000 | (addr >> 4)
    d = wgmma.descriptor_bits(0x1230, lbo=8192, sbo=2048, swizzle=64)
    assert d & 0x3FFF == 0x123
    assert (d >> 16) & 0x3FFF == 8192 >> 4
    assert (d >> 32) & 0x3FFF == 2048 >> 4
    assert d >> 62 == 2
    assert (d >> 46) & 1 == 0 and (d >> 49) & 0x7 == 0  # no Blackwell bit 46, base offset 0
    assert wgmma.descriptor_bits(0, swizzle=32) >> 62 == 3
    assert wgmma.descriptor_bits(0, swizzle=0) >> 62 == 0
    assert wgmma.descriptor_bits(0x40000 + 0x100) & 0x3FFF == 0x10  # only the 18-bit shared window counts


def test_descriptor_rejects_misaligned_fields():
    with pytest.raises(LayoutError, match="addr expects a multiple of 16 bytes, but got 8"):
        wgmma.descriptor_bits(8)
    with pytest.raises(LayoutError, match="sbo expects a multiple of 16"):
        wgmma.descriptor_bits(0, sbo=1000)
    with pytest.raises(LayoutError, match="swizzle expects 0, 32, 64 or 128"):
        wgmma.descriptor_bits(0, swizzle=256)
