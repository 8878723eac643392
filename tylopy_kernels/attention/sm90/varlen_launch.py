"""Host side of the Hopper attention forward over packed batches (``varlen_forward.py``).

``launch_varlen_hopper(ForwardTensors(q, k, v, out, lse), PackedDocs(cu_q, cu_k, max_q, max_k),
HopperOptions(scale, is_causal))`` takes
q (total_q, H, D), k/v (total_k, H_kv, D) with H_kv dividing H, D in {64, 128}, int32 prefix
sums cu_q/cu_k of B + 1 entries on the device, and writes the documents' rows of out (which the
caller zeroes) and of lse (H, total_q) float32 or None (which the caller fills with -inf). The
packed tensors are mapped as (1, H, total, D) views, so a work tile's TMA box starts at any row
and the rows past a document's end are masked in the kernel. It never reads cu_seqlens on the
host. ``plan_varlen_launch`` builds the same launch without a GPU (the emulator runs it).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import NamedTuple

import torch

import tylopy as ty

from tylopy.runtime.plancache import PlanCache

from tylopy_kernels.attention.common import ForwardTensors, PackedDocs, placeholder, tma_copy
from tylopy_kernels.attention.sm90 import launch as dense
from tylopy_kernels.attention.sm90.launch import HopperOptions, MapTarget
from tylopy_kernels.attention.sm90.tiles import Plan
from tylopy_kernels.attention.sm90.varlen_forward import attention_varlen_fwd_sm90

# Per head dim: the dense defaults without what a packed batch cannot take (TMA stores clip at
# the tensor's end, not a document's; the deferred epilogue carries a document's rows across tiles).
# D=64 takes three consumers (192-row query tiles, as the dense kernel): on an H200, documents of
# 0.5-1.5k tokens 0.311 against 0.349 ms with two, of 2-6k 0.721 against 0.808 ms. At 160
# registers a consumer thread the per-document values spill 4-12 bytes (ptxas; in the SASS one
# 4-byte reload per key tile, the rest before the key loop and in the epilogue), which costs less
# than the wider tile gains. D=128 takes the "shared" exponent sequence, as the dense kernel: 1.01-1.07x
# the "ffma" form it had (H200, 16k tokens, documents of 1k/4k/16k: 0.235 -> 0.232, 0.589 -> 0.577,
# 1.858 -> 1.787 ms; no spills either way).
# (Read-only: overrides go through HopperOptions.schedule; a replaced table plans again.)
SCHEDULE = MappingProxyType({
    64: MappingProxyType({"BLOCK_N": 128, "STAGES": 2, "CONSUMERS": 3, "EXPONENT": "shared", "PERSISTENT": False}),
    128: MappingProxyType({"BLOCK_N": 128, "STAGES": 2, "CONSUMERS": 2, "EXPONENT": "shared", "PERSISTENT": False})})
KERNEL_OPTIONS = ("BLOCK_N", "STAGES", "CONSUMERS", "PERSISTENT", "ORDER", "EXPONENT", "RESCALE_THRESHOLD", "SPLIT_S",
                  "PV_WAIT", "POLY_EXP2", "EARLY_SUMS")


def _as_batch(t: torch.Tensor) -> torch.Tensor:
    """(total, H, D) -> a (1, H, total, D) view: the dense launcher's geometry over the same memory."""
    return t.unsqueeze(0).transpose(1, 2)


def resolve_schedule(D, is_causal, schedule=None) -> dict:
    sched = dict(SCHEDULE[D])
    for key, val in (schedule or {}).items():
        if key not in KERNEL_OPTIONS:
            raise ValueError(f"launch_varlen_hopper: schedule expects keys among {KERNEL_OPTIONS}, but got {key!r}")
        sched[key] = val
    sched.setdefault("ORDER", "lpt" if (is_causal and sched["PERSISTENT"]) else "heads")
    return sched


def plan_varlen_launch(tensors: ForwardTensors, docs: PackedDocs, options: HopperOptions,
                       target: MapTarget = MapTarget()) -> dense.Launch:
    """The grid, arguments and constexprs of one launch (``target.make_map(t, dims, strides, box)``;
    ``tensors.attn_mask`` must be None)."""
    return _launch_of(_layout(tensors, docs, options, target.sm_count), tensors, docs, options,
                      target.make_map or dense.device_map)


class _Shape(NamedTuple):
    """What a launch takes from the call's sizes, layouts and options alone (kept per signature):
    the grid, the constexprs, whether q, k, v need contiguous copies (TMA cannot describe them) and
    each map's (dims, strides, box) over the (1, H, total, D) views."""
    grid: tuple
    constexprs: dict
    copy: bool
    geometry: tuple


def _layout(tensors: ForwardTensors, docs: PackedDocs, options: HopperOptions, sm_count) -> _Shape:
    q, k, v, out, lse, _ = tensors
    total_q, H, D = q.shape
    if H % k.shape[1] or k.shape[1] != v.shape[1]:
        raise ValueError(f"launch_varlen_hopper: key/value heads expects a divisor of the {H} query heads (the same "
                         f"for both), but got {k.shape[1]} and {v.shape[1]}")
    sched = resolve_schedule(D, options.is_causal, options.schedule)
    qb, kb, vb = _as_batch(q), _as_batch(k), _as_batch(v)
    order = dense._coord_order(qb)
    copy = not all(dense._fits(t, order) for t in (qb, kb, vb))
    if copy:
        qb, kb, vb = (_as_batch(tma_copy(t)) for t in (q, k, v))
        order = dense._coord_order(qb)
    block_m = 64 * sched["CONSUMERS"]
    geometry = tuple(tuple(map(tuple, dense._map_geometry(t, rows, order)))
                     for t, rows in ((qb, block_m), (kb, sched["BLOCK_N"]), (vb, sched["BLOCK_N"])))
    n_docs = docs.cu_q.shape[0] - 1
    num_m = (docs.max_q + block_m - 1) // block_m
    grid = (max(1, min(num_m * H * n_docs, sm_count or dense.EMULATED_SMS)),) if sched["PERSISTENT"] else (num_m, H, n_docs)
    cx = dict(sched, DTYPE=ty.bf16 if q.dtype == torch.bfloat16 else ty.f16, HEAD_DIM=D, RETURN_LSE=lse is not None,
              COORD_ORDER=order, SEQUSED_Q=docs.seqused_q is not None, SEQUSED_K=docs.seqused_k is not None)
    Plan(D, cx["BLOCK_N"], cx["STAGES"], cx["CONSUMERS"], False)  # fails early on too much smem
    return _Shape(grid, cx, copy, geometry)


def _launch_of(shape: _Shape, tensors: ForwardTensors, docs: PackedDocs, options: HopperOptions,
               make_map) -> dense.Launch:
    """The launch of ``shape`` over these tensors (contiguous copies of q, k, v where it asks for them)."""
    q, k, v, out, lse, _ = tensors
    if shape.copy:
        q, k, v = tma_copy(q), tma_copy(k), tma_copy(v)
    cu_q, cu_k, max_q, max_k, used_q, used_k = docs
    total_q, H, _ = q.shape
    maps = [make_map(_as_batch(t), *g) for t, g in zip((q, k, v), shape.geometry)]
    lse_arg = lse if lse is not None else placeholder(q.device, torch.float32)
    args = (*maps, out.view(torch.int16), lse_arg, cu_q, cu_k, cu_q if used_q is None else used_q,
            cu_k if used_k is None else used_k, max_q, max_k, H, cu_q.shape[0] - 1, H // k.shape[1], total_q, 0,
            options.scale, int(options.is_causal), out.stride(1), out.stride(0))
    return dense.Launch(shape.grid, args, shape.constexprs)


def launch_varlen_hopper(tensors: ForwardTensors, docs: PackedDocs, options: HopperOptions):
    """Run the kernel (see the module's docstring); returns nothing, never synchronizes. The launch's
    shape (grid, constexprs, map geometries) is kept per signature, and the launch repacks only the
    arguments that changed (``kernel[grid].repeat``): the layers of a model call it again and again."""
    q = tensors.q
    if docs.max_q == 0 or docs.max_k == 0 or docs.cu_q.shape[0] < 2 or q.shape[0] * q.shape[1] == 0:
        return
    sms = dense.sm_count(q.device)
    key = _signature(tensors, docs, options, sms)
    shape = _shapes.get(key) if key is not None else None
    if shape is None:
        shape = _layout(tensors, docs, options, sms)
        if key is not None and not shape.copy:
            _shapes.put(key, shape)
    launch = _launch_of(shape, tensors, docs, options, dense.device_map)
    attention_varlen_fwd_sm90[launch.grid].repeat(*launch.args, **launch.constexprs)


_shapes = PlanCache("varlen forward launch shapes", capacity=64)


def _signature(tensors: ForwardTensors, docs: PackedDocs, options: HopperOptions, sms: int):
    """What ``_layout`` reads, or None (schedule overrides are not kept). The schedule table is part
    of it: a replaced ``SCHEDULE`` plans again. A base address off 16 bytes is planned each time."""
    q, k, v, out, lse, _ = tensors
    if options.schedule is not None or (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15:
        return None
    return (q.dtype, q.device, tuple(q.shape), q.stride(), tuple(k.shape), k.stride(), v.stride(),
            docs.cu_q.shape[0], docs.max_q, lse is None, docs.seqused_q is None, docs.seqused_k is None,
            options.is_causal, sms, tuple(SCHEDULE.get(q.shape[2], {}).items()))
