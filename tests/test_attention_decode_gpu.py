"""GPU tier of split-KV decode: ``tylopy.attention_decode`` against an FP64 reference over cache
lengths 1..64k (ragged per sequence, GQA 32/8, paged and contiguous, causal bottom-right, both
merges, both layouts, D 64/128, bf16/fp16), the FlashAttention-style rule against a float32
computation rounded once, graph capture, and agreement with ``tylopy.attention`` at n_q = 1."""
import math

import pytest
import torch

import tylopy
from attention_decode_cases import DecodeCase, check_result, make_inputs, scale_of
from tylopy_kernels.attention.decode import launch as dl

pytestmark = pytest.mark.gpu

FLOOR_REL = 2.0 ** -10

CASES = [
    DecodeCase("len1", (1,), h_q=32, h_kv=8, head_dim=128),
    DecodeCase("ragged-1-17-4096", (1, 17, 4096), h_q=32, h_kv=8, head_dim=128),
    DecodeCase("len64k-gqa4", (65536,), h_q=32, h_kv=8, head_dim=128),
    DecodeCase("len64k-gqa4-atomic", (65536,), h_q=32, h_kv=8, head_dim=128, merge="atomic"),
    DecodeCase("ragged-b8-paged16", (5, 3000, 777, 8192, 1, 64, 4095, 129), h_q=32, h_kv=8, head_dim=128,
               page_size=16),
    DecodeCase("paged256-causal-nq4", (300, 9000, 4), n_q=4, h_q=32, h_kv=8, head_dim=128, page_size=256,
               causal=True),
    DecodeCase("causal-nq8-gqa4-two-row-tiles", (1000, 8, 5), n_q=8, h_q=16, h_kv=4, head_dim=128, causal=True,
               merge="atomic"),
    DecodeCase("d64-fp16-mqa", (12345, 2), h_q=16, h_kv=1, head_dim=64, dtype=torch.float16),
    DecodeCase("d64-bhsd", (2048, 333), h_q=8, h_kv=8, head_dim=64, layout="bhsd"),
    DecodeCase("forced-splits-many", (20000,), h_q=8, h_kv=2, head_dim=128, splits=200),
    DecodeCase("zero-length-rows", (0, 50, 0), h_q=8, h_kv=2, head_dim=128, splits=4),
]


def _run(case):
    q, k, v, lens, table = make_inputs(case, "cuda")
    out, lse = tylopy.attention_decode(q, k, v, lens, scale=scale_of(case), block_table=table, is_causal=case.causal,
                                       num_splits=case.splits, return_lse=True, layout=case.layout,
                                       merge=case.merge)
    ref_out, ref_lse = dl.reference_decode(q, k, v, lens, scale=scale_of(case), block_table=table,
                                           is_causal=case.causal, layout=case.layout)
    return q, k, v, lens, table, out, lse, ref_out, ref_lse


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decode_matches_fp64(case):
    q, k, v, lens, table, out, lse, ref_out, ref_lse = _run(case)
    check_result(case, out, lse, ref_out, ref_lse)
    # FlashAttention's rule: at most twice the error of a float32 computation rounded once, plus a floor
    once = ref_out.float().to(case.dtype).double()
    base = (once - ref_out).abs().max().item()
    err = (out.double() - ref_out).abs().max().item()
    vmax = torch.nan_to_num(v.double(), nan=0.0).abs().max().item()
    assert err <= 2 * base + FLOOR_REL * vmax, f"{case.name}: error {err}, float32-rounded-once error {base}"


@pytest.mark.parametrize("merge", dl.MERGES)
def test_graph_replay_is_repeatable(merge):
    """Two replays of a captured decode step give the same bits (the arrival counters reset themselves)."""
    case = DecodeCase("graph", (7000, 123), h_q=32, h_kv=8, head_dim=128, merge=merge)
    q, k, v, lens, table = make_inputs(case, "cuda")
    run = lambda: tylopy.attention_decode(q, k, v, lens, merge=merge, num_splits=16)  # noqa: E731
    first = run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run()
    g.replay()
    torch.cuda.synchronize()
    a = out.clone()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(a, out) and torch.equal(a, first)


def test_one_query_equals_attention():
    """n_q = 1 against the whole cache: tylopy.attention with the cache as (B, H_kv, N, D) and enable_gqa."""
    B, N, H, Hkv, D = 2, 3000, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(B, 1, H, D, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, N, Hkv, D, device="cuda", generator=g).bfloat16()
    v = torch.randn(B, N, Hkv, D, device="cuda", generator=g).bfloat16()
    lens = torch.full((B,), N, dtype=torch.int32, device="cuda")
    out, lse = tylopy.attention_decode(q, k, v, lens, return_lse=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           enable_gqa=True).transpose(1, 2)
    assert (out.float() - ref.float()).abs().max().item() <= 2 ** -6
    ro, rl = dl.reference_decode(q, k, v, lens)
    assert (lse.double() - rl).abs().max().item() <= 1e-4


def test_negative_scale_and_deterministic_repeats():
    case = DecodeCase("neg", (4000, 17), h_q=8, h_kv=2, head_dim=64)
    q, k, v, lens, table = make_inputs(case, "cuda")
    out = tylopy.attention_decode(q, k, v, lens, scale=-0.2)
    ref, _ = dl.reference_decode(q, k, v, lens, scale=-0.2)
    assert (out.double() - ref).abs().max().item() <= 8 * 2 ** -8
    assert torch.equal(out, tylopy.attention_decode(q, k, v, lens, scale=-0.2))


def test_strided_views_are_used_or_copied():
    """A cache slice of a bigger buffer (rows 16-byte aligned) and an odd q view both work."""
    B, N, Hkv, D = 2, 1000, 2, 64
    big = torch.randn(B, N, Hkv + 2, D, device="cuda").bfloat16()
    k, v = big[:, :, :Hkv], big[:, :, 2:]
    q = torch.randn(B, 1, 8, D + 8, device="cuda").bfloat16()[..., 8:]
    lens = torch.tensor([1000, 3], dtype=torch.int32, device="cuda")
    out = tylopy.attention_decode(q, k, v, lens)
    ref, _ = dl.reference_decode(q, k, v, lens)
    assert (out.double() - ref).abs().max().item() <= 8 * 2 ** -8 * max(1, ref.abs().max().item())
    assert math.isfinite(out.float().sum().item())
