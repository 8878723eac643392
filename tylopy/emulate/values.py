"""How IR values live in the emulator: numpy arrays over the 32 lanes of a warp.

Each IR scalar type maps to one numpy dtype. ``bf16`` has no numpy type, so its values are
their 16 raw bits (``uint16``); ``b32`` words (packed pairs of 16-bit floats) are ``uint32``.
Pointers are addresses: ``uint32`` offsets into the CTA's shared window for shared pointers,
``uint64`` fake device addresses for global and generic ones.

The arithmetic itself is ``tylopy.semantics.scalar``, shared with the tile library's
reference mode.
"""
from __future__ import annotations

import numpy as np

from ..ir.types import PointerType, ScalarType, TensorMapType, Type
from ..semantics.scalar import (bf16_to_f32, ex2_approx_ftz, f16_to_f32, f32_to_bf16, f32_to_f16,  # noqa: F401
                                f32_to_half, fma_f32, ftz, half_to_f32, lg2_approx_ftz, rcp_rn, rsqrt_approx_ftz,
                                scalar_dtype, signed_of, unsigned_of)

WARP = 32
LANES = np.arange(WARP, dtype=np.int32)


SHARED_WINDOW = 0x7F00_0000_0000  # generic addresses of shared memory start here (cvta.shared)
TENSORMAP_BASE = 0x7E00_0000_0000  # fake param-space addresses of tensor-map arguments


def np_dtype(t: Type) -> np.dtype:
    """The numpy dtype that holds one lane's value of IR type ``t``."""
    if isinstance(t, ScalarType):
        return scalar_dtype(t)
    if isinstance(t, PointerType):
        return np.dtype(np.uint32 if t.space == "shared" else np.uint64)
    if isinstance(t, TensorMapType):
        return np.dtype(np.uint64)
    raise TypeError(f"the emulator has no representation for IR type {t}")


def splat(value, t: Type) -> np.ndarray:
    """A read-only array with ``value`` in every lane (constants, parameters)."""
    dt = np_dtype(t)
    if isinstance(t, ScalarType) and t.name == "bf16":
        arr = np.full(WARP, f32_to_bf16(np.array([value], dtype=np.float32))[0], dtype=np.uint16)
    elif isinstance(t, ScalarType) and t.is_int and not t.is_bool:
        arr = np.full(WARP, int(value) & ((1 << t.bits) - 1), dtype=unsigned_of(dt)).view(dt)
    else:
        arr = np.full(WARP, value, dtype=dt)
    arr.flags.writeable = False
    return arr


# -- wgmma results not yet waited on -----------------------------------------------------------------

class Pending:
    """A wgmma result that belongs to a commit group the warp has not waited out yet.

    ``group`` is the warp's commit-group index the wgmma was issued into; ``op`` the wgmma.
    Only wgmma (accumulator chaining), wgmma_wait, fence_operand and region plumbing may
    touch it; any other reader is a protocol error.
    """

    __slots__ = ("value", "group", "op")

    def __init__(self, value: np.ndarray, group: int, op):
        self.value, self.group, self.op = value, group, op


def merge(cond: np.ndarray, a, b):
    """np.where over lanes that also carries the pending state of wgmma results."""
    if type(a) is Pending or type(b) is Pending:
        if a is b:
            return a
        av = a.value if type(a) is Pending else a
        bv = b.value if type(b) is Pending else b
        pend = a if type(a) is Pending else b
        if type(a) is Pending and type(b) is Pending and b.group > a.group:
            pend = b
        return Pending(np.where(cond, av, bv), pend.group, pend.op)
    return np.where(cond, a, b)
