"""GPU tier of the host run's cases (tests/host_llvm_cases.py): the device runs each scalar kernel on
the same inputs and must give the emulator's bits (a NaN may carry other bits: the device returns
the canonical 0x7FFFFFFF for an invalid operation, the emulator numpy's NaN), padding included (a loop one step too long, or
a negative-step run-time loop counting the wrong way, shows here as it does on the host)."""
import numpy as np
import pytest
import torch

import host_llvm_cases as cases
from conftest import for_this_gpu

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.name)
def test_device_gives_the_emulators_bits(case):
    kernel = for_this_gpu(case.kernel)
    for seed in (20, 21):
        args = case.make(np.random.default_rng(seed))
        emu = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        case.kernel.emulate(*emu, grid=(1,))
        dev = [torch.from_numpy(a.copy()).cuda() if isinstance(a, np.ndarray) else a for a in args]
        kernel[(1,)](*dev)
        torch.cuda.synchronize()
        for idx in case.reference(args):
            got = dev[idx].cpu().numpy()
            same = cases._same(got, emu[idx], nan_bits=False)  # NaN payloads of arithmetic: not modelled
            assert same.all(), f"{case.name} (seed {seed}) " + cases._first(
                args, case.reference(args), idx, same, got, emu[idx], "emulator")


def test_min_max_of_signed_zeros_match_the_emulator():
    """min/max of +0 and -0 (either order): LLVM's minnum/maxnum may return either zero, so the host
    run leaves them out; the device must give the emulator's zero."""
    a = np.array([0.0, -0.0, 0.0, -0.0] * 8, np.float32)
    b = np.array([-0.0, 0.0, 0.0, -0.0] * 8, np.float32)
    c = np.ones(32, np.float32)
    n = 32
    outs = [np.full(32, np.nan, np.float32) for _ in range(7)]
    cases.float_arith.emulate(a, b, c, *outs, n, grid=(1,))
    dev = [torch.from_numpy(x.copy()).cuda() for x in (a, b, c, *[np.full(32, np.nan, np.float32)] * 7)]
    for_this_gpu(cases.float_arith)[(1,)](*dev, n)
    for name, k in (("min", 5), ("max", 6)):
        got = dev[k].cpu().numpy()
        want = outs[k - 3]
        assert (got.view(np.uint32) == want.view(np.uint32)).all(), (
            f"{name} of signed zeros: expects the emulator's {want[:4]}, but got {got[:4]} for a={a[:4]}, b={b[:4]}")
