"""Argument checks, packing and ``cuLaunchKernelEx`` on torch's current stream.

A ``Launcher`` is built once per compiled kernel: it turns the parameter list into a tuple of
small packer functions, keeps one ``CUlaunchConfig`` and loads the module lazily per device.
A launch then does only what must happen per call: check each argument, write it into a
ctypes slot, point the void*[] at them, and call the driver. It never synchronizes.
"""
from __future__ import annotations

import ctypes
import operator

from ..errors import LaunchTypeError, LaunchValueError, ResourceLimitError
from ..ir.types import PointerType, ScalarType, TensorMapType
from . import driver as drv

TensorMapSlot = None  # set to runtime.tensormap.TensorMap once a kernel takes a tensor map

_INT_CTYPES = {"i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
               "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
               "b32": ctypes.c_uint32, "i1": ctypes.c_bool}
_FLOAT_CTYPES = {"f32": ctypes.c_float, "f64": ctypes.c_double}


def torch_dtype(t: ScalarType):
    import torch
    table = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
             "i32": torch.int32, "i64": torch.int64, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
             "i1": torch.bool, "b32": torch.int32, "u32": getattr(torch, "uint32", torch.int32),
             "u64": getattr(torch, "uint64", torch.int64), "u16": getattr(torch, "uint16", torch.int16)}
    return table[t.name]


def _pointer_packer(kernel: str, name: str, t: PointerType):
    import torch
    want = torch_dtype(t.pointee)

    def pack(x, device):
        if not isinstance(x, torch.Tensor):
            raise LaunchTypeError(f"{kernel}: argument {name!r} expects a torch.Tensor of {want}, "
                                  f"but got {type(x).__name__}")
        if x.dtype != want:
            raise LaunchTypeError(f"{kernel}: argument {name!r} expects dtype {want}, but got {x.dtype}")
        if x.device.type != "cuda":
            raise LaunchValueError(f"{kernel}: argument {name!r} expects a CUDA tensor, but got one on {x.device}")
        if device is not None and x.device.index != device:
            raise LaunchValueError(f"{kernel}: argument {name!r} is on cuda:{x.device.index}, but the launch "
                                   f"runs on cuda:{device}")
        return x.device.index, ctypes.c_void_p(x.data_ptr())
    return pack


def _scalar_packer(kernel: str, name: str, t: ScalarType):
    if t.is_float:
        ct = _FLOAT_CTYPES.get(t.name)
        if ct is None:
            raise LaunchTypeError(f"{kernel}: scalar parameter {name!r} of type {t} cannot be passed from Python")

        def pack(x, device):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise LaunchTypeError(f"{kernel}: argument {name!r} expects a Python float for {t}, "
                                      f"but got {type(x).__name__}")
            return None, ct(x)
        return pack
    ct = _INT_CTYPES[t.name]
    from ..ir.types import int_range
    lo, hi = int_range(t)

    def pack(x, device):
        if t.is_bool:
            if not isinstance(x, bool):
                raise LaunchTypeError(f"{kernel}: argument {name!r} expects a bool, but got {type(x).__name__}")
            return None, ct(x)
        if isinstance(x, bool) or not isinstance(x, int):
            import numbers
            if not isinstance(x, numbers.Integral) or isinstance(x, bool):
                raise LaunchTypeError(f"{kernel}: argument {name!r} expects a Python int for {t}, "
                                      f"but got {type(x).__name__}")
            x = int(x)
        if not lo <= x <= hi:
            raise LaunchValueError(f"{kernel}: argument {name!r} expects a value in {lo}..{hi} ({t}), but got {x}")
        return None, ct(x)
    return pack


def _tensormap_packer(kernel: str, name: str):
    from .tensormap import TensorMap
    global TensorMapSlot
    TensorMapSlot = TensorMap

    def pack(x, device):
        if not isinstance(x, TensorMap):
            raise LaunchTypeError(f"{kernel}: argument {name!r} expects a tylopy TensorMap, but got {type(x).__name__}")
        if device is not None and x.device != device:
            raise LaunchValueError(f"{kernel}: tensor map {name!r} describes memory on cuda:{x.device}, "
                                   f"but the launch runs on cuda:{device}")
        return x.device, x  # the map's own 128 bytes are the parameter
    return pack


def check_grid(kernel: str, grid) -> tuple[int, int, int]:
    if isinstance(grid, int):
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


class Launcher:
    def __init__(self, compiled):
        self.ck = compiled
        name = compiled.name
        packers = []
        for pname, t in compiled.params:
            if isinstance(t, PointerType):
                packers.append(_pointer_packer(name, pname, t))
            elif isinstance(t, TensorMapType):
                packers.append(_tensormap_packer(name, pname))
            else:
                packers.append(_scalar_packer(name, pname, t))
        self.packers = tuple(packers)
        self.names = tuple(p for p, _ in compiled.params)
        self._functions: dict[int, object] = {}
        self._config = None
        self._streams: dict[int, object] = {}
        self._debug_record = self.DEBUG_RECORD if self.DEBUG_RECORD in compiled.ptx else None
        self._ptr_array = ctypes.c_void_p * max(len(self.packers), 1)

    def pack(self, args) -> tuple[int | None, list]:
        """Check and pack every argument; needs no GPU. Returns (device index, ctypes values)."""
        if len(args) != len(self.packers):
            raise LaunchTypeError(f"{self.ck.name} expects {len(self.packers)} arguments "
                                  f"({', '.join(self.names)}), but got {len(args)}")
        device = None
        slots = []
        for pack, x in zip(self.packers, args):
            dev, slot = pack(x, device)
            if dev is not None:
                device = dev
            slots.append(slot)
        return device, slots

    def function(self, device: int):
        f = self._functions.get(device)
        if f is None:
            drv.ensure_context(device)
            ck = self.ck
            image = ck.cubin if ck.cubin is not None else ck.ptx.encode() + b"\0"
            module = drv.call("cuModuleLoadData", image, kernel=ck.name)
            f = drv.call("cuModuleGetFunction", module, ck.name.encode(), kernel=ck.name)
            smem = ck.dynamic_shared_bytes
            if smem > 48 * 1024:
                limit = drv.device_attribute(device, "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
                if smem > limit:
                    raise ResourceLimitError(f"{ck.name} asks for {smem} bytes of dynamic shared memory, "
                                             f"but cuda:{device} allows {limit} per block")
                d = drv.driver()
                drv.call("cuFuncSetAttribute", f,
                         d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem, kernel=ck.name)
            self._module = module
            self._functions[device] = f
        return f

    def launch(self, grid, args, stream=None):
        import torch
        gx, gy, gz = check_grid(self.ck.name, grid)
        device, slots = self.pack(args)
        if device is None:
            device = torch.cuda.current_device()
        if gx * gy * gz == 0:
            return  # an empty grid launches nothing
        f = self.function(device)
        d = drv.driver()
        cfg = self._config
        if cfg is None:
            cfg = self._config = d.CUlaunchConfig()
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.ck.threads, 1, 1
            cfg.sharedMemBytes = self.ck.dynamic_shared_bytes
            cfg.numAttrs = 0
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx, gy, gz
        if stream is None:
            handle = torch._C._cuda_getCurrentRawStream(device)
        else:
            handle = stream.cuda_stream if hasattr(stream, "cuda_stream") else int(stream)
        s = self._streams.get(handle)
        if s is None:
            s = self._streams[handle] = d.CUstream(handle)
        cfg.hStream = s
        ptrs = self._ptr_array(*[x.getPtr() if type(x) is TensorMapSlot else ctypes.addressof(x) for x in slots])
        if self._debug_record is not None:
            self._reset_debug_record(device, s)
        err, = d.cuLaunchKernelEx(cfg, f, ctypes.addressof(ptrs), 0)
        if err != d.CUresult.CUDA_SUCCESS:
            from ..errors import DriverError
            raise DriverError("cuLaunchKernelEx", drv._result_name(d, err), self.ck.name,
                              f"grid={(gx, gy, gz)}, block={self.ck.threads}, smem={self.ck.dynamic_shared_bytes}")
        if self._debug_record is not None:
            self._check_debug_record(device, s)

    # -- debug mode (TYLOPY_DEBUG_WAITS=1 at compile time): bounded mbarrier waits -------------
    DEBUG_RECORD = "tylopy_debug_record"

    def _record_ptr(self, device):
        self.function(device)
        ptr, _size = drv.call("cuModuleGetGlobal", self._module, self.DEBUG_RECORD.encode(), kernel=self.ck.name)
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
