"""TMA tile loads, mbarriers and wgmma (SS and RS) in the emulator.

The 128B-swizzled shared-memory image is checked against the rule of docs/hopper.md
section 2 (the 16-byte chunk c of row r of a 1024-byte-aligned tile lands at chunk c ^ (r % 8));
the wgmma products against torch, through TMA tiles and 64-bit descriptors.
"""
import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.semantics.tensorcore import mma_f32
from tylopy.runtime.tensormap import TensorMapSpec
from emulate_dsl import (desc, fence_mbarrier_init, mbar_expect_tx, mbar_init, mbar_wait, tma_load, wgmma,
                              wgmma_commit, wgmma_fence, wgmma_wait)
from emulate_probes import tile_map, tma_image, wgmma_ss_rs  # noqa: F401


@ty.kernel(threads=128)
def wgmma_ss(a_map: ty.tensormap, b_map: ty.tensormap, d: ty.ptr(ty.f32), SW: ty.constexpr, N: ty.constexpr = 64):
    """D (64xN) = A (64xK) @ B (NxK)^T with both operands K-major in TMA-swizzled tiles."""
    smem = ty.dynamic_shared(ty.bf16, 8192 + 2 * 64 * max(N, 64), align=1024)
    bar = ty.shared(ty.u64, 1, align=8)
    tid = ty.thread_idx()
    a_s, b_s = smem, smem + 4096
    K = 16 if SW == 0 else SW // 2  # columns in one tile row
    if tid == 0:
        mbar_init(bar, 1)
        fence_mbarrier_init()
    ty.syncthreads()
    if tid == 0:
        mbar_expect_tx(bar, 2 * (64 + N) * K)
        if SW == 0:  # interleaved: two 64x8 boxes, one per 8 columns of k
            for h in ty.static_range(2):
                tma_load(a_s + 512 * h, a_map, bar, 8 * h, 0)
                tma_load(b_s + 512 * h, b_map, bar, 8 * h, 0)
        else:
            tma_load(a_s, a_map, bar, 0, 0)
            tma_load(b_s, b_map, bar, 0, 0)
    mbar_wait(bar, 0)
    a_addr, b_addr = ty.address(a_s), ty.address(b_s)
    wgmma_fence()
    acc = None
    for k in ty.static_range(K // 16):
        if SW == 0:
            da, db = desc(a_addr, lbo=1024, sbo=128, swizzle=0), desc(b_addr, lbo=1024, sbo=128, swizzle=0)
        else:
            da = desc(a_addr + 32 * k, sbo=8 * SW, swizzle=SW)
            db = desc(b_addr + 32 * k, sbo=8 * SW, swizzle=SW)
        acc = wgmma(N, acc, da, db)
    wgmma_commit()
    acc = wgmma_wait(0, acc)
    w, lane = tid >> 5, tid & 31
    g, t = lane >> 2, lane & 3
    for i in ty.static_range(N // 2):
        d[(16 * w + g + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * t + (i & 1)] = acc[i]


def chained_product(a, b_t, k_step=16):
    """A @ B^T as a chain of k16 wgmmas, each accumulating as the tensor cores do.

    The arithmetic model (``tensorcore.mma_f32``) is checked against hardware results in
    test_emulate_mma.py; here it isolates what these tests are about: the data path (TMA,
    swizzle, descriptors, fragments).
    """
    d = None
    af, bf = a.float().numpy(), b_t.float().numpy()
    for k in range(0, a.shape[1], k_step):
        d = mma_f32(af[:, k:k + k_step], bf[:, k:k + k_step].T, d, "bf16")
    return torch.from_numpy(d)


def swizzle128_model(img: np.ndarray) -> np.ndarray:
    """Row r, chunk c of the dense tile goes to chunk c ^ (r % 8) (docs/hopper.md, shared-memory matrix descriptors)."""
    out = np.zeros_like(img)
    rows = img.reshape(-1, 8, 16)
    res = out.reshape(-1, 8, 16)
    for r in range(rows.shape[0]):
        for c in range(8):
            res[r, c ^ (r % 8)] = rows[r, c]
    return out


def _run_tma_image(row0):
    src = torch.arange(40 * 64, dtype=torch.float32).to(torch.bfloat16).view(40, 64)
    out = np.zeros(2048, dtype=np.uint32)
    tma_image.emulate(tile_map(src), out, grid=1, ROW0=row0)
    dense = np.zeros((64, 64), dtype=np.uint16)
    rows = src.view(torch.int16).numpy().view(np.uint16)[row0:row0 + 64]
    dense[: len(rows)] = rows
    return out.view(np.uint8), swizzle128_model(dense.view(np.uint8).reshape(-1))


@pytest.mark.parametrize("row0", [0, 24])
def test_tma_swizzled_image(row0):
    got, want = _run_tma_image(row0)
    assert np.array_equal(got, want)  # includes zero fill of the rows past the tensor (40 - row0)


@pytest.mark.parametrize("sw", [128, 64, 32, 0])
def test_wgmma_ss_on_tma_tiles(sw):
    torch.manual_seed(3)
    K = 16 if sw == 0 else sw // 2
    a, b = torch.randn(64, K).to(torch.bfloat16), torch.randn(64, K).to(torch.bfloat16)
    d = torch.zeros(64, 64)
    box_cols = 8 if sw == 0 else K
    wgmma_ss.emulate(tile_map(a, box_cols=box_cols, swizzle=sw), tile_map(b, box_cols=box_cols, swizzle=sw), d,
                     grid=1, SW=sw)
    assert torch.equal(d, chained_product(a, b))


@pytest.mark.parametrize("n", [8, 128, 256])
def test_wgmma_ss_other_widths(n):
    torch.manual_seed(9)
    a, b = torch.randn(64, 64).to(torch.bfloat16), torch.randn(n, 64).to(torch.bfloat16)
    d = torch.zeros(64, n)
    wgmma_ss.emulate(tile_map(a), tile_map(b, box_rows=n), d, grid=1, SW=128, N=n)
    assert torch.equal(d, chained_product(a, b))


def test_wgmma_ss_then_rs_with_mn_major_v():
    torch.manual_seed(4)
    q, k, v = (torch.randn(64, 64).to(torch.bfloat16) for _ in range(3))
    s, o = torch.zeros(64, 64), torch.zeros(64, 64)
    wgmma_ss_rs.emulate(tile_map(q), tile_map(k), tile_map(v), s, o, grid=1)
    assert torch.equal(s, chained_product(q, k))
    p = s.to(torch.bfloat16)  # RNE, as pack2 / cvt.rn.bf16x2.f32
    assert torch.equal(o, chained_product(p, v.T))

