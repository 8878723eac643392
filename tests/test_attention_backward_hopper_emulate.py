"""The Hopper attention backward in the emulator, at small sizes.

* Each of the five products, with the descriptors, swizzles and operand majors the dK/dV kernel
  uses (S^T = K Q^T, dP^T = V dO^T, dV = P^T dO, dK = dS^T Q from registers and from shared
  memory, dQ = dS K through the stmatrix-written dS^T buffer), is bit-identical to the tensor-core
  model (``tylopy.semantics.tensorcore``) chained over k16 steps.
* Whole backward passes (``plan_backward_hopper``'s launches) match the float64 oracle under
  FlashAttention's rule (at most twice the error of torch in the input dtype, plus a floor):
  head dim 64 and 128, bf16 and fp16, causal (interior tiles that skip the length/causal mask beside
  diagonal and ragged ones), ragged lengths, GQA/MQA, Boolean masks (broadcast,
  with empty rows), both dQ reductions and the deterministic mode, (B, N, H, D) views, with NaN
  in the memory past every end of every input and output.
"""
import math

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy import hopper
from tylopy.semantics.tensorcore import mma_f32
from tylopy_kernels.attention.sm90 import backward as K
from tylopy_kernels.attention.sm90 import backward_launch as L
from tylopy_kernels.attention.sm90.backward_common import (bar_at, kmajor_desc, load_tile, mnmajor_desc, rs_gemm,
                                                             ss_gemm, zeros)
from tylopy_kernels.attention.testing.backward_reference import attention_grads, gradient_rule

# -- the five products ------------------------------------------------------------------------------------


@ty.func
def store_acc(acc, out, row0, col0, width):
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    for i in range(len(acc)):
        r, c = acc.layout.coord(warp, lane, i)
        out[(row0 + r) * width + col0 + c] = acc.values[i]


@ty.kernel(threads=256)
def bwd_products(tm_q: ty.tensormap, tm_k: ty.tensormap, tm_v: ty.tensormap, tm_do: ty.tensormap,
                 st: ty.ptr(ty.f32), dpt: ty.ptr(ty.f32), dv: ty.ptr(ty.f32), dk_regs: ty.ptr(ty.f32),
                 dk_smem: ty.ptr(ty.f32), dq: ty.ptr(ty.f32),
                 HEAD_DIM: ty.constexpr = 64, BLOCK_M: ty.constexpr = 128):
    """Warpgroup w: S^T and dP^T of keys 64w.., then dV = pack(S^T) dO, dK = pack(dP^T) Q (RS and
    SS from the dS^T buffer) and its dQ sub-tile of dS K with dS = pack(dP^T)^T."""
    dtype = ty.bf16
    order = ("n", "h", "b")
    lay = K.Smem(HEAD_DIM, BLOCK_M, 1, "tma")
    cfg = K.Config(dtype, HEAD_DIM, BLOCK_M, 1, False, "tma", "early", False, order, order)
    smem = ty.dynamic_shared(ty.u8, lay.total, align=1024)
    bar = bar_at(smem, lay.kv_full)
    panels = HEAD_DIM // 64
    if ty.thread_idx() == 0:
        hopper.mbarrier_init(bar, 1)
        hopper.fence_mbarrier_init()
        hopper.fence_proxy_async()
    ty.syncthreads()
    if ty.thread_idx() == 0:
        hopper.mbarrier_arrive_expect_tx(bar, 2 * lay.kv_bytes + 2 * lay.tile_bytes)
        load_tile(smem, lay.k, tm_k, bar, K.BLOCK_N, panels, (0, 0, 0))
        load_tile(smem, lay.v, tm_v, bar, K.BLOCK_N, panels, (0, 0, 0))
        load_tile(smem, lay.q, tm_q, bar, BLOCK_M, panels, (0, 0, 0))
        load_tile(smem, lay.do, tm_do, bar, BLOCK_M, panels, (0, 0, 0))
    hopper.mbarrier_wait(bar, 0)
    wi = ty.warpgroup_idx()
    base = ty.address(smem)
    mine = 64 * 128 * wi
    atom_s = hopper.WgmmaAtom(BLOCK_M, dtype, "ss")
    atom_kv = hopper.WgmmaAtom(HEAD_DIM, dtype, "rs")
    s = ss_gemm(atom_s, kmajor_desc(base, lay.k + mine), 128, kmajor_desc(base, lay.q), BLOCK_M, HEAD_DIM // 16)
    dp = ss_gemm(atom_s, kmajor_desc(base, lay.v + mine), 128, kmajor_desc(base, lay.do), BLOCK_M, HEAD_DIM // 16)
    s, dp = hopper.wgmma_wait(0, s, dp)
    store_acc(s, st, 64 * wi, 0, BLOCK_M)
    store_acc(dp, dpt, 64 * wi, 0, BLOCK_M)
    p_ops = [ty.pack_operand_a(atom_kv, s, kk) for kk in range(BLOCK_M // 16)]
    ds_ops = [ty.pack_operand_a(atom_kv, dp, kk) for kk in range(BLOCK_M // 16)]
    K.store_ds(smem, lay.ds, ds_ops, wi)
    hopper.fence_proxy_async()
    acc_v = rs_gemm(atom_kv, zeros(HEAD_DIM), p_ops, mnmajor_desc(base, lay.do, BLOCK_M * 128))
    acc_k = K.dk_product(cfg, base, zeros(HEAD_DIM), ds_ops, lay.ds, wi, lay.q)
    acc_v, acc_k, p_ops, ds_ops = hopper.wgmma_wait(0, acc_v, acc_k, p_ops, ds_ops)
    store_acc(acc_v, dv, 64 * wi, 0, HEAD_DIM)
    store_acc(acc_k, dk_regs, 64 * wi, 0, HEAD_DIM)
    ty.syncthreads()                                     # both halves of dS^T are in place
    cfg.dk_smem = True
    acc_k2 = K.dk_product(cfg, base, zeros(HEAD_DIM), ds_ops, lay.ds, wi, lay.q)
    acc_q = K.dq_product(smem, lay, cfg, base, lay.ds, wi)
    acc_k2, acc_q = hopper.wgmma_wait(0, acc_k2, acc_q)
    store_acc(acc_k2, dk_smem, 64 * wi, 0, HEAD_DIM)
    if BLOCK_M == 128:
        store_acc(acc_q, dq, 64 * wi, 0, HEAD_DIM)
    else:
        store_acc(acc_q, dq, 0, 64 * wi, HEAD_DIM)


def _chain(a, b):
    """A (M, K) B (K, N) as the tensor cores accumulate it, one k16 step after the other."""
    c = None
    for k in range(0, a.shape[1], 16):
        c = mma_f32(a[:, k:k + 16], b[k:k + 16], c, "bf16")
    return c


def _bf16(x):
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).float().numpy()


@pytest.mark.parametrize("D", [64, 128])
def test_each_product_matches_the_tensor_core_model(D):
    torch.manual_seed(4)
    block_m = L.SCHEDULE[D]["BLOCK_M"]
    q, do = (torch.randn(1, 1, block_m, D).to(torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 1, 128, D).to(torch.bfloat16) for _ in range(2))
    order = ("n", "h", "b")
    maps = [L._map(t, *L._tile_map(t, rows, order), False) for t, rows in ((q, block_m), (k, 128), (v, 128), (do, block_m))]
    outs = {name: torch.full((rows * cols,), float("nan")) for name, rows, cols in
            (("st", 128, block_m), ("dpt", 128, block_m), ("dv", 128, D), ("dk_regs", 128, D), ("dk_smem", 128, D),
             ("dq", block_m, D))}
    report = bwd_products.emulate(*maps, *outs.values(), grid=(1,), HEAD_DIM=D, BLOCK_M=block_m)
    assert not report.notes
    Q, Kt, V, dO = (t[0, 0].float().numpy() for t in (q, k, v, do))
    want_st = np.concatenate([_chain(Kt[64 * w:64 * w + 64], Q.T) for w in range(2)])
    want_dpt = np.concatenate([_chain(V[64 * w:64 * w + 64], dO.T) for w in range(2)])
    got = {name: t.numpy() for name, t in outs.items()}
    assert np.array_equal(got["st"].reshape(128, block_m), want_st)
    assert np.array_equal(got["dpt"].reshape(128, block_m), want_dpt)
    p, ds = _bf16(want_st), _bf16(want_dpt)
    want_dv = np.concatenate([_chain(p[64 * w:64 * w + 64], dO) for w in range(2)])
    want_dk = np.concatenate([_chain(ds[64 * w:64 * w + 64], Q) for w in range(2)])
    assert np.array_equal(got["dv"].reshape(128, D), want_dv)
    assert np.array_equal(got["dk_regs"].reshape(128, D), want_dk)
    assert np.array_equal(got["dk_smem"].reshape(128, D), want_dk)
    dq = got["dq"].reshape(block_m, D)
    for w in range(2):  # consumer w's 64x64 sub-tile: rows 64w.. (BLOCK_M 128) or columns 64w.. (64)
        rows = slice(64 * w, 64 * w + 64) if block_m == 128 else slice(0, 64)
        cols = slice(0, 64) if block_m == 128 else slice(64 * w, 64 * w + 64)
        assert np.array_equal(dq[rows, cols], _chain(ds.T[rows], Kt[:, cols]))


# -- whole backward passes ---------------------------------------------------------------------------------

def _padded(shape, dtype, bnhd=False, fill=None):
    """A tensor of ``shape`` (B, H, N, D) viewed inside a NaN-filled buffer with extra rows (and, for
    (B, N, H, D) storage, extra heads), so memory past every end holds NaN."""
    B, H, N, D = shape
    if bnhd:
        buf = torch.full((B, N + 3, H + 1, D), float("nan"), dtype=dtype)
        view = buf[:, :N, :H].transpose(1, 2)
    else:
        buf = torch.full((B, H, N + 5, D), float("nan"), dtype=dtype)
        view = buf[:, :, :N]
    if fill is not None:
        view.copy_(fill)
    return buf, view


def run_backward(B=1, H=2, H_kv=None, n_q=128, n_k=128, D=64, dtype=torch.bfloat16, causal=False, mask=None,
                 deterministic=False, schedule=None, bnhd=False, scale=None, check_races=True, seed=0):
    H_kv = H_kv or H
    torch.manual_seed(seed)
    scale = 1 / math.sqrt(D) if scale is None else scale
    _, q = _padded((B, H, n_q, D), dtype, bnhd, torch.randn(B, H, n_q, D))
    _, k = _padded((B, H_kv, n_k, D), dtype, bnhd, torch.randn(B, H_kv, n_k, D))
    _, v = _padded((B, H_kv, n_k, D), dtype, bnhd, torch.randn(B, H_kv, n_k, D))
    _, dout = _padded((B, H, n_q, D), dtype, bnhd, torch.randn(B, H, n_q, D))
    o64, lse64, dq64, dk64, dv64 = attention_grads(q, k, v, dout, is_causal=causal, scale=scale, attn_mask=mask)
    _, out = _padded((B, H, n_q, D), dtype, False, o64)
    lse = lse64.float()
    bufs, grads = zip(*(_padded(t.shape, dtype, bnhd) for t in (q, k, v)))
    steps = L.plan_backward_hopper(L.BackwardTensors(q, k, v, out, dout, lse, *grads, mask),
                                   L.HopperBackwardOptions(scale, causal, deterministic, schedule), encode=False)
    for step in steps:
        report = step.emulate(check_races=check_races)
        assert not report.notes, report
    for buf, g in zip(bufs, grads):  # nothing written past the views
        assert buf.isnan().sum() == buf.numel() - g.numel()
    base = attention_grads(q, k, v, dout, is_causal=causal, scale=scale, attn_mask=mask, dtype=dtype)[2:]
    for name, got, oracle, low in zip(("dq", "dk", "dv"), grads, (dq64, dk64, dv64), base):
        ok, msg = gradient_rule(got, oracle, low)
        assert ok, f"{name}: {msg}"
    return grads


CASES = {
    "d64-bf16": dict(),
    "d128-fp16": dict(D=128, dtype=torch.float16),
    "d64-ragged-atomic": dict(n_q=200, n_k=100, schedule={"DQ": "atomic"}),
    "d128-causal-deterministic": dict(D=128, n_q=192, n_k=192, causal=True, deterministic=True),
    "d64-gqa-bnhd-deterministic": dict(H=4, H_kv=2, n_q=70, n_k=90, bnhd=True, deterministic=True),
    "d128-mqa-ragged": dict(H=3, H_kv=1, n_q=100, n_k=60, D=128),
    "d64-causal-short-queries": dict(n_q=64, n_k=128, causal=True, dtype=torch.float16),
    "d64-sweep-late-dk-smem": dict(n_q=96, schedule={"DQ_ORDER": "late", "DK_SMEM": True}),
    "d128-sweep-serial-3-stages": dict(D=128, n_q=200, n_k=64, schedule={"DQ_ORDER": "serial", "STAGES": 3}),
    "d64-negative-scale": dict(n_q=50, n_k=70, scale=-0.2),
    "d128-deterministic-unpipelined": dict(D=128, n_q=130, n_k=300, deterministic=True,
                                           schedule={"DQ_PIPELINE": False, "DQ_BLOCK_N": 128, "DQ_STAGES": 2}),
    # Tiles the length/causal mask does not reach (they skip it) beside diagonal and ragged ones
    "d64-causal-interior-and-diagonal": dict(n_q=330, n_k=300, causal=True),
    "d128-gqa-causal-interior-and-diagonal": dict(D=128, H=2, H_kv=1, n_q=290, n_k=350, causal=True),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_backward_matches_float64(case):
    run_backward(**CASES[case])


def _mask(B, H, n_q, n_k, seed, broadcast):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand((1, 1, n_q, n_k) if broadcast else (B, H, n_q, n_k), generator=g) > 0.3
    m[..., 5, :] = False                                      # a query row with no key: zero gradients
    return m


@pytest.mark.parametrize("D,deterministic,broadcast", [(64, False, True), (128, True, False), (64, True, False)])
def test_backward_with_boolean_mask(D, deterministic, broadcast):
    B, H, n_q, n_k = 2, 2, 90, 150
    run_backward(B=B, H=H, n_q=n_q, n_k=n_k, D=D, deterministic=deterministic,
                 mask=_mask(B, H, n_q, n_k, D, broadcast), check_races=deterministic)


def test_backward_several_key_blocks_tma_reduce():
    """Several CTAs add into one dQ sub-tile with TMA reduce-adds (race checks off: see below)."""
    run_backward(B=1, H=1, n_q=130, n_k=300, D=64, causal=False, check_races=False)


def test_tma_reduce_from_several_ctas_passes_the_race_checks():
    run_backward(B=1, H=1, n_q=64, n_k=256, D=64)


def test_deterministic_mode_is_bitwise_repeatable():
    a = run_backward(n_q=100, n_k=200, deterministic=True, seed=7)
    b = run_backward(n_q=100, n_k=200, deterministic=True, seed=7)
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))


def test_expanded_key_value_heads_run_as_one_head():
    """K and V expanded over the heads (stride 0): head 0 of dk/dv gets the sum, the others 0."""
    torch.manual_seed(9)
    B, H, n, D = 1, 3, 80, 64
    q, dout = (torch.randn(B, H, n, D).to(torch.bfloat16) for _ in range(2))
    k1, v1 = (torch.randn(B, 1, n, D).to(torch.bfloat16) for _ in range(2))
    k, v = k1.expand(B, H, n, D), v1.expand(B, H, n, D)
    o64, lse64, dq64, dk64, dv64 = attention_grads(q, k1, v1, dout)
    out = o64.to(torch.bfloat16)
    grads = [torch.full((B, H, n, D), float("nan")).to(torch.bfloat16) for _ in range(3)]
    steps = L.plan_backward_hopper(L.BackwardTensors(q, k, v, out, dout, lse64.float(), *grads),
                                   L.HopperBackwardOptions(1 / 8), encode=False)
    assert steps[1].grid[1] == 1                                   # one key/value head
    for step in steps:
        step.emulate()
    base = attention_grads(q, k1, v1, dout, dtype=torch.bfloat16)[2:]
    for got, want, low in zip((grads[0], grads[1][:, :1], grads[2][:, :1]), (dq64, dk64, dv64), base):
        ok, msg = gradient_rule(got, want, low)
        assert ok, msg
    assert (grads[1][:, 1:] == 0).all() and (grads[2][:, 1:] == 0).all()
