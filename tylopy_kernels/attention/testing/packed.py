"""Packed (varlen) batches for tests: ragged documents with NaN past every document's used rows,
and the float64 reference the kernels are checked against (``autograd.reference_varlen_*``, with
seqused applied by cutting each document to its used rows)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from tylopy_kernels.attention import autograd as A


def prefix_sums(lengths, device="cpu") -> torch.Tensor:
    """int32 cu_seqlens of the given document lengths."""
    sums = [0]
    for n in lengths:
        sums.append(sums[-1] + int(n))
    return torch.tensor(sums, dtype=torch.int32, device=device)


def packed(lengths, used, heads, D, dtype, gen, pad=3) -> torch.Tensor:
    """(sum(lengths) + pad, heads, D): random rows where a document's first ``used[b]`` rows are,
    NaN everywhere else (a document's unused tail and the ``pad`` rows past the last document)."""
    total = sum(lengths)
    t = torch.full((total + pad, heads, D), float("nan"), dtype=dtype)
    start = 0
    for n, u in zip(lengths, used):
        t[start:start + u] = torch.randn(u, heads, D, generator=gen).to(dtype)
        start += n
    return t


def used_prefix_sums(lengths, used):
    """cu_seqlens of the documents cut to their used rows, and the row index of each used row in
    the packed tensor (to gather and scatter between the two)."""
    rows, start = [], 0
    for n, u in zip(lengths, used):
        rows += list(range(start, start + u))
        start += n
    return prefix_sums(used), torch.tensor(rows, dtype=torch.long)


class Documents(NamedTuple):
    """The documents of one packed tensor: each one's rows in the buffer (``lengths``, what
    cu_seqlens sums) and how many of its first rows hold data (``used``, seqused)."""

    lengths: tuple
    used: tuple


def reference(q, k, v, docs_q: Documents, docs_k: Documents, causal, scale):
    """float64 (out, lse, used query rows) over the packed rows: documents' used rows only; zeros
    and LSE -inf elsewhere (rows past a document's used ones are not written by the kernels)."""
    cu_q, rows_q = used_prefix_sums(*docs_q)
    cu_k, rows_k = used_prefix_sums(*docs_k)
    o, l = A.reference_varlen_forward(q[rows_q].double(), k[rows_k].double(), v[rows_k].double(), cu_q, cu_k,
                                      causal, scale)
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64)
    out[rows_q] = o
    lse[:, rows_q] = l.double()
    return out, lse, rows_q
