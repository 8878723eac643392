"""Ring attention across processes, one GPU each; launched by torchrun (tests/test_ring_attention_gpu.py):

    torchrun --nproc_per_node 2 tests/ring_attention_worker.py

Every rank builds the same full-sequence q, k, v (same seed), takes its shard (zig-zag for causal
with load balancing, contiguous otherwise), runs ``ring_attention``; the shards are gathered and
checked on every rank against a float64 oracle by FlashAttention's rule (at most twice the error
of single-GPU ``tylopy.attention`` on the whole sequence, plus a floor). On Hopper with D in
{64, 128} the backward too: gathered dQ, dK, dV against the float64 oracle by the same rule,
with torch's autograd in the input dtype as the baseline. Rank 0 prints RING_WORKER_OK at the end.
"""
import os
import sys

import torch
import torch.distributed as dist

import tylopy
from tylopy_kernels.attention.distributed import ring as ra
from tylopy_kernels.attention.testing.backward_reference import attention_grads, gradient_rule

FLOOR_REL = 2.0 ** -10

# (name, B, H, H_kv, N, D, causal, load_balance)
CASES = [
    ("causal-zigzag-d128-gqa4", 1, 8, 2, 4096, 128, True, True),
    ("causal-contiguous-d64", 2, 4, 4, 2048, 64, True, False),
    ("full-d128", 1, 4, 4, 3072, 128, False, True),
    ("causal-zigzag-d64-long", 1, 2, 2, 16384, 64, True, True),
]


def gather(x, world, load_balance):
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return ra.unshard_sequence(parts, load_balance)


def check_forward(name, q, k, v, causal, lb, rank, world):
    sh = lambda t: ra.shard_sequence(t, rank, world, lb and causal)  # noqa: E731
    gqa = k.shape[1] != q.shape[1]
    out = ra.ring_attention(sh(q), sh(k), sh(v), is_causal=causal, load_balance=lb, enable_gqa=gqa)
    full = gather(out, world, lb and causal)
    single = tylopy.attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    oracle = attention_grads(q, k, v, torch.zeros_like(q), is_causal=causal)[0]
    err = (full.double() - oracle).abs().max().item()
    base = (single.double() - oracle).abs().max().item()
    limit = 2 * base + FLOOR_REL * v.abs().max().item()
    assert err <= limit, f"{name}: ring error {err:.3e}, single-GPU error {base:.3e}"
    return err, base


def check_backward(name, q, k, v, causal, lb, rank, world):
    g = torch.Generator(device=q.device).manual_seed(7)
    dout = torch.randn(q.shape, generator=g, device=q.device).to(q.dtype)
    z = lb and causal
    sh = lambda t: ra.shard_sequence(t, rank, world, z).detach().clone().requires_grad_()  # noqa: E731
    lq, lk, lv = sh(q), sh(k), sh(v)
    out = ra.ring_attention(lq, lk, lv, is_causal=causal, load_balance=lb, enable_gqa=k.shape[1] != q.shape[1])
    out.backward(ra.shard_sequence(dout, rank, world, z))
    oracle = attention_grads(q, k, v, dout, is_causal=causal)
    baseline = attention_grads(q, k, v, dout, is_causal=causal, dtype=q.dtype)
    for i, (name_g, local) in enumerate((("dq", lq.grad), ("dk", lk.grad), ("dv", lv.grad))):
        ok, msg = gradient_rule(gather(local, world, z), oracle[2 + i], baseline[2 + i])
        assert ok, f"{name} {name_g}: {msg}"


def main():
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))  # before NCCL binds a device
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    hopper = torch.cuda.get_device_capability()[0] == 9
    failures = 0
    for name, B, H, H_kv, N, D, causal, lb in CASES:
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(B, H, N, D, generator=g, device="cuda").bfloat16()
        k = torch.randn(B, H_kv, N, D, generator=g, device="cuda").bfloat16()
        v = torch.randn(B, H_kv, N, D, generator=g, device="cuda").bfloat16()
        try:
            err, base = check_forward(name, q, k, v, causal, lb, rank, world)
            msg = f"forward error {err:.2e} (single GPU {base:.2e})"
            if hopper and D in (64, 128) and N <= 4096:
                check_backward(name, q, k, v, causal, lb, rank, world)
                msg += ", backward ok"
            if rank == 0:
                print(f"{name}: {msg}", flush=True)
        except AssertionError as e:
            failures += 1
            print(f"rank {rank}: FAILED {e}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        sys.exit(1)
    if rank == 0:
        print(f"RING_WORKER_OK world={world}", flush=True)


if __name__ == "__main__":
    main()
