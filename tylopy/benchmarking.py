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


def parse_schedule(text: str) -> dict:
    """"K=V,K=V" -> {K: V} with ints, floats, True/False/None converted ("EXPONENT=shared,BLOCK_N=64"):
    the ``--schedule`` / ``--variant`` argument of the benchmarks."""
    out = {}
    for item in (t for t in text.split(",") if t):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"a schedule change is KEY=VALUE (e.g. EXPONENT=shared), but got {item!r}")
        out[key.strip()] = _value(value.strip())
    return out


def _value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"True": True, "False": False, "None": None}.get(text, text)
