"""Host side of the Hopper attention kernel: tensor maps, specialization, launch."""
from __future__ import annotations

import functools

import torch

import tylopy as ty
from tylopy.runtime.tensormap import TensorMap

from .hopper import HEAD_DIM, attention_fwd_sm90
from .common import mask_and_lse_args

# Measured on the H200 (results/attention-sweep-H200-2026-11-29.json): 128-key tiles and three
# consumer warpgroups beat 64 x 2 by 15-30%; the stage count barely matters at this depth.
SCHEDULE = {"BLOCK_N": 128, "STAGES": 2, "CONSUMERS": 3, "PERSISTENT": "auto", "EXPONENT": "exact"}
# EXPONENT "fast" (ex2(fma(s, c, -round(m c)))) is 6-8% faster (results/attention-exponent-*.json)
# but overflows to NaN once |max score * scale * log2 e| nears 2^31 (e.g. every input 133120 in
# bf16); "exact" (ex2((s - m) c)) is right for every finite input and is the default.
# The persistent loop needs a few more live registers than 160 per consumer thread allow
# (3 consumers spill 32 bytes), so it runs with two consumers.
PERSISTENT_SCHEDULE = {"CONSUMERS": 2}
# A persistent grid (one CTA per SM looping over work tiles, the next Q loading under the current
# epilogue) wins only where each work tile is short; with long rows the hardware's dynamic block
# scheduler balances causal work better than our static order (results/*-v3-persistent.json).
PERSISTENT_MAX_KEYS = 1024
# With a user mask the per-element mask loads need more registers than 160 per consumer thread
# (3 consumers spill 156 bytes); two consumers get 240.
MASKED_SCHEDULE = {"CONSUMERS": 2}
_maps: dict = {}


def _coord_order(t: torch.Tensor) -> tuple:
    """(n, h, b) sorted by increasing stride: the tensor map lists dimensions innermost first."""
    dims = {"b": 0, "h": 1, "n": 2}
    return tuple(sorted(dims, key=lambda k: (t.stride(dims[k]), dims[k] == 0, k != "n")))


def _tensor_map(t: torch.Tensor, rows: int, order: tuple) -> TensorMap:
    dims = {"b": 0, "h": 1, "n": 2}
    shape = [HEAD_DIM] + [t.shape[dims[k]] for k in order]
    strides = [max(t.stride(dims[k]), 1) * t.element_size() for k in order]
    strides = [s if t.shape[dims[k]] > 1 else max(s, 16) for s, k in zip(strides, order)]
    box = [HEAD_DIM] + [rows if k == "n" else 1 for k in order]
    key = (t.data_ptr(), tuple(shape), tuple(strides), tuple(box), t.dtype, t.device.index)
    tm = _maps.get(key)
    if tm is None:
        if len(_maps) > 256:
            _maps.clear()
        tm = TensorMap.tiled(t, shape, strides, box, "bf16" if t.dtype == torch.bfloat16 else "f16", swizzle=128)
        _maps[key] = tm
    return tm


@functools.lru_cache(maxsize=None)
def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_hopper(q, k, v, attn_mask, is_causal, scale, out, lse, schedule=None):
    sched = dict(SCHEDULE, **(MASKED_SCHEDULE if attn_mask is not None else {}), **(schedule or {}))
    B, H, n_q, _ = q.shape
    n_k = k.shape[2]
    if sched["PERSISTENT"] == "auto":
        sched["PERSISTENT"] = n_k <= PERSISTENT_MAX_KEYS
    if sched["PERSISTENT"]:
        sched.update(PERSISTENT_SCHEDULE)
    block_m = 64 * sched["CONSUMERS"]
    order = _coord_order(q)
    if _coord_order(k) != order or _coord_order(v) != order:
        k, v = k.contiguous(), v.contiguous()
        q = q.contiguous()
        order = _coord_order(q)
    tm_q = _tensor_map(q, block_m, order)
    tm_k = _tensor_map(k, sched["BLOCK_N"], order)
    tm_v = _tensor_map(v, sched["BLOCK_N"], order)
    mask_t, ms, lse_t = mask_and_lse_args(attn_mask, lse, B, H, n_q, n_k, q.device)
    num_m = (n_q + block_m - 1) // block_m
    grid = (min(num_m * H * B, _sm_count(q.device)),) if sched["PERSISTENT"] else (num_m, H, B)
    attention_fwd_sm90[grid](
        tm_q, tm_k, tm_v, out.view(torch.int16), lse_t, mask_t,
        n_q, n_k, H, B, scale, int(is_causal),
        out.stride(0), out.stride(1), out.stride(2),
        ms[0], ms[1], ms[2], ms[3],
        DTYPE=ty.bf16 if q.dtype == torch.bfloat16 else ty.f16, HAS_MASK=attn_mask is not None,
        RETURN_LSE=lse is not None, COORD_ORDER=order, **sched)
