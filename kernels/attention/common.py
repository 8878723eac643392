"""What the attention launchers share: the mask view and placeholders for optional pointer arguments."""
from __future__ import annotations

_placeholders: dict = {}


def placeholder(device, dtype):
    """A small cached tensor passed where the kernel takes a pointer it will not touch (no mask,
    no LSE): kernel parameters are fixed, their use is switched off by a constexpr."""
    key = (device, dtype)
    t = _placeholders.get(key)
    if t is None:
        import torch
        t = _placeholders[key] = torch.zeros(16, dtype=dtype, device=device)
    return t


def mask_and_lse_args(attn_mask, lse, B, H, n_q, n_k, device):
    """(mask as uint8 with stride-0 broadcast dims, its 4 strides, lse or a placeholder): no copies."""
    import torch
    if attn_mask is not None:
        mask_t = attn_mask.view(torch.uint8).expand(B, H, n_q, n_k)
        strides = [mask_t.stride(i) for i in range(4)]
    else:
        mask_t, strides = placeholder(device, torch.uint8), [0, 0, 0, 0]
    return mask_t, strides, (lse if lse is not None else placeholder(device, torch.float32))
