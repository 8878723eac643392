"""Benchmark the three softmax kernels against torch.softmax and a device-to-device copy.

For each row width (1k to 64k columns) it makes a float32 input of about ``--mbytes`` MiB
(torch.randn * 3), checks every kernel's output against torch.softmax in float64 (output
poisoned with NaN first, so an unwritten element fails), then times each with CUDA events:
``--warmup`` untimed runs, then ``--iters`` runs each between its own pair of events; the
median is reported. In the same run it times ``y.copy_(x)`` at the same size.

Reported per kernel and width: time, useful GB/s (input read once + output written once),
traffic GB/s (bytes the kernel asks for: streaming reads the input twice, three-pass three
times; re-reads of narrow rows may be served by L2), and useful GB/s as a fraction of the copy's
(read + write) GB/s. The full-row kernel runs up to its column limit (``MAX_FULL_ROW_COLS``,
32768: one warp a row up to 4096 columns, then 4, 8 or 16 warps a row); its records carry the
``warps_per_row`` it used. At 65536 it is skipped: a float32 row that wide does not fit in
registers.

    tylopy bench softmax [--output results/softmax.json] [--widths 1024,65536]

Writes JSON (device, git commit, settings, every measurement) to ``--output`` (default
results/softmax-<device>-<date>.json) and prints a markdown table. Exit status 1 if any output
check failed, 2 without a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_WIDTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
RTOL, ATOL = 1e-4, 1e-9  # against float64 torch.softmax, as in tests/test_softmax_kernels.py


def time_ms(fn, warmup: int, iters: int) -> float:
    """Median milliseconds of ``fn()`` on the current stream, one event pair per run."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def check(result, ref) -> tuple[bool, float]:
    """(every element within tolerance, max abs error); NaN (an unwritten element) fails."""
    err = (result.double() - ref).abs()
    ok = bool((err <= ATOL + RTOL * ref.abs()).all())
    return ok, float(err.max())


def variants():
    """(name, run(x, out) -> result, bytes moved per input byte or None, max cols or None,
    config(cols) -> dict of the launcher's choices to record)."""
    import torch
    from tylopy_kernels.softmax import streaming as ss

    def none(cols):
        return {}

    return [
        ("torch.softmax", lambda x, out: torch.softmax(x, dim=1), None, None, none),
        ("streaming", lambda x, out: ss.softmax_streaming(x, out=out), 3, None, none),
        ("full_row", lambda x, out: ss.softmax_full_row(x, out=out), 2, ss.MAX_FULL_ROW_COLS,
         lambda cols: {"warps_per_row": ss.full_row_warps(cols)}),
        ("three_pass", lambda x, out: ss.softmax_three_pass(x, out=out), 4, None, none),
    ]


def bench_width(cols: int, mbytes: int, warmup: int, iters: int) -> tuple[dict, list[dict]]:
    import torch
    rows = max(4, (mbytes << 20) // (4 * cols))
    torch.manual_seed(0)
    x = torch.randn(rows, cols, device="cuda") * 3
    out = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    copy_ms = time_ms(lambda: out.copy_(x), warmup, iters)
    copy = {"cols": cols, "rows": rows, "ms": copy_ms, "gbps": 2 * nbytes / copy_ms / 1e6}
    ref = torch.softmax(x.double(), dim=1)
    results = []
    for name, run, traffic, max_cols, config in variants():
        rec = {"kernel": name, "cols": cols, "rows": rows, "bytes_in": nbytes}
        if max_cols is not None and cols > max_cols:
            results.append({**rec, "status": f"skipped: cols > {max_cols}"})
            continue
        rec.update(config(cols))
        out.fill_(float("nan"))
        t0 = time.perf_counter()
        res = run(x, out)  # first call compiles
        torch.cuda.synchronize()
        rec["first_call_s"] = time.perf_counter() - t0
        ok, err = check(res, ref)
        rec["check"] = {"ok": ok, "max_abs_err": err, "rtol": RTOL, "atol": ATOL}
        del res
        if not ok:
            results.append({**rec, "status": "FAILED check"})
            continue
        ms = time_ms(lambda: run(x, out), warmup, iters)
        useful = 2 * nbytes / ms / 1e6
        results.append({**rec, "status": "ok", "ms": ms, "useful_gbps": useful,
                        "traffic_gbps": traffic * nbytes / ms / 1e6 if traffic else None,
                        "fraction_of_copy": useful / copy["gbps"]})
    del x, out, ref
    torch.cuda.empty_cache()
    return copy, results


def git_commit() -> tuple[str | None, bool | None]:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None, None
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return head.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def markdown(copies: list[dict], results: list[dict]) -> str:
    copy_by_cols = {c["cols"]: c for c in copies}
    lines = ["| cols | rows | kernel | time (us) | useful GB/s | traffic GB/s | of copy | max abs err |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for cols in sorted(copy_by_cols):
        c = copy_by_cols[cols]
        lines.append(f"| {cols} | {c['rows']} | copy (read+write) | {c['ms'] * 1e3:.1f} | {c['gbps']:.0f} | "
                     f"{c['gbps']:.0f} | 100% | |")
        for r in (r for r in results if r["cols"] == cols):
            err = f"{r['check']['max_abs_err']:.1e}" if "check" in r else ""
            if r["status"] != "ok":
                lines.append(f"| {cols} | {r['rows']} | {r['kernel']} | {r['status']} | | | | {err} |")
                continue
            traffic = f"{r['traffic_gbps']:.0f}" if r["traffic_gbps"] else "-"
            kernel = f"{r['kernel']} ({r['warps_per_row']} warps/row)" if "warps_per_row" in r else r["kernel"]
            lines.append(f"| {cols} | {r['rows']} | {kernel} | {r['ms'] * 1e3:.1f} | {r['useful_gbps']:.0f} | "
                         f"{traffic} | {100 * r['fraction_of_copy']:.0f}% | {err} |")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench_softmax", description=__doc__.split("\n\n")[0])
    p.add_argument("--output", help="JSON path (default results/softmax-<device>-<date>.json)")
    p.add_argument("--widths", default=",".join(map(str, DEFAULT_WIDTHS)), help="comma-separated row widths")
    p.add_argument("--mbytes", type=int, default=512, help="input size per width in MiB (default 512)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=40)
    args = p.parse_args(argv)
    try:
        args.widths = [int(w) for w in args.widths.split(",") if w.strip()]
    except ValueError:
        p.error(f"--widths expects comma-separated integers, but got {args.widths!r}")
    if not args.widths or min(args.widths) < 1:
        p.error(f"--widths expects positive integers, but got {args.widths}")
    if args.mbytes < 1 or args.warmup < 0 or args.iters < 1:
        p.error("--mbytes and --iters expect positive integers, --warmup a non-negative one")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_softmax: needs a CUDA GPU, but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    started = time.perf_counter()
    copies, results = [], []
    for cols in args.widths:
        copy, res = bench_width(cols, args.mbytes, args.warmup, args.iters)
        copies.append(copy)
        results += res
    commit, dirty = git_commit()
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    output = args.output or os.path.join(ROOT, "results", f"softmax-{slug}-{datetime.date.today():%Y%m%d}.json")
    report = {
        "benchmark": "softmax", "device": device, "git_commit": commit, "git_dirty": dirty,
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__,
        "settings": {"widths": args.widths, "mbytes": args.mbytes, "warmup": args.warmup, "iters": args.iters,
                     "dtype": "float32", "input": "torch.randn * 3", "timer": "median of per-run CUDA event pairs"},
        "copy": copies, "results": results, "seconds": time.perf_counter() - started,
    }
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump(report, f, indent=2)
    print(f"softmax benchmark on {device} (commit {commit or 'unknown'}{' + local changes' if dirty else ''})")
    print(markdown(copies, results))
    print(f"\nwrote {output} ({report['seconds']:.0f} s)")
    failed = [f"{r['kernel']} cols={r['cols']}" for r in results if r["status"] == "FAILED check"]
    if failed:
        print("FAILED checks: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
