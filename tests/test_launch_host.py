"""The host side of a launch without a GPU: a fake CUDA driver records what the launcher asks of
it, and CPU tensors pretend to live on cuda:0 or cuda:1. Checks the parameters the kernel would
receive (pointers, scalars, tensor shapes and strides), the context switch for a tensor on a
second device, the image chosen for the device's architecture, and the Python cost per launch.
"""
import ctypes
import time

import pytest
import torch

import tylopy as ty
from tylopy.errors import ArchMismatchError, LaunchValueError
from tylopy.runtime import driver as drv
from tylopy.runtime import launch as rl
from tylopy.testing import FakeDriver, Handle, on_device
from tylopy_kernels.examples.vector_add import vector_add

import kernels_for_tests as K


def on(device: int, t: torch.Tensor) -> torch.Tensor:
    return on_device(t, device)


def read_params(address: int, ctypes_types) -> list:
    """Decode the void*[] the kernel would receive."""
    ptrs = (ctypes.c_void_p * len(ctypes_types)).from_address(address)
    return [t.from_address(p).value for t, p in zip(ctypes_types, ptrs)]


def fresh_kernel(kernel, arch=None):
    return ty.Kernel(kernel.fn, kernel.threads, arch or kernel.arch, kernel.min_blocks_per_sm, kernel.max_registers,
                     kernel.name, _register=False)


def vectors(device=0, n=1000):
    return [on(device, torch.randn(n)) for _ in range(3)]


def test_vector_add_parameters_reach_the_driver(fake):
    x, y, out = vectors()
    vector_add[(4,)](x, y, out, 1000)
    (launch,) = fake.launches
    assert launch["grid"] == (4, 1, 1) and launch["block"] == 256 and launch["stream"] == 7000
    got = read_params(launch["params"], [ctypes.c_void_p] * 3 + [ctypes.c_int32])
    assert got == [x.data_ptr(), y.data_ptr(), out.data_ptr(), 1000]


def test_a_tensor_on_the_second_device_launches_in_its_context(fake):
    k = fresh_kernel(vector_add)
    k[(1,)](*vectors(device=1), 1000)
    k[(1,)](*vectors(device=0), 1000)
    k[(1,)](*vectors(device=1), 1000)
    assert [l["context"] for l in fake.launches] == [101, 100, 101]
    assert [l["stream"] for l in fake.launches] == [7001, 7000, 7001]
    assert [c[1] for c in fake.calls if c[0] == "load"] == [101, 100]  # one module per device, in its context
    assert {l["function"][1] for l in fake.launches} == {("module", 101), ("module", 100)}


def test_the_context_switch_happens_even_if_someone_else_changed_it(fake):
    k = fresh_kernel(vector_add)
    k[(1,)](*vectors(device=1), 1000)
    fake.current = Handle(100)  # e.g. torch switched the thread to cuda:0 meanwhile
    k[(1,)](*vectors(device=1), 1000)
    assert [l["context"] for l in fake.launches] == [101, 101]
    assert int(fake.current) == 100  # and the launch put torch's context back


def test_a_launch_on_another_device_restores_the_current_context(fake):
    k = fresh_kernel(vector_add)
    fake.current = Handle(100)  # torch works on cuda:0
    k[(1,)](*vectors(device=1), 1000)
    assert fake.launches[0]["context"] == 101 and int(fake.current) == 100
    switches = [c[1] for c in fake.calls if c[0] == "set_current"]
    assert switches == [101, 100, 101, 100]  # load the module in 101, back; launch in 101, back


def test_one_device_sets_the_context_once_per_thread(fake):
    fake.devices = 1
    k = fresh_kernel(vector_add)
    for _ in range(5):
        k[(1,)](*vectors(device=0), 1000)
    assert [c for c in fake.calls if c[0] == "set_current"] == [("set_current", 100)]


def test_tensors_on_two_devices_are_rejected(fake):
    x, y, out = vectors(device=0)
    with pytest.raises(LaunchValueError, match="argument 'y' is on cuda:1, but the launch runs on cuda:0"):
        fresh_kernel(vector_add)[(1,)](x, on(1, torch.randn(1000)), out, 1000)


@ty.kernel(threads=64)
def copy_2d(src: ty.tensor(2), dst: ty.tensor(2)):
    r = ty.block_idx()
    for c in range(ty.thread_idx(), src.shape[1], 64):
        dst[r, c] = src[r, c]


def test_tensor_parameters_pass_pointer_shape_and_strides(fake):
    src = on(0, torch.randn(6, 10, dtype=torch.float16).t())  # a transposed view: strides (1, 10)
    dst = on(0, torch.empty(10, 6, dtype=torch.float16))
    copy_2d[(10,)](src, dst)
    got = read_params(fake.launches[0]["params"], [ctypes.c_void_p] + [ctypes.c_int32] * 4 +
                      [ctypes.c_void_p] + [ctypes.c_int32] * 4)
    assert got == [src.data_ptr(), 10, 6, 1, 10, dst.data_ptr(), 10, 6, 6, 1]


def test_each_dtype_of_an_open_tensor_is_its_own_specialization(fake, no_disk_cache):
    k = fresh_kernel(copy_2d)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        k[(2,)](on(0, torch.zeros(2, 3, dtype=dt)), on(0, torch.zeros(2, 3, dtype=dt)))
    keys = {tuple(sorted(ck.constexprs.items(), key=str)) for entries in k._compiled.values() for ck in entries}
    assert {str(dict(key)["src"]) for key in keys} == {"f32", "bf16", "f16"}
    with pytest.raises(ty.KernelSourceError, match="store to ptr<f16, global> expects f16 values, but got f32"):
        k[(2,)](on(0, torch.zeros(2, 3)), on(0, torch.zeros(2, 3, dtype=torch.float16)))  # two open dtypes


@pytest.mark.parametrize("arch, capability, plan", [
    ("sm_80", (8, 0), "cubin"), ("sm_80", (8, 6), "cubin"), ("sm_80", (8, 9), "cubin"), ("sm_80", (9, 0), "ptx"),
    ("sm_86", (9, 0), "ptx"), ("sm_90", (9, 0), "cubin"), ("sm_90", (10, 0), "ptx"), ("sm_90a", (9, 0), "cubin"),
    ("sm_89", (12, 0), "ptx"),
])
def test_load_plan(arch, capability, plan):
    assert rl.load_plan(arch, capability) == plan


@pytest.mark.parametrize("arch, capability, message", [
    ("sm_90a", (8, 0), "exist only on compute capability 9.0, but the device is sm_80"),
    ("sm_90a", (10, 0), "exist only on compute capability 9.0, but the device is sm_100"),
    ("sm_86", (8, 0), "the device is sm_80, an older architecture"),
    ("sm_90", (8, 9), "an older architecture; compile it with arch='sm_89'"),
])
def test_arch_that_cannot_run_says_why(arch, capability, message):
    with pytest.raises(ArchMismatchError, match=message):
        rl.load_plan(arch, capability)


def test_an_sm80_kernel_on_a_hopper_loads_its_ptx(fake):
    k = fresh_kernel(K.tiny)  # arch sm_80
    k[(1,)](on(0, torch.zeros(32)))
    (load,) = [c for c in fake.calls if c[0] == "load"]
    assert load[2].startswith(b"//")  # PTX text for the driver to compile, not an ELF cubin


def test_an_sm90a_kernel_on_an_ampere_is_an_arch_error(fake):
    fake.capability = (8, 0)
    with pytest.raises(ArchMismatchError, match="vector_add on cuda:0: the kernel was compiled for sm_90a"):
        fresh_kernel(vector_add)[(1,)](*vectors(), 1000)


def microseconds_per_call(fake, fn, n=1000, repeats=7) -> float:
    """CPU time of this process per call, the best of several runs (the machine may be shared)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        fake.launches.clear()
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def test_python_cost_of_a_launch(fake, capsys):
    """The launcher's own cost with a driver call that does nothing (printed; bounded loosely)."""
    x, y, out = vectors()
    us_launch = microseconds_per_call(fake, lambda: vector_add[(4,)](x, y, out, 1000))
    launcher = vector_add.compile().launcher()
    us_prepared = microseconds_per_call(fake, lambda: launcher.launch((4,), (x, y, out, 1000)))
    src, dst = on(0, torch.randn(8, 8)), on(0, torch.randn(8, 8))
    us_tensor = microseconds_per_call(fake, lambda: copy_2d[(8,)](src, dst))
    with capsys.disabled():
        print(f"\n[host overhead, fake driver] kernel[grid](...): {us_launch:.2f} us; "
              f"CompiledKernel launcher: {us_prepared:.2f} us; two 2-D tensor arguments: {us_tensor:.2f} us")
    assert us_launch < 60 and us_prepared < 40


def test_launch_path_does_not_grow_memory(fake):
    import gc
    import tracemalloc
    x, y, out = vectors()
    for _ in range(200):
        vector_add[(4,)](x, y, out, 1000)
    fake.launches.clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(2000):
            vector_add[(4,)](x, y, out, 1000)
        fake.launches.clear()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 16 * 1024, grown  # nothing kept per launch


@pytest.mark.gpu
def test_second_device_on_a_real_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    from conftest import for_this_gpu
    k = for_this_gpu(vector_add)
    for dev in (1, 0, 1):
        x = torch.randn(1000, device=f"cuda:{dev}")
        y = torch.randn(1000, device=f"cuda:{dev}")
        out = torch.full((1000,), float("nan"), device=f"cuda:{dev}")
        k[(4,)](x, y, out, 1000)
        torch.cuda.synchronize(dev)
        torch.testing.assert_close(out, x + y)


def test_a_tensor_map_holds_its_tensor_unless_told_not_to():
    """A user's map keeps its memory alive; a launcher cache's map (hold=False) does not."""
    import gc
    import weakref
    from tylopy.runtime.tensormap import TensorMap, TensorMapSpec
    t = torch.zeros(64, 64, dtype=torch.bfloat16)
    held = TensorMap(Handle(0), TensorMapSpec(t, (64, 64), (128,), (64, 64), "bf16", 128))
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is not None and held.spec.tensor is ref()
    t = ref()
    del held
    tm = TensorMap(Handle(0), TensorMapSpec(t, (64, 64), (128,), (64, 64), "bf16", 128), hold=False)
    assert tm.spec.tensor is t and tm.device is None  # a CPU tensor has no CUDA index
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is None
    with pytest.raises(LaunchValueError, match="the tensor this tensor map describes has been freed"):
        tm.spec


@pytest.mark.gpu
def test_an_sm80_kernel_runs_on_a_newer_gpu():
    """No for_this_gpu: the sm_80 kernel's PTX is compiled by the driver for the device at hand."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a GPU newer than sm_8x")
    out = torch.full((32,), float("nan"), device="cuda")
    K.tiny[(1,)](out)
    torch.cuda.synchronize()
    assert (out == 1.0).all()


@pytest.mark.gpu
def test_an_sm90a_kernel_on_another_gpu_says_why():
    if torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("sm_90a runs here")
    x = torch.zeros(1000, device="cuda")
    with pytest.raises(ArchMismatchError, match="exist only on compute capability 9.0"):
        vector_add[(4,)](x, x, x, 1000)


@ty.kernel(threads=32)
def takes_a_map(tm: ty.tensormap, out: ty.ptr(ty.f32), n: ty.i32):
    out[0] = ty.cast(n, ty.f32)


class MapHandle:
    def __init__(self):
        self.buffer = (ctypes.c_uint8 * 128)()

    def getPtr(self):
        return ctypes.addressof(self.buffer)


def test_a_tensor_map_parameter_passes_the_maps_own_memory(fake):
    from tylopy.runtime.tensormap import TensorMap, TensorMapSpec
    t = on(0, torch.zeros(64, 64, dtype=torch.bfloat16))
    t.device_index = 0
    spec = TensorMapSpec(t, (64, 64), (128,), (64, 64), "bf16", 128)
    tm = TensorMap(MapHandle(), spec)
    tm.device = 0
    out = on(0, torch.zeros(4))
    fresh_kernel(takes_a_map)[(1,)](tm, out, 7)
    ptrs = (ctypes.c_void_p * 3).from_address(fake.launches[0]["params"])
    assert ptrs[0] == tm.getPtr()
    assert ctypes.c_void_p.from_address(ptrs[1]).value == out.data_ptr()
    assert ctypes.c_int32.from_address(ptrs[2]).value == 7


def test_a_prepared_launch_packs_once_and_repacks_what_is_set(fake):
    x, y, out = vectors()
    run = vector_add[(4,)].prepare(x, y, out, 1000)
    assert fake.launches == []  # preparing launches nothing
    types = [ctypes.c_void_p] * 3 + [ctypes.c_int32]
    run.launch()
    first = read_params(fake.launches[0]["params"], types)  # what the driver copied at the launch
    x2 = on(0, torch.randn(1000))
    run.set("x", x2)
    run.set(3, 999)
    run.launch()
    second = read_params(fake.launches[1]["params"], types)
    assert first == [x.data_ptr(), y.data_ptr(), out.data_ptr(), 1000]
    assert second == [x2.data_ptr(), y.data_ptr(), out.data_ptr(), 999]
    assert fake.launches[1]["grid"] == (4, 1, 1) and fake.launches[1]["stream"] == 7000
    vector_add[(4,)](x, y, out, 5)  # the kernel's own launches use other parameter memory
    run.launch()
    assert read_params(fake.launches[-1]["params"], [ctypes.c_void_p] * 3 + [ctypes.c_int32])[3] == 999


def test_a_prepared_launch_checks_what_is_set(fake):
    x, y, out = vectors()
    run = vector_add[(4,)].prepare(x, y, out, 1000)
    with pytest.raises(ty.LaunchTypeError, match=r"set expects an argument name \(x, y, out, n\) or position, "
                                                   r"but got 'z'"):
        run.set("z", x)
    with pytest.raises(ty.LaunchTypeError, match="argument 'y' expects dtype torch.float32, but got torch.float16"):
        run.set("y", on(0, torch.randn(1000).half()))
    with pytest.raises(LaunchValueError, match="argument 'out' is on cuda:1, but the launch runs on cuda:0"):
        run.set("out", on(1, torch.randn(1000)))
    with pytest.raises(LaunchValueError, match=r"argument 'n' expects a value in -2147483648..2147483647"):
        run.set("n", 2**40)
    with pytest.raises(ty.LaunchTypeError, match=r"or position, but got \[1\]"):
        run.set([1], x)
    with pytest.raises(LaunchValueError, match="arguments 'y', 'out', 'n' have no valid value since the last set"):
        run.launch()  # the failed sets above left them unset
    run.set("y", y)
    run.set("out", out)
    with pytest.raises(LaunchValueError, match="argument 'n' has no valid value"):
        run.launch()
    run.set("n", 1000)
    run.launch()
    assert read_params(fake.launches[-1]["params"], [ctypes.c_void_p] * 3 + [ctypes.c_int32])[1:] == [
        y.data_ptr(), out.data_ptr(), 1000]
    with pytest.raises(ty.LaunchTypeError, match="expects 4 arguments"):
        vector_add[(4,)].prepare(x, y, out)
    with pytest.raises(ty.LaunchTypeError, match="grid expects an int or a tuple"):
        vector_add.compile().prepare("four", x, y, out, 1000)


def test_a_prepared_launch_on_the_second_device_runs_in_its_context(fake):
    k = fresh_kernel(vector_add)
    run = k[(2,)].prepare(*vectors(device=1), 1000)
    run.launch()
    assert fake.launches[0]["context"] == 101 and fake.launches[0]["stream"] == 7001
    run2 = k[(0,)].prepare(*vectors(device=0), 1000)  # an empty grid launches nothing
    run2.launch()
    assert len(fake.launches) == 1


def test_a_prepared_launch_keeps_the_maps_it_passes(fake):
    import gc
    import weakref
    from tylopy.runtime.tensormap import TensorMap, TensorMapSpec
    t = on(0, torch.zeros(64, 64, dtype=torch.bfloat16))
    spec = TensorMapSpec(t, (64, 64), (128,), (64, 64), "bf16", 128)

    handles = []

    def a_map():
        handles.append(MapHandle())
        tm = TensorMap(handles[-1], spec)
        tm.device = 0
        return tm
    out = on(0, torch.zeros(4))
    run = fresh_kernel(takes_a_map)[(1,)].prepare(a_map(), out, 7)
    run.set(0, a_map())
    first, second = (weakref.ref(h) for h in handles)
    del handles[:]
    gc.collect()
    assert first() is None and second() is not None  # it keeps the map it passes, and only that one
    run.launch()
    assert (ctypes.c_void_p * 3).from_address(fake.launches[0]["params"])[0] == ctypes.addressof(second().buffer)


def test_a_known_map_geometry_still_checks_each_new_address():
    """TensorMapSpec skips re-checking a geometry it checked before, never the address."""
    from tylopy.runtime.tensormap import TensorMapSpec
    flat = torch.zeros(64 * 64 + 8, dtype=torch.bfloat16)
    t = flat[:4096].view(64, 64)
    for _ in range(2):
        TensorMapSpec(t, (64, 64), (128,), (64, 64), "bf16", 128)
    odd = flat[1:4097].view(64, 64)  # 2 bytes past a 16-byte boundary
    with pytest.raises(LaunchValueError, match="base address expects 16-byte alignment"):
        TensorMapSpec(odd, (64, 64), (128,), (64, 64), "bf16", 128)
    with pytest.raises(LaunchValueError, match="box\\[1\\] expects 1..256, but got 512"):
        TensorMapSpec(t, (64, 64), (128,), (64, 512), "bf16", 128)


def test_a_new_address_with_a_known_geometry_converts_no_argument_again(monkeypatch):
    import types
    from tylopy.runtime import tensormap as tm
    converted, encoded = [], []

    class Bindings(types.SimpleNamespace):
        def cuuint64_t(self, x):
            converted.append(x)
            return ("u64", x)

        def cuuint32_t(self, x):
            converted.append(x)
            return ("u32", x)

        def cuTensorMapEncodeTiled(self, *args):
            encoded.append(args)
            return 0, MapHandle()

    d = Bindings(CUresult=FakeDriver.CUresult, CUtensorMapDataType=int, CUtensorMapSwizzle=int,
                 CUtensorMapL2promotion=int, CUtensorMapInterleave=types.SimpleNamespace(CU_TENSOR_MAP_INTERLEAVE_NONE=0),
                 CUtensorMapFloatOOBfill=types.SimpleNamespace(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE=0))
    monkeypatch.setattr(drv, "driver", lambda: d)
    monkeypatch.setattr(drv, "ensure_context", lambda device: None)
    monkeypatch.setattr(tm, "_arguments", {})
    monkeypatch.setattr(tm, "_cache", {})
    a, b = (on(0, torch.zeros(64, 64, dtype=torch.bfloat16)) for _ in range(2))
    maps = [tm.TensorMap.cached(t, (64, 64), (128,), (64, 64), "bf16") for t in (a, b, a)]
    assert maps[0] is maps[2] and maps[0] is not maps[1]  # the third is the cached first
    assert len(encoded) == 2 and [e[2] for e in encoded] == [a.data_ptr(), b.data_ptr()]
    assert encoded[0][3:] == encoded[1][3:] and len(converted) == 2 + 1 + 2 + 1  # dims, strides, box, ones
