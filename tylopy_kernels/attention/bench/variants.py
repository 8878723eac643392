"""``tylopy bench attention_variants``: tylopy's attention variants beside the FA3-class kernel
(flash-attn-4's CuTe DSL interface, ``flash_attn.cute``, where it imports and has the variant)
and ``torch.compile(flex_attention)``, forward and backward, all in one process.

Variants (``variant_cases.VARIANTS``): causal, sliding window (causal, 1024 keys back),
document-causal (packed tokens, as varlen and as a mask_mod over B=1 with document ids), softcap
30, ALiBi, a random 128 x 128 block-sparse mask (a mask_mod reading a block table) and sinks.
Shapes: batch x N = 16k tokens, N from 1k to 16k (for the document variants N is the mean
document length), D = 64 with 32 heads and D = 128 with 16 heads, bf16.

Each (library, variant, D) is first checked against an fp32 torch reference at the smallest N
of the run (the smallest above 1024 for the window, where it differs from causal), on the first
batch element: forward output and, with the backward, dq, dk, dv; the largest absolute error is
printed. The check is at a timed shape, so it is also the first call that compiles, JITs or plans
(torch.compile specializes per shape: a separate check size would cost a compile per variant).
Then each point is timed: a first call, then the CUDA-event median after warm-up. TFLOP/s count
only the visible work: 4 D FLOPs per visible (query, key) pair per head forward, 2.5 times that
backward, with the pairs counted exactly (causal n(n+1)/2, not n^2/2). The backward is timed
alone (autograd.grad on a kept graph).

    tylopy bench attention_variants --quick                        # D=128, N=4096: a few minutes
    tylopy bench attention_variants --d 64 --output results/variants-d64.json
    tylopy bench attention_variants --merge results/variants-d64.json results/variants-d128.json \\
        --output results/variants.json                            # one table, JSON and PNG from both

After each (variant, D) the rows so far are written to ``<output>.partial.json``: a run stopped by a
time limit keeps what it timed, and ``--merge`` takes that file like any other.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from tylopy_kernels.attention.bench import variant_cases as cases
from tylopy_kernels.attention.bench import variant_libs as libs

WARMUP_MS, REP_MS = 20, 80
# The largest absolute error against the fp32 reference that passes the check (unit-normal bf16
# inputs: a correct kernel lands near 1e-2, an error in the masks or the gradients far above).
CHECK_LIMIT = {"fwd": 0.05, "bwd": 0.1}
REFERENCE_CHUNK = 2 ** 28  # fp32 score elements per chunk of heads in the reference (1 GiB)
QUICK = {"d": (128,), "n": (4096,)}
DIRECTIONS = {"fwd": ("fwd",), "bwd": ("bwd",), "both": ("fwd", "bwd")}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="tylopy bench attention_variants", description=__doc__.split("\n\n")[0])
    ap.add_argument("--direction", choices=tuple(DIRECTIONS), default="both", help="forward, backward or both")
    ap.add_argument("--variants", nargs="+", choices=tuple(cases.VARIANTS), default=list(cases.VARIANTS),
                    metavar="VARIANT", help="variants to run: " + ", ".join(cases.VARIANTS))
    ap.add_argument("--libs", nargs="+", choices=libs.LIBRARIES, default=list(libs.LIBRARIES),
                    help="libraries to run (tylopy is always timed: the ratios need it)")
    ap.add_argument("--d", type=int, nargs="+", choices=cases.DIMS, default=None, help="head dims (64, 128)")
    ap.add_argument("--n", type=int, nargs="+", default=None, help="sequence lengths (default 1k..16k)")
    ap.add_argument("--quick", action="store_true", help=f"a small subset: D={QUICK['d']}, N={QUICK['n']}")
    ap.add_argument("--no-check", action="store_true", help="skip the numerics check")
    ap.add_argument("--output", help="JSON path (default results/attention_variants-<device>-<date>.json)")
    ap.add_argument("--plot", help="PNG path (default: the JSON path with .png)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="no timing: merge the rows of earlier runs' JSON files into one table, JSON and PNG")
    ap.add_argument("--warmup-ms", type=float, default=WARMUP_MS)
    ap.add_argument("--rep-ms", type=float, default=REP_MS)
    args = ap.parse_args(argv)
    if args.d is None:
        args.d = list(QUICK["d"] if args.quick else cases.DIMS)
    if args.n is None:
        args.n = list(QUICK["n"] if args.quick else cases.NS)
    bad = [n for n in args.n if n <= 0 or cases.TOKENS % n]
    if bad:
        ap.error(f"--n expects lengths that divide {cases.TOKENS} tokens, but got {bad}")
    if "tylopy" not in args.libs:
        args.libs = ["tylopy"] + list(args.libs)
    return args


def _error(e):
    return f"{type(e).__name__}: {e}"[:300]


# -- the numerics check ---------------------------------------------------------------------------

def check_n(variant, ns):
    """The N a variant is checked at: the smallest of the run, for the window the smallest longer
    than the window (at N <= 1024 it is plain causal attention)."""
    longer = [n for n in ns if n > cases.WINDOW + 1]
    return min(longer) if variant == "sliding_window" and longer else min(ns)


def reference_grads(spec, x, backward=True, chunk=REFERENCE_CHUNK):
    """(out, dq, dk, dv) of the fp32 reference on the first batch element, (1, heads, seq, D)
    each, computed a chunk of heads at a time (dq, dk, dv None without ``backward``)."""
    import torch
    step = max(1, chunk // (spec.seq * spec.seq))
    parts = []
    for h0 in range(0, spec.heads, step):
        heads = slice(h0, min(spec.heads, h0 + step))
        leaves = [x[name][:1, heads].float().requires_grad_(backward) for name in ("q", "k", "v")]
        with torch.set_grad_enabled(backward):
            out = cases.reference(spec, x, *leaves, heads=heads)
            grads = torch.autograd.grad(out, leaves, x["dout"][:1, heads].float()) if backward else (None,) * 3
        parts.append((out.detach(), *grads))
    return tuple(None if p[0] is None else torch.cat(p, 1) for p in zip(*parts))


def check_one(library, spec, x, ref, directions):
    """{"fwd_err": ..., "bwd_err": ...} of one library against the reference (out, dq, dk, dv);
    "fwd_error" / "bwd_error" hold what a direction's call raised, "error" what building the call
    raised, "unavailable" why the library is not there."""
    import torch
    try:
        run = libs.build(library, spec, x)
    except libs.Unavailable as e:
        return {"unavailable": str(e)}
    except Exception as e:  # noqa: BLE001 - reported per row, never fatal
        return {"error": _error(e)}
    got = {}
    for direction in directions:
        try:
            if direction == "fwd":
                with torch.no_grad():
                    out = run.to_common(run.forward())
                got["fwd_err"] = (out[:1].float() - ref[0]).abs().max().item()
            else:
                grads = [run.to_common(g) for g in run.backward_fn()()]
                parts = {name: _worst(g[:1].float() - r) for name, g, r in zip(("dq", "dk", "dv"), grads, ref[1:])}
                errs = [err for err, _ in parts.values()]
                got["bwd_err"] = float("nan") if any(e != e for e in errs) else max(errs)  # NaN is a failure
                got["bwd_worst"] = {name: dict(err=err, at=at) for name, (err, at) in parts.items()}
        except Exception as e:  # noqa: BLE001 - one direction may run where the other does not
            got[f"{direction}_error"] = _error(e)
    return got


def _worst(diff):
    """(largest |diff|, its (batch, head, row, column)): where a failing check is wrong."""
    import torch
    flat = diff.abs().flatten()
    i = flat.nan_to_num(float("inf")).argmax()   # a NaN counts as the worst
    return flat[i].item(), tuple(int(x) for x in torch.unravel_index(i, diff.shape))


def check(spec, x, library_names, directions):
    """One record per library: the largest absolute errors against fp32 on the first batch element."""
    ref = reference_grads(spec, x, backward="bwd" in directions)
    records = []
    for library in library_names:
        rec = dict(library=library, variant=spec.variant, d=spec.d, n=spec.n,
                   **check_one(library, spec, x, ref, directions))
        records.append(rec)
        print(format_check(rec), flush=True)
    return records


def failed_checks(rec) -> list:
    """The directions whose error is past ``CHECK_LIMIT`` in one check record."""
    return [d for d in ("fwd", "bwd") if rec.get(f"{d}_err", 0.0) > CHECK_LIMIT[d] or
            rec.get(f"{d}_err") != rec.get(f"{d}_err")]  # (NaN fails too)


def format_check(rec):
    failed = failed_checks(rec)
    line = (f"| check: {rec['library']} | {rec['variant']} | {rec['d']} | {rec.get('n', '-')} "
            f"| fwd err {_cell(rec, 'fwd')} | bwd err {_cell(rec, 'bwd')} |")
    if failed:
        line += f" CHECK FAILED ({', '.join(failed)}: past {', '.join(str(CHECK_LIMIT[d]) for d in failed)})"
        if "bwd" in failed and rec.get("bwd_worst"):  # which gradient, at (batch, head, row, column)
            line += " " + ", ".join(f"{name} {w['err']:.2e} at {tuple(w['at'])}" for name, w in rec["bwd_worst"].items())
    return line


def _cell(rec, direction):
    if f"{direction}_err" in rec:
        return f"{rec[f'{direction}_err']:.2e}"
    if "unavailable" in rec:
        return "unavailable"
    why = rec.get(f"{direction}_error") or rec.get("error")
    return f"not supported ({why[:100]})" if why else "-"


# -- timing ---------------------------------------------------------------------------------------

def _timer(warmup_ms=WARMUP_MS, rep_ms=REP_MS):
    from tylopy.benchmarking import median_ms
    return lambda fn: median_ms(fn, warmup_ms, rep_ms)


def base_row(library, spec, direction):
    return {"library": library, "variant": spec.variant, "d": spec.d, "n": spec.n, "direction": direction,
            "batch": spec.batch, "heads": spec.heads, "seq": spec.seq, "pairs": cases.visible_pairs(spec),
            "flops": cases.flops(spec, direction)}


def measure(library, spec, x, directions, bench, synchronize=None):
    """Rows (one per direction) of one library on one shape: ms and TFLOP/s, or why not.
    A call that raises gives "error" (shown as "not supported (<error>)"), never an exception."""
    import torch
    sync = synchronize or torch.cuda.synchronize
    rows = [base_row(library, spec, direction) for direction in directions]
    try:
        run = libs.build(library, spec, x)
    except libs.Unavailable as e:
        return [dict(r, unavailable=str(e)) for r in rows]
    except Exception as e:  # noqa: BLE001
        return [dict(r, error=_error(e)) for r in rows]
    for row in rows:
        if run.note:
            row["note"] = run.note
        try:
            if row["direction"] == "fwd":
                def call():
                    with torch.no_grad():
                        return run.forward()
            else:
                call = run.backward_fn()
            call()  # compiles / JITs / plans outside the timing
            sync()
            row["ms"] = bench(call)
            row["tflops"] = row["flops"] / row["ms"] / 1e9
        except Exception as e:  # noqa: BLE001
            row["error"] = _error(e)
        finally:
            call = None
    return rows


def time_all(variants, dims, ns, library_names, directions, bench, checked=True, progress=None):
    """(rows, checks): every point timed, each (variant, D) checked first at its ``check_n``;
    ``progress(rows, checks)`` is called after each (variant, D), with what is done so far."""
    import torch
    rows, checks = [], []
    print("\n| library | variant | D | N | dir | ms | TFLOP/s |\n|---|---|---|---|---|---|---|", flush=True)
    for variant in variants:
        for d in dims:
            for n in sorted(ns, key=lambda n: n != check_n(variant, ns)):  # the checked N first
                spec = cases.make_spec(variant, d, n)
                x = cases.make_inputs(spec, "cuda")
                if checked and n == check_n(variant, ns):
                    checks += check(spec, x, library_names, directions)
                    torch.cuda.empty_cache()
                for library in library_names:
                    for row in measure(library, spec, x, directions, bench):
                        rows.append(row)
                        print(format_row(row), flush=True)
                    torch.cuda.empty_cache()
                del x
                torch.cuda.empty_cache()
            if progress is not None:
                progress(rows, checks)
    return rows, checks


def format_row(r):
    tag = f"| {r['library']} | {r['variant']} | {r['d']} | {r['n']} | {r['direction']} |"
    if "tflops" in r:
        return f"{tag} {r['ms']:.3f} | {r['tflops']:.0f} |"
    if "unavailable" in r:
        return f"{tag} - | unavailable ({r['unavailable'][:80]}) |"
    return f"{tag} - | {r['library']}: not supported ({r.get('error', '?')[:100]}) |"


# -- ratios, the table, JSON, the plot ------------------------------------------------------------

def _key(r):
    return (r["variant"], r["d"], r["n"], r["direction"])


def with_ratios(rows):
    """Each row with ``ratio_vs_tylopy``: its TFLOP/s over tylopy's on the same point (None where
    either did not run). The work counted is the same, so it is also tylopy's ms over the row's."""
    ours = {_key(r): r.get("tflops") for r in rows if r["library"] == "tylopy"}
    out = []
    for r in rows:
        t, o = ours.get(_key(r)), r.get("tflops")
        out.append(dict(r, ratio_vs_tylopy=round(o / t, 4) if t and o else None))
    return out


def ratio_table(rows):
    """Per point: TFLOP/s of each library and tylopy / FA3-class, tylopy / flex (> 1: tylopy faster)."""
    points = {}
    for r in rows:
        points.setdefault(_key(r), {})[r["library"]] = r
    order = {v: i for i, v in enumerate(cases.VARIANTS)}
    table = []
    for key in sorted(points, key=lambda k: (order.get(k[0], 99), k[1], k[3] != "fwd", k[2])):
        cell = points[key]
        t = cell.get("tylopy", {}).get("tflops")
        entry = dict(zip(("variant", "d", "n", "direction"), key))
        for lib in libs.LIBRARIES:
            entry[lib] = cell[lib].get("tflops") if lib in cell else None
            entry[f"{lib}_why"] = _why(cell.get(lib))
            entry[f"{lib}_check_failed"] = bool(cell.get(lib, {}).get("check_failed"))
        for lib in ("fa3_cute", "flex"):
            o = entry[lib]
            entry[f"tylopy_vs_{lib}"] = round(t / o, 3) if t and o else None
        table.append(entry)
    return table


def _why(row):
    if row is None:
        return "not run"
    if "tflops" in row:
        return ""
    if "unavailable" in row:
        return "unavailable"
    return "not supported"


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def markdown(table):
    """The ratio table as markdown lines, then the geometric means per variant and direction;
    every point is listed, the losses (ratio < 1) included and counted."""
    lines = ["| variant | D | N | dir | tylopy | FA3-class | flex | tylopy / FA3-class | tylopy / flex |",
             "|---|---|---|---|---|---|---|---|---|"]

    def num(e, lib):
        if not e[lib]:
            return e[f"{lib}_why"] or "-"
        return f"{e[lib]:.0f}" + (" (check failed)" if e.get(f"{lib}_check_failed") else "")

    def ratio(v):
        return "-" if v is None else f"{v:.2f}" + (" (loss)" if v < 1 else "")
    for e in table:
        lines.append(f"| {e['variant']} | {e['d']} | {e['n']} | {e['direction']} | {num(e, 'tylopy')} | "
                     f"{num(e, 'fa3_cute')} | {num(e, 'flex')} | {ratio(e['tylopy_vs_fa3_cute'])} | "
                     f"{ratio(e['tylopy_vs_flex'])} |")
    lines += ["", "| variant | D | dir | tylopy / FA3-class (geomean, losses) | tylopy / flex (geomean, losses) |",
              "|---|---|---|---|---|"]
    for (variant, d, direction), per_lib in summaries(table).items():
        cells = ["-" if per_lib[lib] is None else "{:.2f} ({} of {} below 1)".format(*per_lib[lib])
                 for lib in ("fa3_cute", "flex")]
        lines.append(f"| {variant} | {d} | {direction} | {cells[0]} | {cells[1]} |")
    return lines


def summaries(table):
    """Per (variant, D, direction), in the table's order: for the FA3-class kernel and flex, the
    geometric mean of tylopy / library over the points both ran, how many of them are below 1 and
    how many there are; None where no point ran."""
    groups = {}
    for e in table:
        groups.setdefault((e["variant"], e["d"], e["direction"]), []).append(e)
    out = {}
    for key, entries in groups.items():
        out[key] = {}
        for lib in ("fa3_cute", "flex"):
            vals = [e[f"tylopy_vs_{lib}"] for e in entries if e.get(f"tylopy_vs_{lib}")]
            out[key][lib] = (geomean(vals), sum(v < 1 for v in vals), len(vals)) if vals else None
    return out


def write_json(path, record):
    """Write ``record`` as JSON (creating the folder); returns the path."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    return path


def plot(rows, path):
    """TFLOP/s against N: one panel per (variant, direction x D), one line per library."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    variants = [v for v in cases.VARIANTS if any(r["variant"] == v for r in rows)]
    cols = sorted({(r["direction"], r["d"]) for r in rows}, key=lambda c: (c[0] != "fwd", c[1]))
    fig, axes = plt.subplots(len(variants), len(cols), figsize=(4 * len(cols), 2.8 * len(variants)),
                             squeeze=False, sharex=True)
    for i, variant in enumerate(variants):
        for j, (direction, d) in enumerate(cols):
            ax = axes[i][j]
            for lib in libs.LIBRARIES:
                pts = sorted((r["n"], r["tflops"]) for r in rows if r["library"] == lib and r["variant"] == variant
                             and r["direction"] == direction and r["d"] == d and "tflops" in r)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=lib)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{variant}, {direction}, D={d}", fontsize=9)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("TFLOP/s (visible pairs)")
    axes[0][0].legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("N")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(rows, checks, output, plot_path, extra=None, cuda=True):
    """Ratios, the markdown table (printed and stored), JSON and PNG; returns the JSON path."""
    rows = with_checks(with_ratios(rows), checks)
    table = ratio_table(rows)
    lines = markdown(table)
    failed = [c for c in checks if failed_checks(c)]
    if checks:
        print("\nnumerics (max |x - fp32 reference| on the first batch element; bwd: max over dq, dk, dv):")
        print("\n".join(format_check(c) for c in checks))
    if failed:
        lines += ["", "Numerics checks that FAILED (their timings are not results):"] + [format_check(c) for c in failed]
    print("\n" + "\n".join(lines))
    unsupported = sorted({(r["library"], r["variant"], r.get("error", "")[:120]) for r in rows if "error" in r})
    for lib, variant, err in unsupported:
        print(f"{lib}: not supported on {variant} ({err})")
    record = dict(extra or {}, rows=rows, checks=checks, ratios=table, markdown=lines)
    if cuda:
        from tylopy.benchmarking import write_results
        path = write_results("attention_variants", record, output)
    else:
        path = write_json(output or "results/attention_variants.json", record)
        print(f"wrote {path}")
    png = plot_path or os.path.splitext(path)[0] + ".png"
    try:
        plot(rows, png)
        print(f"wrote {png}")
    except ImportError as e:
        print(f"no plot ({e})")
    return path


def with_checks(rows, checks):
    """Each row with ``check_failed`` (True / False) where its library, variant and D were checked."""
    verdict = {}
    for c in checks:
        key = (c["library"], c["variant"], c["d"])
        verdict[key] = verdict.get(key, False) or bool(failed_checks(c))
    return [dict(r, check_failed=verdict[(r["library"], r["variant"], r["d"])])
            if (r["library"], r["variant"], r["d"]) in verdict else r for r in rows]


def merge(paths):
    """Rows and checks of earlier runs, the later file winning where two timed the same point."""
    rows, checks = {}, {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for r in data.get("rows", []):
            rows[(r["library"], *_key(r))] = {k: v for k, v in r.items() if k != "ratio_vs_tylopy"}
        for c in data.get("checks", []):
            checks[(c["library"], c["variant"], c["d"])] = c
    return list(rows.values()), list(checks.values())


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        rows, checks = merge(args.merge)
        report(rows, checks, args.output, args.plot, {"merged_from": args.merge}, cuda=False)
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench attention_variants needs a CUDA GPU (or --merge to combine earlier results)", file=sys.stderr)
        return 2
    directions = DIRECTIONS[args.direction]
    fa_why = libs.fa3_import()[1]
    if "fa3_cute" in args.libs and fa_why:
        print(f"FA3-class kernel skipped: flash_attn.cute does not import ({fa_why})")
    # A run cut short (a time limit) keeps what it timed: --merge reads the partial file.
    partial = os.path.splitext(args.output or "results/attention_variants")[0] + ".partial.json"
    rows, checks = time_all(args.variants, args.d, args.n, args.libs, directions, _timer(args.warmup_ms, args.rep_ms),
                            checked=not args.no_check,
                            progress=lambda rows, checks: write_json(partial, dict(rows=rows, checks=checks)))
    extra = {"fa3_cute": fa_why or "available", "direction": args.direction,
             "timing": {"warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "statistic": "median of CUDA-event times"},
             "variants": {v: cases.VARIANTS[v] for v in args.variants},
             "flops": "4 D per visible (query, key) pair per head forward, 2.5x backward; pairs counted exactly"}
    report(rows, checks, args.output, args.plot, extra)
    return 1 if any(failed_checks(c) for c in checks if c["library"] == "tylopy") else 0


if __name__ == "__main__":
    sys.exit(main())
