"""Block and warp collectives of the tile library (``ty.block_reduce``, ``ty.block_scan``, ``ty.warp_scan``,
``ty.warp_sort``, ``ty.warp_topk``): emulator against numpy on fresh random data (float64 references
for floats, exact for integers), ptxas, errors at the line; GPU tier (marker ``gpu``) bit for bit
against the emulator."""
import functools

import numpy as np
import pytest
import torch

import tylopy as ty

DT = {"f32": (ty.f32, np.float32), "i32": (ty.i32, np.int32), "f64": (ty.f64, np.float64),
      "u32": (ty.u32, np.uint32), "i64": (ty.i64, np.int64)}


@functools.cache
def reduce_kernel(dtype, op, threads):
    @ty.kernel(threads=threads, name=f"block_reduce_{op}_{dtype}_{threads}")
    def k(x: ty.ptr(dtype), out: ty.ptr(dtype), rounds: ty.i32):
        t = ty.thread_idx()
        for r in ty.range(rounds):   # repeated calls: the scratch words must not race
            v = ty.block_reduce(x[r * threads + t], op)
            out[r * threads + t] = v
    return k


@functools.cache
def scan_kernel(dtype, op, threads, exclusive):
    @ty.kernel(threads=threads, name=f"block_scan_{op}_{dtype}_{threads}_{int(exclusive)}")
    def k(x: ty.ptr(dtype), out: ty.ptr(dtype), totals: ty.ptr(dtype), rounds: ty.i32):
        t = ty.thread_idx()
        for r in ty.range(rounds):
            p, s = ty.block_scan(x[r * threads + t], op, exclusive=exclusive, total=True)
            out[r * threads + t] = p
            totals[r * threads + t] = s
    return k


@functools.cache
def sort_kernel(dtype, descending, k_top):
    @ty.kernel(threads=64, name=f"warp_sort_{dtype}_{int(descending)}_{k_top}")
    def k(x: ty.ptr(dtype), out: ty.ptr(dtype), idx: ty.ptr(ty.i32), top: ty.ptr(dtype)):
        t = ty.thread_idx()
        v, i = ty.warp_sort(x[t], ty.lane_id(), descending=descending)
        out[t] = v
        idx[t] = i
        best, inside = ty.warp_topk(x[t], k_top)
        if inside:
            top[(t >> 5) * k_top + ty.lane_id()] = best
    return k


def data(np_dtype, n, seed):
    rng = np.random.default_rng(seed)
    if np.issubdtype(np_dtype, np.floating):
        return (rng.standard_normal(n) * 10).astype(np_dtype)
    if np_dtype == np.uint32:
        return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    return rng.integers(-2**20, 2**20, n).astype(np_dtype)


def np_reduce(op, a):
    return {"sum": np.sum, "max": np.max, "min": np.min}[op](a)


@pytest.mark.parametrize("dtype", ["f32", "i32", "f64", "u32", "i64"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("threads", [32, 96, 256])
def test_block_reduce_matches_numpy(dtype, op, threads):
    tyd, npd = DT[dtype]
    rounds = 2
    x = data(npd, rounds * threads, seed=threads + len(op))
    out = np.zeros_like(x)
    reduce_kernel(tyd, op, threads).emulate(x, out, rounds, grid=(1,))
    for r in range(rounds):
        chunk = x[r * threads:(r + 1) * threads]
        got = out[r * threads:(r + 1) * threads]
        assert (got == got[0]).all()  # every thread holds the same bits
        if dtype in ("f32", "f64") and op == "sum":
            exact = chunk.astype(np.float64).sum()
            bound = 8 * np.finfo(npd).eps * np.abs(chunk.astype(np.float64)).sum()
            assert abs(float(got[0]) - exact) <= bound
        elif op == "sum":
            with np.errstate(over="ignore"):
                assert got[0] == chunk.sum(dtype=npd)  # integers wrap like C
        else:
            assert got[0] == np_reduce(op, chunk)


def test_block_reduce_ignores_nan_for_max_and_takes_infinities():
    x = data(np.float32, 128, seed=3)
    x[5], x[70] = np.nan, -np.inf
    out = np.zeros_like(x)
    reduce_kernel(ty.f32, "max", 128).emulate(x, out, 1, grid=(1,))
    assert out[0] == np.nanmax(x)
    reduce_kernel(ty.f32, "min", 128).emulate(x, out, 1, grid=(1,))
    assert out[0] == -np.inf


@pytest.mark.parametrize("dtype", ["f32", "i32", "i64"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("threads,exclusive", [(32, False), (32, True), (160, False), (256, True)])
def test_block_scan_matches_numpy(dtype, op, threads, exclusive):
    tyd, npd = DT[dtype]
    rounds = 2
    x = data(npd, rounds * threads, seed=threads * 3 + exclusive)
    out, totals = np.zeros_like(x), np.zeros_like(x)
    scan_kernel(tyd, op, threads, exclusive).emulate(x, out, totals, rounds, grid=(1,))
    acc = {"sum": np.cumsum, "max": np.maximum.accumulate, "min": np.minimum.accumulate}[op]
    ident = {"sum": 0, "max": -np.inf if dtype == "f32" else np.iinfo(npd).min,
             "min": np.inf if dtype == "f32" else np.iinfo(npd).max}[op]
    for r in range(rounds):
        chunk = x[r * threads:(r + 1) * threads]
        got = out[r * threads:(r + 1) * threads]
        ref = acc(chunk.astype(np.float64 if dtype == "f32" else npd))
        total = ref[-1]
        if exclusive:
            ref = np.concatenate([[ident], ref[:-1]])
        if dtype == "f32" and op == "sum":
            bound = 8 * 2**-24 * np.cumsum(np.abs(chunk.astype(np.float64)))
            assert (np.abs(got.astype(np.float64) - ref) <= bound + 1e-30).all()
            assert np.allclose(totals[r * threads:(r + 1) * threads], total, rtol=1e-5)
        else:
            assert np.array_equal(got, ref.astype(npd))
            assert (totals[r * threads:(r + 1) * threads] == total).all()


@pytest.mark.parametrize("dtype", ["f32", "i32", "u32", "f64"])
@pytest.mark.parametrize("descending", [False, True])
def test_warp_sort_and_topk_match_numpy(dtype, descending):
    tyd, npd = DT[dtype]
    x = data(npd, 64, seed=7 + descending)
    if dtype == "i32":
        x[3:9] = x[20]  # ties
    if dtype == "f32":
        x[40], x[41], x[42] = np.nan, np.inf, -0.0
    out, idx, top = np.zeros_like(x), np.zeros(64, np.int32), np.zeros(2 * 5, npd)
    sort_kernel(tyd, descending, 5).emulate(x, out, idx, top, grid=(1,))
    for w in range(2):
        chunk = x[32 * w:32 * w + 32]
        ref = np.sort(chunk)  # numpy puts NaN last, as the total order does
        if descending:
            ref = ref[::-1]
        got = out[32 * w:32 * w + 32]
        assert np.array_equal(got, ref, equal_nan=True)
        assert sorted(idx[32 * w:32 * w + 32].tolist()) == list(range(32))  # a permutation
        assert np.array_equal(chunk[idx[32 * w:32 * w + 32]], got, equal_nan=True)  # the payload moved along
        assert np.array_equal(top[5 * w:5 * w + 5], np.sort(chunk)[::-1][:5], equal_nan=True)


def test_collectives_assemble_and_use_shuffles_and_barriers():
    ptx = reduce_kernel(ty.f32, "sum", 256).compile().ptx  # compile runs ptxas
    assert "shfl.sync.bfly.b32" in ptx and "bar.sync" in ptx
    assert "redux.sync" in reduce_kernel(ty.i32, "max", 256).compile().ptx
    ptx = scan_kernel(ty.i64, "sum", 256, True).compile().ptx
    assert "shfl.sync.up.b32" in ptx and "bar.sync" in ptx
    assert "shfl.sync.bfly.b32" in sort_kernel(ty.f32, False, 4).compile().ptx
    for arch in ("sm_80", "sm_90a"):
        reduce_kernel(ty.f64, "min", 96).with_arch(arch).compile()


def test_misuse_is_an_error_at_the_line():
    @ty.kernel(threads=48)
    def odd_block(x: ty.ptr(ty.f32)):
        x[0] = ty.block_reduce(x[ty.thread_idx()])

    @ty.kernel(threads=64)
    def bad_op(x: ty.ptr(ty.f32)):
        x[0] = ty.block_reduce(x[ty.thread_idx()], "mean")

    @ty.kernel(threads=64)
    def half_value(x: ty.ptr(ty.f16)):
        x[0] = ty.block_scan(x[ty.thread_idx()])

    @ty.kernel(threads=64)
    def bad_k(x: ty.ptr(ty.f32)):
        v, inside = ty.warp_topk(x[ty.thread_idx()], 40)
        x[0] = v

    cases = [(odd_block, "block_reduce expects a block of whole warps (a multiple of 32 threads, 32..1024), but got 48"),
             (bad_op, "block_reduce op expects one of 'sum', 'max', 'min', but got 'mean'"),
             (half_value, "block_scan expects an f32, f64, i32, u32, i64 or u64 value, but got f16"),
             (bad_k, "warp_topk k expects a compile-time int in 1..32, but got 40")]
    for k, text in cases:
        with pytest.raises(ty.KernelSourceError) as e:
            k.compile()
        assert text in str(e.value), str(e.value)
        assert "ty.block_" in str(e.value) or "ty.warp_topk" in str(e.value)  # the kernel's line is shown


# -- GPU tier -------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype,op", [("f32", "sum"), ("i32", "sum"), ("f32", "max"), ("i64", "min"), ("f64", "sum")])
def test_gpu_block_reduce_and_scan_match_the_emulator(dtype, op):
    tyd, npd = DT[dtype]
    x = data(npd, 3 * 256, seed=11)
    for kern, n_out in ((reduce_kernel(tyd, op, 256), 1), (scan_kernel(tyd, op, 256, True), 2)):
        want = [np.zeros_like(x) for _ in range(n_out)]
        kern.emulate(x, *want, 3, grid=(1,))
        got = [torch.full((x.size + 64,), 7, dtype=torch.from_numpy(x).dtype, device="cuda") for _ in range(n_out)]
        kern[(1,)](torch.from_numpy(x).cuda(), *[g[:x.size] for g in got], 3)
        torch.cuda.synchronize()
        for g, w in zip(got, want):
            assert np.array_equal(g[:x.size].cpu().numpy(), w)
            assert (g[x.size:].cpu() == 7).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f32", "i32"])
def test_gpu_warp_sort_matches_the_emulator(dtype):
    tyd, npd = DT[dtype]
    x = data(npd, 64, seed=13)
    want = (np.zeros_like(x), np.zeros(64, np.int32), np.zeros(10, npd))
    sort_kernel(tyd, True, 5).emulate(x, *want, grid=(1,))
    got = [torch.from_numpy(np.zeros_like(w)).cuda() for w in want]
    sort_kernel(tyd, True, 5)[(1,)](torch.from_numpy(x).cuda(), *got)
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        assert np.array_equal(g.cpu().numpy(), w)
