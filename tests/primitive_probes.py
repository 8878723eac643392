"""Probes and helpers shared by the CPU and GPU tiers of the tests (moved here so that no test
module imports another)."""
import re
import numpy as np
import pytest
import torch
import tylopy as ty
from tylopy.codegen.ptxas import assemble
from tylopy.emulate import MemoryAccessError, ProtocolError
from tylopy.errors import CompileError
from emulate_dsl import line_of
from tylopy.emulate import ProtocolError
from tylopy.semantics import warp as W
from tylopy import hopper
from tylopy.errors import KernelSourceError
from tylopy.runtime.tensormap import TensorMapSpec
from tylopy.semantics.tensorcore import mma_f32


# -- from test_primitives_atomics ------------------------------------------------------------

NP = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "f32": np.float32, "f64": np.float64}


def int_atomics(dtype):
    @ty.kernel(threads=32)
    def int_atomic_kernel(mem: ty.ptr(dtype), x: ty.ptr(dtype), old: ty.ptr(dtype), OP: ty.constexpr,
                          SLOTS: ty.constexpr):
        t = ty.thread_idx()
        p = mem + t % SLOTS
        if OP == "add":
            old[t] = ty.atomic_add(p, x[t])
        elif OP == "min":
            old[t] = ty.atomic_min(p, x[t])
        elif OP == "max":
            old[t] = ty.atomic_max(p, x[t])
        elif OP == "and":
            old[t] = ty.atomic_and(p, x[t])
        elif OP == "or":
            old[t] = ty.atomic_or(p, x[t])
        elif OP == "xor":
            old[t] = ty.atomic_xor(p, x[t])
        elif OP == "exch":
            old[t] = ty.atomic_exch(p, x[t])
        elif OP == "inc":
            old[t] = ty.atomic_inc(p, x[t])
        else:
            old[t] = ty.atomic_dec(p, x[t])
    return int_atomic_kernel


INT_KERNELS = {n: int_atomics(getattr(ty, n)) for n in ("i32", "u32", "i64", "u64")}


LEGAL = {"add": ("i32", "u32", "u64"), "min": ("i32", "u32", "i64", "u64"), "max": ("i32", "u32", "i64", "u64"),
         "and": ("i32", "u32", "i64", "u64"), "or": ("i32", "u32", "i64", "u64"), "xor": ("i32", "u32", "i64", "u64"),
         "exch": ("i32", "u32", "i64", "u64"), "inc": ("u32",), "dec": ("u32",)}


@ty.kernel(threads=128)
def counters(ctr: ty.ptr(ty.u32), old: ty.ptr(ty.u32), K: ty.constexpr):
    t = ty.thread_idx()
    if t % 2 == 0:  # a diverged warp: only the active lanes update
        old[t] = ty.atomic_add(ctr + t % K, 1)


@ty.kernel(threads=32)
def cas_lock(lock: ty.ptr(ty.i32), old: ty.ptr(ty.i32)):
    t = ty.thread_idx()
    old[t] = ty.atomic_cas(lock, 0, t + 1, sem="acquire")


def to_words(vals, dtype):
    return torch.from_numpy(np.asarray(vals, np.float32)).to(dtype).view(torch.int16).numpy().view(np.uint32)


# -- from test_primitives_warp ------------------------------------------------------------

@ty.kernel(threads=128)
def votes(pred: ty.ptr(ty.i32), out: ty.ptr(ty.u32)):
    t = ty.thread_idx()
    p = pred[t] != 0
    out[5 * t] = ty.ballot(p)
    out[5 * t + 1] = ty.cast(ty.vote_all(p), ty.u32)
    out[5 * t + 2] = ty.cast(ty.vote_any(p), ty.u32)
    out[5 * t + 3] = ty.cast(ty.vote_uni(p), ty.u32)
    out[5 * t + 4] = ty.activemask()


@ty.kernel(threads=48)
def partial_warp_votes(out: ty.ptr(ty.u32)):
    t = ty.thread_idx()
    out[2 * t] = ty.ballot(t >= 0)
    out[2 * t + 1] = ty.cast(ty.vote_all(t >= 32), ty.u32)


@ty.kernel(threads=32)
def lanes_here(out: ty.ptr(ty.u32)):
    t = ty.thread_idx()
    out[t] = 7
    if t % 3 == 0:
        out[t] = ty.activemask()


@ty.kernel(threads=64)
def matches(v32: ty.ptr(ty.u32), v64: ty.ptr(ty.u64), f: ty.ptr(ty.f32), out: ty.ptr(ty.u32)):
    t = ty.thread_idx()
    out[5 * t] = ty.match_any(v32[t])
    m, same = ty.match_all(v32[t])
    out[5 * t + 1] = m
    out[5 * t + 2] = ty.cast(same, ty.u32)
    out[5 * t + 3] = ty.match_any(v64[t])
    out[5 * t + 4] = ty.match_any(f[t])


def reducer(dtype):
    @ty.kernel(threads=64)
    def reduce_kernel(x: ty.ptr(dtype), out: ty.ptr(dtype), OP: ty.constexpr):
        t = ty.thread_idx()
        out[t] = ty.warp_reduce(OP, x[t])
    return reduce_kernel


REDUCERS = {name: reducer(getattr(ty, name)) for name in ("f32", "f64", "i32", "u32", "i64", "u64")}


# -- from test_primitives_async_copy ------------------------------------------------------------

@ty.kernel(threads=32)
def cp_probe(src: ty.ptr(ty.u8), take: ty.ptr(ty.i32), out: ty.ptr(ty.u8), NBYTES: ty.constexpr = 16,
             CACHE: ty.constexpr = None, CONST_TAKE: ty.constexpr = -1):
    """Lane l copies NBYTES from src + NBYTES l to its slot with src_bytes take[l] (or a constant)."""
    smem = ty.shared(ty.u8, 32 * 16, align=16)
    lane = ty.lane_id()
    for k in range(16):
        smem[lane * 16 + k] = ty.cast(0xAB, ty.u8)  # a canary under every destination
    ty.syncthreads()
    n = take[lane] if CONST_TAKE < 0 else (None if CONST_TAKE == NBYTES else CONST_TAKE)
    ty.cp_async(smem + lane * NBYTES, src + lane * NBYTES, NBYTES, src_bytes=n, cache=CACHE)
    ty.cp_async_commit()
    ty.cp_async_wait(0)
    ty.syncthreads()
    for k in range(16):
        out[lane * 16 + k] = smem[((lane + 5) & 31) * 16 + k]  # read another lane's bytes: needs the sync


def run_cp(nbytes, const_take=-1, device="cpu", seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 255, 32 * 16, dtype=np.uint8)
    take = rng.integers(0, nbytes + 1, 32).astype(np.int32) if const_take < 0 else np.full(32, const_take, np.int32)
    out = torch.zeros(32 * 16, dtype=torch.uint8, device=device)
    args = (torch.from_numpy(src).to(device), torch.from_numpy(take).to(device), out)
    if device == "cpu":
        cp_probe.emulate(*args, grid=1, NBYTES=nbytes, CONST_TAKE=const_take)
    else:
        from conftest import for_this_gpu
        for_this_gpu(cp_probe)[(1,)](*args, NBYTES=nbytes, CONST_TAKE=const_take)
        torch.cuda.synchronize()
    return src, take, out.cpu().numpy()


ROWS, COLS = 16, 32  # the TMA-store box: 16 rows of 32 f32


@ty.kernel(threads=128, arch="sm_90a")
def tma_store_probe(dst: ty.tensormap, x: ty.i32, y: ty.i32, REDUCE: ty.constexpr = None, FENCE: ty.constexpr = True):
    """Every thread writes 4 elements of the box (value 1000 row + col + 0.5), then thread 0 stores it."""
    tile = ty.shared(ty.f32, ROWS * COLS, align=128)
    tid = ty.thread_idx()
    for k in range(ROWS * COLS // 128):
        e = tid + 128 * k
        tile[e] = ty.cast(1000 * (e // COLS) + e % COLS, ty.f32) + 0.5
    if FENCE:
        hopper.fence_proxy_async()  # my generic writes -> visible to the TMA engine (async proxy)
    ty.syncthreads()
    if tid == 0:
        hopper.tma_store(dst, tile, x, y, reduce=REDUCE)
        hopper.bulk_commit()
        hopper.bulk_wait(0, read=True)  # the tile may be reused (or freed at exit) after this
    ty.syncthreads()


def store_map(t):
    rows, cols = t.shape
    return TensorMapSpec(t, (cols, rows), (cols * 4,), (COLS, ROWS), "f32", 0)


def box_values():
    r, c = np.meshgrid(np.arange(ROWS), np.arange(COLS), indexing="ij")
    return (1000 * r + c + 0.5).astype(np.float32)


# -- from test_primitives_matrix ------------------------------------------------------------

LANE = np.arange(32)


TORCH = {"bf16": torch.bfloat16, "f16": torch.float16}


TY = {"bf16": ty.bf16, "f16": ty.f16}


def _word(p, index):
    """The b32 word of two 16-bit loads (raw bits): element ``index[0]`` low, ``index[1]`` high."""
    lo = ty.cast(ty.bitcast(p[index[0]], ty.u16), ty.u32)
    hi = ty.cast(ty.bitcast(p[index[1]], ty.u16), ty.u32)
    return ty.bitcast(lo | (hi << 16), ty.b32)


@ty.kernel(threads=32)
def mma_probe(a: ty.ptr(ty.i16), b: ty.ptr(ty.i16), c: ty.ptr(ty.f32), d: ty.ptr(ty.f32),
              DTYPE: ty.constexpr = ty.bf16, SHAPE: ty.constexpr = "m16n8k8"):
    """D = A B + C for one atom; A (16xK), B (Kx8) as raw 16-bit bits, row-major; fragments by the ISA."""
    atom = ty.MmaSyncAtom(DTYPE, SHAPE)
    K = atom.mnk[2]
    lane = ty.lane_id()
    g, t = lane >> 2, lane & 3
    if SHAPE == "m16n8k16":
        aw = [_word(a, [(g + 8 * (r & 1)) * K + 2 * t + h + 8 * (r >> 1) for h in range(2)]) for r in range(4)]
        bw = [_word(b, [(2 * t + h + 8 * r) * 8 + g for h in range(2)]) for r in range(2)]
    else:
        aw = [_word(a, [(g + 8 * r) * K + 2 * t + h for h in range(2)]) for r in range(2)]
        bw = [_word(b, [(2 * t + h) * 8 + g for h in range(2)])]
    cv = [c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] for i in range(4)]
    out = ty.mma(atom, atom.a_fragment(aw), atom.b_fragment(bw), atom.c_fragment(cv))
    for i in range(4):
        d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = out.values[i]


def mma_inputs(dtype, shape, seed=0):
    k = 16 if shape == "m16n8k16" else 8
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(16, k, generator=gen).to(TORCH[dtype])
    b = torch.randn(k, 8, generator=gen).to(TORCH[dtype])
    c = torch.randn(16, 8, generator=gen)
    return a, b, c


def run_mma_probe(dtype, shape, device="cpu", seed=0):
    a, b, c = mma_inputs(dtype, shape, seed)
    d = torch.full((16, 8), float("nan"), device=device)
    args = (a.view(torch.int16).to(device), b.view(torch.int16).to(device), c.to(device), d)
    if device == "cpu":
        mma_probe.emulate(*args, grid=1, DTYPE=TY[dtype], SHAPE=shape)
    else:
        from conftest import for_this_gpu
        for_this_gpu(mma_probe)[(1,)](*args, DTYPE=TY[dtype], SHAPE=shape)
        torch.cuda.synchronize()
    return a, b, c, d.cpu()


def row_slots(num, seed):
    """Shared slots (16 bytes each, 32 of them) of the rows: lane 8j + i gives row i of matrix j.
    A permutation, so rows sit anywhere (as in a swizzled tile); lanes past 8 num get a valid but
    unused slot, which must not matter."""
    perm = np.random.default_rng(seed).permutation(32).astype(np.int32)
    return np.where(LANE < 8 * num, perm, perm[0]).astype(np.int32)


@ty.kernel(threads=32)
def ldmatrix_probe(src: ty.ptr(ty.i16), slots: ty.ptr(ty.i32), out: ty.ptr(ty.i32),
                   NUM: ty.constexpr = 4, TRANS: ty.constexpr = False):
    """smem (32 rows of 8 x 16 bit) <- src; each lane loads with its row slot; out[j * 32 + lane] = word j."""
    smem = ty.shared(ty.i16, 256, align=16)
    lane = ty.lane_id()
    for k in range(8):
        smem[lane * 8 + k] = src[lane * 8 + k]
    ty.syncthreads()
    words = ty.ldmatrix(smem + slots[lane] * 8, NUM, trans=TRANS)
    words = (words,) if NUM == 1 else words
    for j in range(NUM):
        out[j * 32 + lane] = ty.bitcast(words[j], ty.i32)


def run_ldmatrix(num, trans, device="cpu", seed=1):
    mem = np.random.default_rng(seed).integers(0, 1 << 16, (32, 8)).astype(np.uint16)
    slots = row_slots(num, seed)
    out = torch.zeros(32 * num, dtype=torch.int32, device=device)
    args = (torch.from_numpy(mem.view(np.int16).ravel().copy()).to(device), torch.from_numpy(slots).to(device), out)
    if device == "cpu":
        ldmatrix_probe.emulate(*args, grid=1, NUM=num, TRANS=trans)
    else:
        from conftest import for_this_gpu
        for_this_gpu(ldmatrix_probe)[(1,)](*args, NUM=num, TRANS=trans)
        torch.cuda.synchronize()
    return mem, slots, out.cpu().numpy().view(np.uint32).reshape(num, 32)


@ty.kernel(threads=32, arch="sm_90a")
def stmatrix_probe(words: ty.ptr(ty.i32), slots: ty.ptr(ty.i32), out: ty.ptr(ty.i16),
                   NUM: ty.constexpr = 4, TRANS: ty.constexpr = False):
    """Each lane stores its NUM words with its row slot; then the whole 512-byte buffer goes to out."""
    smem = ty.shared(ty.i16, 256, align=16)
    lane = ty.lane_id()
    for k in range(8):
        smem[lane * 8 + k] = ty.cast(-1, ty.i16)
    ty.syncthreads()
    ty.stmatrix(smem + slots[lane] * 8, [ty.bitcast(words[j * 32 + lane], ty.b32) for j in range(NUM)], trans=TRANS)
    ty.syncthreads()
    for k in range(8):
        out[lane * 8 + k] = smem[lane * 8 + k]


def run_stmatrix(num, trans, device="cpu", seed=2):
    words = np.random.default_rng(seed).integers(0, 1 << 32, (num, 32), dtype=np.uint64).astype(np.uint32)
    slots = row_slots(num, seed)
    out = torch.zeros(256, dtype=torch.int16, device=device)
    args = (torch.from_numpy(words.view(np.int32).ravel().copy()).to(device), torch.from_numpy(slots).to(device), out)
    if device == "cpu":
        stmatrix_probe.emulate(*args, grid=1, NUM=num, TRANS=trans)
    else:
        from conftest import for_this_gpu
        for_this_gpu(stmatrix_probe)[(1,)](*args, NUM=num, TRANS=trans)
        torch.cuda.synchronize()
    return words, slots, out.cpu().numpy().view(np.uint16).reshape(32, 8)


@ty.func
def _fill_core_matrices(dst, src, rows, lane_id, threads):
    """rows x 16 (K) 16-bit values, row-major in ``src``, into the no-swizzle K-major layout: 8x8
    core matrices of 128 contiguous bytes; 8-row groups 128 bytes apart (SBO), the two 8-column
    halves of k 16 * rows bytes apart (LBO)."""
    for e in range(lane_id, rows * 16, threads):
        r, k = e // 16, e % 16
        dst[(k // 8) * (rows * 8) + r * 8 + (k % 8)] = src[e]


@ty.kernel(threads=128, arch="sm_90a")
def wgmma_probe(a: ty.ptr(ty.i16), b: ty.ptr(ty.i16), d: ty.ptr(ty.f32), N: ty.constexpr = 64,
                A_FROM: ty.constexpr = "ss", DTYPE: ty.constexpr = ty.bf16):
    """D (64 x N) = A (64 x 16) B (N x 16)^T: one wgmma, B (and A for SS) in no-swizzle shared tiles."""
    smem = ty.shared(ty.i16, 64 * 16 + 256 * 16, align=1024)
    tid = ty.thread_idx()
    a_s, b_s = smem, smem + 64 * 16
    _fill_core_matrices(a_s, a, 64, tid, 128)
    _fill_core_matrices(b_s, b, N, tid, 128)
    hopper.fence_proxy_async()
    ty.syncthreads()
    atom = hopper.WgmmaAtom(N, DTYPE, A_FROM)
    db = hopper.smem_descriptor(ty.address(b_s), lbo=N * 16, sbo=128, swizzle=0)
    w, lane = tid >> 5, tid & 31
    g, t = lane >> 2, lane & 3
    if A_FROM == "ss":
        a_op = hopper.smem_descriptor(ty.address(a_s), lbo=64 * 16, sbo=128, swizzle=0)
    else:  # register A: a_r[h] at row 16w + g + 8 (r & 1), col 2t + h + 8 (r >> 1), as mma.sync's A per warp
        regs = [_word(a, [(16 * w + g + 8 * (r & 1)) * 16 + 2 * t + h + 8 * (r >> 1) for h in range(2)])
                for r in range(4)]
        a_op = ty.Fragment(tuple(regs), ty.WGMMA_A_RS, pack=2, dtype=DTYPE)
    hopper.wgmma_fence()
    acc = hopper.wgmma(atom, None, a_op, db)
    hopper.wgmma_commit()
    acc = hopper.wgmma_wait(0, acc)
    for i in range(N // 2):
        d[(16 * w + g + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * t + (i & 1)] = acc.values[i]


def run_wgmma(n, a_from, dtype="bf16", device="cpu", seed=3):
    gen = torch.Generator().manual_seed(seed + n)
    a = torch.randn(64, 16, generator=gen).to(TORCH[dtype])
    b = torch.randn(n, 16, generator=gen).to(TORCH[dtype])
    d = torch.full((64, n), float("nan"), device=device)
    args = (a.view(torch.int16).to(device), b.view(torch.int16).to(device), d)
    if device == "cpu":
        wgmma_probe.emulate(*args, grid=1, N=n, A_FROM=a_from, DTYPE=TY[dtype])
    else:
        from conftest import for_this_gpu
        for_this_gpu(wgmma_probe)[(1,)](*args, N=n, A_FROM=a_from, DTYPE=TY[dtype])
        torch.cuda.synchronize()
    return a, b, d.cpu()
