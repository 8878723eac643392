"""The emulator's asynchronous semantics: copies land after their issue, become visible only through
the wait that covers them, and a seeded scheduler; named barriers keyed by their run-time id.

Each broken kernel has a correct twin that runs clean (for several seeds), and each message
names the line (marked ``# <- name``) where the bug shows and, where it can, the line at fault.
"""
import re

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.emulate import ProtocolError
from tylopy.runtime.tensormap import TensorMapSpec
from emulate_dsl import (bulk_commit, bulk_wait, cp_async, cp_async_commit, cp_async_wait, fence_mbarrier_init,
                              fence_proxy_async, line_of, mbar_arrive, mbar_expect_tx, mbar_init, mbar_wait, tma_load,
                              tma_store)
import emulate_probes
from emulate_probes import _store_args, cp_pipeline, cp_zero_fill, tile_store  # noqa: F401

HERE = __file__
SEEDS = (None, 1, 2, 3)


def at(marker: str) -> str:
    """The file:line of a marked line here or in the shared probes."""
    for path in (HERE, emulate_probes.__file__):
        try:
            return re.escape(f"{path}:{line_of(path, marker)}")
        except LookupError:
            pass
    raise LookupError(f"no line marked {marker!r}")


def tile_map(t, rows, swizzle=128):
    cols = t.shape[1]
    return TensorMapSpec(t, (cols, t.shape[0]), (cols * t.element_size(),), (cols, rows), "bf16", swizzle)


# -- named barriers by run-time id ---------------------------------------------------------------------

@ty.kernel(threads=128)
def handoff_by_runtime_id(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    """Warps 2 and 3 fill a buffer and hand it to warps 0 and 1 on barriers 1 and 2 (run-time ids)."""
    buf = ty.shared(ty.f32, 64)
    warp, lane = ty.warp_idx(), ty.lane_id()
    bid = (warp & 1) + 1
    if warp >= 2:
        buf[(warp - 2) * 32 + lane] = x[(warp - 2) * 32 + lane]
        ty.barrier_arrive(bid, 64)
    else:
        ty.barrier_sync(bid, 64)
        out[warp * 32 + lane] = buf[warp * 32 + lane]


@pytest.mark.parametrize("seed", SEEDS)
def test_named_barriers_are_keyed_by_their_run_time_id(seed):
    x, out = torch.randn(64), torch.zeros(64)
    handoff_by_runtime_id.emulate(x, out, grid=1, seed=seed)
    assert torch.equal(out, x)


@ty.kernel(threads=64)
def wrong_turn(out: ty.ptr(ty.i32)):
    ty.barrier_sync(ty.warp_idx() + 1, 64)  # <- turn


def test_barriers_with_different_run_time_ids_do_not_meet():
    with pytest.raises(ProtocolError) as e:
        wrong_turn.emulate(torch.zeros(1, dtype=torch.int32), grid=1)
    msg = str(e.value)
    assert msg.startswith("deadlock") and "bar.sync 1 for 64 threads: 32 arrived (warps 0)" in msg
    assert re.search(f"warp 1 .* waits at {at('turn')}.*bar.sync 2 for 64 threads", msg)


# -- TMA loads: visible only through their own mbarrier -----------------------------------------------

@ty.kernel(threads=64)
def tma_flag(src: ty.tensormap, out: ty.ptr(ty.f32), WAIT: ty.constexpr):
    """Warp 0 issues a TMA load, then arrives on a second mbarrier; warp 1 reads the tile after waiting on
    the copy's own mbarrier (WAIT="own") or only on the second one (WAIT="other")."""
    tile = ty.dynamic_shared(ty.bf16, 8192, align=1024)
    bars = ty.shared(ty.u64, 3, align=8)  # full, flag, done
    tid, lane = ty.thread_idx(), ty.lane_id()
    if tid == 0:
        mbar_init(bars, 1)
        mbar_init(bars + 1, 1)
        mbar_init(bars + 2, 1)
        fence_mbarrier_init()
    ty.syncthreads()
    if ty.warp_idx() == 0:
        if lane == 0:
            mbar_expect_tx(bars, 8192)
            tma_load(tile, src, bars, 0, 0)  # <- tma
            mbar_arrive(bars + 1)
            mbar_wait(bars + 2, 0)
            mbar_wait(bars, 0)
    else:
        if WAIT == "own":
            mbar_wait(bars, 0)
        else:
            mbar_wait(bars + 1, 0)  # <- other_wait
        out[lane] = ty.cast(tile[lane], ty.f32)  # <- tile_read
        if lane == 0:
            mbar_arrive(bars + 2)


def _tile():
    torch.manual_seed(0)
    return torch.randn(64, 64).to(torch.bfloat16)


@pytest.mark.parametrize("seed", SEEDS)
def test_tma_load_read_after_its_own_mbarrier(seed):
    t, out = _tile(), torch.zeros(32)
    tma_flag.emulate(tile_map(t, 64), out, grid=1, WAIT="own", seed=seed)
    assert torch.equal(out, t[0, :32].float())


@pytest.mark.parametrize("seed", SEEDS)
def test_tma_load_is_not_ordered_by_another_barrier_of_the_producer(seed):
    t = _tile()
    with pytest.raises(ProtocolError) as e:
        tma_flag.emulate(tile_map(t, 64), torch.zeros(32), grid=1, WAIT="other", seed=seed)
    msg = str(e.value)
    assert re.search(f"shared-memory race at {at('tile_read')} .*: warp 1 .* reads dynamic_smem\\+0\\.\\.", msg), msg
    assert re.search(f"(TMA load at {at('tma')}|TMA copy completing on mbarrier smem0\\[0\\])", msg), msg
    assert re.search(f"Most likely at fault: warp 1 never waited on mbarrier smem0\\[0\\].*last mbarrier wait was "
                     f"on mbarrier smem0\\[1\\] \\(parity 0\\) at {at('other_wait')}", msg), msg


def test_tma_load_not_yet_landed_reads_stale_bytes_without_race_checks():
    t, out = _tile(), torch.zeros(32)
    tma_flag.emulate(tile_map(t, 64), out, grid=1, WAIT="other", check_races=False)
    assert torch.isnan(out).all()  # the poison the emulator fills shared memory with: the copy had not landed


# -- cp.async -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_cp_async_pipeline(seed):
    x, out = torch.randn(5 * 64), torch.zeros(5 * 64)
    cp_pipeline.emulate(x, out, 5, grid=1, MODE="wait", seed=seed)
    assert torch.equal(out, x.view(5, 64).flip(1).reshape(-1))


@pytest.mark.parametrize("mode", ["no_wait", "wait_too_few"])
def test_cp_async_read_before_its_wait(mode):
    with pytest.raises(ProtocolError) as e:
        cp_pipeline.emulate(torch.randn(3 * 64), torch.zeros(3 * 64), 3, grid=1, MODE=mode)
    msg = str(e.value)
    assert re.search(f"shared-memory race at {at('cp_read')} .*: warp \\d .* reads smem0\\+\\d+\\.\\.\\d+, which the "
                     "cp.async at .* \\(thread \\d+, warp \\d\\) may still be writing: no cp_async_wait of that thread "
                     "has covered its commit group", msg), msg


@pytest.mark.parametrize("seed", SEEDS)
def test_cp_async_read_by_another_warp_needs_a_barrier_after_the_wait(seed):
    with pytest.raises(ProtocolError) as e:
        cp_pipeline.emulate(torch.randn(3 * 64), torch.zeros(3 * 64), 3, grid=1, MODE="no_sync", seed=seed)
    # Depending on the schedule the other warp has not issued its copies yet, has them in flight, or has
    # waited for them without a barrier after the wait.
    assert re.search(f"(shared-memory race|read of uninitialized shared memory) at {at('cp_read')} .*: warp \\d .* "
                     "reads smem0\\+\\d+\\.\\.\\d+, which (warp \\d wrote at .*cp_async|the cp.async at|nothing wrote)",
                     str(e.value)), str(e.value)


def test_cp_async_missing_wait_reads_stale_bytes_without_race_checks():
    x, out = torch.randn(3 * 64), torch.zeros(3 * 64)
    cp_pipeline.emulate(x, out, 3, grid=1, MODE="no_wait", check_races=False)
    assert torch.isnan(out[:64]).all()  # the copies land at their wait, which never comes before the read


@pytest.mark.parametrize("n", [0, 5, 64, 126])
def test_cp_async_zero_fills_past_src_bytes(n):
    x = torch.arange(1, n + 1, dtype=torch.int32) if n else torch.zeros(1, dtype=torch.int32)  # reads past n fail
    out = torch.full((128,), -1, dtype=torch.int32)
    cp_zero_fill.emulate(x, out, n, grid=1)
    want = torch.zeros(128, dtype=torch.int32)
    want[:n] = torch.arange(1, n + 1, dtype=torch.int32)
    assert torch.equal(out, want)


# -- TMA stores -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_tma_store_writes_the_tile(seed):
    x, out, spec = _store_args()
    tile_store.emulate(spec, x.view(-1), grid=1, MODE="ok", REDUCE=None, seed=seed)
    assert torch.equal(out, x)


def test_tma_store_reduce_add():
    x, out, spec = _store_args()
    before = out.clone()
    tile_store.emulate(spec, x.view(-1), grid=1, MODE="ok", REDUCE="add")
    assert torch.equal(out, (before.double() + x.double()).float().to(torch.bfloat16))


def test_tma_stores_of_two_ctas_race_but_reductions_do_not():
    x, out, spec = _store_args()
    with pytest.raises(ProtocolError, match=f"global-memory write race at {at('store')} .*CTA \\(0, 0, 0\\) wrote them"):
        tile_store.emulate(spec, x.view(-1), grid=2, MODE="ok", REDUCE=None)
    before = out.clone()
    tile_store.emulate(spec, x.view(-1), grid=2, MODE="ok", REDUCE="add")
    once = (before.double() + x.double()).float().to(torch.bfloat16)
    assert torch.equal(out, (once.double() + x.double()).float().to(torch.bfloat16))


def test_tma_store_source_overwritten_before_its_read_wait():
    x, out, spec = _store_args()
    with pytest.raises(ProtocolError) as e:
        tile_store.emulate(spec, x.view(-1), grid=1, MODE="overwrite", REDUCE=None)
    assert re.search(f"shared-memory race at {at('overwrite')} .*: warp 0 .* overwrites dynamic_smem\\+0\\.\\.1, which the "
                     f"TMA store at {at('store')} .* may still be reading: no bulk_wait\\(n, read=True\\)", str(e.value))
    tile_store.emulate(spec, x.view(-1), grid=1, MODE="overwrite", REDUCE=None, check_races=False)
    assert out[0, 0] == 0 and torch.equal(out.view(-1)[1:], x.view(-1)[1:])  # the store read the overwritten tile


def test_tma_store_without_fence_and_exit_without_wait():
    x, out, spec = _store_args()
    with pytest.raises(ProtocolError, match=f"missing fence.proxy.async: TMA store at {at('store')}"):
        tile_store.emulate(spec, x.view(-1), grid=1, MODE="no_fence", REDUCE=None)
    with pytest.raises(ProtocolError, match=f"CTA \\(0, 0, 0\\) exits while the TMA store at {at('store')} .* may "
                                            "still read its shared memory: no bulk_wait"):
        tile_store.emulate(spec, x.view(-1), grid=1, MODE="no_wait", REDUCE=None)
    assert torch.equal(out, x)  # the store still landed


# -- uninitialized shared memory, global write races, views --------------------------------------------

@ty.kernel(threads=32)
def reads_past_written(out: ty.ptr(ty.f32), OFFSET: ty.constexpr):
    buf = ty.shared(ty.f32, 64)
    lane = ty.lane_id()
    buf[lane] = ty.cast(lane, ty.f32)
    out[lane] = buf[lane + OFFSET]  # <- uninit


def test_reading_shared_memory_nothing_wrote():
    with pytest.raises(ProtocolError, match=f"read of uninitialized shared memory at {at('uninit')} .*: warp 0 .* reads "
                                            "smem0\\+128\\.\\.255, which nothing wrote before"):
        reads_past_written.emulate(torch.zeros(32), grid=1, OFFSET=32)
    out = torch.zeros(32)
    reads_past_written.emulate(out, grid=1, OFFSET=32, check_races=False)
    assert torch.isnan(out).all()  # the poison fill
    reads_past_written.emulate(out, grid=1, OFFSET=0)
    assert torch.equal(out, torch.arange(32.0))


@ty.kernel(threads=64)
def shared_output(out: ty.ptr(ty.f32), MODE: ty.constexpr):
    lane, warp = ty.lane_id(), ty.warp_idx()
    if MODE == "ctas":
        out[ty.thread_idx()] = ty.cast(ty.block_idx(), ty.f32)  # <- every_cta
    elif MODE == "warps":
        out[lane] = ty.cast(warp, ty.f32)  # <- both_warps
    else:
        if warp == 0:
            out[lane] = 1.0
        ty.syncthreads()
        if warp == 1:
            out[lane] = 2.0


def test_global_write_races():
    with pytest.raises(ProtocolError, match=f"global-memory write race at {at('every_cta')} .*: warp 0 of CTA \\(1, 0, 0\\) "
                                            "writes out\\+0 bytes .*; CTA \\(0, 0, 0\\) wrote them at .*CTAs cannot"):
        shared_output.emulate(torch.zeros(64), grid=2, MODE="ctas")
    with pytest.raises(ProtocolError, match=f"global-memory write race at {at('both_warps')} .*: warp 1 of CTA "
                                            "\\(0, 0, 0\\) writes out\\+0 bytes .*warp 0 of the same CTA"):
        shared_output.emulate(torch.zeros(64), grid=1, MODE="warps")
    out = torch.zeros(64)
    shared_output.emulate(out, grid=1, MODE="ordered")
    assert (out[:32] == 2).all()
    shared_output.emulate(out, grid=1, MODE="warps", check_races=False)


@ty.kernel(threads=32)
def strided_rows(out: ty.ptr(ty.f32), cols: ty.i32, stride: ty.i32):
    lane = ty.lane_id()
    for r in range(2):
        for c in range(lane, cols, 32):
            out[r * stride + c] = 1.0  # <- row_write


def test_accesses_outside_a_non_contiguous_view():
    base = torch.zeros(2, 64)
    strided_rows.emulate(base[:, :32], 32, 64, grid=1)
    assert (base[:, :32] == 1).all() and (base[:, 32:] == 0).all()
    with pytest.raises(Exception, match=f"global write out of bounds at {at('row_write')} .*: lane 0 .* writes 4 bytes at "
                                        "out\\+128 bytes, inside the span of 'out' .* but outside its elements"):
        strided_rows.emulate(base[:, :32], 33, 64, grid=1)


# -- messages use the kernel's labels --------------------------------------------------------------------

@ty.kernel(threads=32)
def labelled_ring():
    bars = ty.shared(ty.u64, 2, align=8)
    if ty.thread_idx() == 0:
        for s in range(2):
            mbar_init(bars + s, 1)
    ty.syncthreads()
    mbar_wait(bars + 1, 0, label="k_full")  # <- labelled_wait


def test_mbarriers_are_named_by_the_kernels_labels():
    with pytest.raises(ProtocolError) as e:
        labelled_ring.emulate(grid=1)
    msg = str(e.value)
    assert re.search(f"waits at {at('labelled_wait')} .*: mbarrier k_full\\[1\\] parity 0: phase 0 still needs 1 of 1",
                     msg), msg
    assert "smem0" not in msg


def test_seeded_schedules_are_reproducible():
    x = torch.randn(4 * 64)
    outs = []
    for seed in (5, 5, 6):
        out = torch.zeros(4 * 64)
        cp_pipeline.emulate(x, out, 4, grid=1, MODE="wait", seed=seed)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert np.array_equal(outs[0].numpy(), x.view(4, 64).flip(1).reshape(-1).numpy())


# -- the operation most likely at fault -------------------------------------------------------------------

@ty.kernel(threads=128)
def turn_handoff(out: ty.ptr(ty.i32), NEXT: ty.constexpr):
    """Warps 0-1 and 2-3 alternate on barriers 1 and 2; a pair passes the turn with bar.arrive on NEXT."""
    pair = ty.warp_idx() // 2
    if pair == 0:
        ty.barrier_arrive(NEXT, 128)  # <- handoff
    else:
        ty.barrier_sync(pair + 1, 128)  # <- turn_wait
    out[ty.thread_idx()] = 1


def test_deadlock_names_a_hand_off_to_the_wrong_barrier():
    turn_handoff.emulate(torch.zeros(128, dtype=torch.int32), grid=1, NEXT=2)
    with pytest.raises(ProtocolError) as e:
        turn_handoff.emulate(torch.zeros(128, dtype=torch.int32), grid=1, NEXT=1)
    msg = str(e.value)
    assert re.search(f"Most likely at fault: bar.sync 2 waits for 64 more threads, but no warp ever arrives on named "
                     f"barrier 2 with bar.arrive; bar.arrive went to barrier 1 \\(warps 0, 1 at .*:"
                     f"{line_of(HERE, 'handoff')}\\)", msg), msg
    assert re.search(f"warps 2, 3 \\(warpgroup 0\\) of CTA \\(0, 0, 0\\) wait at {at('turn_wait')}", msg), msg


@ty.kernel(threads=64)
def release_ring(COUNT: ty.constexpr, SKIP_LAST: ty.constexpr):
    """Warp 1 frees a buffer (``empty``) four times, warp 0 hands it back (``full``) after each."""
    bars = ty.shared(ty.u64, 2, align=8)
    if ty.thread_idx() == 0:
        ty.hopper.mbarrier_init(bars, COUNT, label="empty")  # <- counted
        ty.hopper.mbarrier_init(bars + 1, 1, label="full")
    ty.syncthreads()
    first = ty.lane_id() == 0
    if ty.warp_idx() == 0:
        for j in range(4):
            ty.hopper.mbarrier_wait(bars, j & 1, "empty")  # <- release_wait
            if first:
                mbar_arrive(bars + 1)
    else:
        if first:
            mbar_arrive(bars)
        for j in range(3 - SKIP_LAST):
            ty.hopper.mbarrier_wait(bars + 1, j & 1, "full")
            if first:
                mbar_arrive(bars)  # <- release


def test_phase_that_cannot_complete_names_the_missing_arrival_or_the_count():
    release_ring.emulate(grid=1, COUNT=1, SKIP_LAST=0)
    with pytest.raises(ProtocolError) as e:
        release_ring.emulate(grid=1, COUNT=1, SKIP_LAST=1)
    assert re.search(f"mbarrier empty still needs 1 arrival\\(s\\) in phase 3; in phase 2 they came from warps 1 at "
                     f".*:{line_of(HERE, 'release')}, but warp 1 exited without arriving again", str(e.value))
    with pytest.raises(ProtocolError) as e:
        release_ring.emulate(grid=1, COUNT=2, SKIP_LAST=0)
    assert re.search(f"deadlock .*Most likely at fault: mbarrier empty got 1 arrival\\(s\\) in phase 0 \\(warps 1 at "
                     f".*\\) and still needs 1: the count of its mbarrier_init at {at('counted')} .* \\(2\\) is larger",
                     str(e.value), re.S), str(e.value)


@ty.kernel(threads=32)
def ahead_of_the_ring(src: ty.tensormap):
    """A producer that fills the same stage twice without waiting for it to be consumed."""
    tile = ty.dynamic_shared(ty.bf16, 8192, align=1024)
    bars = ty.shared(ty.u64, 1, align=8)
    if ty.lane_id() == 0:
        mbar_init(bars, 1)
        fence_mbarrier_init()
        for j in range(2):
            mbar_expect_tx(bars, 8192)  # <- refill
            tma_load(tile, src, bars, 0, 64 * j)
    mbar_wait(bars, 0)
    mbar_wait(bars, 1)


def test_too_many_arrivals_points_at_the_missing_empty_wait():
    t = torch.randn(128, 64).to(torch.bfloat16)
    with pytest.raises(ProtocolError) as e:
        ahead_of_the_ring.emulate(tile_map(t, 64), grid=1)
    assert re.search(f"too many arrivals on mbarrier smem0\\[0\\] at {at('refill')} .*Most likely at fault: A producer "
                     "refilling a ring is a whole lap ahead: its wait for the stage to be free", str(e.value))
