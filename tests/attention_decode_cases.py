"""Inputs for the split-KV decode tests: random q and caches (ragged lengths, GQA, paged or not)
with NaN in every cache row past a sequence's end, in unused pages and -1 table entries past
the end; shared by the emulator tests and the GPU tests."""
from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class DecodeCase:
    name: str
    lens: tuple
    n_q: int = 1
    h_q: int = 4
    h_kv: int = 2
    head_dim: int = 64
    cap: int | None = None          # cache capacity (default: the longest length, rounded up to a page)
    page_size: int = 0              # 0: contiguous cache
    causal: bool = False
    splits: int | None = None
    merge: str = "kernel"
    layout: str = "bshd"
    dtype: torch.dtype = torch.bfloat16
    schedule: dict | None = None
    seed: int = 0

    @property
    def capacity(self) -> int:
        cap = self.cap or max(max(self.lens), 1)
        if self.page_size:
            cap = -(-cap // self.page_size) * self.page_size
        return cap


def make_inputs(case: DecodeCase, device="cpu"):
    """(q, k_cache, v_cache, cache_seqlens, block_table or None) for ``case``."""
    g = torch.Generator().manual_seed(case.seed)
    B, D, dt = len(case.lens), case.head_dim, case.dtype
    cap = case.capacity
    q = torch.randn(B, case.n_q, case.h_q, D, generator=g).to(dt)
    lens = torch.tensor(case.lens, dtype=torch.int32)
    if case.page_size:
        P = case.page_size
        per_seq = cap // P
        n_pages = B * per_seq + 3                                   # three pages nobody uses
        k = torch.randn(n_pages, P, case.h_kv, D, generator=g).to(dt)
        v = torch.randn(n_pages, P, case.h_kv, D, generator=g).to(dt)
        table = torch.randperm(n_pages, generator=g)[:B * per_seq].reshape(B, per_seq).to(torch.int32)
        used = torch.zeros(n_pages, P, dtype=torch.bool)
        for b, n in enumerate(case.lens):
            for j in range(n):
                used[table[b, j // P], j % P] = True
            table[b, -(-n // P):] = -1                              # entries past the end: never read
        k[~used] = float("nan")
        v[~used] = float("nan")
    else:
        table = None
        k = torch.randn(B, cap, case.h_kv, D, generator=g).to(dt)
        v = torch.randn(B, cap, case.h_kv, D, generator=g).to(dt)
        for b, n in enumerate(case.lens):
            k[b, n:] = float("nan")
            v[b, n:] = float("nan")
    if case.layout == "bhsd":
        q = q.transpose(1, 2).contiguous()
        if table is None:
            k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    to = (lambda t: t.to(device)) if device != "cpu" else (lambda t: t)
    return to(q), to(k), to(v), to(lens), (to(table) if table is not None else None)


def scale_of(case: DecodeCase) -> float:
    return 1.0 / math.sqrt(case.head_dim)


UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def tolerance(ref_out, dtype) -> float:
    """The output is rounded to the input dtype and P to it before P V: a few units in the last place."""
    return 8 * UNIT_ROUNDOFF[dtype] * max(1.0, ref_out.abs().max().item())


def check_result(case, out, lse, ref_out, ref_lse):
    """Output within the rounding rule, LSE within fp32 accuracy, and -inf exactly where the reference has it."""
    assert not torch.isnan(out).any(), "NaN in the output"
    err = (out.double().cpu() - ref_out.cpu()).abs().max().item()
    assert err <= tolerance(ref_out, case.dtype), f"{case.name}: max error {err}"
    if lse is not None:
        lse, ref_lse = lse.double().cpu(), ref_lse.cpu()
        empty = torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(lse), empty), f"{case.name}: LSE -inf where the reference has {ref_lse}"
        assert not torch.isnan(lse).any()
        assert (lse[~empty] - ref_lse[~empty]).abs().max().item() <= 1e-5 * max(1.0, ref_lse[~empty].abs().max()
                                                                                .item()) if (~empty).any() else True
        rows_empty = empty.transpose(1, 2) if case.layout == "bshd" else empty
        assert (out.cpu()[rows_empty] == 0).all(), "rows without keys must be 0"
