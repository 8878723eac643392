"""GPU tier of the host run's cases (tests/host_llvm_cases.py): the device runs each scalar kernel on
the same inputs and must give the emulator's bits, padding included (a loop one step too long, or
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
            same = cases._same(got, emu[idx])
            assert same.all(), f"{case.name} (seed {seed}) " + cases._first(
                args, case.reference(args), idx, same, got, emu[idx], "emulator")
