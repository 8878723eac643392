"""Q, K and V with three different layouts, in the emulator, against the FP64 references.

A launcher that passes K's strides (or K's tensor-map geometry) for V reads V at K's addresses; when
K and V share a layout every other test still passes. Here they never do: each tensor sits in its
own buffer with its own padding and dimension order, and K/V heads are grouped (GQA), so a head, a
row or a batch stride taken from the wrong tensor reads other numbers (or the NaN padding). Each
kernel is also run with the launcher mutated to use K's strides for V, and the check must fail.

* portable kernel (per-tensor strides): Q a (B, n_q, H, D) buffer seen as (B, H, n_q, D); K a
  (B, H_kv, n_k, D) buffer padded along keys and head dim; V an (n_k, B, H_kv, D) buffer permuted.
* Hopper kernel (one coordinate order shared by the three tensor maps, strides per map): the same
  order, different strides: Q padded along the head dim, K padded along the keys, V padded along
  the keys differently and offset, batch of two.
"""
from __future__ import annotations

import inspect
import math

import pytest
import torch

from tylopy.emulate.errors import MemoryAccessError
from tylopy.runtime.tensormap import TensorMapSpec

PL = pytest.importorskip("tylopy_kernels.attention.portable.launch")
L = pytest.importorskip("tylopy_kernels.attention.sm90.launch")
from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90  # noqa: E402
from tylopy_kernels.attention.testing.reference import HOPPER, PORTABLE  # noqa: E402
from attention_layout_cases import check_layouts, hopper_inputs, portable_inputs  # noqa: E402


def _caught_by(run, plan, mutation):
    """Run with the mutated plan: the references (AssertionError) or the emulator's bounds check must fail."""
    with pytest.raises((AssertionError, MemoryAccessError)) as info:
        run(plan)
    check = "check_output" if info.type is AssertionError else "the emulator's bounds check"
    print(f"\nmutation {mutation}: caught by {check} ({str(info.value).splitlines()[0][:200]})")


def _mutated(module, name, old, new):
    """``module.name`` compiled again from its source with ``old`` replaced by ``new``."""
    src = inspect.getsource(getattr(module, name))
    assert src.count(old) == 1, f"the mutation no longer applies: {old!r} is not once in {module.__name__}.{name}"
    code = compile(src.replace(old, new), inspect.getsourcefile(module), "exec")
    scope = dict(vars(module))
    exec(code, scope)
    return scope[name]


# -- the portable kernel: strides per tensor ------------------------------------------------------------

def run_portable(plan_forward):
    q, k, v = portable_inputs()
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:3], float("nan"))
    scale = 1 / math.sqrt(q.shape[-1])
    plan = plan_forward(PL.ForwardTensors(q, k, v, out, lse), PL.ForwardOptions(scale, block_n=32, warps=2))
    plan.run(emulate=True)
    return check_layouts(out, lse, q, k, v, scale, PORTABLE.replace(block_n=32, lse=True, dtype=q.dtype))


def test_portable_q_k_v_in_three_layouts():
    run_portable(PL.plan_forward)


def test_portable_v_read_with_k_strides_is_caught():
    mutated = _mutated(PL, "plan_forward", "*row_strides(v, packed)", "*row_strides(k, packed)")
    _caught_by(run_portable, mutated, "portable-v-with-k-strides")


# -- the Hopper kernel: one coordinate order, a tensor map per tensor ------------------------------------

def _spec(t, dims, strides, box):
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "bf16" if t.dtype == torch.bfloat16 else "f16",
                         128)


def run_hopper(plan_launch):
    q, k, v = hopper_inputs()
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:3], float("nan"))
    scale = 1 / math.sqrt(q.shape[-1])
    plan = plan_launch(L.ForwardTensors(q, k, v, out, lse), L.HopperOptions(scale, False, {"PERSISTENT": False, "CONSUMERS": 2}),
                       L.MapTarget(_spec, sm_count=132))
    attention_fwd_sm90.emulate(*plan.args, grid=plan.grid, **plan.constexprs)
    model = HOPPER.replace(block_n=plan.constexprs["BLOCK_N"], lse=True, dtype=q.dtype)
    return check_layouts(out, lse, q, k, v, scale, model)


def test_hopper_q_k_v_with_different_strides():
    run_hopper(L.plan_launch)


def test_hopper_v_mapped_with_k_geometry_is_caught():
    mutated = _mutated(L, "plan_launch", "maps = [make_map(t, *_map_geometry(t, rows, order))",
                       "maps = [make_map(t, *_map_geometry(kk if t is vv else t, rows, order))")
    _caught_by(run_hopper, mutated, "hopper-v-with-k-map-geometry")
