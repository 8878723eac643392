"""Small kernels the tests compile; the ones named ``bad_*`` each contain one mistake.

A comment ``# <- name`` marks the line an error must point at; ``line_of(name)`` finds it, so
the tests stay right when this file is edited.
"""
import tylopy as ty


def line_of(marker: str) -> int:
    """The 1-based line of this file that carries the comment ``# <- marker``."""
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# <- {marker}"):
                return n
    raise LookupError(f"no line marked {marker!r} in {__file__}")


# -- kernels with one mistake each ----------------------------------------------------------------

@ty.kernel(threads=32)
def bad_type_mismatch(x: ty.ptr(ty.f32), n: ty.i32):
    v = x[0] + n  # <- type_mismatch
    x[0] = v


@ty.kernel(threads=32)
def bad_float_literal(x: ty.ptr(ty.i32), n: ty.i32):
    x[0] = n + 1.5  # <- float_literal


@ty.kernel(threads=32)
def bad_bool_and(x: ty.ptr(ty.f32), n: ty.i32):
    i = ty.thread_idx()
    if i < n and i > 0:  # <- bool_and
        x[i] = 1.0


@ty.kernel(threads=32)
def bad_bool_call(x: ty.ptr(ty.f32), n: ty.i32):
    flag = bool(n)  # <- bool_call
    x[0] = ty.select(flag, 1.0, 0.0)


@ty.kernel(threads=32)
def bad_runtime_shared_size(x: ty.ptr(ty.f32), n: ty.i32):
    buf = ty.shared(ty.f32, n)  # <- runtime_shared_size
    buf[0] = x[0]


@ty.kernel(threads=32)
def bad_runtime_static_range(x: ty.ptr(ty.f32), n: ty.i32):
    for k in ty.static_range(n):  # <- runtime_static_range
        x[k] = 0.0


@ty.kernel(threads=32)
def bad_address_space(x: ty.ptr(ty.f32), n: ty.i32):
    s = ty.ptr_cast(x, space="shared")  # <- address_space
    s[0] = 1.0


@ty.kernel(threads=32)
def bad_one_branch(x: ty.ptr(ty.f32), n: ty.i32):
    if n > 0:
        y = x[1]
    x[0] = y  # <- one_branch


@ty.kernel(threads=32)
def bad_loop_only(x: ty.ptr(ty.f32), n: ty.i32):
    for k in range(n):
        last = x[k]
    x[0] = last + 1.0  # <- loop_only


@ty.kernel(threads=32)
def bad_for_carry_type(x: ty.ptr(ty.f32), n: ty.i32):
    acc = ty.cast(0, ty.i32)
    for k in range(n):
        acc = ty.cast(acc, ty.f32) + x[k]  # <- for_carry_type
    x[0] = acc


@ty.kernel(threads=32)
def bad_while_carry_type(x: ty.ptr(ty.f32), n: ty.i32):
    j = ty.thread_idx()
    while j < n:
        j = ty.cast(j, ty.f32) * 2.0  # <- while_carry_type
    x[0] = 1.0


@ty.kernel(threads=32)
def bad_returns_value(x: ty.ptr(ty.f32), n: ty.i32):
    return x[0]  # <- returns_value


@ty.func
def helper_mixes_types(a, b):
    return a * b  # <- helper_mixes


@ty.kernel(threads=32)
def bad_in_helper(x: ty.ptr(ty.f32), n: ty.i32):
    x[0] = helper_mixes_types(x[1], n)  # <- helper_call


def define_unannotated():
    """Decorating this raises at once (so it is wrapped in a function the test calls)."""
    @ty.kernel(threads=32)
    def unannotated(x: ty.ptr(ty.f32),
                    n):  # <- missing_annotation
        x[0] = 1.0
    return unannotated


@ty.kernel(threads=32)
def with_constexpr(x: ty.ptr(ty.f32), SCALE: ty.constexpr = 2.0):  # <- constexpr_def
    x[0] = x[0] * SCALE


class Nested:
    """A kernel defined one indentation level deep: columns must still be the file's."""

    @ty.kernel(threads=32)
    def bad_indented(x: ty.ptr(ty.f32), n: ty.i32):
        x[0] = x[1] +   n  # <- indented


@ty.kernel(threads=32)
def bad_fragment_registers(x: ty.ptr(ty.f32)):
    f = ty.Fragment((x[0], x[1]), ty.MMA_SYNC_C)  # <- fragment_registers
    x[0] = f.values[0]


@ty.kernel(threads=32)
def bad_fragment_ownership(x: ty.ptr(ty.f32)):
    a = ty.Fragment((x[0], x[1], x[2], x[3]), ty.MMA_SYNC_C)
    b = ty.Fragment((x[0], x[1], x[2], x[3]), ty.LocalOwnership(2, 2))
    c = a + b  # <- fragment_ownership
    x[0] = c.values[0]


@ty.kernel(threads=32)
def bad_atom_dtype(x: ty.ptr(ty.f32)):
    atom = ty.MmaSyncAtom(ty.f32)  # <- atom_dtype
    x[0] = 1.0


class Box:
    """A plain object: attributes set inside a run-time if are not carried out of it."""


@ty.kernel(threads=32)
def bad_leak_through_attribute(x: ty.ptr(ty.f32), n: ty.i32):
    b = Box()
    b.v = x[0]
    if n > 0:
        b.v = x[1]
    x[2] = b.v  # <- leak


@ty.kernel(threads=32)
def bad_int_true_division(x: ty.ptr(ty.i32), n: ty.i32):
    x[0] = n / 2  # <- int_truediv


@ty.kernel(threads=32)
def bad_static_shared(x: ty.ptr(ty.f32)):
    a = ty.shared(ty.f32, 8192)
    b = ty.shared(ty.f32, 8192)  # <- static_shared
    b[0] = a[0]


@ty.kernel(threads=32)
def bad_ptx(x: ty.ptr(ty.f32)):
    ty.inline_ptx("no.such.instruction;")  # <- bad_ptx


# -- kernels that compile ------------------------------------------------------------------------

@ty.kernel(threads=128)
def control_flow(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    """for with an if inside (values carried through both), then a while."""
    t = ty.thread_idx()
    acc = 0.0
    for k in range(n):
        if k % 2 == 0:
            acc = acc + x[k]
        else:
            acc = acc - x[k]
    j = t
    while j < n:
        acc = acc * 0.5
        j = j + 128
    out[t] = acc


@ty.kernel(threads=128)
def copy_vec4(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    """Four floats per thread through one 16-byte load and store (n a multiple of 4)."""
    i = (ty.block_idx() * 128 + ty.thread_idx()) * 4
    if i < n:
        a, b, c, d = ty.load(x + i, vec=4)
        ty.store(out + i, (a, b, c, d))


SMEM_BYTES = 64 * 1024  # above the 48 KB a kernel gets without opting in


@ty.kernel(threads=256)
def reverse_through_smem(x: ty.ptr(ty.f32), out: ty.ptr(ty.f32), NBYTES: ty.constexpr = SMEM_BYTES):
    """Each block stages NBYTES of x in dynamic shared memory and writes it back reversed."""
    per_block = NBYTES // 4
    s = ty.dynamic_shared(ty.f32, NBYTES)
    t = ty.thread_idx()
    base = ty.block_idx() * per_block
    for k in range(t, per_block, 256):
        s[k] = x[base + k]
    ty.syncthreads()
    for k in range(t, per_block, 256):
        out[base + k] = s[per_block - 1 - k]


@ty.kernel(threads=128)
def scalars_first(n: ty.i32, alpha: ty.f32, flag: ty.i1, out: ty.ptr(ty.f32)):
    """Scalars ahead of the pointer, so their checks run before the CUDA-tensor check."""
    i = ty.thread_idx()
    if i < n:
        out[i] = ty.select(flag, alpha, 0.0)


@ty.kernel(threads=32, arch="sm_80")
def tiny(out: ty.ptr(ty.f32)):
    """The least a kernel can do: one store (for launch-overhead timing)."""
    out[ty.thread_idx()] = 1.0
