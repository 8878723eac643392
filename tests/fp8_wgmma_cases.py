"""An FP8 wgmma probe kernel and its numpy model, shared by tests/test_fp8_wgmma.py (emulator, ptxas)
and tests/test_fp8_wgmma_gpu.py (the H200 oracle).

``wgmma_fp8_probe``: one warpgroup TMA-loads A (64 x 128) and B (N x 128), both K-major fp8 with
the 128-byte swizzle, and chains four m64nNk32 wgmmas (SS, or RS with A's registers loaded from
global memory) onto an accumulator read from ``c`` (f32 or packed f16) or starting from zero.
``model`` computes the same chain with ``tylopy.semantics.tensorcore.mma_fp8``.
"""
import numpy as np
import torch

import tylopy as ty
from tylopy import hopper
from tylopy.runtime.tensormap import TensorMapSpec
from tylopy.semantics.tensorcore import mma_fp8

K = 128
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
DTYPE = {"e4m3": ty.e4m3, "e5m2": ty.e5m2, "f32": ty.f32, "f16": ty.f16}


@ty.func
def acc_position(i):
    """(row, column) of accumulator element i of this thread (the m64nN layout)."""
    w = ty.warp_idx() & 3
    lane = ty.lane_id()
    return 16 * w + (lane >> 2) + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)


@ty.kernel(threads=128, arch="sm_90a")
def wgmma_fp8_probe(a_map: ty.tensormap, b_map: ty.tensormap, a_glob: ty.ptr(ty.b32), c: ty.ptr(ty.f32),
                    d: ty.ptr(ty.f32), N: ty.constexpr = 64, A: ty.constexpr = ty.e4m3, B: ty.constexpr = ty.e4m3,
                    ACC: ty.constexpr = ty.f32, RS: ty.constexpr = False, ZERO: ty.constexpr = False):
    smem = ty.dynamic_shared(ty.u8, 64 * K + N * K, align=1024)
    bar = ty.shared(ty.u64, 1, align=8)
    tid = ty.thread_idx()
    if tid == 0:
        hopper.mbarrier_init(bar, 1)
        hopper.fence_mbarrier_init()
    ty.syncthreads()
    if tid == 0:
        hopper.mbarrier_arrive_expect_tx(bar, 64 * K + N * K)
        hopper.tma_load(smem, a_map, bar, 0, 0)
        hopper.tma_load(smem + 64 * K, b_map, bar, 0, 0)
    hopper.mbarrier_wait(bar, 0)
    atom = hopper.WgmmaAtom(N, A, "rs" if RS else "ss", b_dtype=B, acc_dtype=ACC)
    acc = None
    if not ZERO:
        vals = []
        for i in range(N // 2):
            row, col = acc_position(i)
            vals.append(c[row * N + col])
        if ACC == ty.f32:
            acc = ty.Fragment(vals, ty.WARPGROUP, ty.wgmma_acc(N))
        else:
            words = [ty.pack2(vals[2 * j], vals[2 * j + 1], ty.f16) for j in range(N // 4)]
            acc = ty.Fragment(words, ty.WARPGROUP, ty.wgmma_acc(N), pack=2, dtype=ty.f16)
    base = ty.address(smem)
    hopper.wgmma_fence()
    w = ty.warp_idx() & 3
    g, t = ty.lane_id() >> 2, ty.lane_id() & 3
    for kk in range(K // 32):
        b_desc = hopper.smem_descriptor(base + (64 * K + 32 * kk), lbo=16, sbo=1024)
        if RS:  # word r: row 16w + g + 8(r & 1), codes k = 32kk + 4t + 16(r >> 1) .. + 3
            words = [a_glob[((16 * w + g + 8 * (r & 1)) * K + 32 * kk + 4 * t + 16 * (r >> 1)) >> 2] for r in range(4)]
            a = atom.a_fragment(words)
        else:
            a = hopper.smem_descriptor(base + 32 * kk, lbo=16, sbo=1024)
        acc = hopper.wgmma(atom, acc, a, b_desc)
    hopper.wgmma_commit()
    acc = hopper.wgmma_wait(0, acc)
    if ACC == ty.f32:
        for i in range(N // 2):
            row, col = acc_position(i)
            d[row * N + col] = acc.values[i]
    else:
        for j in range(N // 4):
            lo, hi = ty.unpack2(acc.values[j], ty.f16)
            row, col = acc_position(2 * j)
            ty.store(d + (row * N + col), (lo, hi))


def inputs(n: int, a_fmt: str, b_fmt: str, acc: str, seed: int = 0):
    """Random codes over the formats' whole finite range (wide exponents, subnormals, signed zeros,
    cancellation) for A (64 x K), B (n x K) and an initial accumulator c (64 x n)."""
    rng = np.random.default_rng(seed)

    def codes(shape, fmt):
        top = 0x7E if fmt == "e4m3" else 0x7B
        if acc == "f16":  # keep sums inside f16's range: |codes| up to 2**3 (e4m3) or 2**5 (e5m2)
            top = 0x58 if fmt == "e4m3" else 0x50
        mag = rng.integers(0, top + 1, shape)
        mag = np.where(rng.random(shape) < 0.6, rng.integers(0x30, 0x48, shape), mag)  # many near 1
        return torch.from_numpy((mag | (rng.integers(0, 2, shape) << 7)).astype(np.uint8)).view(TORCH_FP8[fmt])

    a, b = codes((64, K), a_fmt), codes((n, K), b_fmt)
    c = (rng.standard_normal((64, n)) * 2.0 ** rng.integers(-6, 10 if acc == "f32" else 6, (64, n))).astype(np.float32)
    if acc == "f16":
        c = c.astype(np.float16).astype(np.float32)
    return a, b, torch.from_numpy(c)


def maps(a, b, on_gpu: bool):
    """Tensor maps (emulator specs, or encoded maps for the GPU) of the K-major fp8 tiles."""
    specs = [TensorMapSpec(t, (K, t.shape[0]), (K,), (K, t.shape[0]), "e4m3" if t.dtype == TORCH_FP8["e4m3"]
                           else "e5m2", 128) for t in (a, b)]
    if not on_gpu:
        return specs
    from tylopy.runtime.tensormap import TensorMap
    return [TensorMap.encode(s) for s in specs]


def run(n, a_fmt, b_fmt, acc="f32", rs=False, zero=False, device="cpu", seed=0):
    a, b, c = inputs(n, a_fmt, b_fmt, acc, seed)
    d = torch.full((64, n), float("nan"))
    kw = dict(N=n, A=DTYPE[a_fmt], B=DTYPE[b_fmt], ACC=DTYPE[acc], RS=rs, ZERO=zero)
    if device == "cpu":
        wgmma_fp8_probe.emulate(*maps(a, b, False), a.view(torch.uint8).view(torch.int32), c, d,
                                grid=(1,), **kw)
        return a, b, c, d
    ag, bg, cg, dg = (x.cuda() for x in (a, b, c, d))
    wgmma_fp8_probe[(1,)](*maps(ag, bg, True), ag.view(torch.uint8).view(torch.int32), cg, dg,
                          **kw)
    torch.cuda.synchronize()
    return a, b, c, dg.cpu()


def model(a, b, c, a_fmt, b_fmt, acc="f32", zero=False) -> np.ndarray:
    """The chain of four k32 steps by the accumulation model."""
    A = a.float().numpy()
    Bt = b.float().numpy().T
    d = None if zero else c.numpy()
    for kk in range(K // 32):
        d = mma_fp8(A[:, 32 * kk:32 * kk + 32], Bt[32 * kk:32 * kk + 32], d, (a_fmt, b_fmt), acc)
    return d


ALL_N = tuple(range(8, 257, 8))


@ty.kernel(threads=128, arch="sm_90a")
def wgmma_fp8_forms(d: ty.ptr(ty.f32), A: ty.constexpr = ty.e4m3, B: ty.constexpr = ty.e4m3,
                    ACC: ty.constexpr = ty.f32, RS: ty.constexpr = False, NS: ty.constexpr = ALL_N):
    """One wgmma of every N in ``NS`` (for ptxas), each result summed into d so none is dead."""
    smem = ty.dynamic_shared(ty.u8, 64 * 32 + 256 * 32, align=1024)
    base = ty.address(smem)
    a_desc = hopper.smem_descriptor(base, lbo=16, sbo=1024)
    b_desc = hopper.smem_descriptor(base + 64 * 32, lbo=16, sbo=1024)
    words = [ty.bitcast(ty.cast(ty.thread_idx() * (r + 1), ty.u32), ty.b32) for r in range(4)]
    total = 0.0
    for n in NS:
        atom = hopper.WgmmaAtom(n, A, "rs" if RS else "ss", b_dtype=B, acc_dtype=ACC)
        hopper.wgmma_fence()
        acc = hopper.wgmma(atom, None, atom.a_fragment(words) if RS else a_desc, b_desc)
        hopper.wgmma_commit()
        acc = hopper.wgmma_wait(0, acc)
        v = acc.values[len(acc.values) - 1]
        if ACC == ty.f32:
            total = total + v
        else:
            lo, hi = ty.unpack2(v, ty.f16)
            total = total + lo + hi
    d[ty.thread_idx()] = total
