"""The Hopper host path against a fake driver, shared by the host-path tests: ``hopper_host`` (a
fixture: launch_hopper's launches as the bytes their parameters carry), RecordedMap and qkv."""
import ctypes

import pytest
import torch

import tylopy as ty

from tylopy.runtime import tensormap as tm_mod
from tylopy.testing import fake_driver
from tylopy_kernels.attention.sm90 import launch as HL

class RecordedMap(tm_mod.TensorMap):
    """A tensor map whose 128 bytes hold what it was made from (address and geometry)."""

    def __init__(self, tensor, dims, strides, box, dtype):
        self.device = 0
        text = repr((tensor.data_ptr(), tuple(dims), tuple(strides), tuple(box), dtype)).encode()
        self._buf = ctypes.create_string_buffer(text, 128)

    def getPtr(self):
        return ctypes.addressof(self._buf)


@pytest.fixture
def hopper_host(monkeypatch):
    """launch_hopper against a fake sm_90 driver; yields the list of launches, each as the bytes
    its parameters would carry."""
    driver = fake_driver(devices=1)
    d = driver.__enter__()
    monkeypatch.setattr(tm_mod.TensorMap, "tiled", staticmethod(
        lambda t, dims, strides, box, dtype, swizzle=128, hold=True: RecordedMap(t, dims, strides, box, dtype)))
    monkeypatch.setattr(tm_mod, "_cache", {})
    monkeypatch.setattr(HL, "_repeats", ty.PlanCache("test launches", capacity=64))
    monkeypatch.setattr(HL, "sm_count", lambda dev: 132)
    monkeypatch.setattr(HL, "l2_bytes", lambda dev: 50 << 20)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)  # CPU tensors pass as cuda:0
    launches = []
    real = d.cuLaunchKernel

    def record(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        types = real_compile(**_last_constexprs[0]).launcher()._types
        sizes = [128 if t is None else ctypes.sizeof(t) for t in types]  # a map's 128 bytes, else the value's
        ptrs = (ctypes.c_void_p * len(sizes)).from_address(params)
        launches.append(((gx, gy, gz), f.value, [ctypes.string_at(p, n) for p, n in zip(ptrs, sizes)]))
        return real(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)
    d.cuLaunchKernel = record
    _last_constexprs[:] = [None]
    real_compile = HL.attention_fwd_sm90.compile

    def compile_and_note(**cx):
        _last_constexprs[0] = cx
        return real_compile(**cx)
    monkeypatch.setattr(HL.attention_fwd_sm90, "compile", compile_and_note)
    try:
        yield launches
    finally:
        driver.__exit__(None, None, None)


_last_constexprs = [None]


def qkv(b=2, h=4, n=256, d=64, h_kv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g).bfloat16()
    k, v = (torch.randn(b, h_kv or h, n, d, generator=g).bfloat16() for _ in range(2))
    return q, k, v
