"""The README's performance tables, generated from committed benchmark JSON, so the figures in the
docs are the measured ones: the dense forward (``tylopy bench attention``) and the attention
variants' ratios (``tylopy bench attention_variants``).

    python tools/perf_tables.py            # rewrite the tables between the README's markers
    python tools/perf_tables.py --check    # exit 1 when the README differs from the data (CI runs this)

SOURCE and VARIANTS_SOURCE name the runs; TYLOPY_ROW names, per head dim, the row that is tylopy's
shipped default in the forward run (a run that timed schedule variants labels them
``tylopy[OPTION=value]``).
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
VARIANTS_SOURCE = "results/H200-2026-12-03-f/attention-variants.json"
VARIANTS_BEGIN, VARIANTS_END = "<!-- variants-table: begin (tools/perf_tables.py) -->", "<!-- variants-table: end -->"


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


def variants_table(data: dict) -> str:
    """Per variant and (D, direction): tylopy / FA3-class and tylopy / flex, geometric means over
    the run's N, with the count of points below 1 (the bench's own ``summaries``; every point is
    in the JSON's ``markdown``)."""
    from tylopy_kernels.attention.bench.variants import summaries
    per_group = summaries(data["ratios"])
    order = list(dict.fromkeys(variant for variant, _, _ in per_group))
    cols = sorted({(d, direction) for _, d, direction in per_group}, key=lambda c: (c[0], c[1] != "fwd"))
    lines = ["| variant | " + " | ".join(f"D={d} {direction}" for d, direction in cols) + " |",
             "|---|" + "---|" * len(cols)]

    def cell(per_lib):
        parts = []
        for lib in ("fa3_cute", "flex"):
            got = (per_lib or {}).get(lib)
            parts.append("-" if got is None else f"{got[0]:.2f}" + (f" ({got[1]}/{got[2]} < 1)" if got[1] else ""))
        return " / ".join(parts)
    for variant in order:
        lines.append(f"| {variant} | " + " | ".join(cell(per_group.get((variant, d, direction)))
                                                   for d, direction in cols) + " |")
    ns = sorted({e["n"] for e in data["ratios"]})
    lines += ["", "Each cell: tylopy / FA3-class (flash-attn-4 CuTe), then tylopy / `torch.compile(flex_attention)`;",
              f"geometric means over N = {', '.join(str(n) for n in ns)} at 16k tokens (in brackets: the points",
              "below 1), bf16 TFLOP/s of the visible work, every library in the same process",
              f"(`{VARIANTS_SOURCE}`)."]
    return "\n".join(lines)


def _replace(text: str, begin: str, end: str, generated: str):
    if begin not in text or end not in text:
        return None
    before, rest = text.split(begin, 1)
    _, after = rest.split(end, 1)
    return f"{before}{begin}\n{generated}\n{end}{after}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail when the README is not what the data gives")
    args = ap.parse_args(argv)
    path = os.path.join(ROOT, "README.md")
    with open(path) as f:
        text = f.read()
    new = text
    for source, make, begin, end in ((SOURCE, table, BEGIN, END),
                                     (VARIANTS_SOURCE, variants_table, VARIANTS_BEGIN, VARIANTS_END)):
        with open(os.path.join(ROOT, source)) as f:
            new = _replace(new, begin, end, make(json.load(f)))
        if new is None:
            print(f"README.md has no {begin} ... {end} block", file=sys.stderr)
            return 1
    if args.check:
        if new != text:
            print("README.md's performance tables differ from the data: run python tools/perf_tables.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(path, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
