"""GPU tier of the Hopper varlen forward (``sm90/varlen_forward.py``) through ``attention_varlen``:
ragged documents (empty, length 1, shorter than a tile, several thousand rows), bottom-right
causal, grouped heads, seqused, NaN past every document's used rows, against the float64
per-document reference; gradients through autograd; no host synchronization with cu_seqlens on
the device; the Hopper kernel is the one that runs."""
import math

import pytest
import torch

from tylopy_kernels.attention import attention_varlen
from tylopy_kernels.attention.testing import grad_check as grad_check
from tylopy_kernels.attention.testing.packed import Documents, packed, prefix_sums, reference

pytestmark = pytest.mark.gpu


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


CASES = [
    # name, query lengths, key lengths, H, H_kv, D, causal, used_q, used_k
    ("D64-ragged", (0, 1, 17, 300, 1000, 129), (3, 1, 0, 1000, 640, 129), 4, 4, 64, False, None, None),
    ("D64-causal-gqa", (128, 1, 511, 0, 1000, 700), (128, 1, 700, 5, 1000, 300), 8, 2, 64, True, None, None),
    ("D128-causal", (4096, 1, 77), (4096, 4096, 300), 4, 4, 128, True, None, None),
    ("D128-gqa-f16", (65, 1, 129, 2000), (65, 2, 33, 2000), 8, 1, 128, False, None, None),
    ("D64-seqused", (300, 1000, 64), (400, 1000, 64), 4, 4, 64, True, (250, 999, 0), (400, 700, 64)),
    ("D128-seqused", (300, 1000), (400, 1000), 4, 2, 128, False, (1, 1000), (399, 3)),
]


@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hopper_varlen_forward_against_the_reference(case, monkeypatch):
    name, lq, lk, H, H_kv, D, causal, uq, uk = case
    dtype = torch.float16 if "f16" in name else torch.bfloat16
    uq, uk = uq or lq, uk or lk
    gen = torch.Generator().manual_seed(len(lq) * D)
    q = packed(lq, uq, H, D, dtype, gen)
    k, v = packed(lk, uk, H_kv, D, dtype, gen, pad=9), packed(lk, uk, H_kv, D, dtype, gen, pad=9)
    from tylopy_kernels.attention.sm90 import varlen_launch
    launched = []
    real = varlen_launch.launch_varlen_hopper
    monkeypatch.setattr(varlen_launch, "launch_varlen_hopper", lambda *a, **kw: launched.append(1) or real(*a, **kw))
    seqused = {} if (uq, uk) == (lq, lk) else dict(
        seqused_q=torch.tensor(uq, dtype=torch.int32, device="cuda"),
        seqused_k=torch.tensor(uk, dtype=torch.int32, device="cuda"))
    out, lse = attention_varlen(q.cuda(), k.cuda(), v.cuda(), prefix_sums(lq, "cuda"), prefix_sums(lk, "cuda"),
                                max(lq), max(lk), is_causal=causal, enable_gqa=H != H_kv, return_lse=True, **seqused)
    assert launched, "the Hopper varlen kernel did not run"
    _check(out.cpu(), lse.cpu(), (q, k, v), Documents(lq, uq), Documents(lk, uk), causal)


def _check(out, lse, qkv, docs_q, docs_k, causal):
    """The documents' rows against the float64 reference; every other row untouched (zeros, LSE -inf)."""
    q, k, v = qkv
    want, want_lse, rows = reference(q, k, v, docs_q, docs_k, causal, 1 / math.sqrt(q.shape[-1]))
    assert torch.isfinite(out).all()
    err = (out.double() - want).abs().max().item()
    assert err <= 2e-2 * torch.nan_to_num(v.double()).abs().max().item(), f"max error {err:.3e}"
    others = torch.ones(q.shape[0], dtype=torch.bool)
    others[rows] = False
    assert (out[others] == 0).all() and (lse[:, others] == float("-inf")).all()
    no_keys = want_lse == float("-inf")
    assert (lse[no_keys] == float("-inf")).all()
    lerr = (lse.double()[~no_keys] - want_lse[~no_keys]).abs().max().item()
    assert lerr <= 1e-4 * max(1.0, want_lse[~no_keys].abs().max().item()), f"LSE error {lerr:.3e}"


@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("D,causal", [(64, True), (64, False), (128, True)])
def test_persistent_schedule_finishes_against_the_reference(D, causal):
    """``schedule={"PERSISTENT": True}`` (no default, but accepted): a loop over work tiles in which
    several past their documents' ends come in a row. It once never finished on the GPU (a warp
    waiting on the Q barrier a lap late); under the timeout it must finish and match."""
    from tylopy_kernels.attention.common import ForwardTensors, PackedDocs
    from tylopy_kernels.attention.sm90.launch import HopperOptions
    from tylopy_kernels.attention.sm90.varlen_launch import launch_varlen_hopper
    lens = (700, 1, 1500, 0, 3000, 129, 4188)
    gen = torch.Generator().manual_seed(D + causal)
    q = packed(lens, lens, 4, D, torch.bfloat16, gen)
    k, v = packed(lens, lens, 2, D, torch.bfloat16, gen, pad=9), packed(lens, lens, 2, D, torch.bfloat16, gen, pad=9)
    out = torch.zeros(q.shape, dtype=q.dtype, device="cuda")
    lse = torch.full((4, q.shape[0]), float("-inf"), device="cuda")
    cu = prefix_sums(lens, "cuda")
    launch_varlen_hopper(ForwardTensors(q.cuda(), k.cuda(), v.cuda(), out, lse),
                         PackedDocs(cu, cu, max(lens), max(lens)),
                         HopperOptions(1 / math.sqrt(D), causal, {"PERSISTENT": True}))
    docs = Documents(lens, lens)
    _check(out.cpu(), lse.cpu(), (q, k, v), docs, docs, causal)


@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("D,causal", [(64, True), (128, False), (128, True)])
def test_hopper_varlen_gradients_pass_the_rule(D, causal, monkeypatch):
    """The Hopper varlen backward (``sm90/backward_varlen.py``) is the one that runs."""
    from tylopy_kernels.attention.sm90 import backward_varlen_launch
    launched = []
    real = backward_varlen_launch.launch_varlen_backward
    monkeypatch.setattr(backward_varlen_launch, "launch_varlen_backward",
                        lambda *a, **kw: launched.append(1) or real(*a, **kw))
    lq, lk, H, H_kv = (0, 1, 300, 1000, 17), (3, 1, 200, 1000, 640), 4, 2
    gen = torch.Generator().manual_seed(D)
    q, k, v = (packed(n, n, h, D, torch.bfloat16, gen, pad=7).cuda().requires_grad_()
               for n, h in ((lq, H), (lk, H_kv), (lk, H_kv)))
    dout = torch.randn(q.shape).to(torch.bfloat16).cuda()
    cu_q, cu_k = prefix_sums(lq, "cuda"), prefix_sums(lk, "cuda")
    out, lse = attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), is_causal=causal, enable_gqa=True,
                                return_lse=True)
    out.backward(dout)
    assert launched, "the Hopper varlen backward did not run"
    got = dict(out=out.detach(), lse=lse.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    grad_check.check(got, grad_check.BackwardInputs(q.detach(), k.detach(), v.detach(), dout, None, causal,
                                                    1 / math.sqrt(D), varlen=(cu_q, cu_k)))


@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
def test_lse_gradient_and_deterministic_mode_take_the_portable_varlen_backward(monkeypatch):
    """An LSE gradient (the Hopper kernels take none) and deterministic mode (their dQ sums are atomic)
    run the portable backward, with the same gradients by the rule."""
    from tylopy_kernels.attention.sm90 import backward_varlen_launch
    launched = []
    monkeypatch.setattr(backward_varlen_launch, "launch_varlen_backward", lambda *a, **kw: launched.append(1))
    lq, lk, D = (1, 300, 129), (2, 300, 200), 64
    gen = torch.Generator().manual_seed(5)
    q, k, v = (packed(n, n, 4, D, torch.bfloat16, gen, pad=7).cuda().requires_grad_() for n in (lq, lk, lk))
    cu_q, cu_k = prefix_sums(lq, "cuda"), prefix_sums(lk, "cuda")
    out, lse = attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), is_causal=True, return_lse=True)
    (out.float().sum() + lse.sum()).backward()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        out = attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), is_causal=True)
        torch.autograd.grad(out.float().sum(), (q, k, v))
    finally:
        torch.use_deterministic_algorithms(False)
    assert not launched


@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
def test_device_prefix_sums_need_no_host_synchronization():
    lq = (100, 2000, 7)
    gen = torch.Generator().manual_seed(5)
    q = packed(lq, lq, 4, 128, torch.bfloat16, gen).cuda()
    cu = prefix_sums(lq, "cuda")
    attention_varlen(q, q, q, cu, cu, 2000, 2000, is_causal=True)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        attention_varlen(q, q, q, cu, cu, 2000, 2000, is_causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
