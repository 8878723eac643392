"""The FP8 tensor-core models of tylopy/semantics/tensorcore.py replayed on results measured on an
H200, bit for bit, without a GPU.

tests/data/fp8_tensorcore_h200.npz is a compact subset of ``tools/fp8_oracle_dump.py``'s output
(``--compact``): every mma.sync m16n8k32 case (A 16 x 32 and B^T 8 x 32 codes, C, the GPU's D;
four format mixes, 8 seeds) and, of the wgmma probe (four chained m64n64k32 steps, C given or
zero), rows 0..15 of A and D and 32 of the 64 columns (B rows): f16 accumulators for all seeds,
f32 for seed 0. The rows and columns of a GEMM are independent, so the subset is a full replay
of those outputs.
"""
import os

import numpy as np
import pytest
import torch

import fp8_cases as F
from tylopy.semantics.fp8 import fp8_to_f32
from tylopy.semantics.tensorcore import mma_fp8, mma_sync_fp8

DATA = np.load(os.path.join(os.path.dirname(__file__), "data", "fp8_tensorcore_h200.npz"))
MIXES = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]


def _check_bits(got, want, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    diff = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    if len(diff):
        i = tuple(diff[0])
        pytest.fail(f"{what}: {len(diff)} of {want.size} outputs differ from the H200; at {i} expects "
                    f"{want[i]!r} ({want.view(np.uint32)[i]:#010x}), but got {got[i]!r} "
                    f"({got.view(np.uint32)[i]:#010x})")


def _mma_case(a_fmt, b_fmt, seed):
    key = f"mma_{a_fmt}_{b_fmt}_{seed}"
    return DATA[key + "_a"], DATA[key + "_bt"], DATA[key + "_c"], DATA[key + "_d"]


@pytest.mark.parametrize("a_fmt, b_fmt", MIXES)
def test_mma_sync_fp8_model_is_the_h200(a_fmt, b_fmt):
    for seed in range(8):
        a, bt, c, d = _mma_case(a_fmt, b_fmt, seed)
        got = mma_sync_fp8(fp8_to_f32(a, a_fmt), fp8_to_f32(bt, b_fmt).T, c)
        _check_bits(got, d, f"mma.sync m16n8k32 {a_fmt} x {b_fmt} seed {seed}")


@pytest.mark.parametrize("a_fmt, b_fmt", [("e4m3", "e5m2"), ("e5m2", "e5m2")])
def test_emulated_mma_sync_fp8_kernel_is_the_h200(a_fmt, b_fmt):
    """The whole path (fragment layouts and model) through the emulator, on two seeds."""
    kern = F.mma_fp8_kernel(F.DTYPE[a_fmt], F.DTYPE[b_fmt], arch="sm_90a")
    for seed in (0, 5):
        a, bt, c, want = _mma_case(a_fmt, b_fmt, seed)
        a_t = torch.from_numpy(a).view(F.TORCH_FP8[a_fmt])
        bt_t = torch.from_numpy(bt).view(F.TORCH_FP8[b_fmt])
        d = torch.full((16, 8), float("nan"))
        kern.emulate(F.words_of(a_t), F.words_of(bt_t), torch.from_numpy(c), d, grid=(1,))
        _check_bits(d.numpy(), want, f"emulated mma.sync {a_fmt} x {b_fmt} seed {seed}")


@pytest.mark.parametrize("acc", ["f32", "f16"])
@pytest.mark.parametrize("a_fmt, b_fmt", MIXES)
def test_wgmma_fp8_model_chain_is_the_h200(a_fmt, b_fmt, acc):
    seeds = (0, 1) if acc == "f16" else (0,)
    for zero in (0, 1):
        for seed in seeds:
            key = f"wgmma_{a_fmt}_{b_fmt}_{acc}_{zero}_{seed}"
            a = fp8_to_f32(DATA[key + "_a"], a_fmt)
            bt = fp8_to_f32(DATA[key + "_b"], b_fmt).T
            d = None if zero else DATA[key + "_c"].astype(np.float32)
            for k in range(0, a.shape[1], 32):  # the probe's four chained k32 steps
                d = mma_fp8(a[:, k:k + 32], bt[k:k + 32], d, (a_fmt, b_fmt), acc)
            _check_bits(d, DATA[key + "_d"].astype(np.float32), f"wgmma {a_fmt} x {b_fmt} acc {acc} "
                        f"{'zero' if zero else 'with C'} seed {seed}")
