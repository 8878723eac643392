"""The packed (varlen) Hopper forward's host path against a fake driver: the launch shape is kept per
signature and the kept launch carries the same bytes as a fresh plan; a new signature, an edited
schedule table or a base address off 16 bytes plans again; nothing here needs a GPU."""
import ctypes
from types import MappingProxyType

import pytest
import torch

from tylopy.runtime import tensormap as tm_mod
from tylopy.testing import fake_driver
from tylopy_kernels.attention.common import ForwardTensors, PackedDocs
from tylopy_kernels.attention.sm90 import launch as HL
from tylopy_kernels.attention.sm90 import varlen_launch as VL
from tylopy_kernels.attention.sm90.launch import HopperOptions


class _Map(tm_mod.TensorMap):
    """A map whose 128 bytes spell the address and geometry it was made from."""

    def __init__(self, tensor, dims, strides, box):
        self.device = 0
        self._buf = ctypes.create_string_buffer(repr((tensor.data_ptr(), dims, strides, box)).encode(), 128)

    def getPtr(self):
        return ctypes.addressof(self._buf)


@pytest.fixture
def host(monkeypatch):
    monkeypatch.setattr(tm_mod.TensorMap, "tiled", staticmethod(
        lambda t, dims, strides, box, dtype, swizzle=128, hold=True: _Map(t, dims, strides, box)))
    monkeypatch.setattr(tm_mod, "_cache", {})
    monkeypatch.setattr(HL, "sm_count", lambda dev: 132)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    VL._shapes.clear()
    with fake_driver(devices=1) as d:
        real, d.sent, d.constexprs = d.cuLaunchKernel, [], None

        def record(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):  # the bytes each parameter carries
            if d.constexprs is None:  # (the test set none: launches only)
                return real(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)
            types = VL.attention_varlen_fwd_sm90.compile(**d.constexprs).launcher()._types
            sizes = [128 if t is None else ctypes.sizeof(t) for t in types]
            ptrs = (ctypes.c_void_p * len(sizes)).from_address(params)
            d.sent.append(((gx, gy, gz), [ctypes.string_at(p, n) for p, n in zip(ptrs, sizes)]))
            return real(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)
        d.cuLaunchKernel = record
        yield d
    VL._shapes.clear()


def _call(T=300, H=4, D=64, docs=(0, 100, 300), lse=False, causal=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(T, H, D, generator=g).bfloat16() for _ in range(3))
    out = torch.zeros_like(q)
    cu = torch.tensor(docs, dtype=torch.int32)
    longest = max(b - a for a, b in zip(docs, docs[1:]))
    return (ForwardTensors(q, k, v, out, torch.zeros(H, T) if lse else None), PackedDocs(cu, cu, longest, longest),
            HopperOptions(D ** -0.5, causal))


def test_a_repeated_call_keeps_its_shape_and_launches_the_same_arguments(host):
    tensors, docs, options = _call()
    plan = VL.plan_varlen_launch(tensors, docs, options, HL.MapTarget(sm_count=132))
    host.constexprs = plan.constexprs
    VL.attention_varlen_fwd_sm90[plan.grid](*plan.args, **plan.constexprs)  # a fresh plan, launched plainly
    VL.launch_varlen_hopper(tensors, docs, options)
    assert len(VL._shapes) == 1
    VL.launch_varlen_hopper(tensors, docs, options)
    assert len(VL._shapes) == 1 and len(host.sent) == 3
    assert host.sent[0] == host.sent[1] == host.sent[2]


@pytest.mark.parametrize("change", [dict(D=128), dict(lse=True), dict(causal=False), dict(docs=(0, 100, 200, 300))])
def test_a_new_signature_plans_its_own_shape(host, change):
    VL.launch_varlen_hopper(*_call())
    VL.launch_varlen_hopper(*_call(**change))
    assert len(VL._shapes) == 2


def test_a_replaced_schedule_table_plans_again(host, monkeypatch):
    VL.launch_varlen_hopper(*_call())
    with pytest.raises(TypeError):
        VL.SCHEDULE[64]["STAGES"] = 3  # (read-only)
    monkeypatch.setattr(VL, "SCHEDULE", MappingProxyType({**VL.SCHEDULE, 64: dict(VL.SCHEDULE[64], STAGES=3)}))
    VL.launch_varlen_hopper(*_call())
    assert len(VL._shapes) == 2
    assert [k for k in VL._shapes._entries][-1][-1] == tuple(VL.SCHEDULE[64].items())


def test_schedule_overrides_and_unaligned_bases_are_not_kept(host):
    tensors, docs, _ = _call()
    VL.launch_varlen_hopper(tensors, docs, HopperOptions(0.125, True, {"STAGES": 3}))
    q = torch.empty(tensors.q.numel() + 8, dtype=torch.bfloat16)[1:1 + tensors.q.numel()].view_as(tensors.q)
    q.copy_(tensors.q)
    VL.launch_varlen_hopper(ForwardTensors(q, tensors.k, tensors.v, tensors.out, None), docs, HopperOptions(0.125, True))
    assert len(VL._shapes) == 0 and len(host.launches) == 2
