"""The attention variants ``tylopy bench attention_variants`` times: their shapes, their masks
(as dense boolean matrices and as mask_mod / score_mod functions), the exact count of visible
(query, key) pairs that the TFLOP/s are computed from, their inputs and an fp32 reference.

Everything here runs on the CPU too (the tests count pairs against brute force at small sizes).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

TOKENS = 16384                      # batch x sequence length of every timed shape
HEADS = {64: 32, 128: 16}           # heads per head dim (a 2048-wide model)
NS = (1024, 2048, 4096, 8192, 16384)
DIMS = (64, 128)
WINDOW = 1024                       # sliding window: key j is visible from query i iff i - 1024 <= j <= i
SOFTCAP = 30.0                      # score -> 30 tanh(score / 30), on the scaled score
BLOCK = 128                         # block-sparse: the block table's granularity (rows and columns)
BLOCK_DENSITY = 0.5                 # block-sparse: chance that an off-diagonal block is kept

# variant -> what it is (the row label in the tables; order = the order they run in)
VARIANTS = {
    "causal": "causal",
    "sliding_window": f"causal, window left {WINDOW}",
    "document_varlen": "document-causal, varlen (cu_seqlens)",
    "document_mask": "document-causal, mask_mod over B=1 packed tokens (document ids)",
    "document_window": f"document-causal varlen, window left {WINDOW} and softcap {SOFTCAP:g} per document",
    "softcap": f"causal, softcap {SOFTCAP:g}",
    "alibi": "causal, ALiBi (slope 2^(-8(h+1)/H))",
    "block_sparse": f"random {BLOCK}x{BLOCK} block table (density {BLOCK_DENSITY:g}, diagonal kept), mask_mod",
    "sinks": "causal, one learnable sink logit per head",
}
DOCUMENT_VARIANTS = ("document_varlen", "document_mask", "document_window")
SOFTCAP_VARIANTS = ("softcap", "document_window")
CAUSAL_VARIANTS = ("causal", "softcap", "alibi", "sinks")


@dataclass(frozen=True)
class Spec:
    """One timed shape of one variant. ``n`` is the nominal sequence length (the row's N; for the
    document variants the mean document length), ``seq`` the length of each of the ``batch``
    sequences the kernels see (for the document variants: all tokens, packed, batch 1)."""
    variant: str
    d: int
    n: int
    batch: int
    heads: int
    seq: int
    doc_lengths: tuple = ()
    table: tuple = ()
    block: int = BLOCK


def make_spec(variant, d, n, tokens=TOKENS, heads=None, seed=0, block=BLOCK):
    """The shape of ``variant`` at head dim ``d`` and length ``n`` with ``tokens`` tokens in all."""
    if variant not in VARIANTS:
        raise ValueError(f"variant expects one of {', '.join(VARIANTS)}, but got {variant!r}")
    heads = HEADS.get(d, 16) if heads is None else heads
    if variant in DOCUMENT_VARIANTS:
        return Spec(variant, d, n, 1, heads, tokens, doc_lengths=document_lengths(tokens, n, seed))
    batch, seq = max(tokens // n, 1), n
    table = random_block_table(-(-seq // block), seed) if variant == "block_sparse" else ()
    return Spec(variant, d, n, batch, heads, seq, table=table, block=block)


def document_lengths(total, mean, seed=0):
    """Lengths of documents packed into ``total`` tokens, each drawn uniformly from
    [mean/2, 3 mean/2] (the last one cut to what is left): ragged, so tile edges fall inside documents."""
    rng = random.Random(1000003 * seed + mean)
    lengths, left = [], total
    while left > 0:
        length = min(rng.randint(max(1, mean // 2), max(1, (3 * mean) // 2)), left)
        lengths.append(length)
        left -= length
    return tuple(lengths)


def random_block_table(blocks, seed=0, density=BLOCK_DENSITY):
    """blocks x blocks of 0/1: the diagonal kept (no query row is left without keys), every
    other block kept with probability ``density``."""
    rng = random.Random(7919 * seed + blocks)
    return tuple(tuple(int(i == j or rng.random() < density) for j in range(blocks)) for i in range(blocks))


# -- counting the work ----------------------------------------------------------------------------

def causal_pairs(n):
    return n * (n + 1) // 2


def window_pairs(n, left=WINDOW):
    """Pairs (i, j) with i - left <= j <= i, 0 <= j, i < n: row i sees min(i, left) + 1 keys."""
    if n <= left + 1:
        return causal_pairs(n)
    return (left + 1) * (left + 2) // 2 + (n - left - 1) * (left + 1)


def table_pairs(table, seq, block):
    """Pairs inside the kept blocks (the last row and column of blocks may be partial)."""
    def size(i):
        return min(block, seq - i * block)
    return sum(size(i) * size(j) for i, row in enumerate(table) for j, keep in enumerate(row) if keep)


def visible_pairs(spec):
    """Visible (query, key) pairs per head, summed over the batch: the work the TFLOP/s count."""
    if spec.variant in CAUSAL_VARIANTS:
        return spec.batch * causal_pairs(spec.seq)
    if spec.variant == "sliding_window":
        return spec.batch * window_pairs(spec.seq)
    if spec.variant == "document_window":
        return sum(window_pairs(length) for length in spec.doc_lengths)
    if spec.variant in DOCUMENT_VARIANTS:
        return sum(causal_pairs(length) for length in spec.doc_lengths)
    if spec.variant == "block_sparse":
        return spec.batch * table_pairs(spec.table, spec.seq, spec.block)
    raise ValueError(f"variant expects one of {', '.join(VARIANTS)}, but got {spec.variant!r}")


def flops(spec, direction):
    """4 D FLOPs per visible pair per head forward (two GEMMs); the backward 2.5 times that."""
    fwd = 4 * spec.d * spec.heads * visible_pairs(spec)
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction expects 'fwd' or 'bwd', but got {direction!r}")
    return fwd if direction == "fwd" else 2.5 * fwd


# -- masks and modifiers --------------------------------------------------------------------------

def doc_ids(spec, device="cpu"):
    """int32 (seq,): the document each packed token belongs to."""
    import torch
    lengths = torch.tensor(spec.doc_lengths, dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(len(spec.doc_lengths), device=device, dtype=torch.int32), lengths)


def cu_seqlens(spec, device="cpu"):
    """int32 (documents + 1,): the documents' start offsets and the total, for the varlen calls."""
    import torch
    out = [0]
    for length in spec.doc_lengths:
        out.append(out[-1] + length)
    return torch.tensor(out, dtype=torch.int32, device=device)


def table_tensor(spec, device="cpu"):
    import torch
    return torch.tensor(spec.table, dtype=torch.int32, device=device)


def dense_mask(spec, device="cpu"):
    """bool (seq, seq): which keys each query sees (the same for every batch element and head)."""
    import torch
    i = torch.arange(spec.seq, device=device)[:, None]
    j = torch.arange(spec.seq, device=device)[None, :]
    if spec.variant in CAUSAL_VARIANTS:
        return j <= i
    if spec.variant == "sliding_window":
        return (j <= i) & (j >= i - WINDOW)
    if spec.variant in DOCUMENT_VARIANTS:
        doc = doc_ids(spec, device)
        window = (j >= i - WINDOW) if spec.variant == "document_window" else True
        return (j <= i) & (doc[:, None] == doc[None, :]) & window
    if spec.variant == "block_sparse":
        return table_tensor(spec, device)[i // spec.block, j // spec.block] > 0
    raise ValueError(f"variant expects one of {', '.join(VARIANTS)}, but got {spec.variant!r}")


def mask_mod(spec, device="cpu"):
    """mask_mod(b, h, q_idx, kv_idx) -> bool for the variant, as FlexAttention (and tylopy)
    take it; tensors it reads are captured (1-D, indexed by plain integer arithmetic)."""
    if spec.variant in CAUSAL_VARIANTS:
        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
        return causal
    if spec.variant == "sliding_window":
        def sliding_window(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)
        return sliding_window
    if spec.variant in DOCUMENT_VARIANTS:
        doc = doc_ids(spec, device)

        def document_causal(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx])

        def document_window(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx]) & (q_idx - kv_idx <= WINDOW)
        return document_window if spec.variant == "document_window" else document_causal
    if spec.variant == "block_sparse":
        flat, columns, block = table_tensor(spec, device).reshape(-1), len(spec.table), spec.block

        def block_table(b, h, q_idx, kv_idx):
            return flat[(q_idx // block) * columns + kv_idx // block] > 0
        return block_table
    raise ValueError(f"variant expects one of {', '.join(VARIANTS)}, but got {spec.variant!r}")


def alibi_slopes(heads, device="cpu"):
    """fp32 (heads,): 2^(-8 (h + 1) / heads), the ALiBi paper's geometric slopes."""
    import torch
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=torch.float32, device=device)


def score_mod(spec, slopes=None):
    """score_mod(score, b, h, q_idx, kv_idx) for softcap and ALiBi (None for the others); the
    score it gets is already scaled by 1/sqrt(D)."""
    import torch
    if spec.variant in SOFTCAP_VARIANTS:
        def softcap(score, b, h, q_idx, kv_idx):
            return SOFTCAP * torch.tanh(score / SOFTCAP)
        return softcap
    if spec.variant == "alibi":
        def alibi(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx).abs()
        return alibi
    return None


# -- inputs and the reference ---------------------------------------------------------------------

def make_inputs(spec, device="cuda", seed=0):
    """q, k, v, dout as (batch, heads, seq, D) bf16 (fresh normal data) and what the variant
    needs besides: ALiBi slopes, sink logits, document ids / cu_seqlens, the block table."""
    import torch
    gen = torch.Generator(device=device).manual_seed(seed + 31 * spec.n + spec.d)
    shape = (spec.batch, spec.heads, spec.seq, spec.d)
    x = {name: torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
         for name in ("q", "k", "v", "dout")}
    x["slopes"] = alibi_slopes(spec.heads, device)
    x["sinks"] = torch.randn(spec.heads, generator=gen, device=device, dtype=torch.float32)
    if spec.variant in DOCUMENT_VARIANTS:
        x["doc_ids"], x["cu_seqlens"] = doc_ids(spec, device), cu_seqlens(spec, device)
        x["max_seqlen"] = max(spec.doc_lengths)
    if spec.variant == "block_sparse":
        x["table"] = table_tensor(spec, device)
    return x


def reference(spec, x, q=None, k=None, v=None, heads=slice(None)):
    """The variant in fp32 on (batch, heads, seq, D) inputs (x's, or the given ones, which may
    require grad, and then hold the heads ``heads`` selects): softmax(mods(q k^T / sqrt(D))
    masked [, sink]) v."""
    import torch
    q, k, v = (x[n].float() if t is None else t for n, t in (("q", q), ("k", k), ("v", v)))
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(spec.d))
    i = torch.arange(spec.seq, device=q.device)
    if spec.variant in SOFTCAP_VARIANTS:
        s = SOFTCAP * torch.tanh(s / SOFTCAP)
    if spec.variant == "alibi":
        s = s - x["slopes"][heads, None, None] * (i[:, None] - i[None, :]).abs().float()
    s = s.masked_fill(~dense_mask(spec, q.device), float("-inf"))
    if spec.variant == "sinks":
        sink = x["sinks"][heads].float()[None, :, None, None].expand(*s.shape[:-1], 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    return p @ v
