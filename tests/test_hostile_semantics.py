"""Integer semantics the review found undefined, now defined once (tylopy/language/proxy.py) and
shared by codegen, the emulator and the GPU:

* ``//`` and ``%`` on run-time values truncate toward zero (C, PTX): ``-7 // 2 == -3``,
  ``-7 % 2 == -1``; compile-time Python ints keep Python's floor semantics (``-7 // 2 == -4``)
  because they are evaluated by Python while tracing;
* a run-time division by zero gives all ones (``%`` gives the dividend); ``MIN // -1`` wraps;
* a run-time shift by the width or more gives 0 (an arithmetic right shift of a negative value
  gives -1); a negative run-time amount counts as a huge unsigned one;
* the same with compile-time operands is an error (tests/test_hostile_frontend.py).

The emulator is checked here against a Python model of those rules; the GPU test checks that
the device computes exactly what the emulator computes.
"""
import numpy as np
import pytest

import kernels_hostile as H

T = 32
I32_MIN = -2**31


def operands(seed: int):
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, T).astype(np.int32)
    b = rng.integers(-40, 40, T).astype(np.int32)
    a[:6] = [-7, 7, -7, I32_MIN, 5, -5]
    b[:6] = [2, -2, 0, -1, 32, 33]
    b[6:9] = [0, 31, -1]
    return a, b


def trunc_div(x: int, y: int, bits=32, signed=True) -> int:
    if y == 0:
        return -1 if signed else (1 << bits) - 1
    q = abs(x) // abs(y)
    q = q if (x < 0) == (y < 0) else -q
    return wrap(q, bits, signed)


def trunc_rem(x: int, y: int, bits=32, signed=True) -> int:
    if y == 0:
        return x
    return wrap(x - trunc_div(x, y, bits, signed) * y, bits, signed)


def wrap(v: int, bits=32, signed=True) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def shift(x: int, y: int, left: bool, signed=True) -> int:
    amount = y & 0xFFFFFFFF  # the amount counts as unsigned
    if amount >= 32:
        return -1 if (not left and signed and x < 0) else 0
    return wrap(x << amount, 32, signed) if left else (x >> amount if signed else (x & 0xFFFFFFFF) >> amount)


def model(a, b):
    out = np.zeros(T * 6, np.int64)
    u = np.zeros(T * 3, np.int64)
    for t in range(T):
        x, y = int(a[t]), int(b[t])
        out[t * 6:t * 6 + 6] = [trunc_div(x, y), trunc_rem(x, y), shift(x, y, True), shift(x, y, False), -3, -1]
        ux, uy = x & 0xFFFFFFFF, y & 0xFFFFFFFF
        u[t * 3:t * 3 + 3] = [trunc_div(ux, uy, signed=False), trunc_rem(ux, uy, signed=False),
                              shift(ux, uy, False, signed=False)]
    return out.astype(np.int32), u.astype(np.uint32)


def emulate(a, b):
    out = np.full(T * 6, 12345, np.int32)
    u = np.full(T * 3, 12345, np.uint32)
    H.runtime_integer_ops.emulate(a, b, out, u, grid=1)
    return out, u


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_emulator_follows_the_documented_integer_semantics(seed):
    a, b = operands(seed)
    out, u = emulate(a, b)
    want_out, want_u = model(a, b)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(u, want_u)


def test_the_documented_examples():
    a, b = operands(0)
    out, _ = emulate(a, b)
    assert out[0] == -3 and out[1] == -1            # -7 // 2, -7 % 2
    assert out[2 * 6] == -1 and out[2 * 6 + 1] == -7  # -7 // 0 gives all ones, -7 % 0 the dividend
    assert out[3 * 6] == I32_MIN                     # MIN // -1 wraps
    assert out[4 * 6 + 2] == 0 and out[5 * 6 + 3] == -1  # 5 << 32, -5 >> 33


def test_compile_time_python_ints_keep_python_semantics():
    assert -7 // 2 == -4  # evaluated by Python while tracing: documented, not a kernel operation


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1])
def test_device_computes_what_the_emulator_computes(seed):
    import torch
    from conftest import for_this_gpu
    a, b = operands(seed)
    out_e, u_e = emulate(a, b)
    k = for_this_gpu(H.runtime_integer_ops)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    out = torch.full((T * 6,), 12345, dtype=torch.int32, device="cuda")
    u = torch.full((T * 3,), 12345, dtype=torch.int32, device="cuda")
    k[1](ta, tb, out, u.view(torch.uint32) if hasattr(torch, "uint32") else u)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), out_e)
    np.testing.assert_array_equal(u.cpu().numpy().view(np.uint32), u_e)
