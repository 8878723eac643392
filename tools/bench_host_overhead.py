"""Host cost per call of a tylopy launch against the floors around it, in one process (needs a GPU).

    python tools/bench_host_overhead.py [--iters 20000] [--output host.json] [--profile ROW]

``--profile ROW[,ROW...]`` prints where the time of each row whose name contains one of them goes
(cProfile).

Rows (microseconds of host time per call, median of repeats; the GPU keeps up with these tiny
launches, so the time is what the Python call costs):

* ``raw cuLaunchKernel``: the same CUfunction launched through cuda-python with a prepacked
  parameter array: the floor any Python launcher pays;
* ``tylopy launcher``: ``CompiledKernel.launcher().launch(grid, args)`` (checks and packing);
* ``tylopy kernel[grid](...)``: the full path (specialization lookup and guards included);
* ``tylopy prepared launch``: ``kernel[grid].prepare(...)`` once, then per call ``set`` one
  pointer and ``launch()`` (a launch whose other arguments stay packed);
* ``tylopy tensor args``: a kernel with two 2-D ``ty.tensor`` parameters;
* ``torch.add(out=)``: a torch op of the same size;
* ``tylopy.attention`` and ``F.scaled_dot_product_attention`` on (1, 1, 128, 64) bf16, and
  tylopy.attention with a new query buffer each call (its tensor map encoded every time);
* ``tylopy on cuda:1`` when a second device exists (the context switch per launch).

Targets: a small launch at most 8 us, ``tylopy.attention`` at most 15 us.
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import tylopy as ty
from tylopy.runtime import driver as drv
from tylopy.runtime.tensormap import CACHE_ENTRIES
from tylopy_kernels.examples.vector_add import vector_add

N = 4096


@ty.kernel(threads=128)
def copy_rows(src: ty.tensor(2), dst: ty.tensor(2)):
    r = ty.block_idx()
    for c in range(ty.thread_idx(), src.shape[1], 128):
        dst[r, c] = src[r, c]


def host_us(fn, iters: int, repeats: int = 7, sync_every: int = 512) -> float:
    """Median over repeats of the host time per call (a sync every ``sync_every`` calls keeps the
    launch queue short; its time is not counted)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        total, done = 0.0, 0
        while done < iters:
            n = min(sync_every, iters - done)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            total += time.perf_counter() - t0
            torch.cuda.synchronize()
            done += n
        runs.append(total / iters * 1e6)
    return statistics.median(runs)


def raw_launch(kernel, grid, args):
    """A prepacked cuLaunchKernel of ``kernel``'s function: the driver floor for the same work."""
    launcher = kernel.compile().launcher()
    device = torch.cuda.current_device()
    f = launcher.function(device)
    values = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int32(a) for a in args]
    ptrs = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    address = ctypes.addressof(ptrs)
    d = drv.driver()
    stream = d.CUstream(torch.cuda.current_stream().cuda_stream)
    threads, smem = launcher.ck.threads, launcher.ck.dynamic_shared_bytes

    def launch():
        d.cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, smem, stream, address, 0)
    launch.keep = (values, ptrs)  # the parameter memory must outlive the launches
    return launch


def profile(rows, pattern: str, calls: int = 20000) -> None:
    import cProfile
    import pstats
    for name, fn in rows.items():
        if any(part and part in name for part in pattern.split(",")):
            host_us(fn, 200, repeats=1)
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(calls):
                fn()
            pr.disable()
            torch.cuda.synchronize()
            print(f"-- profile of {name!r}, {calls} calls")
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--output", help="write the results as JSON here")
    p.add_argument("--profile", help="print a cProfile of the rows whose name contains this")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_host_overhead: needs a CUDA GPU", file=sys.stderr)
        return 2
    cc = torch.cuda.get_device_capability()
    kernel = vector_add if cc == (9, 0) else vector_add.with_arch("sm_80")
    x, y, out = (torch.randn(N, device="cuda") for _ in range(3))
    grid = (N + 255) // 256
    ck = kernel.compile()
    launcher = ck.launcher()
    prepared = kernel[(grid,)].prepare(x, y, out, N)
    q = torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16)
    # more query buffers than the tensor-map cache holds maps: each call encodes its Q map
    fresh_q = itertools.cycle([torch.randn_like(q) for _ in range(2 * CACHE_ENTRIES)])
    k, v = torch.randn_like(q), torch.randn_like(q)
    src = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy = copy_rows if cc == (9, 0) else copy_rows.with_arch("sm_80")
    rows = {
        "raw cuLaunchKernel": raw_launch(kernel, grid, (x, y, out, N)),
        "tylopy launcher": lambda: launcher.launch((grid,), (x, y, out, N)),
        "tylopy kernel[grid](...)": lambda: kernel[(grid,)](x, y, out, N),
        "tylopy prepared launch (set x, launch)": lambda: (prepared.set(0, x), prepared.launch()),
        "tylopy tensor args": lambda: copy[(64,)](src, dst),
        "torch.add(out=)": lambda: torch.add(x, y, out=out),
        "tylopy.attention (1,1,128,64) bf16": lambda: ty.attention(q, k, v),
        "tylopy.attention, a new q each call": lambda: ty.attention(next(fresh_q), k, v),
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    if torch.cuda.device_count() > 1:
        x1, y1, o1 = (t.to("cuda:1") for t in (x, y, out))
        rows["tylopy on cuda:1 (context switch)"] = lambda: kernel[(grid,)](x1, y1, o1, N)
    results = {}
    if args.profile:
        profile(rows, args.profile)
    for name, fn in rows.items():
        try:
            results[name] = round(host_us(fn, args.iters), 2)
        except Exception as e:  # noqa: BLE001 - report the row, keep measuring the others
            results[name] = f"failed: {type(e).__name__}: {e}"
    torch.testing.assert_close(out, x + y)
    width = max(map(len, results))
    print(f"host time per call, {torch.cuda.get_device_name()} (median of 7 x {args.iters} calls)")
    for name, us in results.items():
        print(f"  {name:<{width}}  {us if isinstance(us, str) else f'{us:7.2f} us'}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "iters": args.iters, "us_per_call": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
