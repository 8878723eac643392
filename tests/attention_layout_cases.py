"""Q, K and V in three layouts (each in its own NaN-padded buffer, its own dimension order, grouped
K/V heads), shared by tests/test_attention_layouts.py (emulator) and its GPU tier."""
from __future__ import annotations

import torch

from tylopy_kernels.attention.sm90 import launch as L
from tylopy_kernels.attention.testing.reference import AttentionInputs
from tylopy_kernels.attention.testing.rules import check_output


def _in_buffer(values, buffer_shape, permute, index):
    """``values`` (B, H, n, D) written into a NaN-filled buffer of ``buffer_shape`` on their device;
    the view ``buffer.permute(permute)[index]`` is returned (it must have the shape of ``values``)."""
    buf = torch.full(buffer_shape, float("nan"), dtype=values.dtype, device=values.device)
    view = buf.permute(permute)[index]
    assert view.shape == values.shape, (view.shape, values.shape)
    view.copy_(values)
    return view


def check_layouts(out, lse, q, k, v, scale, model):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # the reference wants all heads
    return check_output(out, lse, AttentionInputs(q, k, v, scale=scale), model, stats=False)


def portable_inputs(B=2, H=4, H_kv=2, n_q=40, n_k=150, D=32, dtype=torch.bfloat16, seed=3, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, n, D, generator=g).to(device, dtype) for h, n in ((H, n_q), (H_kv, n_k),
                                                                                 (H_kv, n_k)))
    q = _in_buffer(q, (B, n_q, H, D), (0, 2, 1, 3), slice(None))                       # (B, n, H, D) storage
    k = _in_buffer(k, (B, H_kv, n_k + 24, D + 32), (0, 1, 2, 3), (slice(None), slice(None), slice(0, n_k),
                                                                   slice(8, 8 + D)))    # padded rows and dims
    v = _in_buffer(v, (n_k + 8, B, H_kv, D), (1, 2, 0, 3), (slice(None), slice(None), slice(0, n_k)))  # (n, B, H, D)
    assert len({q.stride(), k.stride(), v.stride()}) == 3 and k.stride() != v.stride()
    return q, k, v


def hopper_inputs(B=2, H=2, H_kv=1, n_q=70, n_k=200, D=64, dtype=torch.bfloat16, seed=4, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, n, D, generator=g).to(device, dtype) for h, n in ((H, n_q), (H_kv, n_k),
                                                                                 (H_kv, n_k)))
    every = (slice(None), slice(None))
    q = _in_buffer(q, (B, H, n_q, D + 16), (0, 1, 2, 3), (*every, slice(None), slice(0, D)))
    k = _in_buffer(k, (B, H_kv, n_k + 40, D), (0, 1, 2, 3), (*every, slice(0, n_k)))
    v = _in_buffer(v, (B, H_kv, n_k + 72, D + 8), (0, 1, 2, 3), (*every, slice(16, 16 + n_k), slice(0, D)))
    order = L._coord_order(q)
    assert all(L._fits(t, order) for t in (q, k, v)), "the layouts must map without a contiguous copy"
    assert len({q.stride(), k.stride(), v.stride()}) == 3
    return q, k, v
