"""Dump FP8 tensor-core results of the H200 with their inputs, for fitting the emulator's FP8
accumulation model offline (tylopy/semantics/tensorcore.py):

    python tools/fp8_oracle_dump.py OUT.npz      # on a GPU machine; then fit on any machine
    python tools/fp8_oracle_dump.py --compact OUT.npz tests/data/fp8_tensorcore_h200.npz

``--compact`` keeps the subset that tests/test_fp8_tensorcore_replay.py replays (a few hundred KB).

Saves, per case, the fp8 codes of A and B, the initial accumulator C and the GPU's D:
mma.sync m16n8k32 (f32 accumulator, four format mixes, 8 seeds) and wgmma k32 with f16 and f32
accumulators (N=64, SS, four mixes, C given and zero).
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import fp8_cases as F  # noqa: E402
import fp8_wgmma_cases as W  # noqa: E402

MIXES = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]


def main(path):
    out = {}
    for a_fmt, b_fmt in MIXES:
        kern = F.mma_fp8_kernel(F.DTYPE[a_fmt], F.DTYPE[b_fmt], arch="sm_90a")
        for seed in range(8):
            a, bt, c = F.mma_fp8_inputs(a_fmt, b_fmt, seed=seed)
            d = torch.full((16, 8), float("nan"), device="cuda")
            kern[(1,)](F.words_of(a.cuda()), F.words_of(bt.cuda()), c.cuda(), d)
            key = f"mma_{a_fmt}_{b_fmt}_{seed}"
            out[key + "_a"], out[key + "_bt"] = a.view(torch.uint8).numpy(), bt.view(torch.uint8).numpy()
            out[key + "_c"], out[key + "_d"] = c.numpy(), d.cpu().numpy()
        for acc in ("f16", "f32"):
            for zero in (False, True):
                for seed in range(2):
                    a, b, c, d = W.run(64, a_fmt, b_fmt, acc, False, zero, device="cuda", seed=seed)
                    key = f"wgmma_{a_fmt}_{b_fmt}_{acc}_{int(zero)}_{seed}"
                    out[key + "_a"], out[key + "_b"] = a.view(torch.uint8).numpy(), b.view(torch.uint8).numpy()
                    out[key + "_c"], out[key + "_d"] = c.numpy(), d.numpy()
    np.savez_compressed(path, **out)
    print(f"{len(out) // 4} cases written to {path}")


def compact(path, out_path):
    """Every mma.sync case; of the wgmma cases rows 0..15 of A, C, D and 32 of the 64 columns (B's
    rows; outputs of a GEMM are independent per row and column), f16 accumulators of every seed
    (C, D stored as f16) and f32 ones of seed 0."""
    z, out = np.load(path), {}
    for key in z.files:
        v = z[key]
        if key.startswith("wgmma_"):
            name, part = key.rsplit("_", 1)
            acc = name.split("_")[3]
            if acc == "f32" and not name.endswith("_0"):
                continue
            v = v[:16] if part == "a" else v[:32] if part == "b" else v[:16, :32]
            if acc == "f16" and part in ("c", "d"):
                v = v.astype(np.float16)
        out[key] = v
    np.savez_compressed(out_path, **out)
    print(f"{len(out) // 4} cases written to {out_path}")


if __name__ == "__main__":
    if sys.argv[1] == "--compact":
        compact(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
