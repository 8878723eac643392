"""Rules for launch arguments that the GPU launcher (runtime/launch.py) and the emulator
(emulate/launch.py) share, so both refuse the same tensors with the same message."""
from __future__ import annotations

from ..errors import LaunchValueError

STRIDED_MARK = "_tylopy_strided"


def strided(t):
    """Mark tensor ``t`` as addressed by the kernel through strides passed alongside it, so a ``ty.ptr``
    parameter accepts it whatever its strides (a stride-0 broadcast, a transposed view). Marks the
    tensor object itself and returns it: mark a view made for the launch (``x.expand(...)``)."""
    setattr(t, STRIDED_MARK, True)
    return t


def strided_last_dim_error(kernel: str, name: str, x):
    """None when ``x`` may go to a ``ty.ptr`` parameter; else the error that says how to fix it."""
    if not x.dim() or x.shape[-1] <= 1 or x.stride(-1) == 1 or getattr(x, STRIDED_MARK, False):
        return None
    return LaunchValueError(
        f"{kernel}: argument {name!r} expects a tensor whose last dimension is contiguous (stride 1): a ty.ptr "
        f"parameter gets only the address of the first element and reads the last dimension's elements as "
        f"consecutive, but got shape {tuple(x.shape)} with strides {tuple(x.stride())}; pass {name}.contiguous(), "
        f"declare the parameter ty.tensor(...) to receive the strides, or, if the kernel takes the strides as "
        f"arguments, pass ty.strided({name})")
