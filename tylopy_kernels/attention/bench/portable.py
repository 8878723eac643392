"""``tylopy bench streaming_attention``: the portable mma.sync kernel beside SDPA and a dense FP32 expression.

Shapes: bf16, batch * N = 16384 tokens, 32 heads; D in {16, 32, 64};
N in {1024, 2048, 4096, 8192}; non-causal (``--causal`` adds causal rows). Candidates:

* ``tylopy_bn32``, ``tylopy_bn64``: ``streaming_attention`` with 32- and 64-key tiles;
* ``sdpa_auto``: ``torch.nn.functional.scaled_dot_product_attention`` (automatic backend);
* ``sdpa_flash``: the same restricted to the FLASH_ATTENTION backend (FlashAttention-2, mma.sync);
* ``dense_fp32``: softmax(scale * Q K^T) V with Q, K, V upcast to float32 (TF32 off): the
  algorithmic baseline that stores the scores.

Each candidate is checked against an FP64 reference on its first (batch, head) before it is
timed; times are medians of CUDA-event timings (``triton.testing.do_bench`` when available).
TFLOP/s counts 4 B H N^2 D (half for causal). Memory is reported two ways, on purpose kept apart:
``peak_mib`` is measured (``torch.cuda.max_memory_allocated`` after a reset, minus what was
allocated before the call: the output and every temporary of the candidate), and
``scores_fp32_mib`` is the analytic size of one dense FP32 score matrix B H N^2 4 bytes, which the
streaming kernel never allocates (that does not by itself prove a reduction of that size: a fused
baseline does not allocate it either).

    tylopy bench attention_portable --output results/streaming_attention.json
    tylopy bench attention_portable --sweep      # schedules (BLOCK_N x WARPS x register cap), D=64
"""
import argparse
import math
import sys

TOKENS, HEADS = 16384, 32
NS = (1024, 2048, 4096, 8192)
DS = (16, 32, 64)


def _timer(warmup=25, rep=100):
    from tylopy.benchmarking import median_ms
    return lambda fn: median_ms(fn, warmup, rep)


def candidates(causal, schedules=((32, None, None), (64, None, None))):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tylopy_kernels.attention.portable.launch import streaming_attention
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def tylopy(bn, warps, regs):
        def run(q, k, v):
            if regs is None:
                return streaming_attention(q, k, v, is_causal=causal, block_n=bn, warps=warps)
            return _with_register_cap(q, k, v, causal, bn, warps, regs)
        return run

    def flash(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(q, k, v, is_causal=causal)

    def dense(q, k, v):
        s = (q.float() @ k.float().transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        if causal:
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        return (torch.softmax(s, -1) @ v.float()).to(q.dtype)

    out = {}
    for bn, warps, regs in schedules:
        name = f"tylopy_bn{bn}" + (f"_w{warps}" if warps else "") + (f"_r{regs}" if regs is not None else "")
        out[name] = tylopy(bn, warps, regs)
    out.update(sdpa_auto=lambda q, k, v: sdpa(q, k, v, is_causal=causal), sdpa_flash=flash, dense_fp32=dense)
    return out


def _with_register_cap(q, k, v, causal, bn, warps, regs):
    """streaming_attention with a ptxas register cap (MAX_REGISTERS) other than the default."""
    import torch

    from tylopy_kernels.attention.portable import forward as sa
    from tylopy_kernels.attention.portable import launch as pl
    B, H, n, D = q.shape
    out = torch.empty_like(q)
    cx = dict(DTYPE=pl.dtype_of(q), HEAD_DIM=D, BLOCK_N=bn, WARPS=warps or sa.DEFAULT_WARPS, HAS_MASK=False,
              RETURN_LSE=False, ASYNC_COPY=True, MAX_REGISTERS=regs)
    rows = sa.ROWS_PER_WARP * cx["WARPS"]
    args = dict(q=pl.token_view(q), k=pl.token_view(k), v=pl.token_view(v), out=pl.token_view(out),
                lse=pl.unused(q.device, torch.float32, 3), mask=pl.unused(q.device, torch.uint8, 4),
                scale=1.0 / math.sqrt(D), causal=int(causal))
    pl.Launch(sa.streaming_attention_fwd, ((n + rows - 1) // rows, H, B), args, cx).run()
    return out


def _reference_error(out, q, k, v, causal):
    """max |out - ref64| on the first (batch, head)."""
    import torch
    qs, ks, vs = q[:1, :1].double(), k[:1, :1].double(), v[:1, :1].double()
    s = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return (out[:1, :1].double() - torch.softmax(s, -1) @ vs).abs().max().item()


def _peak_extra_bytes(fn):
    import torch
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def run(ds=DS, ns=NS, causal_modes=(False,), schedules=((32, None, None), (64, None, None)), only=None):
    import torch
    bench = _timer()
    rows = []
    for causal in causal_modes:
        cands = candidates(causal, schedules)
        for D in ds:
            for n in ns:
                b = max(TOKENS // n, 1)
                torch.manual_seed(n + D)
                q = torch.randn(b, HEADS, n, D, device="cuda", dtype=torch.bfloat16)
                k, v = torch.randn_like(q), torch.randn_like(q)
                flops = 4 * b * HEADS * n * n * D / (2 if causal else 1)
                for name, fn in cands.items():
                    if only and not any(name.startswith(o) for o in only):
                        continue
                    row = {"name": name, "D": D, "n": n, "batch": b, "heads": HEADS, "causal": causal,
                           "scores_fp32_mib": b * HEADS * n * n * 4 / 2 ** 20}
                    try:
                        out = fn(q, k, v)
                        row["max_err"] = _reference_error(out, q, k, v, causal)
                        del out
                        row["peak_mib"] = _peak_extra_bytes(lambda: fn(q, k, v)) / 2 ** 20
                        ms = bench(lambda: fn(q, k, v))
                        row.update(ms=ms, tflops=flops / ms / 1e9)
                    except Exception as e:  # noqa: BLE001 - a backend may not support a shape
                        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                        torch.cuda.empty_cache()
                    rows.append(row)
                    print_row(row, rows)
                del q, k, v
                torch.cuda.empty_cache()
    return rows


def print_row(r, rows=(), header=False):
    if header:
        print("| candidate | D | N | causal | ms | TFLOP/s | peak MiB (measured) | fp32 scores MiB (analytic) | "
              "max err |")
        print("|---|---|---|---|---|---|---|---|---|")
        return
    if "error" in r:
        print(f"| {r['name']} | {r['D']} | {r['n']} | {r['causal']} | - | - | - | {r['scores_fp32_mib']:.0f} | "
              f"{r['error'][:60]} |", flush=True)
        return
    print(f"| {r['name']} | {r['D']} | {r['n']} | {r['causal']} | {r['ms']:.3f} | {r['tflops']:.1f} | "
          f"{r['peak_mib']:.0f} | {r['scores_fp32_mib']:.0f} | {r['max_err']:.2e} |", flush=True)


def targets(rows):
    """The targets: D=64, N >= 4096: >= 0.8x sdpa_flash; D=16, 32: >= 1.0x sdpa_auto (best tile size)."""
    out = []
    for D, base, need in ((64, "sdpa_flash", 0.8), (32, "sdpa_auto", 1.0), (16, "sdpa_auto", 1.0)):
        for r in rows:
            if r["D"] != D or r["name"] != base or "tflops" not in r or (D == 64 and r["n"] < 4096):
                continue
            mine = [x for x in rows if x["name"].startswith("tylopy") and x["D"] == D and x["n"] == r["n"]
                    and x["causal"] == r["causal"] and "tflops" in x]
            if not mine:
                continue
            best = max(mine, key=lambda x: x["tflops"])
            ratio = best["tflops"] / r["tflops"]
            out.append({"D": D, "n": r["n"], "causal": r["causal"], "baseline": base, "need": need,
                        "best": best["name"], "ratio": ratio, "met": ratio >= need})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tylopy bench streaming_attention", description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", help="JSON path (default results/streaming_attention-<device>-<date>.json)")
    ap.add_argument("--n", type=int, nargs="*", default=list(NS))
    ap.add_argument("--d", type=int, nargs="*", default=None, help="head dims (default 16 32 64; 64 with --sweep)")
    ap.add_argument("--causal", action="store_true", help="also time causal attention")
    ap.add_argument("--only", nargs="*", help="candidate name prefixes to time (e.g. tylopy sdpa_flash)")
    ap.add_argument("--sweep", action="store_true",
                    help="time tylopy schedules (BLOCK_N x WARPS x register cap) at D=64 instead of the comparison")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench streaming_attention needs a CUDA GPU", file=sys.stderr)
        return 2
    print_row({}, header=True)
    if args.sweep:
        scheds = [(bn, w, r) for bn in (32, 64) for w in (4, 8) for r in (0, 128)]
        rows = run(ds=tuple(args.d or (64,)), ns=tuple(args.n), schedules=scheds, only=("tylopy", "sdpa"))
    else:
        rows = run(tuple(args.d or DS), tuple(args.n), (False, True) if args.causal else (False,))
    goals = targets(rows)
    for g in goals:
        print(f"target D={g['D']} N={g['n']}{' causal' if g['causal'] else ''}: {g['best']} = {g['ratio']:.2f}x "
              f"{g['baseline']} (need >= {g['need']}): {'met' if g['met'] else 'MISSED'}")
    from tylopy.benchmarking import write_results
    from tylopy_kernels.attention.portable import forward as sa
    data = {"rows": rows, "targets": goals,
            "defaults": {"block_n": sa.DEFAULT_BLOCK_N, "warps": sa.DEFAULT_WARPS,
                         "max_registers": sa.DEFAULT_MAX_REGISTERS},
            "dense_fp32_allow_tf32": torch.backends.cuda.matmul.allow_tf32}
    write_results("streaming_attention", data, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
