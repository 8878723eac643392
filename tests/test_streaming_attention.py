"""CPU tier of the portable streaming attention (tylopy_kernels/attention/portable/forward.py).

* the worked example through the reference semantics of the online softmax (6; 7 when the
  numerator is not rescaled);
* ptxas on every (BLOCK_N, D, dtype) variant: no spills, no stack frame; the key instructions
  are in the PTX;
* the ldmatrix addressing against the mma.sync B-operand table of the PTX ISA, and the swizzle's
  bank-conflict freedom;
* input checks (no GPU is touched before them) and the arch choice;
* when the CPU emulator is there: small launches checked against the shared references and pass
  rules (``tylopy_kernels/attention/testing/reference.py``, ``rules.py``) with the portable kernel's model.
"""
import math

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy_kernels.attention.testing import cases as cases
from tylopy_kernels.attention.testing import reference as R
from tylopy_kernels.attention.testing import rules as rules
from tylopy_kernels.attention.testing import scenarios as scenarios
from tylopy_kernels.attention.portable import forward as sa
from tylopy_kernels.attention.portable import launch as pl

DTYPES = (ty.bf16, ty.f16)


# -- the worked example: logits [0, 0] then [log 2], values [1, 3] then [10] -----------------------------

def _tile(logits):
    return ty.Fragment(tuple(float(x) for x in logits), ty.LocalOwnership(2, len(logits)))


def _seed_recurrence(rescale_numerator=True):
    tiles = [([0.0, 0.0], [1.0, 3.0]), ([math.log(2.0)], [10.0])]
    state = ty.SoftmaxState(_tile(tiles[0][0]))
    numerator = None
    trace = []
    for logits, values in tiles:
        upd = ty.softmax_update(state, _tile(logits), scale=1.0)  # scale 1: natural exp of the logits
        pv = sum(p * x for p, x in zip(upd.weights.data, values))
        if numerator is None:
            numerator = ty.Fragment((pv,), ty.LocalOwnership(2, 1))
        else:
            kept = numerator * upd.rescale if rescale_numerator else numerator
            numerator = kept + pv
        state = upd.state
        trace.append((state.maximum.item(), state.sum.item(), numerator.item(), upd.rescale.item()))
    return ty.softmax_normalize(numerator, state).item(), trace


def test_worked_example_recurrence_gives_6():
    out, trace = _seed_recurrence()
    (m1, l1, a1, _), (m2, l2, a2, alpha2) = trace
    assert (m1, l1, a1) == (0.0, 2.0, 4.0)
    assert m2 == pytest.approx(math.log(2.0), rel=1e-7)
    assert alpha2 == pytest.approx(0.5, rel=1e-6)
    assert (l2, a2) == (pytest.approx(2.0, rel=1e-6), pytest.approx(12.0, rel=1e-6))
    assert out == pytest.approx(6.0, rel=1e-6)
    # the full softmax gives the same: weights [1/4, 1/4, 1/2]
    assert np.dot([0.25, 0.25, 0.5], [1.0, 3.0, 10.0]) == 6.0


def test_worked_example_without_rescaling_the_numerator_gives_7():
    out, _ = _seed_recurrence(rescale_numerator=False)
    assert out == pytest.approx(7.0, rel=1e-6)


def test_module_docstring_traces_the_worked_example():
    doc = " ".join(sa.__doc__.split())
    for text in ("m = 0, l = e^0 + e^0 = 2, a = 1*1 + 1*3 = 4", "alpha = e^(0 - log 2) = 1/2",
                 "l = 1/2 * 2 + e^0 = 2, a = 1/2 * 4 + 1 * 10 = 12", "a / l = 6", "14 / 2 = 7"):
        assert text in doc, text


# -- ptxas on every variant -----------------------------------------------------------------------------

VARIANTS = [(bn, d, dt) for bn in sa.BLOCK_NS for d in sa.HEAD_DIMS for dt in DTYPES]


def _instructions(ptx):
    return [line.strip() for line in ptx.splitlines() if line.strip() and not line.strip().startswith("//")]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("block_n,head_dim,dtype", VARIANTS, ids=[f"BN{b}-D{d}-{t}" for b, d, t in VARIANTS])
def test_every_variant_assembles_without_spills(arch, block_n, head_dim, dtype):
    ck = sa.streaming_attention_fwd.with_arch(arch).compile(DTYPE=dtype, HEAD_DIM=head_dim, BLOCK_N=block_n)
    rep = ck.report
    if not rep.available:
        pytest.skip(rep.note)
    assert rep.spills == 0 and rep.stack_frame == 0, str(rep)
    assert rep.registers <= (168 if head_dim <= 64 else 255), str(rep)
    total = sa.Smem(block_n, head_dim, sa.STAGES).total
    assert rep.shared_bytes == (total if total <= sa.STATIC_SMEM_LIMIT else 0)  # beyond: dynamic, opted in
    ins = _instructions(ck.ptx)
    count = lambda text: sum(text in line for line in ins)  # noqa: E731
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype.name}.{dtype.name}.f32"
    assert count(mma) == 2 * (block_n // 8) * (head_dim // 16)  # S and PV, fully unrolled, once
    assert count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == (block_n // 16) * (head_dim // 16)
    assert count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == (block_n // 16) * (head_dim // 16)
    assert count("cp.async.cg.shared.global") > 0 and count("cp.async.wait_group 0") == 1
    assert count("ex2.approx.ftz.f32") >= block_n // 2
    assert count(f"cvt.rn.{dtype.name}x2.f32") >= block_n // 4  # P rounded to the input dtype
    assert f".target {arch}" in ck.ptx


@pytest.mark.parametrize("options", [dict(HAS_MASK=True, RETURN_LSE=True), dict(WARPS=8), dict(WARPS=1),
                                     dict(ASYNC_COPY=False)], ids=["mask-lse", "warps8", "warps1", "ld-st"])
def test_options_assemble_without_spills(options):
    for head_dim in sa.HEAD_DIMS:
        ck = sa.streaming_attention_fwd.compile(HEAD_DIM=head_dim, BLOCK_N=sa.DEFAULT_BLOCK_N[head_dim], **options)
        if not ck.report.available:
            pytest.skip(ck.report.note)
        assert ck.report.spills == 0 and ck.report.stack_frame == 0, str(ck.report)


def test_codegen_is_deterministic():
    a = sa.streaming_attention_fwd.trace(HEAD_DIM=32, BLOCK_N=32)
    b = sa.streaming_attention_fwd.trace(HEAD_DIM=32, BLOCK_N=32)
    from tylopy.codegen.llvm import lower_kernel
    from tylopy.codegen.ptx import optimize_and_emit
    assert optimize_and_emit(str(lower_kernel(a)), "sm_80")[1] == optimize_and_emit(str(lower_kernel(b)), "sm_80")[1]


# -- ldmatrix addressing against the PTX ISA's fragment tables ----------------------------------------------

def _ldmatrix_x4(smem: np.ndarray, row_addr, trans: bool) -> np.ndarray:
    """PTX ISA ldmatrix .m8n8.x4 .b16: lanes 8i..8i+7 give the 8 row addresses of matrix i; without
    .trans lane l receives row l/4, elements 2(l%4), 2(l%4)+1 of each matrix, with .trans row
    2(l%4) and 2(l%4)+1 of column l/4. Returns [lane, register, half] of element values."""
    flat = smem.reshape(-1)
    mats = np.stack([np.stack([flat[row_addr[8 * i + r] // 2:row_addr[8 * i + r] // 2 + 8] for r in range(8)])
                     for i in range(4)])  # [matrix, row, col]
    out = np.zeros((32, 4, 2), dtype=smem.dtype)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            for h in range(2):
                out[lane, i, h] = mats[i, 2 * t + h, g] if trans else mats[i, g, 2 * t + h]
    return out


def _b_expected(tile_kn: np.ndarray) -> np.ndarray:
    """mma.m16n8k16 B fragment from the PTX ISA: b_r[h] = B[k = 2t + h + 8r][n = g]."""
    out = np.zeros((32, 2, 2), dtype=tile_kn.dtype)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r in range(2):
            for h in range(2):
                out[lane, r, h] = tile_kn[2 * t + h + 8 * r, g]
    return out


def _swizzled_tile(values: np.ndarray, head_dim: int) -> np.ndarray:
    """A BLOCK_N x D tile stored as the kernel stores it (element ids as values)."""
    block_n = values.shape[0]
    smem = np.full(block_n * head_dim, -1, dtype=np.int64)
    for row in range(block_n):
        for chunk in range(head_dim // 8):
            off = sa.swizzled_offset(row, chunk, head_dim) // 2
            smem[off:off + 8] = values[row, 8 * chunk:8 * chunk + 8]
    assert (smem >= 0).all(), "the swizzle must be a bijection on the tile"
    return smem


@pytest.mark.parametrize("block_n", sa.BLOCK_NS)
@pytest.mark.parametrize("head_dim", sa.HEAD_DIMS)
def test_k_operands_are_the_isa_b_fragments_of_k_transposed(block_n, head_dim):
    ids = np.arange(block_n * head_dim).reshape(block_n, head_dim)  # K[key][d]
    smem = _swizzled_tile(ids, head_dim)
    for n_pair in range(block_n // 16):
        for kk in range(head_dim // 16):
            addr = [sa.swizzled_offset(*sa.k_operand_row_chunk(lane, n_pair, kk), head_dim) for lane in range(32)]
            got = _ldmatrix_x4(smem, addr, trans=False)
            for half in range(2):  # the two 8-key atoms
                keys = slice(16 * n_pair + 8 * half, 16 * n_pair + 8 * half + 8)
                b_tile = ids[keys, 16 * kk:16 * kk + 16].T  # B[k = d][n = key]
                np.testing.assert_array_equal(got[:, 2 * half:2 * half + 2], _b_expected(b_tile))


@pytest.mark.parametrize("block_n", sa.BLOCK_NS)
@pytest.mark.parametrize("head_dim", sa.HEAD_DIMS)
def test_v_operands_are_the_isa_b_fragments_of_v(block_n, head_dim):
    ids = np.arange(block_n * head_dim).reshape(block_n, head_dim)  # V[key][d]
    smem = _swizzled_tile(ids, head_dim)
    for kk in range(block_n // 16):
        for d_pair in range(head_dim // 16):
            addr = [sa.swizzled_offset(*sa.v_operand_row_chunk(lane, kk, d_pair), head_dim) for lane in range(32)]
            got = _ldmatrix_x4(smem, addr, trans=True)
            for half in range(2):  # the two 8-wide d atoms
                b_tile = ids[16 * kk:16 * kk + 16, 16 * d_pair + 8 * half:16 * d_pair + 8 * half + 8]  # B[k=key][n=d]
                np.testing.assert_array_equal(got[:, 2 * half:2 * half + 2], _b_expected(b_tile))


@pytest.mark.parametrize("head_dim", sa.HEAD_DIMS)
def test_ldmatrix_phases_hit_eight_different_bank_groups(head_dim):
    """Each 8x8 matrix of an ldmatrix (8 consecutive rows, one logical chunk) covers all 32 banks once."""
    for row0 in range(0, 64, 8):
        for chunk in range(head_dim // 8):
            groups = {(sa.swizzled_offset(row0 + r, chunk, head_dim) // 16) % 8 for r in range(8)}
            assert len(groups) == 8


# -- input checks and dispatch ---------------------------------------------------------------------------

def _qkv(n_q=8, n_k=8, D=32, dtype=torch.bfloat16, B=1, H=2):
    return (torch.zeros(B, H, n_q, D, dtype=dtype), torch.zeros(B, H, n_k, D, dtype=dtype),
            torch.zeros(B, H, n_k, D, dtype=dtype))


@pytest.mark.parametrize("change,exc,words", [
    (dict(n_q=8, n_k=12, causal=True), ValueError, "is_causal"),
    (dict(D=256), ValueError, "head_dim"),
    (dict(D=48), ValueError, "head_dim"),
    (dict(dtype=torch.float32), TypeError, "query expects dtype"),
    (dict(device="cpu"), ValueError, "CUDA"),
    (dict(block_n=128), ValueError, "block_n"),
    (dict(warps=3), ValueError, "warps"),
])
def test_bad_inputs_are_rejected_naming_the_argument(change, exc, words):
    q, k, v = _qkv(change.get("n_q", 8), change.get("n_k", 8), change.get("D", 32),
                   change.get("dtype", torch.bfloat16))
    with pytest.raises(exc, match=words):
        pl.streaming_attention(q, k, v, is_causal=change.get("causal", False), block_n=change.get("block_n"),
                               warps=change.get("warps"))


@pytest.mark.parametrize("which,shape,words", [
    ("key", (2, 2, 8, 32), "key/value batch"),
    ("value", (1, 3, 8, 32), "key/value heads"),
    ("key", (1, 2, 8, 16), "key/value head_dim"),
    ("value", (1, 2, 9, 32), "value expects as many rows as key"),
])
def test_mismatched_shapes_are_rejected(which, shape, words):
    q, k, v = _qkv()
    bad = torch.zeros(shape, dtype=torch.bfloat16)
    args = dict(query=q, key=k, value=v)
    args[which] = bad
    with pytest.raises(ValueError, match=words):
        pl.streaming_attention(**args)


def test_mismatched_dtypes_and_masks_are_rejected():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="key/value"):
        pl.streaming_attention(q, k.half(), v)
    with pytest.raises(TypeError, match="attn_mask"):
        pl.streaming_attention(q, k, v, attn_mask=torch.zeros(8, 8))
    with pytest.raises(ValueError, match="attn_mask"):
        pl.streaming_attention(q, k, v, attn_mask=torch.ones(3, 8, dtype=torch.bool))


@pytest.mark.parametrize("capability,expected", [((8, 0), ("sm_80", False)), ((8, 6), ("sm_86", False)),
                                                 ((8, 9), ("sm_89", False)), ((9, 0), ("sm_90", False)),
                                                 ((10, 0), ("sm_80", True)), ((12, 0), ("sm_80", True))])
def test_arch_choice(capability, expected):
    assert pl.device_arch(capability) == expected


def test_pre_ampere_is_rejected():
    with pytest.raises(ValueError, match="compute capability 8.0"):
        pl.device_arch((7, 5))


def test_checks_dispatch(capsys):
    from tylopy import cli
    assert cli.main(["check", "streaming_attention", "--list", "-k", "worked"]) == 0
    names = capsys.readouterr().out.split()
    assert names and all("worked" in n for n in names)
    assert cli.main(["check", "no_such_checker"]) == 2
    assert "no check 'no_such_checker'" in capsys.readouterr().err


def test_checker_cases_cover_the_issue():
    names = " ".join(c.name for c in cases.PORTABLE_CASES)
    for n in (1, 2, 15, 17, 63, 65, 2047, 2048, 4096, 5000):
        assert f"N{n}-" in names
    for text in ("BN32", "BN64", "D16", "D32", "D64", "bf16", "f16", "causal", "uniform", "large", "mask",
                 "future", "worked", "poison", "rect", "bnhd"):
        assert text in names, text
    assert len({c.name for c in cases.PORTABLE_CASES}) == len(cases.PORTABLE_CASES)


# -- emulated launches (the ld/st copy path), checked like the GPU checker checks -------------------------

EMULATED = ["N17-D64-BN64-bf16", "N65-D32-BN32-bf16", "N63-D64-BN64-bf16-causal", "mask-hqk-D16-f16",
            "ragged-rect-300x7-D64", "worked-example-two-tiles-D32-BN32"]


@pytest.mark.parametrize("name", EMULATED)
def test_emulated_kernel_matches_the_references(name):
    case = next(c for c in cases.PORTABLE_CASES if c.name == name)
    if case.kind == "worked":
        q, k, v, mask, scale = cases.worked_example_inputs(case.head_dim, case.dtype, case.block_n, True, "cpu")
    else:
        q, k, v, mask = cases.make_inputs(case, "cpu")
        scale = case.resolved_scale
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full((B, H, n_q), float("nan"))
    mask_t = pl.mask_view(mask, (B, H, n_q, n_k)) if mask is not None else pl.unused("cpu", torch.uint8, 4)
    rows = sa.ROWS_PER_WARP * case.warps
    i16 = torch.int16
    sa.streaming_attention_fwd.emulate(
        q=q.view(i16), k=k.view(i16), v=v.view(i16), out=out.view(i16), lse=lse, mask=mask_t, scale=scale,
        causal=int(case.causal), grid=((n_q + rows - 1) // rows, H, B),
        DTYPE=ty.bf16 if q.dtype == torch.bfloat16 else ty.f16, HEAD_DIM=D, BLOCK_N=case.block_n, WARPS=case.warps,
        HAS_MASK=mask is not None, RETURN_LSE=True, ASYNC_COPY=False)
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    if case.kind == "worked":
        assert (out.double() - 6.0).abs().max().item() < 1e-2
        return
    model = scenarios.portable_model(case).replace(lse=True)
    rules.check_output(out, lse, R.AttentionInputs(q, k, v, mask, case.causal, scale), model, stats=False)
    ref = R.oracle(q, k, v, mask, case.causal, scale)
    half_ulp = R.UNIT_ROUNDOFF[q.dtype]
    assert (out.double() - ref.out).abs().max().item() <= 8 * half_ulp * max(1.0, ref.out.abs().max().item())
