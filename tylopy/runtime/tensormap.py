"""CUtensorMap descriptors for TMA, built on the host with cuTensorMapEncodeTiled.

The rules the driver enforces are checked here first, so a bad shape gets a ValueError that
names the argument instead of CUDA_ERROR_INVALID_VALUE (constraints from the driver API docs:
16-byte aligned base and strides, box dims 1..256, inner box ≤ swizzle span, dims ≤ 2**32).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import LaunchValueError
from . import driver as drv

SWIZZLE_BYTES = {0: 0, 32: 1, 64: 2, 128: 3}
DTYPE_CODES = {"u8": 0, "u16": 1, "u32": 2, "i32": 3, "u64": 4, "i64": 5, "f16": 6, "f32": 7, "f64": 8, "bf16": 9}


def validate(dtype_bytes: int, address: int, dims, strides_bytes, box, swizzle: int) -> None:
    """Raise LaunchValueError naming the first field the driver would reject."""
    rank = len(dims)
    if not 1 <= rank <= 5:
        raise LaunchValueError(f"tensor map dims expects rank 1..5, but got {rank}")
    if len(strides_bytes) != rank - 1:
        raise LaunchValueError(f"tensor map strides expects {rank - 1} entries (innermost stride is the element), "
                               f"but got {len(strides_bytes)}")
    if len(box) != rank:
        raise LaunchValueError(f"tensor map box expects {rank} entries, but got {len(box)}")
    if address % 16:
        raise LaunchValueError(f"tensor map base address expects 16-byte alignment, but got {address:#x}")
    for i, n in enumerate(dims):
        if not 1 <= n <= 2**32:
            raise LaunchValueError(f"tensor map dims[{i}] expects 1..2**32, but got {n}")
    for i, s in enumerate(strides_bytes):
        if s % 16 or not 0 < s < 2**40:
            raise LaunchValueError(f"tensor map strides[{i}] expects a positive multiple of 16 bytes below 2**40, "
                                   f"but got {s}")
    for i, b in enumerate(box):
        if not 1 <= b <= 256:
            raise LaunchValueError(f"tensor map box[{i}] expects 1..256, but got {b}")
    if (box[0] * dtype_bytes) % 16:
        raise LaunchValueError(f"tensor map box[0] expects a multiple of 16 bytes, but got {box[0] * dtype_bytes}")
    if swizzle not in SWIZZLE_BYTES:
        raise LaunchValueError(f"tensor map swizzle expects 0, 32, 64 or 128, but got {swizzle}")
    if swizzle and box[0] * dtype_bytes > swizzle:
        raise LaunchValueError(f"tensor map box[0] spans {box[0] * dtype_bytes} bytes, more than the {swizzle}-byte "
                               "swizzle allows")


@dataclass
class TensorMap:
    """A 128-byte CUtensorMap and what it describes; pass it for a ``ty.tensormap`` parameter."""

    handle: object  # cuda.bindings.driver.CUtensorMap
    device: int
    dims: tuple
    box: tuple
    swizzle: int
    keepalive: object = None  # the tensor whose memory the map points at

    def getPtr(self) -> int:
        return self.handle.getPtr()

    @staticmethod
    def tiled(tensor, dims, strides_bytes, box, dtype: str, swizzle: int = 128, l2_promotion: int = 2) -> "TensorMap":
        """A tiled map over ``tensor``'s memory: dims innermost first, strides in bytes (rank - 1)."""
        dims = tuple(int(x) for x in dims)
        strides_bytes = tuple(int(x) for x in strides_bytes)
        box = tuple(int(x) for x in box)
        elem = tensor.element_size()
        validate(elem, tensor.data_ptr(), dims, strides_bytes, box, swizzle)
        d = drv.driver()
        drv.ensure_context(tensor.device.index)
        tmap = drv.call(
            "cuTensorMapEncodeTiled",
            d.CUtensorMapDataType(DTYPE_CODES[dtype]), len(dims), tensor.data_ptr(),
            [d.cuuint64_t(x) for x in dims], [d.cuuint64_t(x) for x in strides_bytes],
            [d.cuuint32_t(x) for x in box], [d.cuuint32_t(1)] * len(dims),
            d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            d.CUtensorMapSwizzle(SWIZZLE_BYTES[swizzle]),
            d.CUtensorMapL2promotion(l2_promotion),
            d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        return TensorMap(tmap, tensor.device.index, dims, box, swizzle, tensor)
