"""The softmax kernels: every variant the launchers can pick assembles without spills (CPU), the
full-row kernel's choice of warps per row keeps a lane's values within bounds, and each kernel
matches torch.softmax on the GPU for ragged, wide (the full-row kernel's one-warp and multi-warp
paths), uniform, masked and large-magnitude rows. GPU tests carry the ``gpu`` marker;
tests/conftest.py skips them without CUDA."""
import math
import re

import pytest
import torch

import tylopy as ty
from tylopy_kernels.softmax import row as rs
from tylopy_kernels.softmax import streaming as ss

# -- CPU tier: compile, ptxas report, PTX golden checks ------------------------------------------

DTYPES = (ty.f32, ty.f16, ty.bf16)
ONE_WARP_COLS = (1, 3, 31, 32, 100, 129, 1000, 1024, 2048, 4095, 4096)
MULTI_WARP_COLS = (4097, 6000, 8192, 8193, 12288, 16384, 16385, 16388, 24573, 32767, 32768)
FULL_ROW_COLS = ONE_WARP_COLS + MULTI_WARP_COLS


def _variants():
    """(id, zero-arg compile function) for every specialization the launchers can pick."""
    out = [("row_softmax", lambda: rs.row_softmax.compile())]
    for dt in DTYPES:
        out += [(f"streaming-{dt}-VEC{v}", lambda dt=dt, v=v: ss.streaming_kernel(dt).compile(VEC=v)) for v in (1, 4)]
        out.append((f"three_pass-{dt}", lambda dt=dt: ss.three_pass_kernel(dt).compile()))
        for cols in FULL_ROW_COLS:
            w = ss.full_row_warps(cols)
            for v in ((1, 4) if cols % 4 == 0 else (1,)):
                out.append((f"full_row-{dt}-COLS{cols}-W{w}-VEC{v}",
                            lambda dt=dt, c=cols, v=v, w=w: ss.full_row_kernel(dt).compile(COLS=c, VEC=v,
                                                                                        WARPS_PER_ROW=w)))
    return out


VARIANTS = _variants()


@pytest.mark.parametrize("compile_fn", [c for _, c in VARIANTS], ids=[n for n, _ in VARIANTS])
def test_variant_assembles_without_spills(compile_fn):
    ck = compile_fn()
    report = ck.report
    if not report.available:
        pytest.skip(report.note)
    assert report.spills == 0, str(report)
    assert report.stack_frame == 0, str(report)
    assert report.registers is not None and report.registers <= 255, str(report)


def test_full_row_limit_matches_the_largest_variant():
    assert ss.MAX_FULL_ROW_COLS == max(FULL_ROW_COLS)
    assert ss.MAX_ONE_WARP_COLS == max(ONE_WARP_COLS)


@pytest.mark.parametrize("cols,warps", [(1, 1), (4096, 1), (4097, 4), (8192, 4), (8193, 8), (16384, 8),
                                        (16385, 16), (32768, 16)])
def test_full_row_warps_at_the_boundaries(cols, warps):
    assert ss.full_row_warps(cols) == warps


def _values_per_lane(cols, warps):
    """What a lane holds: four values for each chunk of 128*warps columns the row starts."""
    return 4 * math.ceil(cols / (128 * warps))


def test_full_row_warps_is_the_fewest_that_keep_64_values_a_lane():
    for cols in range(ss.MAX_ONE_WARP_COLS + 1, ss.MAX_FULL_ROW_COLS + 1):
        w = ss.full_row_warps(cols)
        assert w in ss.WARPS_PER_ROW_CHOICES and w > 1, (cols, w)
        assert _values_per_lane(cols, w) <= ss.MAX_VALUES_PER_LANE, (cols, w)
        assert _values_per_lane(cols, w // 2) > ss.MAX_VALUES_PER_LANE, (cols, w)


@pytest.mark.parametrize("cols", [0, ss.MAX_FULL_ROW_COLS + 1])
def test_full_row_warps_rejects_widths_out_of_range(cols):
    with pytest.raises(ValueError, match=f"but got {cols}"):
        ss.full_row_warps(cols)


def test_full_row_kernel_rejects_warps_per_row_not_a_power_of_two():
    with pytest.raises(ValueError, match="WARPS_PER_ROW.*but got 3"):
        ss.full_row_kernel(ty.f32).compile(COLS=8192, VEC=4, WARPS_PER_ROW=3)


def test_streaming_ptx_uses_16_byte_loads_and_ex2():
    ptx = ss.streaming_kernel(ty.f32).compile(VEC=4).ptx
    assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", ptx), "expected a 16-byte vector load"
    assert re.search(r"st\.global\.v4\.(f32|b32)", ptx), "expected a 16-byte vector store"
    assert "ex2.approx" in ptx
    assert "shfl.sync.bfly" in ptx


def test_scalar_path_has_no_vector_access():
    ptx = ss.streaming_kernel(ty.f32).compile(VEC=1).ptx
    assert not re.search(r"\.v4\.", ptx)
    assert "ex2.approx" in ptx


def test_full_row_ptx_uses_16_byte_loads():
    ptx = ss.full_row_kernel(ty.f32).compile(COLS=1024, VEC=4).ptx
    assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", ptx)
    assert "bar.sync" not in ptx and ".shared" not in ptx  # one warp a row: shuffles only


def test_multi_warp_full_row_reduces_across_warps_through_shared_memory():
    ck = ss.full_row_kernel(ty.f32).compile(COLS=16384, VEC=4, WARPS_PER_ROW=8)
    assert ck.threads == 256
    ptx = ck.ptx
    assert len(re.findall(r"\bbar\.sync\b", ptx)) == 2  # one for the maximum, one for the sum
    assert len(re.findall(r"\bst\.shared\.", ptx)) == 2 and len(re.findall(r"\bld\.shared\.", ptx)) == 2
    assert len(re.findall(r"ld\.global(\.nc)?\.v4\.(f32|b32)", ptx)) == 16384 // (4 * 256)


LAUNCHERS = {"softmax_streaming": ss.softmax_streaming, "softmax_full_row": ss.softmax_full_row,
             "softmax_three_pass": ss.softmax_three_pass, "softmax": rs.softmax}


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_launchers_reject_bad_input_naming_the_argument(name):
    fn = LAUNCHERS[name]
    with pytest.raises(TypeError, match=r"\bx\b"):
        fn([[1.0, 2.0]])
    with pytest.raises(TypeError, match=r"\bx\b.*dtype"):
        fn(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\bx\b.*2-D"):
        fn(torch.zeros(6))
    with pytest.raises(ValueError, match=r"\bx\b.*CUDA"):
        fn(torch.zeros(2, 3))


@pytest.mark.parametrize("cols", [ss.MAX_FULL_ROW_COLS + 1, 65536 + 5, 100000])
def test_full_row_rejects_rows_no_block_can_hold(cols):
    # A 65536-column float32 row is 256 KiB, an SM's whole register file: softmax_streaming's job.
    with pytest.raises(ValueError, match="at most 32768 columns.*softmax_streaming"):
        ss.softmax_full_row(torch.zeros(2, cols))


# -- GPU tier: numerics against torch.softmax in float64 ------------------------------------------

# 4097 and up take full_row's multi-warp path: 4097 (4 warps, scalar, ragged), 8192 (4 warps),
# 8196 (8 warps, vector, ragged), 16384 (8), 20001 (16, scalar, ragged), 32768 (16). Wider rows
# than 32768 are beyond full_row (test_full_row_rejects_rows_no_block_can_hold).
WIDE = (4097, 8192, 8196, 16384, 20001, 32768, 65536 + 5, 100000)
WIDTHS = (1, 3, 31, 32, 33, 127, 128, 129, 1000, 4096) + WIDE
ROWS = 37  # not a multiple of the 4 rows per block: the last one-warp block has idle warps
KERNELS = {"streaming": ss.softmax_streaming, "full_row": ss.softmax_full_row,
           "three_pass": ss.softmax_three_pass, "row_softmax": rs.softmax}
MAX_COLS = {"full_row": ss.MAX_FULL_ROW_COLS}
TOL = {torch.float32: (1e-4, 1e-9), torch.float16: (1.5e-3, 1e-6), torch.bfloat16: (1e-2, 1e-6)}  # rtol, atol


def _cases(widths, kernels=KERNELS):
    return [(k, c) for k in kernels for c in widths if c <= MAX_COLS.get(k, math.inf)]


def _run(kernel: str, x):
    """The kernel's output written into a NaN-poisoned tensor, so an element never written shows."""
    out = torch.full_like(x, float("nan"))
    res = KERNELS[kernel](x, out=out)
    assert res is out
    torch.cuda.synchronize()
    return out


def _check(out, x):
    ref = torch.softmax(x.double(), dim=1)
    assert not out.isnan().any(), f"{int(out.isnan().sum())} of {out.numel()} elements were not written"
    rtol, atol = TOL[x.dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,cols", _cases(WIDTHS))
def test_random_rows_match_torch(kernel, cols):
    torch.manual_seed(cols)
    x = torch.randn(ROWS, cols, device="cuda") * 3
    _check(_run(kernel, x), x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("kernel,cols", _cases((33, 1000, 4096, 8192, 16388), ("streaming", "full_row", "three_pass")))
def test_half_inputs_match_torch(kernel, cols, dtype):
    torch.manual_seed(cols)
    x = (torch.randn(ROWS, cols, device="cuda") * 3).to(dtype)
    _check(_run(kernel, x), x)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,cols", _cases((4, 1000, 4096, 16384)))
def test_misaligned_rows_take_the_scalar_path(kernel, cols):
    # cols % 4 == 0, but the storage starts 4 bytes past a 16-byte boundary: VEC=4 is not allowed.
    torch.manual_seed(cols)
    flat = torch.randn(ROWS * cols + 1, device="cuda") * 3
    x = flat[1:].view(ROWS, cols)
    assert x.data_ptr() % 16 != 0
    _check(_run(kernel, x), x)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,cols", _cases((1, 129, 4096, 8196, 32768, 65536 + 5, 100000)))
def test_uniform_logits_give_uniform_probabilities(kernel, cols):
    x = torch.full((ROWS, cols), 7.25, device="cuda")
    out = _run(kernel, x)
    torch.testing.assert_close(out, torch.full_like(x, 1.0 / cols), rtol=1e-5, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [3e4, -3e4])
@pytest.mark.parametrize("kernel,cols", _cases((33, 1000, 4096, 16384, 20001, 65536 + 5, 100000)))
def test_large_logits_lose_no_accuracy(kernel, cols, offset):
    # Near +-3e4 the exp2 argument x*log2(e) - m*log2(e) must not pick up the rounding of x*log2(e).
    torch.manual_seed(cols)
    x = torch.randn(ROWS, cols, device="cuda") * 3 + offset
    _check(_run(kernel, x), x)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,cols", _cases((33, 1000, 4096, 16384)))
def test_logits_spread_over_plus_minus_3e4(kernel, cols):
    torch.manual_seed(cols)
    x = (torch.rand(ROWS, cols, device="cuda") * 2 - 1) * 3e4
    _check(_run(kernel, x), x)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,cols", _cases((1, 33, 1000, 4096, 8192, 20001, 65536 + 5, 100000)))
def test_masked_logits(kernel, cols):
    """-inf entries get zero weight; a row of only -inf is written as zeros (torch gives NaN)."""
    torch.manual_seed(cols)
    x = torch.randn(ROWS, cols, device="cuda") * 3
    x[0, :] = float("-inf")  # fully masked
    x[1, ::2] = float("-inf")  # half masked (for cols == 1 this masks the whole row too)
    x[2, 1:] = float("-inf")  # one survivor
    out = _run(kernel, x)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    ok = ~torch.isinf(x).all(dim=1)
    _check(out[ok], x[ok])
    assert torch.equal(out[~ok], torch.zeros_like(out[~ok]))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_empty_inputs_launch_nothing(kernel):
    for shape in ((0, 5), (5, 0)):
        x = torch.randn(*shape, device="cuda")
        assert KERNELS[kernel](x).shape == shape


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_out_must_not_overlap_x(kernel):
    x = torch.randn(8, 64, device="cuda")
    with pytest.raises(ValueError, match="overlap"):
        KERNELS[kernel](x, out=x)
