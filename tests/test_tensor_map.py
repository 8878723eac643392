"""``ty.tensor_map``: one object for the GPU launch and the emulator, the driver's rules checked in
the caller's terms, and the TMA copy example (CPU tier: emulator and ptxas; GPU tier: marker ``gpu``)."""
import os

import pytest
import torch

import tylopy as ty
from tylopy_kernels.examples import tma_copy

EXAMPLES = os.path.dirname(tma_copy.__file__)


def padded_2d(rows, cols, extra_cols, dtype, device="cpu", seed=0):
    """A (rows, cols) view with fresh random values inside a NaN-filled (rows + 3, cols + extra) buffer."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.full((rows + 3, cols + extra_cols), float("nan"), dtype=dtype)
    buf[:rows, :cols] = (torch.randn(rows, cols, generator=g) * 3).to(dtype)
    buf = buf.to(device)
    return buf, buf[:rows, :cols]


def run_copy(x, out, alpha, emulate):
    src = ty.tensor_map(x, box=(tma_copy.BM, tma_copy.BN))
    dst = ty.tensor_map(out, box=(tma_copy.BM, tma_copy.BN))
    k = tma_copy.copy_kernel(ty.f32 if x.dtype == torch.float32 else ty.bf16)
    grid = ((x.shape[1] + tma_copy.BN - 1) // tma_copy.BN, (x.shape[0] + tma_copy.BM - 1) // tma_copy.BM)
    if emulate:
        k.emulate(src, dst, alpha, box_bytes=src.box_bytes, grid=grid)
    else:
        k[grid](src, dst, alpha, box_bytes=src.box_bytes)


# -- the API --------------------------------------------------------------------------------------------------

def test_a_cpu_map_describes_the_tensor_in_its_own_order():
    x = torch.randn(100, 64)
    tm = ty.tensor_map(x, box=(32, 16), swizzle=64)
    assert isinstance(tm, ty.TensorMap) and tm.box == (32, 16) and tm.box_bytes == 32 * 16 * 4
    spec = tm.spec  # innermost first, as the driver and the PTX coordinates take it
    assert spec.dims == (64, 100) and spec.strides_bytes == (256,) and spec.box == (16, 32) and spec.swizzle == 64
    assert "shape=(100, 64)" in repr(tm) and "cpu" in repr(tm)
    with pytest.raises(ty.LaunchValueError, match="describes a CPU tensor"):
        tm.getPtr()  # a CPU map never reaches the driver


@pytest.mark.parametrize("make,kwargs,text", [
    (lambda: torch.randn(100, 64), dict(box=(32,)), "box expects 2 entries"),
    (lambda: torch.randn(100, 64), dict(box=(300, 32)), "box[0] expects 1..256 elements"),
    (lambda: torch.randn(100, 64), dict(box=(0, 32)), "box[0] expects 1..256 elements (the TMA's largest box), but got 0"),
    (lambda: torch.randn(100, 64), dict(box=(32, 6)), "box[1] (the innermost) expects a multiple of 16 bytes"),
    (lambda: torch.randn(100, 64), dict(box=(32, 64), swizzle=128),
     "box[1] (the innermost) expects at most 128 bytes (32 float32 elements) with swizzle=128, but got 64"),
    (lambda: torch.randn(100, 64), dict(box=(32, 32), swizzle=16), "swizzle expects 0, 32, 64 or 128"),
    (lambda: torch.randn(100, 64), dict(box=(32, 32), l2_promotion=32), "l2_promotion expects 0, 64, 128 or 256"),
    (lambda: torch.randn(100, 64), dict(box=32), "box expects a tuple of 2 ints"),
    (lambda: torch.randn(100, 64), dict(box=(32.0, 32)), "box[0] expects an int"),
    (lambda: torch.randn(10, 10), dict(box=(8, 8)), "tensor.stride()[0] expects a multiple of 16 bytes"),
    (lambda: torch.randn(64, 12).t(), dict(box=(8, 8)), "tensor expects its last dimension contiguous"),
    (lambda: torch.randn(1, 64).expand(8, 64), dict(box=(8, 8)), "tensor.stride()[0] expects a positive stride"),
    (lambda: torch.randn(65)[1:], dict(box=(16,)), "tensor expects its first element 16-byte aligned"),
    (lambda: torch.randn(2, 2, 2, 2, 2, 4), dict(box=(1,) * 6), "tensor expects 1 to 5 dimensions"),
    (lambda: torch.zeros(0, 4), dict(box=(1, 4)), "tensor.shape[0] expects 1..2**32, but got 0"),
    (lambda: torch.zeros(4, 4, dtype=torch.bool), dict(box=(1, 4)), "tensor expects one of the dtypes"),
    (lambda: [[1.0] * 4], dict(box=(1, 4)), "tensor expects a torch.Tensor, but got list"),
])
def test_what_the_hardware_cannot_take_names_the_argument(make, kwargs, text):
    with pytest.raises((ty.LaunchValueError, ty.LaunchTypeError)) as e:
        ty.tensor_map(make(), **kwargs)
    assert text in str(e.value) and "ty.tensor_map:" in str(e.value)
    assert "but got" in str(e.value)


def test_the_emulator_takes_the_map_and_the_gpu_launch_rejects_a_cpu_one():
    x = torch.randn(8, 8)
    tm = ty.tensor_map(x, box=(8, 8))

    @ty.kernel(threads=32, arch="sm_90a")
    def touch(m: ty.tensormap):
        ty.hopper.prefetch_tensormap(m)

    touch.emulate(tm, grid=(1,))
    with pytest.raises(ty.LaunchTypeError, match="expects a TensorMapSpec or TensorMap"):
        touch.emulate(x, grid=(1,))


# -- the example: emulator and ptxas -------------------------------------------------------------------------

@pytest.mark.parametrize("rows,cols,dtype", [(45, 76, torch.float32), (32, 32, torch.float32),
                                            (70, 40, torch.bfloat16)])
def test_tma_copy_in_the_emulator_clips_at_the_edges(rows, cols, dtype):
    xbuf, x = padded_2d(rows, cols, 16, dtype, seed=rows + cols)
    obuf, out = padded_2d(rows, cols, 16, dtype, seed=1)
    out.fill_(float("nan"))
    run_copy(x, out, -1.25, emulate=True)
    assert torch.equal(out, tma_copy.reference(x, -1.25))
    assert obuf[:, cols:].isnan().all() and obuf[rows:].isnan().all()  # the store clipped at out's edges


def test_tma_copy_launcher_and_cli():
    from tylopy.cli.emulate import cli_main
    g = torch.Generator().manual_seed(5)
    x = torch.randn(33, 20, generator=g)
    assert torch.equal(tma_copy.scaled_copy(x, 0.5, emulate=True), tma_copy.reference(x, 0.5))
    assert cli_main([os.path.join(EXAMPLES, "tma_copy.py")]) == 0
    with pytest.raises(ValueError, match="scaled_copy: x expects a 2-D"):
        tma_copy.scaled_copy(torch.randn(4), 1.0, emulate=True)
    with pytest.raises(ty.LaunchValueError, match=r"tensor.stride\(\)\[0\] expects a multiple of 16 bytes"):
        tma_copy.scaled_copy(torch.randn(5, 7), 1.0, emulate=True)


def test_tma_copy_assembles_with_load_barrier_and_store():
    for k in (tma_copy.tma_scaled_copy_f32, tma_copy.tma_scaled_copy_bf16):
        ptx = k.compile(box_bytes=4096).ptx  # compile runs ptxas
        assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
        assert "mbarrier.try_wait.parity" in ptx and "cp.async.bulk.tensor.2d.global.shared::cta" in ptx
        assert "cp.async.bulk.wait_group.read 0" in ptx
    src = open(tma_copy.__file__).read()
    assert "tylopy.language" not in src and "tylopy.jit" not in src and "tylopy.runtime" not in src and "Run it" in tma_copy.__doc__


# -- GPU tier -------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols,dtype", [(1000, 520, torch.float32), (45, 76, torch.float32),
                                            (70, 40, torch.bfloat16), (1, 8, torch.bfloat16)])
def test_gpu_tma_copy_matches_float64_and_the_emulator(rows, cols, dtype):
    xbuf, x = padded_2d(rows, cols, 16, dtype, device="cuda", seed=rows * cols)
    obuf = torch.full_like(xbuf, float("nan"))
    out = obuf[:rows, :cols]
    run_copy(x, out, 0.75, emulate=False)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), tma_copy.reference(x.cpu(), 0.75))
    assert obuf[:, cols:].isnan().all() and obuf[rows:].isnan().all()
    assert torch.equal(tma_copy.scaled_copy(x, 0.75).cpu(), tma_copy.reference(x.cpu(), 0.75))
    if rows * cols <= 4096:  # the emulator agrees bit for bit
        assert torch.equal(tma_copy.scaled_copy(x.cpu(), 0.75, emulate=True), out.cpu())


@pytest.mark.gpu
def test_gpu_launch_rejects_a_map_of_a_cpu_tensor():
    x = torch.randn(32, 32, device="cuda")
    cpu_map = ty.tensor_map(torch.randn(32, 32), box=(32, 32))
    gpu_map = ty.tensor_map(x, box=(32, 32))
    assert gpu_map.device == x.device.index and gpu_map.getPtr()
    with pytest.raises(ty.LaunchValueError, match="describes a CPU tensor"):
        tma_copy.tma_scaled_copy_f32[(1, 1)](cpu_map, gpu_map, 1.0, box_bytes=4096)
