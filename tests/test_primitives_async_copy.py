"""Asynchronous copies: ``ty.cp_async`` / ``cp_async_commit`` / ``cp_async_wait`` and
``ty.hopper.tma_store`` / ``bulk_commit`` / ``bulk_wait`` (PTX spellings, ptxas, errors at the
user line, and the emulator against oracles written from the PTX ISA).

ISA facts used as oracles: cp.async copies ``cp-size`` (4, 8, 16) bytes; with ``src-size`` <
cp-size only src-size bytes are read and "the remaining bytes in destination dst are filled with
zeros"; ``cp.async.wait_group N`` waits until at most N of the most recent groups are pending.
A TMA store writes the box at the coordinates, skipping elements outside the tensor; the
reduction forms combine element-wise with what is in global memory.
"""
import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy import hopper
from tylopy.errors import KernelSourceError
from tylopy.runtime.tensormap import TensorMapSpec
from emulate_dsl import line_of
from primitive_probes import box_values, cp_probe, run_cp, store_map, tma_store_probe  # noqa: F401

HERE = __file__


@pytest.fixture
def emulated():
    from tylopy.emulate.program import load_handlers
    missing = {"cp_async", "cp_async_commit", "cp_async_wait", "tma_store", "bulk_commit", "bulk_wait"} - set(
        load_handlers())
    assert not missing, f"the emulator lost its semantics for {sorted(missing)}"


# -- cp.async ---------------------------------------------------------------------------------------------


def cp_oracle(src: np.ndarray, take: np.ndarray, nbytes: int) -> np.ndarray:
    mem = np.full(32 * 16, 0xAB, dtype=np.uint8)
    for lane in range(32):
        d = lane * nbytes
        mem[d:d + nbytes] = 0
        mem[d:d + take[lane]] = src[d:d + take[lane]]
    return np.concatenate([mem[((lane + 5) & 31) * 16:((lane + 5) & 31) * 16 + 16] for lane in range(32)])


@pytest.mark.parametrize("nbytes, const_take", [(4, -1), (8, -1), (16, -1), (16, 16), (8, 3), (16, 0)])
def test_cp_async_copies_and_zero_fills(nbytes, const_take, emulated):
    src, take, got = run_cp(nbytes, const_take)
    np.testing.assert_array_equal(got, cp_oracle(src, take, nbytes))


@ty.kernel(threads=32)
def cp_groups(src: ty.ptr(ty.i32), out: ty.ptr(ty.i32)):
    """Two groups; wait(1) completes the older: lane l reads its own first copy after it."""
    smem = ty.shared(ty.i32, 256, align=16)
    lane = ty.lane_id()
    ty.cp_async(smem + lane * 4, src + lane * 4, 16)
    ty.cp_async_commit()
    ty.cp_async(smem + 128 + lane * 4, src + 128 + lane * 4, 16)
    ty.cp_async_commit()
    ty.cp_async_wait(1)
    out[lane] = smem[lane * 4 + 3]
    ty.cp_async_wait(0)
    out[32 + lane] = smem[128 + lane * 4 + 3]


def test_wait_group_completes_the_older_groups(emulated):
    src = torch.arange(256, dtype=torch.int32) * 7
    out = torch.zeros(64, dtype=torch.int32)
    cp_groups.emulate(src, out, grid=1)
    lanes = torch.arange(32)
    assert torch.equal(out[:32], src[lanes * 4 + 3]) and torch.equal(out[32:], src[128 + lanes * 4 + 3])


@pytest.mark.parametrize("nbytes, cache, const_take, text", [
    (16, None, -1, "cp.async.cg.shared.global [%r{}], [%rd{}], 16, %r{};"),
    (16, "ca", 16, "cp.async.ca.shared.global [%r{}], [%rd{}], 16;"),
    (8, None, 3, "cp.async.ca.shared.global [%r{}], [%rd{}], 8, %r{};"),
    (4, "ca", -1, "cp.async.ca.shared.global [%r{}], [%rd{}], 4, %r{};"),
])
def test_cp_async_ptx_and_ptxas(nbytes, cache, const_take, text):
    ck = cp_probe.compile(NBYTES=nbytes, CACHE=cache, CONST_TAKE=const_take)
    import re
    pattern = re.escape(text).replace(re.escape("{}"), r"\d+")
    assert re.search(pattern, ck.ptx), text
    assert "cp.async.commit_group;" in ck.ptx and "cp.async.wait_group 0;" in ck.ptx
    assert ck.report.available is False or ck.report.spills == 0


@ty.kernel(threads=32)
def cp_misuse(g: ty.ptr(ty.u8), n: ty.i32, CASE: ty.constexpr = 0):
    smem = ty.shared(ty.u8, 512, align=16)
    lane = ty.lane_id()
    if CASE == 0:
        ty.cp_async(g, g + 16, 16)  # <- cp 0
    elif CASE == 1:
        ty.cp_async(smem, smem + 16, 16)  # <- cp 1
    elif CASE == 2:
        ty.cp_async(smem, g, 12)  # <- cp 2
    elif CASE == 3:
        ty.cp_async(smem, g, 8, cache="cg")  # <- cp 3
    elif CASE == 4:
        ty.cp_async(smem, g, 8, src_bytes=9)  # <- cp 4
    elif CASE == 5:
        ty.cp_async_wait(n)  # <- cp 5
    elif CASE == 6:
        ty.cp_async(smem, g, 16, src_bytes=ty.cast(lane, ty.f32))  # <- cp 6
    else:
        hopper.bulk_wait(0)  # <- cp 7


@pytest.mark.parametrize("case, words", [
    (0, "destination expects a shared pointer"), (1, "source expects a global or generic pointer"),
    (2, "nbytes expects 4, 8 or 16"), (3, "cache='cg' expects nbytes=16"), (4, "src_bytes expects an int in 0..8"),
    (5, "n expects a compile-time int"), (6, "src_bytes expects an i32"), (7, "expects a kernel for sm_90a"),
])
def test_cp_async_misuse_is_an_error_at_the_user_line(case, words):
    with pytest.raises(KernelSourceError, match=words) as e:
        cp_misuse.with_arch("sm_80").compile(CASE=case)
    assert e.value.loc.lineno == line_of(HERE, f"cp {case}")


# -- TMA stores ---------------------------------------------------------------------------------------------

from primitive_probes import COLS, ROWS  # noqa: E402  (the TMA-store box)


@pytest.mark.parametrize("reduce", [None, "add"])
def test_tma_store_writes_the_box_clipped_at_the_tensor_edge(reduce, emulated):
    g = torch.full((40, 52), 7.0)  # the box at (x=28, y=30) hangs over both edges; 28 f32 = 112 bytes
    tma_store_probe.emulate(store_map(g), 28, 30, grid=1, REDUCE=reduce)
    want = np.full((40, 52), 7.0, np.float32)
    box = box_values()[:10, :24]
    want[30:40, 28:52] = {None: box, "add": box + 7.0}[reduce]
    np.testing.assert_array_equal(g.numpy(), want)


def test_tma_store_whose_row_start_is_not_16_byte_aligned_is_rejected(emulated):
    """x=30 f32 starts the box 120 bytes into a row: the H200 raises an illegal instruction."""
    from tylopy.emulate import MemoryAccessError
    g = torch.full((40, 52), 7.0)
    with pytest.raises(MemoryAccessError, match=r"innermost coordinate 30 \(120 bytes.*multiple of 16 bytes"):
        tma_store_probe.emulate(store_map(g), 30, 30, grid=1)


@pytest.mark.parametrize("reduce", ["min", "max"])
def test_tma_store_min_max_into_f32_is_rejected(reduce, emulated):
    """The H200 raises an illegal instruction for cp.reduce.async.bulk.tensor .max on an f32 map."""
    from tylopy.emulate import ProtocolError
    g = torch.full((40, 52), 7.0)
    with pytest.raises(ProtocolError, match=f"reduce='{reduce}' on tensor map .* of f32"):
        tma_store_probe.emulate(store_map(g), 28, 30, grid=1, REDUCE=reduce)


def test_tma_store_of_unfenced_writes_is_a_protocol_error(emulated):
    from tylopy.emulate import ProtocolError
    g = torch.zeros(16, 32)
    with pytest.raises(ProtocolError, match="fence"):
        tma_store_probe.emulate(store_map(g), 0, 0, grid=1, FENCE=False)


@pytest.mark.parametrize("reduce, text", [
    (None, "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd{}, {%r{}, %r{}}], [%r{}];"),
    ("add", "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group"),
    ("min", "cp.reduce.async.bulk.tensor.2d.global.shared::cta.min.tile.bulk_group"),
])
def test_tma_store_ptx_and_ptxas(reduce, text):
    import re
    ck = tma_store_probe.compile(REDUCE=reduce)
    assert re.search(re.escape(text).replace(re.escape("{}"), r"\d+"), ck.ptx), text
    assert "fence.proxy.async.shared::cta;" in ck.ptx
    assert "cp.async.bulk.commit_group;" in ck.ptx and "cp.async.bulk.wait_group.read 0;" in ck.ptx
    assert ck.report.available is False or ck.report.spills == 0


@ty.kernel(threads=32, arch="sm_90a")
def tma_store_ranks(dst: ty.tensormap, RANK: ty.constexpr = 1):
    tile = ty.shared(ty.f32, 256, align=128)
    if ty.thread_idx() == 0:
        hopper.tma_store(dst, tile, *[ty.thread_idx()] * RANK)
        hopper.bulk_commit()
        hopper.bulk_wait(2)


@pytest.mark.parametrize("rank", [1, 3, 5])
def test_tma_store_every_rank_assembles(rank):
    ck = tma_store_ranks.compile(RANK=rank)
    assert f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group" in ck.ptx
    assert "cp.async.bulk.wait_group 2;" in ck.ptx
    assert ck.report.available is False or ck.report.registers is not None


@ty.kernel(threads=32, arch="sm_90a")
def tma_misuse(dst: ty.tensormap, g: ty.ptr(ty.f32), CASE: ty.constexpr = 0):
    tile = ty.shared(ty.f32, 256, align=128)
    if CASE == 0:
        hopper.tma_store(g, tile, 0)  # <- tma 0
    elif CASE == 1:
        hopper.tma_store(dst, g, 0)  # <- tma 1
    elif CASE == 2:
        hopper.tma_store(dst, tile, 0, reduce="mul")  # <- tma 2
    elif CASE == 3:
        hopper.tma_store(dst, tile)  # <- tma 3
    else:
        hopper.bulk_wait(0, read=1)  # <- tma 4


@pytest.mark.parametrize("case, words", [(0, "expects a tensor map"), (1, "source expects a shared pointer"),
                                         (2, "reduce expects None, 'add', 'min' or 'max'"),
                                         (3, "expects 1 to 5 coordinates"), (4, "read expects a compile-time bool")])
def test_tma_store_misuse_is_an_error_at_the_user_line(case, words):
    with pytest.raises(KernelSourceError, match=words) as e:
        tma_misuse.compile(CASE=case)
    assert e.value.loc.lineno == line_of(HERE, f"tma {case}")


# -- the portable attention: its cp.async path is the one emulated -----------------------------------------

@pytest.mark.parametrize("causal", [0, 1])
def test_portable_attention_cp_async_path_equals_its_ld_st_path(causal, emulated):
    """Two k-tiles past the first ring turn, the last one ragged: the cp.async pipeline (the GPU's
    path) and the plain ld/st pipeline give the same bits in the emulator."""
    import math
    import tylopy as ty
    from tylopy_kernels.attention.portable import forward as portable
    n, d = 150, 32
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 1, n, d, generator=gen).to(torch.bfloat16) for _ in range(3))
    results = []
    for async_copy in (True, False):
        out, lse = torch.full_like(q, float("nan")), torch.full((1, 1, n), float("nan"))
        no_mask = torch.zeros(1, dtype=torch.uint8).as_strided((1, 1, 1, 1), (0, 0, 0, 0))
        i16 = torch.int16
        portable.streaming_attention_fwd.emulate(
            q=q.view(i16), k=k.view(i16), v=v.view(i16), out=out.view(i16), lse=lse, mask=no_mask,
            scale=1 / math.sqrt(d), causal=causal, grid=(-(-n // 32), 1, 1), DTYPE=ty.bf16, HEAD_DIM=d, BLOCK_N=32,
            WARPS=2, HAS_MASK=False, RETURN_LSE=True, ASYNC_COPY=async_copy)
        results.append((out, lse))
    (o1, l1), (o2, l2) = results
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)
    want = torch.softmax((q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
                         + (torch.full((n, n), -math.inf).triu(1) if causal else 0), dim=-1) @ v.double()
    assert float((o1.double() - want).abs().max()) < 2e-2
