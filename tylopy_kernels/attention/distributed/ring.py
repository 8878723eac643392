"""Context-parallel (ring) attention over a ``torch.distributed`` process group.

    import tylopy
    out = tylopy.distributed.ring_attention(q, k, v, is_causal=True)      # q, k, v: this rank's shard

Each of the W ranks of ``group`` holds a shard of the sequence: q, k, v are (B, H, N_local, D)
tensors (SDPA's layout, as ``tylopy.attention``; K/V may have fewer heads with ``enable_gqa``).
The output is this rank's shard of ``softmax(scale q k^T) v`` over the *whole* sequence. With no
process group (``group=None`` and ``torch.distributed`` not initialized) W = 1 and it is plain
attention; the same code runs from one process to N GPUs launched with ``torchrun``.

The ring. At step t = 0 .. W-1 rank r holds the K/V shard of rank s = (r - t) mod W. At the start
of each step but the last it sends that shard to rank r + 1 and receives the next one from rank
r - 1 (a functional collective, ``permute_tensor``: NCCL runs the transfer on its own stream,
which overlaps the attention of step t that runs meanwhile on the current stream; the wait at
the end of the step only makes the current stream wait). Functional collectives are what
``torch.compile`` traces: ``ring_attention`` compiles into one graph without breaks. Each step's attention (``tylopy.attention`` with
``return_lse=True``) gives a partial (O_t, LSE_t) for some of the local query rows; partials are
merged in fp32 with the log-sum-exp, which is ``softmax_merge`` of the summaries (m = LSE, l = 1):

    LSE = logaddexp(LSE_acc, LSE_t),   O = O_acc + sigmoid(LSE_t - LSE_acc) (O_t - O_acc)

(a row that has seen no key yet has LSE_acc = -inf and takes O_t whole; a partial with LSE_t =
-inf changes nothing).

Shards and causal masking. The sequence is cut into chunks of equal length.

* Contiguous (``load_balance=False``, or not causal): rank r holds chunk r. The K/V chunk s is
  visible in full to the local queries if s < r, causally (key j visible to query i iff j <= i,
  positions within the chunk: ``tylopy.attention(is_causal=True)``) if s == r, and not at all if
  s > r (skipped). Under causal masking rank W-1 does W steps of work and rank 0 one.
* Zig-zag (``load_balance=True`` with ``is_causal``): 2W chunks of c = N / (2W) tokens; rank r
  holds chunks r and 2W-1-r, concatenated in that order (``shard_sequence`` builds it). For the
  local query halves (early chunk r, late chunk 2W-1-r) and the K/V of rank s (chunks s, 2W-1-s):
  - s == r: causal attention of the local 2c queries on the local 2c keys. Top-left causal on the
    concatenation is exact: the early queries see only the early keys (causally), the late
    queries see all early keys (chunk r < 2W-1-r) and the late keys causally.
  - s < r: chunk s precedes both local chunks and chunk 2W-1-s follows both (2W-1-s > 2W-1-r):
    all 2c local queries attend to the first half of the K/V shard (c keys), no mask.
  - s > r: chunk s follows chunk r but precedes chunk 2W-1-r (s <= W-1 < 2W-1-r), and chunk
    2W-1-s >= W > r also lies between them: the early queries see nothing, the late c queries
    attend to all 2c keys of the shard, no mask.
  Every step after the first costs 2c^2 scores on every rank: the work is balanced.

Each step runs tylopy's attention operators (``autograd.py``): ``tylopy::attention_fwd`` for the
forward and ``tylopy::attention_bwd`` for the backward, i.e. the Hopper kernels for D in {64, 128}
on sm_90 and the portable ones elsewhere; off CUDA the operators compute a reference in the
inputs' dtype, so the whole ring also runs on CPU tensors (float64 in the tests).

Backward (``torch.autograd``): the forward saves the global (merged) output and LSE; the backward
walks the ring again: each step computes the pair's dQ, dK, dV with the global LSE and delta =
rowsum(dO O) (so the partial gradients simply add), dQ accumulates locally in fp32, and the fp32
dK/dV accumulators travel around the ring with their K/V shard (sent on after each step, so the
transfer overlaps the next step's kernels), arriving back at their owner after W exchanges. The
LSE output is not differentiable (its gradient is dropped).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from tylopy_kernels.attention.common import rejecter

__all__ = ["ring_attention", "shard_sequence", "unshard_sequence", "RingSteps", "ring_forward", "ring_backward",
           "TorchRing", "ring_of"]


_fail = rejecter("ring_attention")


# -- shards -------------------------------------------------------------------------------------------

def shard_sequence(x, rank: int, world: int, load_balance: bool = True, dim: int = 2):
    """Rank ``rank``'s shard of the full sequence ``x`` (along ``dim``): chunk ``rank`` of ``world``,
    or with ``load_balance`` chunks rank and 2 world - 1 - rank of 2 world, concatenated."""
    n = x.shape[dim]
    parts = 2 * world if load_balance else world
    if n % parts:
        _fail(ValueError, "sequence length", f"a multiple of {parts} ({world} ranks"
              f"{', zig-zag' if load_balance else ''})", n)
    c = n // parts
    if not load_balance:
        return x.narrow(dim, rank * c, c)
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (2 * world - 1 - rank) * c, c)], dim=dim)


def unshard_sequence(shards, load_balance: bool = True, dim: int = 2):
    """The full sequence from every rank's shard (the inverse of ``shard_sequence``)."""
    if not load_balance:
        return torch.cat(list(shards), dim=dim)
    halves = [s.chunk(2, dim=dim) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=dim)


# -- the ring -----------------------------------------------------------------------------------------------

class _Received:
    """Tensors arriving through a functional collective: ``wait()`` hands them over once the
    transfer is done (eager: the current stream waits for it, not the host; traced: the graph's
    wait_tensor, which the compiler may move later to overlap the transfer)."""

    def __init__(self, flat, shapes):
        self._flat, self._shapes = flat, shapes

    def wait(self):
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
        return [(t.wait() if isinstance(t, AsyncCollectiveTensor) else t).view(shape)
                for t, shape in zip(self._flat, self._shapes)]


class _Done:
    def __init__(self, tensors):
        self._tensors = tensors

    def wait(self):
        return self._tensors


class SingleRank:
    """World size 1: the ring is one rank; an exchange hands the tensors back."""

    rank, world = 0, 1

    def exchange(self, tensors):
        return _Done(list(tensors))


class TorchRing:
    """Neighbours in a ``torch.distributed`` group: send to rank + 1, receive from rank - 1, through
    the functional collectives (an ``all_to_all_single`` in which each rank sends its whole,
    flattened tensor to one peer and receives one from another), so ``torch.compile`` traces the
    ring into one graph."""

    def __init__(self, group=None):
        import torch.distributed as dist
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.next = (self.rank + 1) % self.world
        self.prev = (self.rank - 1) % self.world

    def _shift(self, t):
        from torch.distributed._functional_collectives import all_to_all_single
        send, recv = [0] * self.world, [0] * self.world
        send[self.next] = recv[self.prev] = t.numel()
        return all_to_all_single(t.contiguous().view(-1), recv, send, self.group)

    def exchange(self, tensors):
        return _Received([self._shift(t) for t in tensors], [t.shape for t in tensors])


def ring_of(group=None):
    """The ring of ``group``; world size 1 when torch.distributed is not initialized."""
    try:
        import torch.distributed as dist
        initialized = dist.is_available() and dist.is_initialized()
    except ImportError:
        initialized = False
    if not initialized:
        if group is not None:
            _fail(ValueError, "group", "None when torch.distributed is not initialized", group)
        return SingleRank()
    ring = TorchRing(group)
    return SingleRank() if ring.world == 1 else ring


# -- which local rows attend to which part of the visiting K/V ------------------------------------------------

def step_pairs(rank: int, src: int, n_local: int, is_causal: bool, zigzag: bool):
    """[(query rows slice, key rows slice, causal)] of the local shard against the K/V shard of ``src``."""
    full = slice(0, n_local)
    if not is_causal:
        return [(full, full, False)]
    if src == rank:
        return [(full, full, True)]
    if not zigzag:
        return [(full, full, False)] if src < rank else []
    c = n_local // 2
    if src < rank:
        return [(full, slice(0, c), False)]
    return [(slice(c, n_local), full, False)]


# -- forward ------------------------------------------------------------------------------------------------------

def _acc_dtype(t):
    """fp32 accumulators for 16-bit inputs (float64 inputs, as in the CPU tests, keep float64)."""
    return torch.promote_types(t.dtype, torch.float32)


def merge_partial(acc_o, acc_lse, o, lse):
    """In place on fp32 (O, LSE) rows: the LSE-weighted combination with the partial (o, lse)."""
    w = torch.sigmoid(lse - acc_lse).nan_to_num_(0.0)  # NaN only where both are -inf: keep the empty row
    acc_o.lerp_(o.to(acc_o.dtype), w.unsqueeze(-1))
    acc_lse.copy_(torch.logaddexp(acc_lse, lse))


class RingSteps(NamedTuple):
    """What every step of a ring pass shares: the ring (``rank``, ``world``, ``exchange``), SDPA's
    global ``is_causal``, the ``scale`` and ``zigzag`` (each rank holds two load-balanced chunks)."""

    ring: object
    is_causal: bool
    scale: float
    zigzag: bool


def ring_forward(q, k, v, steps: RingSteps, attend):
    """(out in q's dtype, lse fp32 (B, H, N_local)); ``attend(q, k, v, causal, scale) -> (o, lse)``."""
    ring, is_causal, scale, zigzag = steps
    n_local = q.shape[2]
    acc_o = acc_lse = None
    kv = (k, v)
    for t in range(ring.world):
        pending = ring.exchange(kv) if t < ring.world - 1 else None
        src = (ring.rank - t) % ring.world
        for rows, cols, causal in step_pairs(ring.rank, src, n_local, is_causal, zigzag):
            o, lse = attend(q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], causal, scale)
            if acc_o is None:  # step 0 covers every row (a query always sees its own position)
                acc_o, acc_lse = o.to(_acc_dtype(q)), lse.to(_acc_dtype(q))
            else:
                merge_partial(acc_o[:, :, rows], acc_lse[:, :, rows], o, lse)
        if pending is not None:
            kv = tuple(pending.wait())
    return acc_o.to(q.dtype), acc_lse


def ring_backward(q, k, v, out, dout, lse, steps: RingSteps, attend_backward):
    """(dq, dk, dv) in the inputs' dtypes; ``attend_backward(q, k, v, out, dout, lse, causal, scale)``
    returns one pair's (dq, dk, dv) computed with the global ``out`` and ``lse``."""
    ring, is_causal, scale, zigzag = steps
    n_local = q.shape[2]
    acc_dtype = _acc_dtype(q)
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    kv = (k, v)
    travelling = None
    for t in range(ring.world):
        pending_kv = ring.exchange(kv) if t < ring.world - 1 else None
        src = (ring.rank - t) % ring.world
        dk = torch.zeros(k.shape, dtype=acc_dtype, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc_dtype, device=v.device)
        for rows, cols, causal in step_pairs(ring.rank, src, n_local, is_causal, zigzag):
            gq, gk, gv = attend_backward(q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], out[:, :, rows],
                                         dout[:, :, rows], lse[:, :, rows].contiguous(), causal, scale)
            dq[:, :, rows] += gq
            dk[:, :, cols] += gk
            dv[:, :, cols] += gv
        if travelling is not None:  # the accumulators of src's K/V, sent on by rank - 1 after its step t - 1
            acc = travelling.wait()
            dk += acc[0]
            dv += acc[1]
        travelling = ring.exchange((dk, dv))
        if pending_kv is not None:
            kv = tuple(pending_kv.wait())
    dk, dv = travelling.wait()  # after W exchanges the accumulators of this rank's K/V are back
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# -- the kernels behind each step ------------------------------------------------------------------------------------

def tylopy_attend(q, k, v, causal, scale):
    """One pair's (out, lse): the ``tylopy::attention_fwd`` operator (the kernels on CUDA, a
    reference in the inputs' dtype elsewhere); K/V may have fewer heads (GQA)."""
    from tylopy_kernels.attention.autograd import attention_fwd
    return attention_fwd(q, k, v, None, causal, float(scale), True)


def tylopy_attend_backward(q, k, v, out, dout, lse, causal, scale):
    """One pair's (dq, dk, dv) from the global out and lse: the ``tylopy::attention_bwd`` operator
    (Hopper's backward for D 64/128 on sm_90, the portable one elsewhere, a reference off CUDA)."""
    from tylopy_kernels.attention.autograd import attention_bwd
    return attention_bwd(dout.contiguous(), q, k, v, out, lse, None, None, causal, float(scale))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, steps):
        out, lse = ring_forward(q, k, v, steps, tylopy_attend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.steps = steps
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, out, dout, lse, ctx.steps, tylopy_attend_backward)
        return dq, dk, dv, None


def check_ring_inputs(q, k, v, is_causal, scale, load_balance, enable_gqa, world):
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _fail(ValueError, name, "a 4-D (batch, heads, local seq, head_dim) tensor",
                  getattr(t, "shape", type(t).__name__))
    if not isinstance(is_causal, bool) or not isinstance(load_balance, bool) or not isinstance(enable_gqa, bool):
        _fail(TypeError, "is_causal/load_balance/enable_gqa", "bools", (is_causal, load_balance, enable_gqa))
    n = q.shape[2]
    if k.shape[2] != n or v.shape[2] != n:
        _fail(ValueError, "key/value local length", f"the query's ({n}): every rank holds the same positions of "
              "q, k and v", f"{k.shape[2]} and {v.shape[2]}")
    if is_causal and load_balance and world > 1 and n % 2:
        _fail(ValueError, "local length", "an even number (two zig-zag chunks per rank)", n)
    if not enable_gqa and (k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]):
        _fail(ValueError, "key/value heads", f"{q.shape[1]} (or enable_gqa=True for fewer)",
              f"{k.shape[1]} and {v.shape[1]}")
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(float(scale)):
        _fail(TypeError, "scale", "a finite float or None", repr(scale))
    return float(scale)


def ring_attention(q, k, v, group=None, is_causal=False, scale=None, load_balance=True, enable_gqa=False,
                   return_lse=False):
    """This rank's shard of attention over the whole sequence (see the module docstring); with
    ``return_lse`` also the fp32 LSE (B, H, N_local). ``load_balance`` (causal only) means the
    shards are in zig-zag order (``shard_sequence``)."""
    ring = ring_of(group)
    scale = check_ring_inputs(q, k, v, is_causal, scale, load_balance, enable_gqa, ring.world)
    if q.device.type == "cuda":  # what the kernels accept (dtype, head dim, heads, devices), on the local shard
        from tylopy_kernels.attention.checks import check_inputs
        check_inputs(q, k, v, None, False, scale, enable_gqa)
    zigzag = load_balance and is_causal and ring.world > 1
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        out, lse = _RingAttention.apply(q, k, v, RingSteps(ring, is_causal, scale, zigzag))
    else:
        out, lse = ring_forward(q, k, v, RingSteps(ring, is_causal, scale, zigzag), tylopy_attend)
    return (out, lse) if return_lse else out
