"""The FP8 (e4m3) attention forward (``sm90/forward_fp8.py``) in the emulator, on small shapes with
ragged last tiles, K/V rings that wrap and NaN codes past every end: against an FP64 reference on
the dequantized inputs (beside SDPA in bf16 on the same inputs, printed), against a float64 model
of the kernel's algorithm (P rounded to e4m3), and the LSE. Also the key permutation against the
two fragment layouts it joins, the permuted V^T, the register report and the entry point's errors.
"""
import math

import pytest
import torch

import tylopy
import tylopy as ty
from tylopy.runtime.tensormap import TensorMapSpec
from tylopy_kernels.attention.sm90 import fp8_launch
from tylopy_kernels.attention.sm90.forward_fp8 import attention_fwd_fp8_sm90, key_slot
from tylopy_kernels.attention.sm90.fp8_transpose import TILE as TRANSPOSE_TILE
from tylopy_kernels.attention.sm90.fp8_transpose import key_of_slot, value_transpose_fp8
from tylopy_kernels.attention.testing import fp8 as F

NAN_CODE = 0x7F


def _spec(t, dims, strides, box, swizzle=128):
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "e4m3", swizzle)


def codes(shape, seed, spread=2.0, pad=48):
    """e4m3 codes of N(0, spread^2), a view of a buffer whose rows past the end hold NaN codes."""
    g = torch.Generator().manual_seed(seed)
    big = torch.full(shape[:-2] + (shape[-2] + pad, shape[-1]), NAN_CODE, dtype=torch.uint8)
    big[..., :shape[-2], :] = (torch.randn(shape, generator=g) * spread).to(torch.float8_e4m3fn).view(torch.uint8)
    return big.view(torch.float8_e4m3fn)[..., :shape[-2], :]


def emulate(q, k, v, descales, causal=False, scale=None, mask=None, schedule=None, lse=True):
    B, H, n, D = q.shape
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = torch.full((B, H, n, D), float("nan"), dtype=torch.bfloat16)
    lse_t = torch.full((B, H, n), float("nan")) if lse else None
    prob = fp8_launch.Fp8Problem(q, k, v, mask, causal, scale, descales)
    plan, _ = fp8_launch.plan_fp8(prob, out, lse_t, schedule, make_map=_spec)
    attention_fwd_fp8_sm90.emulate(*plan.args, grid=plan.grid, **plan.constexprs)
    return out, lse_t, plan


CASES = [
    # name, (B, H, Hkv, n, D), causal, descale form, schedule
    pytest.param("gqa-mask-per-head-descales", (1, 2, 1, 200, 128), False, "per_head", {},
                 id="D128-gqa-mask-per-head-descales"),
    pytest.param("causal-mixed-descales-3-tiles", (2, 1, 1, 300, 64), True, "mixed", {},
                 id="D64-causal-mixed-descales-3-tiles"),
    pytest.param("bn256-3-stages-causal", (1, 4, 2, 600, 128), True, "per_head", {"BLOCK_N": 256, "STAGES": 3},
                 marks=pytest.mark.exhaustive, id="D128-bn256-3-stages-causal"),
    pytest.param("long-ring-no-descales", (1, 1, 1, 700, 128), False, "none", {}, marks=pytest.mark.exhaustive,
                 id="D128-long-ring-no-descales"),
    pytest.param("gqa-two-consumers", (2, 4, 1, 333, 64), False, "per_head", {"CONSUMERS": 2},
                 marks=pytest.mark.exhaustive, id="D64-gqa-two-consumers"),
    pytest.param("poly-exp2", (1, 2, 2, 260, 128), True, "tensor", {"POLY_EXP2": 3}, marks=pytest.mark.exhaustive,
                 id="D128-poly-exp2"),
]


def _descales(form, B, Hkv, seed):
    if form == "none":
        return (None, None, None)
    g = torch.Generator().manual_seed(seed)
    if form == "mixed":  # q per tensor, k none, v per (batch, K/V head)
        return (0.25 + torch.rand(1, generator=g), None, 0.25 + torch.rand(B, Hkv, generator=g))
    shape = (B, Hkv) if form == "per_head" else (1,)
    return tuple((0.25 + torch.rand(shape, generator=g)).float() for _ in range(3))


@pytest.mark.parametrize("name, dims, causal, form, schedule", CASES)
def test_emulated_fp8_forward(name, dims, causal, form, schedule):
    B, H, Hkv, n, D = dims
    q, k, v = codes((B, H, n, D), 1), codes((B, Hkv, n, D), 2), codes((B, Hkv, n, D), 3)
    descales = _descales(form, B, Hkv, 4)
    mask = None
    if "mask" in name:
        mask = torch.rand(n, n, generator=torch.Generator().manual_seed(5)) > 0.3
        mask[:, 0] = True  # every row keeps a key
    out, lse, plan = emulate(q, k, v, descales, causal, mask=mask, schedule=schedule)
    qd, kd, vd = (F.dequantized(t, d) for t, d in zip((q, k, v), descales))
    want, want_lse = F.reference(qd, kd, vd, causal, mask=mask)
    assert torch.isfinite(out.float()).all(), "NaN/inf in the output"
    vmax = vd.abs().max().item()
    fp8_err = F.errors(out, want)
    bf16_err = F.errors(F.sdpa_bf16(qd, kd, vd, causal, mask=mask), want)
    model = F.blockwise_model(q, k, v, descales, causal, block_n=plan.constexprs["BLOCK_N"], mask=mask)
    model_err = F.errors(out, model)
    print(f"\n{name}: max|v| {vmax:.3g}; tylopy fp8 vs FP64 max {fp8_err['max_abs']:.3e} mean {fp8_err['mean_abs']:.3e};"
          f" SDPA bf16 max {bf16_err['max_abs']:.3e} mean {bf16_err['mean_abs']:.3e}; fp8 vs its float64 model "
          f"max {model_err['max_abs']:.3e} mean {model_err['mean_abs']:.3e}")
    assert fp8_err["max_abs"] <= 3e-2 * vmax and fp8_err["mean_abs"] <= 1.5e-3 * vmax, fp8_err
    # The model has the e4m3 rounding of P; what is left is the tensor cores' truncation of S (13 bits)
    # and ex2.approx, which move a weight across an e4m3 rounding boundary now and then (one ulp of a
    # dominant weight is 1/8 of it): a share of the error to FP64, not all of it.
    assert model_err["mean_abs"] <= 0.4 * fp8_err["mean_abs"] and model_err["max_abs"] <= 2e-2 * vmax, model_err
    # S comes from FP8 wgmma, which keeps 13 fraction bits of its sums: the LSE is that close
    assert (lse.double() - want_lse).abs().max().item() <= 5e-4 * max(1.0, want_lse.abs().max().item())


def test_key_slot_joins_the_accumulator_and_the_fp8_a_fragment():
    """Register i of S (the f32 accumulator) packed into A register r, byte h (``pack_p``) sits at
    the k that ``key_slot`` gives its column, in the same row, for every thread of the warpgroup."""
    acc, a = ty.wgmma_acc(128), ty.WGMMA_A_RS_FP8
    assert sorted(key_slot(c) for c in range(32)) == list(range(32))
    for warp in range(4):
        for lane in range(32):
            for step in range(4):
                for r in range(4):
                    for h in range(4):
                        i = 16 * step + 8 * (r >> 1) + 2 * (r & 1) + 4 * (h >> 1) + (h & 1)
                        row, col = acc.coord(warp, lane, i)
                        a_row, a_k = a.coord(warp, lane, 4 * r + h)
                        assert (row, step * 32 + key_slot(col % 32)) == (a_row, step * 32 + a_k)


def test_value_transposed_permutes_each_32_keys_and_pads_with_zeros():
    v = codes((2, 3, 70, 128), 5)
    vt = fp8_launch.value_transposed(v).view(torch.uint8)
    assert vt.shape == (2, 3, 128, 96) and vt.is_contiguous()
    src = v.view(torch.uint8)
    for key in (0, 5, 31, 32, 45, 69):
        slot = 32 * (key // 32) + key_slot(key % 32)
        assert torch.equal(vt[:, :, :, slot], src[:, :, key, :])
    used = {32 * (k // 32) + key_slot(k % 32) for k in range(70)}
    assert all(not vt[:, :, :, s].any() for s in range(96) if s not in used)


@pytest.mark.parametrize("dims", [(2, 3, 70, 128), (1, 2, 100, 64)])
def test_gpu_transpose_kernel_writes_the_same_v_transposed(dims):
    """``value_transpose_fp8`` (the GPU path of ``value_transposed``) in the emulator, bit for bit
    against the torch path, from a strided view whose rows past N_k hold NaN codes."""
    B, H, n, D = dims
    v = codes(dims, 5).view(torch.uint8)
    want = fp8_launch.value_transposed(v.view(torch.float8_e4m3fn)).view(torch.uint8)
    n_pad = want.shape[-1]
    vt = torch.full((B, H, D, n_pad), 0xAB, dtype=torch.uint8)
    value_transpose_fp8.emulate(ty.strided(v), vt, n, n_pad, H, v.stride(0), v.stride(1), v.stride(2),
                                grid=(-(-n_pad // TRANSPOSE_TILE), H, B), HEAD_DIM=D)
    assert torch.equal(vt, want)
    assert all(key_of_slot(key_slot(c)) == c for c in range(32))


@pytest.mark.parametrize("d, masked", [(128, True), (64, False)])
def test_default_specializations_do_not_spill(d, masked):
    cx = dict(fp8_launch.resolve_schedule(d, masked), HEAD_DIM=d, RETURN_LSE=True, HAS_MASK=masked)
    report = attention_fwd_fp8_sm90.compile(**cx).report
    if report.available:
        assert report.spill_stores == 0 and report.spill_loads == 0, report


def test_entry_point_errors_name_the_argument():
    q = torch.randn(1, 2, 64, 128).to(torch.float8_e4m3fn)
    bad = [
        (dict(q_descale=torch.ones(2, 2)), ValueError, "q_descale expects one element .per tensor. or shape"),
        (dict(v_descale=torch.ones(1, dtype=torch.float64)), TypeError, "v_descale expects dtype torch.float32"),
        (dict(window_size=(8, 8)), ValueError, "window_size expects its default with float8 inputs"),
        (dict(dropout_p=0.1), ValueError, "dropout_p expects 0.0"),
        ({}, ValueError, "query expects a CUDA tensor"),
    ]
    for kw, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            tylopy.attention(q, q, q, **kw)
    with pytest.raises(ValueError, match="query head_dim expects 64 or 128 with float8 inputs, but got 32"):
        tylopy.attention(q[..., :32], q[..., :32], q[..., :32])
    with pytest.raises(TypeError, match="key expects dtype torch.float8_e4m3fn"):
        tylopy.attention(q, q.bfloat16(), q)
    with pytest.raises(NotImplementedError, match="key expects requires_grad=False with float8 inputs"):
        tylopy.attention(q, q.clone().requires_grad_(True), q)
    with pytest.raises(TypeError, match="query expects dtype torch.float8_e4m3fn"):  # a descale makes it FP8
        tylopy.attention(q.bfloat16(), q.bfloat16(), q.bfloat16(), v_descale=torch.ones(1))


def test_fp8_attention_is_an_operator_compile_and_export_see_one_graph():
    """Under torch.compile(fullgraph=True) and torch.export an FP8 call is the operator
    tylopy::attention_fp8_fwd (on the CPU: the float64 reference of the dequantized inputs, in bf16)."""
    B, H, Hkv, N, D = 1, 4, 2, 40, 64
    q, k, v = (codes((B, h, N, D), seed=s) for s, h in ((1, H), (2, Hkv), (3, Hkv)))
    qd, kd, vd = _descales("mixed", B, Hkv, seed=4)

    def fn(q, k, v, qd, vd):
        return tylopy.attention(q, k, v, is_causal=True, enable_gqa=True, return_lse=True, q_descale=qd,
                                v_descale=vd)

    want = F.reference(*(F.dequantized(t, d) for t, d in ((q, qd), (k, kd), (v, vd))), causal=True)
    explained = torch._dynamo.explain(fn)(q, k, v, qd, vd)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    out, lse = torch.compile(fn, fullgraph=True, backend="eager")(q, k, v, qd, vd)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert torch.allclose(out.double(), want[0], atol=2e-2) and torch.allclose(lse.double(), want[1], atol=1e-5)

    class Module(torch.nn.Module):
        def forward(self, q, k, v, qd, vd):
            return fn(q, k, v, qd, vd)

    program = torch.export.export(Module(), (q.contiguous(), k.contiguous(), v.contiguous(), qd, vd))
    assert "tylopy.attention_fp8_fwd" in str(program.graph)
    again = program.module()(q.contiguous(), k.contiguous(), v.contiguous(), qd, vd)
    assert torch.equal(again[0], out) and torch.equal(again[1], lse)
