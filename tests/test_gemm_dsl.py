"""The DSL pieces a pipelined GEMM main loop needs: a wgmma accumulator carried around a run-time
loop while its last group is in flight (wgmma_wait(1)), and MN-major A (imm-trans-a)."""

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy import hopper
from tylopy.runtime.tensormap import TensorMapSpec
from tylopy.semantics.tensorcore import mma_f32

N = 64


@ty.kernel(threads=128, min_blocks_per_sm=1)
def pipelined(tm_a: ty.tensormap, tm_b: ty.tensormap, out: ty.ptr(ty.f32), k_blocks: ty.i32,
              TRANS_A: ty.constexpr = 0, READ_EARLY: ty.constexpr = False):
    """out = A B over k_blocks k16 steps of one 64 x 64 tile; the loop keeps one group in flight."""
    smem = ty.dynamic_shared(ty.u8, 2 * 8192 * 4 + 16, align=1024)
    bar = ty.ptr_cast(smem + 2 * 8192 * 4, ty.u64)
    if ty.thread_idx() == 0:
        hopper.mbarrier_init(bar, 1)
        hopper.fence_mbarrier_init()
    ty.syncthreads()
    if ty.thread_idx() == 0:
        hopper.mbarrier_arrive_expect_tx(bar, 8 * 8192)
        for s in range(4):
            if TRANS_A:
                hopper.tma_load(smem + s * 8192, tm_a, bar, 0, 64 * s)
            else:
                hopper.tma_load(smem + s * 8192, tm_a, bar, 64 * s, 0)
            hopper.tma_load(smem + (4 + s) * 8192, tm_b, bar, 0, 64 * s)
    hopper.mbarrier_wait(bar, 0)
    base = ty.address(smem)
    atom = hopper.WgmmaAtom(N, ty.bf16, "ss")

    def descs(kb):
        s, kk = kb // 4, kb % 4
        a_off = s * 8192 + (kk * 2048 if TRANS_A else kk * 32)
        a = hopper.smem_descriptor(base + ty.cast(a_off, ty.u32), lbo=8192 if TRANS_A else 16)
        b = hopper.smem_descriptor(base + ty.cast(4 * 8192 + s * 8192 + kk * 2048, ty.u32), lbo=8192)
        return a, b

    hopper.wgmma_fence()
    a, b = descs(0)
    acc = hopper.wgmma(atom, None, a, b, trans_a=TRANS_A, trans_b=1)
    hopper.wgmma_commit()
    for kb in range(1, k_blocks):
        hopper.wgmma_fence()
        a, b = descs(kb)
        acc = hopper.wgmma(atom, acc, a, b, trans_a=TRANS_A, trans_b=1)
        hopper.wgmma_commit()
        acc = hopper.wgmma_wait(1, acc)
    if READ_EARLY:
        acc = hopper.wgmma_wait(1, acc)  # the last group may still run: reading is an error
    else:
        acc = hopper.wgmma_wait(0, acc)
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    for i in range(N // 2):
        r, c = acc.layout.coord(warp, lane, i)
        out[r * N + c] = acc.values[i]


def _maps(a, b, trans_a):
    a_src = a.t().contiguous() if trans_a else a  # MN-major A: the (K, M) row-major transpose
    tm_a = TensorMapSpec(a_src, (a_src.shape[1], a_src.shape[0]), (a_src.shape[1] * 2,), (64, 64), "bf16", 128)
    tm_b = TensorMapSpec(b, (b.shape[1], b.shape[0]), (b.shape[1] * 2,), (64, 64), "bf16", 128)
    return tm_a, tm_b


def _model(a, b, k_blocks):
    """mma_f32 applied k16 step by step: the tensor cores' accumulation, in the kernel's order."""
    af, bf = a.float().numpy(), b.float().numpy()
    acc = None
    for kb in range(k_blocks):
        acc = mma_f32(af[:, 16 * kb:16 * kb + 16], bf[16 * kb:16 * kb + 16], acc, "bf16")
    return acc


@pytest.mark.parametrize("trans_a", [0, 1])
def test_loop_carried_accumulator_in_the_emulator(trans_a):
    torch.manual_seed(trans_a)
    k = 256
    a = torch.randn(64, k).to(torch.bfloat16)
    b = torch.randn(k, N).to(torch.bfloat16)
    out = torch.full((64 * N,), float("nan"))
    pipelined.emulate(*_maps(a, b, trans_a), out, k // 16, grid=(1,), TRANS_A=trans_a)
    np.testing.assert_array_equal(out.view(64, N).numpy(), _model(a, b, k // 16))


def test_reading_before_the_last_wait_is_a_trace_error():
    with pytest.raises(ty.KernelSourceError, match="read before the wgmma_wait"):
        pipelined.trace(READ_EARLY=True)


def test_trans_a_reaches_the_ptx():
    ck = pipelined.compile(TRANS_A=1)
    lines = [line for line in ck.ptx.splitlines() if "wgmma.mma_async" in line]
    assert lines and all(line.rstrip().endswith("1, 1, 1, 1;") for line in lines), lines[:1]
    assert ck.report.spills == 0 or not ck.report.available


def test_register_a_rejects_trans_a():
    @ty.kernel(threads=128)
    def rs_trans(out: ty.ptr(ty.f32)):
        atom = hopper.WgmmaAtom(64, ty.bf16, "rs")
        p = ty.Fragment(tuple(ty.cast(0, ty.b32) for _ in range(4)), ty.WGMMA_A_RS, pack=2)
        hopper.wgmma(atom, None, p, ty.cast(0, ty.u64), trans_a=1)

    with pytest.raises(ty.TylopyError, match="trans_a=0"):
        rs_trans.trace()
