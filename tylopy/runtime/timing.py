"""CUDA-event timing, shared by the autotuner and the benchmarks."""
from __future__ import annotations


def events_median_ms(fn, warmup_ms: float = 100, rep_ms: float = 400) -> float:
    """Median milliseconds of ``fn()`` from CUDA events after warm-up (the autotuner's timer too)."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    for _ in range(max(1, int(warmup_ms / once))):
        fn()
    times = []
    for _ in range(max(5, int(rep_ms / once))):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
