"""Two attention forward kernels run end to end in the emulator, against torch, with timings.

``hopper_attention`` is a compact FA3-style warp-specialized kernel (docs/hopper.md):
384 threads, warpgroup 0 produces with TMA through a two-stage ring of full/empty mbarriers,
warpgroups 1 and 2 consume with SS wgmma (S = Q K^T, K-major, 128B swizzle), an online
softmax in the exp2 domain, and RS wgmma (O += P V, P from S's registers, V MN-major);
setmaxnreg moves registers from the producer to the consumers. ``mma_sync_attention`` is the
portable form: four warps of mma.sync m16n8k16, fragments loaded straight from global memory.
Speed targets: one head, N=256 in under a minute; N=128 portable in under ten seconds.
"""
import math
import time

import pytest
import torch

import tylopy as ty
from tylopy.runtime.tensormap import TensorMapSpec
from emulate_dsl import (desc, fence_mbarrier_init, mbar_arrive, mbar_expect_tx, mbar_init, mbar_wait,
                              mma_sync, setmaxnreg, tma_load, wgmma, wgmma_commit, wgmma_fence, wgmma_wait, word_of)

D = 64
KBM, KBN, STAGES = 128, 64, 2
LOG2E = 1.4426950408889634
NEG_INF = float("-inf")
TILE_BYTES = KBN * D * 2


@ty.func
def quad_max(x):
    x = ty.maximum(x, ty.shfl_xor(x, 1))
    return ty.maximum(x, ty.shfl_xor(x, 2))


@ty.func
def quad_sum(x):
    x = x + ty.shfl_xor(x, 1)
    return x + ty.shfl_xor(x, 2)


@ty.func
def online_softmax(scores, valid, m, l, acc, scale_log2, half_of):
    """Update (m, l, acc) with a tile of raw scores; returns the unnormalized p (f32) too.

    ``half_of(i)`` is the row (0 or 1) of score register i; ``valid(i)`` says whether its key exists.
    """
    x = [ty.select(valid(i), scores[i] * scale_log2, NEG_INF) for i in range(len(scores))]
    m_new, shift, alpha = [], [], []
    for h in range(2):
        mx = m[h]
        for i in range(len(x)):
            if half_of(i) == h:
                mx = ty.maximum(mx, x[i])
        mx = quad_max(mx)
        sh = ty.select(mx == NEG_INF, 0.0, mx)  # an empty row never computes -inf - (-inf)
        m_new.append(mx)
        shift.append(sh)
        alpha.append(ty.exp2(m[h] - sh))
    p = [ty.exp2(x[i] - shift[half_of(i)]) for i in range(len(x))]
    l_new = []
    for h in range(2):
        s = l[h] * alpha[h]
        for i in range(len(p)):
            if half_of(i) == h:
                s = s + p[i]
        l_new.append(s)
    acc = [acc[i] * alpha[half_of(i)] for i in range(len(acc))]
    return p, m_new, l_new, acc


# -- Hopper: warp-specialized, TMA + wgmma ------------------------------------------------------------------

@ty.func
def producer(q_map, k_map, v_map, q_s, k_s, v_s, bars, m0, n_tiles):
    if ty.thread_idx() == 0:
        mbar_expect_tx(bars, KBM * D * 2)
        tma_load(q_s, q_map, bars, 0, m0)
        tma_load(q_s + 64 * D, q_map, bars, 0, m0 + 64)
        for j in range(n_tiles):
            s = j % STAGES
            ph = (j // STAGES) & 1
            mbar_wait(bars + 1 + STAGES + s, ph ^ 1)  # K stage free (the first lap passes at once)
            mbar_expect_tx(bars + 1 + s, TILE_BYTES)
            tma_load(k_s + s * (KBN * D), k_map, bars + 1 + s, 0, j * KBN)
            mbar_wait(bars + 1 + 3 * STAGES + s, ph ^ 1)
            mbar_expect_tx(bars + 1 + 2 * STAGES + s, TILE_BYTES)
            tma_load(v_s + s * (KBN * D), v_map, bars + 1 + 2 * STAGES + s, 0, j * KBN)


@ty.func
def consumer(q_s, k_s, v_s, bars, n_tiles, n_keys, scale_log2, o, m0):
    tid = ty.thread_idx()
    wgc = (tid >> 7) - 1
    w, lane = (tid >> 5) & 3, tid & 31
    g, t = lane >> 2, lane & 3
    q_addr = ty.address(q_s + wgc * (64 * D))
    mbar_wait(bars, 0)
    acc = [ty.cast(0.0, ty.f32)] * (D // 2)
    m = [ty.cast(NEG_INF, ty.f32)] * 2
    l = [ty.cast(0.0, ty.f32)] * 2
    for j in range(n_tiles):
        s = j % STAGES
        ph = (j // STAGES) & 1
        mbar_wait(bars + 1 + s, ph)
        k_addr = ty.address(k_s + s * (KBN * D))
        wgmma_fence()
        sc = None
        for kk in ty.static_range(D // 16):
            sc = wgmma(KBN, sc, desc(q_addr + 32 * kk), desc(k_addr + 32 * kk))
        wgmma_commit()
        sc = wgmma_wait(0, sc)
        if tid % 128 == 0:
            mbar_arrive(bars + 1 + STAGES + s)  # release the K stage
        col0 = j * KBN + 2 * t
        p, m, l, acc = online_softmax(sc, lambda i: col0 + 8 * (i >> 2) + (i & 1) < n_keys, m, l, acc,
                                      scale_log2, lambda i: (i >> 1) & 1)
        mbar_wait(bars + 1 + 2 * STAGES + s, ph)
        v_addr = ty.address(v_s + s * (KBN * D))
        wgmma_fence()
        for kk in ty.static_range(KBN // 16):
            a = [ty.pack2(p[8 * kk + 2 * r], p[8 * kk + 2 * r + 1], ty.bf16) for r in range(4)]
            acc = wgmma(D, acc, a, desc(v_addr + 2048 * kk), trans_b=1)
        wgmma_commit()
        acc = wgmma_wait(0, acc)
        if tid % 128 == 0:
            mbar_arrive(bars + 1 + 3 * STAGES + s)  # release the V stage
    inv = []
    for h in range(2):
        lh = quad_sum(l[h])
        inv.append(ty.select(lh > 0.0, ty.rcp(lh), 0.0))
    for i in ty.static_range(D // 2):
        row = m0 + 64 * wgc + 16 * w + g + 8 * ((i >> 1) & 1)
        o[row * D + 8 * (i >> 2) + 2 * t + (i & 1)] = acc[i] * inv[(i >> 1) & 1]


@ty.kernel(threads=384, min_blocks_per_sm=1)
def hopper_attention(q_map: ty.tensormap, k_map: ty.tensormap, v_map: ty.tensormap, o: ty.ptr(ty.f32),
                     n_keys: ty.i32, scale_log2: ty.f32):
    smem = ty.dynamic_shared(ty.bf16, (KBM + 2 * STAGES * KBN) * D * 2, align=1024)
    bars = ty.shared(ty.u64, 1 + 4 * STAGES, align=8)  # q_full, k_full[S], k_empty[S], v_full[S], v_empty[S]
    q_s = smem
    k_s = smem + KBM * D
    v_s = k_s + STAGES * KBN * D
    m0 = ty.block_idx() * KBM
    n_tiles = (n_keys + KBN - 1) // KBN
    if ty.thread_idx() == 0:
        mbar_init(bars, 1)
        for s in ty.static_range(STAGES):
            mbar_init(bars + 1 + s, 1)
            mbar_init(bars + 1 + STAGES + s, 2)  # one elected thread per consumer warpgroup
            mbar_init(bars + 1 + 2 * STAGES + s, 1)
            mbar_init(bars + 1 + 3 * STAGES + s, 2)
        fence_mbarrier_init()
    ty.syncthreads()
    if ty.warpgroup_idx() == 0:
        setmaxnreg(24, False)
        producer(q_map, k_map, v_map, q_s, k_s, v_s, bars, m0, n_tiles)
    else:
        setmaxnreg(240, True)
        consumer(q_s, k_s, v_s, bars, n_tiles, n_keys, scale_log2, o, m0)


def reference(q, k, v):
    s = (q.double() @ k.double().T) / math.sqrt(q.shape[1])
    return torch.softmax(s, dim=1) @ v.double()


def tile_map(t, rows=64):
    return TensorMapSpec(t, (t.shape[1], t.shape[0]), (t.shape[1] * 2,), (t.shape[1], rows), "bf16", 128)


@pytest.mark.parametrize("n", [256, 200])
def test_hopper_attention_one_head(n, capsys):
    torch.manual_seed(5)
    q, k, v = (torch.randn(n, D).to(torch.bfloat16) for _ in range(3))
    o = torch.zeros(n + (-n % KBM), D)  # whole CTAs of output rows
    t0 = time.perf_counter()
    report = hopper_attention.emulate(tile_map(q), tile_map(k), tile_map(v), o, n, LOG2E / math.sqrt(D),
                                      grid=(-(-n // KBM),))
    dt = time.perf_counter() - t0
    err = (o[:n].double() - reference(q, k, v)).abs().max().item()
    with capsys.disabled():
        print(f"\n[emulate timings] Hopper attention, one head, N={n}, D={D}: {dt:.2f} s "
              f"({len(report.ctas)} CTAs x 12 warps), max error {err:.2e}")
    assert err < 2e-2
    assert dt < 60
    assert not report.notes


# -- portable: mma.sync m16n8k16 -------------------------------------------------------------------------------

@ty.kernel(threads=128)
def mma_sync_attention(q: ty.ptr(ty.bf16), k: ty.ptr(ty.bf16), v: ty.ptr(ty.bf16), o: ty.ptr(ty.f32),
                       n_keys: ty.i32, scale_log2: ty.f32):
    lane = ty.lane_id()
    w = ty.thread_idx() >> 5
    g, t = lane >> 2, lane & 3
    row0 = ty.block_idx() * 64 + 16 * w
    q32, k32 = ty.ptr_cast(q, ty.b32), ty.ptr_cast(k, ty.b32)
    # A fragments of Q for the D/16 k-steps: a_r = row g + 8(r&1), columns 2t + 8(r>>1) (+1)
    qa = [[q32[((row0 + g + 8 * (r & 1)) * D + 16 * kk + 2 * t + 8 * (r >> 1)) >> 1] for r in range(4)]
          for kk in range(D // 16)]
    zero = ty.cast(0.0, ty.f32)
    acc = [zero] * (4 * (D // 8))  # O: D/8 n-tiles of 4 registers
    m = [ty.cast(NEG_INF, ty.f32)] * 2
    l = [zero] * 2
    for j in range(0, n_keys, 64):
        sc = []
        for nt in ty.static_range(8):  # S = Q K^T, 8 n-tiles of 8 keys
            key = j + 8 * nt + g
            c = [zero] * 4
            for kk in ty.static_range(D // 16):
                b = [k32[(key * D + 16 * kk + 2 * t + 8 * r) >> 1] for r in range(2)]
                c = mma_sync(qa[kk], b, c)
            sc = sc + c
        p, m, l, acc = online_softmax(sc, lambda i: j + 8 * (i >> 2) + 2 * t + (i & 1) < n_keys, m, l, acc,
                                      scale_log2, lambda i: i >> 1 & 1)
        for kk in ty.static_range(4):  # O += P V over 16 keys per step; P's C registers become A
            a = [ty.pack2(p[8 * kk + 0], p[8 * kk + 1], ty.bf16), ty.pack2(p[8 * kk + 2], p[8 * kk + 3], ty.bf16),
                 ty.pack2(p[8 * kk + 4], p[8 * kk + 5], ty.bf16), ty.pack2(p[8 * kk + 6], p[8 * kk + 7], ty.bf16)]
            for nt in ty.static_range(D // 8):
                key = j + 16 * kk + 2 * t
                col = 8 * nt + g
                b = [word_of(v[(key + 8 * r) * D + col], v[(key + 8 * r + 1) * D + col]) for r in range(2)]
                acc[4 * nt:4 * nt + 4] = mma_sync(a, b, acc[4 * nt:4 * nt + 4])
    inv = []
    for h in range(2):
        lh = quad_sum(l[h])
        inv.append(ty.select(lh > 0.0, ty.rcp(lh), 0.0))
    for i in ty.static_range(4 * (D // 8)):
        row = row0 + g + 8 * ((i >> 1) & 1)
        o[row * D + 8 * (i >> 2) + 2 * t + (i & 1)] = acc[i] * inv[(i >> 1) & 1]


def test_mma_sync_attention_n128(capsys):
    torch.manual_seed(6)
    n = 128
    q, k, v = (torch.randn(n, D).to(torch.bfloat16) for _ in range(3))
    o = torch.zeros(n, D)
    t0 = time.perf_counter()
    mma_sync_attention.emulate(q, k, v, o, n, LOG2E / math.sqrt(D), grid=(n // 64,))
    dt = time.perf_counter() - t0
    err = (o.double() - reference(q, k, v)).abs().max().item()
    with capsys.disabled():
        print(f"\n[emulate timings] mma.sync attention, N={n}, D={D}: {dt:.2f} s, max error {err:.2e}")
    assert err < 2e-2
    assert dt < 10
