"""Fragments on the GPU: the same-lane C -> A conversion against the shared-memory path and a
second mma.sync, and the reductions and softmax state ops against their numpy reference mode.

Kernels here take their fragments' registers from global memory at ``layout.coord(warp, lane, i)``
(the tables tests/test_fragments_layouts.py checks against the PTX ISA), run the fragment ops traced, and
write every thread's registers back, so each (thread, value) is compared. Outputs are poisoned
first (NaN, or 0xFFFFFFFF for packed words) so a missing write fails.

The kernels compile for the current device (sm_90a on Hopper, sm_80/86/89 elsewhere); the CPU
tier only checks that they assemble.
"""
import functools

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.tile import mma_sync

from conftest import for_this_gpu

DTYPES = {"bf16": (ty.bf16, torch.bfloat16), "f16": (ty.f16, torch.float16)}


# -- kernel helpers (plain Python run at trace time) ---------------------------------------------------

def load_fragment(src, ld: int, layout, ownership, warp, lane):
    """A fragment whose value i is src[row * ld + col] at (row, col) = layout.coord(warp, lane, i)."""
    vals = []
    for i in range(layout.nvalues):
        r, c = layout.coord(warp, lane, i)
        vals.append(src[r * ld + c])
    return ty.Fragment(tuple(vals), ownership, layout)


def load_operand(src, ld: int, col0: int, layout, ownership, warp, lane, dtype):
    """A packed 16-bit operand: register r = pack(element 2r, element 2r + 1) of an f32 tile
    (already representable in ``dtype``, so the rounding is exact), columns offset by ``col0``."""
    words = []
    for reg in range(layout.nvalues // 2):
        r0, c0 = layout.coord(warp, lane, 2 * reg)
        r1, c1 = layout.coord(warp, lane, 2 * reg + 1)
        words.append(ty.pack2(src[r0 * ld + c0 + col0], src[r1 * ld + c1 + col0], dtype))
    return ty.Fragment(tuple(words), ownership, layout, pack=2, dtype=dtype)


def store_fragment(dst, ld: int, col0: int, frag, warp, lane):
    for i, x in enumerate(frag.values):
        r, c = frag.layout.coord(warp, lane, i)
        dst[r * ld + c + col0] = x


def store_registers(dst, tid, frag):
    """Every thread's registers in order: dst[tid * n + i]."""
    n = len(frag.values)
    for i, x in enumerate(frag.values):
        dst[tid * n + i] = x


# -- pack_operand_a: registers vs shared memory vs a second MMA ---------------------------------------

@functools.cache
def chain_kernel(dtype_name: str):
    """One warp: S = Q Kt (two n8 mma.sync atoms), P = pack_operand_a(S), O = P V; P also through
    shared memory (16-bit stores at the C layout, 16-bit loads at the A layout)."""
    dtype = DTYPES[dtype_name][0]
    atom = ty.MmaSyncAtom(dtype)
    A, B, C = ty.MMA_SYNC_A, ty.MMA_SYNC_B, ty.MMA_SYNC_C

    @ty.kernel(threads=32, name=f"same_lane_chain_{dtype_name}")
    def same_lane_chain(q: ty.ptr(ty.f32), kt: ty.ptr(ty.f32), v: ty.ptr(ty.f32), s_out: ty.ptr(ty.f32),
                        p_regs: ty.ptr(ty.b32), p_smem: ty.ptr(ty.b32), o_out: ty.ptr(ty.f32)):
        warp = ty.warp_idx()
        lane = ty.lane_id()
        zero = ty.Fragment(tuple(ty.cast(0.0, ty.f32) for _ in range(4)), ty.QUAD, C)
        qa = load_operand(q, 16, 0, A, mma_sync.A_OWNERSHIP, warp, lane, dtype)
        s0 = mma_sync.mma(atom, qa, load_operand(kt, 16, 0, B, mma_sync.B_OWNERSHIP, warp, lane, dtype), zero)
        s1 = mma_sync.mma(atom, qa, load_operand(kt, 16, 8, B, mma_sync.B_OWNERSHIP, warp, lane, dtype), zero)
        store_fragment(s_out, 16, 0, s0, warp, lane)
        store_fragment(s_out, 16, 8, s1, warp, lane)

        p = ty.pack_operand_a(atom, s0, s1)
        store_registers(p_regs, lane, p)

        tile = ty.shared(ty.u16, 16 * 16)
        for col0, s in ((0, s0), (8, s1)):
            for i, x in enumerate(s.values):
                r, c = C.coord(warp, lane, i)
                tile[r * 16 + c + col0] = ty.bitcast(ty.cast(x, dtype), ty.u16)
        ty.syncthreads()
        for reg in range(4):
            r0, c0 = A.coord(warp, lane, 2 * reg)
            r1, c1 = A.coord(warp, lane, 2 * reg + 1)
            lo = ty.cast(tile[r0 * 16 + c0], ty.u32)
            hi = ty.cast(tile[r1 * 16 + c1], ty.u32)
            p_smem[lane * 4 + reg] = ty.bitcast(lo | (hi << 16), ty.b32)

        o = mma_sync.mma(atom, p, load_operand(v, 8, 0, B, mma_sync.B_OWNERSHIP, warp, lane, dtype), zero)
        store_fragment(o_out, 8, 0, o, warp, lane)

    return same_lane_chain


def rounded(x: torch.Tensor, tdt) -> torch.Tensor:
    return x.to(tdt).to(torch.float32)


def rne_words(tile: np.ndarray, table: np.ndarray, tdt) -> np.ndarray:
    """Packed words a correct conversion gives: register r = element 2r (bits 0-15) | 2r + 1 (16-31)."""
    elems = torch.from_numpy(np.ascontiguousarray(tile[table[..., 0], table[..., 1]], np.float32))
    bits = elems.to(tdt).view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    return bits[:, 0::2] | (bits[:, 1::2] << 16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "f16"])
def test_pack_operand_a_matches_shared_memory_and_feeds_a_second_mma(dtype_name):
    tdt = DTYPES[dtype_name][1]
    kernel = for_this_gpu(chain_kernel(dtype_name))
    gen = torch.Generator().manual_seed(5)
    q, kt = (rounded(torch.randn(16, 16, generator=gen), tdt) for _ in range(2))
    v = rounded(torch.randn(16, 8, generator=gen), tdt)
    dev = [t.cuda() for t in (q, kt, v)]
    s_out = torch.full((16, 16), float("nan"), device="cuda")
    o_out = torch.full((16, 8), float("nan"), device="cuda")
    p_regs = torch.full((32, 4), -1, dtype=torch.int32, device="cuda")
    p_smem = torch.full((32, 4), -1, dtype=torch.int32, device="cuda")
    kernel[(1,)](*dev, s_out, p_regs, p_smem, o_out)
    torch.cuda.synchronize()

    s = s_out.cpu().double()
    want_s = q.double() @ kt.double()
    torch.testing.assert_close(s, want_s, rtol=1e-5, atol=1e-5 * float((q.abs().double() @ kt.abs().double()).max()))
    regs = p_regs.cpu().numpy().view(np.uint32)
    smem = p_smem.cpu().numpy().view(np.uint32)
    np.testing.assert_array_equal(regs, smem, err_msg="pack_operand_a differs from the shared-memory path")
    np.testing.assert_array_equal(regs, rne_words(s_out.cpu().numpy(), ty.MMA_SYNC_A.table, tdt),
                                  err_msg="packed words are not RNE of S at the ISA's A positions")
    p64 = rounded(s_out.cpu(), tdt).double()
    want_o = p64 @ v.double()
    bound = 1e-5 * float((p64.abs() @ v.abs().double()).max())
    torch.testing.assert_close(o_out.cpu().double(), want_o, rtol=1e-5, atol=bound)


# -- reductions and softmax on device vs the reference mode --------------------------------------------

SCALE = 0.6


def fragment_ops(y, x0, x1, dims_list):
    """The ops under test, as (name, fragment): reductions of ``y``, two online softmax updates with
    scores ``x0``, ``x1``. The same code runs traced in the kernel and in numpy reference mode."""
    out = []
    for dims in dims_list:
        for op in ("max", "min", "sum"):
            out.append((f"{op}_dims{dims}", y.reduce(op, dims)))
    for partial in (False, True):
        tag = "_partial" if partial else ""
        u0 = ty.softmax_update(ty.SoftmaxState(x0, partial_sum=partial), x0, SCALE)
        u1 = ty.softmax_update(u0.state, x1, SCALE)
        numerator = u0.weights * u1.rescale + u1.weights
        out += [(f"rescale0{tag}", u0.rescale), (f"p0{tag}", u0.weights), (f"rescale1{tag}", u1.rescale),
                (f"p1{tag}", u1.weights), (f"maximum{tag}", u1.state.maximum), (f"sum{tag}", u1.state.sum),
                (f"normalized{tag}", ty.softmax_normalize(numerator, u1.state)),
                (f"lse{tag}", ty.softmax_lse(u1.state, SCALE))]
    return out


DEVICE_CASES = {  # name: (layout, ownership, reduction axes that stay inside a warp)
    "mma_c": (ty.MMA_SYNC_C, ty.QUAD, (1, 2)),
    "tiled_2x4": (ty.tiled_mma_c(2, 4), ty.QUAD, (1, 2)),
    "wgmma64": (ty.wgmma_acc(64), ty.WARPGROUP, (2,)),
}


@functools.cache
def ops_kernel(case: str):
    layout, own, dims_list = DEVICE_CASES[case]
    rows, cols = layout.shape

    @ty.kernel(threads=layout.threads, name=f"fragment_ops_{case}")
    def fragment_ops_kernel(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
        warp = ty.warp_idx()
        lane = ty.lane_id()
        tid = ty.thread_idx()
        y, x0, x1 = (load_fragment(x + k * rows * cols, cols, layout, own, warp, lane) for k in range(3))
        base = 0
        for _, frag in fragment_ops(y, x0, x1, dims_list):
            store_registers(out + base, tid, frag)
            base += layout.threads * len(frag.values)

    return fragment_ops_kernel


def device_tiles(layout, seed: int) -> np.ndarray:
    """[y, x0, x1]: y finite (for the reductions); scores x0, x1 with ~15% -inf, row 0 masked in both,
    row 1 in x0 only, row 2 in x1 only."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3,) + layout.shape) * 2.0).astype(np.float32)
    scores = x[1:]
    scores[rng.random(scores.shape) < 0.15] = -np.inf
    scores[:, 0] = -np.inf
    scores[0, 1] = -np.inf
    scores[1, 2] = -np.inf
    return x


def reference_results(layout, own, dims_list, x):
    t = layout.table
    frags = [ty.Fragment(x[k][t[..., 0], t[..., 1]], own, layout) for k in range(3)]
    with np.errstate(divide="ignore"):  # the reference takes log2(0) of the masked row, then selects -inf
        return [(name, f.data) for name, f in fragment_ops(*frags, dims_list)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(DEVICE_CASES))
def test_reductions_and_softmax_on_device_match_the_reference(case):
    layout, own, dims_list = DEVICE_CASES[case]
    kernel = for_this_gpu(ops_kernel(case))
    x = device_tiles(layout, seed=len(case))
    ref = reference_results(layout, own, dims_list, x)
    total = sum(r.size for _, r in ref)
    out = torch.full((total,), float("nan"), device="cuda")
    kernel[(1,)](torch.from_numpy(x).cuda(), out)
    torch.cuda.synchronize()
    got_all = out.cpu().numpy()
    base = 0
    for name, want in ref:
        got = got_all[base:base + want.size].reshape(want.shape)
        base += want.size
        if name.startswith(("max_", "min_", "maximum")):
            np.testing.assert_array_equal(got, want, err_msg=name)
        elif name.startswith("sum_dims"):  # same fold and shuffle order; allow f32 reassociation
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * np.abs(x[0]).max() * x[0].shape[0],
                                       err_msg=name)
        elif name.startswith("lse"):
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=name)
        else:  # ex2.approx.ftz: a few ulp against numpy's exp2
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=0, err_msg=name)
        assert np.isnan(got).sum() == np.isnan(want).sum() == 0, f"{name}: NaN"


# -- CPU tier: the kernels trace and assemble ------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: chain_kernel("bf16"), lambda: chain_kernel("f16")]
                         + [lambda c=c: ops_kernel(c) for c in DEVICE_CASES],
                         ids=["chain-bf16", "chain-f16"] + [f"ops-{c}" for c in DEVICE_CASES])
def test_fragment_kernels_assemble(make):
    """Traced, lowered and (where ptxas is installed) assembled; spills do not matter in these test
    kernels, which keep every result live until the stores at the end."""
    ck = make().compile()
    assert "mma.sync.aligned.m16n8k16" in ck.ptx or "shfl.sync.bfly" in ck.ptx
    report = ck.report
    if not report.available:
        pytest.skip(report.note)
    assert report.registers is not None, str(report)
