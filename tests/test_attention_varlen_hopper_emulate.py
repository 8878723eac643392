"""The Hopper forward over packed batches (``sm90/varlen_forward.py``) in the emulator, against the
float64 per-document reference.

Documents of ragged lengths: empty, length 1, shorter than a tile, longer than one, queries
without keys and keys without queries; causal aligned to each document's bottom-right corner
(more queries than keys leaves the first rows without keys: zeros, LSE -inf); grouped-query K/V;
seqused (only the first tokens of a document count); every row past a document's used rows is
NaN in q, k and v (the next document's values or NaN: the kernel must mask them and zero V), and
output rows outside every document stay zero, LSE -inf. Persistent grids (more work tiles than
CTAs, the ring of stages running on across documents) too. Also: the dense kernel's PTX does not
change with the varlen hooks (they vanish for dense problems).
"""
import math

import pytest
import torch

from tylopy.runtime.tensormap import TensorMapSpec
from tylopy_kernels.attention.sm90 import tiles
from tylopy_kernels.attention.sm90.varlen_forward import attention_varlen_fwd_sm90
from tylopy_kernels.attention.sm90.varlen_launch import (ForwardTensors, HopperOptions, MapTarget, PackedDocs,
                                                         plan_varlen_launch)
from tylopy_kernels.attention.testing.packed import Documents, packed, prefix_sums, reference


def _spec(t, dims, strides, box):
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "bf16" if t.dtype == torch.bfloat16 else "f16",
                         128)


def emulate_varlen(lens_q, lens_k, H, H_kv, D, causal, used_q=None, used_k=None, schedule=None,
                   dtype=torch.bfloat16, seed=0, sched_seed=None):
    """(out, lse, q, k, v, plan): the kernel's output in the emulator (out zeroed, lse -inf as the
    launcher's caller sets them); ``sched_seed``: the emulator's random warp order (None: round robin)."""
    g = torch.Generator().manual_seed(seed)
    used_q, used_k = used_q or lens_q, used_k or lens_k
    q = packed(lens_q, used_q, H, D, dtype, g)
    k, v = packed(lens_k, used_k, H_kv, D, dtype, g, pad=5), packed(lens_k, used_k, H_kv, D, dtype, g, pad=5)
    out = torch.zeros(q.shape, dtype=dtype)
    lse = torch.full((H, q.shape[0]), float("-inf"))
    seqused = (None if used_q == lens_q else torch.tensor(used_q, dtype=torch.int32),
               None if used_k == lens_k else torch.tensor(used_k, dtype=torch.int32))
    docs = PackedDocs(prefix_sums(lens_q), prefix_sums(lens_k), max(lens_q), max(lens_k), *seqused)
    plan = plan_varlen_launch(ForwardTensors(q, k, v, out, lse), docs, HopperOptions(1 / math.sqrt(D), causal, schedule),
                              MapTarget(_spec, sm_count=3))
    attention_varlen_fwd_sm90.emulate(*plan.args, grid=plan.grid, seed=sched_seed, **plan.constexprs)
    return out, lse, q, k, v, plan


def check_varlen(out, lse, q, k, v, lens_q, lens_k, causal, used_q=None, used_k=None, tol=2e-2):
    used_q, used_k = used_q or lens_q, used_k or lens_k
    want, want_lse, rows = reference(q, k, v, Documents(lens_q, used_q), Documents(lens_k, used_k), causal,
                                     1 / math.sqrt(q.shape[-1]))
    assert torch.isfinite(out).all(), "NaN/inf in the output"
    err = (out.double() - want).abs().max().item()
    assert err <= tol * torch.nan_to_num(v.double()).abs().max().item(), f"max error {err:.3e}"
    others = torch.ones(q.shape[0], dtype=torch.bool)
    others[rows] = False
    assert (out[others] == 0).all(), "a row outside every document's used rows was written"
    assert (lse[:, others] == float("-inf")).all()
    no_keys = want_lse == float("-inf")
    assert (lse[no_keys] == float("-inf")).all(), "a row without keys got a finite LSE"
    lerr = (lse.double()[~no_keys] - want_lse[~no_keys]).abs().max().item() if (~no_keys).any() else 0.0
    assert lerr <= 1e-4 * max(1.0, want_lse[~no_keys].abs().max().item()), f"LSE error {lerr:.3e}"


CASES = [
    # name, query lengths, key lengths, H, H_kv, D, causal, used_q, used_k, schedule
    ("D64-ragged", (0, 1, 17, 140, 300), (5, 1, 0, 200, 300), 2, 1, 64, False, None, None, {}),
    ("D64-causal-bottom-right-3-consumers", (0, 1, 17, 140, 300, 200), (5, 1, 0, 200, 300, 50), 2, 1, 64, True, None,
     None, {"CONSUMERS": 3}),
    ("D128-causal-gqa", (33, 150, 1), (33, 260, 7), 4, 2, 128, True, None, None, {}),
    ("D128-seqused", (40, 130, 9), (60, 200, 9), 2, 2, 128, False, (40, 100, 0), (31, 199, 9), {}),
    ("D64-seqused-causal-f16", (70, 200), (70, 300), 2, 2, 64, True, (64, 190), (70, 129), {"CONSUMERS": 2}),
    ("D64-persistent-causal", (1, 150, 260, 40, 0, 130), (1, 150, 260, 90, 3, 130), 2, 1, 64, True, None, None,
     {"PERSISTENT": True, "CONSUMERS": 2}),
    ("D128-persistent", (200, 5, 129), (3, 250, 129), 2, 1, 128, False, None, None, {"PERSISTENT": True}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_varlen_forward_against_the_reference(case):
    _, lq, lk, H, H_kv, D, causal, uq, uk, schedule = case
    dtype = torch.float16 if "f16" in case[0] else torch.bfloat16
    out, lse, q, k, v, plan = emulate_varlen(lq, lk, H, H_kv, D, causal, uq, uk, schedule, dtype=dtype)
    for key, val in schedule.items():
        assert plan.constexprs[key] == val
    check_varlen(out, lse, q, k, v, lq, lk, causal, uq, uk)


def test_malformed_lengths_are_clamped_on_the_device():
    """A document longer than max_seqlen is cut to it and a negative length counts as none: the
    kernel never reads or writes outside the rows the prefix sums name (no host check of device data)."""
    g = torch.Generator().manual_seed(3)
    q = packed((100, 60), (100, 60), 1, 64, torch.bfloat16, g, pad=0)
    k, v = (packed((100, 60), (100, 60), 1, 64, torch.bfloat16, g, pad=0) for _ in range(2))
    out = torch.zeros(q.shape, dtype=q.dtype)
    lse = torch.full((1, 160), float("-inf"))
    cu = torch.tensor([0, 100, 60], dtype=torch.int32)  # the second document runs backwards
    plan = plan_varlen_launch(ForwardTensors(q, k, v, out, lse), PackedDocs(cu, cu, 64, 64), HopperOptions(0.125),
                              MapTarget(_spec))
    attention_varlen_fwd_sm90.emulate(*plan.args, grid=plan.grid, **plan.constexprs)
    whole = Documents((64,), (64,))
    want, want_lse, _ = reference(q[:64], k[:64], v[:64], whole, whole, False, 0.125)
    assert (out[:64].double() - want).abs().max().item() < 2e-2
    assert (out[64:] == 0).all() and (lse[:, 64:] == float("-inf")).all()


def _instructions(ptx):
    """PTX without source locations (the hooks move the kernel source's lines)."""
    lines = (ln.split("//")[0].rstrip() for ln in ptx.splitlines())
    return [ln for ln in lines if ln and not ln.lstrip().startswith((".loc", ".file"))]


@pytest.mark.parametrize("cx", [dict(HEAD_DIM=64, PERSISTENT=False, ORDER="heads", EXPONENT="shared"),
                                dict(HEAD_DIM=128, CONSUMERS=2, PERSISTENT=True, ORDER="lpt", TMA_STORE=True,
                                     RETURN_LSE=True, HAS_MASK=True)], ids=["D64", "D128-persistent-mask-lse"])
def test_dense_ptx_does_not_change_with_the_varlen_hooks(cx, monkeypatch):
    """The hooks the packed kernel adds to the shared roles (``tiles.shift``, ``tile_problem``,
    ``batch_coord``, ``Problem.varlen``) emit nothing for a dense problem: the dense kernel's PTX
    equals the one traced with the hooks replaced by what the code did before them."""
    from tylopy_kernels.attention.sm90 import consumer, forward
    from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90
    with_hooks = attention_fwd_sm90.compile(**cx).ptx
    calls = []

    def plain_shift(x, offset):
        calls.append(offset)
        return x

    monkeypatch.setenv("TYLOPY_CACHE", "0")  # trace again, whatever the disk cache holds
    for mod in (tiles, consumer, forward):
        for name, plain in (("shift", plain_shift), ("tile_problem", lambda prob, b: prob),
                            ("batch_coord", lambda prob, b: b)):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, plain)
    attention_fwd_sm90.clear_cache()
    try:
        without = attention_fwd_sm90.compile(**cx).ptx
    finally:
        monkeypatch.undo()
        attention_fwd_sm90.clear_cache()
    assert calls, "the replaced hooks were not traced"
    assert _instructions(with_hooks) == _instructions(without)


# -- host checks -----------------------------------------------------------------------------------------

def _meta_args(**change):
    q = torch.zeros(10, 2, 64, dtype=torch.bfloat16, device="meta")
    args = dict(q=q, k=q.clone(), v=q.clone(), cu_seqlens_q=prefix_sums([4, 6]), cu_seqlens_k=prefix_sums([4, 6]),
                max_seqlen_q=6, max_seqlen_k=6)
    args.update(change)
    return args


HOST_BAD = [
    ("not from 0", dict(cu_seqlens_q=torch.tensor([1, 4, 10], dtype=torch.int32)), "cu_seqlens_q", "first entry"),
    ("decreasing", dict(cu_seqlens_k=torch.tensor([0, 7, 6], dtype=torch.int32)), "cu_seqlens_k", "non-decreasing"),
    ("past the rows", dict(cu_seqlens_q=torch.tensor([0, 5, 11], dtype=torch.int32)), "cu_seqlens_q", "at most"),
    ("longer than max", dict(max_seqlen_k=5), "max_seqlen_k", "longest"),
    ("seqused dtype", dict(seqused_k=torch.tensor([1, 2])), "seqused_k", "int32"),
    ("seqused count", dict(seqused_q=torch.tensor([1, 2, 3], dtype=torch.int32, device="meta")), "seqused_q", "2"),
]


@pytest.mark.parametrize("change,arg,what", [b[1:] for b in HOST_BAD], ids=[b[0] for b in HOST_BAD])
def test_host_prefix_sums_and_seqused_are_checked_naming_the_argument(change, arg, what):
    """Prefix sums on the host are checked there (no wait on the GPU), before anything runs."""
    from tylopy_kernels.attention import attention_varlen
    with pytest.raises((ValueError, TypeError)) as info:
        attention_varlen(**_meta_args(**change))
    text = str(info.value)
    assert arg in text and what in text and "expects" in text and "but got" in text, text


def test_host_prefix_sums_are_moved_to_the_device():
    from tylopy_kernels.attention import attention_varlen
    out, lse = attention_varlen(**_meta_args(), return_lse=True)
    assert out.device.type == "meta" and lse.shape == (2, 10)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("lse,seqused", [(False, False), (True, True)])
def test_default_schedules_spill_within_their_bounds(D, lse, seqused):
    """ptxas: what the launcher picks keeps every value in registers (no local memory), except D=64's
    three consumers, whose document bounds spill a few bytes (varlen_launch.SCHEDULE says why that
    is the faster choice); the bound keeps that from growing unnoticed."""
    import tylopy as ty
    from tylopy_kernels.attention.sm90.varlen_launch import resolve_schedule
    cx = dict(resolve_schedule(D, True), DTYPE=ty.bf16, HEAD_DIM=D, RETURN_LSE=lse, SEQUSED_Q=seqused,
              SEQUSED_K=seqused)
    report = attention_varlen_fwd_sm90.compile(**cx).report
    if not report.available:
        pytest.skip("ptxas is not installed")
    if D == 64:
        assert report.spill_stores <= 12 and report.spill_loads <= 28, str(report)
    else:
        assert not report.has_local_memory, str(report)


def test_host_prefix_sums_may_be_lists():
    from tylopy_kernels.attention import attention_varlen
    out = attention_varlen(**_meta_args(cu_seqlens_q=[0, 4, 10], cu_seqlens_k=[0, 4, 10]))
    assert out.shape == (10, 2, 64)
    with pytest.raises(ValueError, match="cu_seqlens_k expects non-decreasing"):
        attention_varlen(**_meta_args(cu_seqlens_k=[0, 7, 6]))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_persistent_schedule_under_random_warp_orders(seed):
    """The persistent loop passes work tiles past their document's end (several in a row). Under a
    random order of warps a consumer's leader used to arrive on q_empty while the other warps of its
    warpgroup had not yet passed their q_full wait; two skipped tiles later the parity came round
    and they waited a lap late -- the kernel never finished on an H200, while the round-robin
    emulator (every warp of a warpgroup reaches a wait in the same round) ran it to the right
    numbers. The emulator now names such a lagging warp at its wait (``check_lap``)."""
    lens = (1, 150, 260, 40, 0, 130)
    out, lse, q, k, v, _ = emulate_varlen(lens, lens, 2, 1, 64, True, schedule={"PERSISTENT": True, "CONSUMERS": 2},
                                          sched_seed=seed)
    check_varlen(out, lse, q, k, v, lens, lens, True)
