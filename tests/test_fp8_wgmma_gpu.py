"""The H200 oracle of FP8 wgmma: the probe kernel (tests/fp8_wgmma_cases.py) on random fp8 inputs
over the formats' whole range, the GPU's result bit-compared with the emulator's for SS and RS,
every e4m3/e5m2 mix, f32 and f16 accumulators, several N.

The emulator's FP8 accumulation model (tylopy/semantics/tensorcore.py ``mma_fp8``: terms
truncated 13 bits below the largest exponent; f32 accumulators truncate the sum to 13 fraction
bits, f16 ones round it to nearest f16) was fitted bit-exactly on H200 results
(tools/fp8_oracle_dump.py; tests/test_fp8_tensorcore_replay.py replays them on the CPU). When the
bits differ, the failure gives the differences in units of the output's last place.

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


def ulp_differences(gpu, emu, acc) -> str:
    """The signed differences gpu - emulator in units of the emulator's last place (f32 or f16)."""
    ulp = np.spacing(np.abs(emu).astype(np.float16 if acc == "f16" else np.float32)).astype(np.float64)
    d = (gpu.astype(np.float64) - emu) / ulp
    d = d[d != 0]
    vals, counts = np.unique(np.round(d, 2), return_counts=True)
    return ", ".join(f"{v:+g} ulp x{c}" for v, c in zip(vals[:8], counts[:8]))


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
        i = np.argwhere(~same)[0]
        pytest.fail(f"{int((~same).sum())} of {same.size} outputs differ, e.g. row {i[0]} col {i[1]}: expects the "
                    f"gpu's {g[tuple(i)]!r}, but the emulator got {e[tuple(i)]!r}; differences: "
                    f"{ulp_differences(g[~same], e[~same], acc)}")
