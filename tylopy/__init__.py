"""tylopy: a Python DSL for NVIDIA GPU kernels whose IR makes register ownership explicit.

    import tylopy as ty

    @ty.kernel(threads=256)
    def add(x: ty.ptr(ty.f32), y: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
        i = ty.block_idx() * 256 + ty.thread_idx()
        if i < n:
            out[i] = x[i] + y[i]

    add[(n + 255) // 256,](x, y, out, n)
"""
from .errors import (CompileError, DriverError, KernelSourceError, LaunchTypeError, LaunchValueError, NoDriverError,
                     OwnershipError, ResourceLimitError, TylopyError)
from .jit import CompiledKernel, Kernel, __version__, func, kernel
from .lang import *  # noqa: F401,F403  (the kernel language is the package's namespace)
from .lang import __all__ as _lang_all
from . import hopper  # noqa: F401  (ty.hopper.tma_load, ty.hopper.mbarrier_wait, ...)
from .ir.fragment import Fragment
from .ir.layouts import (MMA_SYNC_A, MMA_SYNC_B, MMA_SYNC_C, QUAD, WARP, WARPGROUP, WGMMA_A_RS, Layout,
                         LocalOwnership, Ownership, tiled_mma_c, wgmma_acc)
from .ir.mma_sync import MmaSyncAtom
from .ir.softmax import SoftmaxState, SoftmaxUpdate, softmax_lse, softmax_merge, softmax_normalize, softmax_update
from .ir.wgmma import WgmmaAtom


def pack_operand_a(atom, *args, **kwargs):
    """Same-lane f32 accumulator -> 16-bit A operand of the next MMA.

    ``pack_operand_a(MmaSyncAtom(...), left, right)`` or ``(atom, acc, m, k)`` for mma.sync;
    ``pack_operand_a(WgmmaAtom(...), acc, k)`` for the wgmma register-A form.
    """
    from .ir import mma_sync, wgmma
    if isinstance(atom, MmaSyncAtom):
        return mma_sync.pack_operand_a(atom, *args, **kwargs)
    if isinstance(atom, WgmmaAtom):
        return wgmma.pack_operand_a(*args, dtype=atom.dtype, **kwargs)
    raise TypeError(f"pack_operand_a expects an MmaSyncAtom or WgmmaAtom, but got {atom!r}")

__all__ = ["kernel", "func", "Kernel", "CompiledKernel", "TylopyError", "KernelSourceError", "CompileError",
           "DriverError", "NoDriverError", "LaunchTypeError", "LaunchValueError", "OwnershipError",
           "ResourceLimitError", "attention", "__version__", "Fragment", "Layout", "Ownership", "LocalOwnership",
           "QUAD", "WARP", "WARPGROUP", "MMA_SYNC_A", "MMA_SYNC_B", "MMA_SYNC_C", "WGMMA_A_RS", "tiled_mma_c",
           "wgmma_acc", "MmaSyncAtom", "WgmmaAtom", "SoftmaxState", "SoftmaxUpdate", "softmax_update",
           "softmax_normalize", "softmax_merge", "softmax_lse", "pack_operand_a", "hopper", *_lang_all]


def __getattr__(name):
    # The PyTorch entry point lives with the kernels (a layer above this package); import on first use.
    if name == "attention":
        from tylopy_kernels.attention import attention
        return attention
    raise AttributeError(f"module 'tylopy' has no attribute {name!r}")
