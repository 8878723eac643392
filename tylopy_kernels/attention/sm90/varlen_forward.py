"""The warp-specialized Hopper attention forward over packed variable-length batches.

The same producer and consumers as ``forward.py`` (``attention_fwd_sm90``), over Q, K, V as
(total, H, D) tensors mapped as one batch entry; the problem carries a ``varlen_tiles.Varlen``,
so each work tile (query block, head, document) reads its document's first rows and lengths
from cu_seqlens (and seqused) on the device, TMA-loads from those rows, masks keys past the
document's end and the causal future relative to the document's bottom-right corner, zeroes V
rows past the end, and stores only the document's rows of O and LSE. Nothing is read on the host.

A separate kernel (not a constexpr of the dense one) so the dense kernel's parameters, and so its
PTX, stay what they are. TMA stores and the deferred epilogue are off here: a TMA box clips at
the tensor's end, not at a document's.
"""
import tylopy as ty

from tylopy_kernels.attention.sm90.consumer import consumer
from tylopy_kernels.attention.sm90.forward import _threads, init_barriers, producer
from tylopy_kernels.attention.sm90.tiles import REGISTER_SPLIT, Output, Plan, Problem, Schedule, Sizes
from tylopy_kernels.attention.sm90.varlen_tiles import Varlen
from tylopy import hopper


@ty.kernel(threads=_threads, min_blocks_per_sm=1, noalias=True)
def attention_varlen_fwd_sm90(
    tm_q: ty.tensormap, tm_k: ty.tensormap, tm_v: ty.tensormap,
    out: ty.ptr(ty.i16), lse_ptr: ty.ptr(ty.f32), cu_q: ty.ptr(ty.i32), cu_k: ty.ptr(ty.i32),
    used_q: ty.ptr(ty.i32), used_k: ty.ptr(ty.i32),
    max_q: ty.i32, max_k: ty.i32, n_heads: ty.i32, n_docs: ty.i32, kv_group: ty.i32, total_q: ty.i32,
    head_group_log2: ty.i32, scale: ty.f32, causal: ty.i32, o_stride_h: ty.i64, o_stride_n: ty.i64,
    DTYPE: ty.constexpr = ty.bf16, HEAD_DIM: ty.constexpr = 64, BLOCK_N: ty.constexpr = 128,
    STAGES: ty.constexpr = 2, CONSUMERS: ty.constexpr = 3, RETURN_LSE: ty.constexpr = False,
    COORD_ORDER: ty.constexpr = ("h", "n", "b"), PERSISTENT: ty.constexpr = False, ORDER: ty.constexpr = "heads",
    EXPONENT: ty.constexpr = "ffma", RESCALE_THRESHOLD: ty.constexpr = 8.0, SPLIT_S: ty.constexpr = False,
    PV_WAIT: ty.constexpr = "pinned", POLY_EXP2: ty.constexpr = 0, EARLY_SUMS: ty.constexpr = True,
    SEQUSED_Q: ty.constexpr = False, SEQUSED_K: ty.constexpr = False,
):
    """Work tiles (query block, head, document) over a grid of (query blocks of max_q, heads,
    documents), or a persistent loop over them. Q, K, V come as tensor maps over (D, then the
    packed rows and heads in ``COORD_ORDER``, one batch entry); out and lse (H, total_q) are
    written for the rows of each document only (the launcher zeroes out and fills lse with -inf)."""
    plan = Plan(HEAD_DIM, BLOCK_N, STAGES, CONSUMERS, False)
    sched = Schedule(DTYPE, return_lse=RETURN_LSE, persistent=PERSISTENT, tile_order=ORDER, coord_order=COORD_ORDER,
                     exponent=EXPONENT, threshold=RESCALE_THRESHOLD, split_s=SPLIT_S, pv_wait=PV_WAIT, poly=POLY_EXP2,
                     early_sums=EARLY_SUMS)
    smem = ty.dynamic_shared(ty.u8, plan.total, align=1024)
    prob = Problem(Sizes(max_q, max_k, n_heads, n_docs, kv_group, 0, head_group_log2), scale, causal,
                   Output(out, lse_ptr, tm_q, (0, o_stride_h, o_stride_n)), (out, (0, 0, 0, 0)), plan.block_m, BLOCK_N)
    prob.varlen = Varlen(cu_q, cu_k, used_q if SEQUSED_Q else None, used_k if SEQUSED_K else None, total_q,
                         max_q, max_k)
    init_barriers(smem, plan)
    wg = ty.warpgroup_idx()
    if wg == 0:
        producer(smem, plan, prob, sched, tm_q, tm_k, tm_v)
    else:
        hopper.setmaxnreg(REGISTER_SPLIT[CONSUMERS][1], increase=True)
        consumer(smem, plan, prob, sched, wg)
