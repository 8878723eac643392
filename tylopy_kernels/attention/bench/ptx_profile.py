"""PTX instructions per key tile of the Hopper attention kernel's consumer loop (no GPU needed).

The steady-state loop is the loop whose body holds the most ``ex2`` and a ``wgmma``; it is cut
into basic blocks (labels and branches), and blocks off the common path are left out: masking
(eight or more selects of -inf), the exact exponent form (eight or more ``sub`` feeding ``ex2``
without FMAs), and the O rescale (a run of multiplies with no ``ex2``, ``wgmma`` or conversion).
Heuristics on the PTX text, stable across schedules of this kernel; they count what one thread
issues per 128-key tile when nothing is masked, the FMA form holds and no row's maximum moves.
Register copies (``mov``) are reported apart: ptxas coalesces most of them.

    tylopy bench attention --ptx            # the table of docs/performance.md, "v5"
"""
from __future__ import annotations

import collections
import re

_LABEL = re.compile(r"^(\$L\w+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L\w+);")
CLASSES = ("ex2", "fp32 arith", "fp32 max", "int/pred", "selp", "cvt pack", "shfl", "sync", "branch", "mov")


def blocks_of(ptx: str) -> list[dict]:
    """Basic blocks: {"label", "ins" (instruction lines), "succ" (branch targets)}."""
    blocks, cur = [], {"label": None, "ins": [], "succ": []}
    for line in ptx.split("\n"):
        s = line.strip()
        m = _LABEL.match(s)
        if m:
            blocks.append(cur)
            cur = {"label": m.group(1), "ins": [], "succ": []}
            continue
        if not s or s.startswith(("//", ".", "$")) or s in ("{", "}"):
            continue
        cur["ins"].append(s)
        b = _BRANCH.search(s)
        if b:
            cur["succ"].append(b.group(1))
            blocks.append(cur)
            cur = {"label": None, "ins": [], "succ": []}
    blocks.append(cur)
    return blocks


def classify(ins: str) -> str:
    op = ins.split()[1] if ins.startswith("@") else ins.split()[0]
    base = op.split(".")[0]
    if base == "ex2":
        return "ex2"
    if op.startswith(("fma.rn.f32", "mul.rn.f32", "add.rn.f32", "sub.rn.f32", "mul.f32", "add.f32", "sub.f32",
                      "neg.f32", "abs.f32")):
        return "fp32 arith"
    if op.startswith(("max.f32", "min.f32")):
        return "fp32 max"
    if base == "cvt" and ("bf16x2" in op or "f16x2" in op):
        return "cvt pack"
    if base == "wgmma":
        return "wgmma"
    if base in ("mbarrier", "bar", "barrier", "fence", "vote"):
        return "sync"
    if base == "shfl":
        return "shfl"
    if base == "mov":
        return "mov"
    if base in ("bra", "ret", "exit"):
        return "branch"
    if base == "selp":
        return "selp"
    return "int/pred"


def main_loop(blocks: list[dict]) -> tuple[int, int]:
    """(first, last) block index of the loop with the most ex2 that issues a wgmma."""
    index = {b["label"]: i for i, b in enumerate(blocks) if b["label"]}
    loops = [(index[t], i) for i, b in enumerate(blocks) for t in b["succ"] if index[t] <= i]

    def count(lo, hi, what):
        return sum(1 for b in blocks[lo:hi + 1] for s in b["ins"] if s.startswith(what))

    cands = [(lo, hi) for lo, hi in loops if count(lo, hi, "ex2") and count(lo, hi, "wgmma.mma_async")]
    if not cands:
        raise ValueError("no loop with ex2 and wgmma.mma_async in this PTX")
    return max(cands, key=lambda lh: (count(*lh, "ex2"), lh[1] - lh[0]))


def off_path(block: dict, exact_form: bool = False) -> str | None:
    """Why a block is off the common path (None: on it)."""
    ins = block["ins"]

    def n(pred):
        return sum(1 for x in ins if pred(x))

    ex2 = n(lambda x: x.startswith("ex2"))
    if n(lambda x: x.startswith("selp.f32") and "0fFF800000" in x) >= 8:
        return "mask"
    if (not exact_form and ex2 >= 8 and n(lambda x: x.startswith("sub.rn.f32")) >= 8
            and n(lambda x: x.startswith("fma.rn.f32")) < 8):
        return "exact exponent"
    if (ex2 == 0 and n(lambda x: x.startswith("mul.rn.f32")) >= 16 and not n(lambda x: "wgmma" in x)
            and not n(lambda x: x.startswith("cvt.rn"))):
        return "rescale"
    return None


def per_tile(ptx: str, exact_form: bool = False) -> collections.Counter:
    """Instruction classes on the common path of one steady-state loop iteration."""
    blocks = blocks_of(ptx)
    lo, hi = main_loop(blocks)
    counts = collections.Counter()
    for b in blocks[lo:hi + 1]:
        if off_path(b, exact_form) is None:
            counts.update(classify(s) for s in b["ins"])
    return counts


def report(constexprs: dict) -> dict:
    """Compile one specialization and count its loop (``total`` leaves ``mov`` out)."""
    from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90
    ck = attention_fwd_sm90.compile(**constexprs)
    c = per_tile(ck.ptx, constexprs.get("EXPONENT") == "exact")
    row = {k: c.get(k, 0) for k in CLASSES}
    row["total"] = sum(c.values()) - c.get("mov", 0)
    row["ptxas"] = str(ck.report).split("\n")[0]
    return row


PROFILES = [("default (D=64, 3 x 128)", {}), ("exact, eager rescale", {"EXPONENT": "exact", "RESCALE_THRESHOLD": None}),
            ("exact", {"EXPONENT": "exact"}), ("fast (no guard)", {"EXPONENT": "fast"}),
            ("eager rescale", {"RESCALE_THRESHOLD": None}), ("SPLIT_S", {"SPLIT_S": True}),
            ("POLY_EXP2=2", {"POLY_EXP2": 2}), ("D=128, 2 x 128", {"HEAD_DIM": 128, "CONSUMERS": 2}),
            ("D=128, 2 x 176", {"HEAD_DIM": 128, "CONSUMERS": 2, "BLOCK_N": 176})]


def print_table(profiles=PROFILES):
    print("| schedule | PTX / tile | " + " | ".join(CLASSES) + " |")
    print("|---|---|" + "---|" * len(CLASSES))
    for name, cx in profiles:
        row = report(cx)
        print(f"| {name} | {row['total']} | " + " | ".join(str(row[k]) for k in CLASSES) + " |", flush=True)
