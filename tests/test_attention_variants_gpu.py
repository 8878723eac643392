"""``tylopy.attention`` with variant keywords on an H100/H200: the Hopper variant forward against
the float64 reference (``variants.reference_forward``) and against torch (SDPA for float masks,
flex_attention for score_mod/mask_mod where it imports), the bench's calls, gradients through the
operator, torch.compile(fullgraph=True), and that the kernel (not the torch path) ran.

    python -m pytest -q -m gpu tests/test_attention_variants_gpu.py
"""
import math
import warnings

import pytest
import torch

import tylopy as ty
from conftest import requires_sm90
from tylopy_kernels.attention import variants as V

pytestmark = [pytest.mark.gpu, requires_sm90]

DEV = "cuda"


def _nan_backed(shape, seed, dtype=torch.bfloat16, pad=64):
    B, H, n, D = shape
    g = torch.Generator(device=DEV).manual_seed(seed)
    buf = torch.full((B, H, n + pad, D), float("nan"), dtype=dtype, device=DEV)
    buf[:, :, :n] = torch.randn(B, H, n, D, generator=g, device=DEV).to(dtype)
    return buf[:, :, :n]


def qkv(B=2, H=4, Hkv=2, n=300, nk=430, D=64, seed=0, dtype=torch.bfloat16):
    return (_nan_backed((B, H, n, D), seed, dtype), _nan_backed((B, Hkv, nk, D), seed + 1, dtype),
            _nan_backed((B, Hkv, nk, D), seed + 2, dtype))


def run_and_check(q, k, v, scale=None, tol=2e-2, **kw):
    """tylopy.attention against the float64 reference; the torch path must not have run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*reference path.*")  # the torch path must not run
        out, lse = ty.attention(q, k, v, scale=scale, enable_gqa=k.shape[1] != q.shape[1], return_lse=True, **kw)
    torch.cuda.synchronize()
    B, H, n, D = q.shape
    variant, tensors = V.make_variant(B, H, n, k.shape[2], q.device, **kw)
    s = 1 / math.sqrt(D) if scale is None else scale
    want, want_lse = V.reference_forward(q.double(), k.double(), v.double(), variant, tensors, s)
    assert torch.isfinite(out).all()
    err = (out.double() - want).abs().max().item()
    assert err <= tol * v.double().abs().max().item(), f"max error {err:.3e}"
    assert (torch.isinf(lse) == torch.isinf(want_lse)).all()
    fin = ~torch.isinf(want_lse)
    assert (lse.double()[fin] - want_lse[fin]).abs().max().item() <= 2e-4 * max(1.0, want_lse[fin].abs().max().item())
    return out, lse


CASES = {
    "window-causal": dict(is_causal=True, window_size=(100, 0)),
    "window-both-bottom-right": dict(is_causal=False, causal_align="bottom_right", window_size=(64, 32)),
    "causal-bottom-right": dict(is_causal=True, causal_align="bottom_right"),
    "causal-top-left-rectangular": dict(is_causal=True),
    "softcap": dict(is_causal=True, softcap=5.0),
    "sinks": dict(is_causal=True, sinks="sinks"),
    "alibi-h": dict(alibi_slopes="slopes_h"),
    "alibi-bh": dict(alibi_slopes="slopes_bh", is_causal=True),
    "float-mask": dict(attn_mask="float"),
    "bool-mask": dict(attn_mask="bool"),
}


def _materialize(kw, B, H, n, nk):
    g = torch.Generator(device=DEV).manual_seed(42)
    out = dict(kw)
    if kw.get("sinks") == "sinks":
        out["sinks"] = torch.randn(H, generator=g, device=DEV)
    if kw.get("alibi_slopes") == "slopes_h":
        out["alibi_slopes"] = torch.rand(H, generator=g, device=DEV)
    if kw.get("alibi_slopes") == "slopes_bh":
        out["alibi_slopes"] = torch.rand(B, H, generator=g, device=DEV)
    if kw.get("attn_mask") == "float":
        out["attn_mask"] = torch.randn(1, H, n, nk, generator=g, device=DEV)
    if kw.get("attn_mask") == "bool":
        m = torch.rand(B, 1, n, nk, generator=g, device=DEV) > 0.3
        m[..., 0] = True
        out["attn_mask"] = m
    return out


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", list(CASES))
def test_builtins_against_the_reference(name, D):
    q, k, v = qkv(D=D)
    run_and_check(q, k, v, **_materialize(CASES[name], 2, 4, 300, 430))


@pytest.mark.parametrize("D", [64, 128])
def test_default_schedules_with_more_tiles_than_sms(D):
    """The defaults of ``variant_launch.default_schedule`` where each CTA loops over several work
    tiles (D=128 window: persistent) or query tiles are 192 rows (D=64 causal and softcap: three
    consumers), ragged at the end: 47 query tiles of 128 x 4 heads > 132 SMs."""
    q, k, v = qkv(B=1, H=4, Hkv=2, n=6000, nk=6000, D=D, seed=7)
    run_and_check(q, k, v, is_causal=True, window_size=(700, 0))
    run_and_check(q, k, v, is_causal=True, softcap=20.0, sinks=torch.randn(4, device=DEV))


@pytest.mark.parametrize("D", [64, 128])
def test_user_mods_with_block_mask(D):
    n = nk = 1000
    doc = (torch.arange(nk, device=DEV) // 333).to(torch.int32)
    bias = torch.randn(4, device=DEV)

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    def biased(score, b, h, q_idx, kv_idx):
        return score + bias[h] * torch.tanh(score)
    bm = ty.create_block_mask(document, None, None, n, nk, device=DEV)
    q, k, v = qkv(n=n, nk=nk, D=D, seed=7)
    run_and_check(q, k, v, score_mod=biased, mask_mod=document, block_mask=bm)


def test_float_mask_matches_sdpa():
    q, k, v = qkv(D=64, Hkv=4, seed=9)
    mask = torch.randn(300, 430, device=DEV, dtype=torch.bfloat16)
    out = ty.attention(q, k, v, attn_mask=mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (out.float() - want.float()).abs().max() < 2e-2


def test_mods_match_flex_attention():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v = qkv(B=1, H=4, Hkv=4, n=512, nk=512, D=64, seed=11)

    def smod(score, b, h, q_idx, kv_idx):
        return score - 0.1 * (q_idx - kv_idx).abs() if hasattr(q_idx, "abs") else score - 0.1 * abs(q_idx - kv_idx)

    def mmod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    want = flex.flex_attention(q, k, v, score_mod=smod,
                               block_mask=flex.create_block_mask(mmod, None, None, 512, 512, device=DEV))
    out = ty.attention(q, k, v, score_mod=smod, mask_mod=mmod,
                       block_mask=ty.create_block_mask(mmod, None, None, 512, 512, device=DEV))
    assert (out.float() - want.float()).abs().max() < 2e-2


def test_bench_calls_run_the_kernel():
    from tylopy_kernels.attention.bench import variant_cases as cases
    from tylopy_kernels.attention.bench import variant_libs as libs
    for variant in cases.VARIANTS:
        spec = cases.make_spec(variant, 64, 1024, tokens=2048, heads=4)
        x = cases.make_inputs(spec, DEV, seed=1)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*reference path.*")
            run = libs.build("tylopy", spec, x)
            out = run.to_common(run.forward())  # the packed (document_varlen) call returns (tokens, H, D)
        err = (out.float()[:1] - cases.reference(spec, x)[:1]).abs().max().item()
        assert err < 3e-2, (variant, err)


def test_gradients_through_the_operator_and_compile():
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv(B=1, H=2, Hkv=2, n=256, nk=256, D=64, seed=13))
    sinks = torch.zeros(2, device=DEV, requires_grad=True)

    def f(q, k, v, sinks):
        return ty.attention(q, k, v, is_causal=True, window_size=(64, 0), softcap=20.0, sinks=sinks)
    out = torch.compile(f, fullgraph=True)(q, k, v, sinks)
    g = torch.autograd.grad(out.float().square().sum(), [q, k, v, sinks])
    qq, kk, vv, ss = (t.detach().double().requires_grad_() for t in (q, k, v, sinks))
    ref = ty.attention(qq, kk, vv, is_causal=True, window_size=(64, 0), softcap=20.0, sinks=ss.float())
    gr = torch.autograd.grad(ref.square().sum(), [qq, kk, vv])
    for a, b in zip(g[:3], gr):
        assert (a.double() - b).abs().max() < 5e-2 * max(1.0, b.abs().max().item())
    assert g[3].shape == (2,)
