"""``tylopy bench scaled_matmul``: tylopy.scaled_matmul beside torch._scaled_mm (cuBLAS).

Square e4m3 problems (4096^3 and 8192^3 by default), a (M, K) row-major and b = w.t() of a
row-major (N, K) weight; bf16 output. Scale forms: per tensor and row-wise (A per row, B per
column), each with ``use_fast_accum`` False (promotion into f32 every 128 k) and True (the
tensor cores' FP8 accumulator over all of K); 128-block scales (tylopy always promotes; torch's
blockwise form where this torch and GPU support it). Every candidate is first checked against
float64 of the dequantized inputs on a slice of rows, then timed two ways, all in one process:
"per call" (CUDA events around each call, synchronized: the host's time to the launch counts,
as in an eager loop that waits for every result) and "back to back" (``tylopy.benchmarking.median_ms``:
triton's do_bench when it imports, which clears the L2 between calls, so the host's latency hides
behind that and the kernel's own time is what remains, as in a model whose launches queue ahead).
TFLOP/s counts 2 M N K and "vs torch" is tylopy's time over torch's inverted (> 1: tylopy faster),
for each timer. tylopy runs the schedule ty.autotune picks (tuned on the first call).

    tylopy bench scaled_matmul
    tylopy bench scaled_matmul --sizes 4096 --forms row --output results/scaled_matmul.json
"""
from __future__ import annotations

import argparse

CHECK_ROWS = 256


def _inputs(s, form, seed):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(s, s, device="cuda", generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(s, s, device="cuda", generator=g).to(torch.float8_e4m3fn).t()
    if form == "tensor":
        return a, b, torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")
    if form == "row":
        return a, b, torch.rand(s, 1, device="cuda", generator=g) + 0.5, torch.rand(1, s, device="cuda",
                                                                                     generator=g) + 0.5
    kb = -(-s // 128)
    # column-major block scales: the layout torch's blockwise scaling and DeepGEMM read
    return (a, b, (torch.rand(kb, s, device="cuda", generator=g) + 0.5).t(),
            (torch.rand(kb, kb, device="cuda", generator=g) + 0.5).t())


def _check(fn, a, b, sa, sb):
    """Worst |error| over the float64 bound of the first rows (<= 1: within)."""
    import torch

    from tylopy_kernels.gemm.fp8_ops import reference
    f64 = torch.float64
    rows = min(CHECK_ROWS, a.shape[0])
    sa_rows = sa[:rows] if sa.numel() > 1 else sa
    out = fn()[:rows].double()
    exact = reference(a[:rows], b, sa_rows, sb, None, f64, f64)
    mag = reference(a[:rows].double().abs(), b.double().abs(), sa_rows.abs(), sb.abs(), None, f64, f64)
    bound = (a.shape[1] / 32 + 2) * 34 * 2.0 ** -12 * mag + 2.0 ** -8 * exact.abs() + 1e-30
    return float(((out - exact).abs() / bound).max())


def candidates(form, a, b, sa, sb):
    """(name, fast_accum, fn) of every contender for this scale form."""
    import torch

    import tylopy
    out = []
    modes = (False,) if form == "block" else (False, True)
    for fast in modes:
        out.append(("tylopy", fast, lambda fast=fast: tylopy.scaled_matmul(a, b, sa, sb, use_fast_accum=fast)))
        tsa, tsb = (sa.reshape(()), sb.reshape(())) if form == "tensor" else (sa, sb)
        out.append(("torch", fast, lambda fast=fast: torch._scaled_mm(a, b, tsa, tsb, out_dtype=torch.bfloat16,
                                                                      use_fast_accum=fast)))
    return out


def run(sizes, forms, warmup_ms=50, rep_ms=300):
    from tylopy.benchmarking import events_median_ms, median_ms
    rows = []
    print("| form | fast_accum | size | tylopy ms | tylopy TFLOP/s | torch ms | torch TFLOP/s | vs torch | "
          "back to back: tylopy / torch TFLOP/s, vs torch | err/bound (tylopy, torch) |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for s in sizes:
        flops = 2.0 * s ** 3
        for form in forms:
            a, b, sa, sb = _inputs(s, form, seed=s)
            results = {}
            for name, fast, fn in candidates(form, a, b, sa, sb):
                row = {"name": name, "form": form, "fast_accum": fast, "m": s, "n": s, "k": s}
                try:
                    row["err_over_bound"] = _check(fn, a, b, sa, sb)
                    row["ms"] = events_median_ms(fn, warmup_ms, rep_ms)
                    row["tflops"] = flops / row["ms"] / 1e9
                    row["stream_ms"] = median_ms(fn, warmup_ms, rep_ms)
                    row["stream_tflops"] = flops / row["stream_ms"] / 1e9
                except Exception as e:  # noqa: BLE001 - torch may not offer a form on this GPU
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                results[(name, fast)] = row
                rows.append(row)
            for fast in sorted({f for _, f in results}):
                t, c = results.get(("tylopy", fast), {}), results.get(("torch", fast), {})
                ratio = c["ms"] / t["ms"] if "ms" in t and "ms" in c else None
                if ratio is not None:
                    t["vs_torch"] = ratio
                    t["stream_vs_torch"] = c["stream_ms"] / t["stream_ms"]

                def cell(r, key, fmt):
                    return format(r[key], fmt) if key in r else "-"
                print(f"| {form} | {fast} | {s}^3 | {cell(t, 'ms', '.3f')} | {cell(t, 'tflops', '.0f')} | "
                      f"{cell(c, 'ms', '.3f')} | {cell(c, 'tflops', '.0f')} | "
                      f"{'-' if ratio is None else format(ratio, '.3f')} | {cell(t, 'stream_tflops', '.0f')} / "
                      f"{cell(c, 'stream_tflops', '.0f')}, {cell(t, 'stream_vs_torch', '.3f')} | "
                      f"{cell(t, 'err_over_bound', '.2f')}, "
                      f"{cell(c, 'err_over_bound', '.2f')} {c.get('error', '')[:60]} |", flush=True)
            del a, b, sa, sb
    return rows


def main(argv=None) -> int:
    """Benchmark tylopy.scaled_matmul against torch._scaled_mm."""
    p = argparse.ArgumentParser(prog="tylopy bench scaled_matmul", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--forms", nargs="+", choices=("tensor", "row", "block"), default=["tensor", "row", "block"])
    p.add_argument("--output", help="write the rows as JSON here (tylopy.benchmarking.write_results)")
    args = p.parse_args(argv)
    rows = run(args.sizes, args.forms)
    if args.output:
        from tylopy.benchmarking import write_results
        write_results("scaled_matmul", {"rows": rows}, args.output)
    bad = [r for r in rows if r["name"] == "tylopy" and ("error" in r or r["err_over_bound"] > 1)]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
