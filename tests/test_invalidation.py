"""One invalidation rule for every cached compile and plan: a specialization is reused only while
``CompiledKernel.is_current()`` holds (same environment options, every value its trace read
unchanged); otherwise the launcher compiles again. Here for the portable attention's and the decode
launcher (the Hopper launchers go through ``kernel[grid]``, whose guards apply the same rule)."""
import pytest
import torch

import tylopy as ty
from tylopy.runtime.plancache import caches, identity_key
from tylopy_kernels.attention.decode import launch as decode_launch
from tylopy_kernels.attention.portable import launch as portable_launch

SCALE = 2.0


@ty.kernel(threads=32)
def scaled(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    i = ty.thread_idx()
    out[i] = x[i] * SCALE


LAUNCHERS = {  # name -> (module, its compiled_for as (device, kernel) -> CompiledKernel, its cache's name)
    "portable": (portable_launch, lambda dev, k: portable_launch.compiled_for(dev, k), "portable attention kernels"),
    "decode": (decode_launch, lambda dev, k: decode_launch.compiled_for(k, dev), "attention_decode kernels"),
}


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_launcher_compiles_again_after_a_global_changes(name, monkeypatch):
    global SCALE
    module, compiled_for, cache_name = LAUNCHERS[name]
    monkeypatch.setitem(module._archs, 0, ("sm_80", False))
    dev = torch.device("cuda", 0)
    first = compiled_for(dev, scaled)
    assert compiled_for(dev, scaled) is first
    SCALE = 3.0
    try:
        second = compiled_for(dev, scaled)
        assert second is not first and "0f40400000" in second.ptx.lower()  # 3.0 in PTX's hex float form
    finally:
        SCALE = 2.0
    assert cache_name in [c[0] for c in caches()]   # a PlanCache: bounded, cleared by clear_caches()


def test_entries_keyed_by_identity_serve_only_the_objects_they_hold():
    """``identity_key`` + ``get_held``/``put_held``: an entry is found only with the very objects it
    was put with (it keeps them alive, so their ids stay theirs), and a tensor written in place has a
    new key."""
    cache = ty.PlanCache("identity test", capacity=4)
    t = torch.zeros(3)
    key = identity_key([t])
    cache.put_held(key, "plan", [t])
    assert cache.get_held(key, [t]) == "plan"
    assert cache.get_held(key, [torch.zeros(3)]) is None     # another object under a matching key
    t.add_(1)
    assert identity_key([t]) != key
