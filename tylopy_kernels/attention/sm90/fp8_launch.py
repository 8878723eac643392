"""Host side of the FP8 attention forward (``forward_fp8.py``): checks, descale tables, the
permuted V^T, tensor maps and the launch.

``launch_fp8(Fp8Problem(q, k, v, attn_mask, is_causal, scale, descales), out, lse)`` takes e4m3 q
(B, H, N_q, D) and k, v (B, H_kv, N_k, D), D = 64 or 128, with H_kv dividing H, and writes out
(B, H, N_q, D) bf16 and lse (B, H, N_q) float32 (or None). ``plan_fp8`` builds the same launch without a GPU (the emulator
runs it with tensor-map specs).

V is read by the kernel as V^T with each group of 32 keys permuted (``forward_fp8.key_slot``):
``value_transposed`` writes it, one pass over V (N_k x D bytes per K/V head, a tylopy kernel on the
GPU) and a buffer of the same size, zeros past N_k up to a multiple of 32.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch

import tylopy as ty
from tylopy.runtime.tensormap import TensorMap

from tylopy_kernels.attention.common import mask_and_lse_args, tma_copy
from tylopy_kernels.attention.sm90.forward_fp8 import KEY_GROUP, Fp8Plan, attention_fwd_fp8_sm90
from tylopy_kernels.attention.sm90.fp8_transpose import TILE, value_transpose_fp8
from tylopy_kernels.attention.sm90.launch import _coord_order, _fits, _map_geometry

# D = 128: 128 x 128 tiles, two consumers (S and O take 64 registers each, P 16).
SCHEDULE = MappingProxyType({"BLOCK_N": 128, "STAGES": 2, "CONSUMERS": 2, "EXPONENT": "shared",
                             "RESCALE_THRESHOLD": 0.0, "PV_WAIT": "pinned"})
# D = 64: O takes 32 registers, so three consumers fit in 160 registers (as the bf16 forward's D = 64).
SCHEDULE_64 = MappingProxyType(dict(SCHEDULE, CONSUMERS=3))
# With a user mask the per-element mask loads need more than 160 registers a consumer thread (D = 64,
# three consumers: 108 bytes of spills with the LSE); two consumers get 240.
MASKED_SCHEDULE = MappingProxyType({"CONSUMERS": 2})


@dataclass
class Fp8Problem:
    """One call's inputs: e4m3 q (B, H, N_q, 128), k/v (B, H_kv, N_k, 128), the Boolean mask or
    None, causal, the softmax scale and the (q, k, v) descales (each None, one element or (B, H_kv))."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_mask: object = None
    is_causal: bool = False
    scale: float = 0.08838834764831845
    descales: tuple = (None, None, None)


@dataclass
class Launch:
    grid: tuple
    args: tuple
    constexprs: dict


def value_transposed(v: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, D, N') e4m3 codes: V^T with the keys of each group of 32 in ``key_slot`` order,
    N' = N_k rounded up to 32, zeros past N_k. Key 8a + 2t + e (a = 2 a1 + a0) goes to slot
    16 a1 + 4 t + 2 a0 + e: a permutation of the key index's bit fields. On the GPU (16-byte
    aligned rows) one pass of ``fp8_transpose.value_transpose_fp8``; elsewhere one strided torch
    copy (and a padded copy first when N_k is not a multiple of 32)."""
    B, Hkv, n, D = v.shape
    n_pad = -(-n // KEY_GROUP) * KEY_GROUP
    codes = v.view(torch.uint8)
    if v.is_cuda and not (codes.data_ptr() | codes.stride(0) | codes.stride(1) | codes.stride(2)) & 15:
        vt = torch.empty((B, Hkv, D, n_pad), dtype=torch.uint8, device=v.device)
        value_transpose_fp8[(-(-n_pad // TILE), Hkv, B)](ty.strided(codes), vt, n, n_pad, Hkv, codes.stride(0),
                                                          codes.stride(1), codes.stride(2), HEAD_DIM=D)
        return vt.view(torch.float8_e4m3fn)
    if n_pad != n:
        codes = torch.cat([codes, torch.zeros((B, Hkv, n_pad - n, D), dtype=torch.uint8, device=v.device)], 2)
    # key = (group, a1, a0, t, e) -> V^T column (group, a1, t, a0, e)
    fields = codes.reshape(B, Hkv, n_pad // KEY_GROUP, 2, 2, 4, 2, D)
    vt = fields.permute(0, 1, 7, 2, 3, 5, 4, 6).contiguous().view(B, Hkv, D, n_pad)
    return vt.view(torch.float8_e4m3fn)


def descale_args(descales, device):
    """(q, k, v descale tensors, form): a one-element descale (or a 1 for None) is read as is, a
    (B, H_kv) one through a contiguous view; bit i of form marks descale i as per (B, H_kv)."""
    tensors, form = [], 0
    for i, d in enumerate(descales):
        if d is None:
            d = placeholder_one(device)
        elif d.numel() != 1:
            form |= 1 << i
            d = d.contiguous()
        tensors.append(d)
    return tensors, form


_ones: dict = {}


def placeholder_one(device):
    """A cached 1-element float32 tensor holding 1 (a missing descale)."""
    t = _ones.get(device)
    if t is None:
        t = _ones[device] = torch.ones(1, dtype=torch.float32, device=device)
    return t


def device_map(t, shape, strides, box, swizzle=128) -> TensorMap:
    return TensorMap.cached(t, tuple(shape), tuple(strides), tuple(box), "e4m3", swizzle)


def resolve_schedule(head_dim=128, masked=False, schedule=None) -> dict:
    sched = dict(SCHEDULE if head_dim == 128 else SCHEDULE_64)
    if masked:
        sched.update(MASKED_SCHEDULE)
    sched.update(schedule or {})
    return sched


def plan_fp8(prob: Fp8Problem, out, lse, schedule=None, make_map=None):
    """(the grid, arguments and constexprs of one launch, the V^T it reads); ``make_map(t, dims,
    strides, box, swizzle)`` builds a tensor map."""
    q, k, v, attn_mask, is_causal, scale = prob.q, prob.k, prob.v, prob.attn_mask, prob.is_causal, prob.scale
    B, H, n_q, D = q.shape
    Hkv, n_k = k.shape[1], k.shape[2]
    sched = resolve_schedule(D, attn_mask is not None, schedule)
    make_map = make_map or device_map
    order = _coord_order(q)
    if _coord_order(k) != order or not all(_fits(t, order) for t in (q, k)):
        q, k = tma_copy(q), tma_copy(k)
        order = _coord_order(q)
    vt = value_transposed(v)
    n_pad = vt.shape[3]
    block_m = 64 * sched["CONSUMERS"]
    maps = []
    for t, rows in ((q, block_m), (k, sched["BLOCK_N"])):
        shape, strides, box = _map_geometry(t, rows, order)
        box[0] = D                       # one D-byte row of codes, swizzled over D bytes
        maps.append(make_map(t, shape, strides, box, D))
    maps.append(make_map(vt, (n_pad, D, Hkv, B), (n_pad, D * n_pad, Hkv * D * n_pad), (128, D, 1, 1), 128))
    mask_t, ms, lse_t = mask_and_lse_args(attn_mask, lse, B, H, n_q, n_k, q.device)
    descale_t, form = descale_args(prob.descales, q.device)
    num_m = (n_q + block_m - 1) // block_m
    args = (*maps, out.view(torch.int16), lse_t, mask_t, *descale_t, form, n_q, n_k, H, B, H // Hkv, scale,
            int(is_causal), out.stride(0), out.stride(1), out.stride(2), ms[0], ms[1], ms[2], ms[3])
    cx = dict(sched, HEAD_DIM=D, HAS_MASK=attn_mask is not None, RETURN_LSE=lse is not None, COORD_ORDER=order)
    Fp8Plan(D, cx["BLOCK_N"], cx["STAGES"], cx["CONSUMERS"])  # fails early on a bad schedule
    return Launch((num_m, H, B), args, cx), vt


def launch_fp8(prob: Fp8Problem, out, lse, schedule=None):
    """Run the kernel (an H100/H200); out and lse are written."""
    launch, vt = plan_fp8(prob, out, lse, schedule)
    attention_fwd_fp8_sm90[launch.grid](*launch.args, **launch.constexprs)
    return vt  # the caller keeps the transposed V alive until the launch has run (same stream)
