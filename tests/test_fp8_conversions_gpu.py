"""GPU tier of the FP8 conversions: ``fp8_cases.convert_all`` on the GPU (sm_89+) against the same
kernel in the emulator, bit for bit, for all 256 codes of both formats (to f32, f16, bf16 and
the other format) and 2048 f32 inputs (ties, saturation, subnormals, infinities, NaN) to fp8,
packed and unpacked. A mismatch prints the codes and both results: the NaN encodings
(``tylopy/semantics/fp8.py``: NaN -> 0x7F, e4m3 NaN -> f16 0x7FFF) are the first suspects.

    python -m pytest -q -m gpu tests/test_fp8_conversions_gpu.py
"""
import numpy as np
import pytest
import torch

import fp8_cases as F
from conftest import ARCH_FOR_CC, compute_capability

pytestmark = pytest.mark.gpu


def _arch():
    cc = compute_capability()
    if cc is None or cc < (8, 9):
        pytest.skip(f"fp8 conversions need sm_89+, but the device is {cc}")
    return ARCH_FOR_CC.get(cc) or pytest.skip(f"no tylopy target for {cc}")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_conversion_matches_the_emulator_bit_for_bit(fmt, monkeypatch):
    arch = _arch()
    monkeypatch.setattr(F, "convert_all", F.convert_all.with_arch(arch))
    gpu, emu = F.run(fmt, "cuda"), F.run(fmt, "cpu")
    bad = []
    for key in ("wide", "halves", "brains", "other", "rounded", "from_half", "packed2", "packed4", "unpacked"):
        g, e = gpu[key], emu[key]
        gb = g.view(np.uint32) if g.dtype == np.float32 else g
        eb = e.view(np.uint32) if e.dtype == np.float32 else e
        diff = np.nonzero(gb != eb)[0]
        if len(diff):
            src = "code" if key in ("wide", "halves", "brains", "other") else "index"
            bad.append(f"{key}: {len(diff)} differ, e.g. " + ", ".join(
                f"{src} {int(i)} (input {gpu['values'][i] if src == 'index' and key in ('rounded', 'from_half') else i})"
                f": gpu {hex(int(gb[i]))} emulator {hex(int(eb[i]))}" for i in diff[:6]))
    print(f"{fmt}: {'all bit-identical' if not bad else 'MISMATCH'}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("a_fmt, b_fmt", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")])
def test_mma_sync_k32_fp8_matches_the_emulator(a_fmt, b_fmt, capsys):
    """mma.sync m16n8k32 (sm_89+) on random codes over the whole range: GPU bits = emulator bits
    (tensorcore.py ``mma_sync_fp8``: sm_90 runs it as two chained f16 MMAs, then adds C in f32)."""
    arch = _arch()
    kern = F.mma_fp8_kernel(F.DTYPE[a_fmt], F.DTYPE[b_fmt], arch=arch)
    bad = 0
    for seed in range(8):
        a, bt, c = F.mma_fp8_inputs(a_fmt, b_fmt, seed=seed)
        d_cpu = torch.full((16, 8), float("nan"))
        kern.emulate(F.words_of(a), F.words_of(bt), c, d_cpu, grid=(1,))
        d_gpu = torch.full((16, 8), float("nan"), device="cuda")
        kern[(1,)](F.words_of(a.cuda()), F.words_of(bt.cuda()), c.cuda(), d_gpu)
        bad += int((d_gpu.cpu().view(torch.int32) != d_cpu.view(torch.int32)).sum())
    with capsys.disabled():
        print(f"\n[mma.sync m16n8k32 {a_fmt}x{b_fmt}] {bad} of {8 * 128} outputs differ from the emulator")
    assert bad == 0


def test_float8_tensor_arguments_and_16_byte_accesses_on_the_gpu():
    arch = _arch()
    x = (torch.randn(512, device="cuda") * 30).to(torch.float8_e4m3fn)
    y = torch.zeros(512, device="cuda").to(torch.float8_e4m3fn)
    F.copy16.with_arch(arch)[(1,)](x, y, 512)
    torch.cuda.synchronize()
    assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))
