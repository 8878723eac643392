"""``tylopy bench attention_decode``: split-KV decode in GB/s of KV read, against the copy bandwidth
and SDPA's best backend (FlashAttention's decode where ``flash_attn`` is importable).

Shapes: bf16, H_q = 32, H_kv = 8, D = 128, one new token per sequence (n_q = 1), B in {1, 8, 64},
cache lengths 4k .. 128k (every sequence full; SDPA cannot take per-sequence lengths), skipping
shapes whose cache exceeds ``--max-gb``. For each shape:

* ``copy``: a device-to-device copy of 2 GiB in the same process; its bandwidth counts bytes read
  plus bytes written (what a copy moves). The decode's figure counts the K/V bytes it must read
  (B L H_kv D 2 bytes x 2), and ``frac_copy`` is the ratio of the two. On an H200 the copy
  (``cudaMemcpy``-class, 2773 GB/s) moved less than the decode reads, so a read-only reference
  is measured too: ``read``, a sum over 2 GiB of random fp32 (bytes read), and ``frac_read``.
* ``tylopy``: ``attention_decode`` with the automatic split count, merged by the second kernel
  and by the arrival counter (``merge=kernel|atomic``);
* ``sdpa_<backend>``: ``scaled_dot_product_attention`` with q (B, 32, 1, D) and the cache viewed
  as (B, 8, L, D) (a transpose, no copy) with ``enable_gqa=True``, on every backend that takes it
  (the fastest is ``sdpa_best``); ``flash_attn_with_kvcache`` when installed.

Timing: each candidate is captured in a CUDA graph of R calls that cycle over enough copies of
the cache to exceed the L2 cache several times (so the bytes come from HBM, and the launch
overhead of the host is out of the figure); the median of the replays divided by R. Each
candidate is checked against the FP64 reference on a short cache before the timings.

    tylopy bench attention_decode --output results/attention_decode.json
    tylopy bench attention_decode --sweep       # schedules and split counts at a few shapes
"""
from __future__ import annotations

import argparse
import math
import sys

BATCHES = (1, 8, 64)
LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
H_Q, H_KV, D = 32, 8, 128
L2_BYTES = 60 << 20


def graph_time_ms(calls, replays=10):
    """Median ms per call of ``calls`` (a list of thunks) captured once in a CUDA graph."""
    import torch
    for c in calls[:2]:
        c()  # compile and allocate outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    del g
    return sorted(times)[len(times) // 2]


def copy_bandwidth_gbs(nbytes=2 << 30):
    """GB/s of a device-to-device copy, bytes read + bytes written."""
    import torch
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = graph_time_ms([lambda: dst.copy_(src)] * 4)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def read_bandwidth_gbs(nbytes=2 << 30):
    """GB/s of a reduction that only reads: torch.sum over ``nbytes`` of random fp32."""
    import torch
    src = torch.randn(nbytes // 4, device="cuda")
    ms = graph_time_ms([lambda: src.sum()] * 4)
    return nbytes / (ms * 1e-3) / 1e9


def make_caches(B, L, copies, dtype, seed=0):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, 1, H_Q, D, generator=g, device="cuda").to(dtype)
    caches = [(torch.randn(B, L, H_KV, D, generator=g, device="cuda").to(dtype),
               torch.randn(B, L, H_KV, D, generator=g, device="cuda").to(dtype)) for _ in range(copies)]
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    return q, caches, lens


def candidates():
    """name -> fn(q (B,1,H,D), k, v (B,L,H_kv,D), lens) -> out (B,1,H,D)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tylopy
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out = {f"tylopy_{m}": (lambda m: lambda q, k, v, lens: tylopy.attention_decode(q, k, v, lens, merge=m))(m)
           for m in ("kernel", "atomic")}

    def backend(b):
        def run(q, k, v, lens):
            with sdpa_kernel(b):
                return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True).transpose(1, 2)
        return run
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        if hasattr(SDPBackend, name):
            out[f"sdpa_{name.lower()}"] = backend(getattr(SDPBackend, name))
    try:
        from flash_attn import flash_attn_with_kvcache
        out["flash_attn_kvcache"] = lambda q, k, v, lens: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
    except ImportError:
        pass
    return out


def check(fn, dtype):
    """Error of ``fn`` against the FP64 reference on a short cache (None if it ran fine)."""
    from tylopy_kernels.attention.decode.launch import reference_decode
    q, caches, lens = make_caches(2, 1000, 1, dtype, seed=1)
    k, v = caches[0]
    out = fn(q, k, v, lens)
    ref, _ = reference_decode(q, k, v, lens)
    err = (out.double() - ref).abs().max().item()
    return err if err <= 2 ** -5 else RuntimeError(f"max error {err:.3e}")


def measure(name, fn, B, L, dtype, copies):
    import torch
    q, caches, lens = make_caches(B, L, copies, dtype)
    calls = [(lambda k, v: lambda: fn(q, k, v, lens))(k, v) for k, v in caches] * max(1, 8 // copies)
    try:
        ms = graph_time_ms(calls)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # a backend that refuses the shape
        torch.cuda.empty_cache()
        return None, str(e).splitlines()[0][:120]
    finally:
        del caches
    return ms, None


def run_table(batches, lengths, dtype, max_gb, names=None):
    import torch
    copy_gbs, read_gbs = copy_bandwidth_gbs(), read_bandwidth_gbs()
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write); fp32 sum: {read_gbs:.0f} GB/s (read)")
    cands = candidates()
    if names:
        cands = {k: v for k, v in cands.items() if any(n in k for n in names)}
    broken = {}
    for name, fn in cands.items():
        try:
            res = check(fn, dtype)
        except Exception as e:  # noqa: BLE001 - a backend that cannot run this at all
            res = e
        if isinstance(res, Exception):
            broken[name] = str(res).splitlines()[0][:120]
            print(f"{name}: skipped ({broken[name]})")
    rows = []
    for B in batches:
        for L in lengths:
            kv_bytes = 2 * B * L * H_KV * D * 2
            if kv_bytes > max_gb * 1e9:
                continue
            copies = max(1, min(16, math.ceil(4 * L2_BYTES / kv_bytes)))
            row = dict(batch=B, cache=L, kv_bytes=kv_bytes, copy_gbs=copy_gbs, read_gbs=read_gbs)
            for name, fn in cands.items():
                if name in broken or (name == "sdpa_math" and kv_bytes * H_Q // H_KV > 20e9):
                    continue
                ms, err = measure(name, fn, B, L, dtype, copies)
                if ms is None:
                    row[f"{name}_error"] = err
                    continue
                row[f"{name}_us"] = ms * 1e3
                row[f"{name}_gbs"] = kv_bytes / (ms * 1e-3) / 1e9
            sdpa = {k[:-3]: v for k, v in row.items() if k.startswith("sdpa_") and k.endswith("_us")}
            if sdpa:
                best = min(sdpa, key=sdpa.get)
                row["sdpa_best"], row["sdpa_best_us"] = best, sdpa[best]
            ours = {k[:-3]: v for k, v in row.items() if k.startswith("tylopy_") and k.endswith("_us")}
            if ours:
                best = min(ours, key=ours.get)
                row["tylopy_best"], row["tylopy_best_us"] = best, ours[best]
                row["frac_copy"] = kv_bytes / (ours[best] * 1e-6) / 1e9 / copy_gbs
                row["frac_read"] = kv_bytes / (ours[best] * 1e-6) / 1e9 / read_gbs
                if sdpa:
                    row["speedup_vs_sdpa_best"] = row["sdpa_best_us"] / ours[best]
            rows.append(row)
            print(_line(row), flush=True)
            torch.cuda.empty_cache()
    return dict(copy_gbs=copy_gbs, read_gbs=read_gbs, rows=rows, broken=broken, shapes=dict(h_q=H_Q, h_kv=H_KV, head_dim=D, n_q=1))


def _line(row):
    parts = [f"B={row['batch']:<3d} L={row['cache']:<7d}"]
    for k, v in row.items():
        if k.endswith("_us") and not k.startswith(("sdpa_best", "tylopy_best")):
            parts.append(f"{k[:-3]} {v:8.1f} us ({row[k[:-3] + '_gbs']:6.0f} GB/s)")
    if "frac_copy" in row:
        parts.append(f"| best/copy {row['frac_copy']:.2f} best/read {row['frac_read']:.2f}")
    if "speedup_vs_sdpa_best" in row:
        parts.append(f"x{row['speedup_vs_sdpa_best']:.2f} vs {row['sdpa_best']}")
    return "  ".join(parts)


SWEEP_SHAPES = ((1, 8192), (1, 131072), (8, 32768), (64, 8192))
SWEEP_SCHEDULES = [dict(WARPS=w, WARP_KEYS=wk, STAGES=st, Q_SMEM=True)
                   for w in (4, 8) for wk in (16, 32) for st in (2, 3, 4, 5)]


def run_sweep(dtype):
    """Every schedule of SWEEP_SCHEDULES that fits, at the automatic split count and at 2x / 0.5x."""
    import torch

    import tylopy

    from tylopy_kernels.attention.decode import kernel as kd
    from tylopy_kernels.attention.decode.launch import SMEM_PER_SM, DecodeShape, plan_schedule
    rows = []
    for B, L in SWEEP_SHAPES:
        kv_bytes = 2 * B * L * H_KV * D * 2
        copies = max(1, min(16, math.ceil(4 * L2_BYTES / kv_bytes)))
        for sched in SWEEP_SCHEDULES:
            if kd.smem_bytes(HEAD_DIM=D, **sched) > SMEM_PER_SM:
                continue
            auto = plan_schedule(DecodeShape(B, 1, H_Q, H_KV, D, L, 0),
                                 torch.cuda.get_device_properties(0).multi_processor_count, schedule=sched)[2]
            for splits in sorted({auto, max(1, auto // 2), auto * 2}):
                for merge in ("kernel", "atomic"):
                    fn = (lambda s, sp, m: lambda q, k, v, lens: tylopy.attention_decode(
                        q, k, v, lens, num_splits=sp, merge=m, schedule=s))(sched, splits, merge)
                    ms, err = measure("sweep", fn, B, L, dtype, copies)
                    row = dict(batch=B, cache=L, splits=splits, merge=merge, **sched, us=ms and ms * 1e3,
                               gbs=ms and kv_bytes / (ms * 1e-3) / 1e9, error=err)
                    rows.append(row)
                    print(row, flush=True)
    return dict(sweep=rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tylopy bench attention_decode", description=__doc__.split("\n")[0])
    p.add_argument("--output", help="JSON path (default results/attention_decode-<device>-<date>.json)")
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    p.add_argument("--max-gb", type=float, default=40.0, help="skip shapes whose K/V exceed this many GB")
    p.add_argument("--only", nargs="*", help="candidates whose name contains one of these")
    p.add_argument("--sweep", action="store_true", help="schedules and split counts at a few shapes")
    args = p.parse_args(argv)
    import torch

    from tylopy.benchmarking import write_results
    if not torch.cuda.is_available():
        print("tylopy bench attention_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    data = run_sweep(dtype) if args.sweep else run_table(args.batches, args.lengths, dtype, args.max_gb, args.only)
    write_results("attention_decode" + ("-sweep" if args.sweep else ""), data, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
