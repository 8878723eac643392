"""Host side of the Hopper backward of programmable attention (``backward_variant.py``).

    launch_backward_variant(BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv), dsinks,
                            VariantCall(variant, tensors, scale))

fills dq, dk, dv (and dsinks, fp32 (H,), when the variant has sinks) from the forward's inputs,
output and LSE. The launches are the dense backward's (``plan_backward_hopper``: statistics, the
Boolean mask's bit packing, the dQ conversion) with its dK/dV kernel replaced by the variant's,
which always runs the "serial" dQ order (the transform's registers). The sink gradient is
computed in torch from the LSE, exactly (``sink_grad``); so is a float mask's (``float_mask_grad``,
for the autograd formula).

Sinks: lse_i = log(sum_j e^(s_ij) + e^(sink)) and out_i = sum_j e^(s_ij - lse_i) v_j, so
d out_i / d sink = -out_i e^(sink - lse_i) and, with delta_i = dout_i . out_i,

    d sink_h = -sum_(b, i) e^(sink_h - lse_(b,h,i)) delta_(b,h,i)

(a returned LSE's gradient adds sum_(b,i) e^(sink_h - lse) dlse_(b,h,i)). The kernels' P = e^(s - lse)
already divides by the sink's share, and dS = P (dP - delta) holds as without sinks (the sink has
no value row: its dP is 0).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from tylopy.runtime.plancache import PlanCache, identity_key
from tylopy_kernels.attention.sm90.backward import attention_bwd_sm90
from tylopy_kernels.attention.sm90.backward_aux import attention_bwd_preprocess
from tylopy_kernels.attention.sm90.backward_launch import (BLOCK_N, BackwardTensors, HopperBackwardOptions,
                                                           plan_backward_hopper, supports as dense_supports)
from tylopy_kernels.attention.sm90.backward_variant import HQ_SHIFT, attention_bwd_variant_sm90
from tylopy_kernels.attention.sm90.variant_tiles import alibi_foldable
from tylopy_kernels.attention.common import ForwardTensors, VariantCall, placeholder

BLOCK_SIZE = 128              # the block mask's tile: one key tile of the dK/dV kernel
ALIBI_FOLD_HEAD_DIM = 64      # the dK/dV kernel takes ALiBi folded at this head dim only (at 128 its terms spill)


def supports(q, k, v, variant) -> bool:
    """Whether the kernel takes the call: the dense backward's limits, block masks of 128-tiles, at
    most ``mods.AUX_SLOTS`` tensors read by the mods (aux and captured ones)."""
    from tylopy_kernels.attention.sm90.mods import AUX_SLOTS
    if not dense_supports(q, k, v):
        return False
    if sum(1 for n in variant.tensor_names if n.startswith("aux")) > AUX_SLOTS:
        return False
    return variant.block_mask is None or variant.block_mask[0] == BLOCK_SIZE


class WorkShape(NamedTuple):
    """The sizes a block mask's work list covers: batch, query heads, key/value heads, queries, keys."""

    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int


def work_list(variant, tensors, shape: WorkShape, block_m):
    """(work int32 (B, H_kv, key tiles, entries), count int32 (B, H_kv, key tiles)): per key tile, the
    (query head, query tile of ``block_m`` rows, full) triples the block mask lists, query heads of
    the group one after another and tiles ascending, as ``(h << 16) | (tile << 1) | full``."""
    from tylopy_kernels.attention.block_mask import BlockMask, _tile_flags
    B, H, H_kv, n_q, n_k = shape
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
    device = tensors[variant.index(names[0])].device
    bm = BlockMask(None, 0, 0, n_q, n_k, BLOCK_SIZE, *(tensors[variant.index(n)] for n in names))
    full, partial = _tile_flags(bm)                     # (B|1, H|1, Q tiles, K tiles)
    full = full.expand(B, H, *full.shape[2:])
    listed = (full | partial.expand(B, H, *partial.shape[2:]))
    sub = BLOCK_SIZE // block_m                          # query tiles of the kernel per mask tile
    qt, kt = listed.shape[2], listed.shape[3]
    n_m = -(-n_q // block_m)
    G = H // H_kv
    # (B, H_kv, K tiles, G, Q tiles * sub): the kernel's query tiles, in the order it walks them
    rows = torch.arange(qt * sub, device=device)
    in_range = (rows < n_m).view(1, 1, 1, 1, -1)
    lst = listed.repeat_interleave(sub, dim=2).view(B, H_kv, G, qt * sub, kt).permute(0, 1, 4, 2, 3)
    ful = full.repeat_interleave(sub, dim=2).view(B, H_kv, G, qt * sub, kt).permute(0, 1, 4, 2, 3)
    lst = lst & in_range
    heads = (torch.arange(H_kv, device=device).view(1, H_kv, 1, 1, 1) * G +
             torch.arange(G, device=device).view(1, 1, 1, G, 1))
    entry = (heads << HQ_SHIFT) | (rows.view(1, 1, 1, 1, -1) << 1) | ful.long()
    entry = entry.expand(B, H_kv, kt, G, qt * sub).reshape(B, H_kv, kt, -1)
    lst = lst.reshape(B, H_kv, kt, -1)
    order = torch.argsort((~lst).to(torch.int8), dim=-1, stable=True)  # listed first, in order
    work = torch.gather(entry, -1, order).to(torch.int32).contiguous()
    count = lst.sum(-1).to(torch.int32).contiguous()
    assert kt == -(-n_k // BLOCK_N)
    return work, count


_work_lists = PlanCache("variant backward work lists", capacity=64)
_LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")


def kept_work_list(variant, tensors, shape: WorkShape, block_m):
    """``work_list``, kept per block mask: a training step's layers and steps pass the same mask
    tensors, and the list is some twenty small device ops. Keyed by the tensors' identity and version
    (``identity_key``; the entry holds them) and the sizes."""
    lists = tuple(tensors[variant.index(n)] for n in _LISTS)
    if torch.compiler.is_compiling() or (lists[0].device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return work_list(variant, tensors, shape, block_m)
    key = (identity_key(lists), tuple(shape), block_m)
    hit = _work_lists.get_held(key, lists)
    if hit is not None:
        return hit
    made = work_list(variant, tensors, shape, block_m)
    _work_lists.put_held(key, made, lists)
    return made


def dq_order(variant, head_dim, n_q, n_k, score_mod_bwd=None) -> str:
    """The dQ order of the variant's dK/dV kernel, chosen where ptxas assembles it without spills.
    "early" (the dense kernel's: dQ = dS K issued between the dV and dK products, its reduction
    overlapping dK) for causal masks, sinks, softcap (at D = 64 with a causal mask only: without it
    the early order spills 8 bytes; at D = 128 softcap spills 52-56 bytes in either order), D = 64
    windows, and D = 64 ALiBi that folds into a per-column bias (``alibi_foldable``, without
    softcap: one FADD per score). "serial" (dQ once dV and dK are done, the fewest live registers)
    where the element work holds more: ALiBi that does not fold, float masks, mask_mod, user
    score_mods and, at D = 128, windows (16 bytes of spills with "early", none serial)."""
    folded = (head_dim == ALIBI_FOLD_HEAD_DIM and not variant.softcap  # (``backward_variant.alibi_folded``)
              and alibi_foldable(variant, n_q, n_k))
    heavy = ((variant.alibi and not folded) or variant.attn_mask == "float" or variant.mask_mod is not None
             or variant.score_mod is not None or score_mod_bwd is not None)
    if heavy or (head_dim == 64 and variant.softcap and not variant.causal):
        return "serial"
    if head_dim == 128 and variant.window != (-1, -1):
        return "serial"
    return "early"


def fused_sinks(call: VariantCall, dsinks):
    """(sink logits, dsinks) where the dQ conversion can add the sink gradient into ``dsinks``
    itself (both fp32, contiguous, one per head), else None."""
    variant, tensors, _ = call
    if not variant.sinks or dsinks is None:
        return None
    sinks = tensors[variant.index("sinks")]
    ok = all(t.dtype == torch.float32 and t.dim() == 1 and t.stride(0) == 1 and t.device == dsinks.device
             for t in (sinks, dsinks)) and sinks.shape == dsinks.shape
    return (sinks, dsinks) if ok else None


def plan_backward_variant(io: BackwardTensors, call: VariantCall, *, schedule=None, score_mod_bwd=None, encode=True,
                          dsinks=None):
    """The launches (``backward_launch.Step``) that fill ``io``'s dq, dk, dv (its attn_mask and dlse
    stay None: the mask travels in ``call``) and, where ``fused_sinks`` allows, ``dsinks``."""
    q, k, v, out, dout, lse, dq, dk, dv = io[:9]
    variant, tensors, scale = call
    bool_mask = tensors[variant.index("attn_mask")] if variant.attn_mask == "bool" else None
    sched = dict(schedule or {})
    if bool_mask is None:  # (with a mask the dense plan's MASKED_SCHEDULE already says "serial")
        sched.setdefault("DQ_ORDER", dq_order(variant, q.shape[-1], q.shape[2], k.shape[2], score_mod_bwd))
    steps = plan_backward_hopper(BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv, bool_mask),
                                 HopperBackwardOptions(scale, schedule=sched), encode=encode,
                                 sinks=fused_sinks(call, dsinks))
    for n, step in enumerate(steps):
        if step.kernel is attention_bwd_sm90:
            steps[n] = _variant_step(step, q, variant, tensors, score_mod_bwd)
    return steps


def _variant_step(step, q, variant, tensors, score_mod_bwd):
    from tylopy_kernels.attention.sm90.backward_launch import Step
    from tylopy_kernels.attention.sm90.variant_launch import variant_args
    from tylopy_kernels.attention.sm90.variant_tiles import KernelVariant
    a = step.args
    head, bits = a[:10], a[10]
    n_q, n_k, H, group, n_pad, scale, _causal = a[11:18]
    dk_s, dv_s, mb_s = a[18:21], a[21:24], a[24:27]
    B = q.shape[0]
    H_kv = H // group
    dev = q.device
    i32 = placeholder(dev, torch.int32)
    work, count, work_stride = i32, i32, 0
    n_kv_tiles = -(-n_k // BLOCK_N)
    if variant.block_mask is not None:
        work, count = kept_work_list(variant, tensors, WorkShape(B, H, H_kv, n_q, n_k), step.constexprs["BLOCK_M"])
        work_stride = work.shape[-1]
    tensor_args, meta = variant_args(variant, tensors, B, H, n_q, n_k, dev)
    left, right = variant.window
    cx = dict(step.constexprs)
    kvar = KernelVariant.of(variant, meta, n_q=n_q, n_k=n_k, fold_alibi=cx["HEAD_DIM"] == ALIBI_FOLD_HEAD_DIM)
    cx.update(VARIANT=kvar, SCORE_MOD_BWD=score_mod_bwd)
    args = (*head, bits, work, count, n_q, n_k, H, group, n_pad, scale, work_stride, n_kv_tiles, H_kv, *dk_s, *dv_s,
            *mb_s, variant.diag(n_q, n_k), left, right, float(variant.softcap or 1.0), *tensor_args)
    return Step(attention_bwd_variant_sm90, step.grid, args, cx)


def sink_grad(dout, out, lse, sinks, dlse=None, delta=None):
    """fp32 (H,): d sink_h = sum_(b,i) e^(sink_h - lse) (dlse - delta), delta = dout . out (module text);
    ``delta``: (B, H, N) fp32 where the backward's statistics kernel already summed it."""
    if delta is None:
        delta = (dout.float() * out.float()).sum(-1)
    if dlse is not None:
        delta = delta - dlse.float()
    share = torch.exp(sinks.float().view(1, -1, 1) - lse.float())
    return -(share * delta).sum(dim=(0, 2))


def float_mask_grad(forward: ForwardTensors, dout, call: VariantCall, dlse=None):
    """fp32 (B, H, N, N_k): d loss / d attn_mask = P (dP - delta), the logits' gradient (the mask is
    added after the score transform, with derivative 1), recomputed in torch from the LSE.
    ``forward``: the forward's q, k, v, out and lse."""
    from tylopy_kernels.attention import variants as V
    q, k, v, out, lse, _ = forward
    variant, tensors, scale = call
    H, n_q, n_k = q.shape[1], q.shape[2], k.shape[2]
    kf = k.float().repeat_interleave(H // k.shape[1], dim=1)
    vf = v.float().repeat_interleave(H // v.shape[1], dim=1)
    s = V.transformed_scores(variant, (q.float() @ kf.transpose(-1, -2)) * scale, tensors, n_q, n_k)
    lse = lse.float()
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), float("inf")).unsqueeze(-1))
    dp = dout.float() @ vf.transpose(-1, -2)
    delta = (dout.float() * out.float()).sum(-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse.float().unsqueeze(-1)
    return p * (dp - delta)


def launch_backward_variant(io: BackwardTensors, dsinks, call: VariantCall, *, schedule=None, score_mod_bwd=None,
                            emulate=False):
    """Fill ``io``'s dq, dk, dv and (sinks) ``dsinks`` on the current stream (``emulate``: run the same
    steps in the emulator, with tensor-map specs, on CPU tensors)."""
    steps = plan_backward_variant(io, call, schedule=schedule, score_mod_bwd=score_mod_bwd, encode=not emulate,
                                  dsinks=dsinks)
    for step in steps:
        step.emulate() if emulate else step.launch()
    variant, tensors, _ = call
    if variant.sinks and not (steps and steps[-1].constexprs.get("SINKS")):  # else the conversion added it
        delta = None
        if steps and steps[0].kernel is attention_bwd_preprocess:
            # the statistics kernel's delta rows (B * H, padded N): no second pass over dO and O in fp32
            B, H, n_q = io.q.shape[:3]
            delta = steps[0].args[3].view(B, H, -1)[:, :, :n_q]
        dsinks.copy_(sink_grad(io.dout, io.out, io.lse, tensors[variant.index("sinks")], delta=delta))
