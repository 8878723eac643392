"""Control flow under run-time conditions: break, continue, return (in kernels and @ty.func),
negative and run-time range steps, element assignment into lists and dicts inside run-time
loops. Each kernel runs in the emulator against the same loop in plain Python, with rows that
make lanes take different paths; the PTX of each also goes through LLVM and ptxas."""
import os
import re

import numpy as np
import pytest

import tylopy as ty
from tylopy.errors import KernelSourceError

import kernels_control_flow as K

T = 32


def line_of(marker: str) -> int:
    with open(K.__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# <- {marker}"):
                return n
    raise LookupError(marker)


def rows(n, seed, negative=0.3):
    """T rows of n floats in (0.5, 1.5), some negative, never zero (fresh per test)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 1.5, size=(T, n)).astype(np.float32)
    x[rng.random((T, n)) < negative] *= -1
    return x


def test_negative_step_with_runtime_start():
    out = np.full(T, -7, np.int32)
    K.reverse_walk.emulate(out, 5, grid=1)
    for t in range(T):
        h = 0
        for i in range(5 - 1 + t % 3, -1, -1):
            h = (h * 3 + i) & 0xFFFFFFFF
        assert out[t] == np.int32(np.uint32(h)), t


@pytest.mark.parametrize("lo, hi, step", [(0, 9, 2), (20, 3, -3), (5, 5, 1), (0, 7, -1), (3, 40, 7)])
def test_runtime_step_sign_decides_the_comparison(lo, hi, step):
    out = np.full(T, -7, np.int32)
    K.runtime_step.emulate(out, lo, hi, step, grid=1)
    for t in range(T):
        h = 0
        for i in range(lo, hi + t, step):
            h = (h * 5 + i) & 0xFFFFFFFF
        assert out[t] == np.int32(np.uint32(h)), (t, lo, hi, step)


def test_runtime_zero_step_runs_nothing():
    out = np.full(T, -7, np.int32)
    K.zero_runtime_step.emulate(out, 0, grid=1)
    assert (out == 0).all()


def test_break_in_runtime_loop():
    n = 9
    x, out = rows(n, 1), np.full(T, np.nan, np.float32)
    K.sum_until_negative.emulate(x.ravel(), out, n, grid=1)
    want = []
    for r in x:
        acc = np.float32(0)
        for v in r:
            if v < 0:
                break
            acc = np.float32(acc + v)
        want.append(acc)
    np.testing.assert_array_equal(out, np.array(want, np.float32))


def test_continue_in_runtime_loop():
    n = 9
    x, out = rows(n, 2), np.full(T, np.nan, np.float32)
    K.sum_skipping_negative.emulate(x.ravel(), out, n, grid=1)
    want = []
    for r in x:
        acc, count = np.float32(0), 0
        for v in r:
            if v < 0:
                continue
            acc, count = np.float32(acc + v), count + 1
        want.append(np.float32(acc + np.float32(count) * np.float32(1000)))
    np.testing.assert_array_equal(out, np.array(want, np.float32))


def first_negative_index(r):
    return next((k for k, v in enumerate(r) if v < 0), len(r))


def test_while_true_with_runtime_break():
    n = 7
    x, out = rows(n, 3), np.full(T, -7, np.int32)
    K.while_true_break.emulate(x.ravel(), out, n, grid=1)
    assert out.tolist() == [first_negative_index(r) for r in x]


def test_early_return_from_a_kernel():
    x, out = rows(1, 4).ravel(), np.full(T, np.nan, np.float32)
    K.early_exit.emulate(x, out, 20, grid=1)
    np.testing.assert_array_equal(out[:20], x[:20] * 2)
    assert np.isnan(out[20:]).all()  # lanes past n returned before the store


def test_func_returns_from_runtime_branches_and_loops():
    n = 6
    x = rows(n, 5)
    x[3, 0] = 0.0  # clamp_sign's third path
    out, idx = np.full(T, np.nan, np.float32), np.full(T, -7, np.int32)
    K.func_returns.emulate(x.ravel(), out, idx, n, grid=1)
    assert idx.tolist() == [next((k for k, v in enumerate(r) if v < 0), -1) for r in x]
    np.testing.assert_array_equal(out, np.sign(x[:, 0]))


def test_list_element_assignment_in_runtime_loop():
    n = 5
    x = rows(4 * n, 6) * 2  # some values below -1.5
    out = np.full(T * 4, np.nan, np.float32)
    K.list_accumulate.emulate(x.ravel(), out, n, grid=1)
    blocks = x.reshape(T, n, 4)
    for t in range(T):
        acc = [np.float32(0)] * 4
        for k in range(n):
            for j in range(4):
                acc[j] = np.float32(acc[j] + blocks[t, k, j])
            if blocks[t, k, 0] < -1.5:
                acc[0] = np.float32(acc[0] + np.float32(100))
        np.testing.assert_array_equal(out[t * 4:t * 4 + 4], np.array(acc, np.float32))


def test_dict_element_assignment_in_runtime_loop():
    n = 6
    x, out = rows(n, 7), np.full(T * 2, np.nan, np.float32)
    K.dict_accumulate.emulate(x.ravel(), out, n, grid=1)
    for t, r in enumerate(x):
        pos, neg = np.float32(0), np.float32(0)
        for v in r:
            if v < 0:
                neg = np.float32(neg + v)
            else:
                pos = np.float32(pos + v)
        assert (out[2 * t], out[2 * t + 1]) == (pos, neg)


def test_break_leaves_only_the_inner_loop():
    n = 5
    x, out = rows(4 * n, 8), np.full(T, -7, np.int32)
    K.nested_break.emulate(x.ravel(), out, n, grid=1)
    rr = x.reshape(T, 4, n)
    for t in range(T):
        total = 0
        for r in range(4):
            total += first_negative_index(rr[t, r])
            total *= 16
        assert out[t] == total


def test_for_else_runs_when_the_loop_did_not_break():
    n = 4
    x, out = rows(n, 9), np.full(T, -7, np.int32)
    K.for_else.emulate(x.ravel(), out, n, grid=1)
    assert out.tolist() == [k if k < n else 1000 for k in (first_negative_index(r) for r in x)]


def test_unrolled_loop_with_runtime_break():
    x, out = rows(K.W, 10), np.full(T, np.nan, np.float32)
    K.unrolled_break.emulate(x.ravel(), out, grid=1)
    want = []
    for r in x:
        acc = np.float32(0)
        for v in r:
            if v < 0:
                break
            acc = np.float32(acc + v)
        want.append(acc)
    np.testing.assert_array_equal(out, np.array(want, np.float32))


def test_compile_time_jumps_keep_python_meaning():
    out = np.full(T, -7, np.int32)
    K.compile_time_jumps.emulate(out, grid=1)
    assert (out == 0 + 1 + 3 + 4 + 5).all()
    text = ty.ir.format_ir(K.compile_time_jumps.trace())
    assert " if(" not in text and " while(" not in text and " for(" not in text


def test_pointer_returned_from_a_runtime_branch():
    x, y = np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32)
    K.pointer_return.emulate(x, y, 1, grid=1)
    assert x[0] == 1.0 and np.isnan(y[0])
    K.pointer_return.emulate(x, y, 0, grid=1)
    assert y[0] == 1.0


COMPILED = ["reverse_walk", "runtime_step", "sum_until_negative", "sum_skipping_negative", "while_true_break",
            "early_exit", "func_returns", "list_accumulate", "dict_accumulate", "nested_break", "for_else",
            "unrolled_break", "pointer_return", "return_inside_loop", "tuple_returns", "while_else"]


@pytest.mark.parametrize("name", COMPILED)
def test_control_flow_kernels_assemble(name, no_disk_cache):
    ck = getattr(K, name).with_arch("sm_80").compile()
    assert ck.report.spill_stores == 0 and f".entry {name}" in ck.ptx


def test_break_loop_is_a_while_in_the_ir():
    text = ty.ir.format_ir(K.sum_until_negative.trace())
    assert " while(" in text and " for(" not in text


# -- errors at the user's line --------------------------------------------------------------------

def points_at(err, marker):
    assert err.loc is not None and os.path.samefile(err.loc.filename, K.__file__), str(err)
    assert err.loc.lineno == line_of(marker), str(err)


@pytest.mark.parametrize("name, marker, message", [
    ("bad_zero_step", "zero_step", r"range step expects a non-zero value, but got 0"),
    ("bad_falls_off", "falls_off", r"returns a value on some paths, but on others it reaches its end"),
    ("bad_return_in_try", "try_return", r"return, break and continue inside try are not supported"),
    ("bad_float_then_int", "float_then_int", r"'m' is the Python float 0\.0 on one path and a i32 value"),
    ("bad_runtime_assert", "runtime_assert", r"assert needs a compile-time condition"),
    ("bad_runtime_range_in_comprehension", "comprehension", r"can only drive a for statement"),
    ("bad_chained_comparison", "chained", r"a chained comparison"),
])
def test_control_flow_errors(name, marker, message):
    with pytest.raises(KernelSourceError) as info:
        getattr(K, name).trace()
    assert re.search(message, str(info.value)), str(info.value)
    points_at(info.value, marker)


def test_compile_time_assert_keeps_python_meaning():
    K.compile_time_assert.trace()
    with pytest.raises(AssertionError, match="N must be even") as info:
        K.compile_time_assert.trace(N=3)
    assert info.value.loc.lineno == line_of("ct_assert")


def test_return_from_inside_a_runtime_loop_of_a_kernel():
    n = 6
    x = rows(n, 11)
    got = x.copy().ravel()
    K.return_inside_loop.emulate(got, n, grid=1)
    want = x.copy()
    for r in want:
        for k in range(n):
            if r[k] < 0:
                break
            r[k] = 0.0
    np.testing.assert_array_equal(got.reshape(T, n), want)


def test_func_returns_a_tuple_from_runtime_branches():
    x = rows(2, 12).ravel()
    out = np.full(2 * T, np.nan, np.float32)
    K.tuple_returns.emulate(x, out, grid=1)
    pairs = x.reshape(T, 2)
    np.testing.assert_array_equal(out.reshape(T, 2), np.sort(pairs, axis=1))


def test_while_else_runs_when_the_loop_did_not_break():
    n = 4
    x, out = rows(n, 13), np.full(T, -7, np.int32)
    K.while_else.emulate(x.ravel(), out, n, grid=1)
    assert out.tolist() == [k if k < n else -1 for k in (first_negative_index(r) for r in x)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sum_until_negative", "sum_skipping_negative", "while_true_break", "nested_break",
                                  "return_inside_loop"])
def test_device_runs_the_control_flow_the_emulator_runs(name):
    """The same kernel and data on the GPU and in the emulator give identical memory."""
    import torch
    from conftest import for_this_gpu
    n = 7
    x = rows(4 * n, 21)
    kernel = getattr(K, name)
    n_params = len(kernel.runtime_params)
    ints = np.full(T, -7, np.int32)
    floats = np.full(T, np.nan, np.float32)
    out = ints if name in ("while_true_break", "nested_break") else floats
    args = [x.ravel().copy()] + ([out.copy()] if n_params == 3 else []) + [n]
    kernel.emulate(*args, grid=1)
    dev = [torch.from_numpy(a.copy()).cuda() if isinstance(a, np.ndarray) else a
           for a in ([x.ravel()] + ([out] if n_params == 3 else []) + [n])]
    for_this_gpu(kernel)[(1,)](*dev)
    torch.cuda.synchronize()
    for emulated, device in zip(args, dev):
        if isinstance(emulated, np.ndarray):
            np.testing.assert_array_equal(device.cpu().numpy(), emulated)
