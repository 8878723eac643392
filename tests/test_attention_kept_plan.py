"""``tylopy.attention`` called again with a signature it has seen takes a shortcut (the checks and,
for the Hopper kernel, the launch plan are kept). These tests hold the shortcut to the path a first
call takes: each call of a sequence, on warm caches, goes the way the same call goes on empty caches
(the Hopper kernel planned, its kept plan, or the portable kernel) with the same Hopper launch, and
every launch of a kept plan is seen by ``ty.observe`` (``scenarios.recorded_launches``), so a check
that a call ran the Hopper kernel cannot be fooled by the second call of a test.
A fake sm_90 driver takes the launches; CPU tensors stand in for CUDA ones.
"""
from types import MappingProxyType

import pytest
import torch

import tylopy as ty
from tylopy_kernels import attention as A
from tylopy_kernels.attention import dispatch
from tylopy_kernels.attention.portable import launch as PLaunch
from tylopy_kernels.attention.sm90 import launch as HL
from tylopy_kernels.attention.testing import scenarios as S

from attention_host_cases import hopper_host, qkv  # noqa: F401 - the fixture is used by name


@pytest.fixture
def routes(hopper_host, monkeypatch):  # noqa: F811
    """Fresh signature and plan caches, sm_90, and a log of the route each call takes."""
    log = []
    monkeypatch.setattr(A, "_checked", ty.PlanCache("test signatures"))
    monkeypatch.setattr(dispatch, "_capability", lambda index: (9, 0))
    planned = HL.launch_hopper
    monkeypatch.setattr(HL, "launch_hopper", lambda *a, **kw: log.append("hopper planned") or planned(*a, **kw))
    monkeypatch.setattr(PLaunch, "launch_forward", lambda *a, **kw: log.append("portable"))
    return log


def _unaligned(t, elements=1):
    """``t`` copied into a buffer at ``elements`` past its start: same shape and strides, another alignment."""
    flat = torch.empty(t.numel() + 16, dtype=t.dtype)
    view = flat[elements:elements + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def _call(log, call):
    """(route, Hopper launches recorded) of one call. Its signature is entered as checked when it is
    new (CPU tensors fail the entry's device check, which the signature cache lets a call skip)."""
    q, k, v, kw = call
    sig = A._signature(q, k, v, None, 0.0, kw.get("is_causal", False), kw.get("scale"), False)
    if A._checked.get(sig) is None:
        scale = kw.get("scale") or q.shape[-1] ** -0.5
        A._checked.put(sig, A._Known(scale, A._tma_strides_ok(q, k, v)))
    log.clear()
    with S.recorded_launches() as seen:
        A.attention(q, k, v, **kw)
    route = log[0] if log else "hopper kept plan"
    return route, [(tuple(sorted((n, repr(x)) for n, x in e.items() if n != "grid")), e["grid"]) for e in seen]


def _calls():
    q, k, v = qkv()
    q128, k128, v128 = qkv(d=128, n=128)
    return [
        (q, k, v, {}),
        (q, k, v, {"return_lse": True}),
        (_unaligned(q), k, v, {}),                     # the signature of the first call, not 16-byte aligned
        (q, _unaligned(k, 8), v, {}),                  # aligned again (16 bytes in)
        (q, k, v, {"scale": -0.2}),                    # a negative scale runs on a negated temporary
        (_unaligned(q128), k128, v128, {}),            # D = 128: Hopper on an aligned copy
        (q, k, v, {"is_causal": True}),
    ]


def test_each_call_goes_the_way_a_first_call_goes(routes, monkeypatch):
    calls = _calls()
    first = []
    for call in calls:  # each on empty caches: the path of a first call
        monkeypatch.setattr(A, "_checked", ty.PlanCache("test signatures"))
        monkeypatch.setattr(HL, "_repeats", ty.PlanCache("test launches"))
        first.append(_call(routes, call))
    assert [r for r, _ in first] == ["hopper planned", "hopper planned", "portable", "hopper planned",
                                     "hopper planned", "hopper planned", "hopper planned"]
    monkeypatch.setattr(A, "_checked", ty.PlanCache("test signatures"))
    monkeypatch.setattr(HL, "_repeats", ty.PlanCache("test launches"))
    order = [0, 0, 1, 2, 0, 2, 3, 3, 0, 4, 4, 0, 5, 5, 1, 6, 6, 2, 0]
    warm = [_call(routes, calls[i]) for i in order]
    kept = 0
    for i, (route, launches) in zip(order, warm):
        want_route, want_launches = first[i]
        if route == "hopper kept plan":
            kept += 1
            assert want_route == "hopper planned", f"call {i} took a kept plan where a first call goes {want_route}"
        else:
            assert route == want_route, f"call {i}: expects the route {want_route}, but got {route}"
        assert launches == want_launches, f"call {i}: expects the Hopper launches {want_launches}, but got {launches}"
    assert kept >= 5  # the shortcut was taken (and recorded) where it applies


def test_a_second_call_records_its_launch(routes):
    q, k, v = qkv()
    seen = [_call(routes, (q, k, v, {})) for _ in range(3)]
    assert [r for r, _ in seen] == ["hopper planned", "hopper kept plan", "hopper kept plan"]
    assert len(seen[0][1]) == 1 and seen[0][1] == seen[1][1] == seen[2][1]  # each launch seen, the same launch


def test_a_kept_plan_whose_launch_declines_falls_back_to_the_full_path(routes, monkeypatch):
    """A replaced schedule table makes the kept plan decline; the call then plans again as a first call."""
    q, k, v = qkv()
    assert [_call(routes, (q, k, v, {}))[0] for _ in range(2)] == ["hopper planned", "hopper kept plan"]
    monkeypatch.setattr(HL, "SCHEDULE", MappingProxyType(dict(HL.SCHEDULE, EXPONENT="fast")))
    route, launches = _call(routes, (q, k, v, {}))
    assert route == "hopper planned" and ("EXPONENT", "'fast'") in launches[0][0]
