"""tylopy.scaled_matmul (tylopy_kernels/gemm/fp8*.py) on the CPU: the kernel emulated at small
ragged sizes bit for bit against the FP8 product model (tests/gemm_fp8_model.py) and near float64,
for every scale form, operand format mix, output dtype, bias and accumulation mode; the
promotion interval; argument errors; ptxas without spills; the operator under fake tensors and
torch.compile(fullgraph=True)."""
import numpy as np
import pytest
import torch

import tylopy
from gemm_fp8_model import f64_bound, model, operands, scales
from tylopy_kernels.gemm import fp8_launch as L
from tylopy_kernels.gemm.fp8 import fit_stages, gemm_fp8_sm90

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def check(m, n, k, form, fast=False, block_n=128, a_dt=E4, b_dt=E4, out=torch.bfloat16, bias_dt=None, grid=2,
          transposed=False, seed=0):
    a, b = operands(m, n, k, a_dt, b_dt, seed=seed)
    sa, sb = scales(form, m, n, k, seed=seed, transposed=transposed)
    bias = None if bias_dt is None else (torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 8).to(bias_dt)
    c = L.emulate(L.Fp8Operands(a, b, sa, sb, bias), out, use_fast_accum=fast, schedule=dict(BLOCK_N=block_n), grid=grid)
    assert c.dtype == out and c.shape == (m, n)
    padded = c.as_strided((m, c.stride(0)), (c.stride(0), 1))  # the output's rows are padded to 16 bytes
    assert bool(padded[:, n:].isnan().all()), "the kernel wrote past N"
    np.testing.assert_array_equal(c.float().numpy(), model(a, b, sa, sb, bias, out, promote=not fast))
    bound, exact = f64_bound(a, b, sa, sb, bias, out, promote=not fast)
    assert bool(((c.double() - exact).abs() <= bound).all())
    return c


@pytest.mark.parametrize("m, n, k, form, fast, block_n, a_dt, b_dt, out, bias_dt", [
    # per tensor: ragged M, N and K (3 k-blocks, the last one 16 codes), promoted, bf16 bias
    (150, 136, 272, "tensor", False, 128, E4, E4, torch.bfloat16, torch.bfloat16),
    # per tensor, fast accumulation, the 256-wide tile past N, e5m2 A, fp16 out
    (64, 264, 128, "tensor", True, 256, E5, E4, torch.float16, None),
    # per row / column: f32 out and bias, 64-wide tiles, 4 k-blocks
    (130, 72, 400, "row", False, 64, E4, E5, torch.float32, torch.float32),
    # per row / column, fast accumulation, an odd N (the output rows padded, the padding untouched)
    (96, 203, 160, "row", True, 128, E4, E4, torch.bfloat16, torch.float16),
    # 128-blocks: two column groups of scale_b, a partial last k-block, bf16 bias
    (150, 200, 400, "block", False, 128, E4, E4, torch.bfloat16, torch.bfloat16),
    # 128-blocks with 64-wide tiles (two tiles per scale_b column group), e5m2 x e5m2, f32 out
    (70, 261, 256, "block", False, 64, E5, E5, torch.float32, None),
])
def test_emulated_kernel_is_the_model_and_near_float64(m, n, k, form, fast, block_n, a_dt, b_dt, out, bias_dt):
    check(m, n, k, form, fast, block_n, a_dt, b_dt, out, bias_dt, seed=m + n + k)


def test_block_scales_in_any_strides_and_use_fast_accum_is_ignored_for_them():
    """Column-major scale tensors (as torch's blockwise forms store them) are read through their
    strides; block scales promote whatever use_fast_accum says."""
    check(100, 130, 384, "block", fast=True, transposed=True, seed=3)


def test_operands_inside_wider_buffers_are_read_through_their_strides():
    """a's rows and b's columns 16-byte aligned but spaced wider than K (slices of bigger tensors)."""
    m, n, k = 72, 40, 160
    big_a, big_b = operands(m, n, k + 48, seed=9)
    a, b = big_a[:, 16:16 + k], big_b[32:32 + k]
    assert a.stride(0) == k + 48 and b.stride(1) == k + 48
    sa, sb = scales("row", m, n, k, seed=9)
    c = L.emulate(L.Fp8Operands(a, b, sa, sb), torch.float32, schedule=dict(BLOCK_N=64), grid=1)
    np.testing.assert_array_equal(c.numpy(), model(a, b, sa, sb, None, torch.float32))


@pytest.mark.slow
def test_one_cta_walks_every_tile_through_the_wrapping_ring():
    check(200, 256, 1040, "row", fast=True, block_n=256, grid=1, seed=5)
    check(200, 256, 1040, "block", block_n=128, grid=1, seed=6)


def test_promotion_every_128_codes_restores_f32_accumulation():
    """A long sum of positive products: the chained FP8 accumulator (13 fraction bits) loses what
    promotion keeps. The kernel equals the model that promotes every 128 codes, not one that
    promotes every 256, and its error is far below the chained kernel's."""
    m, n, k = 64, 64, 1024
    gen = torch.Generator().manual_seed(11)
    a = (torch.rand(m, k, generator=gen) * 2 + 1).to(E4)
    b = (torch.rand(n, k, generator=gen) * 2 + 1).to(E4).t()
    sa, sb = torch.tensor([1.0]), torch.tensor([1.0])
    got = {}
    for fast in (False, True):
        c = L.emulate(L.Fp8Operands(a, b, sa, sb), torch.float32, use_fast_accum=fast, schedule=dict(BLOCK_N=64), grid=1)
        np.testing.assert_array_equal(c.numpy(), model(a, b, sa, sb, None, torch.float32, promote=not fast))
        got[fast] = c
    assert not np.array_equal(got[False].numpy(), model(a, b, sa, sb, None, torch.float32, interval=256))
    exact = a.double() @ b.double()
    err_promoted = float((got[False].double() - exact).abs().max())
    err_chained = float((got[True].double() - exact).abs().max())
    assert err_promoted * 16 < err_chained, (err_promoted, err_chained)


@pytest.mark.parametrize("cfg", [
    dict(BLOCK_N=256, PROMOTE=False),
    dict(BLOCK_N=128, PROMOTE=False, A_DTYPE=tylopy.e5m2, SCALE="row", HAS_BIAS=True, BIAS_DTYPE=tylopy.bf16),
    dict(BLOCK_N=128, PROMOTE=True, SCALE="tensor", OUT_DTYPE=tylopy.f16),
    dict(BLOCK_N=128, PROMOTE=True, SCALE="row", OUT_DTYPE=tylopy.f32, HAS_BIAS=True),
    dict(BLOCK_N=128, PROMOTE=True, SCALE="block", HAS_BIAS=True, BIAS_DTYPE=tylopy.bf16),
    dict(BLOCK_N=64, PROMOTE=True, SCALE="block", B_DTYPE=tylopy.e5m2, OUT_DTYPE=tylopy.f32),
])
def test_every_schedule_assembles_without_spills_or_serialized_wgmma(cfg):
    out = cfg.get("OUT_DTYPE", tylopy.bf16).name
    ck = gemm_fp8_sm90.compile(STAGES=fit_stages(cfg["BLOCK_N"], out, cfg["PROMOTE"]), **cfg)
    a, b = cfg.get("A_DTYPE", tylopy.e4m3).name, cfg.get("B_DTYPE", tylopy.e4m3).name
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg['BLOCK_N']}k32.f32.{a}.{b}" in ck.ptx
    if ck.report.available:
        assert ck.report.spills == 0 and "C7515" not in ck.report.codes()


def test_argument_errors_name_the_argument():
    a, b = operands(64, 32, 64)
    sa, sb = scales("tensor", 64, 32, 64)

    def err(exc, match, *args, **kw):
        with pytest.raises(exc, match=match):
            tylopy.scaled_matmul(*args, **kw)

    err(TypeError, "a expects dtype torch.float8_e4m3fn or torch.float8_e5m2, but got torch.float32",
        a.float(), b, sa, sb)
    err(ValueError, r"b expects 64 rows", a, b[:32], sa, sb)
    err(ValueError, r"b expects a column-major \(K, N\) tensor, b.stride\(0\) == 1", a, b.contiguous(), sa, sb)
    err(ValueError, r"a expects a row-major \(M, K\) tensor", a.t().contiguous().t(), b, sa, sb)
    a40, b40 = operands(64, 32, 40)
    err(ValueError, r"a expects K \(a.shape\[1\]\) a multiple of 16 .*, but got 40", a40, b40, sa, sb)
    err(ValueError, "a expects 16-byte aligned rows", torch.empty(64, 80, dtype=E4)[:, 8:72], b, sa, sb)
    err(TypeError, "scale_b expects dtype torch.float32, but got torch.bfloat16", a, b, sa, sb.bfloat16())
    err(ValueError, r"scale_b expects the shape matching scale_a \(64, 1\)", a, b, torch.ones(64, 1), torch.ones(32))
    err(ValueError, r"scale_a expects one element each .* but got shape \(3, 3\)", a, b, torch.ones(3, 3), sb)
    err(ValueError, r"bias expects a 1-D tensor of N = 32 elements", a, b, sa, sb, torch.ones(31))
    err(TypeError, "bias expects dtype", a, b, sa, sb, torch.ones(32, dtype=torch.float64))
    err(TypeError, "out_dtype expects torch.bfloat16, torch.float16 or torch.float32", a, b, sa, sb,
        out_dtype=torch.float8_e4m3fn)
    err(TypeError, "use_fast_accum expects a bool", a, b, sa, sb, use_fast_accum=1)
    err(ValueError, r"schedule expects keys among", a, b, sa, sb, schedule=dict(BLOCK_M=64))
    err(ValueError, "PROMOTE=True keeps two accumulators", a, b, sa, sb, schedule=dict(BLOCK_N=256))
    err(ValueError, "a expects a CUDA tensor, but got a tensor on cpu", a, b, sa, sb)


def test_operator_fake_and_compiled_fullgraph_match_the_reference():
    """Meta tensors give the output's shape and dtype; torch.compile(fullgraph=True) traces one
    tylopy::scaled_matmul call; on CPU tensors the operator runs the fp32 dequantized reference."""
    m, n, k = 48, 40, 256
    a, b = operands(m, n, k)
    sa, sb = scales("block", m, n, k)
    meta = tylopy.scaled_matmul(a.to("meta"), b.to("meta"), sa.to("meta"), sb.to("meta"), out_dtype=torch.float16)
    assert meta.shape == (m, n) and meta.dtype == torch.float16 and meta.is_meta
    calls = []

    def backend(gm, inputs):
        calls.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    fn = torch.compile(lambda *t: tylopy.scaled_matmul(*t, out_dtype=torch.float32), backend=backend, fullgraph=True)
    got = fn(a, b, sa, sb)
    assert [c for c in calls if "tylopy" in c] == ["tylopy.scaled_matmul.default"], calls
    from tylopy_kernels.gemm.fp8_ops import reference, scaled_matmul_op
    want = reference(a, b, sa, sb, None, torch.float64, torch.float64)
    assert float((got.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())
    # test_schema compares inputs before and after with arithmetic torch lacks for fp8 on the CPU
    torch.library.opcheck(scaled_matmul_op, (a, b, sa, sb, torch.ones(n), torch.float32, False, ""),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
