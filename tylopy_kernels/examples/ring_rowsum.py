"""Row sums of a 2-D float32 tensor through a TMA ring: the warp-specialized pipeline in small.

One block per 32 rows, two warps with different jobs (sm_90a):

1. Thread 0 sets up the ring (``ty.hopper.ring_init``: each stage's *full* barrier takes one
   arrival, its *empty* barrier one per consumer thread) and a ``syncthreads`` publishes it.
2. Warp 0 is the producer: one of its threads walks the row block's column tiles ``j = 0, 1, ...``;
   ``ring_acquire`` waits until tile ``j``'s stage is free (the consumers released the tile
   ``STAGES`` before it) and arms the stage's full barrier with the box's bytes; the TMA load of
   the (32 rows, 32 columns) box then completes that barrier. The producer runs up to ``STAGES``
   tiles ahead of the consumer.
3. Warp 1 is the consumer: ``ring_wait`` waits for tile ``j``'s bytes, each lane adds its row's 32
   values, and ``ring_release`` gives the stage back (every lane arrives: the empty barrier counts
   32). After the last tile each lane writes its row's sum.

Columns past the tensor's end arrive as zeros (they add nothing); rows past it are not written.
The same kernel runs on the GPU and in ``kernel.emulate``, whose protocol checks would report a
wait on a phase no one completes, an arrival past a barrier's count or a read of a stage before its
bytes landed. ``tylopy emulate tylopy_kernels/examples/ring_rowsum.py`` runs a ragged example.
"""
import tylopy as ty
from tylopy import hopper

BM, BN = 32, 32              # one box: 32 rows of 32 float32 columns (128 bytes a row, swizzle 0)
TILE_BYTES = BM * BN * 4
STAGES = 3
CONSUMER_THREADS = 32
RING = hopper.Ring(full=STAGES * TILE_BYTES, empty=STAGES * TILE_BYTES + 8 * STAGES, stages=STAGES)
SMEM_BYTES = STAGES * TILE_BYTES + 16 * STAGES


@ty.kernel(threads=64, arch="sm_90a")
def ring_rowsum(src: ty.tensormap, out: ty.ptr(ty.f32), rows: ty.i32, cols: ty.i32):
    smem = ty.dynamic_shared(ty.u8, SMEM_BYTES, align=128)
    t = ty.thread_idx()
    if t == 0:
        hopper.ring_init(smem, RING, CONSUMER_THREADS)
    ty.syncthreads()
    row0 = ty.block_idx(0) * BM
    n_tiles = (cols + (BN - 1)) // BN
    if ty.warp_idx() == 0:
        if t == 0:                                   # the producer
            for j in range(n_tiles):
                stage, full = hopper.ring_acquire(smem, RING, j, TILE_BYTES)
                hopper.tma_load(smem + stage * TILE_BYTES, src, full, j * BN, row0)
    else:                                            # the consumer: lane r sums row r of the block
        lane = ty.lane_id()
        total = 0.0
        for j in range(n_tiles):
            stage = hopper.ring_wait(smem, RING, j)
            row = ty.ptr_cast(smem + (stage * TILE_BYTES + lane * (BN * 4)), ty.f32)
            for c in ty.static_range(BN):
                total = total + ty.load(row + c)
            hopper.ring_release(smem, RING, j)
        if row0 + lane < rows:
            ty.store(out + (row0 + lane), total)


def row_sums(x, *, emulate: bool = False):
    """``x.sum(1)`` for a 2-D float32 tensor (CUDA; CPU with ``emulate=True``), through the ring."""
    import torch
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"row_sums: x expects a 2-D float32 tensor, but got "
                         f"{getattr(x, 'dtype', type(x).__name__)} of shape {tuple(getattr(x, 'shape', ()))}")
    if x.device.type != ("cpu" if emulate else "cuda"):
        raise ValueError(f"row_sums: x expects a {'CPU' if emulate else 'CUDA'} tensor, but got one on {x.device}")
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return out.zero_()
    src = ty.tensor_map(x, box=(BM, BN))
    grid = ((x.shape[0] + BM - 1) // BM,)
    if emulate:
        ring_rowsum.emulate(src, out, x.shape[0], x.shape[1], grid=grid)
    else:
        ring_rowsum[grid](src, out, x.shape[0], x.shape[1])
    return out


def emulate_example(rows: int = 45, cols: int = 140):
    """``tylopy emulate tylopy_kernels/examples/ring_rowsum.py``: 2 row blocks of 5 column tiles (the
    ring of 3 stages wraps), ragged both ways, against float64."""
    import torch
    g = torch.Generator().manual_seed(5)
    x = torch.randn(rows, cols, generator=g)
    return row_sums(x, emulate=True).numpy(), x.double().sum(1).numpy(), 1e-4
