"""An instruction-level account of attention kernels from Nsight Compute's source page: per key tile
of the consumer loop, the executed instructions by class and the warp-stall samples by reason, for
tylopy's kernel and the FA3-class kernel side by side.

Profile each kernel once (same shape, same process settings), keeping the per-instruction CSV:

    ncu --set full --import-source no --page source --print-source sass --csv \\
        -k regex:attention_fwd_sm90 --launch-skip 3 --launch-count 1 \\
        tylopy bench attention --once --d 64 --n 16384 > tylopy.csv
    ncu ... -k regex:flash --launch-skip 3 --launch-count 1 \\
        tylopy bench attention --once --only fa3_cute --d 64 --n 16384 > fa3.csv
    python -m tylopy_kernels.attention.bench.account tylopy.csv fa3.csv

The loop is found in each listing as the innermost backward branch whose range holds ``MUFU.EX2``
and ``HGMMA`` (as ``sass_profile.py`` does on a cubin); "per tile" divides the loop's executed
instructions by the executions of its first instruction (warp-level counts, so: per warp and key
tile, averaged over the paths the data took). Stall reasons are shares of the loop's warp-state
samples. The executed instructions from the wait for S (the loop's first ``WARPGROUP.DEPBAR``) to
the next PV issue (the next register-A ``HGMMA``, around the loop) are the chain from S to PV; the
longest run of back-to-back ``MUFU.EX2`` and their mean spacing say how the exponentials are
interleaved with the other work.
"""
from __future__ import annotations

import argparse
import collections
import csv
import io
import re
import sys

from tylopy_kernels.attention.bench.sass_profile import classify

CLASSES = ("HGMMA", "MUFU", "fp32", "FMNMX", "F2FP", "SHFL", "sync", "branch", "int/other")
_OPCODE = re.compile(r"^\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_TARGET = re.compile(r"(0x[0-9a-f]+)\s*;?\s*$|`\((\.L_x_\d+)\)")


class Listing:
    """One kernel's SASS rows: address, opcode, branch target address, executed count, stall samples."""

    def __init__(self, rows: list[dict], stall_columns: list[str]):
        self.rows, self.stall_columns = rows, stall_columns


def _number(text: str) -> float:
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def parse(text: str) -> Listing:
    """The source-page CSV of one kernel (ncu's preamble lines before the header are skipped)."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if "Source" in l and "Address" in l), None)
    if start is None:
        raise ValueError("no source-page header (a row naming 'Address' and 'Source') in this CSV")
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    fields = reader.fieldnames or []
    executed = next((f for f in fields if f.strip().lower() == "instructions executed"), None)
    if executed is None:
        raise ValueError(f"no 'Instructions Executed' column among {fields}")
    stalls = [f for f in fields if "stall" in f.lower() and "sampling" not in f.lower()]
    total = next((f for f in fields if f.lower().startswith("warp stall sampling (all")), None)
    rows = []
    for r in reader:
        addr_text = (r.get("Address") or r.get("# Address") or "").strip()
        source = r.get("Source") or ""
        m = _OPCODE.match(source)
        if not addr_text or not m:
            continue
        t = re.search(r"(0x[0-9a-f]+)\s*;?\s*$", source) if m.group(2).startswith("BRA") else None
        rows.append({"address": int(addr_text, 16), "opcode": m.group(2), "source": source.strip(),
                     "target": int(t.group(1), 16) if t else None, "executed": _number(r[executed]),
                     "samples": _number(r[total]) if total else 0.0,
                     "stalls": {s: _number(r[s]) for s in stalls}})
    return Listing(rows, stalls)


def main_loop(listing: Listing) -> tuple[int, int]:
    """(first, last) row index of the innermost loop holding MUFU.EX2 and HGMMA."""
    rows = listing.rows
    index = {r["address"]: i for i, r in enumerate(rows)}
    loops = [(index[r["target"]], i) for i, r in enumerate(rows)
             if r["target"] is not None and r["target"] in index and index[r["target"]] <= i]
    ok = [(lo, hi) for lo, hi in loops
          if any(rows[k]["opcode"].startswith("MUFU.EX2") for k in range(lo, hi + 1))
          and any(rows[k]["opcode"].startswith("HGMMA") for k in range(lo, hi + 1))]
    if not ok:
        raise ValueError("no loop with MUFU.EX2 and HGMMA in this listing")
    return min(ok, key=lambda lh: lh[1] - lh[0])


def chain_after_s(rows, lo: int, hi: int) -> int:
    """Executed instructions from the loop's first warpgroup wait (S_j ready) to the next PV issue
    (the first HGMMA whose A operand is a register, ``HGMMA ... Rd, Ra, gdesc``), around the loop."""
    loop = rows[lo:hi + 1]
    wait = next((i for i, r in enumerate(loop) if r["opcode"].startswith("WARPGROUP.DEPBAR")), None)
    if wait is None:
        return 0
    n = len(loop)
    count = 0
    for step in range(1, n + 1):
        r = loop[(wait + step) % n]
        if r["opcode"].startswith("HGMMA") and re.search(r"HGMMA\S*\s+R\d+,\s*R\d+", r["source"]):
            return count
        count += r["executed"] > 0
    return 0


def mufu_runs(rows) -> tuple[int, float]:
    """(longest run of back-to-back MUFU.EX2, mean executed instructions between two of them) in the
    loop's listing order: how the exponentials are interleaved with the other work."""
    live = [r for r in rows if r["executed"] > 0]
    where = [i for i, r in enumerate(live) if r["opcode"].startswith("MUFU.EX2")]
    longest = run = 0
    for a, b in zip([-2] + where, where):
        run = run + 1 if b == a + 1 else 1
        longest = max(longest, run)
    gaps = [b - a - 1 for a, b in zip(where, where[1:])]
    return longest, (sum(gaps) / len(gaps) if gaps else 0.0)


def account(listing: Listing) -> dict:
    """Per key tile (per warp): instructions by class, the S-to-PV chain, how the exponentials are
    spread, and each stall reason's share of the loop's warp-state samples (%)."""
    lo, hi = main_loop(listing)
    rows = listing.rows[lo:hi + 1]
    iterations = max(rows[0]["executed"], 1.0)
    by_class = collections.Counter()
    stalls = collections.Counter()
    for r in rows:
        by_class[classify(r["opcode"])] += r["executed"]
        for s, v in r["stalls"].items():
            if "not issued" not in s.lower():
                stalls[s] += v
    samples = sum(r["samples"] for r in rows)
    longest, gap = mufu_runs(rows)
    out = {"loop rows": len(rows), "iterations": iterations,
           "instructions": sum(r["executed"] for r in rows) / iterations,
           "S->PV chain": chain_after_s(listing.rows, lo, hi), "MUFU run": longest, "MUFU gap": gap,
           "loop share %": 100.0 * samples / max(sum(r["samples"] for r in listing.rows), 1.0)}
    out.update({c: by_class.get(c, 0.0) / iterations for c in CLASSES})
    total = max(sum(stalls.values()), 1.0)
    out["stalls"] = {s: 100.0 * v / total for s, v in stalls.most_common() if v}
    return out


def table(accounts: dict) -> str:
    """A markdown table, one column per kernel, instruction classes then the largest stall reasons."""
    names = list(accounts)
    lines = ["| per key tile | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in ("instructions",) + CLASSES + ("S->PV chain", "MUFU run", "MUFU gap", "loop share %"):
        lines.append(f"| {key} | " + " | ".join(f"{accounts[n][key]:.1f}" for n in names) + " |")
    reasons = collections.Counter()
    for a in accounts.values():
        reasons.update(a["stalls"])
    for s, _ in reasons.most_common(10):
        lines.append(f"| {s} (% of samples) | " + " | ".join(f"{accounts[n]['stalls'].get(s, 0.0):.1f}"
                                                         for n in names) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="per-tile instruction account of attention kernels from ncu CSVs")
    ap.add_argument("csv", nargs="+", help="ncu --page source --print-source sass --csv output, one file a kernel")
    ap.add_argument("--names", nargs="*", help="column names (default: the file names)")
    args = ap.parse_args(argv)
    names = args.names or args.csv
    accounts = {}
    for name, path in zip(names, args.csv):
        with open(path) as f:
            accounts[name] = account(parse(f.read()))
    print(table(accounts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
