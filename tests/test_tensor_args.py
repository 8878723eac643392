"""Tensor parameters (``ty.tensor``): pointer, shape and strides from a torch tensor, indexing
through the strides, dtype-open kernels specialized per argument dtype, the ``contiguous``,
``noalias`` and ``index`` options, and the checks at launch. Run in the emulator (CPU tensors,
non-contiguous views included) and, as GPU tests, on the device against torch."""
import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.errors import KernelSourceError, LaunchTypeError, LaunchValueError
from tylopy.language.tensor import TensorSpec, check_index_range
from tylopy.ir import format_ir

THREADS = 64
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@ty.kernel(threads=THREADS)
def scale_rows(x: ty.tensor(2), out: ty.tensor(2), s: ty.f32):
    """out[r, c] = x[r, c] * s * (r + 1), one block per row; any dtype, any strides."""
    r = ty.block_idx()
    factor = s * ty.cast(r + 1, ty.f32)
    for c in range(ty.thread_idx(), x.shape[1], THREADS):
        out[r, c] = ty.cast(ty.cast(x[r, c], ty.f32) * factor, out.dtype)


@ty.kernel(threads=THREADS)
def row_sums(x: ty.tensor(ty.f32, 2, contiguous=True), out: ty.ptr(ty.f32)):
    """A fixed-dtype, contiguous tensor next to a pointer parameter."""
    r = ty.block_idx()
    if ty.thread_idx() == 0:
        acc = 0.0
        for c in range(x.shape[1]):
            acc = acc + x[r, c]
        out[r] = acc


@ty.kernel(threads=32)
def strides_out(x: ty.tensor(3, index=ty.i64, noalias=True), out: ty.ptr(ty.i64)):
    """Writes the shape, the strides and the address offset of element (1, 1, 1)."""
    if ty.thread_idx() == 0:
        for k in range(3):
            out[k] = x.shape[k]
            out[3 + k] = x.stride[k]
        out[6] = ty.cast(ty.address(x.address((1, 1, 1))) - ty.address(x.ptr), ty.i64)


def fresh_random(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * 4 - 2).to(dtype)


def scale_rows_reference(x, s):
    rows = torch.arange(1, x.shape[0] + 1, dtype=torch.float32, device=x.device)[:, None]
    return (x.float() * (s * rows)).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_emulated_tensor_kernel_any_dtype_any_strides(dtype, layout):
    base = fresh_random((9, 70), dtype, seed=hash((str(dtype), layout)) % 1000)
    x = {"contiguous": base, "transposed": base.t().contiguous().t(), "sliced": base[:, ::2]}[layout]
    storage = torch.full((x.shape[0] * 3, x.shape[1] * 2), float("nan"), dtype=dtype)
    out = storage[::3, 1::2]  # a strided output view; the rest of its storage must stay NaN
    scale_rows.emulate(x, out, 0.75, grid=x.shape[0])
    torch.testing.assert_close(out, scale_rows_reference(x, 0.75), rtol=0, atol=0)
    untouched = storage.clone()
    untouched[::3, 1::2] = 0
    assert torch.isnan(untouched).sum() == storage.numel() - out.numel()


def test_open_dtype_specializes_per_dtype(no_disk_cache):
    keys = {}
    for name in ("f32", "f16", "bf16"):
        dt = getattr(ty, name)
        ck = scale_rows.with_arch("sm_80").compile(x=dt, out=dt)
        keys[name] = ck.cache_key
        assert ck.params[0] == ("x", TensorSpec(dt, 2))
    assert len(set(keys.values())) == 3
    assert "x" in scale_rows.constexpr_names and "out" in scale_rows.constexpr_names


def test_open_dtype_needs_a_dtype_to_compile():
    with pytest.raises(LaunchTypeError, match="tensor parameter 'x' takes its dtype from the argument; to compile "
                                              "without arguments pass x=ty.f32"):
        scale_rows.compile(out=ty.f32)
    with pytest.raises(LaunchTypeError, match="expects a dtype such as ty.f32"):
        scale_rows.compile(x="nonsense", out=ty.f32)
    assert scale_rows.trace(x=torch.bfloat16, out="float16")  # torch dtypes and names are accepted


def test_fixed_dtype_contiguous_tensor_and_pointer():
    x = fresh_random((5, 37), torch.float32, seed=3)
    out = torch.full((5,), float("nan"))
    row_sums.emulate(x, out, grid=5)
    want = torch.tensor([sum(float(v) for v in row) for row in x.double()], dtype=torch.float64)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    text = format_ir(row_sums.trace())
    assert "x.stride1" not in text and "x.stride0" in text  # the last stride is the constant 1


def test_contiguous_tensor_rejects_a_transposed_view():
    x = fresh_random((37, 5), torch.float32, seed=4).t()
    with pytest.raises(LaunchValueError, match="argument 'x' is declared contiguous=True, but its last stride is 5"):
        row_sums.emulate(x, torch.zeros(5), grid=5)


def test_wrong_dtype_and_rank_name_the_argument():
    with pytest.raises(LaunchTypeError, match="row_sums: argument 'x' expects dtype"):
        row_sums.emulate(torch.zeros(5, 3, dtype=torch.float16), torch.zeros(5), grid=5)
    with pytest.raises(LaunchValueError, match="argument 'x' expects a 2-D tensor, but got shape"):
        row_sums.emulate(torch.zeros(5), torch.zeros(5), grid=5)


def test_i64_index_noalias_shape_and_strides():
    x = torch.zeros(4, 6, 5)[:, ::2, 1:]  # shape (4, 3, 4), strides (30, 10, 1)
    out = torch.zeros(7, dtype=torch.int64)
    strides_out.emulate(x, out, grid=1)
    assert out.tolist() == [4, 3, 4, 30, 10, 1, 4 * (30 + 10 + 1)]
    kir = strides_out.trace(x=ty.f32)
    assert [(p.name, str(p.type), p.noalias) for p in kir.params[:3]] == [
        ("x", "ptr<f32, global>", True), ("x.shape0", "i64", False), ("x.shape1", "i64", False)]


def test_32_bit_index_range_is_checked():
    spec = TensorSpec(ty.f32, 2)
    check_index_range("k", "x", spec, (2, 2**30), (2**30, 1))  # 2**31 - 1 elements: fits
    with pytest.raises(LaunchValueError, match="more than 32-bit indexing reaches; declare it ty.tensor"):
        check_index_range("k", "x", spec, (3, 2**30), (2**30, 1))
    check_index_range("k", "x", TensorSpec(ty.f32, 2, index=ty.i64), (3, 2**30), (2**30, 1))


@ty.kernel(threads=32)
def bad_rank(x: ty.tensor(ty.f32, 2)):
    x[0] = 1.0  # <- rank


@ty.kernel(threads=32)
def bad_index(x: ty.tensor(ty.f32, 1)):
    x[x[0]] = 1.0  # <- float_index


@pytest.mark.parametrize("kernel, message", [
    (bad_rank, "tensor 'x' has 2 dimension(s), but is indexed with 1"),
    (bad_index, "tensor 'x' index 0 expects an integer, but got a f32 value"),
])
def test_indexing_mistakes_are_located(kernel, message):
    with pytest.raises(KernelSourceError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        kernel.trace()
    assert info.value.loc.function == kernel.name


@pytest.mark.parametrize("args, message", [
    ((2, 3, 4), "ty.tensor expects (ndim) or (dtype, ndim)"), ((0,), "ndim expects an int in 1..8"),
    ((ty.i1, 2), "dtype expects a scalar type"),
])
def test_bad_annotations(args, message):
    with pytest.raises((TypeError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        ty.tensor(*args)


def test_dump_a_dtype_open_kernel(capsys, tmp_path):
    from tylopy import cli
    f = tmp_path / "open_kernel.py"
    f.write_text("import tylopy as ty\n\n\n@ty.kernel(threads=32)\ndef copy(x: ty.tensor(1), y: ty.tensor(1)):\n"
                 "    y[ty.thread_idx()] = x[ty.thread_idx()]\n")
    assert cli.main(["dump", str(f), "-D", "x=bf16", "-D", "y=bf16", "--no-report"]) == 0
    ptx = capsys.readouterr().out
    assert ".entry copy" in ptx and ("ld.global.b16" in ptx or "ld.global.u16" in ptx), ptx


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_kernel_on_the_gpu(dtype):
    from conftest import for_this_gpu
    k = for_this_gpu(scale_rows)
    base = fresh_random((33, 300), dtype, seed=7).cuda()
    x = base[:, 1::2]
    storage = torch.full((33 * 2, 300), float("nan"), dtype=dtype, device="cuda")
    out = storage[::2, :150]
    k[(33,)](x, out, 1.25)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, scale_rows_reference(x, 1.25), rtol=0, atol=0)
    assert torch.isnan(storage[1::2]).all()


@pytest.mark.gpu
def test_tensor_map_cache_keeps_no_tensor_alive():
    import gc
    import weakref
    from tylopy.runtime import tensormap
    q = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16, device="cuda")
    ref = weakref.ref(q)
    ty.attention(q, q.clone(), q.clone())
    torch.cuda.synchronize()
    del q
    gc.collect()
    assert ref() is None and tensormap._cache  # maps are cached, the tensors are not kept


def test_string_annotations_are_evaluated_where_the_kernel_is_defined():
    """``from __future__ import annotations`` turns every annotation into text; the decorator
    evaluates it in the kernel's module and closure."""
    import kernels_future_annotations as m
    src = torch.randn(3, 40)
    dst = torch.full_like(src, float("nan"))
    m.copy_rows.emulate(src, dst, grid=3, SCALE=2)
    torch.testing.assert_close(dst, src * 2)
    x = torch.randn(32)
    m.make_scaled(ty.f32).emulate(x.clone(), 32, grid=1)
    assert m.make_scaled(ty.f32).signature[0][1] == ty.ptr(ty.f32)
    # a copy for another target keeps the evaluated annotations (the factory's locals are gone by then)
    other = m.make_scaled(ty.f16).with_arch("sm_80")
    assert other.signature[0][1] == ty.ptr(ty.f16) and other.arch == "sm_80"


def test_a_string_annotation_that_does_not_evaluate_names_the_parameter():
    def k(x: "ty.ptr(ty.f33)"):  # noqa: F821
        pass
    with pytest.raises(KernelSourceError, match=r"parameter 'x': its annotation 'ty.ptr\(ty.f33\)' could not be "
                                                r"evaluated \(AttributeError"):
        ty.kernel(threads=32)(k)
