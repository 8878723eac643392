"""Launch-boundary checks that run before any driver call, so they need no GPU: each bad
argument gets a LaunchTypeError/LaunchValueError (also a TypeError/ValueError) naming it."""
import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.runtime import driver
from tylopy.runtime.launch import check_grid
from tylopy_kernels.examples.vector_add import vector_add

import kernels_for_tests as K
from conftest import cuda_available


@pytest.fixture(scope="module")
def va():
    return vector_add.compile().launcher()


@pytest.fixture(scope="module")
def scalars():
    return K.scalars_first.compile().launcher()


def cpu(n=16, dtype=torch.float32):
    return torch.zeros(n, dtype=dtype)


# -- tensors ----------------------------------------------------------------------------------------

def test_cpu_tensor_names_the_parameter(va):
    with pytest.raises(ty.LaunchValueError, match=r"vector_add: argument 'x' expects a CUDA tensor, but got one on cpu"):
        va.pack((cpu(), cpu(), cpu(), 16))


def test_cpu_tensor_is_a_value_error(va):
    with pytest.raises(ValueError):
        va.pack((cpu(), cpu(), cpu(), 16))


def test_wrong_dtype_names_the_parameter(va):
    with pytest.raises(ty.LaunchTypeError,
                       match=r"argument 'x' expects dtype torch.float32, but got torch.float16"):
        va.pack((cpu(dtype=torch.float16), cpu(), cpu(), 16))
    with pytest.raises(TypeError):
        va.pack((cpu(dtype=torch.float64), cpu(), cpu(), 16))


def test_not_a_tensor(va):
    with pytest.raises(ty.LaunchTypeError, match=r"argument 'x' expects a torch.Tensor of torch.float32, but got ndarray"):
        va.pack((np.zeros(16, np.float32), cpu(), cpu(), 16))


def test_full_launch_path_checks_before_the_driver():
    with pytest.raises(ty.LaunchValueError, match="argument 'x' expects a CUDA tensor"):
        vector_add[(1,)](cpu(), cpu(), cpu(), 16)


# -- scalars ----------------------------------------------------------------------------------------

def test_scalars_pass_their_checks(scalars):
    # The pointer comes last; a CPU tensor stops the pack there, after the scalars passed their checks.
    with pytest.raises(ty.LaunchValueError, match="argument 'out'"):
        scalars.pack((7, 0.5, True, cpu()))
    with pytest.raises(ty.LaunchValueError, match="argument 'out'"):
        scalars.pack((np.int32(7), 2, False, cpu()))  # numpy ints and Python ints for floats are fine


@pytest.mark.parametrize("n", [2**31, -(2**31) - 1, 10**12])
def test_int_out_of_range_for_i32(scalars, n):
    with pytest.raises(ty.LaunchValueError, match=rf"argument 'n' expects a value in -2147483648..2147483647 \(i32\), but got {n}"):
        scalars.pack((n, 1.0, True, cpu()))


def test_i32_limits_are_accepted(scalars):
    for n in (2**31 - 1, -(2**31)):
        with pytest.raises(ty.LaunchValueError, match="argument 'out'"):  # n passed; the CPU tensor did not
            scalars.pack((n, 1.0, True, cpu()))


@pytest.mark.parametrize("bad", [1.5, 2.0, "3", True, None])
def test_non_int_for_int_param(scalars, bad):
    with pytest.raises(ty.LaunchTypeError, match=r"argument 'n' expects a Python int for i32"):
        scalars.pack((bad, 1.0, True, cpu()))


@pytest.mark.parametrize("bad", ["1.0", None, True, [1.0]])
def test_non_number_for_float_param(scalars, bad):
    with pytest.raises(ty.LaunchTypeError, match=r"argument 'alpha' expects a Python float for f32"):
        scalars.pack((1, bad, True, cpu()))


def test_non_bool_for_bool_param(scalars):
    with pytest.raises(ty.LaunchTypeError, match=r"argument 'flag' expects a bool, but got int"):
        scalars.pack((1, 1.0, 1, cpu()))


# -- argument count and grid ---------------------------------------------------------------------------

@pytest.mark.parametrize("args", [(), (cpu(),), (cpu(), cpu(), cpu()), (cpu(), cpu(), cpu(), 16, 17)])
def test_wrong_argument_count(va, args):
    with pytest.raises(ty.LaunchTypeError,
                       match=rf"vector_add expects 4 arguments \(x, y, out, n\), but got {len(args)}"):
        va.pack(args)


def test_wrong_argument_count_through_the_kernel():
    with pytest.raises(ty.LaunchTypeError, match=r"expects 4 arguments"):
        vector_add[(1,)](cpu(), cpu())


@pytest.mark.parametrize("grid, expected", [(5, (5, 1, 1)), ((5,), (5, 1, 1)), ((2, 3), (2, 3, 1)),
                                            ([2, 3, 4], (2, 3, 4)), ((np.int64(7),), (7, 1, 1)),
                                            ((0,), (0, 1, 1)), ((2**31 - 1, 65535, 65535), (2**31 - 1, 65535, 65535))])
def test_good_grids(grid, expected):
    assert check_grid("k", grid) == expected


@pytest.mark.parametrize("grid, exc, message", [
    ((1, 2, 3, 4), ty.LaunchTypeError, r"k: grid expects an int or a tuple of 1 to 3 ints, but got \(1, 2, 3, 4\)"),
    ((), ty.LaunchTypeError, r"grid expects an int or a tuple of 1 to 3 ints"),
    ("abc", ty.LaunchTypeError, r"grid expects an int or a tuple"),
    (None, ty.LaunchTypeError, r"grid expects an int or a tuple"),
    ((2.5,), ty.LaunchTypeError, r"grid dimension 0 expects an int, but got float 2.5"),
    ((1, "2"), ty.LaunchTypeError, r"grid dimension 1 expects an int, but got str '2'"),
    ((-1,), ty.LaunchValueError, r"grid dimension 0 expects 0..2147483647, but got -1"),
    ((2**31,), ty.LaunchValueError, r"grid dimension 0 expects 0..2147483647"),
    ((1, 65536), ty.LaunchValueError, r"grid dimension 1 expects 0..65535, but got 65536"),
    ((1, 1, 70000), ty.LaunchValueError, r"grid dimension 2 expects 0..65535, but got 70000"),
])
def test_bad_grids(grid, exc, message):
    with pytest.raises(exc, match=message):
        check_grid("k", grid)


def test_bad_grid_through_the_kernel():
    with pytest.raises(ty.LaunchValueError, match="grid dimension 0"):
        vector_add[(-1,)](cpu(), cpu(), cpu(), 16)


# -- no driver ----------------------------------------------------------------------------------------

@pytest.mark.skipif(cuda_available(), reason="this machine has a CUDA driver")
def test_no_driver_error():
    with pytest.raises(ty.NoDriverError) as info:
        driver.call("cuInit", 0)
    assert str(info.value).startswith("no CUDA driver: compile and dump work, launch needs a GPU")
    assert isinstance(info.value, ty.TylopyError)


def test_no_driver_error_from_older_bindings(monkeypatch):
    """cuda-bindings 13.0 reports a missing libcuda as a RuntimeError, later ones as DynamicLibNotFoundError."""
    class Bindings:
        def cuInit(self, flags):
            raise RuntimeError("Failed to dlopen libcuda.so.1")

    monkeypatch.setattr(driver, "driver", lambda: Bindings())
    with pytest.raises(ty.NoDriverError, match=r"launch needs a GPU \(Failed to dlopen libcuda.so.1\)"):
        driver.call("cuInit", 0)


def test_compile_needs_no_driver():
    # Compiling, reading the report and checking arguments never touched the driver above.
    ck = K.scalars_first.compile()
    assert ck.cubin and ck.report.available
