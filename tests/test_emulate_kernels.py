"""The project's attention kernels (``kernels/``) run in the emulator, against torch.

The arguments are built as the kernels' own launchers build them, with ``TensorMapSpec`` in
place of driver-encoded tensor maps. Speed targets: the Hopper kernel for one
head at N=256 under a minute, the portable mma.sync kernel at N=128 under ten seconds.
"""
import math
import time

import pytest
import torch

import tylopy as ty
from tylopy.runtime.tensormap import TensorMapSpec
from emulate_probes import D, _spec, emulate_hopper, qkv  # noqa: F401


def sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)


@pytest.mark.parametrize("b,h,n,causal", [(1, 1, 256, False), (1, 2, 200, True)])
def test_hopper_attention_kernel(b, h, n, causal, capsys):
    q, k, v = qkv(b, h, n, seed=7)
    out, lse = torch.zeros_like(q), torch.zeros(b, h, n)
    t0 = time.perf_counter()
    report = emulate_hopper(q, k, v, out, lse, causal)
    dt = time.perf_counter() - t0
    err = (out.double() - sdpa(q, k, v, causal)).abs().max().item()
    with capsys.disabled():
        print(f"\n[emulate timings] tylopy_kernels/attention/sm90/forward.py B={b} H={h} N={n} causal={causal}: {dt:.2f} s "
              f"({len(report.ctas)} CTAs x {report.warps_per_cta} warps), max error {err:.2e}")
    assert err < 2e-2
    want_lse = torch.logsumexp((q.double() @ k.double().transpose(2, 3)) / math.sqrt(D)
                               + (torch.full((n, n), -math.inf).triu(1) if causal else 0), dim=-1)
    assert torch.allclose(lse.double(), want_lse, atol=1e-3)
    if (b, h, n) == (1, 1, 256):
        assert dt < 60


def test_streaming_attention_kernel_n128(capsys):
    mod = pytest.importorskip("tylopy_kernels.attention.portable.forward")
    n, warps = 128, mod.DEFAULT_WARPS
    q, k, v = qkv(1, 1, n, seed=8)
    out, lse = torch.zeros_like(q), torch.zeros(1, 1, n)
    t0 = time.perf_counter()
    no_mask = torch.zeros(1, dtype=torch.uint8).as_strided((1, 1, 1, 1), (0, 0, 0, 0))
    i16 = torch.int16
    mod.streaming_attention_fwd.emulate(
        q=q.view(i16), k=k.view(i16), v=v.view(i16), out=out.view(i16), lse=lse, mask=no_mask,
        scale=1 / math.sqrt(D), causal=0, grid=(-(-n // (mod.ROWS_PER_WARP * warps)), 1, 1), DTYPE=ty.bf16,
        HEAD_DIM=D, BLOCK_N=64, WARPS=warps, HAS_MASK=False, RETURN_LSE=True,
        ASYNC_COPY=True)  # the cp.async path, as the GPU runs it
    dt = time.perf_counter() - t0
    err = (out.double() - sdpa(q, k, v, False)).abs().max().item()
    with capsys.disabled():
        print(f"\n[emulate timings] tylopy_kernels/attention/portable/forward.py N={n}: {dt:.2f} s, max error {err:.2e}")
    assert err < 2e-2
    assert dt < 10
