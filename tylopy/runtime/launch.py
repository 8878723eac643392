"""Argument checks, packing and ``cuLaunchKernel`` on torch's current stream.

A ``Launcher`` is built once per compiled kernel: one packer per launch argument, and one
preallocated ctypes slot per kernel parameter with a fixed ``void*[]`` pointing at them. A
launch then does only what must happen per call: check each argument, write it into its slot,
make the device's context current and call the driver. It allocates nothing on that path and
never synchronizes. (Another thread launching the same kernel gets its own slots.)

A tensor parameter (``ty.tensor``) fills 1 + 2 * ndim slots: pointer, shape, strides. The
module is loaded per device; which image it loads (the cubin, or the PTX for the driver to
compile) follows ``load_plan`` from the kernel's arch and the device's compute capability.
"""
from __future__ import annotations

import ctypes
import operator
import threading

from ..errors import ArchMismatchError, DriverError, LaunchTypeError, LaunchValueError, ResourceLimitError
from ..ir.types import FLOAT_MAX, PointerType, ScalarType, TensorMapType, float_fits, int_range
from . import driver as drv
from . import hooks
from ..ir.arguments import strided_last_dim_error
from .streams import stream_handle

_INT_CTYPES = {"i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
               "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
               "b32": ctypes.c_uint32, "i1": ctypes.c_bool}
_FLOAT_CTYPES = {"f32": ctypes.c_float, "f64": ctypes.c_double}


def torch_dtype(t: ScalarType):
    import torch
    table = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
             "i32": torch.int32, "i64": torch.int64, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
             "i1": torch.bool, "b32": torch.int32, "u32": getattr(torch, "uint32", torch.int32),
             "u64": getattr(torch, "uint64", torch.int64), "u16": getattr(torch, "uint16", torch.int16),
             "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    return table[t.name]


def _is_tensor(t) -> bool:
    """A ``ty.tensor`` parameter (the frontend's TensorSpec: element type, rank, options)."""
    return hasattr(t, "ndim") and hasattr(t, "contiguous") and hasattr(t, "index")


def check_index_range(kname: str, name: str, spec, shape, strides) -> None:
    """With 32-bit indexing every shape, stride and element offset the tensor spans must fit i32."""
    if spec.index.bits == 64:
        return
    extent = 0
    for n, st in zip(shape, strides):
        if n > 0:
            extent += (n - 1) * abs(st)
        if n > 2**31 - 1 or abs(st) > 2**31 - 1:
            extent = 2**31
    if extent > 2**31 - 1:
        raise LaunchValueError(f"{kname}: argument {name!r} spans {extent + 1} elements, more than 32-bit indexing "
                               "reaches; declare it ty.tensor(..., index=ty.i64)")


def _family(arch: str) -> tuple[int, int]:
    digits = arch[3:].rstrip("a")  # sm_90a -> (9, 0)
    return int(digits[:-1]), int(digits[-1])


# -- which image runs on which device ------------------------------------------------------------------

def load_plan(arch: str, capability: tuple[int, int]) -> str:
    """"cubin" when the kernel's machine code runs on a device of ``capability``, "ptx" when the
    driver must compile the PTX for it (a newer major architecture); ``ArchMismatchError`` when
    neither can run (an ``a`` target on another device, or a device older than the target)."""
    major, minor = capability
    want = _family(arch)
    if arch.endswith("a"):
        if (major, minor) != want:
            raise ArchMismatchError(
                f"the kernel was compiled for {arch}, whose instructions (wgmma, setmaxnreg, ...) exist only on "
                f"compute capability {want[0]}.{want[1]}, but the device is sm_{major}{minor}; compile it with "
                f"arch='sm_{major}{minor}' if its source uses no {arch}-only instructions")
        return "cubin"
    if (major, minor) < want:
        raise ArchMismatchError(f"the kernel was compiled for {arch}, but the device is sm_{major}{minor}, an older "
                                f"architecture; compile it with arch='sm_{major}{minor}'")
    return "cubin" if major == want[0] else "ptx"


# -- packers: check one launch argument and write it into its slot(s) ------------------------------------

def _device_of(kernel: str, name: str, x) -> int:
    dev = x.get_device()
    if dev < 0:
        raise LaunchValueError(f"{kernel}: argument {name!r} expects a CUDA tensor, but got one on {x.device}")
    return dev


def _same_device(kernel: str, name: str, dev: int, device):
    if device is not None and dev != device:
        raise LaunchValueError(f"{kernel}: argument {name!r} is on cuda:{dev}, but the launch runs on cuda:{device} "
                               "(the first tensor argument's device)")
    return dev


def _pointer_packer(kernel: str, name: str, t: PointerType, i: int):
    import torch
    Tensor, want = torch.Tensor, torch_dtype(t.pointee)
    # b32 words (packed pairs of 16-bit floats) are raw bits: signed or unsigned 32-bit tensors both hold them.
    also = (getattr(torch, "uint32", torch.int32),) if t.pointee.name == "b32" else ()

    def checked(x, device):
        if not isinstance(x, Tensor):
            raise LaunchTypeError(f"{kernel}: argument {name!r} expects a torch.Tensor of {want}, "
                                  f"but got {type(x).__name__}")
        if x.dtype is not want and x.dtype not in also:
            raise LaunchTypeError(f"{kernel}: argument {name!r} expects dtype {want}, but got {x.dtype}")
        error = strided_last_dim_error(kernel, name, x)
        if error is not None:
            raise error
        return _same_device(kernel, name, _device_of(kernel, name, x), device)

    def pack(x, slots, ptrs, device):
        try:  # the common case first: a contiguous CUDA tensor of the right dtype on the launch's device
            if x.dtype is want and x.is_contiguous():
                dev = x.get_device()
                if dev == device or (device is None and dev >= 0):
                    slots[i].value = x.data_ptr()
                    return dev
        except AttributeError:
            pass
        device = checked(x, device)
        slots[i].value = x.data_ptr()
        return device
    return pack


def _tensor_packer(kernel: str, name: str, spec, i: int):
    import torch
    Tensor, want, n = torch.Tensor, torch_dtype(spec.dtype), spec.ndim
    strides_passed = n - 1 if spec.contiguous else n
    index64 = spec.index.bits == 64

    def pack(x, slots, ptrs, device):
        if not isinstance(x, Tensor):
            raise LaunchTypeError(f"{kernel}: argument {name!r} expects a torch.Tensor, but got {type(x).__name__}")
        if x.dtype is not want:
            raise LaunchTypeError(f"{kernel}: argument {name!r} expects dtype {want}, but got {x.dtype}")
        dev = x.get_device()
        if dev != device:
            device = _same_device(kernel, name, _device_of(kernel, name, x), device)
        shape, stride = x.shape, x.stride()
        if len(shape) != n:
            raise LaunchValueError(f"{kernel}: argument {name!r} expects a {n}-D tensor, but got shape {tuple(shape)}")
        if spec.contiguous and shape[-1] > 1 and stride[-1] != 1:
            raise LaunchValueError(f"{kernel}: argument {name!r} is declared contiguous=True, but its last stride "
                                   f"is {stride[-1]}")
        extent = 0  # the largest element offset the tensor spans (32-bit indexing must reach it)
        for k in range(n):
            size, st = shape[k], stride[k]
            if size > 1:
                extent += (size - 1) * (st if st >= 0 else -st)
            slots[i + 1 + k].value = size
            if k < strides_passed:
                slots[i + 1 + n + k].value = st
        if not index64 and extent > 2**31 - 1:
            check_index_range(kernel, name, spec, shape, stride)  # raises, naming the argument
        slots[i].value = x.data_ptr()
        return device
    return pack


def _scalar_packer(kernel: str, name: str, t: ScalarType, i: int):
    if t.is_float:
        if t.name not in _FLOAT_CTYPES:
            raise LaunchTypeError(f"{kernel}: scalar parameter {name!r} of type {t} cannot be passed from Python")

        limit = FLOAT_MAX[t.name]

        def pack_float(x, slots, ptrs, device):
            if type(x) is not float and (isinstance(x, bool) or not isinstance(x, (int, float))):
                raise LaunchTypeError(f"{kernel}: argument {name!r} expects a Python float for {t}, "
                                      f"but got {type(x).__name__}")
            if not -limit <= x <= limit and not float_fits(t, x):  # nan and inf pass; 1e39 would become inf
                raise LaunchValueError(f"{kernel}: argument {name!r} expects a value of magnitude at most {limit:.8g} "
                                       f"({t}), inf or nan, but got {x!r}")
            slots[i].value = x
            return device
        return pack_float
    if t.is_bool:
        def pack_bool(x, slots, ptrs, device):
            if not isinstance(x, bool):
                raise LaunchTypeError(f"{kernel}: argument {name!r} expects a bool, but got {type(x).__name__}")
            slots[i].value = x
            return device
        return pack_bool
    lo, hi = int_range(t)

    def pack_int(x, slots, ptrs, device):
        if type(x) is not int:
            import numbers
            if isinstance(x, bool) or not isinstance(x, numbers.Integral):
                raise LaunchTypeError(f"{kernel}: argument {name!r} expects a Python int for {t}, "
                                      f"but got {type(x).__name__}")
            x = int(x)
        if not lo <= x <= hi:
            raise LaunchValueError(f"{kernel}: argument {name!r} expects a value in {lo}..{hi} ({t}), but got {x}")
        slots[i].value = x
        return device
    return pack_int


def _tensormap_packer(kernel: str, name: str, i: int):
    from .tensormap import TensorMap

    def pack(x, slots, ptrs, device):
        if not isinstance(x, TensorMap):
            raise LaunchTypeError(f"{kernel}: argument {name!r} expects a tylopy TensorMap, but got {type(x).__name__}")
        if x.device is None:
            raise LaunchValueError(f"{kernel}: tensor map {name!r} describes a CPU tensor (it serves kernel.emulate); "
                                   "build it with ty.tensor_map from a CUDA tensor to launch on the GPU")
        if device is not None and x.device != device:
            raise LaunchValueError(f"{kernel}: tensor map {name!r} describes memory on cuda:{x.device}, "
                                   f"but the launch runs on cuda:{device}")
        ptrs[i] = x.getPtr()  # the map's own 128 bytes are the parameter
        return x.device
    return pack


def _slot_types(params) -> list:
    """One ctypes type per kernel parameter (None for a tensor map: its own memory is passed)."""
    out = []
    for _, t in params:
        if _is_tensor(t):
            idx = _INT_CTYPES[t.index.name]
            out += [ctypes.c_void_p] + [idx] * t.ndim + [idx] * (t.ndim - 1 if t.contiguous else t.ndim)
        elif isinstance(t, PointerType):
            out.append(ctypes.c_void_p)
        elif isinstance(t, TensorMapType):
            out.append(None)
        elif t.is_float:
            out.append(_FLOAT_CTYPES.get(t.name, ctypes.c_float))
        else:
            out.append(_INT_CTYPES[t.name])
    return out


def check_grid(kernel: str, grid) -> tuple[int, int, int]:
    t = type(grid)
    if t is tuple and len(grid) == 1 and type(grid[0]) is int and 0 <= grid[0] < 2**31:
        return grid[0], 1, 1  # the common case, without the general checks
    if t is int:
        grid = (grid,)
    if not isinstance(grid, (tuple, list)) or not 1 <= len(grid) <= 3:
        raise LaunchTypeError(f"{kernel}: grid expects an int or a tuple of 1 to 3 ints, but got {grid!r}")
    for i, x in enumerate(grid):
        if isinstance(x, bool) or not hasattr(type(x), "__index__"):  # a float would be truncated silently
            raise LaunchTypeError(f"{kernel}: grid dimension {i} expects an int, but got {type(x).__name__} {x!r}")
    g = [operator.index(x) for x in grid] + [1] * (3 - len(grid))
    limits = (2**31 - 1, 65535, 65535)
    for i, (x, lim) in enumerate(zip(g, limits)):
        if not 0 <= x <= lim:
            raise LaunchValueError(f"{kernel}: grid dimension {i} expects 0..{lim}, but got {x}")
    return g[0], g[1], g[2]


class _Slots:
    """One thread's parameter memory: a ctypes value per parameter and the void*[] pointing at them."""

    __slots__ = ("values", "ptrs", "address")

    def __init__(self, types):
        self.values = [t() if t is not None else None for t in types]
        self.ptrs = (ctypes.c_void_p * max(len(types), 1))(
            *[ctypes.addressof(v) if v is not None else 0 for v in self.values])
        self.address = ctypes.addressof(self.ptrs)


class Launcher:
    def __init__(self, compiled):
        self.ck = compiled
        name = compiled.name
        packers, i = [], 0
        for pname, t in compiled.params:
            if _is_tensor(t):
                packers.append(_tensor_packer(name, pname, t, i))
                i += 1 + 2 * t.ndim - (1 if t.contiguous else 0)
                continue
            if isinstance(t, PointerType):
                packers.append(_pointer_packer(name, pname, t, i))
            elif isinstance(t, TensorMapType):
                packers.append(_tensormap_packer(name, pname, i))
            else:
                packers.append(_scalar_packer(name, pname, t, i))
            i += 1
        self.packers = tuple(packers)
        self.names = tuple(p for p, _ in compiled.params)
        self._types = _slot_types(compiled.params)
        self._slots = _Slots(self._types)
        self._owner = threading.get_ident()
        self._local = threading.local()
        self._functions: dict[int, object] = {}
        self._modules: dict[int, object] = {}
        self._streams: dict[int, object] = {}
        self._d, self._success = None, None  # the driver module and its CUDA_SUCCESS, looked up once
        # debug mode is an option of the compile, never guessed from the PTX text (a kernel's own
        # names or strings may contain anything)
        options = getattr(compiled, "options", None)
        bounded = options is not None and options.debug_waits and bool(compiled.wait_sites)  # (sites: its waits)
        self._debug_record = self.DEBUG_RECORD if bounded else None

    def _thread_slots(self) -> _Slots:
        if threading.get_ident() == self._owner:
            return self._slots
        slots = getattr(self._local, "slots", None)
        if slots is None:
            slots = self._local.slots = _Slots(self._types)
        return slots

    def pack(self, args, slots: _Slots | None = None) -> tuple[int | None, list]:
        """Check and pack every argument; needs no GPU. Returns (device index, ctypes values)."""
        if len(args) != len(self.packers):
            raise LaunchTypeError(f"{self.ck.name} expects {len(self.packers)} arguments "
                                  f"({', '.join(self.names)}), but got {len(args)}")
        slots = slots or self._thread_slots()
        values, ptrs = slots.values, slots.ptrs
        device = None
        for pack, x in zip(self.packers, args):
            device = pack(x, values, ptrs, device)
        return device, values

    def function(self, device: int):
        """The kernel's CUfunction on ``device``: its module loaded into that device's context."""
        f = self._functions.get(device)
        if f is not None:
            return f
        image = self._image_for(device)
        smem = self.ck.dynamic_shared_bytes
        if smem > 48 * 1024:
            limit = drv.device_attribute(device, "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
            if smem > limit:
                raise ResourceLimitError(f"{self.ck.name} asks for {smem} bytes of dynamic shared memory, "
                                         f"but cuda:{device} allows {limit} per block")
        previous = drv.enter_device(device)
        try:
            module = drv.call("cuModuleLoadData", image, kernel=self.ck.name)
            f = drv.call("cuModuleGetFunction", module, self.ck.name.encode(), kernel=self.ck.name)
            if smem > 48 * 1024:
                d = drv.driver()
                drv.call("cuFuncSetAttribute", f,
                         d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem,
                         kernel=self.ck.name)
        finally:
            drv.leave_device(previous)
        self._modules[device] = module
        self._functions[device] = f
        return f

    def _image_for(self, device: int) -> bytes:
        ck = self.ck
        try:
            plan = load_plan(ck.arch, drv.compute_capability(device))
        except ArchMismatchError as e:
            raise ArchMismatchError(f"{ck.name} on cuda:{device}: {e}") from None
        if plan == "cubin" and ck.cubin is not None:
            return ck.cubin
        return ck.ptx.encode() + b"\0"  # the driver compiles the PTX for this device

    def launch(self, grid, args, stream=None):
        if type(grid) is tuple and len(grid) == 1 and type(grid[0]) is int and 0 < grid[0] < 2**31:
            gx = gy = gz = 1
            gx = grid[0]  # the common case, checked without the general path
        else:
            gx, gy, gz = check_grid(self.ck.name, grid)
        slots = self._slots if threading.get_ident() == self._owner else self._thread_slots()
        if len(args) != len(self.packers):
            self.pack(args, slots)  # raises the argument-count error
        values, ptrs, device = slots.values, slots.ptrs, None
        for pack, x in zip(self.packers, args):
            device = pack(x, values, ptrs, device)
        if device is None:
            device = drv.current_device()
        if gx == 0 or gy == 0 or gz == 0:
            if stream is not None:
                stream_handle(self.ck.name, stream, device)  # a bad stream is an error even with nothing to run
            return  # an empty grid launches nothing
        self._send(gx, gy, gz, slots, device, stream)

    def _send(self, gx, gy, gz, slots, device, stream, prepared=False):
        f = self._functions.get(device) or self.function(device)
        if hooks._observers:
            hooks.emit(hooks.LaunchEvent(self.ck.name, self.ck.constexprs, (gx, gy, gz), device, prepared))
        previous = drv.enter_device(device)
        try:
            self._launch(f, gx, gy, gz, slots, device, stream)
        finally:
            if previous is not None:
                drv.leave_device(previous)

    def prepare(self, grid, args) -> "PreparedLaunch":
        """Check and pack ``args`` once into parameter memory of their own (see ``PreparedLaunch``)."""
        return PreparedLaunch(self, grid, args)

    def _launch(self, f, gx, gy, gz, slots, device, stream):
        handle = drv.current_stream(device) if stream is None else stream_handle(self.ck.name, stream, device)
        s = self._streams.get(handle)
        d = drv.driver()
        if d is not self._d:
            self._d, self._success = d, d.CUresult.CUDA_SUCCESS
        if s is None:
            s = self._streams[handle] = d.CUstream(handle)
        if self._debug_record is not None:
            self._reset_debug_record(device, s)
        ck = self.ck
        if ck.cluster is not None:
            self._launch_cluster(d, f, gx, gy, gz, slots, s)
        else:
            err, = d.cuLaunchKernel(f, gx, gy, gz, ck.threads, 1, 1, ck.dynamic_shared_bytes, s, slots.address, 0)
            if err != self._success:
                raise DriverError("cuLaunchKernel", drv._result_name(d, err), ck.name,
                                  f"grid={(gx, gy, gz)}, block={ck.threads}, smem={ck.dynamic_shared_bytes}")
        if self._debug_record is not None:
            self._check_debug_record(device, s)

    def _launch_cluster(self, d, f, gx, gy, gz, slots, s):
        """``cuLaunchKernelEx`` with the cluster-dimension attribute (a kernel with ``cluster=``)."""
        ck = self.ck
        cx, cy, cz = ck.cluster
        if gx % cx or gy % cy or gz % cz:
            raise LaunchValueError(f"{ck.name}: grid expects a multiple of the cluster shape {ck.cluster} in every "
                                   f"dimension, but got {(gx, gy, gz)}")
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cx, cy, cz
        config = d.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
        config.blockDimX, config.blockDimY, config.blockDimZ = ck.threads, 1, 1
        config.sharedMemBytes = ck.dynamic_shared_bytes
        config.hStream = s
        config.attrs = [attr]
        config.numAttrs = 1
        err, = d.cuLaunchKernelEx(config, f, slots.address, 0)
        if err != self._success:
            raise DriverError("cuLaunchKernelEx", drv._result_name(d, err), ck.name,
                              f"grid={(gx, gy, gz)}, cluster={ck.cluster}, block={ck.threads}, "
                              f"smem={ck.dynamic_shared_bytes}")

    # -- debug mode (TYLOPY_DEBUG_WAITS=1 at compile time): bounded mbarrier waits -------------
    DEBUG_RECORD = "tylopy_debug_record"

    def _record_ptr(self, device):
        self.function(device)
        ptr, _size = drv.call("cuModuleGetGlobal", self._modules[device], self.DEBUG_RECORD.encode(),
                              kernel=self.ck.name)
        return ptr

    def _reset_debug_record(self, device, stream):
        drv.call("cuMemsetD32Async", self._record_ptr(device), 0, 4, stream, kernel=self.ck.name)

    def _check_debug_record(self, device, stream):
        """Debug mode only: wait for the kernel and turn a recorded timeout into an error."""
        drv.call("cuStreamSynchronize", stream, kernel=self.ck.name)
        buf = (ctypes.c_int32 * 4)()
        drv.call("cuMemcpyDtoH", ctypes.addressof(buf), self._record_ptr(device), 16, kernel=self.ck.name)
        site, parity, address, stage = list(buf)
        if site == 0:
            return
        from ..errors import MbarrierTimeoutError
        sites = self.ck.wait_sites
        label, where = (sites[site - 1].label, sites[site - 1].where) if 0 < site <= len(sites) else ("?", "?")
        what = f"mbarrier wait{(' ' + repr(label)) if label else ''} at {where}"
        stage_text = f", stage {stage}" if stage >= 0 else ""
        raise MbarrierTimeoutError(f"{self.ck.name}: {what} timed out waiting for phase parity {parity} of the "
                                   f"mbarrier at shared address {address:#x}{stage_text}; the phase never "
                                   "completed (an expect_tx byte count or arrival count that does not match?)")


class PreparedLaunch:
    """A launch whose arguments were checked and packed once, into parameter memory of its own.

    ``set(arg, value)`` checks and packs one argument again (by name or position), ``launch()``
    sends the kernel on torch's current stream of the device (or ``stream``). A call repeated
    with mostly the same arguments then pays only for what changed::

        run = add_one[(blocks,)].prepare(x, out, n)
        for x in batches:
            run.set("x", x)
            run.launch()

    It holds a reference to every argument it packed (the latest one ``set`` for each), so a
    tensor whose address it passes cannot be freed and its memory reused while it may launch;
    a tensor map's own memory is the parameter. It stays on
    the specialization and device it was prepared for: an edit of a global the kernel read takes
    effect in a new ``prepare``, and a tensor on another device is rejected. One thread at a time.
    """

    __slots__ = ("launcher", "grid", "device", "_slots", "_index", "_held", "_unset")

    def __init__(self, launcher: Launcher, grid, args):
        self.launcher = launcher
        self.grid = check_grid(launcher.ck.name, grid)
        self._slots = _Slots(launcher._types)
        device, _ = launcher.pack(tuple(args), self._slots)
        self.device = drv.current_device() if device is None else device
        self._index = {name: i for i, name in enumerate(launcher.names)}
        self._held = list(args)  # kept alive: their addresses (a map's own memory) are in the parameters
        self._unset: set = set()  # arguments whose last set() failed (their slots may be half written)

    def set(self, arg, value) -> None:
        """Check and pack ``value`` as argument ``arg`` (its name, or its position)."""
        i = arg if type(arg) is int else self._index.get(arg) if isinstance(arg, str) else None
        if i is None or not 0 <= i < len(self._index):
            raise LaunchTypeError(f"{self.launcher.ck.name}: set expects an argument name "
                                  f"({', '.join(self.launcher.names)}) or position, but got {arg!r}")
        try:
            self.launcher.packers[i](value, self._slots.values, self._slots.ptrs, self.device)
        except BaseException:
            self._unset.add(i)  # a tensor's shape may be written and its pointer not: no launch until set again
            raise
        self._unset.discard(i)
        self._held[i] = value

    def launch(self, stream=None) -> None:
        if self._unset:
            names = [repr(self.launcher.names[i]) for i in sorted(self._unset)]
            what = f"argument {names[0]} has" if len(names) == 1 else f"arguments {', '.join(names)} have"
            raise LaunchValueError(f"{self.launcher.ck.name}: {what} no valid value since the last set() of it "
                                   "failed; set it again before launching")
        gx, gy, gz = self.grid
        if gx and gy and gz:
            self.launcher._send(gx, gy, gz, self._slots, self.device, stream, prepared=True)
