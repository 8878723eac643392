"""Host side of the Hopper attention backward over packed batches (``backward_varlen.py``).

``plan_varlen_backward(BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv), PackedDocs(cu_q, cu_k,
max_q, max_k), HopperBackwardOptions(scale, is_causal))`` takes the packed (total, H, D) tensors, lse as (H, total_q) fp32 (natural log) and device prefix
sums, and returns the three launches (statistics, dK/dV with dQ partials by TMA reduce-add, dQ
conversion) as ``Step``s; with ``encode=False`` the tensor maps are specs and the steps run in the
emulator. Every row of dq, dk, dv is written: the documents' rows by the kernels, the rows no
document computes (past max_seqlen, after the last document) zeroed by the conversion. The
non-deterministic mode only: dQ's fp32 sums run in whatever order CTAs reach them (the portable
backward serves ``torch.use_deterministic_algorithms``). Nothing reads cu_seqlens on the host.
"""
from __future__ import annotations

import torch

import tylopy as ty

from tylopy_kernels.attention.sm90.backward import BLOCK_N, SUPPORTED
from tylopy_kernels.attention.common import BackwardTensors, PackedDocs
from tylopy_kernels.attention.sm90.backward_launch import (SCHEDULE, HopperBackwardOptions, Step, _map, _same_order,
                                                           _stat_map, _tile_map, wide_rows)
from tylopy_kernels.attention.sm90.backward_varlen import (attention_bwd_varlen_dq_convert,
                                                           attention_bwd_varlen_preprocess, attention_bwd_varlen_sm90,
                                                           padded_rows)

PAD = 128


def _as_batch(t):
    return t.unsqueeze(0).transpose(1, 2)  # (total, H, D) -> (1, H, total, D)


def plan_varlen_backward(tensors: BackwardTensors, docs: PackedDocs, options: HopperBackwardOptions,
                         encode=True) -> list[Step]:
    """The launches (see the module docstring). ``tensors.attn_mask``/``dlse``, ``docs.seqused_*``
    and ``options.deterministic`` are not supported and must be None/False."""
    if tensors.attn_mask is not None or tensors.dlse is not None or docs.seqused_q is not None \
            or docs.seqused_k is not None or options.deterministic:
        raise ValueError("attention_varlen backward: the Hopper kernels expect no mask, LSE gradient, seqused or "
                         "deterministic mode, but got one")
    q, k, v, out, dout, lse, dq, dk, dv = tensors[:9]
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):  # the conversion zeroes rows in 32-bit words
        if t.data_ptr() % 4 or t.stride(0) % 2 or t.stride(1) % 2:
            raise ValueError(f"attention_varlen backward: {name} expects a 4-byte aligned base and even strides, "
                             f"but got strides {tuple(t.stride())} at {t.data_ptr():#x}")
    cu_q, cu_k, max_q, max_k = docs[:4]
    is_causal, scale, schedule = options.is_causal, options.scale, options.schedule
    total_q, H, D = q.shape
    total_k, H_kv = k.shape[0], k.shape[1]
    n_docs = cu_q.shape[0] - 1
    if n_docs < 1 or max_q == 0 or max_k == 0 or total_q * H == 0 or total_k == 0:
        return []
    sched = dict(SCHEDULE[D], **(schedule or {}))
    block_m = sched["BLOCK_M"]
    if (D, block_m) not in SUPPORTED:
        raise ValueError(f"attention_varlen backward: schedule BLOCK_M expects a (head dim, BLOCK_M) pair in "
                         f"{sorted(SUPPORTED)}, but got {(D, block_m)}")
    dtype = ty.bf16 if q.dtype == torch.bfloat16 else ty.f16
    dev = q.device
    n_pad = padded_rows(total_q, n_docs)
    max_pad = -(-max_q // PAD) * PAD
    qb, dob, q_order = _same_order(_as_batch(q), _as_batch(dout))
    kb, vb, kv_order = _same_order(_as_batch(k), _as_batch(v))
    delta = torch.empty((H, n_pad), dtype=torch.float32, device=dev)
    # the fp32 dQ accumulator: the statistics kernel zeroes the rows the dK/dV kernel adds into
    dq_accum = torch.empty(H * n_pad * D, dtype=torch.float32, device=dev)
    lse_log2 = torch.empty((H, n_pad), dtype=torch.float32, device=dev)
    i16 = torch.int16
    steps = [Step(attention_bwd_varlen_preprocess, (max_pad // (128 // (D // 8)), H, n_docs),
                  (out.view(i16), dout.view(i16), lse, delta, lse_log2, dq_accum, cu_q, max_q, total_q, n_pad,
                   out.stride(1), out.stride(0), dout.stride(1), dout.stride(0), lse.stride(0)),
                  dict(DTYPE=dtype, HEAD_DIM=D))]
    tm_q, tm_do = (_map(t, *_tile_map(t, block_m, q_order), encode) for t in (qb, dob))
    tm_k, tm_v = (_map(t, *_tile_map(t, BLOCK_N, kv_order), encode) for t in (kb, vb))
    tm_lse, tm_delta = (_stat_map(t, block_m, encode) for t in (lse_log2, delta))
    dq_mode = sched["DQ"]
    tm_dq = _map(dq_accum, (256, dq_accum.numel() // 256), (1024,), (256, 16), "f32", 0, encode) \
        if dq_mode == "tma" else tm_lse
    steps.append(Step(attention_bwd_varlen_sm90, (-(-max_k // BLOCK_N), H_kv, n_docs),
                      (tm_q, tm_k, tm_v, tm_do, tm_lse, tm_delta, tm_dq, dk.view(i16), dv.view(i16), dq_accum, cu_q,
                       cu_k, max_q, max_k, total_q, total_k, H, H // H_kv, n_pad, float(scale), int(is_causal),
                       dk.stride(1), dk.stride(0), dv.stride(1), dv.stride(0)),
                      dict(DTYPE=dtype, HEAD_DIM=D, BLOCK_M=block_m, STAGES=sched["STAGES"], DQ=dq_mode,
                           DQ_ORDER=sched["DQ_ORDER"], DK_SMEM=sched["DK_SMEM"], Q_ORDER=q_order, KV_ORDER=kv_order)))
    steps.append(Step(attention_bwd_varlen_dq_convert, (-(-max_q // 64) * (D // 64), H, n_docs),
                      (dq_accum, dq.view(i16), cu_q, max_q, total_q, n_pad, float(scale), dq.stride(1), dq.stride(0),
                       dk.view(i16), dv.view(i16), cu_k, max_k, total_k, H_kv, dk.stride(1), dk.stride(0),
                       dv.stride(1), dv.stride(0)),
                      dict(DTYPE=dtype, HEAD_DIM=D, WIDE=wide_rows(dq))))
    return steps


def launch_varlen_backward(*args, **kwargs) -> None:
    """Run ``plan_varlen_backward``'s launches on the current stream (no host synchronization)."""
    for step in plan_varlen_backward(*args, **kwargs):
        step.launch()
