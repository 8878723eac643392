"""``tylopy bench attention``: tylopy's Hopper attention forward beside SDPA (cuDNN, FlashAttention-2)
and the FA3-class kernel (flash-attn-4's CuTe sm90 path, ``flash_attn.cute.flash_attn_func``, in
(B, N, H, D) layout, when importable), all in one process.

Shapes: D = 64 (32 heads) and D = 128 (16 heads), batch x N = 16384 tokens, N from 512 to 16k,
causal and not, bf16. Every candidate is checked on one (batch, head) against an FP64 reference
before it is timed; times are CUDA-event medians after warm-up. TFLOP/s counts 4 B H N^2 D (half of
it for causal). The summary gives tylopy's ratio to each other candidate.

    tylopy bench attention --output results/attention.json --plot results/attention.png
    tylopy bench attention --sweep      # tylopy's schedule options, ~4 minutes: which wins where
    tylopy bench attention --ptx        # PTX instructions per key tile per schedule (no GPU)
    tylopy bench attention --once --d 64 --n 16384 --causal   # one call after warm-up (for ncu)
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys

TOKENS = 16384
HEADS = {64: 32, 128: 16}
NS = (512, 1024, 2048, 4096, 8192, 16384)
DIMS = (64, 128)


def _timer(warmup_ms=100, rep_ms=400):
    from tylopy.benchmarking import median_ms
    return lambda fn: median_ms(fn, warmup_ms, rep_ms)


def _fa3():
    """(flash_attn_func, None) or (None, why it is not available)."""
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func, None
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        return None, f"{type(e).__name__}: {e}"[:200]


def reference_error(out, q, k, v, causal):
    """max |out - ref64| on the first (batch, head); out in (B, H, N, D)."""
    import torch
    qs, ks, vs = q[:1, :1].double(), k[:1, :1].double(), v[:1, :1].double()
    s = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ vs
    return (out[:1, :1].double() - ref).abs().max().item()


def candidates(causal, only=None):
    """name -> fn(inputs) returning the output as (B, H, N, D); inputs holds q, k, v (B, H, N, D)
    and their (B, N, H, D) copies."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tylopy
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def backend(b):
        def run(x):
            with sdpa_kernel(b):
                return sdpa(x["q"], x["k"], x["v"], is_causal=causal)
        return run

    out = {"tylopy": lambda x: tylopy.attention(x["q"], x["k"], x["v"], is_causal=causal),
           "sdpa_cudnn": backend(SDPBackend.CUDNN_ATTENTION),
           "sdpa_flash": backend(SDPBackend.FLASH_ATTENTION)}
    fa3, _ = _fa3()
    if fa3 is not None:
        def run_fa3(x):
            res = fa3(x["qt"], x["kt"], x["vt"], causal=causal)
            return (res[0] if isinstance(res, tuple) else res).transpose(1, 2)
        out["fa3_cute"] = run_fa3
    return {k: v for k, v in out.items() if not only or k in only}


def _inputs(b, h, n, d, seed):
    import torch
    torch.manual_seed(seed)
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    x = {"q": q, "k": k, "v": v}
    x.update({name + "t": t.transpose(1, 2).contiguous() for name, t in (("q", q), ("k", k), ("v", v))})
    return x


def measure(fn, x, n, d, b, h, causal, bench):
    flops = 4 * b * h * n * n * d / (2 if causal else 1)
    try:
        out = fn(x)
        err = reference_error(out, x["q"], x["k"], x["v"], causal)
        ms = bench(lambda: fn(x))
        return {"ms": ms, "tflops": flops / ms / 1e9, "max_err": err}
    except Exception as e:  # noqa: BLE001 - a backend may not support a shape
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def run(ns=NS, dims=DIMS, causal_modes=(False, True), only=None, bench=None):
    import torch
    bench = bench or _timer()
    rows = []
    for d in dims:
        h = HEADS[d]
        for causal in causal_modes:
            cands = candidates(causal, only)
            for n in ns:
                b = max(TOKENS // n, 1)
                x = _inputs(b, h, n, d, seed=n + d)
                for name, fn in cands.items():
                    row = {"name": name, "d": d, "n": n, "batch": b, "heads": h, "causal": causal}
                    row.update(measure(fn, x, n, d, b, h, causal, bench))
                    rows.append(row)
                    print_row(row)
                del x
                torch.cuda.empty_cache()
    return rows


def print_row(r):
    tag = f"| {r['name']} | {r['d']} | {r['n']} | {r['causal']} |"
    if "error" in r:
        print(f"{tag} - | - | {r['error'][:60]} |", flush=True)
    else:
        print(f"{tag} {r['ms']:.3f} | {r['tflops']:.0f} | {r['max_err']:.2e} |", flush=True)


def ratios(rows):
    """tylopy's TFLOP/s over each other candidate's, per (d, causal, n)."""
    out = []
    keyed = {(r["name"], r["d"], r["causal"], r["n"]): r.get("tflops") for r in rows}
    for (name, d, causal, n), t in sorted(keyed.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
        if name != "tylopy" or not t:
            continue
        row = {"d": d, "causal": causal, "n": n, "tylopy": round(t)}
        for other in sorted({r["name"] for r in rows} - {"tylopy"}):
            o = keyed.get((other, d, causal, n))
            row[other] = round(o) if o else None
            row[f"vs_{other}"] = round(t / o, 3) if o else None
        out.append(row)
    return out


def print_ratios(table):
    if not table:
        return
    cols = [k for k in table[0] if k not in ("d", "causal", "n")]
    print("\n| D | causal | N | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for r in table:
        print(f"| {r['d']} | {r['causal']} | {r['n']} | " + " | ".join("-" if r[c] is None else str(r[c]) for c in cols)
              + " |")


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dims = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(len(dims), 2, figsize=(11, 4 * len(dims)), sharey=True, squeeze=False)
    for i, d in enumerate(dims):
        for ax, causal in zip(axes[i], (False, True)):
            for name in sorted({r["name"] for r in rows}):
                pts = [(r["n"], r["tflops"]) for r in rows
                       if r["name"] == name and r["d"] == d and r["causal"] == causal and "tflops" in r]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length N")
            ax.set_title(f"D={d}, {'causal' if causal else 'non-causal'}, bf16, 16k tokens x {HEADS[d]} heads")
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel("TFLOP/s")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# -- the schedule sweep -------------------------------------------------------------------------------

@contextlib.contextmanager
def schedule(d, override):
    """Launch with the head dim's SCHEDULE updated by ``override`` (restored afterwards)."""
    from tylopy_kernels.attention import hopper_launch as launch
    name = "SCHEDULE" if d == 64 else "SCHEDULE_128"
    saved = getattr(launch, name)
    setattr(launch, name, dict(saved, **override))
    try:
        yield
    finally:
        setattr(launch, name, saved)


LONG, SHORT = (2048, 4096, 16384), (512, 1024, 2048)  # LONG stays off the persistent table
# (label, head dim, schedule changes, sequence lengths): docs/performance.md "v5" says what each
# should do. About 30 specializations to compile and 120 timed points: ~4 minutes on an H200 host.
SWEEP = [
    ("default", 64, {}, LONG),
    ("v4 arithmetic (exact, eager)", 64, {"EXPONENT": "exact", "RESCALE_THRESHOLD": None}, LONG),
    ("exact, lazy", 64, {"EXPONENT": "exact"}, LONG),
    ("ffma, eager", 64, {"RESCALE_THRESHOLD": None}, LONG),
    ("fast (no guard)", 64, {"EXPONENT": "fast"}, LONG),
    ("fast, PV wait free", 64, {"EXPONENT": "fast", "PV_WAIT": "free"}, LONG),
    ("split S", 64, {"SPLIT_S": True}, LONG),
    ("poly exp2 2/8", 64, {"POLY_EXP2": 2}, LONG),
    ("poly exp2 4/8", 64, {"POLY_EXP2": 4}, (16384,)),
    ("4 consumers x 64 keys", 64, {"CONSUMERS": 4, "BLOCK_N": 64}, LONG),
    ("short: not persistent", 64, {"PERSISTENT": False}, SHORT),
    ("short: persistent 2 x 128, heads order", 64, {"PERSISTENT": True, "CONSUMERS": 2, "ORDER": "heads"}, SHORT),
    ("short: persistent 2 x 128, lpt", 64, {"PERSISTENT": True, "CONSUMERS": 2, "ORDER": "lpt"}, SHORT),
    ("short: persistent 3 x 128, lpt", 64, {"PERSISTENT": True, "CONSUMERS": 3, "ORDER": "lpt"}, SHORT),
    ("short: persistent lpt + TMA store", 64, {"PERSISTENT": True, "CONSUMERS": 2, "ORDER": "lpt",
                                               "TMA_STORE": True}, SHORT),
    ("short: persistent, epilogue inline", 64, {"PERSISTENT": True, "CONSUMERS": 2, "DEFER_EPILOGUE": False},
     SHORT),
    ("default", 128, {}, LONG),
    ("128 x 176", 128, {"BLOCK_N": 176}, LONG),
    ("192 x 64 (3 consumers)", 128, {"BLOCK_N": 64, "CONSUMERS": 3}, LONG),
    ("split S", 128, {"SPLIT_S": True}, LONG),
    ("exact, eager", 128, {"EXPONENT": "exact", "RESCALE_THRESHOLD": None}, LONG),
    ("short: not persistent", 128, {"PERSISTENT": False}, SHORT),
    ("short: persistent lpt + TMA store", 128, {"PERSISTENT": True, "ORDER": "lpt", "TMA_STORE": True}, SHORT),
]


def sweep(entries=SWEEP, bench=None):
    """Time tylopy under each entry's schedule (non-causal and causal); rows carry ``config``."""
    import torch
    bench = bench or _timer(25, 100)
    rows = []
    for label, d, override, ns in entries:
        for causal in (False, True):
            fn = candidates(causal, ("tylopy",))["tylopy"]
            for n in ns:
                b, h = max(TOKENS // n, 1), HEADS[d]
                x = _inputs(b, h, n, d, seed=n + d)
                with schedule(d, override):
                    row = {"config": label, "schedule": override, "d": d, "n": n, "causal": causal}
                    row.update(measure(fn, x, n, d, b, h, causal, bench))
                rows.append(row)
                del x
            torch.cuda.empty_cache()
        got = [r for r in rows if r["config"] == label and r["d"] == d]
        print(f"## D={d} {label}: " + ", ".join(f"N={r['n']}{'c' if r['causal'] else ''} "
                                                  f"{r.get('tflops', 0):.0f}" for r in got), flush=True)
    return rows


def sweep_summary(rows):
    """Per (d, causal, n): each config's TFLOP/s over the default's, and the winner."""
    best = {}
    base = {(r["d"], r["causal"], r["n"]): r.get("tflops") for r in rows if r["config"] == "default"}
    print("\n| D | causal | N | config | TFLOP/s | vs default |")
    print("|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["d"], r["causal"], r["n"], -(r.get("tflops") or 0))):
        key = (r["d"], r["causal"], r["n"])
        t, b = r.get("tflops"), base.get(key)
        rel = f"{t / b:.3f}" if t and b else "-"
        print(f"| {r['d']} | {r['causal']} | {r['n']} | {r['config']} | {t or 0:.0f} | {rel} |")
        if t and (key not in best or t > best[key][1]):
            best[key] = (r["config"], t)
    return {f"D{d} {'causal' if c else 'non-causal'} N={n}": cfg for (d, c, n), (cfg, _) in sorted(best.items())}


def once(d, n, causal, reps=3):
    """A few tylopy calls after warm-up: for ``ncu --launch-skip`` / ``nsys``."""
    import torch
    b, h = max(TOKENS // n, 1), HEADS[d]
    x = _inputs(b, h, n, d, seed=n + d)
    fn = candidates(causal, ("tylopy",))["tylopy"]
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    for _ in range(reps):
        fn(x)
    torch.cuda.synchronize()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tylopy bench attention", description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", help="JSON path (default results/attention-<device>-<date>.json)")
    ap.add_argument("--plot", help="PNG path for TFLOP/s against N")
    ap.add_argument("--n", type=int, nargs="*", default=list(NS))
    ap.add_argument("--d", type=int, nargs="*", default=list(DIMS), choices=DIMS)
    ap.add_argument("--only", nargs="*", help="candidates to run (tylopy, sdpa_cudnn, sdpa_flash, fa3_cute)")
    ap.add_argument("--sweep", action="store_true", help="time tylopy's schedule options instead of the comparison")
    ap.add_argument("--ptx", action="store_true", help="print PTX instructions per key tile per schedule (no GPU)")
    ap.add_argument("--once", action="store_true", help="run tylopy a few times on one shape (--d, --n, --causal)")
    ap.add_argument("--causal", action="store_true", help="with --once: causal")
    ap.add_argument("--schedule", default="", help="tylopy schedule changes, e.g. BLOCK_N=128,CONSUMERS=2")
    args = ap.parse_args(argv)
    if args.ptx:
        from .ptx_profile import print_table
        print_table()
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench attention needs a CUDA GPU", file=sys.stderr)
        return 2
    sched = {k: _value(v) for k, v in (kv.split("=") for kv in args.schedule.split(",") if kv)}
    if args.once:
        with schedule(args.d[0], sched):
            once(args.d[0], args.n[0], args.causal)
        return 0
    from tylopy.benchmarking import write_results
    from tylopy_kernels.attention import hopper_launch as launch
    if args.sweep:
        rows = sweep()
        data = {"sweep": rows, "winners": sweep_summary(rows)}
        print("\nwinners:", data["winners"])
    else:
        print("| candidate | D | N | causal | ms | TFLOP/s | max err |\n|---|---|---|---|---|---|---|")
        with contextlib.ExitStack() as stack:
            for d in args.d:
                stack.enter_context(schedule(d, sched))
            rows = run(tuple(args.n), tuple(args.d), only=args.only)
        table = ratios(rows)
        print_ratios(table)
        data = {"rows": rows, "ratios": table, "fa3_cute": _fa3()[1] or "available"}
        if args.plot:
            plot(rows, args.plot)
    write_results("attention", dict(data, schedule=dict(launch.SCHEDULE), schedule_128=dict(launch.SCHEDULE_128),
                                    overrides=sched), args.output)
    return 0


def _value(text):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"True": True, "False": False, "None": None}.get(text, text)


if __name__ == "__main__":
    sys.exit(main())
