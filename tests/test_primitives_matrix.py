"""Matrix primitives: ``ty.MmaSyncAtom`` + ``ty.mma`` (m16n8k16, m16n8k8), ``ty.ldmatrix``,
``ty.stmatrix`` and the wgmma of ``ty.hopper`` for every N.

Oracles are written here from the PTX ISA, not from tylopy's tables: g = lane >> 2, t = lane & 3;
a b32 word holds the lower column (or k) in bits 0-15.

* mma.m16n8k16 (figures "Matrix Fragments for mma.m16n8k16"): A a_r[h] at (g + 8 (r & 1),
  2t + h + 8 (r >> 1)); B b_r[h] at (k 2t + h + 8r, n g); C/D c_i at (g + 8 (i >> 1), 2t + (i & 1)).
* mma.m16n8k8 ("... mma.m16n8k8"): A a_r[h] at (g + 8r, 2t + h); B b0[h] at (k 2t + h, n g).
* ldmatrix / stmatrix: lane 8j + i gives the address of row i of matrix j (x1: lanes 0-7, x2:
  0-15); word j of lane l holds row l // 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j;
  ``.trans`` reads (writes) the matrix transposed.
"""
import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy import hopper
from tylopy.errors import KernelSourceError
from tylopy.semantics.tensorcore import mma_f32
from emulate_dsl import line_of
from primitive_probes import LANE, TORCH, TY, _fill_core_matrices, _word, ldmatrix_probe, mma_inputs, mma_probe, row_slots, run_ldmatrix, run_mma_probe, run_stmatrix, run_wgmma, stmatrix_probe, wgmma_probe  # noqa: F401

HERE = __file__
G, T = LANE >> 2, LANE & 3


def isa_tables(shape: str):
    """(A (lane, element) -> (row, col), B (lane, element) -> (k, n)) of an mma.sync shape, from the ISA."""
    if shape == "m16n8k16":
        a = [[(g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)) for i in range(8)] for g, t in zip(G, T)]
        b = [[(2 * t + (i & 1) + 8 * (i >> 1), g) for i in range(4)] for g, t in zip(G, T)]
    else:
        a = [[(g + 8 * (i >> 1), 2 * t + (i & 1)) for i in range(4)] for g, t in zip(G, T)]
        b = [[(2 * t + i, g) for i in range(2)] for g, t in zip(G, T)]
    return np.array(a), np.array(b)


@pytest.mark.parametrize("shape", ["m16n8k16", "m16n8k8"])
def test_atom_layouts_are_the_isa_fragments(shape):
    atom = ty.MmaSyncAtom(ty.bf16, shape)
    a, b = isa_tables(shape)
    assert np.array_equal(atom.a_layout.table, a) and np.array_equal(atom.b_layout.table, b)
    c = np.array([[(g + 8 * (i >> 1), 2 * t + (i & 1)) for i in range(4)] for g, t in zip(G, T)])
    assert np.array_equal(atom.c_layout.table, c)
    assert atom.mnk == ((16, 8, 16) if shape == "m16n8k16" else (16, 8, 8))
    assert (atom.a_words, atom.b_words) == ((4, 2) if shape == "m16n8k16" else (2, 1))
    assert atom.a_ownership.row_lanes == (1, 2) and atom.b_ownership.col_lanes == (1, 2)


# -- mma.sync ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["m16n8k8", "m16n8k16"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_mma_emulated_matches_fp64_and_the_tensor_core_model(dtype, shape):
    a, b, c, d = run_mma_probe(dtype, shape)
    want = a.double() @ b.double() + c.double()
    torch.testing.assert_close(d.double(), want, rtol=2e-6, atol=2e-6)
    model = mma_f32(a.float().numpy(), b.float().numpy(), c.numpy(), dtype)
    np.testing.assert_array_equal(d.numpy(), model)


@pytest.mark.parametrize("shape", ["m16n8k8", "m16n8k16"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_mma_ptx_and_ptxas(shape, arch):
    ck = mma_probe.with_arch(arch).compile(DTYPE=ty.f16, SHAPE=shape)
    want = f"mma.sync.aligned.{shape}.row.col.f32.f16.f16.f32"
    assert ck.ptx.count(want) == 1
    assert ck.report.available is False or ck.report.spills == 0


@ty.kernel(threads=32)
def mma_misuse(a: ty.ptr(ty.b32), d: ty.ptr(ty.f32), CASE: ty.constexpr = 0):
    lane = ty.lane_id()
    w = a[lane]
    bf, k8 = ty.MmaSyncAtom(ty.bf16), ty.MmaSyncAtom(ty.f16, "m16n8k8")
    f16 = ty.MmaSyncAtom(ty.f16)
    acc = bf.zeros()
    if CASE == 0:
        acc = ty.mma(bf, f16.a_fragment([w] * 4), bf.b_fragment([w] * 2), acc)  # <- case 0
    elif CASE == 1:
        acc = ty.mma(bf, bf.b_fragment([w] * 2), bf.b_fragment([w] * 2), acc)  # <- case 1
    elif CASE == 2:
        acc = ty.mma(bf, k8.a_fragment([w] * 2), bf.b_fragment([w] * 2), acc)  # <- case 2
    elif CASE == 3:
        acc = ty.mma(bf, bf.a_fragment([w] * 3), bf.b_fragment([w] * 2), acc)  # <- case 3
    elif CASE == 4:
        acc = ty.mma(bf, bf.a_fragment([ty.bitcast(w, ty.f32)] * 4), bf.b_fragment([w] * 2), acc)  # <- case 4
    elif CASE == 5:
        acc = ty.mma(bf, bf.a_fragment([w] * 4), bf.b_fragment([w] * 2), [w] * 4)  # <- case 5
    else:
        acc = ty.MmaSyncAtom(ty.f32).zeros()  # <- case 6
    d[lane] = acc.values[0]


@pytest.mark.parametrize("case, words", [
    (0, "bf16 atom expects A packed as bf16, but it holds f16"),
    (1, "expects a packed mma.m16n8k16 A 16-bit"),
    (2, "expects a packed mma.m16n8k16 A 16-bit.*m16n8k8"),
    (3, "expects 4 b32 word"),
    (4, "expects b32"),
    (5, "C expects a Fragment"),
    (6, "dtype expects ty.bf16, ty.f16, ty.e4m3 or ty.e5m2"),
])
def test_fragment_misuse_is_an_error_at_the_user_line(case, words):
    with pytest.raises(KernelSourceError, match=words) as e:
        mma_misuse.compile(CASE=case)
    assert e.value.loc is not None and e.value.loc.lineno == line_of(HERE, f"case {case}")


# -- ldmatrix / stmatrix ------------------------------------------------------------------------------------


def ldmatrix_oracle(mem: np.ndarray, slots: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """Words (num, 32) from the ISA: matrix j's row i is memory row slots[8 j + i]."""
    out = np.zeros((num, 32), dtype=np.uint32)
    for j in range(num):
        m = mem[slots[8 * j:8 * j + 8]]  # (8 rows, 8 cols) uint16
        if trans:
            m = m.T
        out[j] = m[G, 2 * T].astype(np.uint32) | (m[G, 2 * T + 1].astype(np.uint32) << 16)
    return out


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_ldmatrix_lane_addresses_and_register_contents(num, trans):
    mem, slots, got = run_ldmatrix(num, trans)
    np.testing.assert_array_equal(got, ldmatrix_oracle(mem, slots, num, trans))


def stmatrix_oracle(words: np.ndarray, slots: np.ndarray, num: int, trans: bool) -> np.ndarray:
    mem = np.full((32, 8), 0xFFFF, dtype=np.uint16)
    for j in range(num):
        m = np.zeros((8, 8), dtype=np.uint16)
        m[G, 2 * T] = words[j] & 0xFFFF
        m[G, 2 * T + 1] = words[j] >> 16
        mem[slots[8 * j:8 * j + 8]] = m.T if trans else m
    return mem


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_stmatrix_lane_addresses_and_memory_contents(num, trans):
    words, slots, got = run_stmatrix(num, trans)
    np.testing.assert_array_equal(got, stmatrix_oracle(words, slots, num, trans))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ldmatrix_ptx_and_ptxas(arch):
    for num in (1, 2, 4):
        for trans in (False, True):
            ck = ldmatrix_probe.with_arch(arch).compile(NUM=num, TRANS=trans)
            assert f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16" in ck.ptx
            assert ck.report.available is False or ck.report.spills == 0


def test_stmatrix_ptx_and_ptxas():
    ck = stmatrix_probe.compile(NUM=2, TRANS=True)
    assert "stmatrix.sync.aligned.m8n8.x2.trans.shared.b16" in ck.ptx
    assert ck.report.available is False or ck.report.registers is not None


@ty.kernel(threads=32)
def matrix_misuse(g: ty.ptr(ty.i16), CASE: ty.constexpr = 0):
    smem = ty.shared(ty.i16, 256, align=16)
    lane = ty.lane_id()
    if CASE == 0:
        ty.ldmatrix(g + lane * 8, 4)  # <- mcase 0
    elif CASE == 1:
        ty.ldmatrix(smem + lane * 8, 3)  # <- mcase 1
    elif CASE == 2:
        ty.ldmatrix(smem + lane * 8, 4, trans=lane)  # <- mcase 2
    elif CASE == 3:
        ty.stmatrix(smem + lane * 8, [ty.bitcast(ty.cast(lane, ty.i32), ty.b32)])  # <- mcase 3
    else:
        ty.stmatrix(smem + lane * 8, [lane, lane])  # <- mcase 4


@pytest.mark.parametrize("case, arch, words", [
    (0, "sm_80", "expects a shared-memory pointer, but got a global pointer"),
    (1, "sm_80", "num expects 1, 2 or 4"),
    (2, "sm_80", "trans expects a compile-time bool"),
    (3, "sm_80", "stmatrix expects a kernel for sm_90 or newer"),
    (4, "sm_90a", "word 0 expects a b32 word"),
])
def test_ldmatrix_stmatrix_misuse_is_an_error_at_the_user_line(case, arch, words):
    with pytest.raises(KernelSourceError, match=words) as e:
        matrix_misuse.with_arch(arch).compile(CASE=case)
    assert e.value.loc.lineno == line_of(HERE, f"mcase {case}")


# -- wgmma for every N: SS and RS --------------------------------------------------------------------------


@pytest.mark.parametrize("n, a_from, dtype", [(8, "ss", "bf16"), (24, "rs", "f16"), (136, "ss", "f16"),
                                              (256, "rs", "bf16")])
def test_wgmma_emulated_matches_the_tensor_core_model(n, a_from, dtype):
    a, b, d = run_wgmma(n, a_from, dtype)
    np.testing.assert_array_equal(d.numpy(), mma_f32(a.float().numpy(), b.float().numpy().T, None, dtype))


@ty.kernel(threads=128, arch="sm_90a")
def wgmma_every_n(b: ty.ptr(ty.i16), d: ty.ptr(ty.f32), A_FROM: ty.constexpr = "ss", DTYPE: ty.constexpr = ty.bf16):
    """One wgmma of each legal N (8, 16, ..., 256) in sequence, each waited and summed into d."""
    smem = ty.shared(ty.i16, 256 * 16 + 64 * 16, align=1024)
    tid = ty.thread_idx()
    _fill_core_matrices(smem, b, 256, tid, 128)
    hopper.fence_proxy_async()
    ty.syncthreads()
    total = ty.cast(0.0, ty.f32)
    word = ty.bitcast(ty.cast(tid, ty.i32) * 65537, ty.b32)
    for n in range(8, 257, 8):
        atom = hopper.WgmmaAtom(n, DTYPE, A_FROM)
        db = hopper.smem_descriptor(ty.address(smem), lbo=n * 16, sbo=128, swizzle=0)
        a_op = (hopper.smem_descriptor(ty.address(smem) + 256 * 32, lbo=64 * 16, sbo=128, swizzle=0)
                if A_FROM == "ss" else ty.Fragment((word,) * 4, ty.WGMMA_A_RS, pack=2, dtype=DTYPE))
        hopper.wgmma_fence()
        acc = hopper.wgmma(atom, None, a_op, db)
        hopper.wgmma_commit()
        acc = hopper.wgmma_wait(0, acc)
        total = total + acc.values[0] + acc.values[n // 2 - 1]
    d[tid] = total


@pytest.mark.parametrize("a_from, dtype", [("ss", ty.bf16), ("rs", ty.f16)])
def test_wgmma_every_n_assembles(a_from, dtype):
    ck = wgmma_every_n.compile(A_FROM=a_from, DTYPE=dtype)
    for n in range(8, 257, 8):
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype.name}.{dtype.name} " in ck.ptx, n
    assert ck.report.available is False or ck.report.registers is not None  # ptxas took all 32 forms


@pytest.mark.parametrize("a_from", ["ss", "rs"])
def test_wgmma_n256_needs_no_spills(a_from):
    ck = wgmma_probe.compile(N=256, A_FROM=a_from)
    assert ck.report.available is False or (ck.report.spills == 0 and ck.report.stack_frame == 0)


# -- wgmma_wait(..., after=): the wait stays after the work that produces the values -----------------------

@ty.kernel(threads=128, arch="sm_90a")
def pinned_wait(out: ty.ptr(ty.f32), n: ty.i32, PIN: ty.constexpr = False):
    smem = ty.shared(ty.u8, 2 * 8192, align=1024)
    base = ty.address(smem)
    tid = ty.thread_idx()
    v = ty.cast(tid, ty.f32) * 0.01
    atom = hopper.WgmmaAtom(64, ty.bf16, "ss")
    hopper.wgmma_fence()
    acc = hopper.wgmma(atom, None, hopper.smem_descriptor(base), hopper.smem_descriptor(base + 8192))
    hopper.wgmma_commit()
    work = ty.exp2(v * 1.4426950408889634) + ty.exp2(v * 0.5)  # overlaps the wgmma only if before the wait
    flag, half = tid < n, ty.cast(v, ty.f16)
    if PIN:
        acc = hopper.wgmma_wait(0, acc, after=(work, [flag, half], smem))
    else:
        acc = hopper.wgmma_wait(0, acc)
    out[tid] = acc.values[0]
    if flag:
        out[tid + 128] = work + ty.cast(half, ty.f32)


def _order(ptx: str) -> list:
    return ["wait" if "wgmma.wait_group" in line else "ex2" for line in ptx.splitlines()
            if ("ex2.approx" in line or "wgmma.wait_group" in line) and not line.strip().startswith("//")]


def test_after_pins_the_work_before_the_wait():
    """Without ``after``, LLVM sinks the work, used only under the later branch, below the wait; with
    it the exponentials stay between the wgmma and its wait (in the PTX and, checked with nvdisasm
    for docs/primitives.md, in the SASS)."""
    assert _order(pinned_wait.compile(PIN=False).ptx) == ["wait", "ex2", "ex2"]
    pinned = pinned_wait.compile(PIN=True)
    assert _order(pinned.ptx) == ["ex2", "ex2", "wait"]
    assert pinned.report.available is False or pinned.report.spills == 0


def test_after_rejects_what_it_cannot_pin():
    @ty.kernel(threads=128, arch="sm_90a")
    def bad_pin(out: ty.ptr(ty.f32)):
        hopper.wgmma_wait(0, after=1.5)  # <- bad after
    with pytest.raises(KernelSourceError, match="after= expects run-time values or fragments") as e:
        bad_pin.compile()
    assert e.value.loc.lineno == line_of(HERE, "bad after")
