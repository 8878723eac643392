"""CPU tier of the portable attention backward (tylopy_kernels/attention/portable/backward.py).

* ptxas on every specialization the launcher uses (head dim x dtype x mask / packed sequences,
  sm_80 and sm_90): no spills, no stack frame, within the shared memory an sm_86 block may have;
* the emulator runs the launcher's plans (forward, then the three backward kernels) on small
  ragged, causal, masked, grouped-query and LSE-gradient cases, checked against the float64
  reference with FlashAttention's rule (``grad_check.py``), with NaN in memory past every end
  and NaN in the gradient buffers before the launch;
* dK, dV and dQ are bitwise the same under random warp schedules (no atomics anywhere);
* the launcher's argument checks.
"""
import pytest
import torch

import tylopy as ty
from tylopy_kernels.attention.portable import backward as bp
from tylopy_kernels.attention.testing import grad_check as grad_check
from tylopy_kernels.attention.portable.backward_launch import BackwardOptions, BackwardTensors, plan_backward_portable

SM86_SMEM = 99 * 1024  # the most shared memory a block may opt into on sm_86/sm_89


# -- ptxas ---------------------------------------------------------------------------------------------------

def _variants():
    out = []
    for d in bp.HEAD_DIMS:
        out += [(d, ty.bf16, {}), (d, ty.f16, {}), (d, ty.bf16, {"HAS_MASK": True}), (d, ty.bf16, {"VARLEN": True})]
    return out


VARIANTS = _variants()
IDS = [f"D{d}-{t.name}-{'-'.join(k for k in o) or 'plain'}" for d, t, o in VARIANTS]


def _no_atomics(ptx):
    return not any(line.split()[0].startswith(("atom.", "red.")) for line in ptx.splitlines() if line.split())


def _assembles(ck, limit_registers=255):
    rep = ck.report
    if not rep.available:
        pytest.skip(rep.note)
    assert rep.spills == 0 and rep.stack_frame == 0, str(rep)
    assert rep.registers <= limit_registers, str(rep)
    assert ck.dynamic_shared_bytes + rep.shared_bytes <= SM86_SMEM, str(rep)
    return ck


@pytest.mark.parametrize("head_dim,dtype,options", VARIANTS, ids=IDS)
def test_dkdv_kernel_assembles_without_spills(head_dim, dtype, options):
    ck = _assembles(bp.attention_bwd_dkdv_portable.compile(DTYPE=dtype, HEAD_DIM=head_dim, BLOCK_M=bp.BLOCK_M[head_dim],
                                                           KV_SMEM=bp.KV_SMEM[head_dim], **options))
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype.name}.{dtype.name}.f32"
    count = sum(mma in line for line in ck.ptx.splitlines())
    assert count == 4 * (bp.BLOCK_M[head_dim] // 8) * (head_dim // 16)  # S^T, dP^T, dV, dK: unrolled once
    assert _no_atomics(ck.ptx)  # deterministic


@pytest.mark.parametrize("head_dim,dtype,options", VARIANTS, ids=IDS)
def test_dq_kernel_assembles_without_spills(head_dim, dtype, options):
    ck = _assembles(bp.attention_bwd_dq_portable.compile(DTYPE=dtype, HEAD_DIM=head_dim, BLOCK_N=bp.BLOCK_N[head_dim],
                                                         **options))
    assert _no_atomics(ck.ptx)


@pytest.mark.parametrize("head_dim", bp.HEAD_DIMS)
def test_preprocess_and_sm90_builds_assemble(head_dim):
    for has_dlse in (False, True):
        _assembles(bp.attention_bwd_preprocess_portable.compile(HEAD_DIM=head_dim, HAS_DLSE=has_dlse, VARLEN=True))
    for kern, cx in ((bp.attention_bwd_dkdv_portable, dict(BLOCK_M=bp.BLOCK_M[head_dim], KV_SMEM=bp.KV_SMEM[head_dim])),
                     (bp.attention_bwd_dq_portable, dict(BLOCK_N=bp.BLOCK_N[head_dim]))):
        ck = _assembles(kern.with_arch("sm_90").compile(HEAD_DIM=head_dim, **cx))
        assert ".target sm_90" in ck.ptx


# -- emulated runs against the float64 reference ----------------------------------------------------------------

def nan_padded(shape, dtype, gen, pad=(0, 0, 3, 0)):
    """A random tensor viewed inside a larger NaN-filled buffer (padding after each dim's end)."""
    big = torch.full([n + p for n, p in zip(shape, pad)], float("nan"), dtype=dtype)
    view = big[tuple(slice(0, n) for n in shape)]
    view.copy_(torch.randn(shape, generator=gen).to(dtype))
    return view


CASES = [
    # (name, B, H, H_kv, n_q, n_k, D, dtype, causal, mask kind, dlse)
    ("ragged-D16-f16", 1, 2, 2, 5, 70, 16, torch.float16, False, None, False),
    ("ragged-D32-bf16", 2, 1, 1, 37, 21, 32, torch.bfloat16, False, None, False),
    ("causal-D64-bf16", 1, 2, 2, 45, 45, 64, torch.bfloat16, True, None, False),
    ("causal-D128-f16", 1, 1, 1, 40, 40, 128, torch.float16, True, None, False),
    ("gqa4-D64-bf16", 1, 4, 1, 20, 33, 64, torch.bfloat16, False, None, False),
    ("gqa2-causal-D32", 1, 4, 2, 33, 33, 32, torch.bfloat16, True, None, False),
    ("mask-random-D32", 1, 2, 2, 24, 40, 32, torch.bfloat16, False, "random", False),
    ("mask-heads-empty-rows-D16", 2, 2, 2, 17, 19, 16, torch.float16, False, "rows", False),
    ("dlse-D64", 1, 2, 2, 19, 30, 64, torch.bfloat16, False, None, True),
    ("gqa-D128-ragged", 1, 2, 1, 9, 50, 128, torch.bfloat16, False, None, False),
]


def _mask(kind, B, H, n_q, n_k, gen):
    if kind == "random":
        return torch.rand(B, H, n_q, n_k, generator=gen) > 0.4
    if kind == "rows":  # per head, broadcast over batch; some query rows have no key at all
        m = torch.rand(1, H, n_q, n_k, generator=gen) > 0.5
        m[:, :, ::4] = False
        return m
    return None


def _case_inputs(B, H, H_kv, n_q, n_k, D, dtype, mask_kind, dlse, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = nan_padded((B, H, n_q, D), dtype, gen)
    k = nan_padded((B, H_kv, n_k, D), dtype, gen)
    v = nan_padded((B, H_kv, n_k, D), dtype, gen, pad=(0, 1, 5, 0))
    dout = nan_padded((B, H, n_q, D), dtype, gen)
    mask = _mask(mask_kind, B, H, n_q, n_k, gen)
    g = torch.randn(B, H, n_q, generator=gen) if dlse else None
    return q, k, v, dout, mask, g


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_emulated_gradients_pass_the_flash_attention_rule(case):
    _, B, H, H_kv, n_q, n_k, D, dtype, causal, mask_kind, with_dlse = case
    q, k, v, dout, mask, dlse = _case_inputs(B, H, H_kv, n_q, n_k, D, dtype, mask_kind, with_dlse)
    got, scale = grad_check.emulate(grad_check.BackwardInputs(q, k, v, dout, mask, causal, dlse=dlse))
    summary = grad_check.check(got, grad_check.BackwardInputs(q, k, v, dout, mask, causal, scale, dlse))
    assert summary
    if mask_kind == "rows":  # rows with no key: zeros out, -inf LSE, no gradient
        empty = ~mask.expand(B, H, n_q, n_k).any(-1)
        assert empty.any() and (got["lse"][empty] == float("-inf")).all()
        assert (got["dq"][empty] == 0).all()


def test_gradients_are_bitwise_the_same_under_random_warp_schedules():
    q, k, v, dout, mask, _ = _case_inputs(1, 4, 2, 33, 40, 32, torch.bfloat16, None, False, seed=5)
    first, _ = grad_check.emulate(grad_check.BackwardInputs(q, k, v, dout), seed=None)
    for seed in (1, 2):
        again, _ = grad_check.emulate(grad_check.BackwardInputs(q, k, v, dout), seed=seed)
        for name in ("dq", "dk", "dv"):
            assert torch.equal(first[name].view(torch.int16), again[name].view(torch.int16)), (name, seed)


def test_nonpositive_and_tiny_shapes_give_zero_or_exact_gradients():
    gen = torch.Generator().manual_seed(3)
    # one query, one key: P = 1, so dV = dO exactly, dQ = dK = 0 (dS = P (dP - delta) = 0)
    q, k, v, dout = (torch.randn(1, 1, 1, 16, generator=gen).to(torch.bfloat16) for _ in range(4))
    got, _ = grad_check.emulate(grad_check.BackwardInputs(q, k, v, dout))
    assert torch.equal(got["dv"], dout) and (got["dq"] == 0).all() and (got["dk"] == 0).all()
    # no keys: the launcher zeroes the gradients without a launch
    q = torch.randn(1, 2, 5, 32).to(torch.bfloat16)
    empty = torch.zeros(1, 2, 0, 32, dtype=torch.bfloat16)
    dq = torch.full_like(q, float("nan"))
    tensors = BackwardTensors(q, empty, empty, q, q, torch.zeros(1, 2, 5), dq, empty.clone(), empty.clone())
    assert plan_backward_portable(tensors, BackwardOptions(scale=1.0)) == []
    assert (dq == 0).all()


# -- launcher checks ---------------------------------------------------------------------------------------------

def _buffers(D=32, H=2, H_kv=2, dtype=torch.bfloat16):
    q = torch.zeros(1, H, 8, D, dtype=dtype)
    k = torch.zeros(1, H_kv, 8, D, dtype=dtype)
    return dict(q=q, k=k, v=k.clone(), out=q.clone(), dout=q.clone(), lse=torch.zeros(1, H, 8), dq=q.clone(),
                dk=k.clone(), dv=k.clone())


@pytest.mark.parametrize("change,exc,words", [
    (dict(D=48), ValueError, "head_dim"),
    (dict(H=3, H_kv=2), ValueError, "key/value heads"),
    (dict(lse=torch.zeros(1, 2, 7)), ValueError, "lse expects an fp32 tensor of shape"),
    (dict(lse=torch.zeros(1, 2, 8, dtype=torch.float64)), ValueError, "lse"),
    (dict(dv=torch.zeros(1, 2, 9, 32, dtype=torch.bfloat16)), ValueError, "dv expects shape"),
    (dict(dq=torch.zeros(1, 2, 8, 32, dtype=torch.float16)), TypeError, "dq expects dtype"),
    (dict(dk=torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)[..., ::2]), ValueError, "dk expects a contiguous last"),
])
def test_launcher_rejects_bad_buffers_naming_them(change, exc, words):
    shape = {n: change.pop(n) for n in ("D", "H", "H_kv") if n in change}
    args = _buffers(**shape)
    args.update(change)
    with pytest.raises(exc, match=words):
        plan_backward_portable(BackwardTensors(**args), BackwardOptions(scale=1.0))
