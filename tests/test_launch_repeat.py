"""``kernel[grid].repeat(...)``: a launch site that packs only the arguments whose packed value
changed since its last launch, without a GPU (a fake driver records the parameters)."""
import ctypes

import pytest
import torch

import tylopy as ty
from tylopy.testing import on_device
from tylopy_kernels.examples.vector_add import vector_add

TYPES = [ctypes.c_void_p] * 3 + [ctypes.c_int32]
FACTOR = 2.0


@ty.kernel(threads=32)
def scaled(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    i = ty.thread_idx()
    out[i] = x[i] * FACTOR


def params(launch, types=TYPES):
    ptrs = (ctypes.c_void_p * len(types)).from_address(launch["params"])
    return [t.from_address(p).value for t, p in zip(types, ptrs)]


def vectors(n=1000, device=0):
    return [on_device(torch.randn(n), device) for _ in range(3)]


def test_repeated_launches_pass_what_plain_launches_pass(fake):
    x, y, out = vectors()
    vector_add[(4,)].repeat(x, y, out, 1000)
    vector_add[(4,)](x, y, out, 1000)
    assert params(fake.launches[0]) == params(fake.launches[1]) == [x.data_ptr(), y.data_ptr(), out.data_ptr(), 1000]
    x2 = on_device(torch.randn(1000))
    vector_add[(4,)].repeat(x2, y, out, 999)      # a new address and a new size
    assert params(fake.launches[2]) == [x2.data_ptr(), y.data_ptr(), out.data_ptr(), 999]
    vector_add[(4,)].repeat(x2, y, out, 999)
    assert params(fake.launches[3]) == params(fake.launches[2])
    vector_add[(4,)].repeat(x, y, out, 1000)      # back to the first values
    assert params(fake.launches[4]) == params(fake.launches[0])
    assert all(launch["grid"] == (4, 1, 1) for launch in fake.launches)


def test_only_changed_arguments_are_packed_again(fake, monkeypatch):
    x, y, out = vectors()
    vector_add[(8,)].repeat(x, y, out, 1000)
    site = next(s for key, s in vector_add._kept.items() if key[0] == (8,))
    packed = []
    monkeypatch.setattr(site.launcher, "packers", tuple(
        (lambda i, p: lambda *a: packed.append(i) or p(*a))(i, p) for i, p in enumerate(site.launcher.packers)))
    vector_add[(8,)].repeat(x, y, out, 1000)
    assert packed == []
    vector_add[(8,)].repeat(x, y, on_device(out[:500]), 500)  # the same address, another shape: packed again
    vector_add[(8,)].repeat(on_device(x.clone()), y, out, 1000)
    assert packed == [2, 3, 0, 2, 3]  # out (its shape) and n; then x, and out and n back


def test_a_rejected_argument_is_checked_again_at_the_next_launch(fake):
    x, y, out = vectors()
    vector_add[(4,)].repeat(x, y, out, 1000)
    with pytest.raises(ty.LaunchTypeError, match="argument 'y' expects dtype torch.float32, but got torch.float16"):
        vector_add[(4,)].repeat(x, on_device(torch.randn(1000).half()), out, 1000)
    with pytest.raises(ty.LaunchValueError, match=r"argument 'n' expects a value in -2147483648..2147483647"):
        vector_add[(4,)].repeat(x, y, out, 2**40)
    vector_add[(4,)].repeat(x, y, out, 1000)
    assert params(fake.launches[-1]) == [x.data_ptr(), y.data_ptr(), out.data_ptr(), 1000]
    with pytest.raises(ty.LaunchValueError, match="argument 'out' is on cuda:1, but the launch runs on cuda:0"):
        vector_add[(4,)].repeat(x, y, on_device(torch.randn(1000), 1), 1000)


def test_each_device_has_its_own_site(fake):
    a, b = vectors(device=0), vectors(device=1)
    vector_add[(4,)].repeat(*a, 1000)
    vector_add[(4,)].repeat(*b, 1000)
    assert params(fake.launches[1])[:3] == [t.data_ptr() for t in b]
    assert fake.launches[0]["context"] != fake.launches[1]["context"]


def test_a_changed_global_compiles_again(fake, no_disk_cache):
    global FACTOR
    x, out = on_device(torch.randn(32)), on_device(torch.empty(32))
    scaled[(1,)].repeat(x, out)
    (site,) = scaled._kept.values()
    first = site.launcher.ck
    FACTOR = 3.0
    try:
        scaled[(1,)].repeat(x, out)
        (site,) = scaled._kept.values()
        assert site.launcher.ck is not first and "0f40400000" in site.launcher.ck.ptx.lower()
        assert len(fake.launches) == 2
    finally:
        FACTOR = 2.0
