"""The cluster GEMM example (tylopy_kernels/examples/gemm_cluster.py): emulated at small ragged sizes with
and without clusters, bit for bit against a chain of the tensor-core model and near float64; its PTX
(multicast, remote arrives) and ptxas (no spills, no serialized wgmma); the host checks; on the H200
(gpu marker) against torch.matmul, the two variants against each other and the multicast alone
feeding a CTA (M within one CTA's rows, so the other CTA only loads B)."""
import numpy as np
import pytest
import torch

from conftest import requires_sm90
from tylopy.semantics.conversions import round_to
from tylopy.semantics.tensorcore import mma_f32
from tylopy_kernels.examples import gemm_cluster as G


def inputs(m, n, k, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    return a.to(device), b.to(device)


def model(a, b) -> np.ndarray:
    """The kernel's arithmetic: k16 wgmma steps chained in k order from zero, rounded to bf16."""
    m, k = a.shape
    kp = -(-k // G.BLOCK_K) * G.BLOCK_K
    A = np.zeros((m, kp), np.float32)
    Bt = np.zeros((kp, b.shape[0]), np.float32)
    A[:, :k], Bt[:k] = a.cpu().float().numpy(), b.cpu().float().numpy().T
    acc = np.zeros((m, b.shape[0]), np.float32)
    for k0 in range(0, kp, 16):
        acc = mma_f32(A[:, k0:k0 + 16], Bt[k0:k0 + 16], acc, "bf16")
    return round_to(acc, "bf16")


def near_f64(c, a, b) -> bool:
    exact = a.double().cpu() @ b.double().cpu().T
    mag = a.double().abs().cpu() @ b.double().abs().cpu().T
    bound = 2.0 ** -8 * exact.abs() + (a.shape[1] / 16 + 2) * 2.0 ** -23 * mag + 1e-30
    return bool(((c.double().cpu() - exact).abs() <= bound).all())


@pytest.mark.parametrize("m, n, k, cluster, grid, store", [
    (300, 136, 200, True, 2, "tma"),      # ragged M (the second cluster tile half empty), N and K; two tiles
    (100, 256, 136, True, 2, "direct"),   # M inside rank 0's rows: rank 1 only loads and multicasts its B half
    (300, 138, 200, False, 2, "direct"),  # the same kernel without clusters; N even, not a multiple of 8
])
def test_emulated_cluster_gemm_is_the_model_and_near_float64(m, n, k, cluster, grid, store):
    a, b = inputs(m, n, k, seed=m + k)
    c = G.matmul(a, b, cluster=cluster, block_n=128, stages=2, emulate=True, grid=grid, store=store)
    np.testing.assert_array_equal(c.float().numpy(), model(a, b))
    assert near_f64(c, a, b)


@pytest.mark.parametrize("cluster_m, block_n, store", [(2, 256, "tma"), (1, 256, "tma"), (2, 128, "tma"),
                                                      (2, 256, "direct")])
def test_every_variant_assembles_without_spills_or_serialized_wgmma(cluster_m, block_n, store):
    ck = G.gemm_kernel(cluster_m).compile(BLOCK_N=block_n, STAGES=G.stages_for(block_n, store), STORE=store)
    assert f"wgmma.mma_async.sync.aligned.m64n{block_n}k16.f32.bf16.bf16" in ck.ptx
    multicast = ".multicast::cluster" in ck.ptx and "mbarrier.arrive.release.cta.shared::cluster.b64" in ck.ptx
    assert multicast == (cluster_m == 2)
    assert ".release.cluster.shared::cluster" not in ck.ptx  # no GPU-scope fence before each stage release
    assert (".reqnctapercluster 2, 1, 1" in ck.ptx) == (cluster_m == 2)
    if ck.report.available:
        assert ck.report.spills == 0 and "C7515" not in ck.report.codes()


def test_host_checks_name_the_argument():
    a, b = inputs(64, 64, 64)
    for call, text in ((lambda: G.matmul(a.float(), b, emulate=True), "expects a as a 2-D torch.bfloat16"),
                       (lambda: G.matmul(a, b[:, :32].contiguous(), emulate=True), r"a (M x K) and b (N x K)"),
                       (lambda: G.matmul(a[:, :60].contiguous(), b[:, :60].contiguous(), emulate=True),
                        "K (a's and b's columns) to be a multiple of 8"),
                       (lambda: G.matmul(a, b[:63], emulate=True), "N (b's rows) to be even"),
                       (lambda: G.matmul(a, b, grid=3, emulate=True), "grid to be a multiple of the cluster size 2"),
                       (lambda: G.matmul(a, b[:62], store="tma", emulate=True), "store 'tma' (with N % 8 == 0)"),
                       (lambda: G.matmul(a, b, release="gpu", emulate=True), "release 'cta' or 'cluster', but got 'gpu'"),
                       (lambda: G.matmul(a, b, blockn=128, emulate=True), "keywords among ['block_n', 'group_m'")):
        with pytest.raises((TypeError, ValueError)) as e:
            call()
        assert text in str(e.value), (text, str(e.value))


def test_the_example_uses_only_public_names():
    src = open(G.__file__).read()
    assert "tylopy.language" not in src and "tylopy.jit" not in src and "tylopy.ir" not in src and "inline_ptx" not in src
    assert G.__doc__ and "Algorithm" in G.__doc__ and "Run it" in G.__doc__


# -- GPU tier -------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("m, n, k", [(1000, 1032, 1056), (4096, 4096, 4096), (100, 256, 512), (77, 8, 16)])
def test_gpu_cluster_gemm_matches_torch_and_itself_without_clusters(m, n, k):
    a, b = inputs(m, n, k, seed=k, device="cuda")
    c = G.matmul(a, b)
    plain = G.matmul(a, b, cluster=False)
    torch.cuda.synchronize()
    assert near_f64(c, a, b)
    ref = torch.matmul(a, b.T)
    assert float((c.float() - ref.float()).abs().max()) <= 2.0 ** -7 * float(ref.float().abs().max()) + 1e-3
    # Same k order, same tensor-core arithmetic: only where the B tile comes from differs.
    assert torch.equal(c, plain)
    assert torch.equal(c, G.matmul(a, b, release="cluster"))   # the fenced stage releases: the same bytes
    if m * n * k <= 2 ** 28:
        np.testing.assert_array_equal(c.float().cpu().numpy(), model(a, b))


@pytest.mark.gpu
@requires_sm90
def test_gpu_multicast_alone_feeds_a_cta():
    """M = 100 lies in rank 0's rows: columns 128-255 of every tile reach rank 0 only through rank 1's
    multicast of its half of B (a multicast that wrote only its issuer would leave NaN or stale bytes)."""
    a, b = inputs(100, 512, 256, seed=11, device="cuda")
    torch.cuda.synchronize()
    for _ in range(3):   # repeated launches: stale bytes from an earlier run would also show
        c = G.matmul(a, b)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(c.float().cpu().numpy(), model(a, b))
