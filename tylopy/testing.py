"""Host-path testing without a GPU: a fake CUDA driver that records what tylopy asks of it, and CPU
tensors that report a CUDA device.

    from tylopy.testing import fake_driver, on_device

    with fake_driver() as d:
        x, y, out = (on_device(torch.randn(1000)) for _ in range(3))
        vector_add[(4,)](x, y, out, 1000)
    d.launches[0]["grid"]        # (4, 1, 1); "params" is the void*[] the kernel would receive

Nothing runs: a launch is checked, packed and handed to the fake, so launchers (argument packing,
plans, tensor maps, context switches) can be tested on any machine. ``ty.observe()`` reports the
same launches without a fake.
"""
from __future__ import annotations

import contextlib

from .runtime import driver as _driver

__all__ = ["FakeDriver", "Handle", "fake_driver", "on_device"]


class Handle:
    """A driver handle (context, module, function, stream) with an ``int()`` value."""

    def __init__(self, value):
        self.value = value

    def __int__(self):
        return self.value if isinstance(self.value, int) else id(self.value)

    def __repr__(self):
        return f"Handle({self.value!r})"


class FakeDriver:
    """The part of cuda.bindings.driver tylopy calls, recording each call.

    ``calls`` lists (what, argument) for context retains, switches and module loads; ``launches``
    one dict per ``cuLaunchKernel`` (function, context, grid, block, smem, stream, params)."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = "smem"

    class CUfunction_attribute:
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = "max_dyn_smem"

    def __init__(self, capability=(9, 0), devices=2, shared_memory=227 * 1024):
        self.calls: list = []
        self.launches: list = []
        self.current = Handle(0)
        self.capability = capability
        self.devices = devices
        self.shared_memory = shared_memory

    def CUstream(self, handle):
        return Handle(handle)

    def cuGetErrorName(self, err):
        return 0, b"CUDA_ERROR_FAKE"

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGetCount(self):
        return 0, self.devices

    def cuDeviceGet(self, i):
        return 0, i

    def cuDevicePrimaryCtxRetain(self, dev):
        self.calls.append(("retain", dev))
        return 0, Handle(100 + dev)

    def cuCtxGetCurrent(self):
        return 0, self.current

    def cuCtxSetCurrent(self, ctx):
        self.calls.append(("set_current", int(ctx)))
        self.current = ctx
        return (0,)

    def cuDeviceGetAttribute(self, attr, dev):
        values = {"major": self.capability[0], "minor": self.capability[1], "smem": self.shared_memory}
        return 0, values[attr]

    def cuModuleLoadData(self, image):
        self.calls.append(("load", int(self.current), image[:16]))
        return 0, Handle(("module", int(self.current)))

    def cuModuleGetFunction(self, module, name):
        return 0, Handle(("function", module.value, name))

    def cuFuncSetAttribute(self, f, attr, value):
        return (0,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.launches.append(dict(function=f.value, context=int(self.current), grid=(gx, gy, gz), block=bx,
                                  smem=smem, stream=stream.value, params=params))
        return (0,)

    # cuLaunchKernelEx and its configuration objects (cluster launches)
    class CUlaunchAttributeID:
        CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4

    class CUlaunchAttribute:
        def __init__(self):
            import types
            self.id = None
            self.value = types.SimpleNamespace(clusterDim=types.SimpleNamespace(x=0, y=0, z=0))

    class CUlaunchConfig:
        pass

    def cuLaunchKernelEx(self, config, f, params, extra):
        cluster = None
        for a in config.attrs[:config.numAttrs]:
            if a.id == self.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
                cluster = (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z)
        self.launches.append(dict(function=f.value, context=int(self.current),
                                  grid=(config.gridDimX, config.gridDimY, config.gridDimZ), block=config.blockDimX,
                                  smem=config.sharedMemBytes, stream=config.hStream.value, params=params,
                                  cluster=cluster))
        return (0,)


@contextlib.contextmanager
def fake_driver(capability=(9, 0), devices=2, stream_base=7000):
    """Launches inside go to a new ``FakeDriver`` (yielded); see ``driver.substitute``."""
    with _driver.substitute(FakeDriver(capability, devices), stream_base=stream_base) as d:
        yield d


_on_device_class = None


def on_device(t, device: int = 0):
    """A view of CPU tensor ``t`` whose ``get_device()`` says ``device`` (the launcher asks it)."""
    global _on_device_class
    if _on_device_class is None:
        import torch

        class OnDevice(torch.Tensor):
            device_index = 0
            __torch_function__ = torch._C._disabled_torch_function_impl  # methods at C speed, as a plain tensor

            def get_device(self):
                return self.device_index
        _on_device_class = OnDevice
    x = t.as_subclass(_on_device_class)
    x.device_index = device
    return x
