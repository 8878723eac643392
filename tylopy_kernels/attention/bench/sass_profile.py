"""SASS instructions per key tile of the Hopper attention kernel's consumer loop (no GPU needed).

The PTX count (``ptx_profile.py``) says what the kernel asks for; this counts what ptxas made of
it: the specialization's cubin is disassembled with ``nvdisasm`` and the consumer's steady-state
loop is found as the innermost backward branch whose range holds ``MUFU.EX2`` and ``HGMMA``.
Its whole range is counted, rare paths included (the exact-exponent fallback of the guarded FMA
form, the O rescale, masking), so one iteration on the common path issues fewer; the MUFU and
HGMMA counts say how much of each path is there. ``nvdisasm`` is looked up in
``$TYLOPY_NVDISASM``, ``PATH``, ``$CUDA_HOME/bin`` and Triton's bundled CUDA tools.

    tylopy bench attention --sass            # the table of docs/performance.md, "final"
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile

_LABEL = re.compile(r"^(\.L_x_\d+):")
_INS = re.compile(r"/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
CLASSES = ("HGMMA", "MUFU", "fp32", "FMNMX", "F2FP", "SHFL", "sync", "branch", "int/other")


def nvdisasm() -> str | None:
    """A path to nvdisasm, or None."""
    found = os.environ.get("TYLOPY_NVDISASM") or shutil.which("nvdisasm")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvdisasm")):
            return os.path.join(root, "bin", "nvdisasm")
    try:
        import triton
        p = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
        return p if os.path.exists(p) else None
    except ImportError:
        return None


def disassemble(cubin: bytes) -> str:
    tool = nvdisasm()
    if tool is None:
        raise RuntimeError("nvdisasm not found: set TYLOPY_NVDISASM, or put the CUDA toolkit's bin on PATH")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([tool, "-c", path], capture_output=True, text=True, check=True).stdout


def instructions(sass: str) -> tuple[list[tuple[str, str | None]], dict[str, int]]:
    """([(opcode, branch target or None)], {label: index of the next instruction})."""
    ins, labels = [], {}
    for line in sass.split("\n"):
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = _INS.search(line)
        if m:
            t = _TARGET.search(line)
            ins.append((m.group(2), t.group(1) if t else None))
    return ins, labels


def classify(op: str) -> str:
    base = op.split(".")[0]
    if base in ("HGMMA", "MUFU", "FMNMX", "F2FP", "SHFL"):
        return base
    if base in ("FFMA", "FADD", "FMUL", "FSEL", "FSETP", "FCHK"):
        return "fp32"
    if base in ("BAR", "SYNCS", "WARPGROUP", "WARPSYNC", "DEPBAR", "MEMBAR", "FENCE", "VOTE", "VOTEU", "ARRIVES"):
        return "sync"
    if base in ("BRA", "BRX", "EXIT", "RET", "CALL", "BSYNC", "BSSY"):
        return "branch"
    return "int/other"


def main_loop(ins, labels) -> tuple[int, int]:
    """(first, last) instruction index of the innermost loop that issues MUFU.EX2 and HGMMA (the
    loops around it, over work tiles and roles, hold the peeled first tile too)."""
    loops = [(labels[t], i) for i, (_, t) in enumerate(ins) if t is not None and labels.get(t, i + 1) <= i]

    def count(lo, hi, prefix):
        return sum(1 for op, _ in ins[lo:hi + 1] if op.startswith(prefix))

    cands = [(lo, hi) for lo, hi in loops if count(lo, hi, "MUFU.EX2") and count(lo, hi, "HGMMA")]
    if not cands:
        raise ValueError("no loop with MUFU.EX2 and HGMMA in this SASS")
    return min(cands, key=lambda lh: lh[1] - lh[0])


def profile(cubin: bytes) -> dict:
    """{"loop": instructions in the loop's range, "kernel": in the whole kernel, classes...}."""
    ins, labels = instructions(disassemble(cubin))
    lo, hi = main_loop(ins, labels)
    c = collections.Counter(classify(op) for op, _ in ins[lo:hi + 1])
    row = {k: c.get(k, 0) for k in CLASSES}
    row["loop"] = hi - lo + 1
    row["kernel"] = len(ins)
    row["MUFU kernel"] = sum(1 for op, _ in ins if op.startswith("MUFU"))
    row["MUFU run"] = longest_run([op for op, _ in ins[lo:hi + 1]], "MUFU.EX2")
    return row


def longest_run(ops, prefix) -> int:
    """The most instructions starting with ``prefix`` issued back to back: a long run of MUFU.EX2
    stalls on the 16-lane unit where interleaved FFMAs would have hidden it."""
    best = run = 0
    for op in ops:
        run = run + 1 if op.startswith(prefix) else 0
        best = max(best, run)
    return best


def report(constexprs: dict) -> dict:
    from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90
    ck = attention_fwd_sm90.compile(**constexprs)
    if ck.cubin is None:
        raise RuntimeError("no cubin: ptxas is not available here")
    row = profile(ck.cubin)
    row["registers"] = ck.report.registers
    return row


def print_table(profiles) -> None:
    """One row per (name, constexprs) in ``profiles``."""
    cols = ("loop",) + CLASSES + ("kernel", "MUFU kernel", "MUFU run", "registers")
    print("| schedule | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, cx in profiles:
        row = report(cx)
        print(f"| {name} | " + " | ".join(str(row[k]) for k in cols) + " |", flush=True)
