"""One checked door to cuda.bindings.driver.

Every call goes through ``call``, whose error names the call, the decoded CUresult and the
kernel. On a machine without the driver the first call raises ``NoDriverError``.
"""
from __future__ import annotations

import functools

from ..errors import DriverError, NoDriverError


@functools.lru_cache(maxsize=None)
def driver():
    from cuda.bindings import driver as d  # imports fine without a driver; the first call fails
    return d


def _result_name(d, err) -> str:
    try:
        res, name = d.cuGetErrorName(err)
        if res == d.CUresult.CUDA_SUCCESS:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - decoding must never hide the original failure
        pass
    return str(err)


def call(name: str, *args, kernel: str | None = None):
    """``driver().<name>(*args)`` with its CUresult checked; returns the remaining outputs."""
    d = driver()
    try:
        out = getattr(d, name)(*args)
    except Exception as e:  # noqa: BLE001
        if type(e).__name__ == "DynamicLibNotFoundError":
            raise NoDriverError(str(e).split(".")[0]) from None
        raise
    err = out[0]
    if err != d.CUresult.CUDA_SUCCESS:
        raise DriverError(name, _result_name(d, err), kernel)
    rest = out[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


_context_ready: set[int] = set()


def ensure_context(device_index: int) -> None:
    """Make torch's primary context for ``device_index`` current on this thread."""
    if device_index in _context_ready:
        return
    import torch
    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.cuda.current_stream()  # forces torch to create the primary context
    call("cuInit", 0)
    ctx = call("cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        dev = call("cuDeviceGet", device_index)
        ctx = call("cuDevicePrimaryCtxRetain", dev)
        call("cuCtxSetCurrent", ctx)
    _context_ready.add(device_index)


@functools.lru_cache(maxsize=None)
def device_attribute(device_index: int, attr_name: str) -> int:
    d = driver()
    dev = call("cuDeviceGet", device_index)
    return call("cuDeviceGetAttribute", getattr(d.CUdevice_attribute, attr_name), dev)


def compute_capability(device_index: int) -> tuple[int, int]:
    return (device_attribute(device_index, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
            device_attribute(device_index, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))
