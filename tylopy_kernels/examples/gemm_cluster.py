"""bf16 GEMM for Hopper (sm_90a) with thread-block clusters and TMA multicast, written with tylopy's
public names only:

    C (bf16, M x N) = A (bf16, M x K) @ B (bf16, N x K)^T        (torch: a @ b.T; fp32 accumulation)

Both operands are K-major (B is a Linear weight's layout), so one 128-byte swizzled row holds 64
k-values of one operand row.

Algorithm. A persistent, warp-specialized kernel: 384 threads, one CTA per SM.

1. Clusters of ``CLUSTER_M`` CTAs (2, or 1 for the same kernel without clusters) along M work on
   cluster tiles of (CLUSTER_M x 128) x BLOCK_N: CTA rank r computes rows [128 r, 128 r + 128) of
   the cluster tile, and all of them need the same BLOCK_N rows of B. So each CTA loads its own
   A tile (128 x 64 per k-block) and 1/CLUSTER_M of the B tile, which it multicasts
   (``tma_load(..., multicast=0b11)``) into the same stage of every CTA of the cluster: each B
   byte crosses from L2 once per cluster instead of once per CTA (per k-block a pair of 128 x 256
   tiles reads 2 x 16 KB of A and 32 KB of B instead of 2 x (16 + 32) KB: 2/3 of the traffic).
2. Warpgroup 0 is the producer: it gives registers back (``setmaxnreg``), and one thread streams
   k-blocks through a ring of ``STAGES`` stages. Each stage has a full mbarrier (the producer's
   ``expect_tx`` of the whole stage: its A, its B half and the other CTAs' B halves, which complete
   on the barrier at the same offset) and an empty mbarrier that counts the consumers of *every*
   CTA of the cluster: the producer may refill a stage only when no CTA its multicast writes to
   still reads it. A consumer frees a stage with ``mbarrier_arrive(empty, cta=r, scope="cta")``
   for each rank r: the bare arrive, as the stage's reads have completed (a cluster-scope release
   would put a GPU-scope fence in front of each arrive, stalling the consumer every k-block).
3. Warpgroups 1 and 2 are consumers (``setmaxnreg.inc``), 64 rows each: per k-block four
   m64 n{BLOCK_N} k16 SS wgmmas, commit, wait until only this k-block is in flight, free the
   previous stage in every CTA of the cluster. Epilogue: round to bf16 and store the rows < M and
   columns < N (below) while the producer already loads the next tile.
4. Barriers are initialized, fenced (``fence_mbarrier_init``) and published to the cluster with a
   ``cluster_sync`` before any remote use, and every warp of every CTA ends with a ``cluster_sync``:
   no CTA exits (taking its shared memory and barriers) while another may still arrive on them.
5. Tiles run in groups of ``GROUP_M`` cluster-tile rows, column by column (L2 reuse of B).

Epilogue (``STORE``): "tma" stages 64-column chunks of each consumer's rows in two alternating
128-byte-swizzled buffers and TMA-stores them (the TMA clips rows >= M and columns >= N); "direct"
stores bf16 pairs straight from the registers.

Shape rules (``check_inputs`` raises ValueError naming the argument): K a multiple of 8 and N even
(16-byte TMA row strides, 4-byte bf16 pair stores), N a multiple of 8 for STORE="tma" (the
default then; "direct" otherwise); any M, N, K otherwise: TMA zero-fills rows and k past the ends,
and only rows < M and columns < N are stored. The grid is a multiple of
CLUSTER_M; a CTA whose rows all lie past M still loads and multicasts its share of B. The default
grid is one CTA per SM: the persistent loop assumes every cluster is resident at once (an H200's
132 SMs form 66 pairs; a larger grid would run its extra clusters only after others finish).

Run it: ``matmul(a, b)`` on CUDA tensors (``cluster=False`` for the kernel without clusters,
``emulate=True`` with CPU tensors); ``tylopy emulate tylopy_kernels/examples/gemm_cluster.py``
checks a ragged example; ``python -m tylopy_kernels.examples.gemm_cluster --bench`` times the
cluster kernel, the same kernel without clusters and torch.matmul (cuBLAS) at 4096^3 and 8192^3.
"""
import functools

import tylopy as ty
from tylopy import hopper

BLOCK_M = 128            # rows per CTA: two consumer warpgroups of 64
BLOCK_K = 64             # bf16 k per k-block: one 128-byte swizzle row
ROW = 128                # bytes per operand row in shared memory
CONSUMERS = 2
THREADS = 128 * (1 + CONSUMERS)
REGISTERS = (40, 232)    # setmaxnreg split: 128 * 40 + 256 * 232 = 384 * 168
SMEM_LIMIT = 232448      # H100/H200 opt-in dynamic shared memory per block
EPI_COLS = 64            # bf16 columns of one 128-byte staging row
EPI_BUF = 64 * ROW       # one consumer's staging buffer: its 64 rows x 128 bytes
EPILOGUE_BARRIER = 1     # named barriers 1 and 2: consumer c's staging buffers


def smem_layout(block_n, stages, store="tma"):
    """Byte offsets: (A stage bytes, B stage bytes, B ring, full barriers, empty barriers, total,
    epilogue staging: two buffers per consumer with STORE="tma")."""
    a_bytes, b_bytes = BLOCK_M * ROW, block_n * ROW
    b = stages * a_bytes
    epi = b + stages * b_bytes
    full = epi + (CONSUMERS * 2 * EPI_BUF if store == "tma" else 0)
    empty = full + 8 * stages
    return a_bytes, b_bytes, b, full, empty, empty + 8 * stages, epi


def stages_for(block_n: int, store: str = "tma") -> int:
    """The deepest ring (up to 6) that fits 227 KB."""
    for stages in range(6, 1, -1):
        if smem_layout(block_n, stages, store)[5] <= SMEM_LIMIT:
            return stages
    return 2


bar_at = hopper.barrier_at  # the mbarrier at a shared-memory offset


@ty.func
def my_units(total, cluster_m):
    """How many cluster tiles this CTA's cluster takes: positions c, c + G, ... below ``total``."""
    if cluster_m == 1:
        c, g = ty.block_idx(0), ty.grid_dim(0)
    else:
        c, g = ty.cluster_idx(0), ty.cluster_grid_dim(0)
    return c, g, ty.select(c < total, (total - c + (g - 1)) // g, 0)


@ty.func
def tile_of(pos, num_m, num_n, group_m):
    """(cluster-tile row, column) of position ``pos``: groups of ``group_m`` rows, column by column."""
    per_group = group_m * num_n
    group = pos // per_group
    first = group * group_m
    rows = ty.minimum(num_m - first, group_m)
    r = pos - group * per_group
    return first + r % rows, r // rows


# -- producer ---------------------------------------------------------------------------------------

@ty.func
def producer(smem, tm_a, tm_b, grid_tiles, k_blocks, cfg):
    cluster_m, block_n, stages, group_m, how = cfg[:5]
    a_bytes, b_bytes, b_off, full, empty = smem_layout(block_n, stages, how)[:5]
    share = block_n // cluster_m           # B rows this CTA loads (and multicasts)
    rank = ty.cluster_ctarank() if cluster_m > 1 else 0
    hopper.setmaxnreg(REGISTERS[0], increase=False)
    if (ty.warp_idx() & 3) == 0:
        if hopper.elect_one():
            hopper.prefetch_tensormap(tm_a)
            hopper.prefetch_tensormap(tm_b)
            first, step, count = my_units(grid_tiles[0] * grid_tiles[1], cluster_m)
            it = 0
            for local in range(count):
                tm, tn = tile_of(first + local * step, grid_tiles[0], grid_tiles[1], group_m)
                m0 = (tm * cluster_m + rank) * BLOCK_M
                n0 = tn * block_n
                for kb in range(k_blocks):
                    stage = (it + kb) % stages
                    hopper.mbarrier_wait(bar_at(smem, empty + 8 * stage), (((it + kb) // stages) & 1) ^ 1,
                                         "stage empty", stage)
                    bar = bar_at(smem, full + 8 * stage)
                    hopper.mbarrier_arrive_expect_tx(bar, a_bytes + b_bytes)   # the whole stage lands here
                    hopper.tma_load(smem + stage * a_bytes, tm_a, bar, kb * BLOCK_K, m0)
                    b_dst = smem + (b_off + stage * b_bytes)
                    if cluster_m > 1:   # my share of B, into the same stage of every CTA of the cluster
                        hopper.tma_load(b_dst + rank * (share * ROW), tm_b, bar, kb * BLOCK_K, n0 + rank * share,
                                        multicast=(1 << cluster_m) - 1)
                    else:
                        hopper.tma_load(b_dst, tm_b, bar, kb * BLOCK_K, n0)
                it = it + k_blocks


# -- consumers --------------------------------------------------------------------------------------

@ty.func
def kblock(smem, base, atom, acc, it, row_off, cfg):
    """Wait for ring iteration ``it``'s stage and issue its four k16 steps (one commit group)."""
    cluster_m, block_n, stages, group_m, how = cfg[:5]
    a_bytes, b_bytes, b_off, full, empty = smem_layout(block_n, stages, how)[:5]
    stage = it % stages
    hopper.mbarrier_wait(bar_at(smem, full + 8 * stage), (it // stages) & 1, "stage full", stage)
    hopper.wgmma_fence()
    a_desc = hopper.smem_descriptor(base + ty.cast(stage * a_bytes + row_off * ROW, ty.u32), lbo=16, sbo=1024)
    b_desc = hopper.smem_descriptor(base + ty.cast(b_off + stage * b_bytes, ty.u32), lbo=16, sbo=1024)
    for kk in range(BLOCK_K // 16):   # 32 bytes = 2 descriptor units per k16 step
        acc = hopper.wgmma(atom, acc, a_desc + 2 * kk, b_desc + 2 * kk)
    hopper.wgmma_commit()
    return acc


@ty.func
def release(smem, it, cfg):
    """One thread per consumer frees the stage of ring iteration ``it`` in every CTA of the cluster
    (each of their producers multicasts into this CTA's copy of the stage). The arrive publishes
    nothing (the stage's wgmma reads have completed), so its release scope is the CTA
    (``RELEASE``="cta", as CUTLASS's cluster barrier arrives): a "cluster" release puts a GPU-scope
    fence (MEMBAR.ALL.GPU) before each arrive, which stalls the warp, and with it the warpgroup's
    next wgmmas, for an L2 round trip per k-block."""
    cluster_m, block_n, stages, group_m, how, scope = cfg
    empty = smem_layout(block_n, stages, how)[4]
    if (ty.thread_idx() & 127) == 0:
        bar = bar_at(smem, empty + 8 * (it % stages))
        if cluster_m > 1:
            for r in range(cluster_m):
                hopper.mbarrier_arrive(bar, cta=r, scope=scope)
        else:
            hopper.mbarrier_arrive(bar)


@ty.func
def store(acc, out, m, n, row0, col0, block_n):
    """bf16 column pairs straight from the registers: register i holds row 16w + g + 8((i >> 1) & 1),
    column 8(i >> 2) + 2t + (i & 1); N is even, so a pair is one 4-byte store."""
    w = ty.warp_idx() & 3
    g = ty.lane_id() >> 2
    t = ty.lane_id() & 3
    words = ty.ptr_cast(out, ty.b32)
    vals = acc.values
    for j in range(block_n // 8):
        col = col0 + 8 * j + 2 * t
        if col < n:
            for half in range(2):
                row = row0 + 16 * w + g + 8 * half
                if row < m:
                    i = 4 * j + 2 * half
                    at = ty.cast(row, ty.i64) * ty.cast(n, ty.i64) + ty.cast(col, ty.i64)
                    words[at >> 1] = ty.pack2(vals[i], vals[i + 1], ty.bf16)


@ty.func
def store_tma(acc, tm_c, smem, epi, seq, row0, col0, block_n):
    """Stage 64-column chunks in the 128-byte-swizzled image TMA expects (row r at 128 r, 16-byte
    piece p at p ^ (r % 8)) in two alternating buffers and TMA-store each (the TMA clips rows >= M
    and columns >= N). Register i holds column 8(i >> 2) + 2t + (i & 1) of row 16w + g + 8((i >> 1) & 1),
    so a pair of 8-column group q lands at piece q ^ g. ``seq`` counts this consumer's chunks so far."""
    c = ty.warpgroup_idx() - 1
    w = ty.warp_idx() & 3
    g = ty.lane_id() >> 2
    t = ty.lane_id() & 3
    leader = (ty.thread_idx() & 127) == 0
    vals = acc.values
    for j in range(block_n // EPI_COLS):
        buf = smem + (epi + (2 * c) * EPI_BUF) + ((seq + j) & 1) * EPI_BUF
        if leader:
            hopper.bulk_wait(1, read=True)   # the store that last read this buffer is done reading
        ty.barrier_sync(EPILOGUE_BARRIER + c, 128)
        for q in range(EPI_COLS // 8):
            for half in range(2):
                i = 4 * (8 * j + q) + 2 * half
                at = buf + ((16 * w + g + 8 * half) * ROW + (q ^ g) * 16 + 4 * t)
                ty.store(ty.ptr_cast(at, ty.b32), ty.pack2(vals[i], vals[i + 1], ty.bf16))
        hopper.fence_proxy_async()
        ty.barrier_sync(EPILOGUE_BARRIER + c, 128)
        if leader:
            hopper.tma_store(tm_c, buf, col0 + EPI_COLS * j, row0)
            hopper.bulk_commit()
    return seq + block_n // EPI_COLS


@ty.func
def consumer(smem, dst, m, n, grid_tiles, k_blocks, cfg):
    cluster_m, block_n, stages, group_m, how = cfg[:5]
    out, tm_c = dst
    hopper.setmaxnreg(REGISTERS[1], increase=True)
    row_off = (ty.warpgroup_idx() - 1) * 64
    rank = ty.cluster_ctarank() if cluster_m > 1 else 0
    base = ty.address(smem)
    atom = hopper.WgmmaAtom(block_n, ty.bf16, "ss")
    first, step, count = my_units(grid_tiles[0] * grid_tiles[1], cluster_m)
    it = 0
    seq = 0
    for local in range(count):
        tm, tn = tile_of(first + local * step, grid_tiles[0], grid_tiles[1], group_m)
        acc = kblock(smem, base, atom, None, it, row_off, cfg)
        for kb in range(1, k_blocks):
            acc = kblock(smem, base, atom, acc, it + kb, row_off, cfg)
            acc = hopper.wgmma_wait(1, acc)
            release(smem, it + kb - 1, cfg)
        acc = hopper.wgmma_wait(0, acc)
        release(smem, it + k_blocks - 1, cfg)
        row0 = (tm * cluster_m + rank) * BLOCK_M + row_off
        if how == "tma":
            seq = store_tma(acc, tm_c, smem, smem_layout(block_n, stages, how)[6], seq, row0, tn * block_n, block_n)
        else:
            store(acc, out, m, n, row0, tn * block_n, block_n)
        it = it + k_blocks
    if how == "tma":
        if (ty.thread_idx() & 127) == 0:
            hopper.bulk_wait(0)   # the staging buffers must outlive the last stores' reads


@functools.cache
def gemm_kernel(cluster_m: int):
    """The kernel with clusters of ``cluster_m`` CTAs along M (1: an ordinary launch, no multicast)."""
    extra = dict(cluster=(cluster_m, 1, 1)) if cluster_m > 1 else {}

    @ty.kernel(threads=THREADS, min_blocks_per_sm=1, noalias=True, arch="sm_90a", name=f"gemm_cluster{cluster_m}",
               **extra)
    def gemm_cluster(tm_a: ty.tensormap, tm_b: ty.tensormap, tm_c: ty.tensormap, out: ty.ptr(ty.bf16), m: ty.i32,
                     n: ty.i32, k: ty.i32, BLOCK_N: ty.constexpr = 256, STAGES: ty.constexpr = 4,
                     GROUP_M: ty.constexpr = 8, STORE: ty.constexpr = "tma", RELEASE: ty.constexpr = "cta"):
        """C = A B^T for A (M x K) and B (N x K) bf16 behind the tensor maps (boxes 64 x 128 and
        64 x BLOCK_N / CLUSTER_M, 128-byte swizzle); C row-major M x N, stored through ``tm_c``
        (64 x 64 boxes) with STORE="tma" or straight from the registers with "direct". RELEASE: the
        scope of the consumers' remote stage releases ("cta" or "cluster", see ``release``)."""
        if STORE not in ("tma", "direct"):
            raise ValueError(f"STORE expects 'tma' or 'direct', but got {STORE!r}")
        if RELEASE not in ("cta", "cluster"):
            raise ValueError(f"RELEASE expects 'cta' or 'cluster', but got {RELEASE!r}")
        cfg = (cluster_m, BLOCK_N, STAGES, GROUP_M, STORE, RELEASE)
        lay = smem_layout(BLOCK_N, STAGES, STORE)
        smem = ty.dynamic_shared(ty.u8, lay[5], align=1024)
        if ty.thread_idx() == 0:
            for s in range(STAGES):
                hopper.mbarrier_init(bar_at(smem, lay[3] + 8 * s), 1, label="stage full")
                hopper.mbarrier_init(bar_at(smem, lay[4] + 8 * s), CONSUMERS * cluster_m, label="stage empty")
            hopper.fence_mbarrier_init()
            hopper.fence_proxy_async()
        if cluster_m > 1:
            ty.cluster_sync()   # every CTA's barriers exist before any multicast or remote arrive
        else:
            ty.syncthreads()
        grid_tiles = ((m + (cluster_m * BLOCK_M - 1)) // (cluster_m * BLOCK_M), (n + (BLOCK_N - 1)) // BLOCK_N)
        k_blocks = (k + (BLOCK_K - 1)) // BLOCK_K
        if ty.warpgroup_idx() == 0:
            producer(smem, tm_a, tm_b, grid_tiles, k_blocks, cfg)
        else:
            consumer(smem, (out, tm_c), m, n, grid_tiles, k_blocks, cfg)
        if cluster_m > 1:
            ty.cluster_sync()   # no CTA exits while the others may still arrive on its barriers

    return gemm_cluster


gemm_cluster2 = gemm_kernel(2)   # module level, so `tylopy dump` finds them
gemm_cluster1 = gemm_kernel(1)


# -- host side ------------------------------------------------------------------------------------------

def check_inputs(a, b) -> None:
    """Raise TypeError/ValueError naming the argument a launch could not take."""
    import torch
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.bfloat16:
            raise TypeError(f"matmul expects {name} as a 2-D torch.bfloat16 tensor, but got "
                            f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"matmul expects a (M x K) and b (N x K), but got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] % 8:
        raise ValueError(f"matmul expects K (a's and b's columns) to be a multiple of 8 (16-byte TMA rows), but got "
                         f"{a.shape[1]}")
    if b.shape[0] % 2:
        raise ValueError(f"matmul expects N (b's rows) to be even (bf16 pairs are stored as one word), but got "
                         f"{b.shape[0]}")
    for name, t in (("a", a), ("b", b)):
        if t.stride(1) != 1 or t.stride(0) % 8 or t.data_ptr() % 16:
            raise ValueError(f"matmul expects {name} row-major with rows 16-byte aligned (TMA), but got strides "
                             f"{tuple(t.stride())}")


TILE_OPTIONS = dict(block_n=256, stages=None, group_m=8, store=None, release="cta")


def matmul(a, b, *, cluster: bool = True, grid: int | None = None, emulate: bool = False, **tile):
    """bf16 ``a @ b.T`` for ``a`` (M x K) and ``b`` (N x K); ``cluster=False`` runs the same kernel
    without clusters (each CTA loads its whole B tile). ``grid``: CTAs (a multiple of the cluster
    size), default one per SM. ``tile`` (keywords, defaults in ``TILE_OPTIONS``): ``block_n`` (64,
    128 or 256), ``stages`` (default: the deepest ring that fits), ``group_m`` (cluster-tile rows
    per raster group), ``store`` ("tma": staged TMA stores, needs N % 8 == 0, the default then;
    "direct": from the registers), ``release`` (the scope of the consumers' remote stage releases:
    "cta", the bare arrive, or "cluster", a GPU-scope fence before each; kept for timing)."""
    import torch
    check_inputs(a, b)
    unknown = sorted(set(tile) - set(TILE_OPTIONS))
    if unknown:
        raise TypeError(f"matmul expects keywords among {sorted(TILE_OPTIONS)}, but got {unknown}")
    block_n, stages, group_m, store, release = ({**TILE_OPTIONS, **tile}[key] for key in TILE_OPTIONS)
    if block_n not in (64, 128, 256):
        raise ValueError(f"matmul expects block_n 64, 128 or 256, but got {block_n}")
    m, k = a.shape
    n = b.shape[0]
    store = store or ("tma" if n % 8 == 0 else "direct")
    if store not in ("tma", "direct") or (store == "tma" and n % 8):
        raise ValueError(f"matmul expects store 'tma' (with N % 8 == 0) or 'direct', but got {store!r} with N = {n}")
    if release not in ("cta", "cluster"):
        raise ValueError(f"matmul expects release 'cta' or 'cluster', but got {release!r}")
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    cluster_m = 2 if cluster else 1
    units = -(-m // (cluster_m * BLOCK_M)) * -(-n // block_n)
    if grid is None:
        grid = 2 * cluster_m if emulate else torch.cuda.get_device_properties(a.device).multi_processor_count
    if grid % cluster_m:
        raise ValueError(f"matmul expects grid to be a multiple of the cluster size {cluster_m}, but got {grid}")
    grid = max(cluster_m, min(grid, units * cluster_m))
    tm_a = ty.tensor_map(a, box=(BLOCK_M, BLOCK_K), swizzle=128)
    tm_b = ty.tensor_map(b, box=(block_n // cluster_m, BLOCK_K), swizzle=128)
    tm_c = ty.tensor_map(c, box=(64, EPI_COLS), swizzle=128) if store == "tma" else tm_a  # direct: unused
    cfg = dict(BLOCK_N=block_n, STAGES=stages or stages_for(block_n, store), GROUP_M=group_m, STORE=store,
               RELEASE=release)
    kernel = gemm_kernel(cluster_m)
    if emulate:
        kernel.emulate(tm_a, tm_b, tm_c, c, m, n, k, grid=(grid,), **cfg)
    else:
        kernel[(grid,)](tm_a, tm_b, tm_c, c, m, n, k, **cfg)
    return c


def reference(a, b):
    """float64 a @ b.T."""
    return a.double() @ b.double().T


def emulate_example(m: int = 300, n: int = 136, k: int = 200, grid=None):
    """``tylopy emulate tylopy_kernels/examples/gemm_cluster.py``: a ragged product on one cluster of two CTAs
    (M past the second CTA's rows, N past the tile, K past the last k-block), against float64;
    tolerance: bf16 rounding of the result plus f32 accumulation."""
    import torch
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    c = matmul(a, b, block_n=128, emulate=True, grid=grid[0] if isinstance(grid, tuple) else grid)
    want = reference(a, b)
    tol = 2.0 ** -8 * float(want.abs().max()) + 2.0 ** -20 * k * float((a.double().abs() @ b.double().abs().T).max())
    return c.double().numpy(), want.numpy(), tol


def bench(sizes=(4096, 8192), releases=("cta",), **cfg) -> list:
    """For each square size: TFLOP/s of the cluster kernel (once per stage-release scope in
    ``releases``), the kernel without clusters and torch.matmul (cuBLAS), CUDA-event medians after
    warm-up in one process; each result checked against torch's. ``cfg``: matmul's tile options
    (block_n, stages, group_m, grid, store) for all variants. Returns one dict per size (the cluster
    kernel under "cluster", or "cluster_<scope>" for each scope when there are several)."""
    import torch
    from tylopy.benchmarking import median_ms
    rows = []
    for s in sizes:
        gen = torch.Generator(device="cuda").manual_seed(s)
        a = torch.randn(s, s, device="cuda", generator=gen, dtype=torch.bfloat16)
        b = torch.randn(s, s, device="cuda", generator=gen, dtype=torch.bfloat16)
        ref = torch.matmul(a, b.T)
        row = dict(size=s)
        names = ["cluster"] if len(releases) == 1 else [f"cluster_{r}" for r in releases]
        variants = [(name, functools.partial(matmul, a, b, release=r, **cfg)) for name, r in zip(names, releases)]
        for name, fn in (*variants, ("no_cluster", lambda: matmul(a, b, cluster=False, **cfg)),
                         ("torch", lambda: torch.matmul(a, b.T))):
            got = fn()
            torch.cuda.synchronize()
            rel = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
            ms = median_ms(fn)
            row[name] = dict(ms=ms, tflops=2 * s ** 3 / ms / 1e9, max_rel_diff=rel)
        rows.append(row)
        nc, t = row["no_cluster"], row["torch"]
        for name, r in zip(names, releases):
            c = row[name]
            ok = c["max_rel_diff"] < 1e-2 and nc["max_rel_diff"] < 1e-2
            print(f"{s}^3 bf16: cluster {c['tflops']:.0f} TFLOP/s ({c['ms']:.3f} ms, release {r})  no-cluster "
                  f"{nc['tflops']:.0f} TFLOP/s  torch {t['tflops']:.0f} TFLOP/s  "
                  f"cluster/torch {c['tflops'] / t['tflops']:.3f}  "
                  f"cluster/no-cluster {c['tflops'] / nc['tflops']:.3f}  max|diff|/max|C| {c['max_rel_diff']:.1e} "
                  f"{'OK' if ok else 'MISMATCH'}", flush=True)
    return rows


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description="The cluster GEMM example: --bench times it against itself without "
                                            "clusters and against torch.matmul")
    p.add_argument("--bench", action="store_true", help="time the kernels (CUDA)")
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--block-n", type=int, default=256)
    p.add_argument("--stages", type=int, default=None, help="default: the deepest ring that fits")
    p.add_argument("--group-m", type=int, default=8, help="cluster-tile rows per raster group")
    p.add_argument("--grid", type=int, default=None, help="CTAs (default: one per SM)")
    p.add_argument("--store", choices=("tma", "direct"), default=None, help="epilogue (default: tma)")
    p.add_argument("--release", choices=("cta", "cluster"), nargs="+", default=["cta"],
                   help="scope of the consumers' remote stage releases; several: time the cluster kernel "
                        "with each")
    p.add_argument("--output", default=None, help="write the timings as JSON (results/...)")
    args = p.parse_args(argv)
    if args.bench:
        rows = bench(args.sizes, tuple(args.release), block_n=args.block_n, stages=args.stages, group_m=args.group_m,
                     grid=args.grid, store=args.store)
        if args.output:
            from tylopy.benchmarking import write_results
            write_results("gemm_cluster", dict(rows=rows, config=vars(args)), args.output)
        return 0
    got, want, tol = emulate_example()
    err = float(abs(got - want).max())
    print(f"emulated {got.shape}: max |C - float64| = {err:.3g} (tolerance {tol:.3g}) {'OK' if err <= tol else 'FAIL'}")
    return 0 if err <= tol else 1


def bench_main(argv=None):
    """``tylopy bench gemm_cluster [options]``: main with --bench."""
    return main(["--bench", *(argv or [])])


if __name__ == "__main__":
    raise SystemExit(main())
