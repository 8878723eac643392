"""Launch edges checked on the CPU with the fake driver: the stream argument (None, a known int
handle, anything else refused naming ``stream``), float parameters range-checked like ints (in
the launcher and the emulator alike), tensors with a strided last dimension refused for ``ty.ptr``
parameters with the fix in the message, a prepared launch keeping its tensors alive, and the
autotuner never timing under CUDA graph capture."""
import ctypes
import gc
import warnings
import weakref

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.errors import LaunchTypeError, LaunchValueError
from tylopy.jit import autotune as at
from tylopy.testing import on_device
from tylopy_kernels.examples.vector_add import vector_add

import kernels_for_tests as K


def vectors(n=64):
    return [on_device(torch.randn(n), 0) for _ in range(3)]


# -- streams ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("handle", [0, 1, 2, 7000])  # default, legacy, per-thread, torch's current (fake: 7000)
def test_known_int_streams_launch(fake, handle):
    vector_add[(1,)](*vectors(), 64, stream=handle)
    assert fake.launches[-1]["stream"] == handle


def test_unknown_int_stream_is_refused_naming_stream(fake):
    with pytest.raises(LaunchValueError) as e:
        vector_add[(1,)](*vectors(), 64, stream=0xDEAD0)
    msg = str(e.value)
    print(msg)
    assert "vector_add: stream expects None, a torch.cuda.Stream, or the int handle of a known stream" in msg
    assert "unknown handle 0xdead0" in msg and "torch.cuda.ExternalStream(0xdead0)" in msg
    assert fake.launches == []


@pytest.mark.parametrize("bad", ["7000", 7000.0, True, object(), [7000]])
def test_stream_of_a_wrong_type_is_refused(fake, bad):
    with pytest.raises(LaunchTypeError, match=r"vector_add: stream expects None, a torch.cuda.Stream or an int "
                                              r"stream handle, but got"):
        vector_add[(1,)](*vectors(), 64, stream=bad)
    assert fake.launches == []


def test_stream_is_checked_by_a_prepared_launch_and_an_empty_grid(fake):
    run = vector_add[(1,)].prepare(*vectors(), 64)
    with pytest.raises(LaunchValueError, match="stream expects None"):
        run.launch(stream=12345)
    run.launch(stream=7000)
    with pytest.raises(LaunchTypeError, match="stream expects None"):
        vector_add[(0,)](*vectors(), 64, stream="s")


# -- floats ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scalars():
    return K.scalars_first.compile().launcher()


@pytest.mark.parametrize("alpha", [3.4028234663852886e38, -3.4028234663852886e38, 1e-45, float("inf"),
                                   float("-inf"), float("nan"), 0.0, 7])
def test_f32_values_in_range_pass(scalars, alpha):
    with pytest.raises(LaunchTypeError, match="'out' expects a torch.Tensor"):
        scalars.pack((4, alpha, True, None))  # everything before 'out' passed its checks


@pytest.mark.parametrize("alpha", [1e39, -3.5e38, 2**128, 10**400])
def test_f32_values_out_of_range_name_the_argument(scalars, alpha):
    with pytest.raises(LaunchValueError, match=r"scalars_first: argument 'alpha' expects a value of magnitude at most "
                                               r"3.4028235e\+38 \(f32\), inf or nan, but got"):
        scalars.pack((4, alpha, True, None))


@pytest.mark.parametrize("alpha", [1e39, 10**400])
def test_the_emulator_range_checks_floats_alike(alpha):
    out = np.zeros(32, np.float32)
    with pytest.raises(LaunchValueError, match=r"argument 'alpha' expects a value of magnitude at most 3.4028235e\+38"):
        K.scalars_first.emulate(4, alpha, True, out, grid=(1,))
    K.scalars_first.emulate(4, 3.0e38, True, out, grid=(1,))
    assert out[0] == np.float32(3.0e38)


# -- strided last dimension ------------------------------------------------------------------------

@pytest.mark.parametrize("view", ["transposed", "every_other", "expanded"])
def test_ptr_refuses_a_strided_last_dimension_with_the_fix(fake, view):
    base = torch.randn(64, 64)
    x = {"transposed": base.t(), "every_other": base.reshape(-1)[::2][:64],
         "expanded": torch.randn(1).expand(64)}[view]
    x = on_device(x, 0)
    y, out = vectors()[:2]
    with pytest.raises(LaunchValueError) as e:
        vector_add[(1,)](x, y, out, 64)
    msg = str(e.value)
    print(msg)
    assert "vector_add: argument 'x' expects a tensor whose last dimension is contiguous (stride 1)" in msg
    assert f"strides {tuple(x.stride())}" in msg and "pass x.contiguous()" in msg and "ty.tensor(...)" in msg
    assert fake.launches == []


def test_strided_marks_a_tensor_the_kernel_addresses_through_strides(fake):
    mask = on_device(torch.randn(64, 1).expand(64, 64), 0)  # stride 0 along the last dimension
    y, out = vectors()[:2]
    with pytest.raises(LaunchValueError, match=r"or, if the kernel takes the strides as arguments, pass "
                                               r"ty.strided\(x\)"):
        vector_add[(1,)](mask, y, out, 64)
    assert ty.strided(mask) is mask
    vector_add[(1,)](mask, y, out, 64)
    assert len(fake.launches) == 1


def test_the_emulator_refuses_a_strided_last_dimension_alike():
    x = torch.randn(64, 64).t()
    y, out = torch.randn(64 * 64), torch.zeros(64 * 64)
    with pytest.raises(LaunchValueError, match=r"argument 'x' expects a tensor whose last dimension is contiguous"):
        vector_add.emulate(x, y, out, 64, grid=(1,))


def test_ptr_accepts_views_with_a_contiguous_last_dimension(fake):
    rows = on_device(torch.randn(8, 128)[:, :64], 0)  # a row slice: strided rows, contiguous within one
    one = on_device(torch.randn(64, 3)[:, :1], 0)  # last dimension of size 1: its stride does not matter
    vector_add[(1,)](rows, *vectors()[:2], 64)
    vector_add[(1,)](one, *vectors()[:2], 64)
    assert len(fake.launches) == 2


# -- a prepared launch keeps what it packed ---------------------------------------------------------

def test_a_prepared_launch_keeps_its_tensors_alive(fake):
    x, y, out = vectors()
    refs = [weakref.ref(t) for t in (x, y, out)]
    run = vector_add[(1,)].prepare(x, y, out, 64)
    del x, y, out
    gc.collect()
    assert all(r() is not None for r in refs)
    x2 = vectors()[0]
    run.set("x", x2)
    gc.collect()
    assert refs[0]() is None and refs[1]() is not None  # the replaced tensor is let go, the new one kept
    del run
    gc.collect()
    assert refs[1]() is None


@ty.kernel(threads=64)
def copy_rows(src: ty.tensor(2), dst: ty.tensor(2)):
    r = ty.block_idx()
    for c in range(ty.thread_idx(), src.shape[1], 64):
        dst[r, c] = src[r, c]


def test_a_prepared_launch_keeps_the_storage_of_views_it_packed(fake):
    """A ``ty.tensor`` argument that is a view of a temporary (the caller keeps neither): the storage
    the packed pointer points into stays alive while the prepared launch does."""
    src = on_device(torch.randn(8, 20)[:, 4:14], 0)  # a view: its base is referenced by nothing else
    dst = on_device(torch.empty(10, 8).t(), 0)
    base = weakref.ref(src._base)
    ptrs = (src.data_ptr(), dst.data_ptr())
    run = copy_rows[(8,)].prepare(src, dst)
    del src, dst
    gc.collect()
    assert base() is not None
    run.launch()
    params = (ctypes.c_void_p * 10).from_address(fake.launches[-1]["params"])
    assert (ctypes.c_void_p.from_address(params[0]).value, ctypes.c_void_p.from_address(params[5]).value) == ptrs
    del run
    gc.collect()
    assert base() is None


# -- autotuning and CUDA graph capture ---------------------------------------------------------------

def _tuned(calls, timed):
    def launch(x, n, BLOCK=0):
        calls.append(BLOCK)
        return BLOCK

    def timer(fn):
        timed.append(fn.keywords["BLOCK"])
        return {64: 3.0, 128: 1.0}[fn.keywords["BLOCK"]]
    return ty.autotune(configs=[ty.Config(BLOCK=64), ty.Config(BLOCK=128)], key=["n"], timer=timer,
                       name="tests.capture", device=lambda a: "fake-gpu")(launch)


def test_autotune_under_capture_runs_the_default_untimed_and_says_so(cache_dir, monkeypatch):
    monkeypatch.delenv("TYLOPY_AUTOTUNE", raising=False)
    calls, timed = [], []
    tuned = _tuned(calls, timed)
    monkeypatch.setattr(at, "capturing", lambda: True)
    with pytest.warns(at.AutotuneWarning, match="under CUDA graph capture.*running the default Config\\(BLOCK=64\\) "
                                                  "untuned"):
        assert tuned("x", 10) == 64
    assert timed == [] and calls == [64]
    monkeypatch.setattr(at, "capturing", lambda: False)
    assert tuned("x", 10) == 128 and timed == [64, 128]  # tunes at the next call outside a capture
    monkeypatch.setattr(at, "capturing", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuned("x", 10) == 128  # a choice already made is used under capture, silently
    assert timed == [64, 128]


def test_capturing_is_false_without_cuda():
    assert at.capturing() is (False if not torch.cuda.is_available() else at.capturing())
