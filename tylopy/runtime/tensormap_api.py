"""``ty.tensor_map``: the one public way to describe a tensor for TMA.

A kernel's ``ty.tensormap`` parameter takes the returned ``TensorMap`` both at a GPU launch and
in ``kernel.emulate(...)``: from a CUDA tensor it is encoded here (cuTensorMapEncodeTiled), from
a CPU tensor it is only checked (no driver needed) and serves the emulator.

Every rule cuTensorMapEncodeTiled states (CUDA driver API, "Tensor Map Object Management") is
checked first, in the caller's terms: the argument, the dimension in ``tensor.shape`` order, what
was expected and what came, so a bad box never becomes CUDA_ERROR_INVALID_VALUE.
"""
from __future__ import annotations

from ..errors import LaunchTypeError, LaunchValueError
from .tensormap import TensorMap, TensorMapSpec

# torch dtype name -> tensor-map dtype (tensormap.DTYPE_CODES); 8-bit and 16-bit integers travel as the
# driver's unsigned types of their width (TMA copies bytes; it never converts).
_TORCH_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "i32",
                 "int64": "i64", "uint8": "u8", "int8": "u8", "int16": "u16", "uint16": "u16", "uint32": "u32",
                 "uint64": "u64", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
L2_PROMOTION = {0: 0, 64: 1, 128: 2, 256: 3}  # bytes -> CU_TENSOR_MAP_L2_PROMOTION_*
MAX_BOX = 256          # boxDim[i] <= 256
MAX_DIM = 2**32        # globalDim[i] <= 2**32
MAX_STRIDE = 2**40     # globalStrides[i] < 2**40 bytes


def tensor_map(tensor, box, *, swizzle: int = 0, l2_promotion: int = 128) -> TensorMap:
    """Describe ``tensor`` for TMA copies of ``box``-shaped tiles; pass the result for a ``ty.tensormap``.

    ``box`` has one entry per dimension of ``tensor``, in ``tensor.shape`` order (outermost first).
    In the kernel, ``ty.hopper.tma_load(dst, tm, bar, *coords)`` / ``tma_store`` take element
    coordinates **innermost first** (PTX's order): for a (rows, cols) tensor, ``(col, row)``.
    ``swizzle`` (0, 32, 64 or 128 bytes) is the shared-memory image's swizzle (128 for wgmma
    operands; the box's innermost extent must then fit in it). ``l2_promotion`` (0, 64, 128 or
    256 bytes) is a cache hint only. A CUDA tensor is encoded now; a CPU tensor is checked and
    serves ``kernel.emulate``. The map holds ``tensor`` (its memory lives as long as the map).
    ``tm.box_bytes`` is what one copy credits to its mbarrier (the whole box, even when clipped).
    """
    where = "ty.tensor_map"
    if not (hasattr(tensor, "data_ptr") and hasattr(tensor, "element_size") and hasattr(tensor, "stride")):
        raise LaunchTypeError(f"{where}: tensor expects a torch.Tensor, but got {type(tensor).__name__}")
    tname = str(tensor.dtype).replace("torch.", "")
    dtype = _TORCH_DTYPES.get(tname)
    if dtype is None:
        raise LaunchTypeError(f"{where}: tensor expects one of the dtypes {sorted(_TORCH_DTYPES)}, but got {tname}")
    shape, strides, es = tuple(tensor.shape), tuple(tensor.stride()), tensor.element_size()
    rank = len(shape)
    if not 1 <= rank <= 5:
        raise LaunchValueError(f"{where}: tensor expects 1 to 5 dimensions, but got {rank} (shape {shape})")
    if isinstance(box, int) or not isinstance(box, (tuple, list)):
        raise LaunchTypeError(f"{where}: box expects a tuple of {rank} ints (one per dimension of shape {shape}), "
                              f"but got {box!r}")
    if len(box) != rank:
        raise LaunchValueError(f"{where}: box expects {rank} entries (one per dimension of shape {shape}, outermost "
                               f"first), but got {len(box)}: {tuple(box)}")
    for i, b in enumerate(box):
        if isinstance(b, bool) or not hasattr(type(b), "__index__"):
            raise LaunchTypeError(f"{where}: box[{i}] expects an int, but got {b!r}")
        if not 1 <= int(b) <= MAX_BOX:
            raise LaunchValueError(f"{where}: box[{i}] expects 1..{MAX_BOX} elements (the TMA's largest box), "
                                   f"but got {int(b)}")
    box = tuple(int(b) for b in box)
    if swizzle not in (0, 32, 64, 128) or isinstance(swizzle, bool):
        raise LaunchValueError(f"{where}: swizzle expects 0, 32, 64 or 128 (bytes), but got {swizzle!r}")
    if l2_promotion not in L2_PROMOTION or isinstance(l2_promotion, bool):
        raise LaunchValueError(f"{where}: l2_promotion expects 0, 64, 128 or 256 (bytes), but got {l2_promotion!r}")
    for i, n in enumerate(shape):
        if not 1 <= n <= MAX_DIM:
            raise LaunchValueError(f"{where}: tensor.shape[{i}] expects 1..2**32, but got {n} (shape {shape})")
    if strides[-1] != 1 and shape[-1] != 1:
        raise LaunchValueError(f"{where}: tensor expects its last dimension contiguous (stride 1: TMA reads the "
                               f"innermost dimension element by element), but got strides {strides}")
    for i in range(rank - 1):
        s = strides[i] * es
        if strides[i] <= 0:
            raise LaunchValueError(f"{where}: tensor.stride()[{i}] expects a positive stride, but got {strides[i]} "
                                   "(a broadcast dimension: index it by coordinate instead, or make it contiguous)")
        if s % 16 or s >= MAX_STRIDE:
            raise LaunchValueError(f"{where}: tensor.stride()[{i}] expects a multiple of 16 bytes ({16 // es or 1} "
                                   f"{tname} elements) below 2**40 bytes, but got {strides[i]} elements = {s} bytes "
                                   "(pad the row, e.g. allocate a wider tensor and slice it)")
    if tensor.data_ptr() % 16:
        raise LaunchValueError(f"{where}: tensor expects its first element 16-byte aligned, but got address "
                               f"{tensor.data_ptr():#x} (storage offset {tensor.storage_offset()} elements)")
    inner = box[-1] * es
    if inner % 16:
        raise LaunchValueError(f"{where}: box[{rank - 1}] (the innermost) expects a multiple of 16 bytes "
                               f"({max(16 // es, 1)} {tname} elements), but got {box[-1]} elements = {inner} bytes")
    if swizzle and inner > swizzle:
        raise LaunchValueError(f"{where}: box[{rank - 1}] (the innermost) expects at most {swizzle} bytes "
                               f"({swizzle // es} {tname} elements) with swizzle={swizzle}, but got {box[-1]} "
                               f"elements = {inner} bytes (use a narrower box and several copies, or swizzle=0)")
    spec = TensorMapSpec(tensor, tuple(reversed(shape)), tuple(s * es for s in reversed(strides[:-1])),
                         tuple(reversed(box)), dtype, swizzle)
    if tensor.device.type == "cuda":
        return TensorMap.encode(spec, L2_PROMOTION[l2_promotion], hold=True)
    if tensor.device.type != "cpu":
        raise LaunchValueError(f"{where}: tensor expects a CUDA tensor (or a CPU one for the emulator), but got "
                               f"one on {tensor.device}")
    return TensorMap(None, spec, hold=True, l2_promotion=L2_PROMOTION[l2_promotion])
