"""One invalidation rule for every cached compile and plan: a specialization is reused only while
``CompiledKernel.is_current()`` holds (same environment options, every value its trace read
unchanged); otherwise the launcher compiles again. Here for the portable attention's and the decode
launcher (the Hopper launchers go through ``kernel[grid]``, whose guards apply the same rule)."""
import torch

import tylopy as ty
from tylopy_kernels.attention.decode import launch as decode_launch
from tylopy_kernels.attention.portable import launch as portable_launch

SCALE = 2.0


@ty.kernel(threads=32)
def scaled(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    i = ty.thread_idx()
    out[i] = x[i] * SCALE


def test_portable_launcher_compiles_again_after_a_global_changes(monkeypatch):
    global SCALE
    monkeypatch.setitem(portable_launch._archs, 0, ("sm_80", False))
    dev = torch.device("cuda", 0)
    first = portable_launch.compiled_for(dev, scaled)
    assert portable_launch.compiled_for(dev, scaled) is first
    SCALE = 3.0
    try:
        second = portable_launch.compiled_for(dev, scaled)
        assert second is not first and "0f40400000" in second.ptx.lower()  # 3.0 in PTX's hex float form
    finally:
        SCALE = 2.0


def test_decode_launcher_compiles_again_after_a_global_changes(monkeypatch):
    global SCALE
    monkeypatch.setitem(decode_launch._archs, 0, ("sm_80", False))
    dev = torch.device("cuda", 0)
    first = decode_launch.compiled_for(scaled, dev)
    assert decode_launch.compiled_for(scaled, dev) is first
    SCALE = 3.0
    try:
        second = decode_launch.compiled_for(scaled, dev)
        assert second is not first and "0f40400000" in second.ptx.lower()
    finally:
        SCALE = 2.0
    from tylopy.runtime.plancache import caches
    assert "attention_decode kernels" in [name for name, _, _ in caches()]
