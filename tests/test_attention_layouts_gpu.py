"""GPU tier of tests/test_attention_layouts.py: Q, K and V in three layouts (their own buffers,
paddings and dimension orders, grouped K/V heads) through the portable kernel, the Hopper kernel
(mapped without a copy) and ``tylopy.attention``, against the FP64 references."""
import math

import pytest
import torch

from conftest import requires_sm90
from attention_layout_cases import check_layouts, hopper_inputs, portable_inputs
from tylopy_kernels.attention.testing.reference import HOPPER, PORTABLE
from tylopy_kernels.attention.testing import scenarios as S

pytestmark = pytest.mark.gpu


def _outputs(q):
    return torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device), \
        torch.full(q.shape[:3], float("nan"), device=q.device)


def test_portable_kernel_three_layouts():
    from tylopy_kernels.attention.portable.launch import ForwardOptions, ForwardTensors, plan_forward
    q, k, v = portable_inputs(device="cuda")
    out, lse = _outputs(q)
    scale = 1 / math.sqrt(q.shape[-1])
    plan_forward(ForwardTensors(q, k, v, out, lse), ForwardOptions(scale, block_n=32, warps=2)).run()
    torch.cuda.synchronize()
    check_layouts(out.cpu(), lse.cpu(), q.cpu(), k.cpu(), v.cpu(), scale,
                  PORTABLE.replace(block_n=32, lse=True, dtype=q.dtype))


@requires_sm90
def test_hopper_kernel_different_strides_mapped_as_they_are():
    from tylopy_kernels.attention.sm90.launch import ForwardTensors, HopperOptions, launch_hopper
    q, k, v = hopper_inputs(device="cuda")
    out, lse = _outputs(q)
    scale = 1 / math.sqrt(q.shape[-1])
    with S.recorded_launches() as seen:
        launch_hopper(ForwardTensors(q, k, v, out, lse), HopperOptions(scale))
    torch.cuda.synchronize()
    assert seen, "the Hopper kernel did not run"
    check_layouts(out.cpu(), lse.cpu(), q.cpu(), k.cpu(), v.cpu(), scale,
                  HOPPER.replace(block_n=int(seen[-1]["BLOCK_N"]), lse=True, dtype=q.dtype))


@pytest.mark.parametrize("inputs", ["portable", "hopper"])
def test_entry_point_three_layouts_twice(inputs):
    """``tylopy.attention`` (whichever kernel it picks), called twice: the second call takes the kept
    plan where there is one, and must read V through V's own strides too."""
    import tylopy as ty
    q, k, v = (portable_inputs if inputs == "portable" else hopper_inputs)(device="cuda")
    scale = 1 / math.sqrt(q.shape[-1])
    for _ in range(2):
        with S.recorded_launches() as seen:
            out, lse = ty.attention(q, k, v, scale=scale, enable_gqa=True, return_lse=True)
        torch.cuda.synchronize()
        if seen:  # the Hopper kernel ran (its launch says its BLOCK_N)
            model = HOPPER.replace(block_n=int(seen[-1]["BLOCK_N"]), lse=True, dtype=q.dtype)
        else:  # the portable kernel with its default schedule
            from tylopy_kernels.attention.portable.launch import check_schedule
            model = PORTABLE.replace(block_n=check_schedule(q.shape[-1], None, None)[0], lse=True, dtype=q.dtype)
        check_layouts(out.cpu(), lse.cpu(), q.cpu(), k.cpu(), v.cpu(), scale, model)
