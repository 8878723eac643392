"""Debug mode (TYLOPY_DEBUG_WAITS=1): every mbarrier wait is bounded and a timeout becomes an error
that names the wait, its source line, the parity and the barrier's address."""
import inspect

import pytest

import tylopy as ty
from tylopy import hopper
from tylopy.errors import MbarrierTimeoutError


def _wrong_expect_tx_kernel():
    @ty.kernel(threads=32)
    def wrong_expect_tx(out: ty.ptr(ty.i32)):
        bar = ty.shared(ty.u64, 1, align=8)
        if ty.thread_idx() == 0:
            hopper.mbarrier_init(bar, 1)
            hopper.fence_mbarrier_init()
        ty.syncthreads()
        if ty.thread_idx() == 0:
            hopper.mbarrier_arrive_expect_tx(bar, 1024)  # no copy will ever deliver these bytes
        hopper.mbarrier_wait(bar, 0, label="never_full")  # <- the wait that times out
        out[ty.thread_idx()] = 1
    return wrong_expect_tx


def _wait_line():
    src, first = inspect.getsourcelines(_wrong_expect_tx_kernel)
    return first + next(i for i, line in enumerate(src) if "<- the wait" in line)


def test_debug_mode_bounds_every_wait(monkeypatch):
    monkeypatch.setenv("TYLOPY_DEBUG_WAITS", "1")
    ck = _wrong_expect_tx_kernel().compile()
    assert "tylopy_debug_record" in ck.ptx and "%globaltimer" in ck.ptx
    assert ck.wait_sites[0].label == "never_full" and ck.ir.wait_sites == ck.wait_sites
    assert ck.report.spills == 0


def test_release_mode_has_no_debug_record(monkeypatch):
    monkeypatch.delenv("TYLOPY_DEBUG_WAITS", raising=False)
    ck = _wrong_expect_tx_kernel().compile()
    assert "tylopy_debug_record" not in ck.ptx and "%globaltimer" not in ck.ptx


def test_debug_mode_is_part_of_the_cache_key(monkeypatch):
    from tylopy.jit import cache
    k = _wrong_expect_tx_kernel()
    monkeypatch.delenv("TYLOPY_DEBUG_WAITS", raising=False)
    key_release, _ = cache.base_key(k, {}, k.options())
    monkeypatch.setenv("TYLOPY_DEBUG_WAITS", "1")
    key_debug, _ = cache.base_key(k, {}, k.options())
    assert key_release != key_debug


@pytest.mark.gpu
@pytest.mark.timeout(60)
def test_wrong_expect_tx_raises_instead_of_hanging(monkeypatch):
    import torch
    monkeypatch.setenv("TYLOPY_DEBUG_WAITS", "1")
    monkeypatch.setenv("TYLOPY_DEBUG_WAIT_SECONDS", "0.5")
    kernel = _wrong_expect_tx_kernel()
    out = torch.zeros(32, dtype=torch.int32, device="cuda")
    with pytest.raises(MbarrierTimeoutError) as e:
        kernel[(1,)](out)
    msg = str(e.value)
    assert "never_full" in msg and f":{_wait_line()}" in msg and "parity 0" in msg
    torch.cuda.synchronize()  # the context survived: no trap, the kernel ran to its end
