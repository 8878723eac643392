"""One checked door to cuda.bindings.driver, and the CUDA context a launch runs in.

Every call goes through ``call``, whose error names the call, the decoded CUresult and the
kernel. On a machine without the driver the first call raises ``NoDriverError``.

Contexts: a kernel's module is loaded into the primary context of the device its tensors live
on (the context torch uses), and a launch makes that context current first (``enter_device``)
and restores the previous one after it (``leave_device``): a tensor on ``cuda:1`` launches in
device 1's context while ``cuda:0`` stays torch's current device. With one visible device the
context is set once per thread; with several it is checked on every launch (one
``cuCtxGetCurrent``, two ``cuCtxSetCurrent`` when it switches). The torch hooks
(``current_device``, ``current_stream``) and ``driver`` are module attributes, so tests can
replace them.
"""
from __future__ import annotations

import contextlib
import functools
import threading

from ..errors import DriverError, NoDriverError


@functools.lru_cache(maxsize=None)
def _cuda_bindings():
    from cuda.bindings import driver as d  # imports fine without a driver; the first call fails
    return d


def driver():
    return _cuda_bindings()


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
        if isinstance(e, RuntimeError) and str(e).startswith("Failed to dlopen libcuda"):  # cuda-bindings 13.0
            raise NoDriverError(str(e)) from None
        raise
    err = out[0]
    if err != d.CUresult.CUDA_SUCCESS:
        raise DriverError(name, _result_name(d, err), kernel)
    rest = out[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


# -- torch's view of the devices (replaceable in tests) ------------------------------------------------

def current_device() -> int:
    import torch
    return torch.cuda.current_device()


def current_stream(device: int) -> int:
    """The raw handle of torch's current stream on ``device``."""
    import torch
    return torch._C._cuda_getCurrentRawStream(device)


@functools.lru_cache(maxsize=None)
def device_count() -> int:
    return int(call("cuDeviceGetCount"))


# -- contexts -------------------------------------------------------------------------------------

_primary: dict[int, object] = {}  # device index -> its primary CUcontext (retained once)
_thread = threading.local()


def primary_context(device: int):
    """The primary context of ``device`` (the one torch uses), created if torch has not yet."""
    ctx = _primary.get(device)
    if ctx is None:
        try:
            import torch
            torch.cuda.init()
            with torch.cuda.device(device):
                torch.cuda.current_stream()  # torch creates the primary context it will use
        except Exception:  # noqa: BLE001 - without torch the driver's primary context is the same one
            pass
        call("cuInit", 0)
        dev = call("cuDeviceGet", device)
        ctx = _primary[device] = call("cuDevicePrimaryCtxRetain", dev)
    return ctx


_single: list = []  # [True] when the process sees exactly one device (decided at the first launch)
_one = [False]  # the same as a plain flag for the launch path


def enter_device(device: int):
    """Make ``device``'s primary context current for a launch. Returns the context to restore
    after it (``leave_device``), or None when nothing changed: a launch on another device's
    tensors must not change which device torch sees as current."""
    if _one[0] and getattr(_thread, "device", None) == device:
        return None  # one device, and this thread already made its context current
    ctx = primary_context(device)
    current = call("cuCtxGetCurrent")
    _thread.device = device
    if current is not None and int(current) == int(ctx):
        _one_device()
        return None
    call("cuCtxSetCurrent", ctx)
    return current if current is not None and int(current) != 0 else None  # no context before: keep ours


def leave_device(previous) -> None:
    if previous is not None:
        call("cuCtxSetCurrent", previous)


def use_device(device: int) -> None:
    """Make ``device``'s primary context current on this thread and leave it current."""
    enter_device(device)


def _current_is(device: int) -> bool:
    ctx = _primary.get(device)
    return ctx is not None and int(call("cuCtxGetCurrent") or 0) == int(ctx)


def _one_device() -> bool:
    if not _single:
        try:
            _single.append(device_count() == 1)
        except Exception:  # noqa: BLE001 - count unknown: check the context every time
            _single.append(False)
        _one[0] = _single[0]
    return _single[0]


def forget_contexts() -> None:
    """Drop what this module remembers about contexts (tests that swap the driver call it)."""
    _primary.clear()
    _single.clear()
    _one[0] = False
    device_count.cache_clear()
    device_attribute.cache_clear()
    if hasattr(_thread, "device"):
        del _thread.device


def ensure_context(device_index: int) -> None:
    """Older name of ``use_device`` (tensor maps and loading call it before driver work)."""
    use_device(device_index)


# -- device properties ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def device_attribute(device_index: int, attr_name: str) -> int:
    d = driver()
    dev = call("cuDeviceGet", device_index)
    return call("cuDeviceGetAttribute", getattr(d.CUdevice_attribute, attr_name), dev)


def compute_capability(device_index: int) -> tuple[int, int]:
    return (device_attribute(device_index, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
            device_attribute(device_index, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))


# -- the seam for host-path tests ---------------------------------------------------------------------

@contextlib.contextmanager
def substitute(fake, devices: int | None = None, stream_base: int = 7000):
    """Run the block against ``fake`` instead of cuda.bindings.driver, without torch's CUDA:
    devices are numbered by the tensors' ``get_device()``, device 0 is current, the current stream
    of device d is ``stream_base + d``, and primary contexts come from ``fake`` alone. Everything
    remembered about contexts is dropped on entry and exit. ``tylopy.testing.FakeDriver`` is such
    a fake; ``tylopy.testing.fake_driver()`` wraps both."""
    module = globals()
    saved = {name: module[name] for name in ("driver", "current_device", "current_stream", "primary_context")}

    def primary(device):
        ctx = _primary.get(device)
        if ctx is None:
            ctx = _primary[device] = call("cuDevicePrimaryCtxRetain", call("cuDeviceGet", device))
        return ctx
    module.update(driver=lambda: fake, current_device=lambda: 0,
                  current_stream=lambda device: stream_base + device, primary_context=primary)
    forget_contexts()
    try:
        yield fake
    finally:
        module.update(saved)
        forget_contexts()
