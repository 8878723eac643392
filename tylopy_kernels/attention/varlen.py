"""``attention_varlen``: attention over packed batches of variable-length sequences.

    out = tylopy.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  is_causal=False, scale=None, enable_gqa=False)

as ``flash_attn_varlen_func``: q is (total_q, H, D), k and v (total_k, H_kv, D), bf16 or fp16
with a contiguous last dim; sequence b holds query rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1]
and key rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] (int32 prefix sums of B + 1 entries, the
same B for both, starting at 0); max_seqlen_q/k bound every sequence's length (the grid is
sized by them, so a longer sequence would be cut short). cu_seqlens may also be Python lists or
CPU tensors: the host then checks them before launching (start at 0, non-decreasing, last entry
at most the tensor's rows, no sequence longer than max_seqlen) and copies them over. CUDA
cu_seqlens are not read by the host (that would wait for the GPU): they are repaired on the
device (clamped to the rows, made non-decreasing), so a kernel never indexes outside q, k or v,
and ``cu_seqlens_status()`` counts the calls whose sums needed it. Sequences may be empty (their output
rows do not exist; queries whose sequence has no keys get zeros and LSE -inf) or of length 1.
``is_causal`` aligns the diagonal to the bottom-right corner of each sequence, as flash-attn
does: key j takes part for query i when j <= i + n_k - n_q (the usual mask when n_q == n_k).
With ``enable_gqa=True`` H_kv may divide H. ``return_lse=True`` adds the LSE as (H, total_q),
fp32. Rows past cu_seqlens_q[-1] get zeros (and LSE -inf), their gradients zeros.

On Hopper (sm_90) with D = 64 or 128 the forward runs the warp-specialized kernel
(``sm90/varlen_forward.py``: TMA from each sequence's first row, keys past its end masked, V rows
past it zeroed in shared memory); it also takes ``seqused_q``/``seqused_k`` (int32 (B,): only
the first seqused[b] tokens of sequence b count, FlashAttention 3's meaning; without gradients).
Elsewhere, and for the backward, the portable kernels (``portable/forward.py``, ``portable/backward.py``)
index each sequence by its offsets on a grid of (query blocks, heads, sequences), every CTA past
its sequence's end returning at once. Prefix sums on the host (a CPU tensor) are checked there
and copied to the device; on the device they are never read by the host (lengths are clamped
to [0, max_seqlen] in the kernel). It is differentiable (``tylopy::attention_varlen_fwd``,
``autograd.py``) and traceable by ``torch.compile``. This module holds the checks and the CUDA
implementations; the entry point is ``tylopy_kernels.attention.attention_varlen``. With the
variant keywords (window_size, softcap, alibi_slopes, sinks, score_mod, mask_mod, aux,
score_mod_bwd, causal_align) a call runs the variant kernels per document instead
(``varlen_variants.py``).
"""
from __future__ import annotations

import functools
import math

import torch

from tylopy.runtime.plancache import PlanCache

from tylopy_kernels.attention.checks import _fail
from tylopy_kernels.attention.dispatch import _nonpositive_scale
from tylopy_kernels.attention.common import ForwardTensors, PackedDocs, check_token_tensor

HEAD_DIMS = (16, 32, 64, 128)


def check_varlen(q, k, v, docs: PackedDocs, is_causal, scale, enable_gqa):
    """Validate (``docs`` as the caller passed them: cu_seqlens may be lists); returns the resolved scale."""
    cu_q, cu_k, max_q, max_k = docs[:4]
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_token_tensor(_fail, name, t, 3, "(total_tokens, heads, head_dim)")
        if t.device != q.device:
            _fail(ValueError, name, f"the query's device {q.device}", t.device)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        _fail(TypeError, "k/v", f"the query's dtype {q.dtype}", f"{k.dtype} and {v.dtype}")
    _, H, D = q.shape
    if k.shape != v.shape:
        _fail(ValueError, "v", f"the shape of k {tuple(k.shape)}", tuple(v.shape))
    if k.shape[2] != D:
        _fail(ValueError, "k/v head_dim", D, k.shape[2])
    if D not in HEAD_DIMS:
        _fail(ValueError, "q head_dim", "16, 32, 64 or 128", D)
    h_kv = k.shape[1]
    if not isinstance(enable_gqa, bool):
        _fail(TypeError, "enable_gqa", "a bool", type(enable_gqa).__name__)
    if enable_gqa and (h_kv == 0 or H % h_kv):
        _fail(ValueError, "k/v heads", f"a count that divides the {H} query heads (enable_gqa=True)", h_kv)
    if not enable_gqa and h_kv != H:
        _fail(ValueError, "k/v heads", f"{H} (or enable_gqa=True for fewer)", h_kv)
    cu_q, cu_k = _as_cu_tensor("cu_seqlens_q", cu_q), _as_cu_tensor("cu_seqlens_k", cu_k)
    for name, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] < 1:
            _fail(TypeError, name, "a 1-D torch.int32 tensor (or a list of ints) of batch + 1 prefix sums",
                  f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}")
        if t.device != q.device and t.device.type != "cpu":
            _fail(ValueError, name, f"the query's device {q.device} (or the CPU)", t.device)
    if cu_q.shape[0] != cu_k.shape[0]:
        _fail(ValueError, "cu_seqlens_k", f"as many entries as cu_seqlens_q ({cu_q.shape[0]})", cu_k.shape[0])
    if cu_q.shape[0] - 1 > 65535:
        _fail(ValueError, "cu_seqlens_q", "at most 65535 sequences (a grid dimension)", cu_q.shape[0] - 1)
    for name, n in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            _fail(TypeError, name, "a non-negative int", repr(n))
    for name, t, total, max_name, max_len in (("cu_seqlens_q", cu_q, q.shape[0], "max_seqlen_q", max_q),
                                              ("cu_seqlens_k", cu_k, k.shape[0], "max_seqlen_k", max_k)):
        if t.device.type == "cpu" and not torch.compiler.is_compiling():  # the host has the values (a trace
            # does not: its graph takes them as inputs): check them without waiting for a GPU
            check_prefix_sums(name, t, total, max_name, max_len)
    if not isinstance(is_causal, bool):
        _fail(TypeError, "is_causal", "a bool", type(is_causal).__name__)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        _fail(TypeError, "scale", "a float or None", type(scale).__name__)
    elif not (abs(scale) <= 1.7976931348623157e308 if isinstance(scale, int) else math.isfinite(scale)):
        _fail(ValueError, "scale", "a finite number", scale if len(str(scale)) < 40 else "an int beyond the float range")
    if q.device.type not in ("cuda", "meta"):  # last: bad input fails the same way without a GPU
        _fail(ValueError, "q", "a CUDA tensor", f"a tensor on {q.device}")
    return float(scale)


def _as_cu_tensor(name, cu):
    """A list or tuple of ints as a CPU int32 tensor (checked like one); anything else unchanged."""
    if isinstance(cu, (list, tuple)):
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in cu):
            _fail(TypeError, name, "a list of ints", f"{[type(x).__name__ for x in cu][:4]}")
        if any(not -2**31 <= x < 2**31 for x in cu):
            _fail(ValueError, name, "int32 values", f"{[x for x in cu if not -2**31 <= x < 2**31][:3]}")
        return torch.tensor(cu, dtype=torch.int32)
    return cu


def check_prefix_sums(name, cu, total: int, max_name: str, max_len: int) -> None:
    """Host checks of prefix sums the host holds: start at 0, never decrease, end at most at
    ``total`` rows, no sequence longer than ``max_len`` (the grid is sized by it)."""
    values = cu.tolist()
    if values[0] != 0:
        _fail(ValueError, name, "prefix sums starting at 0", f"{values[0]} as the first entry")
    lengths = [b - a for a, b in zip(values, values[1:])]
    for i, n in enumerate(lengths):
        if n < 0:
            _fail(ValueError, name, "non-decreasing prefix sums", f"{values[i]} then {values[i + 1]} at entries "
                  f"{i}, {i + 1}")
    if values[-1] > total:
        _fail(ValueError, name, f"a last entry of at most the {total} rows of its tensor", values[-1])
    longest = max(lengths, default=0)
    if longest > max_len:
        _fail(ValueError, max_name, f"at least the longest sequence in {name} ({longest} rows, sequence "
              f"{lengths.index(longest)})", max_len)


STATUS_WORDS: dict = {}  # device -> int32 count of calls whose CUDA cu_seqlens needed repair
_PENDING: dict = {}  # device -> {id(flag): [int32 "needed repair" flag, calls not yet in the status word]}
# (cu_q key, cu_k key, totals, device) -> ((cu_q, cu_k on the device, int32 "needed repair"), held tensors)
_device_sums = PlanCache("varlen device cu_seqlens", capacity=64)


def cu_key(cu):
    """A cache key part for prefix sums: host sums by value; device sums by address, layout and version
    (no sync). An entry keyed by it keeps the device tensors alive (``held_sums``), so no other tensor
    takes their addresses while it is cached; an in-place write through torch bumps the version."""
    if isinstance(cu, (list, tuple)):
        return ("host", tuple(cu))
    if cu.device.type == "cpu":
        return ("host", tuple(cu.tolist()))
    return ("dev", cu.data_ptr(), cu._version, tuple(cu.shape), tuple(cu.stride()), str(cu.device))


def held_sums(*cus):
    return tuple(c for c in cus if isinstance(c, torch.Tensor) and c.device.type != "cpu")


def device_cu_seqlens(q, cu_q, cu_k, total_q: int, total_k: int):
    """``cu_q`` and ``cu_k`` as int32 tensors on q's device, safe to index with. Host values (a list, a
    CPU tensor; checked by ``check_varlen``) are copied over. CUDA prefix sums are repaired on the device
    without a host sync (clamped to [0, total], made non-decreasing by a running maximum, the first entry
    0), and a call whose sums needed it counts once in the device's status word (``cu_seqlens_status``).
    Every step is a device kernel, so the repair also runs inside a captured CUDA graph.

    The result is kept per (cu_q, cu_k) (host sums by value, device sums by address and version,
    ``cu_key``): the layers of a training step pass the same sums, and a repeated call launches no
    kernel instead of the repair's dozen (its count joins the status word when that is read,
    ``_count_later``), nor pays their host time. Nothing is
    kept while tracing or capturing a CUDA graph (the graph must record the repair of its own input)."""
    cu_q, cu_k = _as_cu_tensor("cu_seqlens_q", cu_q), _as_cu_tensor("cu_seqlens_k", cu_k)
    if q.device.type != "cuda":
        return cu_q, cu_k
    if torch.compiler.is_compiling():  # a traced graph keeps device sums as given (no global side effects)
        return tuple(cu if cu.device.type != "cpu" else cu.to(q.device, non_blocking=True) for cu in (cu_q, cu_k))
    key = None
    if not torch.cuda.is_current_stream_capturing():
        key = (cu_key(cu_q), cu_key(cu_k), total_q, total_k, str(q.device))
        hit = _device_sums.get_held(key, held_sums(cu_q, cu_k))
        if hit is not None:
            safe_q, safe_k, bad = hit
            if bad is not None:
                _count_later(q.device, bad)
            return safe_q, safe_k
    out, bad = [], None
    for cu, total in ((cu_q, total_q), (cu_k, total_k)):
        if cu.device.type == "cpu":
            out.append(cu.to(q.device, non_blocking=True))
            continue
        safe = torch.cummax(cu.clamp(0, total), 0).values.to(torch.int32)
        safe[:1].zero_()  # (an assignment of a Python 0 would copy from the host)
        differs = (safe != cu).any()
        bad = differs if bad is None else bad | differs
        out.append(safe)
    if bad is not None:
        bad = bad.to(torch.int32)
        _status_word(q.device).add_(bad)
    if key is not None:
        _device_sums.put_held(key, (out[0], out[1], bad), held_sums(cu_q, cu_k))
    return out[0], out[1]


def _count_later(device, bad):
    """A repeated call with cached sums counts in the status word when it is read (``_flush``), not
    with a kernel of its own: one launch less per call of a training step. At most 64 entries wait."""
    pending = _PENDING.setdefault(device, {})
    slot = pending.get(id(bad))
    if slot is not None:
        slot[1] += 1
        return
    if len(pending) >= 64:
        _flush(device)
        pending = _PENDING.setdefault(device, {})
    pending[id(bad)] = [bad, 1]  # the entry holds ``bad``, so its id stays its own


def _flush(device):
    pending = _PENDING.pop(device, None)
    if pending:
        word = _status_word(device)
        for bad, calls in pending.values():
            word.add_(bad * calls)


def _status_word(device):
    word = STATUS_WORDS.get(device)
    if word is None:
        word = STATUS_WORDS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return word


def cu_seqlens_status(device=None, reset: bool = True) -> int:
    """How many calls on ``device`` since the last reset had CUDA cu_seqlens that were not valid prefix
    sums (repaired on the device; their outputs are not meaningful). Reads a device word: a sync."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    _flush(device)
    word = STATUS_WORDS.get(device)
    if word is None:
        return 0
    count = int(word.item())
    if reset:
        word.zero_()
    return count


def check_seqused(q, seqused_q, seqused_k, n_docs):
    """seqused_q/k: None or int32 (B,) on the query's device; only the Hopper kernels take them."""
    for name, t in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != n_docs:
            _fail(TypeError, name, f"None or a 1-D torch.int32 tensor of {n_docs} lengths (one per sequence)",
                  f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}")
        if t.device != q.device:
            _fail(ValueError, name, f"the query's device {q.device}", t.device)
    if (seqused_q is not None or seqused_k is not None) and q.device.type == "cuda" and not hopper_applies(q):
        raise NotImplementedError(f"attention_varlen: seqused_q/seqused_k expects a Hopper GPU (sm_90) and head_dim 64 "
                                  f"or 128 (the portable kernels do not take them), but got head_dim {q.shape[2]} on "
                                  f"compute capability {_capability(q.device.index)}")


@functools.lru_cache(maxsize=None)
def _capability(device_index):
    return torch.cuda.get_device_capability(device_index)


def hopper_applies(q) -> bool:
    """The warp-specialized Hopper kernels run this call: sm_90 and head dim 64 or 128."""
    return q.device.type == "cuda" and q.shape[2] in (64, 128) and _capability(q.device.index)[0] == 9


def forward_varlen(q, k, v, docs: PackedDocs, is_causal, scale, return_lse):
    """(out, lse or None) on CUDA: Hopper's warp-specialized kernel where it applies, else the portable
    one (which takes no ``docs.seqused_*``)."""
    cu_q, cu_k, max_q, max_k = docs[:4]
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device) if return_lse else None
    if q.shape[0] * q.shape[1] == 0 or max_q == 0 or max_k == 0:
        return out, lse
    q, scale = _nonpositive_scale(q, scale)
    if hopper_applies(q):
        from tylopy_kernels.attention.sm90.varlen_launch import HopperOptions, launch_varlen_hopper
        launch_varlen_hopper(ForwardTensors(q, k, v, out, lse), docs, HopperOptions(scale, is_causal))
        return out, lse
    from tylopy_kernels.attention.portable.launch import launch_forward
    launch_forward(q, k, v, out, lse, scale=scale, is_causal=is_causal, varlen=(cu_q, cu_k, max_q))
    return out, lse


def backward_varlen(forward: ForwardTensors, dout, dlse, docs: PackedDocs, is_causal, scale):
    """(dq, dk, dv) on CUDA; zeros for rows outside every sequence. Hopper's warp-specialized kernels
    (``sm90/backward_varlen.py``) where the forward ran on them, without an LSE gradient and outside
    ``torch.use_deterministic_algorithms`` (their dQ sums are atomic); the portable ones otherwise.
    ``forward``: the forward's q, k, v, out and lse; ``dlse`` the LSE's gradient or None."""
    q, k, v, out, lse, _ = forward
    cu_q, cu_k, max_q, max_k = docs[:4]
    empty = q.shape[0] * q.shape[1] == 0 or k.shape[0] == 0 or max_q == 0 or max_k == 0 or cu_q.shape[0] < 2
    hopper = not empty and hopper_applies(q) and dlse is None and not torch.are_deterministic_algorithms_enabled()
    # the Hopper conversion writes every row (zeros outside the documents): no fills
    make = torch.empty if hopper else torch.zeros
    dq, dk, dv = (make(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if empty:
        return dq, dk, dv
    if dout.stride(-1) != 1:  # e.g. the zero-stride gradient of out.sum()
        dout = dout.contiguous()
    q_used, s = _nonpositive_scale(q, scale)
    if hopper:
        from tylopy_kernels.attention.common import BackwardTensors
        from tylopy_kernels.attention.sm90.backward_launch import HopperBackwardOptions
        from tylopy_kernels.attention.sm90.backward_varlen_launch import launch_varlen_backward
        launch_varlen_backward(BackwardTensors(q_used, k, v, out, dout, lse, dq, dk, dv), PackedDocs(cu_q, cu_k, max_q,
                               max_k), HopperBackwardOptions(s, is_causal))
    else:
        from tylopy_kernels.attention.portable.backward_launch import launch_backward_portable
        launch_backward_portable(q_used, k, v, out, dout, lse, dq, dk, dv, is_causal=is_causal, scale=s, dlse=dlse,
                                 varlen=(cu_q, cu_k, max_q, max_k))
    if scale < 0:
        dq.neg_()
    elif scale == 0:
        dq.zero_()
    return dq, dk, dv
