"""Scaled FP8 GEMM for Hopper (sm_90a): C = scale(A @ B) + bias with e4m3/e5m2 operands.

    C[m, n] = sum_kb s(m, n, kb) * sum_{k in block kb} A[m, k] B[k, n]  (+ bias[n])

A is M x K, row-major; B is K x N with its columns contiguous (``w.t()`` of an N x K weight):
FP8 wgmma reads both operands K-major and has no transpose for 8-bit data. The scale ``s`` is
one of (``SCALE``):

* ``"tensor"``: scale_a[0] * scale_b[0], applied in the epilogue;
* ``"row"``: scale_a[m] * scale_b[n] (A per row, B per column), applied in the epilogue;
* ``"block"``: scale_a[m, kb] * scale_b[kb, n // 128] (A 1 x 128 per row, B 128 x 128; the
  DeepSeek-V3 recipe), applied per k-block of 128 while promoting into f32 (below).

One persistent CTA per SM, 384 threads, warp-specialized like ``hopper.py``'s bf16 GEMM:

1. Warpgroup 0 (producer) gives registers back and one elected thread streams k-blocks of 128
   codes (one 128-byte swizzled row per operand row) of A and B by TMA through a ring of
   ``STAGES`` stages, each with a full and an empty mbarrier. The ring runs on across tiles.
2. Warpgroups 1 and 2 (consumers) share every 128 x BLOCK_N tile, 64 rows each: per k-block
   four m64 n{BLOCK_N} k32 SS wgmmas (the descriptor moves 32 bytes per k32 step).
3. Accumulation. FP8 wgmma keeps about 13 fraction bits of its running sum (docs/fp8.md).
   ``PROMOTE=False`` chains every k-block into one accumulator (torch's ``use_fast_accum=True``).
   ``PROMOTE=True`` starts each k-block from zero, waits for it and adds it into a separate f32
   total with ordinary FADDs, restoring f32 accumulation every 128 k (``use_fast_accum=False``);
   with block scales the add is ``total = fma(part, s, total)`` with this k-block's scales.
   Promotion doubles the accumulator registers, so it needs BLOCK_N <= 128.
4. Epilogue: scale (tensor / row forms), add the bias in f32, round to ``OUT_DTYPE`` and stage
   128-byte-wide column chunks in two alternating 128-byte-swizzled buffers per consumer, each
   TMA-stored (the TMA clips rows >= M and columns >= N; it zero-fills rows and k past the
   operands' ends on the way in, so tails add zero products).

The rounding of every step is fixed (explicit ``ty.mul`` / ``ty.fma``, no contraction left to
the compiler), so the emulator and ``tests/test_gemm_fp8.py``'s model agree bit for bit.
"""
from typing import Any, NamedTuple

import tylopy as ty
from tylopy import hopper

BLOCK_M = 128            # two consumers of 64 rows
BLOCK_K = 128            # codes per k-block: one 128-byte swizzle row; also the block-scale width
ROW = 128                # bytes per operand row in shared memory
CONSUMERS = 2
THREADS = 128 * (1 + CONSUMERS)
REGISTERS = (40, 232)    # setmaxnreg split: 128 * 40 + 256 * 232 = 384 * 168
EPI_BUF = 64 * ROW       # one staging buffer: a consumer's 64 rows x 128 bytes
EPILOGUE_BARRIER = 1     # named barriers 1 and 2: consumer c's staging buffers
SMEM_LIMIT = 232448      # H100/H200 opt-in dynamic shared memory per block
SCALES = ("tensor", "row", "block")
OUT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


class Fp8Plan:
    """Shared-memory map of one schedule; raises ValueError naming a bad choice."""

    def __init__(self, block_n, stages, out_dtype="bf16", promote=False):
        if block_n not in (64, 128, 256):
            raise ValueError(f"BLOCK_N expects 64, 128 or 256, but got {block_n!r}")
        if promote and block_n > 128:
            raise ValueError(f"PROMOTE=True keeps two accumulators: it expects BLOCK_N <= 128, but got {block_n}")
        if out_dtype not in OUT_BYTES:
            raise ValueError(f"OUT_DTYPE expects bf16, f16 or f32, but got {out_dtype!r}")
        if isinstance(stages, bool) or not isinstance(stages, int) or not 2 <= stages <= 8:
            raise ValueError(f"STAGES expects an int in 2..8, but got {stages!r}")
        self.block_n, self.stages, self.promote = block_n, stages, promote
        self.a_bytes, self.b_bytes = BLOCK_M * ROW, block_n * ROW
        self.stage_bytes = self.a_bytes + self.b_bytes
        self.b = stages * self.a_bytes
        self.epi = self.b + stages * self.b_bytes
        self.epi_cols = ROW // OUT_BYTES[out_dtype]      # output columns per 128-byte staging row
        self.epi_chunks = block_n // self.epi_cols
        self.full = self.epi + CONSUMERS * 2 * EPI_BUF
        self.empty = self.full + 8 * stages
        self.total = self.empty + 8 * stages
        if self.total > SMEM_LIMIT:
            raise ValueError(f"the schedule needs {self.total} bytes of shared memory, more than the {SMEM_LIMIT} a "
                             f"block may use (BLOCK_N={block_n}, STAGES={stages})")


def fit_stages(block_n, out_dtype="bf16", promote=False, most=6) -> int:
    """The deepest ring (up to ``most``) that fits in shared memory."""
    for stages in range(most, 2, -1):
        try:
            Fp8Plan(block_n, stages, out_dtype, promote)
            return stages
        except ValueError:
            continue
    return 2


# -- shared by the producer and consumers (the example kernel imports these) ---------------------------

class TileGrid(NamedTuple):
    """The output's tiles: block_m x block_n each (compile-time), num_m x num_n of them with k_blocks
    k-blocks each, taken in groups of group_m tile rows (``tile_of``)."""

    block_m: int
    block_n: int
    num_m: Any
    num_n: Any
    k_blocks: Any
    group_m: int


class OperandRing:
    """The operand ring as one consumer reads it (a plain holder): the shared memory (pointer and u32
    address), the wgmma atom, ``lay`` (A and B stage bytes, B's ring offset, the full and empty
    barriers), the ring's depth and the consumer's first row in an A stage."""

    def __init__(self, smem, base, atom, lay, stages, row_off):
        self.smem, self.base, self.atom, self.lay, self.stages, self.row_off = smem, base, atom, lay, stages, row_off


@ty.func
def tile_of(pos, num_m, num_n, group_m):
    """Tile (row, column) of position ``pos``: groups of ``group_m`` tile rows, column by column,
    so the tiles in flight together share rows of A and columns of B in L2."""
    per_group = group_m * num_n
    group = pos // per_group
    first = group * group_m
    rows = ty.minimum(num_m - first, group_m)
    r = pos - group * per_group
    return first + r % rows, r // rows


@ty.func
def my_tiles(total):
    """How many tiles this CTA takes: positions b, b + G, b + 2G, ... below ``total``."""
    g = ty.grid_dim(0)
    b = ty.block_idx(0)
    return ty.select(b < total, (total - b + (g - 1)) // g, 0)


@ty.func
def producer(smem, tm_a, tm_b, tiles, lay, stages, registers):
    """``tiles``: the ``TileGrid``; ``lay``: (A stage bytes, B stage bytes, B ring offset, full
    barriers, empty barriers)."""
    a_bytes, b_bytes, b_off, full, empty = lay[:5]
    hopper.setmaxnreg(registers[0], increase=False)
    if (ty.warp_idx() & 3) == 0:
        if hopper.elect_one():
            hopper.prefetch_tensormap(tm_a)
            hopper.prefetch_tensormap(tm_b)
            it = 0
            for local in range(my_tiles(tiles.num_m * tiles.num_n)):
                tm, tn = tile_of(ty.block_idx(0) + local * ty.grid_dim(0), tiles.num_m, tiles.num_n, tiles.group_m)
                for kb in range(tiles.k_blocks):
                    stage, bar = hopper.ring_acquire(smem, hopper.Ring(full, empty, stages), it + kb, a_bytes + b_bytes)
                    hopper.tma_load(smem + stage * a_bytes, tm_a, bar, kb * BLOCK_K, tm * tiles.block_m)
                    hopper.tma_load(smem + (b_off + stage * b_bytes), tm_b, bar, kb * BLOCK_K, tn * tiles.block_n)
                it = it + tiles.k_blocks


@ty.func
def issue(acc, atom, base, a_at, b_at):
    """Four k32 steps of one k-block into ``acc`` (None: start from zero)."""
    a_desc = hopper.smem_descriptor(base + a_at, lbo=16, sbo=1024)
    b_desc = hopper.smem_descriptor(base + b_at, lbo=16, sbo=1024)
    for kk in range(BLOCK_K // 32):   # 32 bytes = 2 descriptor units per k32 step
        acc = hopper.wgmma(atom, acc, a_desc + 2 * kk, b_desc + 2 * kk)
    return acc


@ty.func
def kblock(ring, acc, it):
    """Wait for ring iteration ``it``'s stage of the ``OperandRing`` and issue its four k32 steps (one
    commit group)."""
    smem, lay, stages = ring.smem, ring.lay, ring.stages
    a_bytes, b_bytes, b_off, full, empty = lay[:5]
    stage = it % stages
    hopper.mbarrier_wait(hopper.barrier_at(smem, full + 8 * stage), (it // stages) & 1, "stage full", stage)
    hopper.wgmma_fence()
    a_at = ty.cast(stage * a_bytes + ring.row_off * ROW, ty.u32)
    b_at = ty.cast(b_off + stage * b_bytes, ty.u32)
    acc = issue(acc, ring.atom, ring.base, a_at, b_at)
    hopper.wgmma_commit()
    return acc


@ty.func
def release(ring, it):
    if (ty.thread_idx() & 127) == 0:  # one thread per consumer frees the stage
        hopper.ring_release(ring.smem, hopper.Ring(ring.lay[3], ring.lay[4], ring.stages), it)


@ty.func
def add_into(total, part):
    """total + part, register by register, rounded to nearest (never contracted)."""
    vals = [ty.add(total.values[i], part.values[i], rounding="rn") for i in range(len(part.values))]
    return ty.Fragment(vals, ty.WARPGROUP, part.layout)


@ty.func
def chained(ring, it0, k_blocks):
    """Every k-block into one accumulator chain, waiting until only the newest k-block is in
    flight before releasing the previous stage (k_blocks >= 1)."""
    acc = kblock(ring, None, it0)
    for kb in range(1, k_blocks):
        acc = kblock(ring, acc, it0 + kb)
        acc = hopper.wgmma_wait(1, acc)
        release(ring, it0 + kb - 1)
    acc = hopper.wgmma_wait(0, acc)
    release(ring, it0 + k_blocks - 1)
    return acc


# -- block scales ----------------------------------------------------------------------------------------

class Scales:
    """The scale operands: pointers, their element strides and the form (a holder of IR values)."""

    def __init__(self, form, a, b, sizes):
        """``a``: (scale_a's pointer, its row stride, its k-block stride); ``b``: (scale_b's pointer,
        its k-block stride, its column-block stride); ``sizes``: (M, N)."""
        self.form = form
        self.sa, self.sa_m, self.sa_k = a
        self.sb, self.sb_k, self.sb_n = b
        self.m, self.n = sizes


@ty.func
def thread_rows(row0):
    """The two rows (of 64) this thread's accumulator registers hold: 16w + g and 16w + g + 8."""
    r = row0 + 16 * (ty.warp_idx() & 3) + (ty.lane_id() >> 2)
    return r, r + 8


@ty.func
def block_scales(sc, row0, col0, kb):
    """scale_a[r, kb] * scale_b[kb, col0 / 128] for this thread's two rows (0 past M)."""
    r0, r1 = thread_rows(row0)
    b = sc.sb[ty.cast(kb, ty.i64) * sc.sb_k + ty.cast(col0 >> 7, ty.i64) * sc.sb_n]
    k_at = ty.cast(kb, ty.i64) * sc.sa_k
    a0 = ty.load(sc.sa + (ty.cast(r0, ty.i64) * sc.sa_m + k_at), mask=r0 < sc.m)
    a1 = ty.load(sc.sa + (ty.cast(r1, ty.i64) * sc.sa_m + k_at), mask=r1 < sc.m)
    return ty.mul(a0, b, rounding="rn"), ty.mul(a1, b, rounding="rn")


@ty.func
def promoted(ring, it0, k_blocks, sc, row0, col0):
    """Each k-block from zero, waited out and added into the f32 total; with block scales
    total = fma(part, s, total), s this k-block's scale of the register's row."""
    block = sc.form == "block"
    if block:
        s = block_scales(sc, row0, col0, 0)
    part = hopper.wgmma_wait(0, kblock(ring, None, it0))
    release(ring, it0)
    if block:
        vals = [ty.mul(part.values[i], s[(i >> 1) & 1], rounding="rn") for i in range(len(part.values))]
        total = ty.Fragment(vals, ty.WARPGROUP, part.layout)
    else:
        total = part
    for kb in range(1, k_blocks):
        if block:
            s = block_scales(sc, row0, col0, kb)   # loads in flight while the wgmmas run
        part = hopper.wgmma_wait(0, kblock(ring, None, it0 + kb))
        release(ring, it0 + kb)
        if block:
            vals = [ty.fma(part.values[i], s[(i >> 1) & 1], total.values[i], rounding="rn")
                    for i in range(len(part.values))]
            total = ty.Fragment(vals, ty.WARPGROUP, part.layout)
        else:
            total = add_into(total, part)
    return total


# -- epilogue ------------------------------------------------------------------------------------------

class Output:
    """Where C goes (a holder): its tensor map, the bias pointer, N, ``form`` = (C's dtype, has bias,
    the bias dtype) and ``epilogue`` = the plan's (columns per store, stores per tile, epilogue)."""

    def __init__(self, tm_c, bias, n, form, epilogue):
        self.tm_c, self.bias, self.n = tm_c, bias, n
        self.out_dtype, self.has_bias, self.bias_dtype = form
        self.epi_cols, self.epi_chunks, self.epi = epilogue


@ty.func
def column_pair(ptr, stride, col, n):
    """ptr[col * stride], ptr[(col + 1) * stride] as f32 (0 past N)."""
    v0 = ty.cast(ty.load(ptr + ty.cast(col, ty.i64) * stride, mask=col < n), ty.f32)
    v1 = ty.cast(ty.load(ptr + ty.cast(col + 1, ty.i64) * stride, mask=col + 1 < n), ty.f32)
    return v0, v1


@ty.func
def finish(v, s, b, dst, sc):
    """The scaled value plus the bias in f32: v * s (+ b as one fma); block scales are applied."""
    if sc.form == "block":
        if dst.has_bias:
            return ty.add(v, b, rounding="rn")
        return v
    if dst.has_bias:
        return ty.fma(v, s, b, rounding="rn")
    return ty.mul(v, s, rounding="rn")


@ty.func
def stage_chunk(acc, dst, sc, buf, j, col0, row_scale):
    """Columns [j E, (j + 1) E) of this consumer's tile (E = 128 bytes of output) into ``buf`` in
    the SWIZZLE_128B image TMA expects: row r at 128 r, 16-byte piece p at p ^ (r % 8). Register i
    holds column 8(i >> 2) + 2t + (i & 1) of row 16w + g + 8((i >> 1) & 1), and r % 8 is g."""
    w = ty.warp_idx() & 3
    g = ty.lane_id() >> 2
    t = ty.lane_id() & 3
    vals = acc.values
    groups = dst.epi_cols // 8       # 8-column groups per chunk: 8 (16-bit) or 4 (f32)
    for q in range(groups):
        col = col0 + 8 * (j * groups + q) + 2 * t
        b0, b1 = 0.0, 0.0
        if dst.has_bias:
            b0, b1 = column_pair(ty.ptr_cast(dst.bias, dst.bias_dtype), 1, col, dst.n)
        c0, c1 = 1.0, 1.0
        if sc.form == "row":
            c0, c1 = column_pair(sc.sb, sc.sb_n, col, dst.n)
        if dst.out_dtype == ty.f32:
            piece = ((2 * q + (t >> 1)) ^ g) * 16 + 8 * (t & 1)
        else:
            piece = (q ^ g) * 16 + 4 * t
        for half in range(2):
            i = 4 * (j * groups + q) + 2 * half
            s0, s1 = row_scale[half], row_scale[half]
            if sc.form == "row":
                s0 = ty.mul(row_scale[half], c0, rounding="rn")
                s1 = ty.mul(row_scale[half], c1, rounding="rn")
            v0 = finish(vals[i], s0, b0, dst, sc)
            v1 = finish(vals[i + 1], s1, b1, dst, sc)
            addr = buf + ((16 * w + g + 8 * half) * ROW + piece)
            if dst.out_dtype == ty.f32:
                ty.store(ty.ptr_cast(addr, ty.f32), (v0, v1))
            else:
                ty.store(ty.ptr_cast(addr, ty.b32), ty.pack2(v0, v1, dst.out_dtype))


@ty.func
def store_tile(acc, dst, sc, smem, seq, row0, col0):
    """Stage and TMA-store every chunk through two alternating buffers; ``seq`` counts this
    consumer's chunks so far (the buffer parity). Per chunk: the leader waits until the store that
    last read the buffer is done reading, the warpgroup syncs, writes, fences the writes to the
    async proxy, syncs, and the leader issues the store."""
    c = ty.warpgroup_idx() - 1
    leader = (ty.thread_idx() & 127) == 0
    if sc.form == "tensor":
        s = ty.mul(sc.sa[0], sc.sb[0], rounding="rn")
        row_scale = (s, s)
    elif sc.form == "row":
        r0, r1 = thread_rows(row0)
        row_scale = (ty.load(sc.sa + ty.cast(r0, ty.i64) * sc.sa_m, mask=r0 < sc.m),
                     ty.load(sc.sa + ty.cast(r1, ty.i64) * sc.sa_m, mask=r1 < sc.m))
    else:
        row_scale = (1.0, 1.0)
    for j in range(dst.epi_chunks):
        buf = smem + (dst.epi + (2 * c) * EPI_BUF) + ((seq + j) & 1) * EPI_BUF
        if leader:
            hopper.bulk_wait(1, read=True)
        ty.barrier_sync(EPILOGUE_BARRIER + c, 128)
        stage_chunk(acc, dst, sc, buf, j, col0, row_scale)
        hopper.fence_proxy_async()
        ty.barrier_sync(EPILOGUE_BARRIER + c, 128)
        if leader:
            hopper.tma_store(dst.tm_c, buf, col0 + dst.epi_cols * j, row0)
            hopper.bulk_commit()
    return seq + dst.epi_chunks


@ty.func
def consumer(smem, dst, sc, tiles, lay, plan, atom):
    hopper.setmaxnreg(REGISTERS[1], increase=True)
    c = ty.warpgroup_idx() - 1
    base = ty.address(smem)
    row_off = c * (BLOCK_M // CONSUMERS)
    ring = OperandRing(smem, base, atom, lay, plan.stages, row_off)
    it = 0
    seq = 0
    for local in range(my_tiles(tiles.num_m * tiles.num_n)):
        tm, tn = tile_of(ty.block_idx(0) + local * ty.grid_dim(0), tiles.num_m, tiles.num_n, tiles.group_m)
        row0 = tm * BLOCK_M + row_off
        col0 = tn * plan.block_n
        if plan.promote:
            acc = promoted(ring, it, tiles.k_blocks, sc, row0, col0)
        else:
            acc = chained(ring, it, tiles.k_blocks)
        seq = store_tile(acc, dst, sc, smem, seq, row0, col0)
        it = it + tiles.k_blocks
    if (ty.thread_idx() & 127) == 0:
        hopper.bulk_wait(0)   # the staging buffers must outlive the last stores' reads


@ty.kernel(threads=THREADS, min_blocks_per_sm=1, noalias=True, arch="sm_90a")
def gemm_fp8_sm90(tm_a: ty.tensormap, tm_b: ty.tensormap, tm_c: ty.tensormap, bias: ty.ptr(ty.u8),
                  scale_a: ty.ptr(ty.f32), scale_b: ty.ptr(ty.f32), m: ty.i32, n: ty.i32, k: ty.i32,
                  sa_m: ty.i64, sa_k: ty.i64, sb_k: ty.i64, sb_n: ty.i64,
                  A_DTYPE: ty.constexpr = ty.e4m3, B_DTYPE: ty.constexpr = ty.e4m3, OUT_DTYPE: ty.constexpr = ty.bf16,
                  SCALE: ty.constexpr = "tensor", PROMOTE: ty.constexpr = False, HAS_BIAS: ty.constexpr = False,
                  BIAS_DTYPE: ty.constexpr = ty.f32, BLOCK_N: ty.constexpr = 256, STAGES: ty.constexpr = 4,
                  GROUP_M: ty.constexpr = 8):
    """C = scale(A B) + bias for A (M x K) and B (N x K in memory) fp8 behind the tensor maps.
    Scale strides are in elements: scale_a[r, kb] at r sa_m + kb sa_k, scale_b[kb, j] at
    kb sb_k + j sb_n (row form: scale_a[r] at r sa_m, scale_b[n] at n sb_n)."""
    if SCALE not in SCALES:
        raise ValueError(f"SCALE expects one of {SCALES}, but got {SCALE!r}")
    if SCALE == "block" and not PROMOTE:
        raise ValueError("SCALE='block' applies the scales while promoting: it expects PROMOTE=True")
    plan = Fp8Plan(BLOCK_N, STAGES, OUT_DTYPE.name, PROMOTE)
    lay = (plan.a_bytes, plan.b_bytes, plan.b, plan.full, plan.empty)
    smem = ty.dynamic_shared(ty.u8, plan.total, align=1024)
    if ty.thread_idx() == 0:
        hopper.ring_init(smem, hopper.Ring(plan.full, plan.empty, STAGES), CONSUMERS)
    ty.syncthreads()
    num_m = (m + (BLOCK_M - 1)) // BLOCK_M
    num_n = (n + (BLOCK_N - 1)) // BLOCK_N
    k_blocks = (k + (BLOCK_K - 1)) // BLOCK_K
    tiles = TileGrid(BLOCK_M, BLOCK_N, num_m, num_n, k_blocks, GROUP_M)
    if ty.warpgroup_idx() == 0:
        producer(smem, tm_a, tm_b, tiles, lay, STAGES, REGISTERS)
    else:
        atom = hopper.WgmmaAtom(BLOCK_N, A_DTYPE, "ss", b_dtype=B_DTYPE)
        dst = Output(tm_c, bias, n, (OUT_DTYPE, HAS_BIAS, BIAS_DTYPE), (plan.epi_cols, plan.epi_chunks, plan.epi))
        sc = Scales(SCALE, (scale_a, sa_m, sa_k), (scale_b, sb_k, sb_n), (m, n))
        consumer(smem, dst, sc, tiles, lay, plan, atom)
