"""``tylopy bench gemm``: tylopy.matmul beside torch.matmul (cuBLAS) and a Triton matmul.

Shapes: square 4096^3 and 8192^3 (A @ B, both row-major); LLM layers M = 8192 with (N, K) in
{4096, 11008, 14336}^2 as a Linear layer (x @ W^T, W stored (N, K): B is K-major); skinny
M in {16, 128} with the same (N, K) pairs. bf16 by default. Every candidate is first checked on
a slice of rows against an FP64 reference (``reference.within_bound``), then timed with CUDA-event
medians (triton.testing.do_bench when Triton is installed), all in one process. TFLOP/s counts
2 M N K. The tylopy column runs the schedule ty.autotune picks (run twice with
TYLOPY_AUTOTUNE_VERBOSE=1 to see the first process tune and the second read the stored choices).

    tylopy bench gemm --output results/gemm.json --plot results/gemm.png
    tylopy bench gemm --sweep           # every tylopy schedule on a few shapes, to pick defaults
    tylopy bench gemm --once 8192 8192 8192 --schedule SCHEDULE=pingpong,BLOCK_M=128,BLOCK_N=128
                                        # one launch (for ncu), no timing loop
"""
from __future__ import annotations

import argparse
import sys

from tylopy.benchmarking import parse_schedule

PAIRS = [(n, k) for n in (4096, 11008, 14336) for k in (4096, 11008, 14336)]
SHAPES = {
    "square": [(4096, 4096, 4096, "nn"), (8192, 8192, 8192, "nn")],
    "llm": [(8192, n, k, "nt") for n, k in PAIRS],
    "skinny": [(m, n, k, "nt") for m in (16, 128) for n, k in PAIRS],
}
SWEEP_SHAPES = [(4096, 4096, 4096, "nn"), (8192, 8192, 8192, "nn"), (8192, 14336, 4096, "nt"),
                (8192, 4096, 14336, "nt"), (128, 11008, 4096, "nt"), (16, 4096, 4096, "nt")]
CHECK_ROWS = 256


def _timer():
    from tylopy.benchmarking import median_ms
    return lambda fn: median_ms(fn, 50, 300)


def operands(m, n, k, layout, dtype, seed=0):
    """(a, b): ``nn`` a (M, K) and b (K, N) row-major; ``nt`` b = W.t() of a (N, K) weight."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    if layout == "nn":
        b = torch.randn(k, n, device="cuda", generator=g).to(dtype)
    else:
        b = torch.randn(n, k, device="cuda", generator=g).to(dtype).t()
    return a, b


def candidates(schedule=None):
    import torch

    import tylopy
    out = {"tylopy": lambda a, b: tylopy.matmul(a, b, schedule=schedule), "torch": torch.matmul}
    try:
        from tylopy_kernels.gemm.bench.triton_matmul import matmul as triton_matmul
        out["triton"] = triton_matmul
    except ImportError:
        pass
    return out


def check(fn, a, b):
    """(within the FP64 bound, worst error / bound) on the first rows."""
    from tylopy_kernels.gemm.testing.reference import reference_fp64, within_bound
    rows = min(CHECK_ROWS, a.shape[0])
    out = fn(a, b)[:rows]
    ref = reference_fp64(a[:rows], b)
    return within_bound(out, a[:rows], b, ref)


def run(shapes, dtype_name="bf16", only=None, schedule=None, bench=None):
    import torch
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    bench = bench or _timer()
    cands = candidates(schedule)
    rows = []
    for m, n, k, layout in shapes:
        a, b = operands(m, n, k, layout, dtype, seed=m + n + k)
        flops = 2.0 * m * n * k
        shape_rows = []
        for name, fn in cands.items():
            if only and name not in only:
                continue
            row = {"name": name, "m": m, "n": n, "k": k, "layout": layout, "dtype": dtype_name}
            try:
                ok, worst = check(fn, a, b)
                ms = bench(lambda: fn(a, b))
                row.update(ms=ms, tflops=flops / ms / 1e9, check_ok=ok, err_over_bound=worst)
                if name == "tylopy" and schedule is None:
                    from tylopy_kernels.gemm import launch
                    row["schedule"] = _chosen(launch, a, b)
            except Exception as e:  # noqa: BLE001 - a candidate may not support a shape
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            shape_rows.append(row)
        base = next((r.get("tflops") for r in shape_rows if r["name"] == "torch"), None)
        for r in shape_rows:
            if base and r.get("tflops"):
                r["vs_torch"] = r["tflops"] / base
        print_rows(shape_rows, header=False)
        rows += shape_rows
        del a, b
    return rows


def _chosen(launch, a, b):
    import torch
    a2, b2, am, bm = launch.prepare(a, b)
    out = launch.output_buffer(a.shape[0], b.shape[1], a.dtype, a.device)
    with torch.cuda.device(a.device):
        return launch.run.best_config(a2, b2, out, None, None, am, bm).kwargs


def print_rows(rows, header=True):
    if header:
        print("| candidate | M | N | K | layout | ms | TFLOP/s | vs torch | check (err/bound) |")
        print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        shape = f"| {r['name']} | {r['m']} | {r['n']} | {r['k']} | {r['layout']} |"
        if "error" in r:
            print(f"{shape} - | - | - | {r['error'][:80]} |", flush=True)
        else:
            ok = "ok" if r["check_ok"] else "FAIL"
            print(f"{shape} {r['ms']:.4f} | {r['tflops']:.0f} | {r.get('vs_torch', 0):.3f} | "
                  f"{ok} ({r['err_over_bound']:.2f}) |", flush=True)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shapes = []
    for r in rows:
        s = (r["m"], r["n"], r["k"], r["layout"])
        if s not in shapes:
            shapes.append(s)
    names = sorted({r["name"] for r in rows}, key=lambda x: ("tylopy", "torch", "triton").index(x)
                   if x in ("tylopy", "torch", "triton") else 9)
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(shapes) * len(names)), 4.5))
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        ys = [next((r.get("tflops", 0) for r in rows if r["name"] == name and (r["m"], r["n"], r["k"], r["layout"])
                    == s), 0) for s in shapes]
        ax.bar([i + j * width for i in range(len(shapes))], ys, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
    ax.set_xticklabels([f"{m}x{n}x{k}\n{lay}" for m, n, k, lay in shapes], fontsize=7, rotation=60)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("GEMM, bf16 in, fp32 accumulate (same process)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def sweep_schedules():
    """Every launcher config, with the other tile order and, where it fits, the other store path."""
    from tylopy_kernels.gemm import launch
    seen, out = [], []
    stores = ["direct"] + (["tma"] if launch.TMA_STORE_AVAILABLE else [])
    for cfg in launch.CONFIGS:
        for group in (8, 16):
            for store in stores:
                try:
                    s = launch.schedule(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SCHEDULE"], group, store=store,
                                        split_k=cfg.get("SPLIT_K", 1))
                except ValueError:
                    continue
                if s not in seen:
                    seen.append(s)
                    out.append(s)
    return out


def sweep(dtype_name="bf16"):
    bench = _timer()
    results = []
    for sched in sweep_schedules():
        rows = run(SWEEP_SHAPES, dtype_name, only=("tylopy",), schedule=sched, bench=bench)
        results.append({"schedule": sched, "rows": rows})
        print("## " + ",".join(f"{k}={v}" for k, v in sched.items()) + ": "
              + ", ".join(f"{r['m']}x{r['n']}x{r['k']} {r.get('tflops', 0):.0f}" for r in rows), flush=True)
    torch_rows = run(SWEEP_SHAPES, dtype_name, only=("torch",), bench=bench)
    best = {}
    for res in results:
        for r in res["rows"]:
            key = f"{r['m']}x{r['n']}x{r['k']}"
            if r.get("tflops", 0) > best.get(key, (0, None))[0]:
                best[key] = (r["tflops"], res["schedule"])
    for r in torch_rows:
        key = f"{r['m']}x{r['n']}x{r['k']}"
        if key in best and r.get("tflops"):
            print(f"best {key}: {best[key][0]:.0f} TFLOP/s ({best[key][0] / r['tflops']:.3f} x torch) {best[key][1]}")
    return {"sweep": results, "torch": torch_rows, "best": {k: {"tflops": v[0], "schedule": v[1]} for k, v in best.items()}}


def once(m, n, k, layout, dtype_name, schedule):
    """One launch of tylopy.matmul (after a warm-up launch that compiles), for a profiler."""
    import torch

    import tylopy
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    a, b = operands(m, n, k, layout, dtype)
    tylopy.matmul(a, b, schedule=schedule)
    torch.cuda.synchronize()
    tylopy.matmul(a, b, schedule=schedule)
    torch.cuda.synchronize()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tylopy bench gemm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", help="JSON path (default results/gemm-<device>-<date>.json)")
    ap.add_argument("--plot", help="PNG path for TFLOP/s per shape")
    ap.add_argument("--shapes", default="square,llm,skinny", help="comma list of: " + ", ".join(SHAPES))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--sweep", action="store_true", help="time every tylopy schedule on a few shapes")
    ap.add_argument("--schedule", default="", help="fix tylopy's schedule, e.g. SCHEDULE=pingpong,BLOCK_M=128")
    ap.add_argument("--once", type=int, nargs=3, metavar=("M", "N", "K"), help="one launch for a profiler")
    ap.add_argument("--layout", default="nn", choices=("nn", "nt"), help="operand layout for --once")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench gemm needs a CUDA GPU", file=sys.stderr)
        return 2
    schedule = parse_schedule(args.schedule) or None
    if args.once:
        once(*args.once, args.layout, args.dtype, schedule)
        return 0
    if args.sweep:
        data = sweep(args.dtype)
    else:
        shapes = [s for group in args.shapes.split(",") for s in SHAPES[group]]
        print_rows([])
        rows = run(shapes, args.dtype, schedule=schedule)
        data = {"rows": rows}
        if args.plot:
            plot(rows, args.plot)
    from tylopy.benchmarking import write_results
    write_results("gemm-sweep" if args.sweep else "gemm", dict(data, schedule=schedule), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
