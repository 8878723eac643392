"""The Hopper attention backward without a GPU: ptxas, exact small kernels, input checks.

* The specializations ``plan_backward_hopper`` launches (head dim 64/128, with and without a
  mask, deterministic or not; fp16 and (B, N, H, D) memory plain and loaded) and every schedule of the
  ``--sweep`` grid assembles for sm_90a with no spills, no stack frame, no C7508/C7511/C7512/C7515, and fits
  in shared memory.
* The preprocessing kernel (delta as a fixed fused-multiply-add tree, L log2 e), the dQ
  conversion and the mask packing are bit-identical to numpy models in the emulator.
* The launcher rejects bad input with errors that name the argument.

The products and end-to-end gradients in the emulator are in
``test_attention_backward_hopper_emulate.py``.
"""
import itertools

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy_kernels.attention.sm90 import backward_launch as L
from tylopy_kernels.attention.sm90.backward import attention_bwd_sm90, smem_bytes
from tylopy_kernels.attention.sm90.backward_aux import (attention_bwd_dq_convert, attention_bwd_pack_mask,
                                                          attention_bwd_preprocess)
from tylopy_kernels.attention.sm90.backward_dq import attention_bwd_dq_sm90
from tylopy_kernels.attention.sm90.backward_dq import smem_bytes as dq_smem_bytes

LOG2E = np.float32(1.4426950408889634)


# -- specializations and ptxas ------------------------------------------------------------------------

def _inputs(D, dtype, bnhd=False, B=1, H=2, H_kv=1, n_q=8, n_k=8):
    def make(h, n):
        t = torch.randn(B, n, h, D).to(dtype).transpose(1, 2) if bnhd else torch.randn(B, h, n, D).to(dtype)
        return t
    q, k, v, out, dout = make(H, n_q), make(H_kv, n_k), make(H_kv, n_k), make(H, n_q), make(H, n_q)
    lse = torch.randn(B, H, n_q)
    return q, k, v, out, dout, lse, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _variants():
    """Every (head dim, mask, mode) in bf16 and (B, H, N, D) memory; fp16 and the (B, N, H, D) order
    (they change instruction types and TMA coordinates, not the register budget) plain and fully
    loaded."""
    for D, masked, det in itertools.product(L.HEAD_DIMS, (False, True), (False, True)):
        yield D, torch.bfloat16, masked, det, False
    for D, loaded in itertools.product(L.HEAD_DIMS, (False, True)):
        yield D, torch.float16, loaded, loaded, loaded
        yield D, torch.bfloat16, loaded, loaded, True


def _launcher_specs():
    """(kernel, constexprs) of the launches the launcher plans, found by planning on CPU tensors."""
    seen = {}
    for D, dtype, masked, det, bnhd in _variants():
        args = _inputs(D, dtype, bnhd)
        mask = torch.rand(8, 8) > 0.5 if masked else None
        for step in L.plan_backward_hopper(L.BackwardTensors(*args, mask), L.HopperBackwardOptions(0.125, deterministic=det),
                                           encode=False):
            key = (step.kernel.name, repr(sorted(step.constexprs.items())))
            seen.setdefault(key, (step.kernel, step.constexprs))
    return list(seen.values())


LAUNCHER_SPECS = _launcher_specs()


def _spec_id(spec):
    kernel, cx = spec
    parts = [kernel.name.replace("attention_bwd_", "")]
    for k, v in sorted(cx.items()):
        if k in ("Q_ORDER", "KV_ORDER"):
            parts.append(f"{k[0].lower()}{''.join(x[0] for x in v)}")
        else:
            parts.append(f"{k.lower()}={v}")
    return "-".join(parts)


def _check_report(kernel, cx):
    ck = kernel.compile(**cx)
    report = ck.report
    if not report.available:
        pytest.skip(report.note)
    assert report.arch == "sm_90a", str(report)
    assert report.spills == 0, str(report)
    assert report.stack_frame == 0 and not report.has_local_memory, str(report)
    assert not report.codes() & {"C7508", "C7511", "C7512", "C7515"}, str(report)
    return ck


def test_launcher_plans_every_kernel():
    names = {kernel.name for kernel, _ in LAUNCHER_SPECS}
    assert names == {"attention_bwd_preprocess", "attention_bwd_pack_mask", "attention_bwd_sm90",
                     "attention_bwd_dq_convert", "attention_bwd_dq_sm90"}


@pytest.mark.parametrize("spec", LAUNCHER_SPECS, ids=[_spec_id(s) for s in LAUNCHER_SPECS])
def test_launcher_specializations_assemble_without_spills(spec):
    kernel, cx = spec
    _check_report(kernel, cx)
    if kernel is attention_bwd_sm90:
        assert smem_bytes(**cx) <= L.MAX_SMEM
    if kernel is attention_bwd_dq_sm90:
        assert dq_smem_bytes(**cx) <= L.MAX_SMEM


SWEEP_SPECS = [(D, s) for D in L.HEAD_DIMS for s in L.SWEEP[D]] + [(D, s) for D in L.HEAD_DIMS for s in L.DQ_SWEEP[D]]


@pytest.mark.exhaustive  # benchmark alternatives: the launcher's specializations are assembled above
@pytest.mark.parametrize("D,sched", SWEEP_SPECS, ids=[f"d{d}-" + "-".join(f"{v}" for v in s.values())
                                                      for d, s in SWEEP_SPECS])
def test_sweep_schedules_assemble_without_spills(D, sched):
    block_m = L.SCHEDULE[D]["BLOCK_M"]
    if "DQ_BLOCK_N" in sched:
        cx = dict(DTYPE=ty.bf16, HEAD_DIM=D, BLOCK_N=sched["DQ_BLOCK_N"], STAGES=sched["DQ_STAGES"],
                  PIPELINE=sched["DQ_PIPELINE"])
        _check_report(attention_bwd_dq_sm90, cx)
        assert dq_smem_bytes(**cx) <= L.MAX_SMEM
    else:
        cx = dict(DTYPE=ty.bf16, HEAD_DIM=D, BLOCK_M=block_m, **sched)
        _check_report(attention_bwd_sm90, cx)
        assert smem_bytes(**cx) <= L.MAX_SMEM


@pytest.mark.parametrize("D", L.HEAD_DIMS)
def test_ptx_holds_the_hopper_instructions(D):
    cx = dict(DTYPE=ty.bf16, HEAD_DIM=D, BLOCK_M=L.SCHEDULE[D]["BLOCK_M"])
    ptx = _check_report(attention_bwd_sm90, cx).ptx
    for needle in ("wgmma.mma_async", "wgmma.wait_group", "cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor",
                   "stmatrix.sync.aligned", "mbarrier.try_wait", "setmaxnreg.inc", "setmaxnreg.dec", "ex2.approx",
                   "fence.proxy.async"):
        assert needle in ptx, f"{needle} missing from the PTX"
    # Five products per iteration: S^T and dP^T (D/16 steps each), dV and dK (BLOCK_M/16), dQ (8).
    steps = 2 * (D // 16) + 2 * (L.SCHEDULE[D]["BLOCK_M"] // 16) + 8
    assert ptx.count("wgmma.mma_async") == steps
    assert ".target sm_90a" in ptx


# -- exact small kernels in the emulator ----------------------------------------------------------------

def _f32(x):
    return np.asarray(x, dtype=np.float32)


def _fma32(a, b, c):
    """float32 fused multiply-add (the product of two 16-bit floats is exact in float64)."""
    return _f32(a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64))


def _delta_model(o, do, D):
    """delta as the kernel sums it: per 8-element chunk a chain of fmas, then a butterfly tree."""
    o, do = o.float().numpy(), do.float().numpy()
    chunks = []
    for c in range(D // 8):
        acc = np.zeros(o.shape[:-1], dtype=np.float32)
        for e in range(8):
            acc = _fma32(o[..., 8 * c + e], do[..., 8 * c + e], acc)
        chunks.append(acc)
    while len(chunks) > 1:  # lane l adds lane l ^ m: pairs, then pairs of pairs
        chunks = [_f32(chunks[i] + chunks[i + 1]) for i in range(0, len(chunks), 2)]
    return chunks[0]


@pytest.mark.parametrize("D,dtype", [(64, torch.bfloat16), (128, torch.float16)])
def test_preprocess_is_exact(D, dtype):
    torch.manual_seed(1)
    B, H, n_q, n_pad = 2, 3, 40, 128
    o = torch.randn(B, n_q + 3, H, D).to(dtype).transpose(1, 2)[:, :, :n_q]   # strided view, rows past n_q
    do = torch.randn(B, H, n_q, D).to(dtype)
    lse = torch.randn(B, H, n_q + 5)[..., :n_q] * 4
    lse[0, 1, 7] = float("-inf")                                               # a row with every key masked
    delta = torch.full((B * H, n_pad), float("nan"))
    lse_log2 = torch.full((B * H, n_pad), float("nan"))
    accum = torch.full((B * H * n_pad * D + 8,), float("nan"))                  # NaN past its end too
    attention_bwd_preprocess.emulate(o.view(torch.int16), do.view(torch.int16), lse, delta, lse_log2, accum, delta,
                                     n_q, H, n_pad, *o.stride()[:3], *do.stride()[:3], *lse.stride(),
                                     grid=(n_pad // (1024 // D), H, B),
                                     DTYPE=ty.bf16 if dtype == torch.bfloat16 else ty.f16, HEAD_DIM=D, ZERO_ACCUM=True)
    assert (accum[:-8] == 0).all() and accum[-8:].isnan().all()
    want_delta = _delta_model(o, do, D).reshape(B * H, n_q)
    assert np.array_equal(delta[:, :n_q].numpy(), want_delta)
    assert (delta[:, n_q:] == 0).all()
    want_lse = _f32(lse.numpy() * LOG2E).reshape(B * H, n_q)
    want_lse[1, 7] = np.inf
    assert np.array_equal(lse_log2[:, :n_q].numpy(), want_lse)
    assert (lse_log2[:, n_q:] == float("inf")).all()


def _acc_coords():
    """(row, col) of register i of thread t in a wgmma m64n64 accumulator, as arrays (128, 32)."""
    t = np.arange(128)[:, None]
    i = np.arange(32)[None, :]
    w, lane = t // 32, t % 32
    g, q = lane // 4, lane % 4
    return 16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * q + (i & 1)


@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("D,dtype", [(64, torch.bfloat16), (128, torch.float16)])
def test_dq_convert_is_exact(D, dtype, wide):
    torch.manual_seed(2)
    B, H, n_q, n_pad, scale = 1, 2, 100, 128, 0.3
    accum = torch.randn(B * H * n_pad * D)
    dq_buf = torch.full((B, H, n_q + 4, D), float("nan")).to(dtype)
    dq = dq_buf[:, :, :n_q]
    attention_bwd_dq_convert.emulate(accum, dq.view(torch.int16), n_q, H, n_pad, scale, *dq.stride()[:3],
                                     accum, accum, accum, accum, grid=(n_pad // 64 * (D // 64), H, B),
                                     DTYPE=ty.bf16 if dtype == torch.bfloat16 else ty.f16, HEAD_DIM=D, WIDE=wide)
    rows, cols = _acc_coords()
    tiles = accum.numpy().reshape(B * H, n_pad // 64, D // 64, 8, 128, 4)  # (bh, row tile, col tile, j, t, e)
    want = np.zeros((B * H, n_pad, D), dtype=np.float32)
    for rt, ct in itertools.product(range(n_pad // 64), range(D // 64)):
        regs = tiles[:, rt, ct].transpose(0, 2, 1, 3).reshape(B * H, 128, 32)   # (bh, t, i = 4j + e)
        want[:, 64 * rt + rows, 64 * ct + cols] = regs * np.float32(scale)
    want_t = torch.from_numpy(want[:, :n_q]).reshape(B, H, n_q, D).to(dtype)
    assert torch.equal(dq.view(torch.int16), want_t.view(torch.int16))
    assert dq_buf[:, :, n_q:].isnan().all()


@pytest.mark.parametrize("keys_on_rows", [True, False])
def test_pack_mask_is_exact(keys_on_rows):
    torch.manual_seed(3)
    B, H, n_q, n_k = 2, 3, 70, 45
    mask = torch.rand(1, H, n_q, n_k) > 0.4                      # broadcast over the batch
    steps = []
    bits, strides = L._packed_mask(steps, L.mask_and_lse_args(mask, None, B, H, n_q, n_k, "cpu")[:2],
                                   L.MaskShape(B, H, n_q, n_k, 128), keys_on_rows)
    step = steps[0]
    step.emulate()
    words = bits.numpy().view(np.uint32)
    rows, per_row = 128, 4                                         # 45 keys and 70 queries, padded to 128
    assert strides == (0, rows * per_row, per_row)
    got = np.unpackbits(words.reshape(H, rows, per_row).view(np.uint8), axis=-1, bitorder="little").astype(bool)
    m = mask[0].numpy()
    want = np.zeros((H, rows, 32 * per_row), dtype=bool)
    if keys_on_rows:
        want[:, :n_k, :n_q] = m.transpose(0, 2, 1)
    else:
        want[:, :n_q, :n_k] = m
    assert np.array_equal(got, want)


# -- input checks -----------------------------------------------------------------------------------------

BAD = [
    ("head dim 96", dict(D=96), ValueError, "head_dim"),
    ("dq float32", dict(dq=torch.float32), TypeError, "dq"),
    ("lse shape", dict(lse=(1, 2, 7)), ValueError, "lse"),
    ("heads not a multiple", dict(H=3, H_kv=2), ValueError, "heads"),
    ("dk shape", dict(dk=(1, 2, 8, 64)), ValueError, "dk"),
    ("strided last dim", dict(strided="v"), ValueError, "v"),
    ("schedule block", dict(schedule={"BLOCK_M": 64}), ValueError, "BLOCK_M"),
]


@pytest.mark.parametrize("name,change,exc,word", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument(name, change, exc, word):
    D, H, H_kv = change.get("D", 64), change.get("H", 2), change.get("H_kv", 1)
    q, k, v, out, dout, lse, dq, dk, dv = _inputs(D, torch.bfloat16, H=H, H_kv=H_kv)
    if "dq" in change:
        dq = dq.float()
    if "lse" in change:
        lse = torch.zeros(change["lse"])
    if "dk" in change:
        dk = torch.zeros(change["dk"], dtype=torch.bfloat16)
    if "strided" in change:
        v = torch.randn(1, 1, 8, 128).to(torch.bfloat16)[..., ::2]
    with pytest.raises(exc, match=word):
        L.plan_backward_hopper(L.BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv),
                               L.HopperBackwardOptions(0.1, schedule=change.get("schedule")), encode=False)


def test_empty_lengths_give_zero_gradients():
    q, k, v, out, dout, lse, dq, dk, dv = _inputs(64, torch.bfloat16, n_q=0)
    for t in (dk, dv):
        t.fill_(float("nan"))
    assert L.plan_backward_hopper(L.BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv), L.HopperBackwardOptions(0.1),
                                  encode=False) == []
    assert (dk == 0).all() and (dv == 0).all()


def test_supports():
    q = torch.zeros(1, 4, 8, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    assert L.supports(q, k, k)
    assert L.supports(q[..., :64], k[..., :64], k[..., :64])
    assert not L.supports(q.float(), k.float(), k.float())
    assert not L.supports(q[..., :32], k[..., :32], k[..., :32])
    assert not L.supports(q[:, :3], k, k)


@pytest.mark.parametrize("D,det,bnhd", [(64, False, False), (128, True, True), (128, False, True)])
def test_a_repeated_signature_plans_the_same_launches(D, det, bnhd):
    """The second call of a signature takes the kept layout: the same kernels, grids, constexprs and
    arguments as planning from scratch (maps over the same buffers with the same geometry)."""
    args = _inputs(D, torch.bfloat16, bnhd, B=2, H=4, H_kv=2, n_q=200, n_k=136)
    options = L.HopperBackwardOptions(0.1, is_causal=True, deterministic=det)
    L._layouts.clear()
    first = L.plan_backward_hopper(L.BackwardTensors(*args), options, encode=False)
    assert len(L._layouts) == 1
    again = L.plan_backward_hopper(L.BackwardTensors(*args), options, encode=False)
    assert len(first) == len(again) == 3
    for a, b in zip(first, again):
        assert (a.kernel, a.grid, a.constexprs) == (b.kernel, b.grid, b.constexprs)
        assert len(a.args) == len(b.args)
        for x, y in zip(a.args, b.args):
            if isinstance(x, torch.Tensor):
                assert (x.shape, x.stride(), x.dtype) == (y.shape, y.stride(), y.dtype)
            elif hasattr(x, "box"):
                assert (x.dims, x.strides_bytes, x.box, x.dtype, x.swizzle) == \
                    (y.dims, y.strides_bytes, y.box, y.dtype, y.swizzle)
            else:
                assert x == y


def test_plans_that_copy_or_mask_are_not_kept():
    """A layout is kept only where the call's own tensors are mapped: not with a mask, an
    unaligned base (q copied) or K/V expanded over the heads."""
    L._layouts.clear()
    q, k, v, out, dout, lse, dq, dk, dv = _inputs(64, torch.bfloat16, H=2, H_kv=2)
    options = L.HopperBackwardOptions(0.1)
    L.plan_backward_hopper(L.BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv, torch.rand(8, 8) > 0.5),
                           options, encode=False)
    odd = torch.randn(1 * 2 * 8 * 64 + 1).to(torch.bfloat16)[1:].view(1, 2, 8, 64)
    L.plan_backward_hopper(L.BackwardTensors(odd, k, v, out, dout, lse, dq, dk, dv), options, encode=False)
    kx = k[:, :1].expand(1, 2, 8, 64)
    L.plan_backward_hopper(L.BackwardTensors(q, kx, kx, out, dout, lse, dq, dk, dv), options, encode=False)
    assert len(L._layouts) == 0
