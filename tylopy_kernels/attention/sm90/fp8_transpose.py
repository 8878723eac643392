"""V^T for the FP8 attention forward, on the GPU in one pass: (B, H_kv, N_k, D) e4m3 codes (any
16-byte-aligned strides, last dim contiguous) -> (B, H_kv, D, N') with the keys of each group of
32 in ``forward_fp8.key_slot`` order and zeros past N_k (N' = N_k rounded up to 32).

One CTA per 64 keys of one (batch, head): 16-byte loads of the 64 key rows into shared memory
(zeros past N_k), then each thread gathers 16 bytes of an output row -- D row d, 16 slots -- and
writes them as one 16-byte store. Reads and writes are both whole 16-byte pieces of contiguous
rows; the gather is byte loads from shared memory.

Slot s of a group holds key (s & 16) | (s & 2) << 2 | (s >> 1) & 6 | (s & 1): the inverse of
``key_slot`` (key 16 a1 + 8 a0 + 2 t + e sits at slot 16 a1 + 4 t + 2 a0 + e).
"""
import tylopy as ty

TILE = 64            # keys per CTA: two permutation groups, four 16-byte pieces of an output row
THREADS = 256


def key_of_slot(s):
    """The key (0..31) a slot (0..31) of V^T holds."""
    return (s & 16) | (s & 2) << 2 | (s >> 1) & 6 | (s & 1)


@ty.kernel(threads=THREADS)
def value_transpose_fp8(v: ty.ptr(ty.u8), vt: ty.ptr(ty.u8), n_k: ty.i32, n_pad: ty.i32, kv_heads: ty.i32,
                        stride_b: ty.i64, stride_h: ty.i64, stride_n: ty.i64, HEAD_DIM: ty.constexpr = 128):
    """Grid (ceil(n_pad / 64), H_kv, B); strides of v in bytes (multiples of 16)."""
    row = HEAD_DIM + 16                     # shared row stride: rows start 16-byte aligned, banks skew
    pieces = HEAD_DIM // 16                 # 16-byte pieces of a key row
    buf = ty.shared(ty.u8, TILE * row)
    tid = ty.thread_idx()
    k0 = ty.block_idx(0) * TILE
    h, b = ty.block_idx(1), ty.block_idx(2)
    base = ty.cast(b, ty.i64) * stride_b + ty.cast(h, ty.i64) * stride_h
    for i in range(TILE * pieces // THREADS):
        idx = tid + i * THREADS
        r, c = idx // pieces, idx % pieces
        key = k0 + r
        codes = ty.load(v + (base + ty.cast(key, ty.i64) * stride_n + ty.cast(16 * c, ty.i64)), vec=16, mask=key < n_k)
        ty.store(buf + (r * row + 16 * c), codes)
    ty.syncthreads()
    out = (ty.cast(b, ty.i64) * ty.cast(kv_heads, ty.i64) + ty.cast(h, ty.i64)) * HEAD_DIM * ty.cast(n_pad, ty.i64)
    per_row = TILE // 16
    for i in range(HEAD_DIM * per_row // THREADS):
        idx = tid + i * THREADS
        d, j = idx // per_row, idx % per_row
        first = k0 + 16 * j                 # the piece's first slot; slot 16 j + e holds key 16 j + key_of_slot(e)
        if first < n_pad:
            src = buf + (16 * j * row + d)
            piece = tuple(ty.load(src + key_of_slot(e) * row) for e in range(16))
            ty.store(vt + (out + ty.cast(d, ty.i64) * ty.cast(n_pad, ty.i64) + ty.cast(first, ty.i64)), piece)
