"""CUtensorMap descriptors for TMA, built on the host with cuTensorMapEncodeTiled.

The rules the driver enforces are checked here first, so a bad shape gets a ValueError that
names the argument instead of CUDA_ERROR_INVALID_VALUE (constraints from the driver API docs:
16-byte aligned base and strides, box dims 1..256, inner box ≤ swizzle span, dims ≤ 2**32).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from ..errors import LaunchValueError
from . import driver as drv
from . import plancache

SWIZZLE_BYTES = {0: 0, 32: 1, 64: 2, 128: 3}
CACHE_ENTRIES = 256  # TensorMap.cached keeps this many maps (128 bytes of host memory each)
_cache: dict = {}
_valid_geometries: set = set()  # (element size, dims, strides, box, swizzle, dtype) that passed validate()
plancache.on_clear(lambda: _cache.clear())  # the maps hold device addresses: forget them with the plans
DTYPE_CODES = {"u8": 0, "u16": 1, "u32": 2, "i32": 3, "u64": 4, "i64": 5, "f16": 6, "f32": 7, "f64": 8, "bf16": 9,
               "e4m3": 0, "e5m2": 0}  # fp8: the driver's UINT8 (TMA copies bytes; sm_90 has no fp8 code)
DTYPE_BYTES = {"u8": 1, "u16": 2, "u32": 4, "i32": 4, "u64": 8, "i64": 8, "f16": 2, "f32": 4, "f64": 8, "bf16": 2,
               "e4m3": 1, "e5m2": 1}


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


@dataclass(frozen=True)
class TensorMapSpec:
    """What a tiled tensor map describes, checked but not encoded (no driver needed).

    ``dims`` and ``box`` are innermost first, ``strides_bytes`` has rank - 1 entries (the
    innermost stride is one element). The emulator reads tiles from this directly.
    """

    tensor: object
    dims: tuple
    strides_bytes: tuple
    box: tuple
    dtype: str
    swizzle: int = 128

    def __post_init__(self):
        address = self.tensor.data_ptr()
        geometry = (self.tensor.element_size(), self.dims, self.strides_bytes, self.box, self.swizzle, self.dtype)
        if geometry in _valid_geometries and not address % 16:
            return  # checked before: only the address is new
        if self.dtype not in DTYPE_CODES:
            raise LaunchValueError(f"tensor map dtype expects one of {sorted(DTYPE_CODES)}, but got {self.dtype!r}")
        validate(geometry[0], address, self.dims, self.strides_bytes, self.box, self.swizzle)
        if len(_valid_geometries) >= CACHE_ENTRIES:
            _valid_geometries.clear()
        _valid_geometries.add(geometry)

    @property
    def box_bytes(self) -> int:
        n = self.tensor.element_size()
        for b in self.box:
            n *= b
        return n


_arguments: dict = {}  # geometry -> (driver module, its encode arguments but the address)


def _encode_arguments(d, dims, strides, box, dtype, swizzle, l2_promotion):
    """cuTensorMapEncodeTiled's arguments before and after the address, as the bindings' objects
    (converted once per geometry: a new address with a known geometry converts nothing)."""
    key = (dims, strides, box, dtype, swizzle, l2_promotion)
    known = _arguments.get(key)
    if known is not None and known[0] is d:
        return known[1]
    made = ((d.CUtensorMapDataType(DTYPE_CODES[dtype]), len(dims)),
            ([d.cuuint64_t(x) for x in dims], [d.cuuint64_t(x) for x in strides], [d.cuuint32_t(x) for x in box],
             [d.cuuint32_t(1)] * len(dims), d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
             d.CUtensorMapSwizzle(SWIZZLE_BYTES[swizzle]), d.CUtensorMapL2promotion(l2_promotion),
             d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    if len(_arguments) >= CACHE_ENTRIES:
        del _arguments[next(iter(_arguments))]
    _arguments[key] = (d, made)
    return made


class TensorMap:
    """A 128-byte CUtensorMap; pass it for a ``ty.tensormap`` parameter.

    The map encodes an address and a geometry. By default it holds its tensor, so the memory it
    points at lives as long as the map (``TensorMap.tiled(torch.randn(...).cuda(), ...)`` is
    safe). Launchers that cache maps by (address, geometry, dtype, device) make them with
    ``hold=False``: such a map refers to its tensor only weakly and never keeps user tensors
    alive; a map cached that way is still right for a new tensor at the same address, since it
    encodes only the address and the geometry. ``spec`` is available while the tensor lives
    (the emulator reads tiles through it).
    """

    __slots__ = ("_handle", "device", "_tensor", "_held", "_geometry", "_l2")

    def __init__(self, handle, spec: TensorMapSpec, hold: bool = True, l2_promotion: int = 2):
        self._handle = handle  # cuda.bindings.driver.CUtensorMap, or None: encoded at the first GPU launch
        device = spec.tensor.device
        self.device = device.index if device.type == "cuda" else None  # None: a CPU tensor (emulator only)
        self._held = spec.tensor if hold else None
        self._tensor = weakref.ref(spec.tensor)
        self._geometry = (spec.dims, spec.strides_bytes, spec.box, spec.dtype, spec.swizzle)
        self._l2 = l2_promotion

    @property
    def handle(self):
        """The encoded CUtensorMap (encoded here, once, for a map made by ``ty.tensor_map``)."""
        if self._handle is None:
            if self.device is None:
                raise LaunchValueError(f"{self!r} describes a CPU tensor: it serves kernel.emulate(...); build the "
                                       "map from a CUDA tensor to launch on the GPU")
            self._handle = TensorMap.encode(self.spec, self._l2, hold=False)._handle
        return self._handle

    @property
    def spec(self) -> TensorMapSpec:
        t = self._tensor()
        if t is None:
            raise LaunchValueError("the tensor this tensor map describes has been freed")
        dims, strides, box, dtype, swizzle = self._geometry
        return TensorMapSpec(t, dims, strides, box, dtype, swizzle)

    def __repr__(self):
        dims, strides, box, dtype, swizzle = self._geometry
        where = "cpu" if self.device is None else f"cuda:{self.device}"
        return (f"TensorMap({dtype}, shape={tuple(reversed(dims))}, box={tuple(reversed(box))}, swizzle={swizzle}, "
                f"{where})")

    @property
    def box(self) -> tuple:
        """The box in the tensor's dimension order (outermost first, as ``tensor.shape``)."""
        return tuple(reversed(self._geometry[2]))

    @property
    def box_bytes(self) -> int:
        """Bytes one TMA copy moves (what ``mbarrier_arrive_expect_tx`` expects per box)."""
        n = DTYPE_BYTES[self._geometry[3]]
        for b in self._geometry[2]:
            n *= b
        return n

    def getPtr(self) -> int:
        h = self._handle
        return (h if h is not None else self.handle).getPtr()

    @staticmethod
    def encode(spec: TensorMapSpec, l2_promotion: int = 2, hold: bool = True) -> "TensorMap":
        d = drv.driver()
        t = spec.tensor
        drv.ensure_context(t.device.index)
        before, after = _encode_arguments(d, spec.dims, spec.strides_bytes, spec.box, spec.dtype, spec.swizzle,
                                          l2_promotion)
        tmap = drv.call("cuTensorMapEncodeTiled", *before, t.data_ptr(), *after)
        return TensorMap(tmap, spec, hold)

    @staticmethod
    def cached(tensor, dims: tuple, strides_bytes: tuple, box: tuple, dtype: str, swizzle: int = 128) -> "TensorMap":
        """``tiled(..., hold=False)`` encoded once per (address, geometry, dtype, swizzle, device):
        the launchers' maps. The cache keeps the newest ``CACHE_ENTRIES`` maps and no tensor
        (a new tensor at a cached address gets the cached map, which encodes only the address and
        the geometry). ``dims``, ``strides_bytes`` and ``box`` are tuples of ints."""
        key = (tensor.data_ptr(), dims, strides_bytes, box, dtype, swizzle, tensor.get_device())
        tm = _cache.get(key)
        if tm is None:
            tm = TensorMap.tiled(tensor, dims, strides_bytes, box, dtype, swizzle, hold=False)
            if len(_cache) >= CACHE_ENTRIES:
                del _cache[next(iter(_cache))]  # the oldest entry
            _cache[key] = tm
        return tm

    @staticmethod
    def tiled(tensor, dims, strides_bytes, box, dtype: str, swizzle: int = 128, hold: bool = True) -> "TensorMap":
        """Check and encode a tiled map over ``tensor``'s memory (``hold``: see the class docstring)."""
        spec = TensorMapSpec(tensor, tuple(int(x) for x in dims), tuple(int(x) for x in strides_bytes),
                             tuple(int(x) for x in box), dtype, swizzle)
        return TensorMap.encode(spec, hold=hold)
