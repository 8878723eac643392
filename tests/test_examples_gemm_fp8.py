"""The FP8 GEMM example (tylopy_kernels/examples/gemm_fp8.py): emulated at small ragged sizes against
float64 and, bit for bit, against a chain of the FP8 tensor-core model (k32 steps in k order,
scale in f32, bf16 rounding); ptxas takes every schedule without spills or serialized wgmma;
the host checks; on the H200 (gpu marker) against the same model bit for bit, float64 and
torch._scaled_mm."""
import numpy as np
import pytest
import torch

from conftest import requires_sm90
from tylopy.semantics.conversions import round_to
from tylopy.semantics.tensorcore import mma_fp8
from tylopy_kernels.examples import gemm_fp8 as G


def inputs(m, n, k, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=gen) * 3).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=gen) * 3).to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([0.75]), torch.tensor([0.125])
    return [t.to(device) for t in (a, b, sa, sb)]


def model(a, b, sa, sb, promote=False) -> np.ndarray:
    """The kernel's arithmetic: k32 wgmma steps chained in k order (PROMOTE: each 128-wide k-block
    from zero, added into an f32 total), times scale_a * scale_b in f32, rounded to bf16."""
    m, k = a.shape
    kp = -(-k // G.BLOCK_K) * G.BLOCK_K
    A = np.zeros((m, kp), np.float32)
    Bt = np.zeros((kp, b.shape[0]), np.float32)
    A[:, :k], Bt[:k] = a.cpu().float().numpy(), b.cpu().float().numpy().T
    acc = None
    for k0 in range(0, kp, G.BLOCK_K):
        part = None if promote else acc
        for s in range(k0, k0 + G.BLOCK_K, 32):
            part = mma_fp8(A[:, s:s + 32], Bt[s:s + 32], part, ("e4m3", "e4m3"))
        acc = part if (not promote or acc is None) else (acc + part).astype(np.float32)
    scale = np.float32(sa.item()) * np.float32(sb.item())
    return round_to((acc * scale).astype(np.float32), "bf16")


def f64_bound(a, b, sa, sb):
    s = sa.item() * sb.item()
    mag = a.double().abs() @ b.double().abs().T
    k = a.shape[1]
    return s * (k / 32 + 2) * 34 * 2.0 ** -12 * mag.cpu() + 2.0 ** -8 * (s * mag.cpu()) + 1e-30


@pytest.mark.parametrize("m, n, k, block_n, promote, grid", [
    (150, 136, 272, 128, False, 2),   # ragged M and K (TMA zero fill), two N tiles, 3 k-blocks
    (64, 264, 128, 256, False, 2),    # one k-block; N past the tile
    (130, 72, 400, 128, True, 2),     # promotion, 4 k-blocks, persistence over 2 CTAs
    (200, 256, 1040, 256, False, 1),  # one CTA, two tiles of 9 k-blocks: the 4-stage ring wraps 4 times
])
@pytest.mark.parametrize("store", ["tma", "direct"])
def test_emulated_fp8_gemm_is_the_model_and_near_float64(m, n, k, block_n, promote, grid, store):
    a, b, sa, sb = inputs(m, n, k, seed=m + n)
    c = G.scaled_mm(a, b, sa, sb, G.Fp8Schedule(block_n, promote, store), emulate=True, grid=grid)
    np.testing.assert_array_equal(c.float().numpy(), model(a, b, sa, sb, promote))
    exact = sa.item() * sb.item() * (a.double() @ b.double().T)
    assert bool(((c.double() - exact).abs() <= f64_bound(a, b, sa, sb)).all())


@pytest.mark.parametrize("block_n, promote, store", [(256, False, "tma"), (256, False, "direct"), (128, False, "tma"),
                                                     (128, True, "tma"), (64, False, "direct")])
def test_every_schedule_assembles_without_spills_or_serialized_wgmma(block_n, promote, store):
    ck = G.gemm_fp8.compile(BLOCK_N=block_n, STAGES=G.stages_for(block_n, store), PROMOTE=promote, STORE=store)
    assert f"wgmma.mma_async.sync.aligned.m64n{block_n}k32.f32.e4m3.e4m3" in ck.ptx
    if ck.report.available:
        assert ck.report.spills == 0 and "C7515" not in ck.report.codes()


def test_host_checks_name_the_argument():
    a, b, sa, sb = inputs(64, 64, 64)
    with pytest.raises(TypeError, match="expects a as a 2-D torch.float8_e4m3fn"):
        G.scaled_mm(a.float(), b, sa, sb, emulate=True)
    with pytest.raises(ValueError, match=r"a \(M x K\) and b \(N x K\)"):
        G.scaled_mm(a, b[:, :32].contiguous(), sa, sb, emulate=True)
    with pytest.raises(TypeError, match="scale_b as a one-element float32"):
        G.scaled_mm(a, b, sa, torch.ones(2), emulate=True)


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("m, n, k, block_n, promote, store", [
    (1000, 1032, 1056, 256, False, "tma"), (1000, 1032, 1056, 256, False, "direct"),
    (1000, 1032, 1056, 128, True, "tma"), (4096, 4096, 4096, 256, False, "tma"), (77, 8, 16, 256, False, "tma")])
def test_gpu_fp8_gemm_is_the_model_and_near_torch(m, n, k, block_n, promote, store):
    a, b, sa, sb = inputs(m, n, k, seed=k, device="cuda")
    c = G.scaled_mm(a, b, sa, sb, G.Fp8Schedule(block_n, promote, store))
    exact = sa.item() * sb.item() * (a.double() @ b.double().T).cpu()
    assert bool(((c.double().cpu() - exact).abs() <= f64_bound(a, b, sa, sb)).all())
    if n % 16 == 0 and k % 16 == 0:  # torch._scaled_mm takes only B dimensions that are multiples of 16
        ref = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
        assert float((c.float() - ref.float()).abs().max()) <= float(f64_bound(a, b, sa, sb).max()) * 2
    if m * n * k <= 2 ** 31:  # bit for bit against the emulator's model (checks the FP8 accumulation model)
        np.testing.assert_array_equal(c.float().cpu().numpy(), model(a, b, sa, sb, promote))
