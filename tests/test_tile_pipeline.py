"""The ring helpers of ``ty.hopper`` (``tylopy/tile/pipeline.py``): the stage/phase arithmetic, the
ring example against float64 in the emulator (the ring wraps, both edges ragged), its PTX, and the
emulator's protocol check catching a ring whose empty barrier counts the wrong consumers."""
import shutil

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy import hopper
from tylopy_kernels.examples import ring_rowsum as R


def test_stage_and_phase_of_each_load():
    assert [hopper.stage_phase(j, 3) for j in range(7)] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 0)]
    ring = hopper.Ring(full=1024, empty=1048, stages=3)
    assert ring.full + 8 * (ring.stages - 1) < ring.empty  # the example's layout: full words, then empty ones


@pytest.mark.parametrize("rows, cols", [(45, 140), (32, 32), (7, 300), (64, 4)])
def test_ring_rowsum_matches_float64(rows, cols):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols))
    got = R.row_sums(x, emulate=True)
    np.testing.assert_allclose(got.double().numpy(), x.double().sum(1).numpy(), rtol=0, atol=1e-4)


def test_ring_rowsum_ptx_waits_and_arms_the_ring():
    ptx = R.ring_rowsum.compile().ptx
    assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive.expect_tx" in ptx
    assert "cp.async.bulk.tensor.2d" in ptx
    report = R.ring_rowsum.compile().report
    if shutil.which("ptxas"):
        assert report.available and report.spill_stores == 0 and report.spill_loads == 0, report


def test_an_empty_barrier_counting_too_few_consumers_is_reported():
    @ty.kernel(threads=64, arch="sm_90a")
    def miscounted(src: ty.tensormap, out: ty.ptr(ty.f32), rows: ty.i32, cols: ty.i32):
        smem = ty.dynamic_shared(ty.u8, R.SMEM_BYTES, align=128)
        if ty.thread_idx() == 0:
            hopper.ring_init(smem, R.RING, 1)          # 32 consumer lanes will arrive
        ty.syncthreads()
        n_tiles = (cols + (R.BN - 1)) // R.BN
        if ty.warp_idx() == 0:
            if ty.thread_idx() == 0:
                for j in range(n_tiles):
                    stage, full = hopper.ring_acquire(smem, R.RING, j, R.TILE_BYTES)
                    hopper.tma_load(smem + stage * R.TILE_BYTES, src, full, j * R.BN, 0)
        else:
            for j in range(n_tiles):
                hopper.ring_wait(smem, R.RING, j)
                hopper.ring_release(smem, R.RING, j)

    x = torch.randn(32, 200)
    with pytest.raises(Exception) as info:
        miscounted.emulate(ty.tensor_map(x, box=(R.BM, R.BN)), torch.empty(32), 32, 200, grid=(1,))
    print(info.value)
    assert "mbarrier" in str(info.value).lower() or "barrier" in str(info.value).lower()


@pytest.mark.gpu
def test_ring_rowsum_on_the_gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper GPU (sm_90)")
    x = torch.randn(333, 1000, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    got = R.row_sums(x)
    torch.testing.assert_close(got.double(), x.double().sum(1), rtol=0, atol=1e-3)
