"""Host side of the portable attention forward (``forward.py``): arch choice, specializations,
argument checks and launches for batched (B, H, N, D) and packed variable-length (total, H, D)
tensors (``streaming_attention``, ``launch_streaming``, ``compiled_for``, ``plan_forward``, ...).

    plan_forward(ForwardTensors(q, k, v, out, lse, attn_mask), ForwardOptions(scale, is_causal)).run()
    launch_forward(q, k, v, out, lse, scale=scale, is_causal=True)       # the same, keywords flat

A ``Launch`` holds the kernel's run-time arguments by parameter name; each tensor goes as one
argument (the kernel takes its shape and strides from it): ``token_view``, ``stats_view`` and
``mask_view`` give the views the kernels take, ``unused`` the placeholder of a tensor they skip.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

import tylopy as ty

from tylopy_kernels.attention.common import ForwardTensors, placeholder, positional  # noqa: F401 (re-exported)
from tylopy_kernels.attention.portable.forward import (BLOCK_NS, DEFAULT_BLOCK_N, DEFAULT_WARPS, HEAD_DIMS, MAX_GRID_YZ,
                                                       NEG_INF, ROWS_PER_WARP, attention_fwd_portable,
                                                       streaming_attention_fwd)

_kernels = ty.PlanCache("portable attention kernels", capacity=512)  # (kernel, arch[, jit, constexprs])
_archs: dict = {}


def device_arch(capability, entry: str = "attention", arg: str = "query") -> tuple[str, bool]:
    """(arch to compile for, whether to hand the driver sm_80 PTX to JIT instead of a cubin); below
    sm_80 it rejects the call in the name of ``entry`` (the public function) and its tensor ``arg``."""
    from tylopy.codegen.targets import SUPPORTED_ARCHS
    major, minor = capability
    if (major, minor) < (8, 0):
        raise ValueError(f"{entry}: {arg} expects a tensor on a GPU of compute capability 8.0 or newer (mma.sync "
                         f"on bf16, cp.async), but got one on sm_{major}{minor}")
    arch = f"sm_{major}{minor}"
    return (arch, False) if arch in SUPPORTED_ARCHS else ("sm_80", True)


def _device_arch(device, entry="attention"):
    index = device.index if device.index is not None else torch.cuda.current_device()
    arch = _archs.get(index)
    if arch is None:
        arch = _archs[index] = device_arch(torch.cuda.get_device_capability(index), entry)
    return arch


def compiled_for(device, kernel=None, *, entry="attention", **constexprs):
    """The CompiledKernel of one specialization of ``kernel`` (default: ``streaming_attention_fwd``)
    for ``device``, cached; the other portable kernels (the backward's) come through here too.
    ``entry``: the public function a rejected device is reported for."""
    kernel = streaming_attention_fwd if kernel is None else kernel
    arch, jit = _device_arch(device, entry)
    key = (kernel, arch, jit, tuple(sorted((k, repr(v)) for k, v in constexprs.items())))
    ck = _kernels.get(key)
    if ck is None or not ck.is_current():  # a global its trace read changed: compile again (docs/design.md)
        kern = _kernels.get((kernel, arch))
        if kern is None:
            kern = kernel.with_arch(arch)
            _kernels.put((kernel, arch), kern)
        ck = kern.compile(**constexprs)
        if jit:  # an arch the codegen does not list: let the driver compile the sm_80 PTX
            ck = dataclasses.replace(ck, cubin=None, _launcher=None)
        _kernels.put(key, ck)
    return ck


def _in_place_ok(t) -> bool:
    """Contiguous, 16-byte aligned rows: cp.async copies 16 bytes and Q is read as 32-bit words (a
    zero stride over rows, heads or batch, an ``expand`` view, is fine; over the head dim it is not)."""
    return (t.data_ptr() % 16 == 0 and (t.stride(-1) == 1 or t.shape[-1] == 1)
            and all(t.shape[d] == 1 or t.stride(d) % 8 == 0 for d in range(t.dim() - 1)))


def aligned(t):
    return t if _in_place_ok(t) else t.clone(memory_format=torch.contiguous_format)


def check_schedule(head_dim, block_n, warps) -> tuple[int, int]:
    """The (BLOCK_N, WARPS) to use: the defaults for None, else checked."""
    block_n = DEFAULT_BLOCK_N[head_dim] if block_n is None else block_n
    warps = DEFAULT_WARPS if warps is None else warps
    if isinstance(block_n, bool) or block_n not in BLOCK_NS:
        raise ValueError(f"streaming_attention: block_n expects one of {BLOCK_NS}, but got {block_n!r}")
    if isinstance(warps, bool) or warps not in (1, 2, 4, 8):
        raise ValueError(f"streaming_attention: warps expects 1, 2, 4 or 8, but got {warps!r}")
    return block_n, warps


def _check_out(out, lse):
    if out.stride(-1) != 1 or out.data_ptr() % 4 or any(out.stride(d) % 2 for d in range(out.dim() - 1)):
        raise ValueError(f"streaming_attention: out expects 4-byte aligned rows with a contiguous last dim, "
                         f"but got strides {out.stride()}")
    if lse is not None and lse.stride(-1) != 1:
        raise ValueError(f"streaming_attention: lse expects a contiguous last dim, but got strides {lse.stride()}")


def token_view(t, sequences=None):
    """A q, k, v, out (or gradient) tensor as the kernels take it: its 16-bit elements as int16
    (DTYPE says bf16 or fp16), (B, H, N, D); packed (total, H, D) rows of ``sequences`` (B)
    sequences as a (B, H, total, D) view whose batch stride is 0 (no copy either way)."""
    t = t.view(torch.int16)
    return t if sequences is None else t.unsqueeze(0).transpose(1, 2).expand(sequences, -1, -1, -1)


def stats_view(t, sequences=None):
    """A per-row statistic (LSE, delta, LSE gradient) as the kernels take it: (B, H, n_q), or
    packed (H, total) as a (B, H, total) view whose batch stride is 0."""
    return t if sequences is None else t.unsqueeze(0).expand(sequences, -1, -1)


def mask_view(attn_mask, shape):
    """The Boolean mask as the kernels read it: uint8 of ``shape`` (B, H, n_q, n_k), whose
    broadcast dims have stride 0 (an expand view: no copy)."""
    return attn_mask.view(torch.uint8).expand(*shape)


def unused(device, dtype, ndim: int):
    """A tensor argument the specialization never reads (no mask, no LSE): the shared placeholder
    as an ``ndim``-D view of stride 0 (any index reads its first element, as the zero strides the
    kernels took for these did)."""
    return placeholder(device, dtype).as_strided((1,) * ndim, (0,) * ndim)


def dtype_of(t):
    return ty.bf16 if t.dtype == torch.bfloat16 else ty.f16


@dataclasses.dataclass
class Launch:
    """One kernel launch, planned on the host: ``run()`` on the GPU, ``run(emulate=True)`` on CPU
    tensors. ``args``: the kernel's run-time arguments by parameter name."""

    kernel: object
    grid: tuple
    args: dict
    constexprs: dict

    def run(self, emulate=False, **options):
        if emulate:
            return self.kernel.emulate(grid=self.grid, **self.args, **self.constexprs, **options)
        entry = "attention_varlen" if self.constexprs.get("VARLEN") else "attention"
        args = positional(self.kernel, self.args)
        compiled_for(args[0].device, self.kernel, entry=entry, **self.constexprs)(self.grid, *args)


@dataclasses.dataclass(frozen=True)
class ForwardOptions:
    """What one forward computes and its schedule: ``scale`` (> 0), SDPA's top-left ``is_causal``,
    ``varlen=(cu_q, cu_k, max_seqlen_q)`` for packed tensors (int32 prefix sums of B + 1 entries),
    ``block_n`` and ``warps`` (None: the defaults for the head dim) and ``async_copy`` (cp.async
    copies, else ld/st)."""

    scale: float
    is_causal: bool = False
    varlen: Optional[tuple] = None
    block_n: Optional[int] = None
    warps: Optional[int] = None
    async_copy: bool = True


def plan_forward(tensors: ForwardTensors, options: ForwardOptions) -> Launch | None:
    """The launch of ``attention_fwd_portable`` that fills ``tensors.out`` (and ``tensors.lse``
    when given); None when there is nothing to compute."""
    q, k, v, out, lse, attn_mask = tensors
    scale, is_causal, varlen = options.scale, options.is_causal, options.varlen
    packed = varlen is not None
    D = q.shape[-1]
    block_n, warps = check_schedule(D, options.block_n, options.warps)
    rows = ROWS_PER_WARP * warps
    H, H_kv = q.shape[-2 if packed else 1], k.shape[-2 if packed else 1]
    if packed:
        cu_q, cu_k, max_q = varlen
        B, n_q, n_k = cu_q.shape[0] - 1, max_q, 0
    else:
        B, n_q, n_k = q.shape[0], q.shape[2], k.shape[2]
        cu_q = cu_k = placeholder(q.device, torch.int32)
    for name, n in (("batch", B), ("heads", H)):
        if n > MAX_GRID_YZ:
            raise ValueError(f"streaming_attention: query {name} expects at most {MAX_GRID_YZ} (a grid dimension), "
                             f"but got {n}")
    _check_out(out, lse)
    if B * H * n_q == 0:
        return None
    q, k, v = aligned(q), aligned(k), aligned(v)
    dev = q.device
    mask = unused(dev, torch.uint8, 4) if packed or attn_mask is None else mask_view(attn_mask, (B, H, n_q, n_k))
    seqs = B if packed else None
    lse_arg = unused(dev, torch.float32, 3) if lse is None else stats_view(lse, seqs)
    args = dict(q=token_view(q, seqs), k=token_view(k, seqs), v=token_view(v, seqs), out=token_view(out, seqs),
                lse=lse_arg, mask=mask, cu_q=cu_q, cu_k=cu_k, kv_group=H // H_kv, scale=float(scale),
                causal=int(is_causal))
    cx = dict(DTYPE=dtype_of(q), HEAD_DIM=D, BLOCK_N=block_n, WARPS=warps, HAS_MASK=attn_mask is not None,
              RETURN_LSE=lse is not None, ASYNC_COPY=options.async_copy, VARLEN=packed)
    return Launch(attention_fwd_portable, ((n_q + rows - 1) // rows, H, B), args, cx)


def launch_forward(q, k, v, out, lse, *, attn_mask=None, **options) -> None:
    """``plan_forward``'s launch, on the current stream; ``options`` are ``ForwardOptions``' fields."""
    launch = plan_forward(ForwardTensors(q, k, v, out, lse, attn_mask), ForwardOptions(**options))
    if launch is not None:
        launch.run()


def launch_streaming(tensors: ForwardTensors, options: ForwardOptions) -> None:
    """Launch on checked (B, H, N, D) inputs (``tylopy_kernels.attention.check_inputs``) into
    ``tensors.out`` (and ``tensors.lse``); K/V may have fewer heads than Q (a divisor)."""
    if tensors.lse is not None and not tensors.lse.is_contiguous():
        raise ValueError("streaming_attention: lse expects a contiguous (B, H, n_q) tensor")
    launch = plan_forward(tensors, options)
    if launch is not None:
        launch.run()


def streaming_attention(query, key, value, attn_mask=None, is_causal=False, scale=None, return_lse=False,
                        block_n=None, warps=None, out=None, enable_gqa=False):
    """Like ``tylopy.attention``, always on this kernel; ``block_n`` (32/64) and ``warps`` pick the schedule."""
    from tylopy_kernels.attention.checks import check_inputs
    B, H, n_q, n_k, D, scale = check_inputs(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    block_n, warps = check_schedule(D, block_n, warps)
    if query.device.type != "cuda":
        raise ValueError(f"streaming_attention: query expects a CUDA tensor, but got a tensor on {query.device}")
    if out is None:
        out = torch.empty((B, H, n_q, D), dtype=query.dtype, device=query.device)
    elif out.shape != (B, H, n_q, D) or out.dtype != query.dtype or out.device != query.device:
        raise ValueError(f"streaming_attention: out expects a {query.dtype} tensor of shape {(B, H, n_q, D)} on "
                         f"{query.device}, but got {out.dtype} {tuple(out.shape)} on {out.device}")
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=query.device) if return_lse else None
    if n_k == 0 and B * H * n_q:  # no keys: every row is empty
        out.zero_()
        if lse is not None:
            lse.fill_(NEG_INF)
    else:
        launch_streaming(ForwardTensors(query, key, value, out, lse, attn_mask),
                         ForwardOptions(scale, is_causal, block_n=block_n, warps=warps))
    return (out, lse) if return_lse else out


__all__ = ["HEAD_DIMS", "device_arch", "compiled_for", "check_schedule", "aligned", "token_view", "stats_view",
           "mask_view", "unused", "positional", "Launch",
           "ForwardTensors", "ForwardOptions", "plan_forward", "launch_forward",
           "launch_streaming", "streaming_attention"]
