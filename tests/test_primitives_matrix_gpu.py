"""The matrix and asynchronous-copy primitives on the GPU, compared bit for bit with the emulator
(every result here is exact: data movement, and the tensor cores' f32 accumulation, which the
emulator models as measured on an H200 for m16n8k16 and wgmma k16; m16n8k8 uses the same model,
and this is the test that measures it)."""
import numpy as np
import pytest
import torch

from conftest import requires_sm90
from primitive_probes import box_values, run_cp, store_map, tma_store_probe
from primitive_probes import run_ldmatrix, run_mma_probe, run_stmatrix, run_wgmma

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_ldmatrix_device_equals_emulator(num, trans):
    _, _, want = run_ldmatrix(num, trans, "cpu", seed=11)
    _, _, got = run_ldmatrix(num, trans, "cuda", seed=11)
    np.testing.assert_array_equal(got, want)


@requires_sm90
@pytest.mark.sm90
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_stmatrix_device_equals_emulator(num, trans):
    _, _, want = run_stmatrix(num, trans, "cpu", seed=12)
    _, _, got = run_stmatrix(num, trans, "cuda", seed=12)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", ["m16n8k16", "m16n8k8"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mma_device_equals_emulator(dtype, shape, seed):
    *_, want = run_mma_probe(dtype, shape, "cpu", seed)
    *_, got = run_mma_probe(dtype, shape, "cuda", seed)
    assert torch.equal(got, want), f"{int((got != want).sum())} of 128 outputs differ"


@requires_sm90
@pytest.mark.sm90
@pytest.mark.parametrize("n, a_from, dtype", [(8, "ss", "bf16"), (24, "rs", "f16"), (136, "ss", "f16"),
                                              (256, "rs", "bf16"), (256, "ss", "bf16")])
def test_wgmma_device_equals_emulator(n, a_from, dtype):
    *_, want = run_wgmma(n, a_from, dtype, "cpu")
    *_, got = run_wgmma(n, a_from, dtype, "cuda")
    assert torch.equal(got, want)


@pytest.mark.parametrize("nbytes, const_take", [(4, -1), (8, -1), (16, -1), (16, 0)])
def test_cp_async_device_equals_emulator(nbytes, const_take):
    *_, want = run_cp(nbytes, const_take, "cpu", seed=13)
    *_, got = run_cp(nbytes, const_take, "cuda", seed=13)
    np.testing.assert_array_equal(got, want)


@requires_sm90
@pytest.mark.sm90
@pytest.mark.parametrize("reduce", [None, "add"])
def test_tma_store_device_equals_emulator(reduce):
    from conftest import for_this_gpu
    from tylopy.runtime.tensormap import TensorMap
    cpu = torch.full((40, 52), 7.0)
    tma_store_probe.emulate(store_map(cpu), 28, 30, grid=1, REDUCE=reduce)
    dev = torch.full((40, 52), 7.0, device="cuda")
    for_this_gpu(tma_store_probe)[(1,)](TensorMap.encode(store_map(dev)), 28, 30, REDUCE=reduce)
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), cpu)
    assert float(cpu[30, 28]) == {None: 0.5, "add": 7.5}[reduce] and box_values()[0, 0] == 0.5
