"""What launchers ask of a CUDA device, asked once per device: its SM count (persistent grids,
split counts) and its L2 size (tile orders that keep K/V resident)."""
from __future__ import annotations

import functools


def _index(device) -> int:
    import torch
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _properties(index: int):
    import torch
    return torch.cuda.get_device_properties(index)


def sm_count(device=None) -> int:
    """Streaming multiprocessors of ``device`` (a torch device, an index, or None: the current one)."""
    return _properties(_index(device)).multi_processor_count


def l2_bytes(device=None) -> int:
    """L2 cache size of ``device`` in bytes."""
    return getattr(_properties(_index(device)), "L2_cache_size", 50 << 20)
