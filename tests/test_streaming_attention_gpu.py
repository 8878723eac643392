"""GPU tier of the portable streaming attention: every case of ``tylopy check streaming_attention``
(the same functions), plus the worked example, the cp.async path against the ld/st path the CPU
emulator runs, and ``tylopy.attention``'s dispatch to this kernel."""
import math

import pytest
import torch

from tylopy_kernels.attention.testing import cases as cases
from tylopy_kernels.attention.testing import scenarios as scenarios
from tylopy_kernels.attention.portable import forward as sa
from tylopy_kernels.attention.portable import launch as pl

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", cases.PORTABLE_CASES, ids=[c.name for c in cases.PORTABLE_CASES])
def test_checker_case(case):
    ok, msg = scenarios.run_portable_case(case)
    assert ok, msg


@pytest.mark.parametrize("head_dim", sa.HEAD_DIMS)
@pytest.mark.parametrize("block_n", sa.BLOCK_NS)
def test_worked_example_gives_6(head_dim, block_n):
    """Scores q.k * scale = [0, 0, log 2] and values [1, 3, 10]: every output is 6 (7 = a not rescaled)."""
    q, k, v, mask, scale = cases.worked_example_inputs(head_dim, "bfloat16", block_n, False)
    out = pl.streaming_attention(q, k, v, scale=scale, block_n=block_n)
    assert out.shape == (1, 1, 3, head_dim)
    torch.testing.assert_close(out.double(), torch.full_like(out.double(), 6.0), rtol=0, atol=1e-2)
    # the same numbers with the third key in the next tile: the maximum grows from 0 to log 2
    q, k, v, mask, scale = cases.worked_example_inputs(head_dim, "bfloat16", block_n, True)
    out = pl.streaming_attention(q, k, v, attn_mask=mask, scale=scale, block_n=block_n)
    torch.testing.assert_close(out.double(), torch.full_like(out.double(), 6.0), rtol=0, atol=1e-2)


@pytest.mark.parametrize("name", ["N2047-D64-BN64-bf16", "N65-D16-BN32-bf16", "N4096-D64-BN64-bf16-causal",
                                  "mask-qk-D64-lse", "ragged-rect-100x300-D32", "warps8-N300-D16-f16-causal"])
def test_cp_async_path_matches_the_ld_st_path_bit_for_bit(name):
    """The emulator checks the ld/st copy path on the CPU; cp.async must put the same bytes in shared memory."""
    case = next(c for c in cases.PORTABLE_CASES if c.name == name)
    q, k, v, mask = cases.make_inputs(case)
    outs = []
    for async_copy in (True, False):
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
        lse = torch.full(q.shape[:3], float("nan"), device=q.device)
        pl.launch_streaming(pl.ForwardTensors(q, k, v, out, lse, mask),
                            pl.ForwardOptions(1.0 / math.sqrt(case.head_dim), case.causal, block_n=case.block_n,
                                              warps=case.warps, async_copy=async_copy))
        outs.append((out, lse))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("head_dim", [16, 32])
def test_tylopy_attention_dispatches_here(head_dim):
    import tylopy
    from tylopy_kernels.attention.dispatch import HOPPER_HEAD_DIMS
    if torch.cuda.get_device_capability()[0] == 9 and head_dim in HOPPER_HEAD_DIMS:
        pytest.skip(f"D={head_dim} goes to the Hopper kernel on this GPU")
    torch.manual_seed(head_dim)
    q = torch.randn(2, 3, 200, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    out, lse = tylopy.attention(q, k, v, is_causal=True, return_lse=True)
    mine, my_lse = pl.streaming_attention(q, k, v, is_causal=True, return_lse=True)
    assert torch.equal(out, mine) and torch.equal(lse, my_lse)


def test_empty_inputs_launch_nothing():
    q = torch.zeros(1, 2, 0, 32, device="cuda", dtype=torch.bfloat16)
    assert pl.streaming_attention(q, q, q).shape == (1, 2, 0, 32)
    q = torch.randn(1, 2, 5, 32, device="cuda", dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 0, 32, device="cuda", dtype=torch.bfloat16)
    out, lse = pl.streaming_attention(q, k, k, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isinf(lse).all() and (lse < 0).all()
