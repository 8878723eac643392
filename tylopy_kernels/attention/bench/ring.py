"""``tylopy bench attention_ring``: ring attention over the GPUs of ``torchrun`` against one GPU.

    torchrun --nproc_per_node 2 -m tylopy_kernels.attention.bench.ring --output results/attention_ring.json

(``tylopy bench attention_ring`` runs the same code in one process: world size 1.) For a total
sequence of N tokens (32k .. 256k; bf16, B = 1, H = 16, D = 128, causal with zig-zag load
balancing unless ``--no-causal``/``--contiguous``), with W ranks:

* ``single_ms``: ``tylopy.attention`` on the whole sequence on one GPU (rank 0, the others idle);
* ``ring_ms``: ``ring_attention`` on the shards, the slowest rank's time;
* ``compute_ms``: the same ring steps with no communication (the shard a rank would receive is
  replaced by its own: the same kernels, masks and merges);
* ``comm_ms``: the W - 1 K/V exchanges alone;
* ``speedup`` = single_ms / ring_ms (W is the ideal), and ``hidden`` = (compute_ms + comm_ms -
  ring_ms) / comm_ms, the fraction of the communication time that overlapped the attention.

Each time is the median of ``--reps`` (5) runs after a warm-up, with a barrier before each run.
Rank 0 prints the table and writes the JSON.
"""
from __future__ import annotations

import argparse
import os
import sys

LENGTHS = (32768, 65536, 131072, 262144)


class NoCommRing:
    """A ring whose exchanges hand back the local tensors: the compute of a W-rank ring, no traffic."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def exchange(self, tensors):
        from tylopy_kernels.attention.distributed.ring import _Done
        return _Done([t for t in tensors])


def timed(fn, reps, barrier):
    import torch
    times = []
    for i in range(reps + 1):
        barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i:  # the first run warms up (compiles, creates NCCL's point-to-point communicators)
            times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def slowest(ms, world):
    import torch
    import torch.distributed as dist
    if world == 1:
        return ms
    t = torch.tensor([ms], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def run(lengths, heads, dim, causal, load_balance, reps):
    import torch
    import torch.distributed as dist

    import tylopy

    from tylopy_kernels.attention.distributed import ring as ra
    ring = ra.ring_of(None)
    rank, world = ring.rank, ring.world
    barrier = dist.barrier if world > 1 else (lambda: None)
    zigzag = causal and load_balance and world > 1
    rows = []
    for N in lengths:
        g = torch.Generator(device="cuda").manual_seed(0)
        full = [torch.randn(1, heads, N, dim, generator=g, device="cuda").bfloat16() for _ in range(3)]
        # one GPU: rank 0 alone (its barriers would pair with the other ranks' ones below)
        single = timed(lambda: tylopy.attention(*full, is_causal=causal), reps, lambda: None) if rank == 0 else 0.0
        barrier()
        shards = [ra.shard_sequence(t, rank, world, zigzag).contiguous() for t in full]
        ring_ms = timed(lambda: ra.ring_attention(*shards, is_causal=causal, load_balance=load_balance), reps,
                        barrier)
        steps = ra.RingSteps(NoCommRing(rank, world), causal, 1 / dim ** 0.5, zigzag)
        compute = timed(lambda: ra.ring_forward(*shards, steps, ra.tylopy_attend), reps, barrier)

        def exchanges():
            kv = shards[1:]
            for _ in range(world - 1):
                kv = ring.exchange(kv).wait()
        comm = timed(exchanges, reps, barrier) if world > 1 else 0.0
        row = dict(tokens=N, world=world, single_ms=slowest(single, world), ring_ms=slowest(ring_ms, world),
                   compute_ms=slowest(compute, world), comm_ms=slowest(comm, world))
        row["speedup"] = row["single_ms"] / row["ring_ms"]
        row["hidden"] = ((row["compute_ms"] + row["comm_ms"] - row["ring_ms"]) / row["comm_ms"]
                         if row["comm_ms"] > 0 else None)
        if rank == 0:
            hidden = f"{row['hidden']:.2f}" if row["hidden"] is not None else "-"
            print(f"N={N:<7d} W={world} single {row['single_ms']:9.2f} ms  ring {row['ring_ms']:9.2f} ms  "
                  f"compute {row['compute_ms']:9.2f} ms  comm {row['comm_ms']:8.2f} ms  speedup "
                  f"{row['speedup']:.2f}  hidden {hidden}", flush=True)
        rows.append(row)
    return dict(rows=rows, heads=heads, head_dim=dim, batch=1, causal=causal, load_balance=load_balance)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tylopy bench attention_ring", description=__doc__.split("\n")[0])
    p.add_argument("--output")
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--contiguous", action="store_true", help="contiguous shards (no zig-zag load balance)")
    p.add_argument("--reps", type=int, default=5, help="timed runs per point (median); 3 left 128k unresolved on two H200s")
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("tylopy bench attention_ring: needs a CUDA GPU", file=sys.stderr)
        return 2
    import torch.distributed as dist
    if "RANK" in os.environ and not dist.is_initialized():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))  # before NCCL binds a device
        dist.init_process_group("nccl")
    data = run(args.lengths, args.heads, args.dim, not args.no_causal, not args.contiguous, args.reps)
    if not dist.is_initialized() or dist.get_rank() == 0:
        from tylopy.benchmarking import write_results
        write_results("attention_ring", data, args.output)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
