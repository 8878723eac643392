"""The reduction examples (RMSNorm, masked argmax, block scan, histogram): CPU tier in the emulator
against float64 torch/numpy on fresh random data with ragged sizes, input checks, PTX and ptxas;
GPU tier (marker ``gpu``) against torch on the device, with NaN-filled memory past every end
and bit-for-bit agreement with the emulator where the arithmetic is exact.
"""
import os

import pytest
import torch

from tylopy_kernels.examples import argmax
from tylopy_kernels.examples import block_scan
from tylopy_kernels.examples import histogram
from tylopy_kernels.examples import rmsnorm

EXAMPLES = os.path.dirname(rmsnorm.__file__)


def rel_err(got, ref) -> float:
    got, ref = got.double(), ref.double()
    return float(((got - ref).abs() / ref.abs().clamp_min(1e-3)).max())


# -- CPU tier: the emulator ----------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,n", [(5, 1), (6, 33), (9, 100)])
def test_rmsnorm_f32_and_bf16_in_the_emulator(rows, n):
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(rows, n, generator=g) * 4 + 1
    w = torch.rand(n, generator=g) + 0.5
    y = rmsnorm.rmsnorm(x, w, 1e-5, emulate=True)
    assert rel_err(y, rmsnorm.reference(x, w, 1e-5)) < 4e-6
    xb, wb = x.bfloat16(), w.bfloat16()
    yb = rmsnorm.rmsnorm(xb, wb, 1e-5, emulate=True)
    assert yb.dtype == torch.bfloat16 and rel_err(yb, rmsnorm.reference(xb, wb, 1e-5)) <= 2**-8 + 1e-6


@pytest.mark.parametrize("rows,n", [(7, 1), (9, 31), (11, 75)])
def test_masked_argmax_in_the_emulator(rows, n):
    g = torch.Generator().manual_seed(7 * rows + n)
    x = torch.randint(-5, 5, (rows, n), generator=g).float()  # many ties
    x[torch.rand(rows, n, generator=g) < 0.05] = float("nan")
    x[torch.rand(rows, n, generator=g) < 0.1] = float("-inf")
    mask = torch.rand(rows, n, generator=g) < 0.6
    mask[0] = False  # an empty row
    if n > 3:
        x[1] = float("-inf")  # a row of -inf: its first unmasked index
        mask[1] = True
        x[2, :] = 1.0
        x[2, n - 1] = float("nan")  # a NaN beats every number
        mask[2] = True
    got = argmax.masked_argmax(x, mask, emulate=True)
    assert got.tolist() == argmax.reference(x, mask).tolist()
    assert got[0] == -1
    unmasked = argmax.masked_argmax(x, None, emulate=True)
    assert unmasked.tolist() == argmax.reference(x, None).tolist()


@pytest.mark.parametrize("n", [1, 1000, 2 * block_scan.TILE + 5])
def test_prefix_sum_int32_is_exact_and_float32_close(n):
    g = torch.Generator().manual_seed(n)
    xi = torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32)
    assert torch.equal(block_scan.prefix_sum(xi, emulate=True), torch.cumsum(xi, 0).int())
    xf = torch.randn(n, generator=g)
    ref = torch.cumsum(xf.double(), 0)
    got = block_scan.prefix_sum(xf, emulate=True)
    assert float((got.double() - ref).abs().max()) <= 64 * 2**-24 * float(xf.abs().sum())


@pytest.mark.parametrize("n,nbins,blocks", [(1, 1, None), (3000, 300, 3), (2500, 4096, None)])
def test_histogram_in_the_emulator(n, nbins, blocks):
    g = torch.Generator().manual_seed(n + nbins)
    data = torch.randint(-10, nbins + 10, (n,), generator=g, dtype=torch.int32)
    got = histogram.histogram(data, nbins, blocks=blocks, emulate=True)
    inside = data[(data >= 0) & (data < nbins)].long()
    assert torch.equal(got, torch.bincount(inside, minlength=nbins).int())


@pytest.mark.parametrize("name", ["rmsnorm", "argmax", "block_scan", "histogram"])
def test_tylopy_emulate_runs_each_example(name, capsys):
    from tylopy.cli.emulate import cli_main
    assert cli_main([os.path.join(EXAMPLES, f"{name}.py")]) == 0, capsys.readouterr()


def test_launchers_name_the_bad_argument():
    x = torch.randn(4, 8)
    cases = [
        (lambda: rmsnorm.rmsnorm(x.double(), torch.ones(8).double(), emulate=True), "rmsnorm: x expects dtype"),
        (lambda: rmsnorm.rmsnorm(x, torch.ones(7), emulate=True), "rmsnorm: weight expects shape (8,)"),
        (lambda: rmsnorm.rmsnorm(x, torch.ones(8), eps=-1.0, emulate=True), "rmsnorm: eps expects a positive"),
        (lambda: rmsnorm.rmsnorm(x, torch.ones(8)), "rmsnorm: x expects a cuda tensor"),
        (lambda: argmax.masked_argmax(x, torch.ones(4, 8), emulate=True), "masked_argmax: mask expects a bool tensor"),
        (lambda: argmax.masked_argmax(x[:, ::2], None, emulate=True), "masked_argmax: x expects a contiguous 2-D"),
        (lambda: block_scan.prefix_sum(x, emulate=True), "prefix_sum: x expects a contiguous 1-D"),
        (lambda: histogram.histogram(torch.zeros(5, dtype=torch.int32), 0, emulate=True),
         "histogram: nbins expects an int in 1..12288"),
        (lambda: histogram.histogram(torch.zeros(5), 4, emulate=True),
         "histogram: data expects a contiguous 1-D int32"),
    ]
    for call, text in cases:
        with pytest.raises((ValueError, TypeError)) as e:
            call()
        assert text in str(e.value), (text, str(e.value))


def _ptx(kernel, arch, **cx) -> str:
    ptx = kernel.with_arch(arch).compile(**cx).ptx  # compile runs ptxas
    return "\n".join(line for line in ptx.splitlines() if not line.strip().startswith("//"))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_examples_use_the_primitives_and_assemble(arch):
    assert "shfl.sync.bfly.b32" in _ptx(rmsnorm.rmsnorm_f32, arch)
    assert "shfl.sync.bfly.b32" in _ptx(rmsnorm.rmsnorm_bf16, arch)
    ptx = _ptx(argmax.masked_argmax_rows, arch)
    assert "vote.sync.any.pred" in ptx and "redux.sync.min.s32" in ptx and "shfl.sync.bfly.b32" in ptx
    assert "shfl.sync.up.b32" in _ptx(block_scan.scan_tiles_f32, arch) and "bar.sync" in _ptx(block_scan.scan_tiles_i32,
                                                                                                arch)
    _ptx(block_scan.add_tile_offsets_f32, arch)
    ptx = _ptx(histogram.histogram_kernel, arch, NBINS=300)
    assert "red.relaxed.cta.shared.add.s32" in ptx and "red.global.add.s32" in ptx


def test_examples_use_only_public_names():
    for mod in (rmsnorm, argmax, block_scan, histogram):
        src = open(mod.__file__).read()
        assert "tylopy.language" not in src and "tylopy.jit" not in src and "tylopy.ir" not in src and "inline_ptx" not in src
        assert mod.__doc__ and "Algorithm" in mod.__doc__ and "Run it" in mod.__doc__


# -- GPU tier --------------------------------------------------------------------------------------------------

def padded(t: torch.Tensor, extra: int = 97) -> torch.Tensor:
    """``t`` on the GPU inside a larger buffer whose tail is NaN (or a sentinel for integers)."""
    fill = float("nan") if t.dtype.is_floating_point else -12345
    buf = torch.full((t.numel() + extra,), fill, dtype=t.dtype, device="cuda")
    buf[:t.numel()] = t.reshape(-1).cuda()
    return buf[:t.numel()].view(t.shape)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,n", [(1000, 4096), (37, 77), (3, 1)])
def test_gpu_rmsnorm_against_torch(dtype, rows, n):
    torch.manual_seed(rows + n)
    x = (torch.randn(rows, n, dtype=torch.float64) * 3 + 0.5).to(dtype)
    w = (torch.rand(n, dtype=torch.float64) + 0.5).to(dtype)
    y = rmsnorm.rmsnorm(padded(x), padded(w), 1e-6)
    ref = rmsnorm.reference(x, w, 1e-6)
    bound = 4e-6 if dtype == torch.float32 else 2**-8 + 1e-6
    assert rel_err(y.cpu(), ref) <= bound
    if rows * n <= 4096:  # exact f32 arithmetic in a fixed order: the emulator agrees bit for bit
        assert torch.equal(y.cpu().view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                           rmsnorm.rmsnorm(x, w, 1e-6, emulate=True).view(torch.int16 if dtype == torch.bfloat16
                                                                         else torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("rows,n", [(4096, 1000), (33, 75), (5, 1)])
def test_gpu_masked_argmax_against_the_rules(rows, n):
    torch.manual_seed(rows * n)
    x = torch.randint(-50, 50, (rows, n)).float()
    x[torch.rand(rows, n) < 0.01] = float("nan")
    mask = torch.rand(rows, n) < 0.8
    mask[0] = False
    got = argmax.masked_argmax(padded(x), padded(mask)).cpu()
    assert got.tolist() == argmax.reference(x, mask).tolist()
    clean = torch.randn(rows, n)  # distinct values, no mask: torch.argmax's answer
    assert torch.equal(argmax.masked_argmax(padded(clean)).cpu().long(), clean.argmax(dim=1))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 1023, 1024 * 1024 + 3, 3 * 1024 * 1024 + 17])
def test_gpu_prefix_sum_against_torch(n):
    torch.manual_seed(n)
    xi = torch.randint(-100, 100, (n,), dtype=torch.int32)
    assert torch.equal(block_scan.prefix_sum(padded(xi)).cpu(), torch.cumsum(xi, 0).int())
    xf = torch.randn(n)
    got = block_scan.prefix_sum(padded(xf)).cpu()
    ref = torch.cumsum(xf.double(), 0)
    levels = 1 + (n > block_scan.TILE) + (n > block_scan.TILE ** 2)
    assert float((got.double() - ref).abs().max()) <= 32 * levels * 2**-24 * float(xf.abs().sum())
    if n <= 3 * block_scan.TILE:
        assert torch.equal(got.view(torch.int32), block_scan.prefix_sum(xf, emulate=True).view(torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("n,nbins", [(10_000_000, 256), (123_457, 12288), (7, 1)])
def test_gpu_histogram_against_torch(n, nbins):
    torch.manual_seed(n)
    data = torch.randint(-3, nbins + 3, (n,), dtype=torch.int32)
    got = histogram.histogram(padded(data), nbins).cpu()
    inside = data[(data >= 0) & (data < nbins)].long()
    assert torch.equal(got, torch.bincount(inside, minlength=nbins).int())
