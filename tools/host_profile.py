"""Where the host time of an attention call goes, on an H100/H200: for each case of
``tylopy bench attention_variants`` at one (D, N), the host's time to enqueue one call (calls issued
back to back with the GPU kept busy, so a time near the kernel's means the GPU waits for the host)
and a cProfile of those calls, printed by own and by cumulative time and saved as ``.pstats``.

    python tools/host_profile.py --d 128 --n 1024 --variants causal document_varlen --libraries tylopy fa3_cute --out DIR
    python tools/host_profile.py --d 128 --n 1024 --variants causal --kernels --top 0   # each kernel's time
    ncu -k regex:attention_bwd_sm90 ... python tools/host_profile.py --variants causal --direction bwd --calls 3

Read a saved profile with ``python -m pstats DIR/<variant>-<dir>.pstats``.
"""
import argparse
import cProfile
import os
import pstats
import time

import torch

from tylopy_kernels.attention.bench import variant_cases as cases
from tylopy_kernels.attention.bench import variant_libs as libs


def _no_grad(fn):
    def call():
        with torch.no_grad():
            return fn()
    return call


def calls(variants, d, n, libraries=("tylopy",)):
    """(variant, library, direction, call) of each case, each call run once (compiled, planned)
    first; a library that does not build a case is reported and skipped."""
    for variant in variants:
        spec = cases.make_spec(variant, d, n)
        x = cases.make_inputs(spec, device="cuda")
        for library in libraries:
            try:
                run = libs.build(library, spec, x)
            except Exception as e:  # noqa: BLE001
                print(f"{variant} {library}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            for direction in ("fwd", "bwd"):
                call = run.backward_fn() if direction == "bwd" else _no_grad(run.forward)
                call()
                torch.cuda.synchronize()
                yield variant, library, direction, call


def host_ms(call, count=10):
    """The host's time to enqueue one call, behind ~100 ms of GPU sleep: the launch queue never
    fills, so nothing but the host's own work is timed."""
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    t0 = time.perf_counter()
    for _ in range(count):
        call()
    host = (time.perf_counter() - t0) / count * 1e3
    torch.cuda.synchronize()
    return host


def back_to_back_ms(call, count=50):
    """GPU time per call of ``count`` calls issued back to back (gaps the host leaves included)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(count):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / count


def kernel_ms(call, count=10, each=None):
    """The GPU kernels' own time per call (torch.profiler: the sum of every kernel and copy); with
    ``each`` (a list), (name, ms per call, launches per call) of every kernel is appended to it."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(count):
            call()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if "cuda" in str(e.device_type).lower()]
    if each is not None:
        each += [(e.key, e.device_time_total / count / 1e3, e.count / count)
                 for e in sorted(events, key=lambda e: -e.device_time_total)]
    return sum(e.device_time_total for e in events) / count / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--variants", nargs="+", default=list(cases.VARIANTS))
    ap.add_argument("--libraries", nargs="+", default=["tylopy"], help="tylopy, fa3_cute, flex")
    ap.add_argument("--out", default=None, help="folder for the .pstats files")
    ap.add_argument("--top", type=int, default=25, help="profile lines to print; 0: no cProfile")
    ap.add_argument("--kernels", action="store_true", help="print each kernel's own time per call")
    ap.add_argument("--direction", choices=("fwd", "bwd"), help="only this direction")
    ap.add_argument("--calls", type=int, default=0,
                    help="only run each case this many times (no timing, no profilers: for ncu)")
    a = ap.parse_args()
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    for variant, library, direction, call in calls(a.variants, a.d, a.n, a.libraries):
        if a.direction and direction != a.direction:
            continue
        if a.calls:
            for _ in range(a.calls):
                call()
            torch.cuda.synchronize()
            continue
        each = []
        host, loop, gpu = host_ms(call), back_to_back_ms(call), kernel_ms(call, each=each)
        print(f"host {variant} D={a.d} N={a.n} {direction} {library}: host {host:.3f} ms per call, "
              f"back to back {loop:.3f} ms, kernels {gpu:.3f} ms", flush=True)
        for name, ms, launches in each if a.kernels else ():
            print(f"    {ms:8.4f} ms  x{launches:g}  {name[:110]}", flush=True)
        if library != "tylopy" or a.top == 0:
            continue
        p = cProfile.Profile()
        torch.cuda.synchronize()
        p.enable()
        for _ in range(50):
            call()
        p.disable()
        torch.cuda.synchronize()
        if a.out:
            p.dump_stats(os.path.join(a.out, f"{variant}-d{a.d}-n{a.n}-{direction}.pstats"))
        print(f"--- profile {variant} {direction} (50 calls), by own time", flush=True)
        pstats.Stats(p).sort_stats("tottime").print_stats(a.top)
        print(f"--- profile {variant} {direction} (50 calls), by cumulative time", flush=True)
        pstats.Stats(p).sort_stats("cumulative").print_stats(a.top)


if __name__ == "__main__":
    main()
