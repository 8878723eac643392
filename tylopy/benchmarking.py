"""Timing for benchmarks: CUDA-event medians after warm-up (``triton.testing.do_bench`` when
Triton is installed, the same method by hand otherwise)."""
from __future__ import annotations

from tylopy.runtime.timing import events_median_ms


def median_ms(fn, warmup_ms: float = 100, rep_ms: float = 400) -> float:
    """Median milliseconds of ``fn()`` on the current stream."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return events_median_ms(fn, warmup_ms, rep_ms)
    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def write_results(name: str, data: dict, output: str | None = None) -> str:
    """Write a benchmark's JSON with the device, commit, torch version and date beside ``data``.

    Default path: results/<name>-<device>-<date>.json (relative to the working directory).
    """
    import datetime
    import json
    import os
    import subprocess

    import torch
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    device = torch.cuda.get_device_name()
    record = dict(data, device=device, commit=commit, torch=torch.__version__,
                  date=datetime.datetime.now().isoformat(timespec="seconds"))
    out = output or f"results/{name}-{device.replace(' ', '_')}-{datetime.date.today()}.json"
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {out}")
    return out
