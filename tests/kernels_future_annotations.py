"""Kernels defined under ``from __future__ import annotations``: every annotation is a string that
the decorator evaluates where the kernel was defined (module globals, closed-over names)."""
from __future__ import annotations

import tylopy as ty

ROWS = 8


@ty.kernel(threads=32)
def copy_rows(src: ty.tensor(2), dst: ty.tensor(2), SCALE: ty.constexpr = 1):
    r = ty.block_idx()
    for c in range(ty.thread_idx(), src.shape[1], 32):
        dst[r, c] = src[r, c] * SCALE


def make_scaled(dtype):
    """A factory: the annotation names ``dtype``, a closed-over variable."""
    @ty.kernel(threads=32)
    def scaled(x: ty.ptr(dtype), n: ty.i32):
        i = ty.thread_idx()
        if i < n:
            x[i] = x[i] + x[i]
    return scaled
