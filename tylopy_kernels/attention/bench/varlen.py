"""``tylopy bench attention_varlen``: packed variable-length batches, forward and backward.

Candidates, all in one process on the same packed bf16 inputs (total 16384 tokens, seeded random
document lengths): ``tylopy`` (``attention_varlen``: the Hopper kernel at D = 64/128 on sm_90),
``tylopy_portable`` (the mma.sync varlen kernel it replaced there), ``fa3_cute`` (the FA3-class
``flash_attn.cute.flash_attn_varlen_func``, when importable) and ``tylopy_dense`` (``attention``
on a dense (B, H, N, D) batch of the same total tokens, N the documents' mean length rounded to
128: what the packing costs). Length mixes: documents of 512-4096 and of 128-1024 tokens; D = 64
(32 heads) and 128 (16 heads); causal (bottom-right, n_q = n_k per document) and not.

TFLOP/s count only the unmasked work: 4 D H sum over documents of the allowed (query, key) pairs
for the forward, 2.5 times that for the backward (timed alone: autograd's backward of one
forward, retained). Each candidate's forward output is checked once on the first document and
head against a float64 reference.

    tylopy bench attention_varlen --output results/attention-varlen.json
    tylopy bench attention_varlen --d 128 --mix 512-4096 --causal-only --no-backward
"""
from __future__ import annotations

import argparse
import math
import sys

TOKENS = 16384
HEADS = {64: 32, 128: 16}
MIXES = {"512-4096": (512, 4096), "128-1024": (128, 1024)}


def document_lengths(lo, hi, tokens=TOKENS, seed=0):
    """Seeded random lengths in [lo, hi] summing to ``tokens`` (the last one cut to fit)."""
    import random
    rng = random.Random(seed * 7919 + lo * 31 + hi)
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(lo, hi), tokens - sum(lengths)))
    return lengths


def allowed_pairs(lengths, causal):
    """(query, key) pairs that take part, n_q = n_k = n per document."""
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


def _fa3_varlen():
    try:
        from flash_attn.cute import flash_attn_varlen_func
        return flash_attn_varlen_func, None
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        return None, f"{type(e).__name__}: {e}"[:200]


def candidates(causal, lengths, only=None):
    """name -> fn(x) returning the packed output (total, H, D); x holds the packed q, k, v, cu, max."""
    import torch

    from tylopy_kernels.attention import attention, attention_varlen

    def tylopy_varlen(x):
        return attention_varlen(x["q"], x["k"], x["v"], x["cu"], x["cu"], x["max"], x["max"], is_causal=causal)

    def portable(x):
        from tylopy_kernels.attention.portable.launch import launch_forward
        out = torch.zeros_like(x["q"])
        launch_forward(x["q"], x["k"], x["v"], out, None, scale=1 / math.sqrt(x["q"].shape[-1]), is_causal=causal,
                       varlen=(x["cu"], x["cu"], x["max"]))
        return out

    def dense(x):  # a (B, N, H, D) batch of the same tokens: timing only, its output is not comparable
        return attention(x["qd"], x["kd"], x["vd"], is_causal=causal)

    out = {"tylopy": tylopy_varlen, "tylopy_portable": portable, "tylopy_dense": dense}
    fa3, _ = _fa3_varlen()
    if fa3 is not None:
        def run_fa3(x):
            res = fa3(x["q"], x["k"], x["v"], cu_seqlens_q=x["cu"], cu_seqlens_k=x["cu"], max_seqlen_q=x["max"],
                      max_seqlen_k=x["max"], causal=causal)
            return res[0] if isinstance(res, tuple) else res
        out["fa3_cute"] = run_fa3
    return {k: v for k, v in out.items() if not only or k in only}


def inputs(lengths, d, seed=0, device="cuda"):
    import torch
    from tylopy_kernels.attention.testing.packed import prefix_sums
    g = torch.Generator(device=device).manual_seed(seed)
    h, total = HEADS[d], sum(lengths)
    q, k, v = (torch.randn(total, h, d, generator=g, device=device).to(torch.bfloat16) for _ in range(3))
    n = max(128, round(total / len(lengths) / 128) * 128)
    b = max(1, total // n)
    qd, kd, vd = (t[:b * n].view(b, n, h, d).transpose(1, 2) for t in (q, k, v))
    return {"q": q, "k": k, "v": v, "cu": prefix_sums(lengths, device), "max": max(lengths), "qd": qd, "kd": kd,
            "vd": vd, "dense_shape": (b, h, n, d), "dout": torch.randn_like(q)}


def reference_error(out, x, causal):
    """max |out - float64| on the first document's first head."""
    import torch
    n = int(x["cu"][1])
    q, k, v = (x[t][:n, 0].double() for t in ("q", "k", "v"))
    s = q @ k.T / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return (out[:n, 0].double() - torch.softmax(s, -1) @ v).abs().max().item()


def time_backward(fn, x, bench):
    """Milliseconds of autograd's backward of one forward (the graph retained), or None."""
    import torch
    names = ("qd", "kd", "vd") if fn.__name__ == "dense" else ("q", "k", "v")
    leaves = {t: x[t].detach().requires_grad_() for t in names}
    y = dict(x, **leaves)
    out = fn(y)
    dout = torch.randn_like(out)
    grads = list(leaves.values())
    return bench(lambda: torch.autograd.grad(out, grads, dout, retain_graph=True))


def run(dims=(64, 128), mixes=tuple(MIXES), causal_modes=(True, False), only=None, backward=True, bench=None):
    import torch
    from tylopy.benchmarking import median_ms
    bench = bench or (lambda f: median_ms(f, 20, 80))
    rows = []
    for mix in mixes:
        lengths = document_lengths(*MIXES[mix])
        for d in dims:
            x = inputs(lengths, d)
            for causal in causal_modes:
                work = 4 * d * HEADS[d] * allowed_pairs(lengths, causal)
                b, h, n, _ = x["dense_shape"]
                dense_work = 4 * d * h * b * (n * (n + 1) // 2 if causal else n * n)
                for name, fn in candidates(causal, lengths, only).items():
                    row = {"candidate": name, "mix": mix, "d": d, "causal": causal, "documents": len(lengths),
                           "tokens": sum(lengths)}
                    try:
                        out = fn(x)
                        torch.cuda.synchronize()
                        if name != "tylopy_dense":
                            row["max_error"] = reference_error(out, x, causal)
                        flop = dense_work if name == "tylopy_dense" else work
                        ms = bench(lambda: fn(x))
                        row.update(fwd_ms=ms, fwd_tflops=flop / ms / 1e9)
                        if backward and name != "tylopy_portable":  # its backward is tylopy's too
                            ms_b = time_backward(fn, x, bench)
                            row.update(bwd_ms=ms_b, bwd_tflops=2.5 * flop / ms_b / 1e9)
                    except Exception as e:  # noqa: BLE001 - one candidate failing does not stop the table
                        row["error"] = f"{type(e).__name__}: {e}"[:300]
                    rows.append(row)
                    print_row(row)
    return rows


def print_row(r):
    if "error" in r:
        print(f"{r['mix']:>9} D{r['d']:<3} {'causal' if r['causal'] else 'full':>6} {r['candidate']:>16}  "
              f"ERROR {r['error']}")
        return
    bwd = f"bwd {r['bwd_tflops']:6.1f} TFLOP/s" if "bwd_tflops" in r else ""
    err = f"err {r['max_error']:.1e}" if "max_error" in r else ""
    print(f"{r['mix']:>9} D{r['d']:<3} {'causal' if r['causal'] else 'full':>6} {r['candidate']:>16}  "
          f"fwd {r['fwd_tflops']:6.1f} TFLOP/s  {bwd}  {err}", flush=True)


def ratios(rows, subject="tylopy"):
    """Per (mix, d, causal): subject's fwd/bwd TFLOP/s over each other candidate's."""
    table = {}
    for r in rows:
        if r["candidate"] != subject or "error" in r:
            continue
        key = f"{r['mix']} D{r['d']} {'causal' if r['causal'] else 'full'}"
        for o in rows:
            same = (o["mix"], o["d"], o["causal"]) == (r["mix"], r["d"], r["causal"])
            if same and o["candidate"] != subject and "error" not in o:
                for what in ("fwd_tflops", "bwd_tflops"):
                    if what in r and what in o:
                        table.setdefault(key, {})[f"{what[:3]} vs {o['candidate']}"] = round(r[what] / o[what], 3)
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tylopy bench attention_varlen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", help="JSON path (default results/attention_varlen-<device>-<date>.json)")
    ap.add_argument("--d", type=int, nargs="*", default=[64, 128], choices=[64, 128])
    ap.add_argument("--mix", nargs="*", default=list(MIXES), choices=list(MIXES))
    ap.add_argument("--only", nargs="*", help="candidates (tylopy, tylopy_portable, tylopy_dense, fa3_cute)")
    ap.add_argument("--causal-only", action="store_true")
    ap.add_argument("--no-backward", action="store_true")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench attention_varlen needs a CUDA GPU", file=sys.stderr)
        return 2
    from tylopy.benchmarking import write_results
    rows = run(tuple(args.d), tuple(args.mix), (True,) if args.causal_only else (True, False), args.only,
               not args.no_backward)
    table = ratios(rows)
    for key, vals in table.items():
        print(f"{key:>26}: " + "  ".join(f"{k} {v:.2f}x" for k, v in vals.items()))
    write_results("attention_varlen", {"rows": rows, "ratios": table, "fa3_cute": _fa3_varlen()[1] or "available",
                                       "tokens": TOKENS, "mixes": MIXES}, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
