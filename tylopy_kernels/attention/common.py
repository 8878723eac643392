"""What the attention launchers share: input rejections, the mask view and placeholders for
optional pointer arguments."""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import tylopy as ty


class ForwardTensors(NamedTuple):
    """The tensors of one forward: q, k, v read, ``out`` (and ``lse``, None: not returned)
    written, and SDPA's ``attn_mask`` (bool or additive float; batched only, None: no mask).

    Batched: q/out (B, H, n_q, D), k/v (B, H_kv, n_k, D) with H_kv dividing H, lse (B, H, n_q).
    Packed (the portable kernel's ``ForwardOptions.varlen``): q/out (total_q, H, D), k/v (total_k, H_kv, D), lse (H, total_q).
    """

    q: Any
    k: Any
    v: Any
    out: Any
    lse: Optional[Any] = None
    attn_mask: Optional[Any] = None


class BackwardTensors(NamedTuple):
    """The tensors of one backward: the forward's q, k, v, its output ``out`` and LSE (fp32,
    natural log) and the output gradient ``dout`` read; dq, dk, dv written; SDPA's ``attn_mask``
    (batched only) and ``dlse``, a gradient of the returned LSE (None: none)."""

    q: Any
    k: Any
    v: Any
    out: Any
    dout: Any
    lse: Any
    dq: Any
    dk: Any
    dv: Any
    attn_mask: Optional[Any] = None
    dlse: Optional[Any] = None


class PackedDocs(NamedTuple):
    """Where the documents of a packed batch lie: ``cu_q``/``cu_k`` int32 prefix sums of B + 1
    entries on the device, ``max_q``/``max_k`` the longest document's queries and keys (host ints),
    and ``seqused_q``/``seqused_k`` (B,) int32 rows of each document that count (None: all)."""

    cu_q: Any
    cu_k: Any
    max_q: int
    max_k: int
    seqused_q: Optional[Any] = None
    seqused_k: Optional[Any] = None


class VariantCall(NamedTuple):
    """The scores of a programmable-attention call: the ``Variant``, its tensors (in
    ``variant.tensor_names`` order, captured ones included) and the scale."""

    variant: Any
    tensors: Any
    scale: float


def reject(entry: str, exc, arg, expected, got):
    """Raise ``exc`` naming the entry point, the argument, what it expects and what came."""
    raise exc(f"{entry}: {arg} expects {expected}, but got {got}")


def rejecter(entry: str):
    """``reject`` bound to one entry point's name: ``_fail(exc, arg, expected, got)``."""
    return functools.partial(reject, entry)


def check_token_tensor(fail, name: str, t, ndim: int, layout: str):
    """The checks every attention input tensor gets: a torch.Tensor of ``ndim`` dimensions
    (``layout`` names them), bf16 or fp16, with a contiguous last dimension."""
    import torch
    if not isinstance(t, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dim() != ndim:
        fail(ValueError, name, f"a {ndim}-D {layout} tensor", f"shape {tuple(t.shape)}")
    if t.dtype not in (torch.bfloat16, torch.float16):
        fail(TypeError, name, "dtype torch.bfloat16 or torch.float16", t.dtype)
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        fail(ValueError, name, "a contiguous last dimension (stride 1)", f"stride {t.stride(-1)}")

def tma_copy(t):
    """A row-major copy of ``t`` in memory of its own, for a tensor map: ``t.contiguous()`` returns
    ``t`` itself when it is already contiguous, at whatever (unaligned) address its view starts."""
    import torch
    return t.clone(memory_format=torch.contiguous_format)


_placeholders: dict = {}


def placeholder(device, dtype):
    """A small cached tensor passed where the kernel takes a pointer it will not touch (no mask,
    no LSE): kernel parameters are fixed, their use is switched off by a constexpr."""
    key = (device, dtype)
    t = _placeholders.get(key)
    if t is None:
        import torch
        t = torch.zeros(16, dtype=dtype, device=device)
        if not (torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _placeholders[key] = t  # (one made while a CUDA graph is captured lives in the graph's pool)
    return t


def mask_and_lse_args(attn_mask, lse, B, H, n_q, n_k, device):
    """(mask as uint8 with stride-0 broadcast dims, its 4 strides, lse or a placeholder): no copies."""
    import torch
    if attn_mask is not None:
        mask_t = ty.strided(attn_mask.view(torch.uint8).expand(B, H, n_q, n_k))  # the kernel reads via strides
        strides = [mask_t.stride(i) for i in range(4)]
    else:
        mask_t, strides = placeholder(device, torch.uint8), [0, 0, 0, 0]
    return mask_t, strides, (lse if lse is not None else placeholder(device, torch.float32))


_ORDER: dict = {}  # kernel -> its run-time parameters' names, in the signature's order


def positional(kernel, args: dict) -> tuple:
    """``args`` (by parameter name) in the order a compiled kernel takes them (a cached order: the
    kernel's own keyword binding costs about 6 us a launch)."""
    names = _ORDER.get(kernel)
    if names is None:
        names = _ORDER[kernel] = tuple(n for n, _ in kernel.runtime_params)
    if len(args) != len(names) or not all(n in args for n in names):
        raise TypeError(f"{kernel.name} expects the arguments {', '.join(names)}, but got {', '.join(args)}")
    return tuple([args[n] for n in names])
