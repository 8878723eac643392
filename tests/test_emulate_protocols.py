"""Each protocol check of the emulator, triggered by a small deliberately broken kernel.

Every message must name the kernel source line (``FILE:LINE`` and its text); the lines are
marked ``# <- name`` and found with ``line_of``. Where a check could fire wrongly, a correct
twin of the kernel runs clean.
"""
import re

import pytest
import torch

import tylopy as ty
from tylopy.emulate import ProtocolError, UnsupportedOpError
from tylopy.runtime.tensormap import TensorMapSpec
from emulate_dsl import (desc, fence_mbarrier_init, fence_proxy_async, line_of, mbar_arrive, mbar_expect_tx,
                              mbar_init, mbar_wait, setmaxnreg, tma_load, wgmma, wgmma_commit, wgmma_fence,
                              wgmma_wait)

HERE = __file__


def at(marker: str) -> str:
    """The ``FILE:LINE`` a message must contain for the line marked ``marker``."""
    return re.escape(f"{HERE}:{line_of(HERE, marker)}")


def tile_map(rows=64, cols=64):
    t = torch.randn(rows, cols).to(torch.bfloat16)
    return TensorMapSpec(t, (cols, rows), (cols * 2,), (cols, 64), "bf16", 128)


@ty.func
def init_full_and_empty(bars):
    """One thread initializes a full and an empty mbarrier (one arrival each); the block syncs."""
    if ty.thread_idx() == 0:
        mbar_init(bars, 1)
        mbar_init(bars + 1, 1)
        fence_mbarrier_init()
    ty.syncthreads()


# -- deadlock and mbarrier phases -------------------------------------------------------------------------

@ty.kernel(threads=64)
def two_barriers():
    if ty.warp_idx() == 0:
        ty.barrier_sync(1, 64)  # <- bar1
    else:
        ty.barrier_sync(2, 64)  # <- bar2


def test_deadlock_names_each_waiting_warp_and_barrier():
    with pytest.raises(ProtocolError) as e:
        two_barriers.emulate(grid=1)
    msg = str(e.value)
    assert msg.startswith("deadlock in CTA (0, 0, 0): every live warp is waiting")
    assert re.search(f"warp 0 .* waits at {at('bar1')} `ty.barrier_sync\\(1, 64\\) .*`: bar.sync 1 for 64 threads: "
                     "32 arrived \\(warps 0\\)", msg)
    assert re.search(f"warp 1 .* waits at {at('bar2')}.*bar.sync 2 for 64 threads", msg)


@ty.kernel(threads=64)
def short_arrivals():
    bar = ty.shared(ty.u64, 2, align=8)
    tid = ty.thread_idx()
    if tid == 0:
        mbar_init(bar + 1, 2)
    ty.syncthreads()
    if tid == 32:
        mbar_arrive(bar + 1)  # one arrival of the two the phase needs
    if tid < 32:
        mbar_wait(bar + 1, 0)  # <- never_completes


def test_phase_that_can_never_complete():
    with pytest.raises(ProtocolError) as e:
        short_arrivals.emulate(grid=1)
    msg = str(e.value)
    assert msg.startswith("mbarrier phase can never complete")
    assert re.search(f"waits at {at('never_completes')} .* on mbarrier smem0\\[1\\] \\(parity 0, phase 0\\), which "
                     "still needs 1 arrival\\(s\\)", msg)
    assert "warps 1 exited" in msg


@ty.kernel(threads=32)
def tma_expect(src: ty.tensormap, EXPECT: ty.constexpr):
    tile = ty.dynamic_shared(ty.bf16, 8192, align=1024)
    bar = ty.shared(ty.u64, 1, align=8)
    if ty.lane_id() == 0:
        mbar_init(bar, 1)
        fence_mbarrier_init()
        mbar_expect_tx(bar, EXPECT)  # <- expect_tx
        tma_load(tile, src, bar, 0, 0)  # <- tma
    mbar_wait(bar, 0)  # <- tma_wait


def test_expect_tx_more_than_delivered():
    with pytest.raises(ProtocolError) as e:
        tma_expect.emulate(tile_map(), grid=1, EXPECT=16384)
    msg = str(e.value)
    assert msg.startswith("expect_tx mismatch on mbarrier smem0[0] (phase 0): expect_tx announced 8192 more bytes "
                          "than the copies delivered")
    assert re.search(f"expect_tx\\(16384\\) at {at('expect_tx')}", msg)
    assert re.search(f"TMA of 8192 bytes at {at('tma')}", msg)
    assert re.search(f"warp 0 .* waits at {at('tma_wait')}", msg)


def test_expect_tx_less_than_delivered():
    with pytest.raises(ProtocolError, match=f"expect_tx mismatch on mbarrier smem0\\[0\\] \\(phase 0\\) at {at('tma')}"
                                            ".*delivered 4096 more bytes than expect_tx announced"):
        tma_expect.emulate(tile_map(), grid=1, EXPECT=4096)


def test_expect_tx_exact_passes():
    tma_expect.emulate(tile_map(), grid=1, EXPECT=8192)


@ty.kernel(threads=64)
def early_reader(src: ty.tensormap, out: ty.ptr(ty.f32), SKIP_WAIT: ty.constexpr):
    """Two TMA loads into one stage; warp 1 reads each after warp 0 has issued it (a named barrier,
    which orders nothing about the copy's bytes). With SKIP_WAIT the second read does not wait on
    its phase of the mbarrier: a race whether or not the copy has landed by then."""
    tile = ty.dynamic_shared(ty.f32, 8192, align=1024)
    bars = ty.shared(ty.u64, 2, align=8)  # full, empty
    init_full_and_empty(bars)
    lane = ty.lane_id()
    if ty.warp_idx() == 0:
        for i in range(2):
            if lane == 0:
                mbar_wait(bars + 1, (i & 1) ^ 1)
                mbar_expect_tx(bars, 8192)
                tma_load(tile, src, bars, 0, 64 * i)
            ty.barrier_arrive(1, 64)  # load i is issued
    else:
        for i in range(2):
            ty.barrier_sync(1, 64)
            if not SKIP_WAIT or i == 0:
                mbar_wait(bars, i & 1)
            out[64 * i + lane] = tile[lane]  # <- early_read
            if lane == 0:
                mbar_arrive(bars + 1)


def f32_rows(rows=128, cols=32):
    t = torch.randn(rows, cols)
    return t, TensorMapSpec(t, (cols, rows), (cols * 4,), (cols, 64), "f32", 128)


@pytest.mark.parametrize("seed", [None, 1, 2, 3, 4, 5, 6])
def test_read_of_a_later_phase_without_its_wait_is_a_race(seed):
    """Whether the second copy has landed when the early read comes (the schedule decides), the
    read is reported: before landing as a read of bytes still being written, after it as bytes of
    a phase the reader never waited for (the copy's bytes carry their phase's epoch)."""
    _, spec = f32_rows()
    with pytest.raises(ProtocolError, match=f"{at('early_read')}"):
        early_reader.emulate(spec, torch.zeros(128), grid=1, SKIP_WAIT=True, seed=seed)


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_reads_after_their_own_phase_run_clean(seed):
    t, spec = f32_rows()
    out = torch.zeros(128)
    early_reader.emulate(spec, out, grid=1, SKIP_WAIT=False, seed=seed)
    assert torch.equal(out.view(2, 64)[:, :32], t.view(2, 64, 32)[:, 0, :])


@ty.kernel(threads=256)
def lagging_warp(LAG: ty.constexpr):
    """Thread 0 fills a one-slot buffer (``full``) four times, waiting for ``empty`` between; the
    four warps of warpgroup 1 take each fill, and thread 128 alone gives the slot back. With LAG,
    warps 5-7 start only after the second fill (warp 1 lets them go), so warp 4 has already given
    the first fill back: their first wait finds the parity come round."""
    bars = ty.shared(ty.u64, 2, align=8)  # full, empty
    init_full_and_empty(bars)
    tid = ty.thread_idx()
    if tid == 0:
        for k in range(4):
            mbar_wait(bars + 1, (k & 1) ^ 1)
            mbar_arrive(bars)
    if LAG:
        if ty.warp_idx() == 1:
            mbar_wait(bars, 1)
            ty.barrier_arrive(2, 128)
        if ty.warp_idx() >= 5:
            ty.barrier_sync(2, 128)
    if tid >= 128:
        for k in range(4):
            mbar_wait(bars, k & 1)  # <- lap_wait
            if not LAG:
                ty.barrier_sync(1, 128)  # every warp of the warpgroup passed the wait
            if tid == 128:
                mbar_arrive(bars + 1)


def test_warp_waiting_a_lap_late_is_named():
    with pytest.raises(ProtocolError) as e:
        lagging_warp.emulate(grid=1, LAG=True)
    msg = str(e.value)
    assert re.match("warps 4 and [567] of warpgroup 1 in CTA \\(0, 0, 0\\) disagree on the phase of mbarrier "
                    f"smem0\\[0\\] that their wait #1 at {at('lap_wait')}", msg), msg
    assert "passed it on completion 1, while warp" in msg and "waits for completion 3" in msg
    assert "sync the warpgroup" in msg


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_warpgroup_synced_after_its_wait_runs_clean(seed):
    lagging_warp.emulate(grid=1, LAG=False, seed=seed)


# -- mbarrier initialization ---------------------------------------------------------------------------

@ty.kernel(threads=64)
def init_not_visible(SYNC: ty.constexpr):
    bar = ty.shared(ty.u64, 1, align=8)
    tid = ty.thread_idx()
    if tid == 0:
        mbar_init(bar, 1)  # <- init
    if SYNC:
        ty.syncthreads()
    if tid == 32:
        mbar_arrive(bar)  # <- early_arrive


@ty.kernel(threads=32)
def never_initialized():
    bar = ty.shared(ty.u64, 1, align=8)
    if ty.lane_id() == 0:
        mbar_arrive(bar)  # <- uninit


@ty.kernel(threads=32)
def tma_without_init_fence(src: ty.tensormap):
    tile = ty.dynamic_shared(ty.bf16, 8192, align=1024)
    bar = ty.shared(ty.u64, 1, align=8)
    if ty.lane_id() == 0:
        mbar_init(bar, 1)
        mbar_expect_tx(bar, 8192)
        tma_load(tile, src, bar, 0, 0)  # <- unfenced_tma
    mbar_wait(bar, 0)


def test_mbarrier_used_before_its_init_is_visible():
    with pytest.raises(ProtocolError) as e:
        init_not_visible.emulate(grid=1, SYNC=False)
    msg = str(e.value)
    assert re.search(f"mbarrier smem0\\[0\\] used at {at('early_arrive')} .* by warp 1 .* before its initialization "
                     f"is visible: warp 0 initialized it at {at('init')}", msg)
    init_not_visible.emulate(grid=1, SYNC=True)


def test_mbarrier_never_initialized():
    with pytest.raises(ProtocolError, match=f"used at {at('uninit')} .* before any mbarrier_init"):
        never_initialized.emulate(grid=1)


def test_tma_needs_the_init_fence():
    with pytest.raises(ProtocolError, match=f"used by TMA at {at('unfenced_tma')}.*never made visible to the async "
                                            "proxy"):
        tma_without_init_fence.emulate(tile_map(), grid=1)


# -- wgmma --------------------------------------------------------------------------------------------------

@ty.kernel(threads=128)
def wgmma_from_smem(d: ty.ptr(ty.f32), MODE: ty.constexpr):
    """A and B written by ordinary stores, then read by an SS wgmma; MODE picks the mistake."""
    smem = ty.dynamic_shared(ty.bf16, 16384, align=1024)
    tid = ty.thread_idx()
    for k in ty.static_range(64):
        smem[tid * 64 + k] = ty.cast(1.0, ty.bf16)  # <- generic_store
    if MODE != "no_proxy_fence":
        fence_proxy_async()
    ty.syncthreads()
    if MODE != "no_wgmma_fence":
        wgmma_fence()
    acc = wgmma(64, None, desc(ty.address(smem)), desc(ty.address(smem) + 8192))  # <- wgmma
    wgmma_commit()
    if MODE == "read_pending":
        d[tid] = acc[0]  # <- pending_read
    if MODE == "wait_too_loose":
        acc = wgmma_wait(1, acc)
        d[tid] = acc[1]  # <- loose_read
    if MODE == "mismatch":
        if ty.warp_idx() == 3:
            acc = wgmma_wait(1, acc)  # <- odd_wait
        else:
            acc = wgmma_wait(0, acc)
    acc = wgmma_wait(0, acc)
    d[tid] = acc[0]


def test_wgmma_reads_generic_stores_without_proxy_fence():
    with pytest.raises(ProtocolError) as e:
        wgmma_from_smem.emulate(torch.zeros(128), grid=1, MODE="no_proxy_fence")
    msg = str(e.value)
    assert re.search(f"missing fence.proxy.async: wgmma \\(B\\) at {at('wgmma')}", msg)
    assert re.search(f"with an ordinary store at {at('generic_store')}", msg)


def test_wgmma_correct_twin_runs_clean():
    d = torch.zeros(128)
    wgmma_from_smem.emulate(d, grid=1, MODE="ok")
    assert (d == 16.0).all()  # 16 products of 1 * 1


def test_accumulator_read_before_wait_group():
    with pytest.raises(ProtocolError, match=f"wgmma accumulator read before its wgmma_wait: store at "
                                            f"{at('pending_read')}.*result of the wgmma at {at('wgmma')}"):
        wgmma_from_smem.emulate(torch.zeros(128), grid=1, MODE="read_pending")


def test_wait_group_that_does_not_cover_the_group():
    with pytest.raises(ProtocolError, match=f"read before its wgmma_wait: store at {at('loose_read')}.*commit group 0"):
        wgmma_from_smem.emulate(torch.zeros(128), grid=1, MODE="wait_too_loose")


def test_wgmma_without_fence():
    with pytest.raises(ProtocolError, match=f"wgmma at {at('wgmma')} .* without wgmma_fence"):
        wgmma_from_smem.emulate(torch.zeros(128), grid=1, MODE="no_wgmma_fence")


def test_warpgroup_warps_disagree_on_a_collective():
    with pytest.raises(ProtocolError) as e:
        wgmma_from_smem.emulate(torch.zeros(128), grid=1, MODE="mismatch")
    msg = str(e.value)
    assert msg.startswith("warps of warpgroup 0 disagree at their warpgroup-collective instruction #4")
    assert re.search(f"wgmma_wait \\(1,\\) at {at('odd_wait')}", msg) and "wgmma_wait (0,)" in msg


# -- shared-memory races --------------------------------------------------------------------------------

@ty.kernel(threads=64)
def racy_writes(out: ty.ptr(ty.f32), ORDER: ty.constexpr):
    buf = ty.shared(ty.f32, 32)
    bar = ty.shared(ty.u64, 1, align=8)
    tid = ty.thread_idx()
    lane = tid & 31
    if tid == 0:
        mbar_init(bar, 1)
    ty.syncthreads()
    if tid < 32:
        buf[lane] = 1.0  # <- first_write
        if ORDER == "mbarrier":
            mbar_arrive(bar)
    if ORDER == "syncthreads":
        ty.syncthreads()
    if tid >= 32:
        if ORDER == "mbarrier":
            mbar_wait(bar, 0)
        buf[lane] = 2.0  # <- second_write
    ty.syncthreads()
    out[tid] = buf[lane]


def test_two_warps_writing_the_same_bytes_without_ordering():
    with pytest.raises(ProtocolError) as e:
        racy_writes.emulate(torch.zeros(64), grid=1, ORDER="none")
    msg = str(e.value)
    first, second = at("first_write"), at("second_write")  # either warp may be the second writer
    assert re.search(f"shared-memory race at ({first}|{second}) .*: warp [01] .* writes smem0\\+0[.\\d]*, which warp [01] "
                     f"wrote at ({first}|{second})", msg)
    assert line_of(HERE, "first_write") != line_of(HERE, "second_write")
    assert re.search(first, msg) and re.search(second, msg)


@pytest.mark.parametrize("order", ["syncthreads", "mbarrier"])
def test_ordered_writes_are_not_a_race(order):
    out = torch.zeros(64)
    racy_writes.emulate(out, grid=1, ORDER=order)
    assert (out == 2.0).all()


# -- setmaxnreg, inline PTX ------------------------------------------------------------------------------

@ty.kernel(threads=384, min_blocks_per_sm=1)
def register_split(PRODUCER: ty.constexpr):
    if ty.warpgroup_idx() == 0:
        setmaxnreg(PRODUCER, PRODUCER > 168)
    else:
        setmaxnreg(240, True)  # <- inc


def test_setmaxnreg_budget():
    register_split.emulate(grid=1, PRODUCER=24)  # 128 * 24 + 256 * 240 = 384 * 168: the whole pool
    with pytest.raises(ProtocolError) as e:
        register_split.emulate(grid=1, PRODUCER=40)  # 40/240 leaves the consumers 2048 registers short
    msg = str(e.value)
    assert msg.startswith("deadlock")
    assert re.search(f"waits at {at('inc')} `setmaxnreg\\(240, True\\) .*`: setmaxnreg.inc 240: needs 2304 more "
                     "registers for the warp, but the CTA's pool has", msg)


@ty.kernel(threads=32)
def uses_inline_ptx(out: ty.ptr(ty.u32)):
    v = ty.inline_ptx("mov.u32 $0, %laneid;", constraints="=r", results=[ty.u32])  # <- asm
    out[ty.lane_id()] = v


def test_inline_ptx_is_refused_with_its_line():
    with pytest.raises(UnsupportedOpError, match=f"cannot emulate inline PTX at {at('asm')}"):
        uses_inline_ptx.emulate(torch.zeros(32, dtype=torch.int32).view(torch.uint32)
                                if hasattr(torch, "uint32") else torch.zeros(32, dtype=torch.int32), grid=1)


# -- write-after-read and read-after-write races ----------------------------------------------------------

@ty.kernel(threads=64)
def reuse_buffer(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), SYNC: ty.constexpr):
    buf = ty.shared(ty.f32, 64)
    t = ty.thread_idx()
    buf[t] = x[t]
    ty.syncthreads()
    out[t] = buf[63 - t]  # <- war_read
    if SYNC:
        ty.syncthreads()
    buf[t] = x[t] * 2.0  # <- war_write
    ty.syncthreads()
    out[64 + t] = buf[63 - t]


def test_buffer_overwritten_before_the_other_warp_read_it():
    with pytest.raises(ProtocolError) as e:
        reuse_buffer.emulate(torch.randn(64), torch.zeros(128), grid=1, SYNC=False)
    msg = str(e.value)
    # the emulator runs warp 1 on while warp 0 waits: warp 0's read of warp 1's new values is caught first
    assert re.search(f"shared-memory race at {at('war_read')}.* reads smem0\\+[\\d.]+, which warp 1 wrote at "
                     f"{at('war_write')}", msg) or \
        re.search(f"shared-memory race at {at('war_write')}.* overwrites smem0\\+[\\d.]+, which warp \\d read at "
                  f"{at('war_read')}", msg)
    x, out = torch.randn(64), torch.zeros(128)
    reuse_buffer.emulate(x, out, grid=1, SYNC=True)
    assert torch.equal(out, torch.cat([x.flip(0), 2 * x.flip(0)]))


@ty.kernel(threads=160)
def stage_ring(a_map: ty.tensormap, d: ty.ptr(ty.f32), RELEASE: ty.constexpr):
    """Warps 0-3 consume two tiles through one stage that warp 4 refills; RELEASE says when they free it."""
    smem = ty.dynamic_shared(ty.bf16, 8192, align=1024)
    bars = ty.shared(ty.u64, 2, align=8)  # full, empty
    init_full_and_empty(bars)
    tid = ty.thread_idx()
    if ty.warp_idx() == 4:
        if ty.lane_id() == 0:
            for j in range(2):
                mbar_wait(bars + 1, (j & 1) ^ 1)
                mbar_expect_tx(bars, 8192)
                tma_load(smem, a_map, bars, 0, 64 * j)  # <- refill
    else:
        for j in range(2):
            mbar_wait(bars, j & 1)
            addr = ty.address(smem)
            wgmma_fence()
            acc = wgmma(64, None, desc(addr), desc(addr))  # <- ring_wgmma
            wgmma_commit()
            if RELEASE == "early":
                if tid == 0:
                    mbar_arrive(bars + 1)  # released while the wgmma may still read the stage
            acc = wgmma_wait(0, acc)
            if RELEASE == "after_wait":
                if tid == 0:
                    mbar_arrive(bars + 1)
            d[j * 128 + tid] = acc[0]


def test_stage_released_before_the_wgmma_finished():
    a_map = tile_map(rows=128)
    with pytest.raises(ProtocolError) as e:
        stage_ring.emulate(a_map, torch.zeros(256), grid=1, RELEASE="early")
    msg = str(e.value)
    assert re.search(f"shared-memory race at {at('refill')} .*overwrites dynamic_smem\\+[\\d.]+, which the wgmma at "
                     f"{at('ring_wgmma')} .*of warpgroup 0 reads", msg)
    stage_ring.emulate(a_map, torch.zeros(256), grid=1, RELEASE="after_wait")


@ty.kernel(threads=128)
def partial_wgmma(d: ty.ptr(ty.f32)):
    smem = ty.dynamic_shared(ty.bf16, 16384, align=1024)
    tid = ty.thread_idx()
    if ty.warp_idx() != 3:
        wgmma_fence()
        acc = wgmma(64, None, desc(ty.address(smem)), desc(ty.address(smem) + 8192))  # <- partial
        wgmma_commit()
        acc = wgmma_wait(0, acc)
        d[tid] = acc[0]


def test_wgmma_waits_for_the_whole_warpgroup():
    with pytest.raises(ProtocolError) as e:
        partial_wgmma.emulate(torch.zeros(128), grid=1)
    msg = str(e.value)
    assert msg.startswith("deadlock")
    assert re.search(f"warps 0, 1, 2 .* wait at {at('partial')} .*: wgmma \\(warpgroup-collective\\): warps 3 of "
                     "warpgroup 0 have not issued it", msg)
    assert "exited warps: 3" in msg
