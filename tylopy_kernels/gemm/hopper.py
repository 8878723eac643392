"""Warp-specialized GEMM for Hopper (sm_90a): C = epilogue(A @ B + bias), fp32 accumulation.

One persistent CTA per SM (384 threads) walks output tiles in a grouped order:

1. Warpgroup 0 is the producer. It gives registers back (``setmaxnreg.dec``) and one thread
   streams the k-blocks (64 wide) of A and B with TMA through a ring of ``STAGES`` shared-memory
   stages (128-byte swizzle), each with a full and an empty mbarrier. The ring runs on across
   tiles, so the next tile's operands load while the consumers finish the current one.
2. Warpgroups 1 and 2 are consumers (``setmaxnreg.inc``). ``cooperative``: both work on every
   tile, each on half of its rows. ``pingpong``: they take whole tiles in turn, and a named
   barrier hands the tensor cores from one to the other after its last wgmma is issued, so one
   consumer's epilogue runs under the other's main loop.
3. Main loop of a consumer: per k-block, wait for the stage, issue 4 x (WM/64) SS wgmmas
   (m64 n{WN} k16; A and B read K-major or MN-major through their descriptors), commit, wait
   until only this k-block's group is in flight (the previous one is done) and release the
   previous stage. After the last k-block: wait for all, release.
4. Epilogue: add the bias (per column), apply ``EPILOGUE`` (a function of one f32 written in the
   DSL), round to ``OUT_DTYPE`` and store the rows and columns that exist: straight from
   registers (``STORE="direct"``) or through a swizzled shared-memory buffer and TMA stores
   (``STORE="tma"``).

Tails: TMA zero-fills rows and k-columns past the tensor maps' bounds (a zero product adds
nothing), and the epilogue stores only rows < M and columns < N.

Operand layouts (the tensor maps are made by the launcher, ``launch.py``):
A "k" (row-major M x K): box 64 (k) x BLOCK_M rows, K-major descriptor, +32 B per k16 step.
A "m" (column-major): BLOCK_M/64 boxes of 64 (m) x 64 (k) rows, MN-major (trans-a), +2 KB per k16.
B "n" (row-major K x N): BLOCK_N/64 boxes of 64 (n) x 64 (k), MN-major (trans-b), LBO = 8 KB.
B "k" (column-major, e.g. a Linear weight N x K): box 64 (k) x BLOCK_N rows, K-major.
docs/hopper.md has the descriptor and swizzle rules these rely on.
"""
from typing import Any, NamedTuple

import tylopy as ty
from tylopy import hopper

from tylopy_kernels.gemm.plan import (BLOCK_K, CHUNK_BYTES, CHUNK_ROWS, CONSUMERS, EPILOGUE_BARRIER, REGISTERS, ROW_BYTES, THREADS,
                   TURN_BARRIER, Plan)

CONSUMER_THREADS = 128 * CONSUMERS


@ty.func
def init_barriers(smem, plan):
    if ty.thread_idx() == 0:
        hopper.ring_init(smem, plan.ring, plan.empty_count)
    ty.syncthreads()


class Problem:
    """Run-time sizes of the product and its tile grid (a holder of IR values)."""

    def __init__(self, m, n, k, plan, group_m, split_k):
        self.m, self.n, self.k = m, n, k
        self.num_m = (m + (plan.block_m - 1)) // plan.block_m
        self.num_n = (n + (plan.block_n - 1)) // plan.block_n
        self.k_blocks = (k + (BLOCK_K - 1)) // BLOCK_K
        self.tiles = self.num_m * self.num_n
        self.split_k = split_k                   # compile-time: work units per tile along K
        self.total = self.tiles * split_k if split_k > 1 else self.tiles
        self.group_m = group_m


class Inputs(NamedTuple):
    """A and B as the kernel reads them: their tensor maps, the element dtype and the majors ("k" or
    "m" for A, "k" or "n" for B: how the producer boxes a k-block, how the consumers read it)."""

    tm_a: Any
    tm_b: Any
    dtype: Any
    a_major: str
    b_major: str


class Unit:
    """One unit of work: an output tile (first row and column) and its range of k-blocks."""

    def __init__(self, m0, n0, split, k_first, k_count):
        self.m0, self.n0, self.split, self.k_first, self.k_count = m0, n0, split, k_first, k_count


@ty.func
def tiles_of_this_cta(prob):
    """How many tiles CTA b of G takes: positions b, b + G, b + 2G, ... below the total."""
    g = ty.grid_dim(0)
    b = ty.block_idx(0)
    return ty.select(b < prob.total, (prob.total - b + (g - 1)) // g, 0)


@ty.func
def tile_coords(prob, pos):
    """(tile row, tile column) of tile position ``pos``.

    Positions run through groups of ``group_m`` tile rows column by column, so the tiles in
    flight at one time (consecutive positions on all SMs) share rows of A and columns of B in L2.
    """
    per_group = prob.group_m * prob.num_n
    group = pos // per_group
    first = group * prob.group_m
    rows = ty.minimum(prob.num_m - first, prob.group_m)
    r = pos - group * per_group
    return (first + r % rows), r // rows


@ty.func
def unit_of(prob, plan, local):
    """This CTA's ``local``-th unit of work (positions b, b + G, b + 2G, ...). With split-K the
    ``split_k`` units of one tile are neighbours; split s takes k-blocks [s KT / S, (s + 1) KT / S)."""
    pos = ty.block_idx(0) + local * ty.grid_dim(0)
    if prob.split_k == 1:
        tm, tn = tile_coords(prob, pos)
        return Unit(tm * plan.block_m, tn * plan.block_n, 0, 0, prob.k_blocks)
    tile = pos // prob.split_k
    split = pos - tile * prob.split_k
    tm, tn = tile_coords(prob, tile)
    k_first = (split * prob.k_blocks) // prob.split_k
    k_end = ((split + 1) * prob.k_blocks) // prob.split_k
    return Unit(tm * plan.block_m, tn * plan.block_n, split, k_first, k_end - k_first)


# -- producer ---------------------------------------------------------------------------------------

@ty.func
def load_stage(smem, plan, inputs, it, u, k0):
    """Wait until the stage of ring iteration ``it`` is free, then TMA the k-block from column k0 of
    A's rows and B's columns of unit ``u``."""
    tm_a, tm_b, m0, n0 = inputs.tm_a, inputs.tm_b, u.m0, u.n0
    stage, full = hopper.ring_acquire(smem, plan.ring, it, plan.stage_bytes)
    a_dst = plan.a + stage * plan.a_bytes
    if inputs.a_major == "k":
        hopper.tma_load(smem + a_dst, tm_a, full, k0, m0)
    else:
        for c in range(plan.block_m // CHUNK_ROWS):
            hopper.tma_load(smem + (a_dst + c * CHUNK_BYTES), tm_a, full, m0 + c * CHUNK_ROWS, k0)
    b_dst = plan.b + stage * plan.b_bytes
    if inputs.b_major == "k":
        hopper.tma_load(smem + b_dst, tm_b, full, k0, n0)
    else:
        for c in range(plan.block_n // CHUNK_ROWS):
            hopper.tma_load(smem + (b_dst + c * CHUNK_BYTES), tm_b, full, n0 + c * CHUNK_ROWS, k0)


@ty.func
def producer(smem, plan, prob, inputs, registers):
    hopper.setmaxnreg(registers[0], increase=False)
    if (ty.warp_idx() & 3) == 0:
        if ty.elect_one():
            hopper.prefetch_tensormap(inputs.tm_a)
            hopper.prefetch_tensormap(inputs.tm_b)
            it = 0
            for local in range(tiles_of_this_cta(prob)):
                u = unit_of(prob, plan, local)
                for kb in range(u.k_count):
                    load_stage(smem, plan, inputs, it + kb, u, (u.k_first + kb) * BLOCK_K)
                it = it + u.k_count


# -- consumer main loop -----------------------------------------------------------------------------

class Operands:
    """Where a consumer's wgmma operands sit in a stage, as descriptor pieces (16-byte units)."""

    def __init__(self, plan, a_major, b_major, row_off, col_off):
        self.plan = plan
        self.trans_a = 0 if a_major == "k" else 1
        self.trans_b = 0 if b_major == "k" else 1
        if a_major == "k":   # row r at r * 128 B; a k16 step is 32 B along the swizzled row
            self.a_atom = [(row_off + 64 * am) * ROW_BYTES for am in range(plan.atoms_m)]
            self.a_step, self.a_lbo = 32, 16
        else:                # 64-row chunks of 64 k-rows; a k16 step is 16 k-rows = 2 KB
            self.a_atom = [((row_off + 64 * am) // CHUNK_ROWS) * CHUNK_BYTES for am in range(plan.atoms_m)]
            self.a_step, self.a_lbo = 16 * ROW_BYTES, CHUNK_BYTES
        if b_major == "k":
            self.b_off, self.b_step, self.b_lbo = col_off * ROW_BYTES, 32, 16
        else:                # LBO: the distance between 64-column chunks along N
            self.b_off, self.b_step, self.b_lbo = (col_off // CHUNK_ROWS) * CHUNK_BYTES, 16 * ROW_BYTES, CHUNK_BYTES


@ty.func
def issue_kblock(accs, atom, ops, base, stage):
    """4 k16 steps x WM/64 atoms of SS wgmma on one stage; ``accs`` None entries start from zero."""
    plan = ops.plan
    a_stage = base + ty.cast(plan.a + stage * plan.a_bytes, ty.u32)
    a_desc = [hopper.smem_descriptor(a_stage + ty.cast(ops.a_atom[am], ty.u32), lbo=ops.a_lbo)
              for am in range(plan.atoms_m)]
    b_desc = hopper.smem_descriptor(base + ty.cast(plan.b + stage * plan.b_bytes + ops.b_off, ty.u32),
                                    lbo=ops.b_lbo)
    out = list(accs)
    for kk in range(BLOCK_K // 16):  # descriptors count 16-byte units
        for am in range(plan.atoms_m):
            out[am] = hopper.wgmma(atom, out[am], a_desc[am] + (kk * ops.a_step >> 4), b_desc + (kk * ops.b_step >> 4),
                                   trans_a=ops.trans_a, trans_b=ops.trans_b)
    return out


@ty.func
def release(smem, plan, it, leader):
    """One thread per consumer frees the stage of ring iteration ``it``."""
    if leader:
        hopper.ring_release(smem, plan.ring, it)


@ty.func
def wait_full(smem, plan, it):
    return hopper.ring_wait(smem, plan.ring, it)


@ty.func
def mainloop(smem, base, atom, ops, it0, k_blocks, leader):
    """Issue every k-block of one tile; returns the accumulators, the last k-block still in flight.

    Iteration kb issues k-block kb, then waits until only that group is pending, so k-block
    kb - 1 has finished reading its stage, which is released. The first k-block starts from zero.
    """
    plan = ops.plan
    stage = wait_full(smem, plan, it0)
    hopper.wgmma_fence()
    accs = issue_kblock([None] * plan.atoms_m, atom, ops, base, stage)
    hopper.wgmma_commit()
    for kb in range(1, k_blocks):
        stage = wait_full(smem, plan, it0 + kb)
        hopper.wgmma_fence()
        accs = issue_kblock(accs, atom, ops, base, stage)
        hopper.wgmma_commit()
        accs = hopper.wgmma_wait(1, accs)
        release(smem, plan, it0 + kb - 1, leader)
    return accs


# -- epilogue ---------------------------------------------------------------------------------------

class OutputForm(NamedTuple):
    """The compile-time shape of the output: its dtype, the bias (``has_bias``, its dtype), the
    user's epilogue (None: none) and ``split_k`` (> 1: f32 partial sums, split s in rows
    [s M, (s + 1) M), a 3-D map for TMA)."""

    out_dtype: object
    bias_dtype: object
    has_bias: bool
    epilogue: object
    split_k: int


class Output:
    """What the epilogue needs: sizes, output and bias pointers, the output's tensor map and its
    ``OutputForm`` (whose fields it carries as its own)."""

    def __init__(self, out, ldc, bias, m, n, tm_c, form: OutputForm):
        self.out, self.ldc, self.bias, self.m, self.n = out, ldc, bias, m, n
        self.tm_c = tm_c
        self.out_dtype, self.bias_dtype, self.has_bias, self.epilogue, self.split_k = form


@ty.func
def finish(v, b, dst):
    """bias, then the user's epilogue, in f32."""
    if dst.has_bias:
        v = v + b
    if dst.epilogue is not None:
        v = dst.epilogue(v)
    return v


@ty.func
def bias_pair(dst, col):
    """bias[col], bias[col + 1] as f32 (0 past the end, or without a bias)."""
    if dst.has_bias:
        p = ty.ptr_cast(dst.bias, dst.bias_dtype)
        b0 = ty.cast(ty.load(p + col, mask=col < dst.n), ty.f32)
        b1 = ty.cast(ty.load(p + (col + 1), mask=col + 1 < dst.n), ty.f32)
        return b0, b1
    return 0.0, 0.0


@ty.func
def store_direct(accs, dst, row0, col0, split, plan):
    """Each thread stores its column pairs straight from the accumulator registers.

    Register i of an m64 atom holds row 16w + g + 8((i >> 1) & 1), column 8(i >> 2) + 2t + (i & 1)
    (g = lane / 4, t = lane % 4); a pair (i, i + 1) is two adjacent columns, one 4- or 8-byte
    store. The launcher keeps ldc even, so a pair whose second column is N lands in padding.
    """
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    g = lane >> 2
    t = lane & 3
    if dst.out_dtype == ty.f32:
        out = ty.ptr_cast(dst.out, ty.f32)
    else:
        out = ty.ptr_cast(dst.out, ty.b32)
    split_rows = split * dst.m if dst.split_k > 1 else 0
    for j in range(plan.wn // 8):
        col = col0 + 8 * j + 2 * t
        b0, b1 = bias_pair(dst, col)
        if col < dst.n:
            for am in range(plan.atoms_m):
                vals = accs[am].values
                for half in range(2):
                    row = row0 + 64 * am + 16 * warp + g + 8 * half
                    if row < dst.m:
                        i = 4 * j + 2 * half
                        v0 = finish(vals[i], b0, dst)
                        v1 = finish(vals[i + 1], b1, dst)
                        off = ty.cast(row + split_rows, ty.i64) * dst.ldc + ty.cast(col, ty.i64)
                        if dst.out_dtype == ty.f32:
                            ty.store(out + off, (v0, v1))
                        else:
                            out[off >> 1] = ty.pack2(v0, v1, dst.out_dtype)


@ty.func
def stage_chunk(accs, dst, buf, j, col0, plan):
    """Write columns [j E, (j + 1) E) of this consumer's tile (E = 128 bytes of output) into the
    staging buffer in the TMA's SWIZZLE_128B image: row r at 128 r, 16-byte piece p at p ^ (r % 8).

    Register i holds column 8(i >> 2) + 2t + (i & 1) of row 16w + g + 8((i >> 1) & 1), and r % 8
    is g, so a pair lands at piece (q ^ g) for its 16-byte piece q of the row.
    """
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    g = lane >> 2
    t = lane & 3
    groups = plan.epi_cols // 8       # 8-column groups per chunk: 8 (16-bit) or 4 (f32)
    for q in range(groups):
        col = col0 + 8 * (j * groups + q) + 2 * t
        b0, b1 = bias_pair(dst, col)
        if dst.out_dtype == ty.f32:
            piece = ((2 * q + (t >> 1)) ^ g) * 16 + 8 * (t & 1)
        else:
            piece = ((q ^ g) * 16) + 4 * t
        for am in range(plan.atoms_m):
            vals = accs[am].values
            for half in range(2):
                r = 64 * am + 16 * warp + g + 8 * half
                i = 4 * (j * groups + q) + 2 * half
                v0 = finish(vals[i], b0, dst)
                v1 = finish(vals[i + 1], b1, dst)
                addr = buf + (r * 128 + piece)
                if dst.out_dtype == ty.f32:
                    ty.store(ty.ptr_cast(addr, ty.f32), (v0, v1))
                else:
                    ty.store(ty.ptr_cast(addr, ty.b32), ty.pack2(v0, v1, dst.out_dtype))


@ty.func
def store_tma(me, accs, seq, row0, col0, split):
    """Stage 128-byte-wide column chunks in two alternating buffers and TMA-store each (the TMA
    clips rows >= M and columns >= N). ``seq`` counts consumer ``me``'s chunks so far (buffer parity).

    Per chunk: the leader waits until at most one store is still reading (the other buffer's),
    the warpgroup syncs, writes, fences the writes to the async proxy, syncs, and the leader
    issues the store.
    """
    dst, smem, c, plan, leader = me.dst, me.smem, me.c, me.plan, me.leader
    bar = EPILOGUE_BARRIER + c
    for j in range(plan.epi_chunks):
        parity = (seq + j) & 1
        buf = smem + (plan.epi + (2 * c) * plan.epi_buf_bytes) + parity * plan.epi_buf_bytes
        if leader:
            hopper.bulk_wait(1, read=True)
        ty.barrier_sync(bar, 128)
        stage_chunk(accs, dst, buf, j, col0, plan)
        hopper.fence_proxy_async()
        ty.barrier_sync(bar, 128)
        if leader:
            if dst.split_k > 1:
                hopper.tma_store(dst.tm_c, buf, col0 + j * plan.epi_cols, row0, split)
            else:
                hopper.tma_store(dst.tm_c, buf, col0 + j * plan.epi_cols, row0)
            hopper.bulk_commit()
    return seq + plan.epi_chunks


@ty.func
def store_tile(me, accs, seq, row0, col0, split):
    """The epilogue of consumer ``me``'s unit (rows from row0, columns from col0, split ``split``);
    returns its count of staged chunks."""
    if me.plan.store == "tma":
        return store_tma(me, accs, seq, row0, col0, split)
    store_direct(accs, me.dst, row0, col0, split, me.plan)
    return seq


# -- consumers --------------------------------------------------------------------------------------

class Consumer:
    """What one consumer's units share (a plain holder): the shared memory (pointer and u32
    address), the wgmma atom and ``Operands`` (with the plan), the ``Output``, the consumer's
    index c, its rows' offset in a tile (cooperative; 0 for pingpong) and its leader thread (it
    releases stages and issues stores)."""

    def __init__(self, smem, base, atom, ops, dst, c, row_off, leader):
        self.smem, self.base, self.atom, self.ops, self.plan = smem, base, atom, ops, ops.plan
        self.dst, self.c, self.row_off, self.leader = dst, c, row_off, leader


@ty.func
def run_unit(me, u, it, seq, turn, hand_over):
    """Main loop, final wait and epilogue of consumer ``me``'s unit ``u`` from ring iteration
    ``it``; pingpong (``turn``) takes the tensor-core turn first and hands it over (when
    ``hand_over``) once its last k-block is issued."""
    smem, leader = me.smem, me.leader
    if turn is not None:
        ty.barrier_sync(turn[0], CONSUMER_THREADS)
    accs = mainloop(smem, me.base, me.atom, me.ops, it, u.k_count, leader)
    if turn is not None:
        if hand_over:
            ty.barrier_arrive(turn[1], CONSUMER_THREADS)
    accs = hopper.wgmma_wait(0, accs)
    release(smem, me.plan, it + u.k_count - 1, leader)
    return store_tile(me, accs, seq, u.m0 + me.row_off, u.n0, u.split)


@ty.func
def consumer(smem, plan, prob, dst, wg, inputs, registers):
    hopper.setmaxnreg(registers[1], increase=True)
    c = wg - 1
    base = ty.address(smem)
    atom = hopper.WgmmaAtom(plan.wn, inputs.dtype, "ss")
    leader = (ty.thread_idx() & 127) == 0
    row_off = c * plan.wm if plan.cooperative else 0
    me = Consumer(smem, base, atom, Operands(plan, inputs.a_major, inputs.b_major, row_off, 0), dst, c, row_off,
                  leader)
    n_units = tiles_of_this_cta(prob)
    seq = 0
    if plan.cooperative:
        it = 0
        for local in range(n_units):
            u = unit_of(prob, plan, local)
            seq = run_unit(me, u, it, seq, None, False)
            it = it + u.k_count
    else:
        turn = (TURN_BARRIER + c, TURN_BARRIER + 1 - c)
        if c == 0:
            ty.barrier_arrive(turn[0], CONSUMER_THREADS)  # the first consumer takes the first turn
        if prob.split_k == 1:  # every unit has k_blocks k-blocks: unit j starts at ring iteration j KT
            for local in range(c, n_units, CONSUMERS):
                u = unit_of(prob, plan, local)
                seq = run_unit(me, u, local * prob.k_blocks, seq, turn, local + 1 < n_units)
        else:  # uneven splits: count every unit's k-blocks, run every other one
            it = 0
            for local in range(n_units):
                u = unit_of(prob, plan, local)
                if (local & 1) == c:
                    seq = run_unit(me, u, it, seq, turn, local + 1 < n_units)
                it = it + u.k_count
    if plan.store == "tma":
        if leader:  # the staging buffers must stay until the last stores have read them
            hopper.bulk_wait(0)


def _smem_bytes(BLOCK_M, BLOCK_N, STAGES, SCHEDULE, OUT_DTYPE, STORE):
    return Plan(BLOCK_M, BLOCK_N, STAGES, SCHEDULE, OUT_DTYPE.name, STORE).total


@ty.kernel(threads=THREADS, min_blocks_per_sm=1, noalias=True)
def gemm_sm90(
    tm_a: ty.tensormap, tm_b: ty.tensormap, tm_c: ty.tensormap, out: ty.ptr(ty.u8), bias: ty.ptr(ty.u8),
    m: ty.i32, n: ty.i32, k: ty.i32, ldc: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, OUT_DTYPE: ty.constexpr = ty.bf16, A_MAJOR: ty.constexpr = "k",
    B_MAJOR: ty.constexpr = "n", BLOCK_M: ty.constexpr = 128, BLOCK_N: ty.constexpr = 256,
    STAGES: ty.constexpr = 4, SCHEDULE: ty.constexpr = "cooperative", GROUP_M: ty.constexpr = 8,
    STORE: ty.constexpr = "tma", HAS_BIAS: ty.constexpr = False, BIAS_DTYPE: ty.constexpr = ty.f32,
    EPILOGUE: ty.constexpr = None, REGISTERS: ty.constexpr = REGISTERS, SPLIT_K: ty.constexpr = 1,
):
    """C[m, n] = EPILOGUE(sum_k A[m, k] B[k, n] + bias[n]); one persistent CTA loops over tiles.

    SPLIT_K > 1: each tile is SPLIT_K units over disjoint k-block ranges, each writing f32
    partial sums to rows [s M, (s + 1) M) of ``out`` (no bias, no epilogue): ``splitk.py`` adds
    them up in order, then applies the bias and the epilogue.
    """
    plan = Plan(BLOCK_M, BLOCK_N, STAGES, SCHEDULE, OUT_DTYPE.name, STORE)
    if SPLIT_K > 1 and (OUT_DTYPE != ty.f32 or HAS_BIAS or EPILOGUE is not None):
        raise ValueError("SPLIT_K > 1 writes f32 partial sums: it expects OUT_DTYPE=f32 without bias or epilogue")
    smem = ty.dynamic_shared(ty.u8, plan.total, align=1024)
    prob = Problem(m, n, k, plan, GROUP_M, SPLIT_K)
    dst = Output(out, ldc, bias, m, n, tm_c, OutputForm(OUT_DTYPE, BIAS_DTYPE, HAS_BIAS, EPILOGUE, SPLIT_K))
    inputs = Inputs(tm_a, tm_b, DTYPE, A_MAJOR, B_MAJOR)
    init_barriers(smem, plan)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, plan, prob, inputs, REGISTERS)
    else:
        consumer(smem, plan, prob, dst, wg, inputs, REGISTERS)
