"""``tylopy bench attention_backward``: the Hopper attention backward beside SDPA and FA3-class kernels.

Shapes: head dim 64 and 128 with 2048 / D heads (a 2048-wide model), batch x N = 16384 tokens,
N from 512 to 16k, causal and not, bf16. Candidates, all in one process: tylopy's backward
(``launch_backward_hopper``, default and deterministic), SDPA's cuDNN and flash backends, and
the FA3-class kernel (``flash_attn.cute.flash_attn_func``, flash-attn-4's CuTe path) when it
imports. Each candidate's gradients are first checked on the first (batch, head) slice against
a float64 reference; then the backward alone and forward + backward are timed (CUDA-event
medians after warm-up). TFLOP/s count the forward as 4 B H N^2 D (half of it causal), the
backward as 2.5 times that, forward + backward as 3.5 times.

    tylopy bench attention_backward --output results/attention-backward.json --plot results/attention-backward.png
    tylopy bench attention_backward --sweep     # tylopy schedules (sm90/backward_launch.SWEEP, DQ_SWEEP)
    tylopy bench attention_backward --once --d 128 --n 4096 --causal   # one backward, for a profiler
"""
from __future__ import annotations

import argparse
import math
import sys

TOKENS, WIDTH = 16384, 2048
NS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)


def _timer():
    from tylopy.benchmarking import median_ms
    return lambda fn: median_ms(fn, 100, 400)


def _shape(n, d):
    return max(TOKENS // n, 1), WIDTH // d


def _inputs(n, d, dtype=None):
    import torch
    b, h = _shape(n, d)
    torch.manual_seed(n + d)
    q, k, v, dout = (torch.randn(b, h, n, d, device="cuda", dtype=dtype or torch.bfloat16) for _ in range(4))
    return q, k, v, dout


def _slice_error(grads, q, k, v, dout, causal):
    """Largest |grad - float64 reference| over dq, dk, dv on batch 0, head 0."""
    from tylopy_kernels.attention.testing.backward_reference import attention_grads, max_error
    sl = [t[:1, :1] for t in (q, k, v, dout)]
    ref = attention_grads(*sl, is_causal=causal)[2:]
    return max(max_error(g[:1, :1], r) for g, r in zip(grads, ref))


class Candidate:
    """``setup(q, k, v, dout, causal)`` returns (forward, backward, info): ``forward()`` keeps what
    ``backward()`` needs, ``backward()`` returns (dq, dk, dv), ``info`` notes for the row."""

    def __init__(self, name, setup):
        self.name, self.setup = name, setup


def _forward_with_lse(q, k, v, causal, scale):
    """(out, lse) from tylopy's forward, or ATen's flash forward where tylopy's has no kernel for
    the shape (its head dims); the second item of the result says which."""
    import torch
    import tylopy
    try:
        return tylopy.attention(q, k, v, is_causal=causal, scale=scale, return_lse=True), "tylopy"
    except (ValueError, TypeError):
        res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return (res[0], res[1]), "aten_flash"


def _tylopy(deterministic, schedule=None):
    def setup(q, k, v, dout, causal):
        import torch
        from tylopy_kernels.attention.sm90.backward_launch import (BackwardTensors, HopperBackwardOptions,
                                                                   launch_backward_hopper)
        scale = 1 / math.sqrt(q.shape[-1])
        grads = [torch.empty_like(t) for t in (q, k, v)]
        state = {}

        def forward():
            (state["out"], state["lse"]), state["forward"] = _forward_with_lse(q, k, v, causal, scale)

        def backward():
            launch_backward_hopper(BackwardTensors(q, k, v, state["out"], dout, state["lse"], *grads),
                                   HopperBackwardOptions(scale, causal, deterministic, schedule))
            return grads
        return forward, backward, state
    return setup


def _autograd(run_forward):
    """Forward through ``run_forward(q, k, v)`` with grad, backward by autograd.grad (graph kept)."""
    def setup(q, k, v, dout, causal):
        import torch
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        state = {}

        def forward():
            state["out"] = run_forward(*leaves, causal)

        def backward():
            return torch.autograd.grad(state["out"], leaves, dout, retain_graph=True)
        return forward, backward, {}
    return setup


def _sdpa(backend):
    def run_forward(q, k, v, causal):
        import torch
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run_forward


def _fa3_class(q, k, v, dout, causal):
    """flash-attn-4's CuTe kernel on (B, N, H, D) leaves of its own (its native layout)."""
    import torch
    from flash_attn.cute import flash_attn_func
    leaves = [t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
    dout_t = dout.transpose(1, 2).contiguous()
    state = {}

    def forward():
        out = flash_attn_func(*leaves, causal=causal)
        state["out"] = out[0] if isinstance(out, tuple) else out

    def backward():
        grads = torch.autograd.grad(state["out"], leaves, dout_t, retain_graph=True)
        return [g.transpose(1, 2) for g in grads]
    return forward, backward, {}


def candidates(include=None):
    from torch.nn.attention import SDPBackend
    cands = [Candidate("tylopy", _tylopy(False)), Candidate("tylopy_deterministic", _tylopy(True)),
             Candidate("sdpa_cudnn", _autograd(_sdpa(SDPBackend.CUDNN_ATTENTION))),
             Candidate("sdpa_flash", _autograd(_sdpa(SDPBackend.FLASH_ATTENTION)))]
    try:
        import flash_attn.cute  # noqa: F401
        cands.append(Candidate("fa3_class_cute", _fa3_class))
    except Exception:  # noqa: BLE001 - not installed, or built for another GPU
        pass
    return [c for c in cands if include is None or c.name in include]


def measure(cand, n, d, causal, bench):
    import torch
    q, k, v, dout = _inputs(n, d)
    b, h = _shape(n, d)
    fwd_flops = 4 * b * h * n * n * d / (2 if causal else 1)
    row = {"name": cand.name, "d": d, "n": n, "batch": b, "heads": h, "causal": causal}
    try:
        forward, backward, state = cand.setup(q, k, v, dout, causal)
        forward()
        row["max_err"] = _slice_error(backward(), q, k, v, dout, causal)
        if "forward" in state:
            row["forward"] = state["forward"]
        ms = bench(backward)
        both = bench(lambda: (forward(), backward()))
        row.update(bwd_ms=ms, bwd_tflops=2.5 * fwd_flops / ms / 1e9, fwd_bwd_ms=both,
                   fwd_bwd_tflops=3.5 * fwd_flops / both / 1e9)
    except Exception as e:  # noqa: BLE001 - a backend may not support a shape
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    del q, k, v, dout
    torch.cuda.empty_cache()
    return row


def run(ns=NS, dims=HEAD_DIMS, causal_modes=(False, True), include=None):
    bench = _timer()
    rows = []
    cands = candidates(include)
    for d in dims:
        for causal in causal_modes:
            for n in ns:
                batch = [measure(c, n, d, causal, bench) for c in cands]
                print_rows(batch, header=False)
                rows += batch
    return rows


def print_rows(rows, header=True):
    if header:
        print("| candidate | D | N | causal | bwd ms | bwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | max err |")
        print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | {r['d']} | {r['n']} | {r['causal']} | - | - | - | - | {r['error'][:70]} |")
        else:
            print(f"| {r['name']} | {r['d']} | {r['n']} | {r['causal']} | {r['bwd_ms']:.3f} | {r['bwd_tflops']:.0f} | "
                  f"{r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_tflops']:.0f} | {r['max_err']:.2e} |", flush=True)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharey=True)
    for (i, d), (j, causal) in ((x, y) for x in enumerate(HEAD_DIMS) for y in enumerate((False, True))):
        ax = axes[i][j]
        for name in sorted({r["name"] for r in rows}):
            pts = [(r["n"], r["bwd_tflops"]) for r in rows
                   if r["name"] == name and r["d"] == d and r["causal"] == causal and "bwd_tflops" in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"backward, D={d}, {'causal' if causal else 'non-causal'}, bf16, 16k tokens")
        ax.set_xlabel("sequence length N")
        ax.grid(alpha=0.3)
    for i in range(2):
        axes[i][0].set_ylabel("TFLOP/s (2.5 x forward FLOPs)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def sweep(ns=(1024, 4096, 16384)):
    """Backward TFLOP/s of every schedule in SWEEP (and DQ_SWEEP, deterministic) per head dim."""
    from tylopy_kernels.attention.sm90.backward_launch import DQ_SWEEP, SWEEP
    bench = _timer()
    results = []
    for d in HEAD_DIMS:
        grid = [(s, False) for s in SWEEP[d]] + [(s, True) for s in DQ_SWEEP[d]]
        for sched, det in grid:
            cand = Candidate("tylopy", _tylopy(det, sched))
            rows = [measure(cand, n, d, causal, bench) for causal in (False, True) for n in ns]
            results.append({"d": d, "schedule": sched, "deterministic": det, "rows": rows})
            print(f"## D={d} {'deterministic ' if det else ''}{sched}: " + ", ".join(
                f"N={r['n']}{'c' if r['causal'] else ''} {r.get('bwd_tflops', 0):.0f}" for r in rows), flush=True)
    return results


def once(n, d, causal, deterministic):
    """One checked backward (for ncu / nsys: ``ncu --set full tylopy bench attention_backward --once``)."""
    cand = Candidate("tylopy", _tylopy(deterministic))
    q, k, v, dout = _inputs(n, d)
    forward, backward, _ = cand.setup(q, k, v, dout, causal)
    forward()
    print(f"max err on slice: {_slice_error(backward(), q, k, v, dout, causal):.2e}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tylopy bench attention_backward", description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", help="JSON path (default results/attention_backward-<device>-<date>.json)")
    ap.add_argument("--plot", help="PNG path for backward TFLOP/s against N")
    ap.add_argument("--n", type=int, nargs="*", default=list(NS))
    ap.add_argument("--d", type=int, nargs="*", default=list(HEAD_DIMS))
    ap.add_argument("--only", nargs="*", help="candidate names to run (default all)")
    ap.add_argument("--sweep", action="store_true", help="time tylopy schedules instead of the comparison")
    ap.add_argument("--once", action="store_true", help="run one tylopy backward (first --n, --d) and exit")
    ap.add_argument("--causal", action="store_true", help="with --once: causal")
    ap.add_argument("--deterministic", action="store_true", help="with --once: deterministic mode")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench attention_backward needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.once:
        once(args.n[0], args.d[0], args.causal, args.deterministic)
        return 0
    from tylopy.benchmarking import write_results
    from tylopy_kernels.attention.sm90.backward_launch import SCHEDULE
    if args.sweep:
        data = {"sweep": sweep()}
    else:
        print_rows([])
        rows = run(tuple(args.n), tuple(args.d), include=args.only)
        data = {"rows": rows}
        if args.plot:
            plot(rows, args.plot)
    write_results("attention_backward", dict(data, schedule={str(d): dict(s) for d, s in SCHEDULE.items()}), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
