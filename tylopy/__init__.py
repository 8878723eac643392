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

__all__ = ["kernel", "func", "Kernel", "CompiledKernel", "TylopyError", "KernelSourceError", "CompileError",
           "DriverError", "NoDriverError", "LaunchTypeError", "LaunchValueError", "OwnershipError",
           "ResourceLimitError", "attention", "__version__", *_lang_all]


def __getattr__(name):
    # The PyTorch entry point lives with the kernels (a layer above this package); import on first use.
    if name == "attention":
        from tylopy_kernels.attention import attention
        return attention
    raise AttributeError(f"module 'tylopy' has no attribute {name!r}")
