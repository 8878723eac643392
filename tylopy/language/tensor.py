"""Tensor parameters: ``x: ty.tensor(ty.f32, 2)`` takes a torch tensor with its shape and strides.

The launcher passes the tensor's data pointer, then its shape and its strides (in elements) as
integers of the tensor's index type; the kernel sees a ``TensorArg``::

    @ty.kernel(threads=128)
    def scale_rows(x: ty.tensor(2), out: ty.tensor(2), s: ty.f32):
        r = ty.block_idx()
        for c in range(ty.thread_idx(), x.shape[1], 128):
            out[r, c] = ty.cast(ty.cast(x[r, c], ty.f32) * s, out.dtype)

``t[i, j]`` loads through the strides (``t[i, j] = v`` stores), ``t.ptr`` is the pointer to
element (0, ..., 0), ``t.shape[k]`` and ``t.stride[k]`` are run-time integers and ``t.dtype``
the element type. A tensor declared without a dtype takes the dtype of the argument: each dtype
is its own specialization (part of the compile key, like a constexpr; at compile time it is
chosen by keyword, ``kernel.compile(x=ty.bf16)``), so one kernel serves f32, f16 and bf16.

Options, each part of the specialization: ``noalias=True`` (LLVM ``noalias`` on the pointer:
no other pointer argument overlaps it), ``contiguous=True`` (the last stride is the constant 1,
checked at launch; loads along the last axis can then be vectorized), ``index=ty.i64`` (shapes,
strides and offsets in 64 bits; the default ``ty.i32`` is checked at launch to cover every
element the tensor spans).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import LaunchTypeError, LaunchValueError
from ..ir.types import SCALAR_TYPES, PointerType, ScalarType, i32, i64
from ..ir.arguments import strided
from ..runtime.launch import check_index_range  # (imports neither torch nor the driver)
from .builder import current_builder
from .proxy import RuntimeValue, as_value, emit, emit1

_INDEX_TYPES = {"i32": i32, "i64": i64}


@dataclass(frozen=True)
class TensorSpec:
    """The annotation ``ty.tensor(...)``: element type (None: taken from the argument), rank, options."""

    dtype: ScalarType | None
    ndim: int
    index: ScalarType = i32
    noalias: bool = False
    contiguous: bool = False

    def __repr__(self):
        opts = [f"{self.ndim}"] if self.dtype is None else [f"{self.dtype}", f"{self.ndim}"]
        if self.index != i32:
            opts.append(f"index={self.index}")
        if self.noalias:
            opts.append("noalias=True")
        if self.contiguous:
            opts.append("contiguous=True")
        return f"tensor({', '.join(opts)})"

    @property
    def open(self) -> bool:
        return self.dtype is None

    def with_dtype(self, dtype: ScalarType) -> "TensorSpec":
        return TensorSpec(dtype, self.ndim, self.index, self.noalias, self.contiguous)

    def ir_params(self, name: str) -> list[tuple[str, object]]:
        """The IR parameters this tensor becomes: pointer, shape[0..n), stride[0..n) (the last
        stride is not passed when contiguous)."""
        out = [(name, PointerType(self.dtype))]
        out += [(f"{name}.shape{k}", self.index) for k in range(self.ndim)]
        strides = self.ndim - 1 if self.contiguous else self.ndim
        out += [(f"{name}.stride{k}", self.index) for k in range(strides)]
        return out


def tensor(*args, index: ScalarType = i32, noalias: bool = False, contiguous: bool = False) -> TensorSpec:
    """A tensor parameter: ``tensor(ndim)`` (dtype from the argument) or ``tensor(dtype, ndim)``."""
    if len(args) == 1:
        dtype, ndim = None, args[0]
    elif len(args) == 2:
        dtype, ndim = args
    else:
        raise TypeError(f"ty.tensor expects (ndim) or (dtype, ndim), but got {len(args)} arguments")
    if dtype is not None and (not isinstance(dtype, ScalarType) or dtype.is_bool):
        raise TypeError(f"ty.tensor dtype expects a scalar type such as ty.f32, but got {dtype!r}")
    if isinstance(ndim, bool) or not isinstance(ndim, int) or not 1 <= ndim <= 8:
        raise ValueError(f"ty.tensor ndim expects an int in 1..8, but got {ndim!r}")
    if index not in (i32, i64):
        raise ValueError(f"ty.tensor index expects ty.i32 or ty.i64, but got {index!r}")
    return TensorSpec(dtype, ndim, index, bool(noalias), bool(contiguous))


class TensorArg:
    """What kernel code holds for a tensor parameter: ``ptr``, ``shape``, ``stride``, ``dtype``, indexing."""

    __slots__ = ("name", "ptr", "shape", "stride", "spec")
    __tylopy_immutable__ = True  # storing through it (t[i] = v) changes memory, not the handle

    def __init__(self, name: str, spec: TensorSpec, ptr, shape, stride):
        self.name, self.spec = name, spec
        self.ptr, self.shape, self.stride = ptr, tuple(shape), tuple(stride)

    @property
    def dtype(self) -> ScalarType:
        return self.spec.dtype

    @property
    def ndim(self) -> int:
        return self.spec.ndim

    def __repr__(self):
        return f"TensorArg({self.name}: {self.spec})"

    def offset(self, index):
        """The element offset of ``index`` (a tuple of ``ndim`` integers) in the index type."""
        idx = index if isinstance(index, tuple) else (index,)
        bld = current_builder()
        if len(idx) != self.ndim:
            bld.error(f"tensor {self.name!r} has {self.ndim} dimension(s), but is indexed with {len(idx)}",
                      hint="index every dimension: " + f"{self.name}[{', '.join('i' + str(k) for k in range(self.ndim))}]")
        total = None
        for k, (i, s) in enumerate(zip(idx, self.stride)):
            term = _as_index(i, self.spec.index, self.name, k)
            if not (isinstance(s, int) and s == 1):
                term = term * s
            total = term if total is None else total + term
        return total

    def address(self, index):
        """The pointer to element ``index``."""
        return self.ptr + self.offset(index)

    def __getitem__(self, index):
        return emit1("load", (self.address(index),), vec=1)

    def __setitem__(self, index, value):
        emit("store", (self.address(index), as_value(value, self.dtype)))

    def __tylopy_flatten__(self):
        leaves = [self.ptr, *self.shape, *[s for s in self.stride if isinstance(s, RuntimeValue)]]
        return leaves, (self.name, self.spec)

    @classmethod
    def __tylopy_unflatten__(cls, aux, leaves):
        name, spec = aux
        n = spec.ndim
        strides = list(leaves[1 + n:])
        if spec.contiguous:
            strides.append(1)
        return cls(name, spec, leaves[0], leaves[1:1 + n], strides)


def _as_index(i, index_type: ScalarType, name: str, k: int):
    if isinstance(i, RuntimeValue):
        t = i.type
        if not isinstance(t, ScalarType) or not t.is_int or t.is_bool:
            current_builder().error(f"tensor {name!r} index {k} expects an integer, but got a {t} value")
        if t != index_type:
            return emit1("convert", (i,), to=index_type)
        return i
    if isinstance(i, bool) or not isinstance(i, int):
        current_builder().error(f"tensor {name!r} index {k} expects an integer, but got {type(i).__name__} {i!r}",
                                hint="slices are not supported: index one element, or use .ptr and .stride")
    return i


# -- launch arguments (shared by the GPU launcher and the emulator) ---------------------------------

def dtype_of(x) -> ScalarType | None:
    """The tylopy type of a dtype given as a tylopy type, a torch or numpy dtype, or its name."""
    if isinstance(x, ScalarType):
        return x
    name = str(x).replace("torch.", "")
    return _DTYPE_NAMES.get(name)


_DTYPE_NAMES = {**SCALAR_TYPES, "float32": SCALAR_TYPES["f32"], "float16": SCALAR_TYPES["f16"],
                "bfloat16": SCALAR_TYPES["bf16"], "float64": SCALAR_TYPES["f64"], "int32": SCALAR_TYPES["i32"],
                "int64": SCALAR_TYPES["i64"], "int16": SCALAR_TYPES["i16"], "int8": SCALAR_TYPES["i8"],
                "uint8": SCALAR_TYPES["u8"], "uint16": SCALAR_TYPES["u16"], "uint32": SCALAR_TYPES["u32"],
                "uint64": SCALAR_TYPES["u64"], "float8_e4m3fn": SCALAR_TYPES["e4m3"],
                "float8_e5m2": SCALAR_TYPES["e5m2"]}


def argument_dtype(kname: str, name: str, x):
    dt = getattr(x, "dtype", None)
    t = _TORCH_DTYPES.get(dt) if dt is not None else None
    if t is None:
        t = dtype_of(dt) if dt is not None else None
        if t is None:
            raise LaunchTypeError(f"{kname}: argument {name!r} expects a torch.Tensor, but got {type(x).__name__}")
        if not isinstance(dt, str):
            try:
                _TORCH_DTYPES[dt] = t
            except TypeError:
                pass
    return t


_TORCH_DTYPES: dict = {}  # dtype object -> tylopy type, filled as arguments arrive (the launch path)


def expand_tensor_args(kname: str, params, args) -> tuple:
    """The emulator's flat argument list: each tensor becomes (tensor, *shape, *strides)."""
    if len(args) != len(params):
        names = ", ".join(n for n, _ in params)
        raise LaunchTypeError(f"{kname} expects {len(params)} arguments ({names}), but got {len(args)}")
    out = []
    for (name, kind), x in zip(params, args):
        if not isinstance(kind, TensorSpec):
            out.append(x)
            continue
        shape, strides = _shape_and_strides(kname, name, kind, x)
        # The strides travel with the pointer, so the pointer slot takes any last stride: a fresh view
        # carries that mark (the caller's tensor object is left unmarked).
        out.append(strided(x[...]) if hasattr(x, "stride") and callable(x.stride) else x)
        out.extend(shape)
        out.extend(strides[:-1] if kind.contiguous else strides)
    return tuple(out)


def _shape_and_strides(kname: str, name: str, spec: TensorSpec, x):
    shape = tuple(int(s) for s in getattr(x, "shape", ()))
    if hasattr(x, "stride") and callable(x.stride):
        strides = tuple(int(s) for s in x.stride())
    elif hasattr(x, "strides"):  # numpy: bytes
        strides = tuple(int(s) // x.itemsize for s in x.strides)
    else:
        raise LaunchTypeError(f"{kname}: argument {name!r} expects a tensor, but got {type(x).__name__}")
    if len(shape) != spec.ndim:
        raise LaunchValueError(f"{kname}: argument {name!r} expects a {spec.ndim}-D tensor, but got shape {shape}")
    if spec.contiguous and shape and shape[-1] > 1 and strides[-1] != 1:
        raise LaunchValueError(f"{kname}: argument {name!r} is declared contiguous=True, but its last stride is "
                               f"{strides[-1]}")
    check_index_range(kname, name, spec, shape, strides)
    return shape, strides


__all__ = ["tensor", "TensorSpec", "TensorArg"]
