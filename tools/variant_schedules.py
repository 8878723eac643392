"""Time the Hopper variant forward under schedule changes, beside the FA3-class kernel, in one process.

    python3 tools/variant_schedules.py --variants sliding_window softcap --d 64 128 --n 2048 8192 \
        --schedule CONSUMERS=3 --schedule PERSISTENT=True --schedule CONSUMERS=3,PERSISTENT=True

Each schedule overrides ``variant_launch.default_schedule``'s choice for the variant and head dim, passed to
``launch_variant`` (the same kernel and launch the public call makes, without its checks and
autograd); every schedule's output is compared with the default's first (the largest difference
is printed), then timed (CUDA-event medians after warm-up, the benchmark's timer). The FA3-class
column is flash-attn-4's ``flash_attn_func`` when it imports. TFLOP/s count visible work, as
``tylopy bench attention_variants`` does. ``document_varlen`` times the packed forward
(``launch_varlen_hopper``; its ``SCHEDULE`` is the default) against ``flash_attn_varlen_func``.
"""
from __future__ import annotations

import argparse
import json
import math

import torch

from tylopy.benchmarking import median_ms, parse_schedule
from tylopy_kernels.attention import variants as V
from tylopy_kernels.attention.bench import variant_cases as cases
from tylopy_kernels.attention.bench import variant_libs as libs
from tylopy_kernels.attention.common import ForwardTensors, PackedDocs, VariantCall
from tylopy_kernels.attention.sm90.launch import HopperOptions
from tylopy_kernels.attention.sm90.variant_launch import launch_variant
from tylopy_kernels.attention.sm90.varlen_launch import launch_varlen_hopper

FORWARD_VARIANTS = ("sliding_window", "softcap", "alibi", "sinks", "causal", "document_varlen")


def _keywords(spec, x):
    kw = libs._tylopy_kwargs(spec, x)
    if spec.variant == "causal":  # tylopy.attention sends plain causal to the dense kernel; time the variant kernel
        kw = {"is_causal": True, "window_size": (-1, -1)}
    return kw


def _launcher(spec, x):
    """(output, launch(schedule)): the variant kernel's launch, or for "document_varlen" the packed
    kernel's (``launch_varlen_hopper`` over the (total, H, D) tensors; output zeroed, LSE -inf)."""
    q, k, v = x["q"], x["k"], x["v"]
    B, H, n, D = q.shape
    if spec.variant == "document_varlen":
        qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
        out = torch.zeros_like(qp)
        lse = torch.full((H, qp.shape[0]), float("-inf"), device=q.device)
        docs = PackedDocs(x["cu_seqlens"], x["cu_seqlens"], x["max_seqlen"], x["max_seqlen"])
        io = ForwardTensors(qp, kp, vp, out, lse)
        return out, lambda sched: launch_varlen_hopper(io, docs, HopperOptions(1 / math.sqrt(D), True, sched))
    variant, tensors = V.make_variant(B, H, n, n, q.device, **_keywords(spec, x))
    call = VariantCall(variant, tensors, 1 / math.sqrt(D))
    out = torch.empty_like(q)
    io = ForwardTensors(q, k, v, out, torch.empty(B, H, n, device=q.device))
    return out, lambda sched: launch_variant(io, call, schedule=sched)


def run_point(spec, schedules, timer, fa3=True):
    x = cases.make_inputs(spec)
    flops = cases.flops(spec, "fwd")
    rows, first = [], None
    for sched in schedules:
        out, launch = _launcher(spec, x)
        launch(sched)
        torch.cuda.synchronize()
        diff = 0.0 if first is None else (out.float() - first.float()).abs().max().item()
        first = out if first is None else first
        ms = timer(lambda: launch(sched))
        rows.append({"schedule": sched, "ms": ms, "tflops": flops / ms / 1e9, "max_diff_vs_default": diff})
    if not fa3:
        return rows
    try:
        run = libs.fa3_run(spec, x)
        with torch.no_grad():
            run.forward()
            ms = timer(lambda: run.forward())
        rows.append({"schedule": "fa3_cute", "ms": ms, "tflops": flops / ms / 1e9})
    except Exception as e:  # noqa: BLE001 - report and go on
        rows.append({"schedule": "fa3_cute", "error": f"{type(e).__name__}: {e}"[:160]})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["sliding_window"], choices=FORWARD_VARIANTS)
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--schedule", action="append", default=[], help="KEY=VALUE,... overrides (repeatable)")
    ap.add_argument("--output", help="JSON path")
    ap.add_argument("--no-fa3", action="store_true", help="time tylopy's schedules only")
    ap.add_argument("--only-fa3", action="store_true", help="time the FA3-class kernel only (e.g. under ncu)")
    args = ap.parse_args(argv)
    schedules = [] if args.only_fa3 else [{}] + [parse_schedule(s) for s in args.schedule]
    timer = lambda fn: median_ms(fn, 100, 400)  # noqa: E731
    results = []
    for name in args.variants:
        for d in args.d:
            for n in args.n:
                spec = cases.make_spec(name, d, n)
                rows = run_point(spec, schedules, timer, fa3=not args.no_fa3)
                base = rows[0].get("ms")
                for r in rows:
                    label = r["schedule"] if isinstance(r["schedule"], str) else (
                        ",".join(f"{a}={b}" for a, b in r["schedule"].items()) or "default")
                    if "ms" in r:
                        print(f"{name:15s} D={d:3d} N={n:5d} {label:32s} {r['ms']:.4f} ms {r['tflops']:6.1f} TFLOP/s "
                              f"x{base / r['ms']:.3f} vs default  diff {r.get('max_diff_vs_default', 0):.2e}",
                              flush=True)
                    else:
                        print(f"{name:15s} D={d:3d} N={n:5d} {label:32s} {r['error']}", flush=True)
                results.append({"variant": name, "d": d, "n": n, "rows": rows})
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
