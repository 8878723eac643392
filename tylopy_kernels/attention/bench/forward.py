"""``tylopy bench attention``: tylopy's Hopper attention forward beside SDPA (cuDNN, FlashAttention-2)
and the FA3-class kernel (flash-attn-4's CuTe sm90 path, ``flash_attn.cute.flash_attn_func``, in
(B, N, H, D) layout, when importable), all in one process.

Shapes: D = 64 (32 heads) and D = 128 (16 heads), batch x N = 16384 tokens, N from 512 to 16k,
causal and not, bf16. Two passes: the first calls every candidate once on every shape (tylopy's
specializations compile, cuDNN builds its plans, the CuTe kernel JIT-compiles) and checks its
output on one (batch, head) against an FP64 reference; the second times them (CUDA-event medians
of ~10-100 calls after a short warm-up; about two minutes in all on an H200, most of it the CuTe
kernel's compiles). TFLOP/s counts 4 B H N^2 D (half of it for causal). The last table gives
tylopy's ratio to the FA3-class kernel and to cuDNN.

    tylopy bench attention --output results/attention.json   # + results/attention.png
    tylopy bench attention --sweep      # tylopy's schedule options, ~5 minutes: which wins where
    tylopy bench attention --ptx        # PTX instructions per key tile per schedule (no GPU)
    tylopy bench attention --sass       # SASS of the launcher's picks, per key tile (ptxas + nvdisasm)
    tylopy bench attention --once --d 64 --n 16384 --causal   # a few calls after warm-up (for ncu)
    tylopy bench attention --fp8        # the FP8 forward beside bf16 and the FA3-class FP8 (``fp8.py``)
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys

from tylopy.benchmarking import parse_schedule

TOKENS = 16384
HEADS = {64: 32, 128: 16}
NS = (512, 1024, 2048, 4096, 8192, 16384)
DIMS = (64, 128)


WARMUP_MS, REP_MS = 20, 80  # per timed point: a CUDA-event median of ~10-100 calls


def _timer(warmup_ms=WARMUP_MS, rep_ms=REP_MS):
    from tylopy.benchmarking import median_ms
    return lambda fn: median_ms(fn, warmup_ms, rep_ms)


def _fa3():
    """(flash_attn_func, None) or (None, why it is not available)."""
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func, None
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        return None, f"{type(e).__name__}: {e}"[:200]


def reference(q, k, v, causal):
    """softmax(q k^T / sqrt(D)) v in float64 on the first (batch, head) of (B, H, N, D) inputs."""
    import torch
    qs, ks, vs = q[:1, :1].double(), k[:1, :1].double(), v[:1, :1].double()
    s = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ vs


def reference_error(out, q, k, v, causal, ref=None):
    """max |out - ref64| on the first (batch, head); out in (B, H, N, D)."""
    ref = reference(q, k, v, causal) if ref is None else ref
    return (out[:1, :1].double() - ref).abs().max().item()


def candidates(causal, only=None, variants=()):
    """name -> fn(inputs) returning the output as (B, H, N, D); inputs holds q, k, v (B, H, N, D)
    and their (B, N, H, D) copies. Each of ``variants`` (schedule changes, as ``--schedule``
    takes them) adds a candidate ``tylopy[K=V,...]``: tylopy under those changes, timed in the same
    process as the others."""
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
    out = {k: v for k, v in out.items() if not only or k in only}
    for text in variants:
        out[f"tylopy[{text}]"] = _variant(parse_schedule(text), causal)
    return out


def _variant(override, causal):
    import tylopy

    def run_variant(x):
        with schedule(x["q"].shape[-1], override):
            return tylopy.attention(x["q"], x["k"], x["v"], is_causal=causal)
    return run_variant


def _inputs(b, h, n, d, seed, device="cuda"):
    import torch
    torch.manual_seed(seed)
    q = torch.randn(b, h, n, d, device=device, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    x = {"q": q, "k": k, "v": v}
    x.update({name + "t": t.transpose(1, 2).contiguous() for name, t in (("q", q), ("k", k), ("v", v))})
    return x


def flops(n, d, b, h, causal):
    return 4 * b * h * n * n * d / (2 if causal else 1)


def measure(fn, x, n, d, b, h, causal, bench):
    """Check one candidate's output, then time it (both in one go: the sweep's way)."""
    row = prepare(fn, x, causal)
    if "error" not in row:
        row.update(time_point(fn, x, n, d, b, h, causal, bench))
    return row


def prepare(fn, x, causal, ref=None):
    """Call a candidate once (it compiles or plans what it needs) and check its output:
    {"max_err": ...} or {"error": ...}."""
    import torch
    try:
        out = fn(x)
        if out.is_cuda:
            torch.cuda.synchronize()
        return {"max_err": reference_error(out, x["q"], x["k"], x["v"], causal, ref)}
    except Exception as e:  # noqa: BLE001 - a backend may not support a shape
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def time_point(fn, x, n, d, b, h, causal, bench):
    try:
        ms = bench(lambda: fn(x))
        return {"ms": ms, "tflops": flops(n, d, b, h, causal) / ms / 1e9}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def points(ns=NS, dims=DIMS, causal_modes=(False, True)):
    """(d, causal, n, batch, heads) of every shape, in the order they run."""
    return [(d, causal, n, max(TOKENS // n, 1), HEADS[d]) for d in dims for causal in causal_modes for n in ns]


def run(ns=NS, dims=DIMS, causal_modes=(False, True), only=None, bench=None, device="cuda", variants=()):
    """Both passes over every shape (module docstring); rows as ``print_row`` prints them."""
    import time

    import torch
    bench = bench or _timer()
    shapes = points(ns, dims, causal_modes)
    cands = {causal: candidates(causal, only, variants) for causal in causal_modes}
    checked, t0 = {}, time.perf_counter()
    for d, causal, n, b, h in shapes:  # pass 1: compile / plan / JIT, and check, outside any timing
        x = _inputs(b, h, n, d, seed=n + d, device=device)
        ref = reference(x["q"], x["k"], x["v"], causal)
        for name, fn in cands[causal].items():
            t = time.perf_counter()
            checked[(name, d, causal, n)] = dict(prepare(fn, x, causal, ref), first_call_s=time.perf_counter() - t)
        del x, ref
        torch.cuda.empty_cache()
    per_name = {}
    for (name, *_), r in checked.items():
        per_name[name] = per_name.get(name, 0.0) + r["first_call_s"]
    print(f"first calls and checks: {time.perf_counter() - t0:.0f} s ("
          + ", ".join(f"{name} {sec:.0f} s" for name, sec in per_name.items()) + ")", flush=True)
    rows, t0 = [], time.perf_counter()
    print("| candidate | D | N | causal | ms | TFLOP/s | max err |\n|---|---|---|---|---|---|---|", flush=True)
    for d, causal, n, b, h in shapes:  # pass 2: timing only
        x = _inputs(b, h, n, d, seed=n + d, device=device)
        for name, fn in cands[causal].items():
            row = {"name": name, "d": d, "n": n, "batch": b, "heads": h, "causal": causal}
            row.update(checked[(name, d, causal, n)])
            if "error" not in row:
                row.update(time_point(fn, x, n, d, b, h, causal, bench))
            rows.append(row)
            print_row(row)
        del x
        torch.cuda.empty_cache()
    print(f"timing: {time.perf_counter() - t0:.0f} s", flush=True)
    return rows


def print_row(r):
    tag = f"| {r['name']} | {r['d']} | {r['n']} | {r['causal']} |"
    if "error" in r:
        print(f"{tag} - | - | {r['error'][:60]} |", flush=True)
    else:
        print(f"{tag} {r['ms']:.3f} | {r['tflops']:.0f} | {r['max_err']:.2e} |", flush=True)


def ratios(rows, subject="tylopy"):
    """``subject``'s TFLOP/s (tylopy, or a ``tylopy[...]`` variant, filed under "tylopy") over each
    other candidate's, per (d, causal, n)."""
    out = []
    keyed = {(r["name"], r["d"], r["causal"], r["n"]): r.get("tflops") for r in rows}
    for (name, d, causal, n), t in sorted(keyed.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
        if name != subject or not t:
            continue
        row = {"d": d, "causal": causal, "n": n, "tylopy": round(t)}
        for other in sorted({r["name"] for r in rows} - {subject}):
            o = keyed.get((other, d, causal, n))
            col = "default" if other == "tylopy" else other  # a variant's table: the default schedule
            row[col] = round(o) if o else None
            row[f"vs_{col}"] = round(t / o, 3) if o else None
        out.append(row)
    return out


SUMMARY_NAMES = ("tylopy", "default", "fa3_cute", "sdpa_cudnn", "sdpa_flash")
SUMMARY_RATIOS = (("default", "default schedule"), ("fa3_cute", "FA3-class"), ("sdpa_cudnn", "cuDNN"))


def print_ratios(table):
    """The final table: each candidate's TFLOP/s, tylopy's ratio to the FA3-class kernel and to
    cuDNN, and their geometric means over the shapes where both ran."""
    if not table:
        return
    names = [n for n in SUMMARY_NAMES if n in table[0]]
    ratio_cols = [(other, label) for other, label in SUMMARY_RATIOS if f"vs_{other}" in table[0]]
    print("\n| D | causal | N | " + " | ".join(names) + " | "
          + " | ".join(f"tylopy / {label}" for _, label in ratio_cols) + " |")
    print("|---|---|---|" + "---|" * (len(names) + len(ratio_cols)))
    for r in table:
        cells = ["-" if r.get(c) is None else str(r[c]) for c in names]
        cells += ["-" if r.get(f"vs_{o}") is None else f"{r[f'vs_{o}']:.2f}" for o, _ in ratio_cols]
        print(f"| {r['d']} | {'yes' if r['causal'] else 'no'} | {r['n']} | " + " | ".join(cells) + " |")
    for other, label in ratio_cols:
        vals = [r[f"vs_{other}"] for r in table if r.get(f"vs_{other}")]
        if vals:
            gm = math.exp(sum(math.log(v) for v in vals) / len(vals))
            print(f"tylopy / {label}: geometric mean {gm:.3f} over {len(vals)} shapes, "
                  f"min {min(vals):.2f}, max {max(vals):.2f}")


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
    from tylopy_kernels.attention.sm90 import launch as launch
    name = "SCHEDULE" if d == 64 else "SCHEDULE_128"
    saved = getattr(launch, name)
    setattr(launch, name, dict(saved, **override))
    try:
        yield
    finally:
        setattr(launch, name, saved)


LONG, SHORT, ALL = (2048, 4096, 16384), (512, 1024, 2048), (512, 1024, 2048, 4096, 16384)
P2 = {"PERSISTENT": True, "CONSUMERS": 2}
# (label, head dim, schedule changes, sequence lengths): docs/performance.md "v5" says what each
# should do and what the first sweep measured. "default" is the launcher's choice at each length
# (sm90/launch.LENGTH_TABLE); the options the first sweep settled as losses (split S, poly 4/8,
# lpt without a TMA store, 128 x 176) are left out, as is PV_WAIT=free (the same SASS as pinned).
# About 30 specializations and 170 timed points: ~5 minutes on an H200 host.
SWEEP = [
    ("default", 64, {}, ALL),
    ("v4 arithmetic (exact, eager)", 64, {"EXPONENT": "exact", "RESCALE_THRESHOLD": None}, LONG),
    ("exact, lazy", 64, {"EXPONENT": "exact"}, LONG),
    ("ffma, eager", 64, {"RESCALE_THRESHOLD": None}, LONG),
    ("fast (no guard)", 64, {"EXPONENT": "fast"}, ALL),
    ("shared exponent sequence", 64, {"EXPONENT": "shared"}, ALL),
    ("poly exp2 2/8", 64, {"POLY_EXP2": 2}, LONG),
    ("4 consumers x 64 keys", 64, {"CONSUMERS": 4, "BLOCK_N": 64}, LONG),
    ("short: not persistent", 64, {"PERSISTENT": False}, SHORT),
    ("short: persistent 2 x 128, heads order", 64, dict(P2, ORDER="heads"), SHORT),
    ("short: persistent 3 x 128, lpt", 64, {"PERSISTENT": True, "CONSUMERS": 3, "ORDER": "lpt"}, SHORT),
    ("short: persistent lpt + TMA store", 64, dict(P2, ORDER="lpt", TMA_STORE=True), SHORT),
    ("short: persistent heads + TMA store", 64, dict(P2, ORDER="heads", TMA_STORE=True), SHORT),
    ("short: persistent lpt + TMA store, epilogue inline", 64,
     dict(P2, ORDER="lpt", TMA_STORE=True, DEFER_EPILOGUE=False), SHORT),
    ("short: persistent heads + TMA store, epilogue inline", 64,
     dict(P2, ORDER="heads", TMA_STORE=True, DEFER_EPILOGUE=False), SHORT),
    ("default", 128, {}, ALL),
    ("192 x 64 (3 consumers)", 128, {"BLOCK_N": 64, "CONSUMERS": 3}, LONG),
    ("exact, eager", 128, {"EXPONENT": "exact", "RESCALE_THRESHOLD": None}, LONG),
    ("fast (no guard)", 128, {"EXPONENT": "fast"}, LONG),
    ("shared exponent sequence", 128, {"EXPONENT": "shared"}, ALL),
    ("not persistent", 128, {"PERSISTENT": False}, SHORT),
    ("persistent lpt + TMA store", 128, {"PERSISTENT": True, "ORDER": "lpt", "TMA_STORE": True}, ALL),
    ("persistent heads + TMA store", 128, {"PERSISTENT": True, "ORDER": "heads", "TMA_STORE": True}, ALL),
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


def once(d, n, causal, reps=3, name="tylopy"):
    """One candidate (tylopy unless ``name``) called 3 times as warm-up, then ``reps`` times, on one
    shape: for ``ncu --launch-skip 3 --launch-count 1 -k <kernel>`` or ``nsys``."""
    import torch
    b, h = max(TOKENS // n, 1), HEADS[d]
    x = _inputs(b, h, n, d, seed=n + d)
    cands = candidates(causal, (name,))
    if name not in cands:
        raise SystemExit(f"--once expects a candidate that runs here (tylopy, sdpa_cudnn, sdpa_flash, fa3_cute), "
                         f"but got {name!r}" + (f" ({_fa3()[1]})" if name == "fa3_cute" else ""))
    fn = cands[name]
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    for _ in range(reps):
        fn(x)
    torch.cuda.synchronize()
    print(f"{name}: D={d} N={n} batch={b} heads={h} causal={causal}: 3 warm-up calls, then {reps}", flush=True)


def sass_profiles():
    """(name, constexprs) of what the launcher runs at 16k and 1k tokens (bf16, no mask, no LSE),
    and the exponent forms at D=64."""
    import tylopy as ty
    from tylopy_kernels.attention.sm90 import launch as launch

    def pick(d, n, causal, **change):
        return dict(launch.resolve_schedule(d, n, causal, False), DTYPE=ty.bf16, HEAD_DIM=d, HAS_MASK=False,
                    RETURN_LSE=False, **change)
    return [("D=64, 16k (3 x 128)", pick(64, 16384, False)), ("D=64, 16k, causal", pick(64, 16384, True)),
            ("D=64, 1k (persistent, 2 x 128)", pick(64, 1024, False)),
            ("D=64, 16k, EXPONENT=shared", pick(64, 16384, False, EXPONENT="shared")),
            ("D=64, 16k, EXPONENT=fast", pick(64, 16384, False, EXPONENT="fast")),
            ("D=128, 16k (2 x 128)", pick(128, 16384, False)), ("D=128, 16k, causal", pick(128, 16384, True))]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tylopy bench attention", description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", help="JSON path (default results/attention-<device>-<date>.json)")
    ap.add_argument("--plot", help="PNG path for TFLOP/s against N (default: the JSON path with .png)")
    ap.add_argument("--n", type=int, nargs="*", default=list(NS))
    ap.add_argument("--d", type=int, nargs="*", default=list(DIMS), choices=DIMS)
    ap.add_argument("--only", nargs="*", help="candidates to run (tylopy, sdpa_cudnn, sdpa_flash, fa3_cute); with "
                                              "--once the one to run (default tylopy)")
    ap.add_argument("--sweep", action="store_true", help="time tylopy's schedule options instead of the comparison")
    ap.add_argument("--ptx", action="store_true", help="print PTX instructions per key tile per schedule (no GPU)")
    ap.add_argument("--sass", action="store_true",
                    help="print SASS instructions per key tile of the launcher's picks (ptxas + nvdisasm, no GPU)")
    ap.add_argument("--once", action="store_true",
                    help="run one candidate (tylopy, or --only NAME) a few times on one shape (--d, --n, --causal): "
                         "for ncu / nsys")
    ap.add_argument("--causal", action="store_true", help="with --once: causal")
    ap.add_argument("--schedule", default="", help="tylopy schedule changes, e.g. BLOCK_N=128,CONSUMERS=2")
    ap.add_argument("--variant", action="append", default=[], metavar="K=V,...",
                    help="also time tylopy under these schedule changes, as candidate tylopy[K=V,...] "
                         "(repeatable; its own ratio table follows the main one)")
    ap.add_argument("--warmup-ms", type=float, default=WARMUP_MS, help="warm-up per timed point (comparison)")
    ap.add_argument("--rep-ms", type=float, default=REP_MS, help="timed calls per point, in ms (comparison)")
    ap.add_argument("--fp8", action="store_true", help="the FP8 (e4m3) forward at D=128 beside tylopy's bf16 forward "
                                                       "and an FA3-class FP8 forward (bench/fp8.py)")
    ap.add_argument("--ptxas", action="store_true", help="with --fp8: registers and spills of the FP8 kernel (no GPU)")
    args = ap.parse_args(argv)
    if args.fp8:
        from tylopy_kernels.attention.bench.fp8 import main as fp8_main
        return fp8_main(args, _timer(args.warmup_ms, args.rep_ms))
    if args.ptx:
        from tylopy_kernels.attention.bench.ptx_profile import print_table
        print_table()
        return 0
    if args.sass:
        from tylopy_kernels.attention.bench.sass_profile import print_table as print_sass
        print_sass(sass_profiles())
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench attention needs a CUDA GPU", file=sys.stderr)
        return 2
    sched = parse_schedule(args.schedule)
    if args.once:
        with schedule(args.d[0], sched):
            once(args.d[0], args.n[0], args.causal, name=(args.only or ["tylopy"])[0])
        return 0
    from tylopy.benchmarking import write_results
    from tylopy_kernels.attention.sm90 import launch as launch
    if args.sweep:
        rows = sweep()
        data = {"sweep": rows, "winners": sweep_summary(rows)}
        print("\nwinners:", data["winners"])
    else:
        with contextlib.ExitStack() as stack:
            for d in args.d:
                stack.enter_context(schedule(d, sched))
            rows = run(tuple(args.n), tuple(args.d), only=args.only, bench=_timer(args.warmup_ms, args.rep_ms),
                       variants=tuple(args.variant))
        table = ratios(rows)
        print_ratios(table)
        variant_tables = {}
        for text in args.variant:
            print(f"\nvariant tylopy[{text}] (its ratios; the column 'tylopy' is the variant):")
            variant_tables[text] = ratios(rows, f"tylopy[{text}]")
            print_ratios(variant_tables[text])
        data = {"rows": rows, "ratios": table, "variant_ratios": variant_tables, "fa3_cute": _fa3()[1] or "available",
                "timing": {"warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms,
                           "statistic": "median of CUDA-event times"}}
    path = write_results("attention", dict(data, schedule=dict(launch.SCHEDULE),
                                           schedule_128=dict(launch.SCHEDULE_128),
                                           length_table={f"D{d} {'causal' if c else 'non-causal'}": t
                                                         for (d, c), t in launch.LENGTH_TABLE.items()},
                                           overrides=sched), args.output)
    if not args.sweep:
        png = args.plot or os.path.splitext(path)[0] + ".png"
        try:
            plot(rows, png)
            print(f"wrote {png}")
        except ImportError as e:
            print(f"no plot ({e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
