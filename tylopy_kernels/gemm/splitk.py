"""The second pass of a split-K GEMM: C = epilogue(sum_s P[s] + bias), in a fixed order.

``gemm_sm90`` with SPLIT_K = S writes S f32 partial products P[s] (rows [s M, (s + 1) M) of
one workspace); this kernel adds them in order s = 0, 1, ... (so the result does not depend on
which unit finished first), adds the bias, applies the epilogue and rounds to the output dtype.
One thread per output element, rows of ``ldw`` f32 in the workspace and ``ldc`` outputs in C.
"""
import tylopy as ty

THREADS = 256


@ty.kernel(threads=THREADS, noalias=True)
def splitk_reduce(ws: ty.ptr(ty.f32), out: ty.ptr(ty.u8), bias: ty.ptr(ty.u8), m: ty.i32, n: ty.i32,
                  ldw: ty.i64, ldc: ty.i64,
                  SPLITS: ty.constexpr = 2, OUT_DTYPE: ty.constexpr = ty.bf16, HAS_BIAS: ty.constexpr = False,
                  BIAS_DTYPE: ty.constexpr = ty.f32, EPILOGUE: ty.constexpr = None):
    idx = ty.cast(ty.block_idx(0), ty.i64) * THREADS + ty.cast(ty.thread_idx(), ty.i64)
    cols = ty.cast(n, ty.i64)
    row = idx // cols
    col = idx - row * cols
    if row < ty.cast(m, ty.i64):
        split_stride = ty.cast(m, ty.i64) * ldw
        p = ws + (row * ldw + col)
        v = p[0]
        for s in range(1, SPLITS):
            v = v + p[s * split_stride]
        if HAS_BIAS:
            v = v + ty.cast(ty.ptr_cast(bias, BIAS_DTYPE)[col], ty.f32)
        if EPILOGUE is not None:
            v = EPILOGUE(v)
        dst = row * ldc + col
        if OUT_DTYPE == ty.f32:
            ty.ptr_cast(out, ty.f32)[dst] = v
        else:
            ty.ptr_cast(out, OUT_DTYPE)[dst] = ty.cast(v, OUT_DTYPE)


def blocks(m: int, n: int) -> int:
    return max(1, -(-(m * n) // THREADS))
