"""The README's forward table, generated from a committed benchmark JSON (``tylopy bench attention``
output), so the figures in the docs are the measured ones.

    python tools/perf_tables.py            # rewrite the table between the README's markers
    python tools/perf_tables.py --check    # exit 1 when the README differs from the data (CI runs this)

SOURCE names the run; TYLOPY_ROW names, per head dim, the row that is tylopy's shipped default in
that run (a run that timed schedule variants labels them ``tylopy[OPTION=value]``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "results/session4-H200-2026-12-01/attention-shared-variant.json"
TYLOPY_ROW = {64: "tylopy[EXPONENT=shared]", 128: "tylopy"}  # D=64 ships the "shared" exponent sequence
COMPETITORS = [("fa3_cute", "FA3-class (flash-attn-4 CuTe)"), ("sdpa_cudnn", "cuDNN"), ("sdpa_flash", "FA2 (SDPA flash)")]
SHOWN_N = (1024, 4096, 16384)
BEGIN, END = "<!-- perf-table: begin (tools/perf_tables.py) -->", "<!-- perf-table: end -->"


def _label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 else str(n)


def table(data: dict) -> str:
    rows = data["rows"]
    at = {(r["name"], r["d"], r["causal"], r["n"]): r["tflops"] for r in rows}
    ns = [n for n in SHOWN_N if any(k[3] == n for k in at)]
    head = "| D | causal | N | tylopy | " + " | ".join(label for _, label in COMPETITORS) + " |"
    lines = [head, "|" + "---|" * (4 + len(COMPETITORS))]
    ratios = {name: [] for name, _ in COMPETITORS}
    for d in sorted(TYLOPY_ROW):
        for causal in (False, True):
            mine = [at.get((TYLOPY_ROW[d], d, causal, n)) for n in ns]
            cells = [" / ".join("-" if v is None else f"{v:.0f}" for v in mine)]
            for name, _ in COMPETITORS:
                theirs = [at.get((name, d, causal, n)) for n in ns]
                cells.append(" / ".join("-" if v is None else f"{v:.0f}" for v in theirs))
            lines.append(f"| {d} | {'yes' if causal else 'no'} | {' / '.join(_label(n) for n in ns)} | "
                         + " | ".join(cells) + " |")
            for name, _ in COMPETITORS:  # every measured N, not only the shown ones
                for (rn, rd, rc, n), v in at.items():
                    if rn == name and rd == d and rc == causal and (TYLOPY_ROW[d], d, causal, n) in at:
                        ratios[name].append(at[(TYLOPY_ROW[d], d, causal, n)] / v)
    summary = []
    for name, label in COMPETITORS[:2]:
        r = ratios[name]
        if r:
            gm = math.exp(sum(map(math.log, r)) / len(r))
            summary.append(f"{gm:.3f}x {label} ({min(r):.2f}-{max(r):.2f})")
    lines.append("")
    lines.append(f"Forward, bf16, 16k tokens, TFLOP/s, one {data.get('device', 'GPU')}, every kernel in the same")
    lines.append(f"process (`{SOURCE}`).")
    lines.append(f"Over {len(ratios[COMPETITORS[0][0]])} shapes tylopy is at " + " and ".join(summary) + ".")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail when the README is not what the data gives")
    args = ap.parse_args(argv)
    with open(os.path.join(ROOT, SOURCE)) as f:
        generated = table(json.load(f))
    path = os.path.join(ROOT, "README.md")
    with open(path) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        print(f"README.md has no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    new = f"{before}{BEGIN}\n{generated}\n{END}{after}"
    if args.check:
        if new != text:
            print("README.md's performance table differs from the data: run python tools/perf_tables.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(path, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
