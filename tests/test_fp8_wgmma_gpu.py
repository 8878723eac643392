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


def fitting_models(a, b, c, a_fmt, b_fmt, acc, zero, gpu) -> list:
    """The (precision, result bits) of the model family that reproduce ``gpu`` exactly."""
    fits = []
    for precision, result in itertools.product(range(10, 27), (10, 11, 12, 13, 14, 15, 16, 23, 24)):
        m = W.model(a, b, c, a_fmt, b_fmt, acc, zero, (precision, result))
        if np.array_equal(m.view(np.uint32), gpu.view(np.uint32)):
            fits.append((precision, result))
    return fits


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
                    f"{g[tuple(i)]!r} emulator {e[tuple(i)]!r}; (FP8_PRECISION, FP8_RESULT_BITS) that fit the GPU "
                    f"here: {fits or 'none of the family'}")
