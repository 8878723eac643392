"""The emulator's deadlock report blames the warp that skipped its arrive, not the warp it left waiting:
a consumer that does not release a stage of a TMA ring hangs the producer's wait for that stage,
and then its own wait for the stage's next fill; the report names the consumer's missing release
whichever warp plays which role."""
import numpy as np
import pytest
import torch

import tylopy as ty
from emulate_dsl import line_of
from kernels_pipeline_bugs import ring_sum

RELEASE = line_of(ring_sum.fn.__code__.co_filename, "release")


def test_the_ring_without_the_bug_sums_every_tile():
    x = torch.randn(48, 32, generator=torch.Generator().manual_seed(1))
    out = np.full(32, np.nan, np.float32)
    ring_sum.emulate(ty.tensor_map(x, box=(8, 32)), out, 6, grid=(1,), SKIP=-1, PRODUCER=1)
    assert np.allclose(out, x.double().sum(0).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("producer", [0, 1])
@pytest.mark.parametrize("skip", [0, 1, 2, 3])
def test_a_skipped_release_is_blamed_on_the_consumer(producer, skip):
    consumer = 1 - producer
    x = torch.randn(48, 32, generator=torch.Generator().manual_seed(skip))
    with pytest.raises(ty.TylopyError) as e:
        ring_sum.emulate(ty.tensor_map(x, box=(8, 32)), np.zeros(32, np.float32), 6, grid=(1,), SKIP=skip,
                         PRODUCER=producer)
    msg = str(e.value)
    blame = msg.split("Most likely at fault: ", 1)[1].split("\n", 1)[0]
    stage = skip % 2
    assert blame.startswith(f"warp {consumer} skipped an arrive on mbarrier empty[{stage}]"), blame
    assert f"kernels_pipeline_bugs.py:{RELEASE}" in blame  # the arrive that did not run
    assert f"passed {skip // 2 + 1} wait(s) on mbarrier full[{stage}]" in blame
    assert f"arrived on mbarrier empty[{stage}] in only {skip // 2} phase(s)" in blame
    assert f"warp {producer} waits for it" in blame
    assert "full" not in blame.split("never completes")[1]  # the producer's wait is not the cause
