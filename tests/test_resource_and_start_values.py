"""Shared memory past the target's limit is an error at trace time; 16-byte vector loads of 8-bit
data; a wgmma accumulator that starts from ``WgmmaAtom.zeros()`` in a run-time K loop."""
import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy import hopper
from tylopy.semantics.tensorcore import mma_f32


# -- shared memory limits -------------------------------------------------------------------------------------

@ty.kernel(threads=128, arch="sm_90a")
def too_much_dynamic(x: ty.ptr(ty.f32), KB: ty.constexpr):
    s = ty.dynamic_shared(ty.f32, KB * 1024)
    s[ty.thread_idx()] = x[ty.thread_idx()]
    ty.syncthreads()
    x[ty.thread_idx()] = s[127 - ty.thread_idx()]


@ty.kernel(threads=128, arch="sm_90a")
def static_plus_dynamic(x: ty.ptr(ty.f32)):
    s = ty.shared(ty.f32, 8192)                  # 32 KB static
    d = ty.dynamic_shared(ty.f32, 200 * 1024)    # + 200 KB dynamic
    s[ty.thread_idx()] = x[ty.thread_idx()]
    d[ty.thread_idx()] = x[ty.thread_idx()]


def test_shared_memory_over_the_limit_fails_at_trace_naming_kernel_and_amount():
    for call in (lambda: too_much_dynamic.compile(KB=300),
                 lambda: too_much_dynamic.emulate(np.zeros(128, np.float32), grid=(1,), KB=300),
                 lambda: too_much_dynamic.trace(KB=300)):
        with pytest.raises(ty.ResourceLimitError) as e:
            call()
        msg = str(e.value)
        assert "kernel 'too_much_dynamic' asks for 307200 bytes (300.0 KB)" in msg, msg
        assert "at most 232448 bytes (227 KB) per block on sm_90a" in msg
        assert "s = ty.dynamic_shared(ty.f32, KB * 1024)" in msg  # the line that asked
    too_much_dynamic.compile(KB=227)  # the limit itself is fine
    with pytest.raises(ty.ResourceLimitError, match=r"on sm_80, but kernel 'too_much_dynamic' asks for 204800"):
        too_much_dynamic.with_arch("sm_80").compile(KB=200)
    with pytest.raises(ty.ResourceLimitError, match=r"asks for 237568 bytes \(232.0 KB\) \(32768 static \+ 204800 "
                                                    r"dynamic\)"):
        static_plus_dynamic.compile()


# -- 16-byte vectors of 8-bit elements ------------------------------------------------------------------------

@ty.kernel(threads=32)
def copy_bytes(x: ty.ptr(ty.u8), y: ty.ptr(ty.u8), n: ty.i32):
    i = ty.thread_idx() * 16
    v = ty.load(x + i, vec=16, mask=i < n)
    s = ty.shared(ty.u8, 512)
    ty.store(s + (496 - i), v)          # through shared memory, 16 bytes at a time both ways
    ty.syncthreads()
    ty.store(y + i, ty.load(s + (496 - i), vec=16))


@ty.kernel(threads=32)
def copy_fp8(x: ty.ptr(ty.e4m3), y: ty.ptr(ty.e4m3)):
    i = ty.thread_idx() * 16
    ty.store(y + i, ty.load(x + i, vec=16))


@ty.kernel(threads=32)
def too_wide(x: ty.ptr(ty.f16)):
    v = ty.load(x, vec=16)
    x[0] = v[0]


def test_vec16_loads_of_8_bit_data_emulate_and_assemble():
    x = np.random.default_rng(1).integers(0, 256, 512).astype(np.uint8)
    y = np.full(512, 0xAB, np.uint8)
    copy_bytes.emulate(x, y, 300, grid=(1,))
    assert np.array_equal(y[:304], x[:304]) and (y[304:] == 0).all()  # lanes past n read zeros
    xf = torch.randn(512).to(torch.float8_e4m3fn)
    yf = torch.zeros(512, dtype=torch.float8_e4m3fn)
    copy_fp8.emulate(xf, yf, grid=(1,))
    assert torch.equal(xf.view(torch.uint8), yf.view(torch.uint8))
    for k in (copy_bytes, copy_fp8):
        for arch in ("sm_80", "sm_90a"):
            ptx = k.with_arch(arch).compile().ptx  # compile runs ptxas
            assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx
    ptx = copy_bytes.compile().ptx
    assert "ld.shared.v4.b32" in ptx and "st.shared.v4.b32" in ptx
    with pytest.raises(ty.KernelSourceError, match=r"load vec expects at most 8 f16 elements \(one access moves at "
                                                  r"most 16 bytes\), but got vec=16"):
        too_wide.compile()


# -- WgmmaAtom.zeros -------------------------------------------------------------------------------------------

ATOM = hopper.WgmmaAtom(64, ty.bf16)


@ty.kernel(threads=128, arch="sm_90a")
def k_loop_from_zeros(a_map: ty.tensormap, b_map: ty.tensormap, d: ty.ptr(ty.f32), k_tiles: ty.i32):
    """D (64x64) = A (64xK) @ B (64xK)^T, K = 64 k_tiles, one 64x64 tile of each per trip of a run-time loop."""
    a_s = ty.dynamic_shared(ty.bf16, 2 * 8192, align=1024)
    b_s = a_s + 4096
    bar = ty.shared(ty.u64, 1, align=8)
    tid = ty.thread_idx()
    if tid == 0:
        hopper.mbarrier_init(bar, 1)
        hopper.fence_mbarrier_init()
    ty.syncthreads()
    acc = ATOM.zeros()
    for kt in ty.range(k_tiles):
        if tid == 0:
            hopper.mbarrier_arrive_expect_tx(bar, 2 * 8192)
            hopper.tma_load(a_s, a_map, bar, kt * 64, 0)
            hopper.tma_load(b_s, b_map, bar, kt * 64, 0)
        hopper.mbarrier_wait(bar, kt & 1)
        hopper.wgmma_fence()
        for k in ty.static_range(4):
            da = hopper.smem_descriptor(ty.address(a_s) + 32 * k)
            db = hopper.smem_descriptor(ty.address(b_s) + 32 * k)
            acc = hopper.wgmma(ATOM, acc, da, db)
        hopper.wgmma_commit()
        acc = hopper.wgmma_wait(0, acc)
        ty.syncthreads()  # every warp is done reading the tiles before the next trip's TMA overwrites them
    w, lane = tid >> 5, tid & 31
    g, t = lane >> 2, lane & 3
    for i in ty.static_range(32):
        d[(16 * w + g + 8 * ((i >> 1) & 1)) * 64 + 8 * (i >> 2) + 2 * t + (i & 1)] = acc.values[i]


def test_wgmma_accumulates_from_zeros_over_a_run_time_loop():
    g = torch.Generator().manual_seed(6)
    for k_tiles in (1, 3):
        a = torch.randn(64, 64 * k_tiles, generator=g).bfloat16()
        b = torch.randn(64, 64 * k_tiles, generator=g).bfloat16()
        d = torch.full((64, 64), float("nan"))
        a_map = ty.tensor_map(a, box=(64, 64), swizzle=128)
        b_map = ty.tensor_map(b, box=(64, 64), swizzle=128)
        k_loop_from_zeros.emulate(a_map, b_map, d, k_tiles, grid=(1,))
        want = np.zeros((64, 64), np.float32)  # the tensor cores' chain of k16 steps from a zero accumulator
        af, bf = a.float().numpy(), b.float().numpy()
        for k in range(0, 64 * k_tiles, 16):
            want = mma_f32(af[:, k:k + 16], bf[:, k:k + 16].T, want, "bf16")
        assert torch.equal(d, torch.from_numpy(want))
        exact = a.double() @ b.double().T
        assert float((d.double() - exact).abs().max()) <= 1e-4 * float((a.double().abs() @ b.double().abs().T).max())
    ptx = k_loop_from_zeros.compile().ptx
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in ptx


def test_zeros_has_the_accumulator_shape_of_each_atom():
    @ty.kernel(threads=128, arch="sm_90a")
    def shapes(out: ty.ptr(ty.i32)):
        f32_acc = hopper.WgmmaAtom(128, ty.bf16).zeros()
        f16_acc = hopper.WgmmaAtom(64, ty.f16, acc_dtype=ty.f16).zeros()
        if ty.thread_idx() == 0:
            out[0] = len(f32_acc.values)
            out[1] = len(f16_acc.values)
            out[2] = ty.cast(f32_acc.values[5], ty.i32) + ty.bitcast(f16_acc.values[3], ty.i32)

    out = np.full(3, -1, np.int32)
    shapes.emulate(out, grid=(1,))
    assert out.tolist() == [64, 16, 0]


# -- GPU tier -------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_vec16_bytes_and_wgmma_zeros_match_the_emulator():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("wgmma needs sm_90a")
    x = torch.randint(0, 256, (512,), dtype=torch.uint8)
    y = torch.full((512 + 64,), 0xAB, dtype=torch.uint8, device="cuda")
    copy_bytes[(1,)](x.cuda(), y, 300)
    torch.cuda.synchronize()
    assert torch.equal(y[:304].cpu(), x[:304]) and (y[304:512] == 0).all() and (y[512:] == 0xAB).all()
    g = torch.Generator().manual_seed(8)
    a = torch.randn(64, 192, generator=g).bfloat16()
    b = torch.randn(64, 192, generator=g).bfloat16()
    want = torch.zeros(64, 64)
    k_loop_from_zeros.emulate(ty.tensor_map(a, box=(64, 64), swizzle=128), ty.tensor_map(b, box=(64, 64), swizzle=128),
                              want, 3, grid=(1,))
    ac, bc = a.cuda(), b.cuda()
    got = torch.full((64 * 64 + 32,), float("nan"), device="cuda")
    k_loop_from_zeros[(1,)](ty.tensor_map(ac, box=(64, 64), swizzle=128), ty.tensor_map(bc, box=(64, 64), swizzle=128),
                            got, 3)
    torch.cuda.synchronize()
    assert torch.equal(got[:4096].cpu().view(64, 64), want) and got[4096:].isnan().all()
