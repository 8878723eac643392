"""Parameter memory kept by one launch site between its launches (``kernel[grid].repeat``).

A launch checks and packs every argument: for a kernel of thirty parameters, eleven of them
tensors, that is most of its host time. A site that launches the same kernel again and again
(an attention backward, a variant forward) passes mostly the same values each time: the same
placeholder tensors, sizes and tensor maps. ``KeptArguments.launch(args)`` compares each argument
with what its slot holds and checks and packs only those that differ.

The comparison is by packed value, not by object: a tensor matches when its address, shape,
strides, dtype and device do (the bytes its slots would get are then the same, whichever tensor
object carries them); a Python int, float or bool when its type and value do; a tensor map when
it is the same object (its own 128 bytes are the parameter, so the site keeps it alive). Nothing
else is kept: a tensor freed after its launch is not held by the site.
"""
from __future__ import annotations

from .launch import _Slots, check_grid

_SCALARS = (int, float, bool)
_UNSET = object()


class KeptArguments:
    """The parameter memory of one (specialization, grid, device, thread) launch site."""

    __slots__ = ("launcher", "grid", "slots", "keys", "device")

    def __init__(self, launcher, grid):
        self.launcher = launcher
        self.grid = check_grid(launcher.ck.name, grid)
        self.slots = _Slots(launcher._types)
        self.keys = [_UNSET] * len(launcher.packers)
        self.device = None

    def launch(self, args, stream=None) -> None:
        import torch
        launcher = self.launcher
        packers = launcher.packers
        if len(args) != len(packers):
            launcher.pack(args)  # raises the argument-count error
        keys, values, ptrs = self.keys, self.slots.values, self.slots.ptrs
        device = self.device
        Tensor = torch.Tensor
        for i, x in enumerate(args):
            t = type(x)
            if t in _SCALARS:
                key = (t, x)
            elif isinstance(x, Tensor):
                key = (x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device())
            else:
                key = x  # a tensor map: by identity
            old = keys[i]
            if old is key or (type(old) is tuple and old == key):
                continue
            try:
                device = packers[i](x, values, ptrs, device)
            except BaseException:
                keys[i] = _UNSET  # its slots may be half written: packed again next time
                raise
            keys[i] = key
        self.device = device
        if device is None:  # no tensor or map pins it: the current device, as a plain launch takes
            from . import driver as drv
            device = drv.current_device()
        gx, gy, gz = self.grid
        if gx and gy and gz:
            launcher._send(gx, gy, gz, self.slots, device, stream, prepared=True)


__all__ = ["KeptArguments"]
