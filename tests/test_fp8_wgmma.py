"""FP8 wgmma (m64nNk32, sm_90a): the emulated probe kernel against the accumulation model bit for
bit and against float64 within the model's error bound; every form through ptxas (SS and RS,
e4m3/e5m2 mixes, f32 and f16 accumulators, all 32 legal N); the atom's and the call's errors."""
import itertools

import numpy as np
import pytest

import tylopy as ty
import fp8_wgmma_cases as W
from tylopy import hopper
from tylopy.errors import KernelSourceError, LayoutError


@pytest.mark.parametrize("n, a_fmt, b_fmt, acc, rs, zero", [
    (64, "e4m3", "e4m3", "f32", False, False),
    (8, "e5m2", "e4m3", "f32", True, False),
    (24, "e4m3", "e5m2", "f32", False, True),
    (256, "e5m2", "e5m2", "f32", True, False),
    (64, "e4m3", "e4m3", "f16", True, False),
    (40, "e5m2", "e4m3", "f16", False, True),
])
def test_emulated_fp8_wgmma_is_the_model_and_near_float64(n, a_fmt, b_fmt, acc, rs, zero):
    a, b, c, d = W.run(n, a_fmt, b_fmt, acc, rs, zero, seed=n)
    want = W.model(a, b, c, a_fmt, b_fmt, acc, zero)
    np.testing.assert_array_equal(d.numpy().view(np.uint32), want.view(np.uint32))
    exact = a.double() @ b.double().T + (0 if zero else c.double())
    scale = a.double().abs() @ b.double().abs().T + (0 if zero else c.double().abs())
    # 4 chained steps, each truncating its terms to 13 bits below the largest and the sum to 13 bits
    # (f32) or rounding it to nearest f16 (half an f16 ulp of the running sum per step)
    bound = 4 * 34 * 2.0 ** -12 * scale + (4 * 2.0 ** -11 * scale if acc == "f16" else 0) + 1e-30
    err = (d.double() - exact).abs()
    assert bool((err <= bound).all()), float((err / bound).max())


FORMS = list(itertools.product(["e4m3", "e5m2"], ["e4m3", "e5m2"], ["f32", "f16"], [False, True]))


@pytest.mark.parametrize("a_fmt, b_fmt, acc, rs", FORMS)
def test_ptxas_accepts_every_fp8_wgmma_form(a_fmt, b_fmt, acc, rs):
    ck = W.wgmma_fp8_forms.compile(A=W.DTYPE[a_fmt], B=W.DTYPE[b_fmt], ACC=W.DTYPE[acc], RS=rs)
    for n in W.ALL_N:
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k32.{acc}.{a_fmt}.{b_fmt} " in ck.ptx, n
    # compile() raises CompileError when ptxas rejects the PTX; the report says it ran
    assert ck.report.available is False or ck.report.registers > 0


def test_fp8_atoms_reject_what_the_hardware_lacks():
    with pytest.raises(LayoutError, match="b_dtype expects e4m3 or e5m2 with dtype e4m3, but got bf16"):
        hopper.WgmmaAtom(64, ty.e4m3, b_dtype=ty.bf16)
    with pytest.raises(LayoutError, match="acc_dtype expects f32 .or f16 for f16/e4m3/e5m2 inputs"):
        hopper.WgmmaAtom(64, ty.bf16, acc_dtype=ty.f16)
    with pytest.raises(LayoutError, match="dtype expects bf16, f16, e4m3 or e5m2, but got f32"):
        hopper.WgmmaAtom(64, ty.f32)
    atom = hopper.WgmmaAtom(64, ty.e4m3, b_dtype=ty.e5m2, acc_dtype=ty.f16)
    assert atom.k == 32 and str(atom).startswith("wgmma.mma_async.sync.aligned.m64n64k32.f16.e4m3.e5m2")


@ty.kernel(threads=128, arch="sm_90a")
def misused(d: ty.ptr(ty.f32), CASE: ty.constexpr = 0):
    smem = ty.dynamic_shared(ty.u8, 4096, align=1024)
    desc = hopper.smem_descriptor(ty.address(smem), lbo=16, sbo=1024)
    hopper.wgmma_fence()
    if CASE == 0:
        acc = hopper.wgmma(hopper.WgmmaAtom(64, ty.e4m3), None, desc, desc, trans_b=1)
    elif CASE == 1:
        bf = hopper.WgmmaAtom(64, ty.bf16, "rs")
        w = [ty.bitcast(ty.cast(ty.thread_idx(), ty.u32), ty.b32)] * 4
        acc = hopper.wgmma(hopper.WgmmaAtom(64, ty.e4m3, "rs"), None, bf.a_fragment(w), desc)
    else:
        first = hopper.wgmma(hopper.WgmmaAtom(64, ty.e4m3), None, desc, desc)
        acc = hopper.wgmma(hopper.WgmmaAtom(64, ty.e4m3, acc_dtype=ty.f16), first, desc, desc)
    hopper.wgmma_commit()
    acc = hopper.wgmma_wait(0, acc)
    d[ty.thread_idx()] = ty.cast(ty.thread_idx(), ty.f32)


@pytest.mark.parametrize("case, words", [
    (0, "8-bit operands are read K-major only"),
    (1, "expects a wgmma m64k32 register A 8-bit .* fragment with 4 elements per register"),
    (2, "accumulator expects .* \\(f16\\)")])
def test_fp8_wgmma_misuse_names_the_problem(case, words):
    with pytest.raises((LayoutError, KernelSourceError), match=words):
        misused.compile(CASE=case)


@pytest.mark.parametrize("rs", [False, True])
def test_ptxas_accepts_f16_inputs_with_an_f16_accumulator(rs):
    ck = W.wgmma_fp8_forms.compile(A=ty.f16, B=ty.f16, ACC=ty.f16, RS=rs, NS=(64, 256))
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f16.f16.f16 " in ck.ptx
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f16.f16.f16 " in ck.ptx
