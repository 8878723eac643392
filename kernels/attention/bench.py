"""``tylopy bench attention``: tylopy's attention beside SDPA (auto, cuDNN, FlashAttention-2).

Shapes follow shared/anchors.md: D=64, batch*seqlen = 16384 tokens, 32 heads, N from 512 to
16k, causal and not. Every candidate is checked on a slice against an FP64 reference before it
is timed; times are CUDA-event medians (triton.testing.do_bench) after warm-up, all candidates
in one process. TFLOP/s counts 4*B*H*N^2*D (half of it for causal).

    tylopy bench attention --output results/attention.json --plot results/attention.png
    tylopy bench attention --sweep        # tylopy schedules only (BLOCK_N x CONSUMERS x STAGES)
"""
from __future__ import annotations

import argparse
import math
import sys

TOKENS, HEADS, D = 16384, 32, 64
NS = (512, 1024, 2048, 4096, 8192, 16384)


def _timer():
    from tylopy.benchmarking import median_ms
    return lambda fn: median_ms(fn, 100, 400)


def _reference_error(out, q, k, v, causal):
    """max |out - ref64| on the first (batch, head), and SDPA-math's own error there."""
    import torch
    qs, ks, vs = q[:1, :1].double(), k[:1, :1].double(), v[:1, :1].double()
    s = qs @ ks.transpose(-1, -2) / math.sqrt(D)
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ vs
    return (out[:1, :1].double() - ref).abs().max().item()


def candidates(causal):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tylopy
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def backend(b):
        def run(q, k, v):
            with sdpa_kernel(b):
                return sdpa(q, k, v, is_causal=causal)
        return run

    return {
        "tylopy": lambda q, k, v: tylopy.attention(q, k, v, is_causal=causal),
        "sdpa_auto": lambda q, k, v: sdpa(q, k, v, is_causal=causal),
        "sdpa_cudnn": backend(SDPBackend.CUDNN_ATTENTION),
        "sdpa_flash": backend(SDPBackend.FLASH_ATTENTION),
    }


def run(ns=NS, causal_modes=(False, True), only=None, schedule=None):
    import torch
    from tylopy_kernels.attention import hopper_launch as launch
    if schedule:
        launch.SCHEDULE.update(schedule)
    bench = _timer()
    rows = []
    for causal in causal_modes:
        cands = candidates(causal)
        for n in ns:
            b = max(TOKENS // n, 1)
            torch.manual_seed(n)
            q = torch.randn(b, HEADS, n, D, device="cuda", dtype=torch.bfloat16)
            k, v = torch.randn_like(q), torch.randn_like(q)
            flops = 4 * b * HEADS * n * n * D / (2 if causal else 1)
            for name, fn in cands.items():
                if only and name not in only:
                    continue
                try:
                    out = fn(q, k, v)
                    err = _reference_error(out, q, k, v, causal)
                    ms = bench(lambda: fn(q, k, v))
                    rows.append({"name": name, "n": n, "batch": b, "causal": causal, "ms": ms,
                                 "tflops": flops / ms / 1e9, "max_err": err})
                except Exception as e:  # noqa: BLE001 - a backend may not support a shape
                    rows.append({"name": name, "n": n, "batch": b, "causal": causal, "error": str(e)[:200]})
            print_rows([r for r in rows if r["n"] == n and r["causal"] == causal], header=False)
            del q, k, v
    return rows


def print_rows(rows, header=True):
    if header:
        print("| candidate | N | causal | ms | TFLOP/s | max err |")
        print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | {r['n']} | {r['causal']} | - | - | {r['error'][:60]} |")
        else:
            print(f"| {r['name']} | {r['n']} | {r['causal']} | {r['ms']:.3f} | {r['tflops']:.0f} | {r['max_err']:.2e} |",
                  flush=True)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        for name in sorted({r["name"] for r in rows}):
            pts = [(r["n"], r["tflops"]) for r in rows if r["name"] == name and r["causal"] == causal and "tflops" in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N")
        ax.set_title(f"{'causal' if causal else 'non-causal'}, D=64, bf16, 16k tokens x 32 heads")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def sweep(ns=(1024, 4096, 16384)):
    import itertools
    results = {}
    for bn, cons, st in itertools.product((64, 128), (2, 3), (2, 4)):
        sched = {"BLOCK_N": bn, "CONSUMERS": cons, "STAGES": st}
        rows = run(ns, (False, True), only=("tylopy",), schedule=sched)
        results[f"BN{bn}_C{cons}_S{st}"] = rows
        print(f"## {sched}: " + ", ".join(f"N={r['n']}{'c' if r['causal'] else ''} {r.get('tflops', 0):.0f}"
                                         for r in rows), flush=True)
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tylopy bench attention", description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", help="JSON path (default results/attention-<device>-<date>.json)")
    ap.add_argument("--plot", help="PNG path for TFLOP/s against N")
    ap.add_argument("--n", type=int, nargs="*", default=list(NS))
    ap.add_argument("--sweep", action="store_true", help="time tylopy schedules instead of the comparison")
    ap.add_argument("--schedule", default="", help="e.g. BLOCK_N=128,CONSUMERS=2,STAGES=2")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench attention needs a CUDA GPU", file=sys.stderr)
        return 2
    sched = {k: (int(v) if v.lstrip("-").isdigit() else v) for k, v in (kv.split("=") for kv in args.schedule.split(",") if kv)}
    if args.sweep:
        data = {"sweep": sweep()}
    else:
        print_rows([])
        rows = run(tuple(args.n), schedule=sched)
        data = {"rows": rows}
        if args.plot:
            plot(rows, args.plot)
    from tylopy.benchmarking import write_results
    from tylopy_kernels.attention import hopper_launch as launch
    write_results("attention", dict(data, schedule=dict(launch.SCHEDULE)), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
