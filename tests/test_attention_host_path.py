"""The host path of ``tylopy.attention`` on Hopper without a GPU: a fake driver takes the launches
and CPU tensors stand in for CUDA ones. A call like an earlier one (same shapes, strides, dtype,
device, options) reuses its checks and its launch plan; these tests hold that reuse to giving
exactly the launch the full path gives, and to noticing whatever would change it.
"""
from types import MappingProxyType

import pytest
import torch

import tylopy as ty

from tylopy_kernels import attention as A
from tylopy_kernels.attention import dispatch
from tylopy_kernels.attention.sm90 import launch as HL


from attention_host_cases import _last_constexprs, hopper_host, qkv  # noqa: F401 (hopper_host: a fixture)




def launch(q, k, v, causal=False, scale=0.125, lse=False, schedule=None, out=None):
    out = torch.empty(q.shape, dtype=q.dtype) if out is None else out
    if lse is True:
        lse = torch.empty(q.shape[:3], dtype=torch.float32)
    lse_t = lse if isinstance(lse, torch.Tensor) else None
    HL.launch_hopper(HL.ForwardTensors(q, k, v, out, lse_t), HL.HopperOptions(scale, causal, schedule))
    return out, lse_t


def full_path(q, k, v, **kw):
    """The same launch through plan_launch every time (a schedule argument bypasses the reuse)."""
    return launch(q, k, v, schedule={}, **kw)


@pytest.mark.parametrize("causal, lse, n, d, h_kv", [
    (False, False, 256, 64, None), (True, True, 2048, 64, None), (False, True, 4096, 128, 2),
    (True, False, 512, 128, 1)])
def test_a_repeated_call_launches_what_the_full_path_launches(hopper_host, causal, lse, n, d, h_kv):
    q, k, v = qkv(n=n, d=d, h_kv=h_kv)
    launch(q, k, v, causal=causal, lse=lse)  # plans, and keeps the plan
    assert len(HL._repeats) == 1
    q2, k2, v2 = qkv(n=n, d=d, h_kv=h_kv, seed=1)  # new buffers: new addresses, new maps
    for args in ((q, k, v), (q2, k2, v2), (q2, k2, v2), (q, k, v)):
        hopper_host.clear()
        out = torch.empty(q.shape, dtype=q.dtype)
        lse_t = torch.empty(q.shape[:3], dtype=torch.float32) if lse else False
        full_path(*args, causal=causal, lse=lse_t, scale=0.3, out=out)
        launch(*args, causal=causal, lse=lse_t, scale=0.3, out=out)
        (grid_a, f_a, params_a), (grid_b, f_b, params_b) = hopper_host
        assert grid_a == grid_b and f_a == f_b and params_a == params_b
    assert len(HL._repeats) == 1


def test_a_broadcast_key_value_view_is_mapped_over_its_storage_when_repeated(hopper_host):
    q, k, v = qkv(h=4, h_kv=1)
    ke, ve = k.expand(2, 4, 256, 64), v.expand(2, 4, 256, 64)
    for _ in range(2):
        hopper_host.clear()
        out = torch.empty(q.shape, dtype=q.dtype)
        full_path(q, ke, ve, out=out)
        launch(q, ke, ve, out=out)
        (_, _, a), (_, _, b) = hopper_host
        assert a == b


def test_a_kept_plan_holds_no_tensor_of_the_call(hopper_host):
    import gc
    import weakref
    q, k, v = qkv()
    out, lse = launch(q, k, v, lse=True)
    refs = [weakref.ref(t) for t in (q, k, v, out, lse)]
    del q, k, v, out, lse
    gc.collect()
    assert len(HL._repeats) == 1 and all(r() is None for r in refs)


def test_the_schedule_tables_are_read_only_and_a_replaced_one_replans(hopper_host, monkeypatch):
    q, k, v = qkv(n=4096)
    launch(q, k, v)
    launch(q, k, v)
    assert _last_constexprs[0]["EXPONENT"] == HL.SCHEDULE["EXPONENT"]
    for table in (HL.SCHEDULE, HL.SCHEDULE_128, HL.LENGTH_TABLE, HL.MASKED_SCHEDULE, HL.LENGTH_TABLE[(64, False)][0][1]):
        with pytest.raises(TypeError):
            table["EXPONENT"] = "fast"
    monkeypatch.setattr(HL, "SCHEDULE", MappingProxyType(dict(HL.SCHEDULE, EXPONENT="fast")))
    launch(q, k, v)
    assert _last_constexprs[0]["EXPONENT"] == "fast"
    monkeypatch.setattr(HL, "LENGTH_TABLE", MappingProxyType({**HL.LENGTH_TABLE, (64, False): ((8192, {"CONSUMERS": 2}),)}))
    launch(q, k, v)
    assert _last_constexprs[0]["CONSUMERS"] == 2


def test_a_kept_plan_asks_compile_again_when_a_read_global_changed(hopper_host, monkeypatch):
    """The kept plan launches its specialization while ``is_current()`` holds (a global the trace
    read unchanged) and goes back through ``compile()`` when it does not."""
    from tylopy.jit.kernel import CompiledKernel
    calls = []
    noted = HL.attention_fwd_sm90.compile
    monkeypatch.setattr(HL.attention_fwd_sm90, "compile", lambda **cx: calls.append(1) or noted(**cx))
    q, k, v = qkv()
    out = torch.empty(q.shape, dtype=q.dtype)
    for _ in range(3):
        launch(q, k, v, out=out)
    assert len(calls) == 2  # the planned launch, then the kept plan's first one
    monkeypatch.setattr(CompiledKernel, "is_current", lambda self: False)
    launch(q, k, v, out=out)
    launch(q, k, v, out=out)
    assert len(calls) == 4
    assert len(hopper_host) == 5 and len({tuple(p) for _, _, p in hopper_host}) == 1


def test_an_unaligned_or_copied_input_is_not_reused(hopper_host):
    q, k, v = qkv()
    wide = torch.empty(2, 4, 256, 68, dtype=q.dtype)  # rows of 136 bytes: TMA cannot map them
    q_wide = wide[..., :64]
    q_wide.copy_(q)
    launch(q_wide, k, v)  # runs on a contiguous copy of q
    assert not HL._repeats
    flat = torch.empty(q.numel() + 8, dtype=q.dtype)
    q_odd = flat[1:1 + q.numel()].view(q.shape)  # 2 bytes past a 16-byte boundary
    q_odd.copy_(q)
    launch(q_odd, k, v)
    assert not HL._repeats
    q_off = flat[8:].view(q.shape)  # 16 bytes past: aligned
    q_off.copy_(q)
    launch(q_off, k, v)
    assert len(HL._repeats) == 1


def test_signature_cache_keeps_every_rejection(monkeypatch):
    """A signature that passed the checks once must not let a different call skip them."""
    q, k, v = qkv()
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(A, "_checked", ty.PlanCache("test signatures"))
    sig = A._signature(q, k, v, None, 0.0, True, None, False)
    A._checked.put(sig, A._Known(0.125, True))  # as if a causal call had passed
    with pytest.raises(TypeError, match="is_causal expects a bool, but got int"):
        A.attention(q, k, v, is_causal=1)
    with pytest.raises(TypeError, match="scale expects a float or None, but got bool"):
        A.attention(q, k, v, is_causal=True, scale=True)
    with pytest.raises(TypeError, match="dropout_p expects a float, but got bool"):
        A.attention(q, k, v, is_causal=True, dropout_p=False)
    with pytest.raises(ValueError, match="key/value heads"):
        A.attention(q, k[:, :2], v[:, :2], is_causal=True)
    assert A._signature(q, k, v, torch.ones(256, 256, dtype=torch.bool), 0.0, False, None, False) is None
    assert A._signature(torch.nn.Parameter(q), k, v, None, 0.0, False, None, False) is None


def test_the_entry_point_launches_the_kept_plan_and_leaves_autograd_to_the_operator(hopper_host, monkeypatch):
    """``attention`` with a signature seen before goes straight to the kept plan: the same launch as
    the full path; an input that requires grad still goes through the autograd operator."""
    from tylopy_kernels.attention import autograd
    monkeypatch.setattr(A, "_checked", ty.PlanCache("test signatures"))
    monkeypatch.setattr(dispatch, "_capability", lambda index: (9, 0))
    q, k, v = qkv()
    A._checked.put(A._signature(q, k, v, None, 0.0, False, None, False), A._Known(0.125, True))  # as if checked
    out_first = A.attention(q, k, v)
    kept = next(iter(A._checked._entries.values())).repeats[False]
    assert kept is not None and len(HL._repeats) == 1
    monkeypatch.setattr(HL, "launch_hopper", lambda *a, **kw: pytest.fail("the full path ran"))
    out_again = A.attention(q, k, v)
    assert out_again.shape == out_first.shape
    (_, _, first), (_, _, again) = hopper_host[0], hopper_host[-1]
    assert first[:3] == again[:3] and first[5:] == again[5:]  # Q, K, V maps and scalars
    assert again[3].startswith(f"({out_again.data_ptr()},".encode())  # the O map (TMA store) of the new output
    assert again[4] == out_again.data_ptr().to_bytes(8, "little")
    through = []
    monkeypatch.setattr(autograd, "attention_op", lambda *a: through.append(a) or a[0])
    A.attention(q.clone().requires_grad_(), k, v)
    assert len(through) == 1
    with torch.no_grad():
        A.attention(q.clone().requires_grad_(), k, v)
    assert len(through) == 1 and len(hopper_host) == 3
    with pytest.raises(TypeError, match="return_lse expects a bool, but got int"):
        A.attention(q, k, v, return_lse=1)
