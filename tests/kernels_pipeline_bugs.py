"""A two-stage TMA ring (one producer warp, one consumer warp) with a planted protocol bug for the
emulator's deadlock report: with ``SKIP >= 0`` the consumer does not release its stage on
iteration ``SKIP`` (its ``mbarrier_arrive`` on the empty barrier is skipped). ``PRODUCER`` is
the producer's warp (0 or 1; the other one consumes)."""
import tylopy as ty
from tylopy import hopper

STAGES = 2
ROWS, COLS = 8, 32   # one box: 8 rows of 32 f32 (1 KB)


@ty.kernel(threads=64, arch="sm_90a")
def ring_sum(src: ty.tensormap, out: ty.ptr(ty.f32), tiles: ty.i32, SKIP: ty.constexpr, PRODUCER: ty.constexpr = 0):
    buf = ty.shared(ty.f32, STAGES * ROWS * COLS, align=128)
    full = ty.shared(ty.u64, STAGES, align=8)
    empty = ty.shared(ty.u64, STAGES, align=8)
    tid = ty.thread_idx()
    if tid == 0:
        for s in ty.static_range(STAGES):
            hopper.mbarrier_init(full + s, 1, label="full")
            hopper.mbarrier_init(empty + s, 1, label="empty")
        hopper.fence_mbarrier_init()
        hopper.fence_proxy_async()
    ty.syncthreads()
    if ty.warp_idx() == PRODUCER:
        if ty.lane_id() == 0:
            for i in ty.range(tiles):
                s = i % STAGES
                phase = (i // STAGES) & 1
                hopper.mbarrier_wait(empty + s, phase ^ 1, label="stage empty")
                hopper.mbarrier_arrive_expect_tx(full + s, ROWS * COLS * 4)
                hopper.tma_load(buf + s * (ROWS * COLS), src, full + s, 0, i * ROWS)
    else:
        lane = ty.lane_id()
        acc = ty.cast(0.0, ty.f32)
        for i in ty.range(tiles):
            s = i % STAGES
            hopper.mbarrier_wait(full + s, (i // STAGES) & 1, label="stage full")
            for r in ty.static_range(ROWS):
                acc = acc + buf[s * (ROWS * COLS) + r * COLS + lane]
            if lane == 0:
                if i != SKIP:
                    hopper.mbarrier_arrive(empty + s)   # <- release
        out[lane] = acc
