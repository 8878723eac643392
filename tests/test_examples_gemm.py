"""The mma.sync GEMM example (tylopy_kernels/examples/gemm_mma_sync.py): emulated at small ragged sizes
against float64 and, bit for bit, against a chain of the tensor-core model; its PTX (cp.async,
ldmatrix, mma.sync, the wait depth) and ptxas; on the GPU against torch.matmul."""
import re

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.semantics.tensorcore import mma_f32
from tylopy_kernels.examples import gemm_mma_sync as G

TORCH = {"bf16": torch.bfloat16, "f16": torch.float16}


@pytest.fixture
def cp_async_emulated():
    from tylopy.emulate.program import load_handlers
    assert "cp_async" in load_handlers(), "the emulator lost its cp.async semantics"


def inputs(m, n, k, dtype="bf16", seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(TORCH[dtype])
    b = torch.randn(k, n, generator=gen).to(TORCH[dtype])
    return a.to(device), b.to(device)


def bound(a, b):
    """|c - a b| for f32 accumulation of exact products: a few f32 ulps of |a| |b| per k-step."""
    k = a.shape[1]
    return 2 * (k / 16 + 2) * 2.0 ** -24 * (a.double().abs() @ b.double().abs()) + 1e-30


def chained_model(a, b, dtype):
    """c by the tensor-core model, one k16 step at a time in k order (the kernel's order)."""
    m, k = a.shape
    k16 = -(-k // 16) * 16
    A = np.zeros((m, k16), np.float32)
    B = np.zeros((k16, b.shape[1]), np.float32)
    A[:, :k], B[:k] = a.float().numpy(), b.float().numpy()
    c = np.zeros((m, b.shape[1]), np.float32)
    for k0 in range(0, k16, 16):
        c = mma_f32(A[:, k0:k0 + 16], B[k0:k0 + 16], c, dtype)
    return c


@pytest.mark.parametrize("m, n, k, dtype", [
    (37, 45, 83, "bf16"),    # K and N not multiples of 8: padded copies; every tile ragged
    (70, 72, 232, "f16"),    # in place; 8 k-tiles wrap the 3-stage ring twice; ragged last k-tile
    (1, 8, 16, "bf16"),
])
def test_emulated_gemm_against_float64_and_the_tensor_core_model(m, n, k, dtype, cp_async_emulated):
    a, b = inputs(m, n, k, dtype, seed=m)
    c = G.matmul(a, b, emulate=True)
    err = (c.double() - a.double() @ b.double()).abs()
    assert bool((err <= bound(a, b)).all()), float(err.max())
    np.testing.assert_array_equal(c.numpy(), chained_model(a, b, dtype))


def test_emulated_gemm_bf16_output_is_the_rounded_f32_result(cp_async_emulated):
    a, b = inputs(33, 40, 64, seed=5)
    c32 = G.matmul(a, b, emulate=True)
    c16 = G.matmul(a, b, out_dtype=torch.bfloat16, emulate=True)
    assert c16.dtype == torch.bfloat16 and torch.equal(c16, c32.to(torch.bfloat16))


def test_the_kernel_reads_and_writes_nothing_past_the_ends(cp_async_emulated):
    """NaN in the padding of a, b and c: a read past K or N would poison the result, a write past
    M or N would overwrite a NaN."""
    m, n, k = 40, 24, 48
    a, b = inputs(m, n, k, seed=9)
    a_buf = torch.full((m + 8, k + 8), float("nan")).to(torch.bfloat16)
    b_buf = torch.full((k + 8, n + 16), float("nan")).to(torch.bfloat16)
    a_buf[:m, :k], b_buf[:k, :n] = a, b
    c_buf = torch.full((m + 3, n + 5), float("nan"))
    G.gemm_f32_out.emulate(a_buf.view(torch.int16), b_buf.view(torch.int16), c_buf, m, n, k, k + 8, n + 16, n + 5,
                           grid=(1, 1), DTYPE=ty.bf16)
    np.testing.assert_array_equal(c_buf[:m, :n].numpy(), chained_model(a, b, "bf16"))
    assert bool(c_buf[m:].isnan().all()) and bool(c_buf[:, n:].isnan().all())


def test_input_checks(cp_async_emulated):
    a, b = inputs(4, 8, 16)
    with pytest.raises(ValueError, match="expects a \\(M x K\\) and b \\(K x N\\)"):
        G.matmul(a, b.T, emulate=True)
    with pytest.raises(TypeError, match="both bfloat16 or both float16"):
        G.matmul(a.float(), b, emulate=True)
    with pytest.raises(TypeError, match="out_dtype expects"):
        G.matmul(a, b, out_dtype=torch.float16, emulate=True)
    assert G.matmul(a[:, :0], b[:0], emulate=True).eq(0).all()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptx_and_ptxas(arch):
    ck = G.gemm_f32_out.with_arch(arch).compile(DTYPE=ty.bf16)
    ptx = ck.ptx
    assert "cp.async.cg.shared.global" in ptx and "cp.async.commit_group;" in ptx
    assert "cp.async.wait_group 1;" in ptx  # STAGES - 2: one k-tile stays in flight
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == 4
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == 4
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 16
    assert not re.search(r"\basm\(", ck.ir_text)  # no inline PTX: every instruction is a public primitive
    assert ck.report.available is False or (ck.report.spills == 0 and ck.report.registers <= 128)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (37, 45, 83), (129, 200, 1000), (2048, 1536, 4096)])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_gpu_gemm_against_torch(m, n, k, dtype):
    a, b = inputs(m, n, k, dtype, seed=1, device="cuda")
    c = G.matmul(a, b)
    torch.cuda.synchronize()
    want = a.double() @ b.double()
    err = (c.double() - want).abs()
    assert bool((err <= bound(a, b)).all()), float(err.max())
    ref = torch.matmul(a, b).double()  # torch's own result, for scale: ours must be no worse than 4x its error
    assert float(err.max()) <= 4 * float((ref - want).abs().max()) + 1e-6
    c16 = G.matmul(a, b, out_dtype=torch.bfloat16)
    assert torch.equal(c16, c.to(torch.bfloat16))


@pytest.mark.gpu
def test_gpu_gemm_is_bit_identical_to_the_emulator(cp_async_emulated):
    a, b = inputs(70, 72, 232, "bf16", seed=3)
    want = G.matmul(a, b, emulate=True)
    got = G.matmul(a.cuda(), b.cuda())
    torch.cuda.synchronize()
    assert torch.equal(got.cpu(), want)
