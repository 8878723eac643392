"""Q, K and V with three different layouts, in the emulator, against the FP64 references.

A launcher that passes K's strides (or K's tensor-map geometry) for V reads V at K's addresses; when
K and V share a layout every other test still passes. Here they never do: each tensor sits in its
own buffer with its own padding and dimension order, and K/V heads are grouped (GQA), so a head, a
row or a batch stride taken from the wrong tensor reads other numbers (or the NaN padding). Each
kernel is also run mutated to read V with K's strides, and the check must fail: the Hopper one with
its launcher mapping V with K's geometry, the portable one with its kernel reading V's pointer
through K's strides (its launcher passes each tensor whole, strides included: the kernel is where
one tensor's strides can still be taken for another's).

* portable kernel (per-tensor strides): Q a (B, n_q, H, D) buffer seen as (B, H, n_q, D); K a
  (B, H_kv, n_k, D) buffer padded along keys and head dim; V an (n_k, B, H_kv, D) buffer permuted.
* Hopper kernel (one coordinate order shared by the three tensor maps, strides per map): the same
  order, different strides: Q padded along the head dim, K padded along the keys, V padded along
  the keys differently and offset, batch of two.
"""
from __future__ import annotations

import importlib.util
import inspect
import math

import pytest
import torch

from tylopy.emulate.errors import MemoryAccessError
from tylopy.runtime.tensormap import TensorMapSpec

PL = pytest.importorskip("tylopy_kernels.attention.portable.launch")
F = pytest.importorskip("tylopy_kernels.attention.portable.forward")
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


def _mutated_kernel(module, name, old, new, tmp_path):
    """Kernel ``module.name`` from a copy of its module with ``old`` replaced by ``new`` (a kernel is
    traced from its file's text, so the copy is a file and a module of its own)."""
    src = inspect.getsource(module)
    assert src.count(old) == 1, f"the mutation no longer applies: {old!r} is not once in {module.__name__}"
    path = tmp_path / f"mutated_{module.__name__.rsplit('.', 1)[1]}.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mutated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutated)
    return getattr(mutated, name)


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


def test_portable_v_read_with_k_strides_is_caught(tmp_path, monkeypatch):
    kernel = _mutated_kernel(F, "attention_fwd_portable", "head_rows(prob.v, seq.b, kv_head,",
                             "head_rows(type(prob.v)('v', prob.v.spec, prob.v.ptr, prob.k.shape, prob.k.stride), "
                             "seq.b, kv_head,", tmp_path)
    monkeypatch.setattr(PL, "attention_fwd_portable", kernel)  # (plan_forward launches the module's global)
    _caught_by(run_portable, PL.plan_forward, "portable-v-with-k-strides")


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
