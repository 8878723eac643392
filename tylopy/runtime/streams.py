"""Which CUDA stream a launch goes to, checked: ``stream=None`` (torch's current stream of the
launch's device), a ``torch.cuda.Stream`` (or ``torch.cuda.ExternalStream``) on that device, or
the int handle of a stream tylopy knows: 0 (the legacy default stream), 1 and 2 (the driver's
``CU_STREAM_LEGACY`` and ``CU_STREAM_PER_THREAD``), torch's current stream of the device, or the
handle of a ``torch.cuda.Stream`` passed to an earlier launch. Anything else is refused with an
error naming ``stream``: a wrong int handle would be dereferenced by the driver (a crash, or work
queued on a stream nobody waits for). A foreign handle is vouched for by wrapping it:
``torch.cuda.ExternalStream(handle)``.
"""
from __future__ import annotations

from ..errors import LaunchTypeError, LaunchValueError
from . import driver as drv

SPECIAL_HANDLES = frozenset({0, 1, 2})  # default, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
_known: dict[int, int] = {}  # handle -> device, of torch streams passed before (bounded below)
_KNOWN_LIMIT = 4096


def _torch_stream_class():
    try:
        import torch
        return torch.cuda.Stream
    except (ImportError, AttributeError):  # pragma: no cover - torch is a dependency
        return None


def stream_handle(kernel: str, stream, device: int) -> int:
    """The raw handle to launch on; ``LaunchTypeError``/``LaunchValueError`` naming ``stream`` otherwise."""
    if stream is None:
        return drv.current_stream(device)
    cls = _torch_stream_class()
    if cls is not None and isinstance(stream, cls):
        sdev = getattr(stream, "device_index", None)
        if sdev is None:
            sdev = getattr(getattr(stream, "device", None), "index", device)
        if sdev is not None and sdev != device:
            raise LaunchValueError(f"{kernel}: stream expects a stream of the launch's device cuda:{device}, but got "
                                   f"{stream!r} on cuda:{sdev}")
        handle = int(stream.cuda_stream)
        if handle not in _known:
            if len(_known) >= _KNOWN_LIMIT:
                _known.clear()
            _known[handle] = device
        return handle
    if type(stream) is int or (isinstance(stream, int) and not isinstance(stream, bool)):
        handle = int(stream)
        if handle in SPECIAL_HANDLES:
            return handle
        if handle == drv.current_stream(device):
            return handle
        known = _known.get(handle)
        if known == device:
            return handle
        if known is not None:
            raise LaunchValueError(f"{kernel}: stream expects a stream of the launch's device cuda:{device}, but "
                                   f"handle {handle:#x} is a stream of cuda:{known}")
        raise LaunchValueError(
            f"{kernel}: stream expects None, a torch.cuda.Stream, or the int handle of a known stream (0, 1, 2, torch's "
            f"current stream of cuda:{device}, or a torch.cuda.Stream passed to an earlier launch), but got the "
            f"unknown handle {handle:#x}; pass the torch.cuda.Stream itself, or wrap a foreign handle as "
            f"torch.cuda.ExternalStream({handle:#x})")
    raise LaunchTypeError(f"{kernel}: stream expects None, a torch.cuda.Stream or an int stream handle, but got "
                          f"{type(stream).__name__} {stream!r}")
