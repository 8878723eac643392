"""Thread-block clusters: ``@ty.kernel(cluster=...)``, the cluster special registers, ``ty.cluster_sync``
(barrier.cluster) and ``ty.cluster_map`` (mapa, distributed shared memory). CPU tier: PTX and ptxas,
the emulator against numpy and its protocol checks, the cuLaunchKernelEx call through the fake
driver; GPU tier (marker ``gpu``): the device against the emulator."""
import re

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy import hopper
from kernels_clusters import (cluster_sum, exits_too_early, multicast_rows, no_cluster, skips_the_barrier,
                              swap_halves, waits_without_arriving, where_am_i)


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


# -- TMA multicast and remote mbarrier arrives ---------------------------------------------------------------

def multicast_case(iters=4, seed=0):
    x = torch.randn(16 * iters, 32, generator=torch.Generator().manual_seed(seed))
    return x, ty.tensor_map(x, box=(8, 32)), torch.full((2 * iters * 512,), float("nan"))


def test_multicast_and_remote_arrives_assemble():
    ptx = multicast_rows.compile(ITERS=4).ptx  # compile runs ptxas
    assert ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster" in ptx)
    assert "mapa.shared::cluster.u32" in ptx and "mbarrier.arrive.release.cluster.shared::cluster.b64" in ptx

    @ty.kernel(threads=32, arch="sm_90")
    def not_arch_specific(tm: ty.tensormap):
        bar = ty.shared(ty.u64, 1, align=8)
        buf = ty.shared(ty.f32, 256, align=128)
        hopper.tma_load(buf, tm, bar, 0, 0, multicast=3)

    @ty.kernel(threads=32, arch="sm_90a")
    def bad_mask(tm: ty.tensormap):
        bar = ty.shared(ty.u64, 1, align=8)
        buf = ty.shared(ty.f32, 256, align=128)
        hopper.tma_load(buf, tm, bar, 0, 0, multicast=1 << 16)

    with pytest.raises(ty.KernelSourceError, match=r"tma_load\(multicast=...\) expects a kernel for sm_90a"):
        not_arch_specific.compile()
    with pytest.raises(ty.KernelSourceError, match="tma_load multicast expects a CTA mask in 1..0xFFFF"):
        bad_mask.compile()


@pytest.mark.parametrize("seed", [None, 2])
def test_multicast_lands_in_every_cta_of_the_mask(seed):
    x, tm, out = multicast_case()
    multicast_rows.emulate(tm, out, grid=(2,), ITERS=4, seed=seed)
    assert torch.equal(out, x.reshape(4, 512).repeat(2, 1).reshape(-1))  # both CTAs saw every whole tile


@pytest.mark.parametrize("bug, text", [
    ("local_release", "the TMA multicast of warp 0 (warpgroup 0) of CTA (0, 0, 0) (CTA rank 0) overwrites smem0+0..1023 "
                      "of CTA rank 1, which warp 1 of that CTA read at"),
    ("expect_half", "These bytes come from another CTA's TMA multicast at"),
    ("no_final_sync", "CTA rank 1 (1, 0, 0) of the cluster exits while CTA rank 0 may still use its shared memory"),
    ("no_init_sync", "of CTA rank 1 before its initialization is visible to the cluster"),
])
def test_cross_cta_protocol_errors_name_the_line(bug, text):
    x, tm, out = multicast_case()
    with pytest.raises(ty.TylopyError) as e:
        multicast_rows.emulate(tm, out, grid=(2,), ITERS=4, BUG=bug)
    assert text in str(e.value)
    assert "kernels_clusters.py:" in str(e.value)


def test_a_multicast_completing_a_phase_early_is_named():
    x, tm, out = multicast_case()
    with pytest.raises(ty.TylopyError) as e:  # this schedule lands the other CTA's bytes first
        multicast_rows.emulate(tm, out, grid=(2,), ITERS=4, BUG="expect_half", seed=7)
    assert "completes phase 0 while the TMA" in str(e.value) and "must expect it on its own barrier" in str(e.value)


def test_a_remote_arrive_on_the_wrong_cta_or_barrier_is_named():
    @ty.kernel(threads=32, arch="sm_90a", cluster=(2, 1, 1))
    def remote_arrive(WHERE: ty.constexpr):
        bars = ty.shared(ty.u64, 2, align=8)
        if ty.thread_idx() == 0:
            hopper.mbarrier_init(bars, 1, label="freed")   # bars[1] is never initialized
            hopper.fence_mbarrier_init()
        ty.cluster_sync()
        if ty.thread_idx() == 0:
            if WHERE == "rank":
                hopper.mbarrier_arrive(bars, cta=ty.cluster_ctarank() + 1)
            elif WHERE == "slot":
                hopper.mbarrier_arrive(bars + 1, cta=ty.cluster_ctarank() ^ 1)
            elif WHERE == "expect_tx":   # an arrival that announces no bytes completes the phase as well
                hopper.mbarrier_arrive_expect_tx(bars, 0, cta=ty.cluster_ctarank() ^ 1)
            elif WHERE == "tx_cta":
                hopper.mbarrier_arrive_expect_tx(bars, 0, cta=ty.cluster_ctarank() ^ 1, scope="cta")
            elif WHERE == "cta_scope":
                hopper.mbarrier_arrive(bars, cta=ty.cluster_ctarank() ^ 1, scope="cta")
            elif WHERE == "bad_scope":
                hopper.mbarrier_arrive(bars, cta=ty.cluster_ctarank() ^ 1, scope="gpu")
            elif WHERE == "local_scope":
                hopper.mbarrier_arrive(bars, scope="cta")
            else:
                hopper.mbarrier_arrive(bars, cta=ty.cluster_ctarank() ^ 1)
        hopper.mbarrier_wait(bars, 0, label="freed")
        ty.cluster_sync()

    remote_arrive.emulate(grid=(2,), WHERE="partner")  # each CTA frees the other one
    remote_arrive.emulate(grid=(2,), WHERE="expect_tx")
    assert "mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64" in remote_arrive.compile(WHERE="expect_tx").ptx
    remote_arrive.emulate(grid=(2,), WHERE="cta_scope")
    ptx = remote_arrive.compile(WHERE="cta_scope").ptx   # the bare arrive: no GPU-scope fence before it
    assert "mbarrier.arrive.release.cta.shared::cluster.b64" in ptx and ".release.cluster.shared::cluster" not in ptx
    assert "mbarrier.arrive.expect_tx.release.cta.shared::cluster.b64" in remote_arrive.compile(WHERE="tx_cta").ptx
    for where, text in (("bad_scope", "mbarrier_arrive scope expects 'cluster' or 'cta', but got 'gpu'"),
                        ("local_scope", "mbarrier_arrive scope expects a remote arrive (cta=...), but got scope='cta'")):
        with pytest.raises(ty.TylopyError, match=re.escape(text)):
            remote_arrive.compile(WHERE=where)
    with pytest.raises(ty.TylopyError, match=r"names CTA rank 2, but the cluster has 2 CTAs"):
        remote_arrive.emulate(grid=(2,), WHERE="rank")
    with pytest.raises(ty.TylopyError, match=r"uses the mbarrier at smem0\[1\] of CTA rank \d \(\d, 0, 0\), which "
                                             r"no thread of that CTA initialized"):
        remote_arrive.emulate(grid=(2,), WHERE="slot")


def test_a_multicast_mask_past_the_cluster_is_an_error():
    @ty.kernel(threads=32, arch="sm_90a", cluster=(2, 1, 1))
    def wide_mask(tm: ty.tensormap):
        bar = ty.shared(ty.u64, 1, align=8)
        buf = ty.shared(ty.f32, 256, align=1024)
        if ty.thread_idx() == 0:
            hopper.mbarrier_init(bar, 1)
            hopper.fence_mbarrier_init()
        ty.cluster_sync()
        if ty.thread_idx() == 0:
            hopper.mbarrier_arrive_expect_tx(bar, 1024)
            hopper.tma_load(buf, tm, bar, 0, 0, multicast=5)
        hopper.mbarrier_wait(bar, 0)
        ty.cluster_sync()

    x, tm, out = multicast_case()
    with pytest.raises(ty.TylopyError, match=r"the multicast mask 0x0005 names CTA rank\(s\) \[0, 2\], but the cluster "
                                             r"has 2 CTA\(s\)"):
        wide_mask.emulate(tm, grid=(2,))


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


@pytest.mark.gpu
def test_gpu_multicast_and_remote_arrives_match_the_emulator():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA multicast needs sm_90a")
    x, tm_cpu, _ = multicast_case(iters=6, seed=4)
    n = 4 * 6 * 512                                              # two clusters of two CTAs, 6 tiles each
    want = torch.full((n,), float("nan"))
    multicast_rows.emulate(tm_cpu, want, grid=(4,), ITERS=6)
    assert torch.equal(want, x.reshape(6, 512).repeat(4, 1).reshape(-1))
    xd = x.cuda()
    out = torch.full((n + 64,), float("nan"), device="cuda")
    multicast_rows[(4,)](ty.tensor_map(xd, box=(8, 32)), out, ITERS=6)
    torch.cuda.synchronize()
    assert torch.equal(out[:n].cpu(), want) and out[n:].isnan().all()
