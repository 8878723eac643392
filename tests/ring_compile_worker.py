"""One rank of ring attention under torch.compile over gloo (tests/test_torch_integration.py):

    python tests/ring_compile_worker.py RANK WORLD PORT [gloo|nccl]

Counts the graphs and breaks ``torch._dynamo.explain`` finds in ``tylopy.distributed.ring_attention``
(shards with gradients: the autograd.Function path), then compiles it with ``fullgraph=True``
(aot_eager) and checks the forward and the gradients against the eager call. gloo (default):
float64 CPU shards through the operators' reference; nccl: bf16 shards on GPU ``RANK``, the kernels.
Prints one line ``RING rank graphs breaks max_difference``.
"""
import sys

import torch
import torch.distributed as dist

import tylopy
from tylopy.distributed import shard_sequence


def main(rank, world, port, backend="gloo"):
    gpu = backend == "nccl"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        gen = torch.Generator().manual_seed(3)
        n, d = (256 * world, 64) if gpu else (8 * world, 8)
        dtype, device = (torch.bfloat16, "cuda") if gpu else (torch.float64, "cpu")
        q, k, v, dout = (torch.randn(1, 2, n, d, generator=gen).to(device, dtype) for _ in range(4))
        local = lambda t: shard_sequence(t, rank, world, True).clone().requires_grad_()  # noqa: E731
        eager_in, compiled_in = [local(t) for t in (q, k, v)], [local(t) for t in (q, k, v)]
        d = shard_sequence(dout, rank, world, True)
        out = tylopy.distributed.ring_attention(*eager_in, is_causal=True)
        out.backward(d)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(tylopy.distributed.ring_attention)(*compiled_in, is_causal=True)
        torch._dynamo.reset()
        compiled = torch.compile(tylopy.distributed.ring_attention, backend="aot_eager", fullgraph=True)
        out2 = compiled(*compiled_in, is_causal=True)
        out2.backward(d)
        diff = max([(out2 - out).abs().max().item()] +
                   [(a.grad - b.grad).abs().max().item() for a, b in zip(compiled_in, eager_in)])
        print(f"RING {rank} {explained.graph_count} {explained.graph_break_count} {diff:.3e}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]), *sys.argv[4:5])
