"""Host side of the Hopper attention backward: buffers, tensor maps, specialization, launch.

    launch_backward_hopper(BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv), HopperBackwardOptions(scale=0.125))

fills dq, dk, dv (views of the input dtype, last dim contiguous) from the forward's inputs, its
output ``out``, the output gradient ``dout`` and its LSE (fp32 (B, H, N), natural log). K and V
may have fewer heads than Q (GQA/MQA: H_q a multiple of H_kv; query head h uses key/value head
h // (H_q / H_kv)); dk and dv have K's shape and receive the sum over each group. K and V expanded
over the query heads (stride 0: MQA by ``expand``) run as one head without a copy: head 0 of dk
and dv receives the sum and the other heads 0, so the expand's own backward (a sum over the
heads) gives the right gradient. ``supports(q, k, v)`` says whether the inputs are within these
limits.

Two modes (``tylopy_kernels/attention/sm90/backward.py`` has the algorithm):

* default (``deterministic=False``): preprocess -> dK/dV kernel that also adds dS K into an fp32
  accumulator with vector atomics -> convert. dQ's fp32 sums run in whatever order the CTAs
  reach the atomics, so dQ can differ in the last bits between runs; dK and dV never do.
* ``deterministic=True``: preprocess -> dK/dV kernel without dQ -> a dQ kernel that loops over
  the key tiles itself. Bitwise reproducible, at the price of recomputing S and dP.

``plan_backward_hopper`` returns the launches as ``Step``s without running them; with
``encode=False`` its tensor maps are unencoded ``TensorMapSpec``s, so the same plan runs on
CPU tensors in the emulator (``Step.emulate``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, Optional

import torch

import tylopy as ty
from tylopy.runtime.tensormap import TensorMap, TensorMapSpec

from tylopy_kernels.attention.sm90.backward import BLOCK_N, SUPPORTED, attention_bwd_sm90
from tylopy_kernels.attention.sm90.backward_aux import attention_bwd_dq_convert, attention_bwd_pack_mask, attention_bwd_preprocess
from tylopy_kernels.attention.sm90.backward_dq import BLOCK_M as DQ_BLOCK_M
from tylopy_kernels.attention.sm90.backward_dq import attention_bwd_dq_sm90
from tylopy_kernels.attention.sm90.backward_dq import smem_bytes as dq_smem_bytes
from tylopy_kernels.attention.common import BackwardTensors, mask_and_lse_args, placeholder, rejecter, tma_copy

HEAD_DIMS = (64, 128)
MAX_SMEM = 232448             # dynamic shared memory a block may opt into on an H100/H200
# Per head dim: the dK/dV kernel's query tile (BLOCK_M is tied to the head dim, see SUPPORTED)
# and ring depth, and the deterministic dQ kernel's key tile and ring depth. Schedule choices only;
# ``schedule=`` overrides any of them (``tylopy bench attention_backward --sweep`` measures them).
SCHEDULE = MappingProxyType({  # (read-only: ``schedule=`` overrides)
    64: MappingProxyType({"BLOCK_M": 128, "STAGES": 2, "DQ": "tma", "DQ_ORDER": "early", "DK_SMEM": False,
                          "DQ_BLOCK_N": 128, "DQ_STAGES": 2, "DQ_PIPELINE": True}),
    128: MappingProxyType({"BLOCK_M": 64, "STAGES": 2, "DQ": "tma", "DQ_ORDER": "early", "DK_SMEM": False,
                           "DQ_BLOCK_N": 64, "DQ_STAGES": 2, "DQ_PIPELINE": True}),
})
# With a user mask the consumers also hold its bits: dQ = dS K waits until dV and dK completed
# (DQ_ORDER "serial"), which keeps them within 240 registers (other orders spill).
MASKED_SCHEDULE = MappingProxyType({"DQ_ORDER": "serial", "DK_SMEM": False})
# The schedules ``tylopy bench attention_backward --sweep`` measures (no mask): every combination that ptxas
# assembles without spills and that fits in shared memory (tests check both). Head dim 128 with
# atomics spills (the accumulator's addressing needs registers the consumers lack), as do a few
# early/late orders with dK read from shared memory; three stages with the TMA reduce need more
# shared memory than an SM has at head dim 64.
SWEEP = {
    64: [dict(STAGES=st, DQ=dq, DQ_ORDER=order, DK_SMEM=dk)
         for st, dq in ((2, "tma"), (2, "atomic"), (3, "atomic"))
         for order in ("early", "late", "serial") for dk in (False, True)
         if not (dq == "atomic" and order == "early" and dk)],
    128: [dict(STAGES=st, DQ="tma", DQ_ORDER=order, DK_SMEM=dk)
          for st in (2, 3) for order in ("early", "late", "serial") for dk in (False, True) if st == 3 or not dk],
}
# The deterministic dQ kernel's key tile, ring depth and pipelining, where they fit in shared
# memory; at head dim 128 a pipelined 128-key tile lacks the registers to overlap (C7512).
DQ_SWEEP = {d: [dict(DQ_BLOCK_N=bn, DQ_STAGES=st, DQ_PIPELINE=pipe) for bn in (64, 128) for st in (2, 3)
                for pipe in (True, False)
                if dq_smem_bytes(HEAD_DIM=d, BLOCK_N=bn, STAGES=st) <= MAX_SMEM and not (d == bn == 128 and pipe)]
            for d in HEAD_DIMS}
PAD = 128                     # L/delta rows are padded to a multiple of every query tile
_DIMS = {"b": 0, "h": 1, "n": 2}
_U32 = getattr(torch, "uint32", torch.int32)


_fail = rejecter("attention backward")


@dataclass
class Step:
    """One kernel launch of the backward: ``launch()`` on the GPU or ``emulate()`` on CPU tensors."""

    kernel: object
    grid: tuple
    args: tuple
    constexprs: dict = field(default_factory=dict)

    def launch(self):
        # repeat(): a training loop launches each step with mostly the same arguments
        self.kernel[self.grid].repeat(*self.args, **self.constexprs)

    def emulate(self, **options):
        return self.kernel.emulate(*self.args, grid=self.grid, **self.constexprs, **options)


def coord_order(t: torch.Tensor) -> tuple:
    """(n, h, b) sorted by increasing stride: a tensor map lists its dimensions innermost first."""
    return tuple(sorted(_DIMS, key=lambda k: (t.stride(_DIMS[k]), _DIMS[k] == 0, k != "n")))


def _tma_ready(t: torch.Tensor) -> bool:
    """TMA needs a 16-byte aligned base and non-zero outer strides that are multiples of 16 bytes."""
    if t.data_ptr() % 16 or t.stride(3) != 1:
        return False
    return all(t.shape[d] <= 1 or (t.stride(d) > 0 and t.stride(d) * t.element_size() % 16 == 0) for d in range(3))


def wide_rows(t: torch.Tensor) -> bool:
    """Whether 16-byte stores can write 8-element row segments of ``t``: a 16-byte aligned base
    and strides (except the last dim's) of multiples of 8 elements."""
    return t.data_ptr() % 16 == 0 and all(t.stride(d) % 8 == 0 or t.shape[d] <= 1 for d in range(t.dim() - 1))


def _same_order(a: torch.Tensor, b: torch.Tensor):
    """Both tensors in one TMA-compatible coordinate order (contiguous copies where needed)."""
    if not _tma_ready(a):
        a = tma_copy(a)
    if not _tma_ready(b) or coord_order(b) != coord_order(a):
        b = tma_copy(b)
        if coord_order(a) != coord_order(b):
            a = tma_copy(a)
    return a, b, coord_order(a)


def _tile_map(t: torch.Tensor, rows: int, order: tuple) -> tuple:
    """The geometry (shape, strides, box, dtype, swizzle) of a map whose box is one 64-column
    panel of ``rows`` rows (the kernels load D/64 panels)."""
    shape = [t.shape[3]] + [t.shape[_DIMS[k]] for k in order]
    strides = [max(t.stride(_DIMS[k]), 1) * t.element_size() for k in order]
    strides = [s if t.shape[_DIMS[k]] > 1 else max(s, 16) for s, k in zip(strides, order)]
    box = [64] + [rows if k == "n" else 1 for k in order]
    return tuple(shape), tuple(strides), tuple(box), "bf16" if t.dtype == torch.bfloat16 else "f16", 128


def _stat_map(t: torch.Tensor, rows: int, encode: bool):
    """A map over a padded (B*H, n_pad) fp32 statistic whose box is one query tile's values."""
    return _map(t, (t.shape[1], t.shape[0]), (t.shape[1] * 4,), (rows, 1), "f32", 0, encode)


def _map(t, shape, strides, box, dtype, swizzle, encode):
    """A map over ``t`` (tuples of ints): encoded (cached by address) or, ``encode=False``, a spec."""
    if not encode:
        return TensorMapSpec(t, shape, strides, box, dtype, swizzle)
    return TensorMap.cached(t, shape, strides, box, dtype, swizzle)


@dataclass(frozen=True)
class HopperBackwardOptions:
    """What one Hopper backward computes and how: ``scale``, SDPA's top-left ``is_causal``,
    ``deterministic`` (the separate dQ kernel, see the module docstring) and ``schedule``
    (overrides of SCHEDULE's constexprs; None: none)."""

    scale: float
    is_causal: bool = False
    deterministic: bool = False
    schedule: Optional[dict] = None


class MaskShape(NamedTuple):
    """The sizes a packed mask is laid out for: batch, query heads, queries, keys, and the
    queries padded to the statistics' row length."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    n_pad: int


def _check(tensors: BackwardTensors):
    q, k, v, out, dout, lse, dq, dk, dv = tensors[:9]
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _fail(ValueError, name, "a 4-D (batch, heads, seq, head_dim) tensor", getattr(t, "shape", type(t)))
        if t.dtype != q.dtype or t.dtype not in (torch.bfloat16, torch.float16):
            _fail(TypeError, name, f"dtype bf16 or fp16 like q ({q.dtype})", t.dtype)
        if t.stride(3) != 1 and t.shape[3] > 1:
            _fail(ValueError, name, "a contiguous last dimension", f"stride {t.stride(3)}")
    B, H, n_q, D = q.shape
    H_kv, n_k = k.shape[1], k.shape[2]
    if D not in HEAD_DIMS:
        _fail(ValueError, "head_dim", f"one of {HEAD_DIMS}", D)
    if H_kv == 0 or H % H_kv:
        _fail(ValueError, "key/value heads", f"a divisor of the {H} query heads", H_kv)
    for name, t, want in (("k", k, (B, H_kv, n_k, D)), ("v", v, (B, H_kv, n_k, D)), ("out", out, (B, H, n_q, D)),
                          ("dout", dout, (B, H, n_q, D)), ("dq", dq, (B, H, n_q, D)), ("dk", dk, (B, H_kv, n_k, D)),
                          ("dv", dv, (B, H_kv, n_k, D))):
        if tuple(t.shape) != want:
            _fail(ValueError, name, f"shape {want}", tuple(t.shape))
    if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or tuple(lse.shape) != (B, H, n_q):
        _fail(ValueError, "lse", f"an fp32 tensor of shape {(B, H, n_q)}", getattr(lse, "shape", type(lse)))
    return B, H, H_kv, n_q, n_k, D


def _packed_mask(steps, mask_view, shape: MaskShape, keys_on_rows):
    """A ``Step`` (appended to ``steps``) that bit-packs the mask (keys or queries on the rows);
    returns its buffer and strides in words. ``mask_view``: (mask, its 4 strides) as
    ``mask_and_lse_args`` gives them."""
    mask_t, ms = mask_view
    B, H, n_q, n_k, n_pad = shape
    dev = mask_t.device
    k_pad = -(-n_k // PAD) * PAD
    rows, words = (k_pad, n_pad // 32) if keys_on_rows else (n_pad, k_pad // 32)
    planes_b = B if ms[0] != 0 else 1
    planes_h = H if ms[1] != 0 else 1
    # int32 storage viewed as uint32: torch's uint32 lacks most kernels (fills) on some builds.
    bits = torch.empty(planes_b * planes_h * rows * words, dtype=torch.int32, device=dev).view(_U32)
    steps.append(Step(attention_bwd_pack_mask, (-(-rows * words // 128), planes_h, planes_b),
                      (mask_t, bits, n_q, n_k, rows, words, *ms), dict(KEYS_ON_ROWS=keys_on_rows)))
    plane = rows * words
    return bits, (plane * planes_h if planes_b > 1 else 0, plane if planes_h > 1 else 0, words)


def schedule_for(head_dim, masked, schedule=None):
    """The compile-time choices a launch uses: SCHEDULE, MASKED_SCHEDULE over it, ``schedule`` last."""
    return dict(SCHEDULE[head_dim], **(MASKED_SCHEDULE if masked else {}), **(schedule or {}))


class Layout(NamedTuple):
    """What a backward's launches derive from its signature alone (shapes, strides, dtypes,
    device, options): the sizes (B, H, H_kv, n_q, n_k, D), the schedule, the kernels' dtype, the
    statistics' padded row length, the coordinate orders of Q/dO and K/V, and each tile map's
    geometry (shape, strides, box, dtype, swizzle) over q, dout, k, v (and, deterministic, the dQ
    kernel's own tiles). ``tables``: the schedule tables it read (replaced tables plan again)."""

    sizes: tuple
    sched: dict
    dtype: object
    n_pad: int
    q_order: tuple
    kv_order: tuple
    geometry: tuple
    tables: tuple


def _tables():
    return SCHEDULE, MASKED_SCHEDULE


# A training loop calls the backward with one signature again and again: the checks, the orders
# and the map geometries (most of the planning's host time) are kept per signature, and a call
# like an earlier one only allocates the statistics and builds its launches (``_steps``).
_layouts = ty.PlanCache("Hopper attention backward layouts", capacity=64)


def _layout_key(tensors: BackwardTensors, options: HopperBackwardOptions):
    """The signature a kept ``Layout`` holds for, or None where the plan depends on more: a mask,
    a schedule that is not a flat dict of plain values, a base TMA cannot read (a copy is made)."""
    q, k, v, out, dout, lse, dq, dk, dv, attn_mask = tensors[:10]
    if attn_mask is not None or (q.data_ptr() | k.data_ptr() | v.data_ptr() | dout.data_ptr()) & 15:
        return None
    sched = options.schedule
    try:
        sched = None if sched is None else tuple(sorted(sched.items()))
        return (*(x for t in (q, k, v, out, dout, lse, dq, dk, dv) for x in (t.shape, t.stride(), t.dtype)),
                q.get_device(), bool(options.is_causal), bool(options.deterministic), sched)
    except (AttributeError, TypeError):  # not tensors, an unsortable schedule: the checks say what
        return None


def plan_backward_hopper(tensors: BackwardTensors, options: HopperBackwardOptions, encode=True,
                         sinks=None) -> list[Step]:
    """The launches that fill dq, dk, dv (see the module docstring); [] when nothing is left to do.
    ``tensors.dlse`` must be None (the Hopper kernels take no LSE gradient). ``sinks``: (the sink
    logits, their gradient to fill), both fp32 (H,), or None: the statistics kernel zeroes the
    gradient and the dQ conversion adds into it (``backward_aux``); deterministic plans take none."""
    if tensors.dlse is not None:
        _fail(ValueError, "dlse", "None (the Hopper backward takes no gradient of the LSE)", "a tensor")
    key = _layout_key(tensors, options)
    layout = _layouts.get(key) if key is not None else None
    if layout is not None and all(a is b for a, b in zip(layout.tables, _tables())):
        return _steps(layout, tensors, options, encode, sinks)
    B, H, H_kv, n_q, n_k, D = _check(tensors)
    q, k, v, out, dout, lse, dq, dk, dv, attn_mask, _ = tensors
    if B * H == 0:
        return []
    if n_q == 0 or n_k == 0:  # no scores: every gradient is zero
        for t in (dq, dk, dv):
            t.zero_()
        return []
    expanded = H_kv == H > 1 and k.stride(1) == 0 and v.stride(1) == 0
    if expanded:
        # K and V expanded over the heads (MQA by ``expand``): run as one key/value head, without a
        # copy. Head 0 of dk/dv gets the group's sum and the others 0, which is what the expand's
        # backward sums to.
        dk[:, 1:].zero_()
        dv[:, 1:].zero_()
        k, v, dk, dv, H_kv = k[:, :1], v[:, :1], dk[:, :1], dv[:, :1], 1
    sched = schedule_for(D, attn_mask is not None, options.schedule)
    block_m = sched["BLOCK_M"]
    if (D, block_m) not in SUPPORTED:
        _fail(ValueError, "schedule BLOCK_M", f"a (head dim, BLOCK_M) pair in {sorted(SUPPORTED)}", (D, block_m))
    q2, dout2, q_order = _same_order(q, dout)
    k2, v2, kv_order = _same_order(k, v)
    geometry = [_tile_map(t, block_m, q_order) for t in (q2, dout2)] + \
               [_tile_map(t, BLOCK_N, kv_order) for t in (k2, v2)]
    if options.deterministic:
        bn = sched["DQ_BLOCK_N"]
        geometry += [_tile_map(t, DQ_BLOCK_M, q_order) for t in (q2, dout2)] + \
                    [_tile_map(t, bn, kv_order) for t in (k2, v2)]
    layout = Layout((B, H, H_kv, n_q, n_k, D), sched, ty.bf16 if q.dtype == torch.bfloat16 else ty.f16,
                    -(-n_q // PAD) * PAD, q_order, kv_order, tuple(geometry), _tables())
    copied = q2 is not q or dout2 is not dout or k2 is not k or v2 is not v
    if key is not None and not (copied or expanded):
        _layouts.put(key, layout)
    return _steps(layout, BackwardTensors(q2, k2, v2, out, dout2, lse, dq, dk, dv, attn_mask), options, encode, sinks)


def _steps(layout: Layout, tensors: BackwardTensors, options: HopperBackwardOptions, encode: bool,
           sinks) -> list[Step]:
    """The launches of one call whose tensors ``layout`` was planned for (q, dout, k, v already in
    its orders): the statistics buffers, the packed masks, the tile maps and the kernels' arguments."""
    B, H, H_kv, n_q, n_k, D = layout.sizes
    q, k, v, out, dout, lse, dq, dk, dv, attn_mask = tensors[:10]
    sched, dtype, n_pad, deterministic = layout.sched, layout.dtype, layout.n_pad, options.deterministic
    masked = attn_mask is not None
    dev = q.device
    delta = torch.empty((B * H, n_pad), dtype=torch.float32, device=dev)
    lse_log2 = torch.empty((B * H, n_pad), dtype=torch.float32, device=dev)
    # the fp32 dQ accumulator; the statistics kernel zeroes it (no fill of its own)
    dq_accum = torch.empty(0 if deterministic else B * H * n_pad * D, dtype=torch.float32, device=dev)
    accum_arg = dq_accum if not deterministic else delta  # a placeholder the kernels never touch
    if sinks is not None and deterministic:
        _fail(ValueError, "sinks", "None with deterministic=True (the sink gradient is summed with atomics)",
              "a (sink logits, dsinks) pair")
    sink_logits, dsinks = sinks if sinks is not None else (delta, delta)  # placeholders without sinks
    i16 = torch.int16
    steps = [Step(attention_bwd_preprocess, (n_pad // (128 // (D // 8)), H, B),
                  (out.view(i16), dout.view(i16), lse, delta, lse_log2, accum_arg, dsinks, n_q, H, n_pad,
                   *out.stride()[:3], *dout.stride()[:3], *lse.stride()),
                  dict(DTYPE=dtype, HEAD_DIM=D, ZERO_ACCUM=not deterministic, SINKS=sinks is not None))]
    no_bits = (placeholder(dev, torch.int32).view(_U32), (0, 0, 0))
    if masked:
        mask_view = mask_and_lse_args(attn_mask, None, B, H, n_q, n_k, dev)[:2]
        shape = MaskShape(B, H, n_q, n_k, n_pad)
        kv_bits = _packed_mask(steps, mask_view, shape, True)
        q_bits = _packed_mask(steps, mask_view, shape, False) if deterministic else no_bits
    else:
        kv_bits = q_bits = no_bits
    maps = [_map(t, *g, encode) for t, g in zip((q, dout, k, v, q, dout, k, v), layout.geometry)]
    tm_q, tm_do, tm_k, tm_v = maps[:4]
    block_m = sched["BLOCK_M"]
    tm_lse, tm_delta = (_stat_map(t, block_m, encode) for t in (lse_log2, delta))
    dq_mode = "none" if deterministic else sched["DQ"]
    # The accumulator as rows of 256 floats, 16 rows per 64x64 sub-tile (one TMA reduce box).
    tm_dq = _map(dq_accum, (256, dq_accum.numel() // 256), (1024,), (256, 16), "f32", 0, encode) \
        if dq_mode == "tma" else tm_lse
    common = (H, H // H_kv, n_pad, float(options.scale), int(options.is_causal))
    orders = dict(Q_ORDER=layout.q_order, KV_ORDER=layout.kv_order)
    steps.append(Step(attention_bwd_sm90, (-(-n_k // BLOCK_N), H_kv, B),
                      (tm_q, tm_k, tm_v, tm_do, tm_lse, tm_delta, tm_dq, dk.view(i16), dv.view(i16), accum_arg,
                       kv_bits[0], n_q, n_k, *common, *dk.stride()[:3], *dv.stride()[:3], *kv_bits[1]),
                      dict(DTYPE=dtype, HEAD_DIM=D, BLOCK_M=block_m, STAGES=sched["STAGES"], HAS_MASK=masked,
                           DQ=dq_mode, DQ_ORDER=sched["DQ_ORDER"], DK_SMEM=sched["DK_SMEM"], **orders)))
    if deterministic:
        tm_q2, tm_do2, tm_k2, tm_v2 = maps[4:]
        steps.append(Step(attention_bwd_dq_sm90, (-(-n_q // DQ_BLOCK_M), H, B),
                          (tm_q2, tm_k2, tm_v2, tm_do2, lse_log2, delta, dq.view(i16), q_bits[0], n_q, n_k, *common,
                           *dq.stride()[:3], *q_bits[1]),
                          dict(DTYPE=dtype, HEAD_DIM=D, BLOCK_N=sched["DQ_BLOCK_N"], STAGES=sched["DQ_STAGES"],
                               HAS_MASK=masked, PIPELINE=sched["DQ_PIPELINE"], **orders)))
    else:
        steps.append(Step(attention_bwd_dq_convert, (n_pad // 64 * (D // 64), H, B),
                          (dq_accum, dq.view(i16), n_q, H, n_pad, float(options.scale), *dq.stride()[:3], delta,
                           lse_log2, sink_logits, dsinks),
                          dict(DTYPE=dtype, HEAD_DIM=D, WIDE=wide_rows(dq), SINKS=sinks is not None)))
    return steps


def supports(q, k, v) -> bool:
    """Whether ``launch_backward_hopper`` takes these inputs (on a Hopper GPU): head dim 64 or 128,
    bf16/fp16, key/value heads dividing the query heads. Strides never matter (copies are made
    where TMA cannot read a view); masks, causal and lengths are all supported."""
    return (q.dim() == k.dim() == v.dim() == 4 and q.shape[-1] in HEAD_DIMS and k.shape[-1] == v.shape[-1] ==
            q.shape[-1] and q.dtype in (torch.bfloat16, torch.float16) and k.dtype == v.dtype == q.dtype and
            k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0 and k.shape[1] == v.shape[1])


def launch_backward_hopper(tensors: BackwardTensors, options: HopperBackwardOptions) -> None:
    """Fill dq, dk, dv on the current stream (no host synchronization; capturable in a CUDA graph)."""
    if not math.isfinite(float(options.scale)):
        _fail(ValueError, "scale", "a finite number", options.scale)
    for step in plan_backward_hopper(tensors, options):
        step.launch()
