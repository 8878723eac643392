"""Vector add: out[i] = x[i] + y[i], one element per thread.

The smallest complete tylopy kernel: typed parameters, the thread index, a run-time bounds
check and pointer indexing. Run ``tylopy dump tylopy_kernels/examples/vector_add.py`` to see its PTX.
"""
import tylopy as ty

BLOCK = 256


@ty.kernel(threads=BLOCK)
def vector_add(x: ty.ptr(ty.f32), y: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
    i = ty.block_idx() * BLOCK + ty.thread_idx()
    if i < n:  # the last block may run past the end
        out[i] = x[i] + y[i]


def add(x, y):
    """out = x + y for two contiguous float32 CUDA tensors of the same size."""
    import torch
    out = torch.empty_like(x)
    n = x.numel()
    vector_add[((n + BLOCK - 1) // BLOCK,)](x, y, out, n)
    return out


def emulate_example(n: int = 1000):
    """``tylopy emulate tylopy_kernels/examples/vector_add.py``: the kernel lane by lane on the CPU against numpy."""
    import torch
    x, y = torch.randn(n), torch.randn(n)
    out = torch.full((n,), float("nan"))
    vector_add.emulate(x, y, out, n, grid=((n + BLOCK - 1) // BLOCK,))
    return out.numpy(), (x + y).numpy(), 0.0
