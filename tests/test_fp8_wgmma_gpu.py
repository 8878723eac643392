"""The H200 oracle of FP8 wgmma: the probe kernel (tests/fp8_wgmma_cases.py) on random fp8 inputs
over the formats' whole range, the GPU's result bit-compared with the emulator's for SS and RS,
every e4m3/e5m2 mix, f32 and f16 accumulators, several N.

The emulator's FP8 accumulation model (tylopy/semantics/tensorcore.py: terms aligned to the
largest exponent and truncated FP8_PRECISION bits below it, the sum truncated to FP8_RESULT_BITS
fraction bits) was not fitted on a GPU when it was written. When the bits differ, the failure
says which (precision, result bits) of the same family reproduce the GPU on this data: set
those constants, or extend the model if none does.

    python -m pytest -q -m gpu tests/test_fp8_wgmma_gpu.py
"""
import itertools

import numpy as np
import pytest

import fp8_wgmma_cases as W
from conftest import requires_sm90

pytestmark = [pytest.mark.gpu, requires_sm90]

CASES = [(n, a, b, acc, rs) for (a, b), acc, rs, n in itertools.product(
    [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")], ["f32", "f16"], [False, True],
    [64, 256])] + [(8, "e4m3", "e4m3", "f32", False), (136, "e5m2", "e4m3", "f32", True)]


def fitting_models(a, b, c, a_fmt, b_fmt, acc, zero, gpu) -> str:
    """Which (precision, result bits, k group) of the model family reproduce ``gpu``: the exact
    fits, else the three closest (fraction of bit-identical outputs)."""
    scores = []
    for group, precision, result in itertools.product((32, 16), range(10, 27), (11, 12, 13, 14, 15, 23, 24)):
        m = W.model(a, b, c, a_fmt, b_fmt, acc, zero, (precision, result, group))
        scores.append((float(np.mean(m.view(np.uint32) == gpu.view(np.uint32))), (precision, result, group)))
    exact = [p for s, p in scores if s == 1.0]
    if exact:
        return f"exact fits (FP8_PRECISION, FP8_RESULT_BITS, k group): {exact}"
    best = sorted(scores, reverse=True)[:3]
    return "no exact fit; closest: " + ", ".join(f"{p} {100 * s:.1f}%" for s, p in best)


@pytest.mark.parametrize("n, a_fmt, b_fmt, acc, rs", CASES)
def test_fp8_wgmma_on_the_gpu_is_the_emulator_bit_for_bit(n, a_fmt, b_fmt, acc, rs, capsys):
    zero = n == 8
    a, b, c, gpu = W.run(n, a_fmt, b_fmt, acc, rs, zero, device="cuda", seed=n + 7)
    _, _, _, emu = W.run(n, a_fmt, b_fmt, acc, rs, zero, device="cpu", seed=n + 7)
    g, e = gpu.numpy(), emu.numpy()
    same = g.view(np.uint32) == e.view(np.uint32)
    exact = (a.double() @ b.double().T + (0 if zero else c.double())).numpy()
    scale = np.abs(exact).max()
    with capsys.disabled():
        print(f"\n[fp8 wgmma n={n} {a_fmt}x{b_fmt} acc={acc} {'RS' if rs else 'SS'}] {100 * same.mean():.2f}% "
              f"bit-identical; max |gpu - exact| / max|exact| = {np.abs(g - exact).max() / scale:.2e}, "
              f"emulator {np.abs(e - exact).max() / scale:.2e}")
    if not same.all():
        fits = fitting_models(a, b, c, a_fmt, b_fmt, acc, zero, g)
        i = np.argwhere(~same)[0]
        pytest.fail(f"{int((~same).sum())} of {same.size} outputs differ, e.g. row {i[0]} col {i[1]}: gpu "
                    f"{g[tuple(i)]!r} emulator {e[tuple(i)]!r}; model family on this data: {fits}")
