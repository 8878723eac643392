"""Host side of the Hopper variant forward (``forward_variant.py``): tensor maps, the variant's
tensors as kernel arguments (placeholders for those it does not use), the VARIANT constexpr.

``plan_variant_launch`` builds the launch without a GPU (the emulator runs it with tensor-map
specs); ``launch_variant`` runs it.
"""
from __future__ import annotations

import inspect
from types import MappingProxyType

import torch

import tylopy as ty

from tylopy_kernels.attention.common import ForwardTensors, VariantCall, tma_copy
from tylopy_kernels.attention.sm90.forward_variant import attention_variant_fwd_sm90
from tylopy_kernels.attention.sm90.launch import (EMULATED_SMS, Launch, _coord_order, _fits, _kv_view, _map_geometry,
                                                  device_map, sm_count)
from tylopy_kernels.attention.sm90.mods import AUX_NDIM, AUX_SLOTS
from tylopy_kernels.attention.sm90.tiles import Plan
from tylopy_kernels.attention.sm90.variant_tiles import KernelVariant, alibi_foldable

SCHEDULE = MappingProxyType({"BLOCK_N": 128, "STAGES": 2, "CONSUMERS": 2, "EXPONENT": "shared",
                             "RESCALE_THRESHOLD": 8.0, "PV_WAIT": "pinned", "PERSISTENT": False})
BLOCK_M = 128  # = block masks' BLOCK_SIZE: a query tile of the block mask is one CTA's work tile


def default_schedule(variant, head_dim, n_q=0, n_k=0) -> dict:
    """SCHEDULE with what measured faster for this kind of variant (``docs/performance.md``,
    "Variant forward schedules"):

    * D=64 with only builtins that fit 3 consumers' registers without spills (causal of either
      alignment, windows, softcap, sinks, ALiBi where it folds: ``variant_tiles.alibi_foldable`` for
      these lengths): three consumers of 64 rows (query tiles of 192), each computing only the key
      tiles its own rows see and passing the others (``forward_variant``): window 1.12-1.14x, causal
      1.11-1.15x, sinks 1.07-1.10x, softcap 1.00-1.06x. ALiBi that does not fold (68 bytes of spills
      at 3 consumers), float or bool masks (244-388 bytes), user mods (their registers are the
      user's) and block masks (tiles of BLOCK_M rows) keep two;
    * D=128 and a window bounded on the left: PERSISTENT. Every work tile is a few key tiles long,
      so the CTA's start (Q load, first S product) and its direct store are a large share; a
      persistent CTA loads the next tile's Q and keys while its consumers finish (1.04-1.08x).
      Causal variants without a window keep one tile per CTA: their tiles' lengths differ up to
      N / 128, and the heads order of the persistent loop balances them worse than the hardware's
      CTA dispatch (0.96x softcap D=128 N=8k)."""
    sched = dict(SCHEDULE)
    alibi = variant.alibi and not alibi_foldable(variant, n_q, n_k)
    if head_dim == 64 and not (alibi or variant.attn_mask or variant.score_mod or variant.mask_mod
                               or variant.block_mask is not None):
        sched["CONSUMERS"] = 3
    elif head_dim == 128 and variant.window[0] >= 0:
        sched["PERSISTENT"] = True
    return sched

_placeholders: dict = {}
_BM_SHAPES = ((1, 1, 1), (1, 1, 1, 1), (1, 1, 1), (1, 1, 1, 1))


def _placeholder(shape, dtype, device):
    key = (shape, dtype, device)
    t = _placeholders.get(key)
    if t is None:
        t = _placeholders[key] = torch.zeros(shape, dtype=dtype, device=device)
    return t


def _as4d(t):
    """An aux tensor as the kernel takes it: 4-D (leading 1s), bool as uint8."""
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    while t.dim() < AUX_NDIM:
        t = t.unsqueeze(0)
    return t


def variant_args(variant, tensors, B, H, n_q, n_k, device):
    """(kernel arguments after win_right: softcap .. aux3, aux meta) of a variant's tensors."""
    def get(name):
        return tensors[variant.index(name)] if name in variant.tensor_names else None
    f32 = torch.float32
    slopes = get("alibi_slopes")
    slopes = (_placeholder((1, 1), f32, device) if slopes is None else
              (slopes.view(1, H).expand(B, H) if slopes.dim() == 1 else slopes))
    sinks = get("sinks")
    sinks = _placeholder((1,), f32, device) if sinks is None else sinks
    mask = get("attn_mask")
    if mask is None:
        mask = _placeholder((1, 1, 1, 1), f32, device)
    else:
        mask = mask.expand(B, H, n_q, n_k)
        mask = mask.view(torch.uint8) if mask.dtype == torch.bool else mask.float()
    bm = [get(n) for n in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")]
    if bm[0] is None:
        bm = [_placeholder(_BM_SHAPES[k], torch.int32, device) for k in range(4)]
    aux, meta = [], []
    k = 0
    while f"aux{k}" in variant.tensor_names:
        t = get(f"aux{k}")
        aux.append(_as4d(t))
        meta.append((t.dim(), t.dtype == torch.bool))
        k += 1
    if len(aux) > AUX_SLOTS:
        raise ValueError(f"attention: aux expects at most {AUX_SLOTS} tensors read by the mods (aux and captured "
                         f"together), but got {len(aux)}")
    if any(m[0] > AUX_NDIM or m[0] == 0 for m in meta):
        raise ValueError(f"attention: aux expects tensors of 1 to {AUX_NDIM} dimensions read by the mods, but got "
                         f"{[m[0] for m in meta]}")
    aux += [_placeholder((1, 1, 1, 1), f32, device)] * (AUX_SLOTS - len(aux))
    return [slopes, sinks, mask, *bm, *aux], meta


def plan_variant_launch(io: ForwardTensors, call: VariantCall, make_map=None, schedule=None) -> Launch:
    """The grid, arguments and constexprs of one launch of ``io`` (q, k, v, out and lse, which is
    required; the mask travels in ``call``) (``make_map(t, dims, strides, box)`` builds a tensor map;
    ``schedule``: overrides of ``default_schedule``'s, e.g. {"PERSISTENT": True}, whose grid is the SM
    count or ``schedule["SM_COUNT"]``)."""
    q, k, v, out, lse, _ = io
    variant, tensors, scale = call
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    make_map = make_map or device_map
    sched = dict(default_schedule(variant, D, n_q, n_k), **(schedule or {}))
    unknown = sorted(set(sched) - set(SCHEDULE) - {"SM_COUNT"})
    if unknown:
        raise ValueError(f"attention variant forward: schedule expects keys among {sorted(SCHEDULE)}, but got "
                         f"{unknown}")
    sms = sched.pop("SM_COUNT", None)
    block_m = 64 * sched["CONSUMERS"]
    if variant.block_mask is not None and block_m != BLOCK_M:
        raise ValueError(f"attention variant forward: a block mask expects CONSUMERS=2 (query tiles of {BLOCK_M} "
                         f"rows, the block mask's), but got CONSUMERS={sched['CONSUMERS']}")
    (kk, k_batched), (vv, v_batched) = _kv_view(q, k), _kv_view(q, v)
    if kk.shape[1] != vv.shape[1] or k_batched != v_batched:
        kk, vv, k_batched = k, v, True
    # What the layouts and the variant decide is kept per signature (shapes, strides, dtypes, device,
    # the Variant object, the sign of the scale): a repeated call only maps its buffers again.
    key = (id(variant), q.shape, q.stride(), kk.shape, kk.stride(), vv.shape, vv.stride(), q.dtype, q.device,
           scale <= 0, tuple((t.shape, t.stride(), t.dtype) for t in tensors), block_m, sched["BLOCK_N"])
    kept = _signatures.get(key)
    aligned = not (q.data_ptr() | kk.data_ptr() | vv.data_ptr()) & 15  # per call: only layouts are kept
    if kept is not None and kept[0] is variant and (aligned or kept[3]):
        _, order, geoms, copy, kvar = kept
        if copy:
            q, kk, vv = tma_copy(q), tma_copy(kk), tma_copy(vv)
    else:
        order = _coord_order(q)
        copy = not all(_fits(t, order) for t in (q, kk, vv))
        if copy:
            q, kk, vv = tma_copy(q), tma_copy(kk), tma_copy(vv)
            order = _coord_order(q)
        geoms = [_map_geometry(t, rows, order) for t, rows in ((q, block_m), (kk, sched["BLOCK_N"]),
                                                               (vv, sched["BLOCK_N"]))]
        kvar = None
    maps = [make_map(t, *g) for t, g in zip((q, kk, vv), geoms)]
    kv_group = H // kk.shape[1]
    left, right = variant.window
    tensor_args, meta = variant_args(variant, tensors, B, H, n_q, n_k, q.device)
    if kvar is None:
        # the folded form keeps maxima of raw scores, which needs scale > 0: else scale first
        kvar = KernelVariant.of(variant, meta, scaled_first=scale <= 0, n_q=n_q, n_k=n_k, fold_alibi=True)
        if aligned:
            _signatures.put(key, (variant, order, geoms, copy, kvar))
    num_m = (n_q + block_m - 1) // block_m
    args = (*maps, out.view(torch.int16), lse, n_q, n_k, H, B, kv_group, int(k_batched), float(scale),
            out.stride(0), out.stride(1), out.stride(2), variant.diag(n_q, n_k), left, right,
            float(variant.softcap or 1.0), *tensor_args)
    cx = dict(sched, DTYPE=ty.bf16 if q.dtype == torch.bfloat16 else ty.f16, HEAD_DIM=D, RETURN_LSE=True,
              COORD_ORDER=order, VARIANT=kvar)
    Plan(D, cx["BLOCK_N"], cx["STAGES"], cx["CONSUMERS"], False)
    if cx["PERSISTENT"]:
        if sms is None:  # a tensor off the GPU (the emulator) gets the grid an H100/H200 run has
            sms = sm_count(q.device) if q.is_cuda else EMULATED_SMS
        return Launch((max(1, min(num_m * H * B, sms)),), args, cx)
    return Launch((num_m, H, B), args, cx)


_signatures = ty.PlanCache("Hopper variant attention layouts", capacity=64)


# Argument positions of the open tensor parameters (their dtypes specialize the kernel), read from its signature.
_PARAMS = tuple(inspect.signature(attention_variant_fwd_sm90.fn).parameters)
OPEN_SLOTS = {name: _PARAMS.index(name) for name in ("mask", "aux0", "aux1", "aux2", "aux3")}
_TY_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.uint8: "u8",
              torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64"}


def open_dtypes(launch: Launch) -> dict:
    """The dtypes of the open tensor parameters of ``launch`` by name (``compile(**constexprs, **these)``)."""
    return {name: getattr(ty, _TY_DTYPES[launch.args[i].dtype]) for name, i in OPEN_SLOTS.items()}


def launch_variant(io: ForwardTensors, call: VariantCall, schedule=None):
    """Run the kernel: q (B, H, N, D), k/v (B, H_kv, N_k, D), D in {64, 128}; out and lse (fp32) written
    (``schedule``: as ``plan_variant_launch``'s)."""
    launch = plan_variant_launch(io, call, schedule=schedule)
    attention_variant_fwd_sm90[launch.grid].repeat(*launch.args, **launch.constexprs)
