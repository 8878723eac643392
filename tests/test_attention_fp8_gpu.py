"""The FP8 attention forward on a Hopper GPU at real sizes, through ``tylopy.attention``: bf16
data quantized to e4m3 with per-tensor or per-(batch, K/V head) descales, causal and not,
grouped-query, ragged lengths, the LSE; each against an FP64 reference on the dequantized inputs
for a few (batch, head) pairs, with SDPA in bf16 on the same inputs printed beside (-s shows the
error table).

    python -m pytest -q -s -m gpu tests/test_attention_fp8_gpu.py
"""
import pytest
import torch

from conftest import requires_sm90
from tylopy_kernels.attention import attention
from tylopy_kernels.attention.testing import fp8 as F

pytestmark = [pytest.mark.gpu, requires_sm90]

CASES = [
    # B, H, H_kv, N, D, causal, descale form, return_lse
    (2, 16, 16, 4096, 128, False, "tensor", False),
    (2, 16, 16, 4096, 128, True, "per_head", True),
    (1, 16, 4, 8192, 128, False, "per_head", False),
    (1, 16, 2, 16384, 128, True, "tensor", True),
    (3, 8, 8, 1000, 128, True, "per_head", False),
    (4, 4, 1, 777, 128, False, "none", True),
    (2, 32, 32, 4096, 64, False, "per_head", True),
    (1, 32, 8, 8192, 64, True, "tensor", False),
]


def _ids():
    return [f"D{d}-B{b}-H{h}-kv{hk}-N{n}-{'causal' if c else 'full'}-{f}{'-lse' if l else ''}"
            for b, h, hk, n, d, c, f, l in CASES]


@pytest.mark.parametrize("B, H, Hkv, N, D, causal, form, want_lse", CASES, ids=_ids())
def test_fp8_forward_against_fp64(B, H, Hkv, N, D, causal, form, want_lse):
    torch.manual_seed(N + H)
    q = torch.randn(B, H, N, D, device="cuda")
    k, v = torch.randn(B, Hkv, N, D, device="cuda"), torch.randn(B, Hkv, N, D, device="cuda")
    if form == "none":
        (q8, k8, v8), descales = [t.to(torch.float8_e4m3fn) for t in (q, k, v)], (None, None, None)
    else:
        (q8, qd), (k8, kd), (v8, vd) = (F.quantize(t, form == "per_head", Hkv) for t in (q, k, v))
        descales = (qd, kd, vd)
    res = attention(q8, k8, v8, is_causal=causal, enable_gqa=Hkv != H, return_lse=want_lse,
                    q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    out, lse = res if want_lse else (res, None)
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and out.shape == (B, H, N, D)
    assert torch.isfinite(out.float()).all()
    group = H // Hkv
    for b, h in {(0, 0), (B - 1, H - 1), (B // 2, H // 2)}:
        sl = (slice(b, b + 1), slice(h, h + 1))
        kv = (slice(b, b + 1), slice(h // group, h // group + 1))
        dq = F.dequantized(q8, descales[0])[sl]
        dk, dv = (F.dequantized(t, d)[kv] for t, d in zip((k8, v8), descales[1:]))
        want, want_lse = F.reference(dq, dk, dv, causal)
        fp8_err = F.errors(out[sl], want)
        bf16_err = F.errors(F.sdpa_bf16(dq, dk, dv, causal), want)
        vmax = dv.abs().max().item()
        print(f"\n(b={b}, h={h}) max|v| {vmax:.3g}: tylopy fp8 max {fp8_err['max_abs']:.3e} mean "
              f"{fp8_err['mean_abs']:.3e} | SDPA bf16 max {bf16_err['max_abs']:.3e} mean {bf16_err['mean_abs']:.3e}")
        assert fp8_err["max_abs"] <= 3e-2 * vmax and fp8_err["mean_abs"] <= 1.5e-3 * vmax, fp8_err
        if lse is not None:
            assert (lse[sl].double() - want_lse).abs().max().item() <= 5e-4 * max(1.0, want_lse.abs().max().item())


def test_repeated_calls_skip_the_checks_but_not_new_signatures():
    """A second call of one signature reuses the checked scale (same output); a new descale shape
    is checked again and refused naming it."""
    from tylopy_kernels.attention import fp8 as A
    q = (torch.randn(1, 4, 256, 128, device="cuda")).to(torch.float8_e4m3fn)
    d = torch.full((1,), 0.5, device="cuda")
    first = attention(q, q, q, q_descale=d)
    size = len(A._checked)
    again = attention(q, q, q, q_descale=d)
    assert len(A._checked) == size and torch.equal(first, again)
    assert A._signature((q, q, q), None, 0.0, False, None, False, (d, None, None)) in A._checked
    with pytest.raises(ValueError, match="q_descale expects one element"):
        attention(q, q, q, q_descale=torch.ones(3, 3, device="cuda"))
