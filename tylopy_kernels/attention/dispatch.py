"""Which kernel family runs a dense call on a CUDA device, and the call's buffers: ``forward`` and
``backward`` launch Hopper's warp-specialized kernels (sm_90, D = 64 and 128, inputs TMA can map)
or the portable mma.sync ones, with output and gradients allocated here. The entry point
(``tylopy.attention``) calls ``forward`` for a plain call; the operators of ``autograd.py`` call
both (they never call back into the entry module).
"""
from __future__ import annotations

import functools

import torch

HOPPER_HEAD_DIMS = (64, 128)  # the head dims of the Hopper kernels


def _nonpositive_scale(query, scale):
    """The kernels keep the running maximum of raw scores, the maximum of scaled scores only for a
    positive scale: softmax(c q k) = softmax(|c| (-q) k), and c = 0 weighs every key equally."""
    if scale > 0:
        return query, scale
    return (torch.zeros_like(query), 1.0) if scale == 0 else (-query, -scale)


def forward(query, key, value, attn_mask, is_causal, scale, return_lse, known=None):
    """(out, lse or None, kept) on CUDA by the kernels: Hopper's where it applies, else the portable
    one. ``known``: the ``_Known`` of this call's signature, when it has one: its ``strides_ok``
    is used, and ``kept`` is the Hopper launch a call of the same signature can repeat (or None)."""
    strides_ok = None if known is None else known.strides_ok
    keep_plan = known is not None
    B, H, n_q, D = query.shape
    n_k = key.shape[2]
    dev = query.device
    out = torch.empty((B, H, n_q, D), dtype=query.dtype, device=dev)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=dev) if return_lse else None
    if B * H * n_q == 0:
        return out, lse, None
    if n_k == 0:  # no keys: every row is empty, output zeros and LSE -inf, nothing to launch
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse, None
    if scale <= 0:
        query, scale = _nonpositive_scale(query, scale)
        keep_plan = False  # it maps a temporary
    major, _ = _capability(dev.index)
    if strides_ok is None:
        strides_ok = _tma_strides_ok(query, key, value)
    aligned = not (query.data_ptr() | key.data_ptr() | value.data_ptr()) & 15
    if major == 9 and D in HOPPER_HEAD_DIMS and ((strides_ok and aligned) or D == 128):
        from tylopy_kernels.attention.common import ForwardTensors
        from tylopy_kernels.attention.sm90.launch import HopperOptions, launch_hopper
        kept = launch_hopper(ForwardTensors(query, key, value, out, lse, attn_mask),  # copies what TMA cannot map
                             HopperOptions(scale, is_causal))
        return out, lse, kept if keep_plan else None
    from tylopy_kernels.attention.portable.launch import launch_forward
    launch_forward(query, key, value, out, lse, scale=scale, is_causal=is_causal, attn_mask=attn_mask)
    return out, lse, None


def backward(forward_tensors, dout, dlse, is_causal, scale):
    """(dq, dk, dv) on CUDA: Hopper's backward kernels for D = 64 and 128 on sm_90 (without a
    gradient of the LSE), the portable ones elsewhere. Deterministic throughout when
    ``torch.use_deterministic_algorithms(True)`` is on (the portable kernels always are).
    ``forward_tensors``: a ``ForwardTensors`` of the forward's query, key, value, out, lse and
    attn_mask; ``dlse``: the LSE's gradient or None."""
    query, key, value, out, lse, attn_mask = forward_tensors
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (query, key, value))
    B, H, n_q, D = query.shape
    if B * H * n_q == 0 or key.shape[2] == 0:
        for t in (dq, dk, dv):
            t.zero_()
        return dq, dk, dv
    if dout.stride(-1) != 1:  # e.g. the zero-stride gradient of out.sum()
        dout = dout.contiguous()
    q, s = _nonpositive_scale(query, scale)
    launch = _hopper_backward(query, key, value, dlse)
    if launch is not None:
        from tylopy_kernels.attention.common import BackwardTensors
        from tylopy_kernels.attention.sm90.backward_launch import HopperBackwardOptions
        launch(BackwardTensors(q, key, value, out, dout, lse, dq, dk, dv, attn_mask),
               HopperBackwardOptions(s, is_causal, torch.are_deterministic_algorithms_enabled()))
    else:
        from tylopy_kernels.attention.portable.backward_launch import launch_backward_portable
        launch_backward_portable(q, key, value, out, dout, lse, dq, dk, dv, is_causal=is_causal, scale=s,
                                 attn_mask=attn_mask, dlse=dlse)
    if scale < 0:
        dq.neg_()  # the kernels saw -query
    elif scale == 0:
        dq.zero_()
    return dq, dk, dv


def _hopper_backward(query, key, value, dlse):
    """Hopper's ``launch_backward_hopper`` when it applies to this call, else None."""
    if dlse is not None or query.shape[3] not in HOPPER_HEAD_DIMS or _capability(query.device.index)[0] != 9:
        return None
    try:
        from tylopy_kernels.attention.sm90.backward_launch import launch_backward_hopper, supports
    except ImportError:
        return None
    return launch_backward_hopper if supports(query, key, value) else None


@functools.lru_cache(maxsize=None)
def _capability(device_index):
    return torch.cuda.get_device_capability(device_index)


def _tma_strides_ok(*tensors) -> bool:
    """TMA needs 16-byte multiple, non-zero strides along the sequence (a zero stride over batch or
    heads, an ``expand`` view, is mapped over its storage by the launcher) and, checked per call,
    a 16-byte aligned base."""
    for t in tensors:
        for d in range(3):
            stride = t.stride(d) * t.element_size()
            if t.shape[d] > 1 and (stride % 16 or (stride == 0 and d == 2)):
                return False
    return True
