"""Three row-softmax kernels, to compare what a row costs to keep.

Each computes ``torch.softmax(x, dim=1)`` for a (rows, cols) tensor of float32, float16 or
bfloat16 (the arithmetic is float32; the output has the input's dtype):

``softmax_streaming`` (``streaming_kernel``)
    One warp per row, four values per lane per 128-column chunk, whatever the row width, so registers stay
    bounded (the loops take two chunks per step, to keep two loads in flight). Pass 1 reads
    the row once and keeps per-lane online statistics: a running maximum m and a running sum
    l of exp(x - m), rescaled whenever m grows. A shfl_xor butterfly then merges the 32 lane
    states. Pass 2 reads the row again and writes the probabilities. Traffic: two reads and
    one write of the row.
``softmax_full_row`` (``full_row_kernel``)
    The row width is a compile-time ``COLS`` and the row stays in registers: one read, one
    write. ``WARPS_PER_ROW`` warps (constexpr) share a row, each lane holding
    COLS/(32*WARPS_PER_ROW) values:

    1. every thread loads its values (16-byte vector loads where aligned; the ragged last chunk
       masked to -inf) and reduces them to its maximum;
    2. a shfl_xor butterfly gives each warp the maximum; with several warps, lane 0 of each
       writes it to a static shared array of WARPS_PER_ROW floats, ``syncthreads``, and every
       warp reads the entries back and finishes with a butterfly over WARPS_PER_ROW lanes;
    3. the same for the sum of exponentials, through a second shared array (so no second
       barrier is needed before the first array's entries could be overwritten);
    4. every thread writes its probabilities (stores past the row's end are skipped).

    ``full_row_warps(cols)`` chooses WARPS_PER_ROW: 1 up to 4096 columns (four rows a block of
    128 threads, up to 128 values a lane), then one row a block of 4, 8 or 16 warps up to 8192,
    16384 and 32768 columns (at most 64 values a lane, which ptxas keeps without spills).
    ``COLS <= MAX_FULL_ROW_COLS`` (32768): a 65536-column float32 row is 256 KiB, the whole
    register file of an SM, so wider rows are for the streaming kernel.
``softmax_three_pass`` (``three_pass_kernel``)
    A scalar loop per lane over columns lane, lane+32, ..., one warp per row: one pass for the
    maximum, one for the sum of exponentials, one to write. Three reads and one write.

Numerics, shared by the three. Everything runs in the exp2 domain: the maximum is kept as
``m = fl(max(x) * log2(e))`` and each weight is ``exp2(fma(x, log2(e), -m))`` (PTX
``ex2.approx``). Because the same rounded m shifts every element of the row and the sum, its
rounding error is a common factor that the normalization cancels: logits near +-3e4 lose no
accuracy. An online update from (m, l) with new values x is::

    m' = max(m, fl(max(x) * log2(e)))
    s  = 0 if m' == -inf else m'            # an empty state never computes -inf - (-inf)
    l' = l * exp2(m - s) + sum(exp2(fma(x, log2(e), -s)))

and merging two states takes m = max(m1, m2), l = l1*exp2(m1 - s) + l2*exp2(m2 - s) with the
same guard. Both are branch-free (``ty.select``). Columns past the end of the row read as -inf,
which gives them zero weight. A row whose logits are all -inf ends with l = 0 and is written
as zeros (torch gives NaN); NaN logits give a NaN row.

Memory access. The T threads on a row (32, or 32*WARPS_PER_ROW) walk it in chunks of 4*T
columns. With ``VEC=4`` thread i owns columns 4i..4i+3 of each chunk and moves them with one
vector access (``ld.global.nc.v4``: 16 bytes for float32, 8 for 16-bit types). That needs every
row start aligned to 4 elements, so the launchers choose ``VEC=4`` only when cols % 4 == 0 and
both tensors are 4-element aligned; otherwise ``VEC=1``, where thread i owns columns i, i+T,
i+2T, i+3T of each chunk and uses four scalar (still coalesced) accesses. Either way the ragged
last chunk is masked: its loads read nothing past the row and its stores are guarded.

Kernels per dtype. A parameter's annotation is fixed when the kernel is defined, so
``streaming_kernel(ty.f16)`` etc. define one kernel per element type; each has its own name
(``softmax_streaming_f16``), which also keeps their disk-cache keys apart. The launchers
``softmax_streaming(x, out=None)``, ``softmax_full_row`` and ``softmax_three_pass`` pick the
kernel, VEC and (full_row) WARPS_PER_ROW, and write into ``out`` when given (contiguous, like x, not overlapping it).

Run and check (needs a GPU)::

    python -c "import torch; from tylopy_kernels.softmax.streaming import softmax_streaming; \\
x = torch.randn(4096, 5000, device='cuda'); print((softmax_streaming(x) - torch.softmax(x, 1)).abs().max())"
    tylopy bench softmax          # all three against torch.softmax and a copy

Inspect one specialization without a GPU::

    python -c "import tylopy as ty; from tylopy_kernels.softmax.streaming import streaming_kernel; \\
k = streaming_kernel(ty.f32).compile(VEC=4); print(k.ptx); print(k.report)"
    python -c "import tylopy as ty; from tylopy_kernels.softmax.streaming import full_row_kernel, full_row_warps; \
print(full_row_kernel(ty.f32).compile(COLS=16384, VEC=4, WARPS_PER_ROW=full_row_warps(16384)).report)"
"""
import functools
import operator

import tylopy as ty
from tylopy_kernels.softmax.row import LOG2E, NEG_INF, warp_max, warp_sum

WARPS = 4  # rows per block, one warp each (full_row: when WARPS_PER_ROW == 1)
CHUNK = 128  # columns a warp covers per step: 32 lanes x 4 values
MAX_ONE_WARP_COLS = 4096  # full_row: the widest row one warp holds (128 values a lane)
MAX_VALUES_PER_LANE = 64  # full_row with several warps a row: the most values a lane holds
WARPS_PER_ROW_CHOICES = (1, 2, 4, 8, 16)  # powers of two: the cross-warp butterfly needs one
MAX_FULL_ROW_COLS = 32 * max(WARPS_PER_ROW_CHOICES) * MAX_VALUES_PER_LANE  # 32768
DTYPES = {"float32": ty.f32, "float16": ty.f16, "bfloat16": ty.bf16}  # torch dtype name -> element type


def tree_reduce(op, values):
    """Combine a Python list of values pairwise: log2(n) dependent steps instead of n."""
    values = list(values)
    while len(values) > 1:
        values = [op(*values[i:i + 2]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def exp2_shifted(v, shift):
    """exp(v - max) as exp2(v*log2(e) - shift), with ``shift`` the row maximum scaled by log2(e)."""
    return ty.exp2(ty.fma(v, LOG2E, -shift))


def safe_shift(m):
    """The scaled maximum to subtract; 0 for an empty (-inf) state."""
    return ty.select(m == NEG_INF, 0.0, m)


@ty.func
def chunk_columns(c0, lane, VEC, threads=32):
    """The four columns that thread ``lane`` of a row's ``threads`` owns in the chunk of 4*threads at ``c0``."""
    if VEC == 4:
        return [c0 + lane * 4 + j for j in range(4)]
    return [c0 + lane + threads * j for j in range(4)]


@ty.func
def load_chunk(row_ptr, c0, lane, cols, VEC, MASKED, threads=32):
    """This thread's four logits of the chunk at ``c0`` as f32; columns at or past ``cols`` give -inf."""
    col = chunk_columns(c0, lane, VEC, threads)
    in_row = [c < cols for c in col] if MASKED else [None] * 4
    if VEC == 4:  # cols % 4 == 0, so a vector lies wholly inside the row or wholly past it
        raw = ty.load(row_ptr + col[0], vec=4, mask=in_row[0])
    else:
        raw = [ty.load(row_ptr + c, mask=ok) for c, ok in zip(col, in_row)]
    vals = [ty.cast(v, ty.f32) for v in raw]
    if MASKED:
        vals = [ty.select(ok, v, NEG_INF) for v, ok in zip(vals, in_row)]
    return vals


@ty.func
def store_chunk(row_ptr, c0, lane, cols, vals, VEC, MASKED, threads=32):
    """Write this thread's four f32 results of the chunk at ``c0`` in the row's dtype."""
    col = chunk_columns(c0, lane, VEC, threads)
    vals = [ty.cast(v, row_ptr.type.pointee) for v in vals]
    if VEC == 4:
        if not MASKED:
            ty.store(row_ptr + col[0], vals)
        elif col[0] < cols:  # run-time: lanes past the end of the row skip the store
            ty.store(row_ptr + col[0], vals)
    else:
        for j in range(4):
            if not MASKED:
                ty.store(row_ptr + col[j], vals[j])
            elif col[j] < cols:
                ty.store(row_ptr + col[j], vals[j])


@ty.func
def online_update(m, l, vals):
    """Fold a list of logits (one or two chunks' worth) into this lane's state (m scaled by log2(e), l)."""
    m_new = ty.maximum(m, tree_reduce(ty.maximum, vals) * LOG2E)
    shift = safe_shift(m_new)
    p_sum = tree_reduce(operator.add, [exp2_shifted(v, shift) for v in vals])
    return m_new, l * ty.exp2(m - shift) + p_sum


@ty.func
def warp_merge(m, l):
    """Merge the 32 lanes' (m, l) states with a shfl_xor butterfly; every lane gets the row's."""
    for offset in (16, 8, 4, 2, 1):
        m_other = ty.shfl_xor(m, offset)
        l_other = ty.shfl_xor(l, offset)
        m_new = ty.maximum(m, m_other)
        shift = safe_shift(m_new)
        l = l * ty.exp2(m - shift) + l_other * ty.exp2(m_other - shift)
        m = m_new
    return m, l


@ty.func
def row_pointers(x, out, rows, cols):
    """(this warp's row index, its lane, x and out advanced to the row's start)."""
    lane = ty.thread_idx() & 31
    row = ty.block_idx() * WARPS + (ty.thread_idx() >> 5)
    start = ty.cast(row, ty.i64) * ty.cast(cols, ty.i64)  # i64: rows*cols may pass 2**31
    return row, lane, x + start, out + start


@ty.func
def full_row_pointers(x, out, rows, cols, WARPS_PER_ROW):
    """(row index, this thread's index among the row's 32*WARPS_PER_ROW, x and out advanced to the row's start).

    One warp a row: four rows a block, as ``row_pointers``. Several warps: one row a block.
    """
    if WARPS_PER_ROW == 1:
        return row_pointers(x, out, rows, cols)
    row = ty.block_idx()
    start = ty.cast(row, ty.i64) * ty.cast(cols, ty.i64)
    return row, ty.thread_idx(), x + start, out + start


@ty.func
def row_reduce(op, v, thread, WARPS_PER_ROW):
    """``op`` over the row's 32*WARPS_PER_ROW threads, in every thread (bitwise the same in each).

    A shfl_xor butterfly inside each warp; with several warps, lane 0 of each writes its warp's
    result to a small shared array, and after one barrier every warp reads it back, lane i taking
    entry i % WARPS_PER_ROW, and finishes with a butterfly over WARPS_PER_ROW lanes. Each call
    allocates its own array, so a second call needs no barrier to protect the first one's reads.
    """
    for offset in (16, 8, 4, 2, 1):
        v = op(v, ty.shfl_xor(v, offset))
    if WARPS_PER_ROW > 1:
        partial = ty.shared(ty.f32, WARPS_PER_ROW)
        lane = thread & 31
        if lane == 0:
            partial[thread >> 5] = v
        ty.syncthreads()
        v = partial[lane & (WARPS_PER_ROW - 1)]
        for offset in [o for o in (16, 8, 4, 2, 1) if o < WARPS_PER_ROW]:  # log2(WARPS_PER_ROW) shuffles
            v = op(v, ty.shfl_xor(v, offset))
    return v


@ty.func
def write_probs(out_row, c0, lane, cols, vals, norm, VEC, MASKED):
    """Pass 2 on one chunk's logits: write exp2(x*log2(e) - shift) / l (``norm``: the row's (shift, 1/l))."""
    shift, inv_l = norm
    store_chunk(out_row, c0, lane, cols, [exp2_shifted(v, shift) * inv_l for v in vals], VEC, MASKED)


@functools.cache
def streaming_kernel(dtype):
    """The streaming kernel for ``dtype`` elements (one specialization per VEC in {1, 4})."""

    @ty.kernel(threads=WARPS * 32, name=f"softmax_streaming_{dtype}", noalias=True)
    def softmax_streaming(x: ty.ptr(dtype), out: ty.ptr(dtype), rows: ty.i32, cols: ty.i32, VEC: ty.constexpr):
        row, lane, x_row, out_row = row_pointers(x, out, rows, cols)
        if row < rows:  # whole warps leave together, so shuffles always see 32 lanes
            # The row splits into pairs of whole chunks, at most one more whole chunk, and a ragged tail.
            # Pairs keep two loads in flight per lane (LLVM does not unroll these run-time loops).
            paired = cols - cols % (2 * CHUNK)
            whole = cols - cols % CHUNK
            # Pass 1: per-lane online statistics, then one merge across the warp.
            m = ty.cast(NEG_INF, ty.f32)
            l = ty.cast(0.0, ty.f32)
            for c0 in range(0, paired, 2 * CHUNK):
                first = load_chunk(x_row, c0, lane, cols, VEC, False)
                second = load_chunk(x_row, c0 + CHUNK, lane, cols, VEC, False)
                m, l = online_update(m, l, first + second)
            if paired < whole:
                m, l = online_update(m, l, load_chunk(x_row, paired, lane, cols, VEC, False))
            if whole < cols:
                m, l = online_update(m, l, load_chunk(x_row, whole, lane, cols, VEC, True))
            m, l = warp_merge(m, l)
            shift = safe_shift(m)
            inv_l = ty.select(l > 0.0, ty.rcp(l), 0.0)  # l == 0 only for an all -inf row
            norm = (shift, inv_l)
            # Pass 2: read the logits again and write the probabilities.
            for c0 in range(0, paired, 2 * CHUNK):
                first = load_chunk(x_row, c0, lane, cols, VEC, False)  # both loads before either store
                second = load_chunk(x_row, c0 + CHUNK, lane, cols, VEC, False)
                write_probs(out_row, c0, lane, cols, first, norm, VEC, False)
                write_probs(out_row, c0 + CHUNK, lane, cols, second, norm, VEC, False)
            if paired < whole:
                vals = load_chunk(x_row, paired, lane, cols, VEC, False)
                write_probs(out_row, paired, lane, cols, vals, norm, VEC, False)
            if whole < cols:
                vals = load_chunk(x_row, whole, lane, cols, VEC, True)
                write_probs(out_row, whole, lane, cols, vals, norm, VEC, True)

    return softmax_streaming


def full_row_threads(COLS, VEC, WARPS_PER_ROW):
    """Block size of a full_row specialization: four one-warp rows, or one row of WARPS_PER_ROW warps."""
    if WARPS_PER_ROW not in WARPS_PER_ROW_CHOICES:
        raise ValueError(f"full_row_kernel expects WARPS_PER_ROW in {WARPS_PER_ROW_CHOICES}, "
                         f"but got {WARPS_PER_ROW!r}")
    return WARPS * 32 if WARPS_PER_ROW == 1 else WARPS_PER_ROW * 32


@functools.cache
def full_row_kernel(dtype):
    """The register-resident kernel for ``dtype`` elements (one specialization per COLS, VEC, WARPS_PER_ROW)."""

    @ty.kernel(threads=full_row_threads, name=f"softmax_full_row_{dtype}", noalias=True)
    def softmax_full_row(x: ty.ptr(dtype), out: ty.ptr(dtype), rows: ty.i32, COLS: ty.constexpr, VEC: ty.constexpr,
                         WARPS_PER_ROW: ty.constexpr = 1):
        row, thread, x_row, out_row = full_row_pointers(x, out, rows, COLS, WARPS_PER_ROW)
        if row < rows:  # with several warps a row the whole block agrees, so the barriers see every thread
            threads = 32 * WARPS_PER_ROW
            span = CHUNK * WARPS_PER_ROW  # columns the row's threads cover per chunk
            n_chunks = (COLS + span - 1) // span
            ragged = [(k + 1) * span > COLS for k in range(n_chunks)]  # compile time: only the last can be
            vals = [v for k in range(n_chunks)
                    for v in load_chunk(x_row, k * span, thread, COLS, VEC, ragged[k], threads)]
            m = row_reduce(ty.maximum, tree_reduce(ty.maximum, vals), thread, WARPS_PER_ROW)
            shift = safe_shift(m * LOG2E)
            probs = [exp2_shifted(v, shift) for v in vals]
            l = row_reduce(operator.add, tree_reduce(operator.add, probs), thread, WARPS_PER_ROW)
            inv_l = ty.select(l > 0.0, ty.rcp(l), 0.0)
            for k in range(n_chunks):
                store_chunk(out_row, k * span, thread, COLS, [p * inv_l for p in probs[4 * k:4 * k + 4]], VEC,
                            ragged[k], threads)

    return softmax_full_row


@functools.cache
def three_pass_kernel(dtype):
    """The scalar three-pass kernel for ``dtype`` elements."""

    @ty.kernel(threads=WARPS * 32, name=f"softmax_three_pass_{dtype}", noalias=True)
    def softmax_three_pass(x: ty.ptr(dtype), out: ty.ptr(dtype), rows: ty.i32, cols: ty.i32):
        row, lane, x_row, out_row = row_pointers(x, out, rows, cols)
        if row < rows:
            m = ty.cast(NEG_INF, ty.f32)
            for c in range(lane, cols, 32):
                m = ty.maximum(m, ty.cast(x_row[c], ty.f32))
            shift = safe_shift(warp_max(m) * LOG2E)
            l = ty.cast(0.0, ty.f32)
            for c in range(lane, cols, 32):
                l = l + exp2_shifted(ty.cast(x_row[c], ty.f32), shift)
            l = warp_sum(l)
            inv_l = ty.select(l > 0.0, ty.rcp(l), 0.0)
            for c in range(lane, cols, 32):
                out_row[c] = ty.cast(exp2_shifted(ty.cast(x_row[c], ty.f32), shift) * inv_l, out_row.type.pointee)

    return softmax_three_pass


# -- launchers ------------------------------------------------------------------------------------

def _checked_tensors(fn: str, x, out, max_cols: int | None = None):
    """Validate x (and out, if given); returns (x contiguous, its element type, the output tensor)."""
    import torch
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn} expects x to be a torch.Tensor, but got {type(x).__name__}")
    name = str(x.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise TypeError(f"{fn} expects x of dtype float32, float16 or bfloat16, but got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{fn} expects x to be 2-D (rows, cols), but got shape {tuple(x.shape)}")
    if x.shape[0] >= 2**31 or x.shape[1] >= 2**31:
        raise ValueError(f"{fn} expects rows and cols below 2**31, but got shape {tuple(x.shape)}")
    if max_cols is not None and x.shape[1] > max_cols:
        raise ValueError(f"{fn} expects x with at most {max_cols} columns (one block holds the row in registers), "
                         f"but got {x.shape[1]}; use softmax_streaming for wider rows")
    if x.device.type != "cuda":
        raise ValueError(f"{fn} expects x on a CUDA device, but got one on {x.device}")
    x = x.contiguous()
    if out is None:
        return x, DTYPES[name], torch.empty_like(x)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{fn} expects out to be a torch.Tensor or None, but got {type(out).__name__}")
    if out.dtype != x.dtype or out.shape != x.shape or out.device != x.device:
        raise ValueError(f"{fn} expects out like x ({x.dtype}, shape {tuple(x.shape)}, {x.device}), but got "
                         f"{out.dtype}, shape {tuple(out.shape)}, {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{fn} expects a contiguous out, but got strides {out.stride()}")
    nbytes = x.numel() * x.element_size()
    if out.numel() and x.data_ptr() < out.data_ptr() + nbytes and out.data_ptr() < x.data_ptr() + nbytes:
        raise ValueError(f"{fn} expects out not to overlap x (the kernels reread x after writing out)")
    return x, DTYPES[name], out


def _vec(x, out) -> int:
    """4 when every row start of x and out is aligned for a 4-element vector access, else 1."""
    align = 4 * x.element_size()
    aligned = x.data_ptr() % align == 0 and out.data_ptr() % align == 0
    return 4 if x.shape[1] % 4 == 0 and aligned else 1


def _grid(rows: int) -> tuple[int]:
    return ((rows + WARPS - 1) // WARPS,)


def softmax_streaming(x, out=None):
    """``torch.softmax(x, dim=1)`` by the two-pass streaming kernel (any cols); written into ``out`` if given."""
    x, dtype, out = _checked_tensors("softmax_streaming", x, out)
    rows, cols = x.shape
    if rows and cols:
        streaming_kernel(dtype)[_grid(rows)](x, out, rows, cols, VEC=_vec(x, out))
    return out


def full_row_warps(cols: int) -> int:
    """WARPS_PER_ROW for a row of ``cols`` columns: how many warps share it in softmax_full_row.

    * cols <= 4096: 1. A lane holds up to 128 values; a 128-thread block lets ptxas give a thread
      up to 255 registers, so nothing spills (H200: ~4100 GB/s at 4096 columns).
    * wider: the fewest warps (a power of two) for which a lane holds at most 64 values
      (MAX_VALUES_PER_LANE): 4 up to 8192 columns, 8 up to 16384, 16 up to 32768. A block of T
      threads caps a thread at 65536 / T registers, 128 at 16 warps; 64 values take 80-100
      registers with the addresses and indices (ptxas, float32, VEC=4), 128 at 32768 with VEC=1.
      More warps with fewer values (32 a lane) hold no more of a row per register: each thread
      carries the same ~15-25 registers of overhead, so as many or fewer rows fit on an SM at once
      (16384 columns, by ptxas's counts: 3 rows at 8 warps, 2 at 16), and the cross-warp exchange
      has more entries.
    * above 32768 (MAX_FULL_ROW_COLS) no block can hold the row: 32 warps would cap a thread at 64
      registers, and a 65536-column float32 row is 256 KiB, the whole register file of an SM.
    """
    if not 1 <= cols <= MAX_FULL_ROW_COLS:
        raise ValueError(f"full_row_warps expects 1 <= cols <= {MAX_FULL_ROW_COLS}, but got {cols}")
    if cols <= MAX_ONE_WARP_COLS:
        return 1
    lanes = -(-cols // MAX_VALUES_PER_LANE)
    return next(w for w in WARPS_PER_ROW_CHOICES if 32 * w >= lanes)


def softmax_full_row(x, out=None):
    """``torch.softmax(x, dim=1)`` by the register-resident kernel; needs cols <= MAX_FULL_ROW_COLS (32768)."""
    x, dtype, out = _checked_tensors("softmax_full_row", x, out, max_cols=MAX_FULL_ROW_COLS)
    rows, cols = x.shape
    if rows and cols:
        warps_per_row = full_row_warps(cols)
        grid = _grid(rows) if warps_per_row == 1 else (rows,)
        full_row_kernel(dtype)[grid](x, out, rows, COLS=cols, VEC=_vec(x, out), WARPS_PER_ROW=warps_per_row)
    return out


def softmax_three_pass(x, out=None):
    """``torch.softmax(x, dim=1)`` by the scalar three-pass kernel (any cols); written into ``out`` if given."""
    x, dtype, out = _checked_tensors("softmax_three_pass", x, out)
    rows, cols = x.shape
    if rows and cols:
        three_pass_kernel(dtype)[_grid(rows)](x, out, rows, cols)
    return out
