"""Kernels written the way the hostile-input review wrote them: each is either rejected at the
marked line (``# <- name``) or compiles to code whose semantics the emulator and the GPU share.
tests/test_hostile_frontend.py and tests/test_hostile_semantics.py use them."""
import functools

import tylopy as ty


def line_of(marker: str) -> int:
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# <- {marker}"):
                return n
    raise LookupError(marker)


# -- silent wrong code: compile-time operands whose result would be undefined ----------------------

@ty.kernel(threads=32)
def shift_left_40(x: ty.ptr(ty.i32), n: ty.i32):
    x[0] = n << 40  # <- shl40


@ty.kernel(threads=32)
def shift_right_negative(x: ty.ptr(ty.i32), n: ty.i32):
    x[0] = n >> -1  # <- shr_neg


@ty.kernel(threads=32)
def divide_by_zero(x: ty.ptr(ty.i32), n: ty.i32):
    x[0] = n // 0  # <- div0


@ty.kernel(threads=32)
def remainder_by_zero(x: ty.ptr(ty.i32), n: ty.i32):
    x[0] = n % 0  # <- rem0


@ty.kernel(threads=32)
def f16_overflow(x: ty.ptr(ty.f16)):
    x[0] = 1e10  # <- f16_overflow


@ty.kernel(threads=32)
def f32_overflow(x: ty.ptr(ty.f32)):
    x[0] = 1e300  # <- f32_overflow


@ty.kernel(threads=32)
def i32_overflow(x: ty.ptr(ty.i32)):
    x[0] = 2**40  # <- i32_overflow


@ty.kernel(threads=32)
def float_then_int_value(x: ty.ptr(ty.f32), n: ty.i32):
    m = x[0]
    if n > 0:  # <- float_int_values
        m = n
    x[1] = m


@ty.kernel(threads=32)
def runtime_integer_ops(a: ty.ptr(ty.i32), b: ty.ptr(ty.i32), out: ty.ptr(ty.i32), u: ty.ptr(ty.u32)):
    """Run-time operands: defined results the emulator and the GPU share (see proxy.py)."""
    t = ty.thread_idx()
    x, y = a[t], b[t]
    out[t * 6 + 0] = x // y
    out[t * 6 + 1] = x % y
    out[t * 6 + 2] = x << y
    out[t * 6 + 3] = x >> y
    ux = ty.cast(x, ty.u32)
    uy = ty.cast(y, ty.u32)
    u[t * 3 + 0] = ux // uy
    u[t * 3 + 1] = ux % uy
    u[t * 3 + 2] = ux >> uy
    out[t * 6 + 4] = -7 // ty.cast(2, ty.i32) + x * 0
    out[t * 6 + 5] = -7 % ty.cast(2, ty.i32) + x * 0


# -- hangs ------------------------------------------------------------------------------------------

@ty.kernel(threads=32)
def huge_unroll(x: ty.ptr(ty.f32)):
    for i in range(1_000_000):  # <- huge_unroll
        x[i] = 0.0


@ty.kernel(threads=32)
def nested_unroll(x: ty.ptr(ty.f32)):
    acc = 0.0
    for i in range(4000):
        for j in range(4000):  # <- nested_unroll
            acc = acc + x[j]
    x[0] = acc


@ty.kernel(threads=32)
def endless_compile_time_while(x: ty.ptr(ty.f32)):
    k = 0
    while k >= 0:  # <- endless_while
        k += 1
    x[0] = 1.0


@ty.kernel(threads=32)
def runtime_loop_of_a_million(x: ty.ptr(ty.f32)):
    acc = 0.0
    for i in ty.range(1_000_000, unroll=False):
        acc = acc + x[i % 32]
    x[0] = acc


# -- tracebacks that must be errors ---------------------------------------------------------------

@ty.func
def recurse(v, depth):
    return recurse(v + 1.0, depth + 1)  # <- recursion


@ty.kernel(threads=32)
def recursive_func(x: ty.ptr(ty.f32)):
    x[0] = recurse(x[0], 0)


@ty.kernel(threads=32)
def range_of_a_float_load(x: ty.ptr(ty.f32)):
    for i in range(x[0]):  # <- range_float
        x[i] = 0.0


@ty.kernel(threads=32)
def range_of_an_int_load(x: ty.ptr(ty.i32)):
    for i in range(x[0]):
        x[i + 1] = i


def passthrough(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


def register(kernel):
    """A decorator stacked above @ty.kernel: it sees the Kernel and returns it."""
    register.seen.append(kernel)
    return kernel


register.seen = []


def define_wrapped_kernel():
    @ty.kernel(threads=32)
    @passthrough
    def wrapped(x: ty.ptr(ty.f32)):  # <- wrapped_def
        x[0] = 1.0
    return wrapped


@register
@ty.kernel(threads=32)
def stacked(x: ty.ptr(ty.f32), n: ty.i32):
    x[0] = x[1] + n  # <- stacked_line


def define_keyword_only():
    @ty.kernel(threads=32)
    def kwonly(x: ty.ptr(ty.f32), *, n: ty.i32):  # <- kwonly
        x[0] = 1.0
    return kwonly


def define_reserved_parameter():
    @ty.kernel(threads=32)
    def reserved(x: ty.ptr(ty.f32), __ty_n: ty.i32):  # <- reserved_param
        x[0] = 1.0
    return reserved


@ty.kernel(threads=32)
def reserved_local(x: ty.ptr(ty.f32)):
    __ty = 3  # <- reserved_local
    x[0] = 1.0


# -- inline PTX that LLVM would abort on ----------------------------------------------------------

@ty.kernel(threads=32)
def asm_operand_out_of_range(x: ty.ptr(ty.f32)):
    x[0] = ty.inline_ptx("add.f32 $0, $1, $5;", (x[0], x[1]), "=f,f,f", (ty.f32,))  # <- asm_range


@ty.kernel(threads=32)
def asm_unknown_constraint(x: ty.ptr(ty.f32)):
    x[0] = ty.inline_ptx("mov.f32 $0, $1;", (x[0],), "=f,q", (ty.f32,))  # <- asm_letter


@ty.kernel(threads=32)
def asm_wrong_type(x: ty.ptr(ty.f32)):
    x[0] = ty.inline_ptx("mov.f32 $0, $1;", (x[0],), "=f,r", (ty.f32,))  # <- asm_type


@ty.kernel(threads=32)
def asm_count_mismatch(x: ty.ptr(ty.f32)):
    x[0] = ty.inline_ptx("mov.f32 $0, $1;", (x[0], x[1]), "=f,f", (ty.f32,))  # <- asm_count


@ty.kernel(threads=32)
def asm_fine(x: ty.ptr(ty.f32)):
    x[0] = ty.inline_ptx("add.f32 $0, $1, $2;", (x[0], x[1]), "=f,f,f", (ty.f32,))
