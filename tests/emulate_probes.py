"""Probes and helpers shared by the CPU and GPU tiers of the tests (moved here so that no test
module imports another)."""
import numpy as np
import pytest
import torch
import tylopy as ty
from tylopy.semantics.tensorcore import mma_f32
from tylopy.runtime.tensormap import TensorMapSpec
from emulate_dsl import (desc, fence_mbarrier_init, mbar_expect_tx, mbar_init, mbar_wait, tma_load, wgmma,
                              wgmma_commit, wgmma_fence, wgmma_wait)
from tylopy.emulate import ProtocolError
from emulate_dsl import ldmatrix, line_of, mma_sync, word_of
import math
import time
import re
from emulate_dsl import (bulk_commit, bulk_wait, cp_async, cp_async_commit, cp_async_wait, fence_mbarrier_init,
                              fence_proxy_async, line_of, mbar_arrive, mbar_expect_tx, mbar_init, mbar_wait, tma_load,
                              tma_store)


# -- from test_emulate_hopper ------------------------------------------------------------

def tile_map(t: torch.Tensor, box_rows=64, box_cols=None, swizzle=128):
    """A 2-D tensor map over a row-major (rows, cols) bf16 tensor."""
    rows, cols = t.shape
    box_cols = box_cols or cols
    return TensorMapSpec(t, (cols, rows), (cols * t.element_size(),), (box_cols, box_rows), "bf16", swizzle)


@ty.kernel(threads=32)
def tma_image(src: ty.tensormap, out: ty.ptr(ty.u32), ROW0: ty.constexpr):
    tile = ty.dynamic_shared(ty.u32, 8192, align=1024)
    bar = ty.shared(ty.u64, 1, align=8)
    lane = ty.lane_id()
    if lane == 0:
        mbar_init(bar, 1)
        fence_mbarrier_init()
        mbar_expect_tx(bar, 8192)
        tma_load(tile, src, bar, 0, ROW0)
    mbar_wait(bar, 0)
    for k in range(64):
        out[k * 32 + lane] = tile[k * 32 + lane]


@ty.kernel(threads=128)
def wgmma_ss_rs(q_map: ty.tensormap, k_map: ty.tensormap, v_map: ty.tensormap, s_out: ty.ptr(ty.f32),
                o_out: ty.ptr(ty.f32)):
    """S = Q K^T (SS, K-major), then O = bf16(S) V (RS: P from S's registers; V MN-major, trans-b)."""
    smem = ty.dynamic_shared(ty.bf16, 3 * 8192, align=1024)
    bar = ty.shared(ty.u64, 1, align=8)
    tid = ty.thread_idx()
    q_s, k_s, v_s = smem, smem + 4096, smem + 8192
    if tid == 0:
        mbar_init(bar, 1)
        fence_mbarrier_init()
    ty.syncthreads()
    if tid == 0:
        mbar_expect_tx(bar, 3 * 8192)
        tma_load(q_s, q_map, bar, 0, 0)
        tma_load(k_s, k_map, bar, 0, 0)
        tma_load(v_s, v_map, bar, 0, 0)
    mbar_wait(bar, 0)
    wgmma_fence()
    s = None
    for k in ty.static_range(4):
        s = wgmma(64, s, desc(ty.address(q_s) + 32 * k), desc(ty.address(k_s) + 32 * k))
    wgmma_commit()
    s = wgmma_wait(0, s)
    wgmma_fence()
    o = None
    for kk in ty.static_range(4):
        p = [ty.pack2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1], ty.bf16) for r in range(4)]
        o = wgmma(64, o, p, desc(ty.address(v_s) + 2048 * kk), trans_b=1)
    wgmma_commit()
    o = wgmma_wait(0, o)
    w, lane = tid >> 5, tid & 31
    g, t = lane >> 2, lane & 3
    for i in ty.static_range(32):
        at = (16 * w + g + 8 * ((i >> 1) & 1)) * 64 + 8 * (i >> 2) + 2 * t + (i & 1)
        s_out[at] = s[i]
        o_out[at] = o[i]


# -- from test_emulate_mma ------------------------------------------------------------

def mma_kernel(dt):
    @ty.kernel(threads=32, name=f"mma_tile_{dt}")
    def mma_tile(a: ty.ptr(dt), b: ty.ptr(dt), c: ty.ptr(ty.f32), d: ty.ptr(ty.f32)):
        lane = ty.lane_id()
        g, t = lane >> 2, lane & 3
        # A 16x16 row-major: a_r holds row g + 8(r&1), columns 2t + 8(r>>1) and the next one
        A = [word_of(a[(g + 8 * (r & 1)) * 16 + 2 * t + 8 * (r >> 1)],
                     a[(g + 8 * (r & 1)) * 16 + 2 * t + 8 * (r >> 1) + 1]) for r in range(4)]
        # B 16x8 (K x N) row-major: b_r holds k = 2t + 8r and 2t + 8r + 1 of column g
        B = [word_of(b[(2 * t + 8 * r) * 8 + g], b[(2 * t + 8 * r + 1) * 8 + g]) for r in range(2)]
        C = [c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] for i in range(4)]
        D = mma_sync(A, B, C, dtype=dt.name)
        for i in range(4):
            d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = D[i]
    return mma_tile


MMA = {"bf16": mma_kernel(ty.bf16), "f16": mma_kernel(ty.f16)}


# -- from test_emulate_kernels ------------------------------------------------------------

D = 64


def qkv(b, h, n, seed):
    torch.manual_seed(seed)
    return [torch.randn(b, h, n, D).to(torch.bfloat16) for _ in range(3)]


def _spec(t, dims, strides, box):
    """A tensor map as the launcher describes it, as a spec the emulator reads (no driver)."""
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "bf16" if t.dtype == torch.bfloat16 else "f16", 128)


def emulate_hopper(q, k, v, out, lse, causal, schedule=None):
    """Run the Hopper kernel in the emulator with the arguments ``launch_hopper`` would pass."""
    mod = pytest.importorskip("tylopy_kernels.attention.sm90.forward")
    launch = pytest.importorskip("tylopy_kernels.attention.sm90.launch")
    plan = launch.plan_launch(launch.ForwardTensors(q, k, v, out, lse),
                              launch.HopperOptions(1 / math.sqrt(q.shape[-1]), causal,
                                                   dict({"PERSISTENT": False}, **(schedule or {}))),
                              launch.MapTarget(_spec, sm_count=4))
    return mod.attention_fwd_sm90.emulate(*plan.args, grid=plan.grid, **plan.constexprs)


# -- from test_emulate_async ------------------------------------------------------------

@ty.kernel(threads=64)
def cp_pipeline(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n_tiles: ty.i32, MODE: ty.constexpr):
    """Double-buffered tiles of 64 floats: copy tile j + 1 while tile j is read (reversed, so every thread
    reads what a thread of the other warp copied)."""
    buf = ty.shared(ty.f32, 128)
    tid = ty.thread_idx()
    cp_async(buf + tid, x + tid, 4)
    cp_async_commit()
    for j in range(n_tiles):
        if j + 1 < n_tiles:
            cp_async(buf + ((j + 1) & 1) * 64 + tid, x + (j + 1) * 64 + tid, 4)
        cp_async_commit()
        if MODE in ("wait", "no_sync"):
            cp_async_wait(1)
        elif MODE == "wait_too_few":
            cp_async_wait(2)
        if MODE != "no_sync":
            ty.syncthreads()
        out[j * 64 + tid] = buf[(j & 1) * 64 + 63 - tid]  # <- cp_read
        ty.syncthreads()


@ty.kernel(threads=32)
def cp_zero_fill(x: ty.ptr(ty.i32), out: ty.ptr(ty.i32), n: ty.i32):
    """Lane i copies 16 bytes (4 ints) from x[4i], reading only the ints below n; the rest is zero-filled."""
    buf = ty.shared(ty.i32, 128)
    lane = ty.lane_id()
    left = ty.maximum(ty.minimum(n - 4 * lane, 4), 0)
    cp_async(buf + 4 * lane, x + 4 * lane, 16, src_bytes=left * 4)
    cp_async_commit()
    cp_async_wait(0)
    for k in range(4):
        out[4 * lane + k] = buf[4 * lane + k]


@ty.kernel(threads=64, arch="sm_90a")
def tile_store(dst: ty.tensormap, x: ty.ptr(ty.bf16), MODE: ty.constexpr, REDUCE: ty.constexpr):
    """Every thread writes a row of a 64 x 16 bf16 tile (no swizzle); thread 0 stores it with TMA."""
    tile = ty.dynamic_shared(ty.bf16, 64 * 16 * 2, align=128)
    tid = ty.thread_idx()
    for c in range(16):
        tile[tid * 16 + c] = x[tid * 16 + c]
    if MODE != "no_fence":
        fence_proxy_async()
    ty.syncthreads()
    if tid == 0:
        tma_store(dst, tile, 0, 0, reduce=REDUCE)  # <- store
        bulk_commit()
        if MODE == "overwrite":
            tile[0] = ty.cast(0.0, ty.bf16)  # <- overwrite
        if MODE != "no_wait":
            bulk_wait(0, read=True)


def _store_args():
    torch.manual_seed(1)
    x = torch.randn(64, 16).to(torch.bfloat16)
    out = torch.randn(64, 16).to(torch.bfloat16)
    return x, out, TensorMapSpec(out, (16, 64), (32,), (16, 64), "bf16", 0)
