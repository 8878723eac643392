"""Thread-block clusters: ``@ty.kernel(cluster=...)``, the cluster special registers, ``ty.cluster_sync``
(barrier.cluster) and ``ty.cluster_map`` (mapa, distributed shared memory). CPU tier: PTX and ptxas,
the emulator against numpy and its protocol checks, the cuLaunchKernelEx call through the fake
driver; GPU tier (marker ``gpu``): the device against the emulator."""
import numpy as np
import pytest
import torch

import tylopy as ty
from kernels_clusters import (cluster_sum, exits_too_early, no_cluster, skips_the_barrier, swap_halves,
                              waits_without_arriving, where_am_i)


def swapped(x):
    return x.reshape(-1, 2, 64)[:, ::-1, ::-1].reshape(-1)


def test_the_ptx_declares_the_cluster_and_assembles():
    ptx = swap_halves.compile().ptx  # compile runs ptxas
    for text in (".reqnctapercluster 2, 1, 1", "barrier.cluster.arrive.aligned", "barrier.cluster.wait.aligned",
                 "mapa.u64", "%cluster_ctarank"):
        assert text in ptx, text
    ptx = where_am_i.compile().ptx
    for reg in ("%cluster_nctarank", "%cluster_ctaid.y", "%cluster_nctaid.x", "%clusterid.y", "%nclusterid.x"):
        assert reg in ptx, reg
    assert ".reqnctapercluster" not in no_cluster.compile().ptx


def test_cluster_declaration_errors_name_the_kernel():
    def body(x: ty.ptr(ty.f32)):
        x[0] = 1.0
    for kwargs, text in ((dict(cluster=(3, 3, 1)), "cluster expects at most 8 CTAs (x * y * z), but got (3, 3, 1) = 9"),
                         (dict(cluster=(0, 1)), "cluster expects 1 to 3 positive ints (x, y, z), but got (0, 1)"),
                         (dict(cluster=(2,), arch="sm_80"), "cluster expects a kernel for sm_90 or sm_90a")):
        with pytest.raises(ty.KernelSourceError, match=None) as e:
            ty.kernel(threads=32, **kwargs)(body)
        assert text in str(e.value) and "kernel 'body'" in str(e.value)

    @ty.kernel(threads=32, arch="sm_80")
    def old_arch(x: ty.ptr(ty.f32)):
        ty.cluster_sync()

    @ty.kernel(threads=32, arch="sm_90a")
    def not_shared(x: ty.ptr(ty.f32)):
        x[0] = ty.cluster_map(x, 0)[0]

    with pytest.raises(ty.KernelSourceError, match="cluster_arrive expects a kernel for sm_90 or sm_90a"):
        old_arch.compile()
    with pytest.raises(ty.KernelSourceError, match="cluster_map expects a shared-memory pointer"):
        not_shared.compile()


@pytest.mark.parametrize("blocks", [2, 6])
def test_distributed_shared_memory_swaps_partner_tiles(blocks):
    x = np.random.default_rng(blocks).standard_normal(64 * blocks).astype(np.float32)
    out = np.full_like(x, np.nan)
    swap_halves.emulate(x, out, grid=(blocks,))
    assert np.array_equal(out, swapped(x))
    swap_halves.emulate(x, out, grid=(blocks,), seed=3)  # another schedule of the warps of both CTAs
    assert np.array_equal(out, swapped(x))
    with pytest.raises(ty.LaunchValueError, match=r"grid expects a multiple of the cluster shape \(2, 1, 1\)"):
        swap_halves.emulate(x, out, grid=(3,))


def test_cluster_registers_in_a_2d_grid_of_2x2_clusters():
    out = np.full(16 * 10, -1, np.int32)
    where_am_i.emulate(out, grid=(4, 4))
    got = out.reshape(4, 4, 10)  # [block y, block x]
    for by in range(4):
        for bx in range(4):
            lx, ly = bx % 2, by % 2
            assert got[by, bx].tolist() == [lx + 2 * ly, 4, lx, ly, 2, 2, bx // 2, by // 2, 2, 2], (bx, by)


def test_rank_zero_sums_the_clusters_partials_over_dsmem():
    x = np.random.default_rng(5).standard_normal(64 * 8).astype(np.float32)
    out = np.full(2, np.nan, np.float32)
    cluster_sum.emulate(x, out, grid=(8,))
    exact = x.astype(np.float64).reshape(2, 256).sum(1)
    assert np.allclose(out, exact, rtol=0, atol=1e-5 * np.abs(x).reshape(2, 256).sum(1).max())


def test_a_launch_without_clusters_is_rank_0_of_1():
    out = np.full(9, -1, np.int32)
    no_cluster.emulate(out, grid=(3,))
    assert out.tolist() == [0, 1, 0, 0, 1, 1, 0, 1, 2]


def test_protocol_errors_of_clusters():
    x = np.zeros(128, np.float32)
    with pytest.raises(ty.TylopyError) as e:
        exits_too_early.emulate(x, np.zeros(64, np.float32), grid=(2,), LATE=3)
    assert "CTA rank 1 (1, 0, 0) of the cluster has exited, and its shared memory with it" in str(e.value)
    assert "out[t] = ty.cluster_map(buf, 1)[t]" in str(e.value)
    with pytest.raises(ty.TylopyError) as e:
        skips_the_barrier.emulate(np.zeros(2, np.int32), grid=(2,))
    msg = str(e.value)
    assert "deadlock" in msg and "phase 0 has 64 of 128 threads arrived" in msg
    assert "CTA rank 1 (1, 0, 0) exited without arriving" in msg
    with pytest.raises(ty.TylopyError, match="waits without a barrier.cluster.arrive before it"):
        waits_without_arriving.emulate(np.zeros(2, np.int32), grid=(2,))


def test_the_launch_uses_cuLaunchKernelEx_with_the_cluster_shape():
    from tylopy.testing import fake_driver, on_device
    with fake_driver() as d:
        x, out = on_device(torch.randn(256)), on_device(torch.zeros(256))
        swap_halves[(4,)](x, out)
        no_cluster[(3,)](on_device(torch.zeros(9, dtype=torch.int32)))
        with pytest.raises(ty.LaunchValueError, match=r"swap_halves: grid expects a multiple of the cluster shape"):
            swap_halves[(5,)](x, out)
    assert d.launches[0]["cluster"] == (2, 1, 1) and d.launches[0]["grid"] == (4, 1, 1)
    assert d.launches[0]["block"] == 64
    assert "cluster" not in d.launches[1]  # an ordinary cuLaunchKernel
    assert len(d.launches) == 2


# -- GPU tier -------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_clusters_match_the_emulator():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    x = np.random.default_rng(7).standard_normal(64 * 8).astype(np.float32)
    out = torch.full((64 * 8 + 32,), float("nan"), device="cuda")
    swap_halves[(8,)](torch.from_numpy(x).cuda(), out)
    torch.cuda.synchronize()
    assert np.array_equal(out[:512].cpu().numpy(), swapped(x)) and out[512:].isnan().all()
    regs = torch.full((160,), -1, dtype=torch.int32, device="cuda")
    where_am_i[(4, 4)](regs)
    want = np.full(160, -1, np.int32)
    where_am_i.emulate(want, grid=(4, 4))
    assert np.array_equal(regs.cpu().numpy(), want)
    sums = torch.zeros(2, device="cuda")
    cluster_sum[(8,)](torch.from_numpy(x).cuda(), sums)
    emulated = np.zeros(2, np.float32)
    cluster_sum.emulate(x, emulated, grid=(8,))
    assert np.array_equal(sums.cpu().numpy(), emulated)
