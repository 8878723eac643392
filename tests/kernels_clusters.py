"""Kernels for the thread-block cluster tests (tests/test_clusters.py), with planted protocol bugs."""
import tylopy as ty
from tylopy import hopper


@ty.kernel(threads=64, arch="sm_90a", cluster=(2, 1, 1))
def swap_halves(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    """Each CTA of a pair reads its partner's shared tile, reversed, through distributed shared memory."""
    buf = ty.shared(ty.f32, 64)
    t = ty.thread_idx()
    b = ty.block_idx()
    buf[t] = x[b * 64 + t]
    ty.cluster_sync()                                   # the partner's tile is written
    other = ty.cluster_map(buf, ty.cluster_ctarank() ^ 1)
    v = other[63 - t]
    ty.cluster_sync()                                   # <- keep alive: nobody exits while its tile is read
    out[b * 64 + t] = v


@ty.kernel(threads=32, arch="sm_90a", cluster=(2, 2, 1))
def where_am_i(out: ty.ptr(ty.i32)):
    """Per CTA: rank, size, position in the cluster, the cluster's position and the cluster grid."""
    b = ty.block_idx(1) * ty.grid_dim(0) + ty.block_idx(0)
    if ty.thread_idx() == 0:
        vals = (ty.cluster_ctarank(), ty.cluster_nctarank(), ty.cluster_block_idx(0), ty.cluster_block_idx(1),
                ty.cluster_dim(0), ty.cluster_dim(1), ty.cluster_idx(0), ty.cluster_idx(1),
                ty.cluster_grid_dim(0), ty.cluster_grid_dim(1))
        for i, v in enumerate(vals):
            out[b * 10 + i] = v


@ty.kernel(threads=64, arch="sm_90a", cluster=(4, 1, 1))
def cluster_sum(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    """Each CTA sums its 64 values into shared memory; rank 0 adds the four partials over DSMEM."""
    part = ty.shared(ty.f32, 1)
    s = ty.block_reduce(x[ty.block_idx() * 64 + ty.thread_idx()])
    if ty.thread_idx() == 0:
        part[0] = s
    ty.cluster_sync()
    if ty.cluster_ctarank() == 0:
        if ty.thread_idx() == 0:
            total = ty.cast(0.0, ty.f32)
            for r in ty.static_range(4):
                total = total + ty.cluster_map(part, r)[0]
            out[ty.cluster_idx()] = total
    ty.cluster_sync()


@ty.kernel(threads=64, arch="sm_90a", cluster=(2, 1, 1))
def exits_too_early(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), LATE: ty.constexpr):
    """Bug: without the second cluster_sync, rank 1 may exit while rank 0 still reads its tile."""
    buf = ty.shared(ty.f32, 64)
    t = ty.thread_idx()
    buf[t] = x[ty.block_idx() * 64 + t]
    ty.cluster_sync()
    if ty.cluster_ctarank() == 0:
        for i in ty.range(LATE):   # rank 0 is slow: its partner is gone by the time it reads
            ty.syncthreads()
        out[t] = ty.cluster_map(buf, 1)[t]


@ty.kernel(threads=64, arch="sm_90a", cluster=(2, 1, 1))
def skips_the_barrier(out: ty.ptr(ty.i32)):
    """Bug: rank 1 never arrives on the cluster barrier that rank 0 waits on."""
    if ty.cluster_ctarank() == 0:
        ty.cluster_sync()   # <- lonely
    if ty.thread_idx() == 0:
        out[ty.block_idx()] = 1


@ty.kernel(threads=32, arch="sm_90a", cluster=(2, 1, 1))
def waits_without_arriving(out: ty.ptr(ty.i32)):
    ty.cluster_wait()
    if ty.thread_idx() == 0:
        out[ty.block_idx()] = 1


@ty.kernel(threads=32, arch="sm_90a")
def no_cluster(out: ty.ptr(ty.i32)):
    """A launch without clusters: each CTA is rank 0 of a cluster of one."""
    if ty.thread_idx() == 0:
        out[ty.block_idx() * 3] = ty.cluster_ctarank()
        out[ty.block_idx() * 3 + 1] = ty.cluster_nctarank()
        out[ty.block_idx() * 3 + 2] = ty.cluster_idx()
    ty.cluster_sync()


# -- TMA multicast and remote mbarrier arrives ---------------------------------------------------------------
# A pair of CTAs streams ITERS tiles of 16 rows x 32 f32 through a 2-stage ring: rank r loads rows
# [8r, 8r + 8) of each tile and multicasts them to both CTAs; warp 1 of each CTA copies the tile out
# and frees the stage in both CTAs (the empty barriers count one consumer of each CTA).
HALF_BYTES = 8 * 32 * 4


@ty.kernel(threads=64, arch="sm_90a", cluster=(2, 1, 1))
def multicast_rows(tm: ty.tensormap, out: ty.ptr(ty.f32), ITERS: ty.constexpr, BUG: ty.constexpr = ""):
    """Planted bugs: "local_release" (consumers free only their own CTA's stage), "expect_half" (each
    CTA expects only the half it loads), "no_final_sync", "no_init_sync"."""
    ring = ty.shared(ty.f32, 2 * 16 * 32, align=1024)
    full = ty.shared(ty.u64, 2, align=8)
    empty = ty.shared(ty.u64, 2, align=8)
    rank = ty.cluster_ctarank()
    t = ty.thread_idx()
    if t == 0:
        for s in ty.static_range(2):
            hopper.mbarrier_init(full + s, 1, label="full")
            hopper.mbarrier_init(empty + s, 1 if BUG == "local_release" else 2, label="empty")
        hopper.fence_mbarrier_init()
        hopper.fence_proxy_async()
    ty.syncthreads()
    if BUG != "no_init_sync":
        ty.cluster_sync()                                   # both CTAs' barriers are initialized
    if ty.warp_idx() == 0:
        if ty.elect_one():
            for i in ty.range(ITERS):
                s = i % 2
                hopper.mbarrier_wait(empty + s, ((i // 2) & 1) ^ 1, label="empty")
                hopper.mbarrier_arrive_expect_tx(full + s, HALF_BYTES if BUG == "expect_half" else 2 * HALF_BYTES)
                hopper.tma_load(ring + (s * 512 + rank * 256), tm, full + s, 0, 16 * i + 8 * rank, multicast=3)
    else:
        lane = ty.lane_id()
        for i in ty.range(ITERS):
            s = i % 2
            hopper.mbarrier_wait(full + s, (i // 2) & 1, label="full")
            for j in ty.static_range(16):
                out[((ty.cluster_idx() * 2 + rank) * ITERS + i) * 512 + j * 32 + lane] = ring[s * 512 + j * 32 + lane]
            if lane == 0:
                if BUG == "local_release":
                    hopper.mbarrier_arrive(empty + s)
                else:
                    hopper.mbarrier_arrive(empty + s, cta=0)
                    hopper.mbarrier_arrive(empty + s, cta=1)
    if BUG != "no_final_sync":
        ty.cluster_sync()                                   # <- no CTA exits while its barriers get remote arrives
