"""Kernels that use break, continue, return, negative and run-time steps and list element
assignment under run-time conditions; tests/test_frontend_control_flow.py runs them in the
emulator against Python. Each thread works on its own row, so lanes take different paths.
``# <- name`` marks the line an error must point at.
"""
import tylopy as ty

W = 8  # the row length each thread reads


@ty.kernel(threads=32)
def reverse_walk(out: ty.ptr(ty.i32), n: ty.i32):
    """out[t] = the indices n-1, n-2, ..., 0 folded into a position-sensitive hash."""
    t = ty.thread_idx()
    h = 0
    for i in range(n - 1 + t % 3, -1, -1):
        h = h * 3 + i
    out[t] = h


@ty.kernel(threads=32)
def runtime_step(out: ty.ptr(ty.i32), lo: ty.i32, hi: ty.i32, step: ty.i32):
    t = ty.thread_idx()
    h = 0
    for i in range(lo, hi + t, step):
        h = h * 5 + i
    out[t] = h


@ty.kernel(threads=32)
def sum_until_negative(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    t = ty.thread_idx()
    acc = 0.0
    for k in range(n):
        v = x[t * n + k]
        if v < 0.0:
            break
        acc = acc + v
    out[t] = acc


@ty.kernel(threads=32)
def sum_skipping_negative(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    t = ty.thread_idx()
    acc = 0.0
    count = 0
    for k in range(n):
        v = x[t * n + k]
        if v < 0.0:
            continue
        acc = acc + v
        count = count + 1
    out[t] = acc + ty.cast(count, ty.f32) * 1000.0


@ty.kernel(threads=32)
def while_true_break(x: ty.ptr(ty.f32), out: ty.ptr(ty.i32), n: ty.i32):
    """The index of the first negative element of the row (n if none)."""
    t = ty.thread_idx()
    k = 0
    while True:
        if k >= n:
            break
        if x[t * n + k] < 0.0:
            break
        k += 1
    out[t] = k


@ty.kernel(threads=32)
def early_exit(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    t = ty.thread_idx()
    if t >= n:
        return
    out[t] = x[t] * 2.0


@ty.func
def first_negative(row, n):
    for k in range(n):
        if row[k] < 0.0:
            return k
    return -1


@ty.func
def clamp_sign(v):
    if v < 0.0:
        return -1.0
    elif v > 0.0:
        return 1.0
    return 0.0


@ty.kernel(threads=32)
def func_returns(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), idx: ty.ptr(ty.i32), n: ty.i32):
    t = ty.thread_idx()
    idx[t] = first_negative(x + t * n, n)
    out[t] = clamp_sign(x[t * n])


@ty.kernel(threads=32)
def list_accumulate(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    """Column sums of a row-major (n x 4) block per thread, kept in a Python list."""
    t = ty.thread_idx()
    acc = [0.0, 0.0, 0.0, 0.0]
    for k in range(n):
        for j in range(4):
            acc[j] = acc[j] + x[(t * n + k) * 4 + j]
        if x[(t * n + k) * 4] < -1.5:
            acc[0] += 100.0
    for j in range(4):
        out[t * 4 + j] = acc[j]


@ty.kernel(threads=32)
def dict_accumulate(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    t = ty.thread_idx()
    acc = {"pos": 0.0, "neg": 0.0}
    for k in range(n):
        v = x[t * n + k]
        if v < 0.0:
            acc["neg"] = acc["neg"] + v
        else:
            acc["pos"] = acc["pos"] + v
    out[t * 2] = acc["pos"]
    out[t * 2 + 1] = acc["neg"]


@ty.kernel(threads=32)
def nested_break(x: ty.ptr(ty.f32), out: ty.ptr(ty.i32), n: ty.i32):
    """For each row r (W rows per thread): count leading non-negatives; inner break only."""
    t = ty.thread_idx()
    total = 0
    for r in range(4):
        for k in range(n):
            if x[(t * 4 + r) * n + k] < 0.0:
                break
            total += 1
        total = total * 16
    out[t] = total


@ty.kernel(threads=32)
def for_else(x: ty.ptr(ty.f32), out: ty.ptr(ty.i32), n: ty.i32):
    t = ty.thread_idx()
    found = -1
    for k in range(n):
        if x[t * n + k] < 0.0:
            found = k
            break
    else:
        found = 1000
    out[t] = found


@ty.kernel(threads=32)
def unrolled_break(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    """A compile-time loop with a run-time break: later iterations are guarded."""
    t = ty.thread_idx()
    acc = 0.0
    for k in range(W):
        v = x[t * W + k]
        if v < 0.0:
            break
        acc = acc + v
    out[t] = acc


@ty.kernel(threads=32)
def compile_time_jumps(out: ty.ptr(ty.i32)):
    """Jumps on compile-time values keep Python's meaning exactly."""
    total = 0
    for k in range(10):
        if k == 2:
            continue
        if k == 6:
            break
        total += k
    out[ty.thread_idx()] = total


@ty.kernel(threads=32)
def zero_runtime_step(out: ty.ptr(ty.i32), step: ty.i32):
    count = 0
    for i in range(0, 10, step):
        count += 1
    out[ty.thread_idx()] = count


# -- mistakes -------------------------------------------------------------------------------------

@ty.kernel(threads=32)
def bad_zero_step(out: ty.ptr(ty.i32), n: ty.i32):
    for i in range(n, 0, 0):  # <- zero_step
        out[i] = 0


@ty.func
def returns_on_one_path(v):
    if v < 0.0:
        return v
    v = v + 1.0  # <- falls_off


@ty.kernel(threads=32)
def bad_falls_off(x: ty.ptr(ty.f32)):
    x[0] = returns_on_one_path(x[1])


@ty.func
def returns_pointer(p, q, c):
    if c > 0:
        return p
    return q


@ty.kernel(threads=32)
def pointer_return(x: ty.ptr(ty.f32), y: ty.ptr(ty.f32), n: ty.i32):
    p = returns_pointer(x, y, n)
    p[0] = 1.0


@ty.kernel(threads=32)
def bad_return_in_try(x: ty.ptr(ty.f32), n: ty.i32):
    try:  # <- try_return
        if n > 0:
            return
    finally:
        pass
    x[0] = 1.0


@ty.kernel(threads=32)
def bad_float_then_int(x: ty.ptr(ty.f32), n: ty.i32):
    m = 0.0
    if n > 0:  # <- float_then_int
        m = n
    x[0] = m


@ty.kernel(threads=32)
def bad_runtime_assert(x: ty.ptr(ty.f32)):
    assert x[0] > 0.0, "positive"  # <- runtime_assert


@ty.kernel(threads=32)
def compile_time_assert(x: ty.ptr(ty.f32), N: ty.constexpr = 4):
    assert N % 2 == 0, "N must be even"  # <- ct_assert
    x[0] = 1.0


@ty.kernel(threads=32)
def bad_runtime_range_in_comprehension(x: ty.ptr(ty.f32), n: ty.i32):
    vals = [x[i] for i in range(n)]  # <- comprehension
    x[0] = vals[0]


@ty.kernel(threads=32)
def bad_chained_comparison(x: ty.ptr(ty.f32), n: ty.i32):
    i = ty.thread_idx()
    if 0 <= i < n:  # <- chained
        x[i] = 1.0


@ty.kernel(threads=32)
def return_inside_loop(x: ty.ptr(ty.f32), n: ty.i32):
    """Zero the row up to (not including) its first negative element, then stop the kernel."""
    t = ty.thread_idx()
    for k in range(n):
        if x[t * n + k] < 0.0:
            return
        x[t * n + k] = 0.0


@ty.func
def ordered(a, b):
    if a < b:
        return a, b
    return b, a


@ty.kernel(threads=32)
def tuple_returns(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32)):
    t = ty.thread_idx()
    lo, hi = ordered(x[2 * t], x[2 * t + 1])
    out[2 * t] = lo
    out[2 * t + 1] = hi


@ty.kernel(threads=32)
def while_else(x: ty.ptr(ty.f32), out: ty.ptr(ty.i32), n: ty.i32):
    t = ty.thread_idx()
    k = 0
    while k < n:
        if x[t * n + k] < 0.0:
            break
        k += 1
    else:
        k = -1
    out[t] = k
