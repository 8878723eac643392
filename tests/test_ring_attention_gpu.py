"""GPU tier of ring attention: world size 1 in this process (no process group) equals
``tylopy.attention`` bit for bit, its backward follows FlashAttention's rule (Hopper), and the
torchrun worker (tests/ring_attention_worker.py) on one GPU and on two (skipped unless
torch.cuda.device_count() >= 2) matches single-GPU attention within the same rule."""
import os
import subprocess
import sys

import pytest
import torch

import tylopy
from tylopy_kernels.attention.distributed import ring as ra

pytestmark = pytest.mark.gpu
WORKER = os.path.join(os.path.dirname(__file__), "ring_attention_worker.py")


def _inputs(B, H, H_kv, N, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, h, N, D, generator=g, device="cuda").bfloat16() for h in (H, H_kv, H_kv)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("H_kv", [8, 2])
def test_world_size_one_is_plain_attention(causal, H_kv):
    q, k, v = _inputs(2, 8, H_kv, 1024, 64)
    out, lse = tylopy.distributed.ring_attention(q, k, v, is_causal=causal, enable_gqa=H_kv != 8, return_lse=True)
    ref, ref_lse = tylopy.attention(q, k, v, is_causal=causal, enable_gqa=H_kv != 8, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


@pytest.mark.sm90
def test_world_size_one_backward():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the attention backward needs Hopper (sm_90)")
    from tylopy_kernels.attention.testing.backward_reference import attention_grads, gradient_rule
    q, k, v = _inputs(1, 8, 2, 2048, 128, seed=4)
    dout = torch.randn_like(q)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ra.ring_attention(*leaves, is_causal=True, enable_gqa=True).backward(dout)
    oracle = attention_grads(q, k, v, dout, is_causal=True)
    base = attention_grads(q, k, v, dout, is_causal=True, dtype=q.dtype)
    for i, leaf in enumerate(leaves):
        ok, msg = gradient_rule(leaf.grad, oracle[2 + i], base[2 + i])
        assert ok, msg


def _torchrun(nproc):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", WORKER]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    ok = res.returncode == 0 and f"RING_WORKER_OK world={nproc}" in res.stdout
    assert ok, res.stdout[-4000:] + res.stderr[-4000:]


def test_torchrun_one_process():
    _torchrun(1)


def test_torchrun_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs, torch sees {torch.cuda.device_count()}")
    _torchrun(2)
