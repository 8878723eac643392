"""tylopy: a Python DSL for NVIDIA GPU kernels whose IR makes register ownership explicit.

    import tylopy as ty

    @ty.kernel(threads=256)
    def add(x: ty.ptr(ty.f32), y: ty.ptr(ty.f32), out: ty.ptr(ty.f32), n: ty.i32):
        i = ty.block_idx() * 256 + ty.thread_idx()
        if i < n:
            out[i] = x[i] + y[i]

    add[(n + 255) // 256,](x, y, out, n)

The namespace holds the kernel language (``tylopy.language.lang``), the tile library
(``tylopy.tile``: fragments, layouts, MMA atoms, online softmax), Hopper's instructions
(``ty.hopper``) and the errors; and the functions built from tylopy's kernels:
``ty.attention``, ``ty.attention_varlen``, ``ty.attention_decode``, ``ty.matmul``, ``ty.scaled_matmul``
(``tylopy.functions``)
and ``ty.distributed.ring_attention`` (``tylopy.distributed``), whose torch operators this import
registers (docs/pytorch.md).
"""
from . import _logging
from ._logging import configure as configure_logging
from . import hopper  # noqa: F401  (ty.hopper.tma_load, ty.hopper.mbarrier_wait, ...)
from .errors import (ArchMismatchError, CaptureError, CompileError, CompileOptionError, DriverError, KernelSourceError,
                     LaunchTypeError, LaunchValueError, NoDriverError, OwnershipError, ResourceLimitError, TylopyError)
from .jit.kernel import CompiledKernel, Kernel, __version__, func, kernel
from .ir.arguments import strided
from .runtime.launch import PreparedLaunch
from .runtime.tensormap import TensorMap
from .runtime.tensormap_api import tensor_map
from .runtime.hooks import CompileEvent, LaunchEvent, observe
from .runtime.plancache import PlanCache, clear_caches
from .jit.autotune import Config, autotune
from .language.lang import *  # noqa: F401,F403  (the kernel language is the package's namespace)
from .language.lang import __all__ as _lang_all
from .jit.options import CompileOptions
from .language.async_copy import cp_async, cp_async_commit, cp_async_wait
from .language.matrix import ldmatrix, stmatrix
from .tile.mma_sync import MMA_SYNC_K8_A, MMA_SYNC_K8_B, mma
from .language.atomics import *  # noqa: F401,F403  (ty.atomic_add, ty.red_add, ...)
from .language.atomics import __all__ as _atomics_all
from .language.debug import device_assert, printf
from .language.cluster import *  # noqa: F401,F403  (ty.cluster_ctarank, ty.cluster_sync, ty.cluster_map, ...)
from .language.cluster import __all__ as _cluster_all
from .language.fp8 import e4m3, e5m2, pack_fp8x2, pack_fp8x4, unpack_fp8x2, unpack_fp8x4
from .language.elementwise import ceil, exp, floor, log, sigmoid, tanh, where
from .language.derivative import jvp, value_and_derivative
from .language.warp import *  # noqa: F401,F403  (ty.vote_all, ty.ballot, ty.warp_reduce, ...)
from .language.warp import __all__ as _warp_all
from .tile import block_reduce, block_scan, warp_scan, warp_sort, warp_topk
from .tile import MMA_SYNC_A_K32, MMA_SYNC_B_K32, WGMMA_A_RS_FP8
from .tile import (MMA_SYNC_A, MMA_SYNC_B, MMA_SYNC_C, QUAD, WARP, WARPGROUP, WGMMA_A_RS, Fragment, Layout,
                   LocalOwnership, MmaSyncAtom, Ownership, SoftmaxState, SoftmaxUpdate, WgmmaAtom, pack_operand_a,
                   softmax_lse, softmax_merge, softmax_normalize, softmax_update, tiled_mma_c, wgmma_acc)

_logging.configure_from_environment()

__all__ = ["kernel", "func", "tensor_map", "TensorMap", "configure_logging", "Kernel", "CompiledKernel", "PreparedLaunch", "strided", "observe", "CompileEvent", "LaunchEvent", "PlanCache", "clear_caches",
           "CompileOptions", "TylopyError", "KernelSourceError",
           "CompileError", "CompileOptionError", "CaptureError", "DriverError", "NoDriverError", "LaunchTypeError",
           "ArchMismatchError",
           "LaunchValueError", "OwnershipError", "ResourceLimitError", "__version__", "Fragment", "Layout",
           "Ownership", "LocalOwnership", "QUAD", "WARP", "WARPGROUP", "MMA_SYNC_A", "MMA_SYNC_B", "MMA_SYNC_C",
           "WGMMA_A_RS", "tiled_mma_c", "wgmma_acc", "MmaSyncAtom", "WgmmaAtom", "SoftmaxState", "SoftmaxUpdate",
           "softmax_update", "softmax_normalize", "softmax_merge", "softmax_lse", "pack_operand_a", "hopper",
           "autotune", "Config", "mma", "MMA_SYNC_K8_A", "MMA_SYNC_K8_B", "ldmatrix", "stmatrix", "cp_async",
           "cp_async_commit", "cp_async_wait",
           *_lang_all, *_atomics_all, *_warp_all, *_cluster_all, "printf", "device_assert",
           "exp", "log", "sigmoid", "tanh", "floor", "ceil", "where", "jvp", "value_and_derivative",
           "attention", "attention_varlen", "attention_decode", "matmul", "scaled_matmul", "create_block_mask",
           "BlockMask", "distributed",
           "e4m3", "e5m2", "MMA_SYNC_A_K32", "MMA_SYNC_B_K32", "WGMMA_A_RS_FP8", "pack_fp8x2", "pack_fp8x4",
           "unpack_fp8x2", "unpack_fp8x4", "block_reduce", "block_scan", "warp_scan", "warp_sort", "warp_topk"]


def __getattr__(name):
    hint = _OTHER_NAMES.get(name)
    raise AttributeError(f"module 'tylopy' has no attribute {name!r}" + (f"; {hint}" if hint else ""))


# Names from other kernel languages (Triton, CUDA, numpy) a kernel author may try first.
_OTHER_NAMES = {
    "program_id": "the block index is ty.block_idx(axis)", "num_programs": "use ty.grid_dim(axis)",
    "float32": "the type is ty.f32", "float16": "the type is ty.f16", "bfloat16": "the type is ty.bf16",
    "float8_e4m3fn": "the type is ty.e4m3", "float8_e5m2": "the type is ty.e5m2",
    "int32": "the type is ty.i32", "int64": "the type is ty.i64", "uint32": "the type is ty.u32",
    "zeros": "kernels hold scalars and fragments: ty.Fragment / atom.zeros(), or a Python list of values",
    "arange": "index with ty.thread_idx() and a loop: for i in range(ty.thread_idx(), n, threads)",
    "syncwarp": "warp collectives are .sync with the full mask", "sin": "not provided", "cos": "not provided",
    "__syncthreads": "use ty.syncthreads()", "shfl_sync": "use ty.shfl_xor / shfl_idx / shfl_down / shfl_up",
    "atomicAdd": "use ty.atomic_add(ptr, value)", "expf": "use ty.exp (or ty.exp2)", "logf": "use ty.log",
    "sum": "a warp's sum is ty.warp_reduce('sum', x)",
    "erf": "not provided; build it from ty.exp and ty.fma, or use tanh-form GELU with ty.tanh",
}


# Last, once the namespace above is complete: the functions built from the kernels (tylopy_kernels),
# which import this package for the kernel language. Loading them registers the tylopy:: torch
# operators, so an exported program runs after `import tylopy` alone; no kernel is traced or
# compiled here (tylopy/functions.py).
from .functions import (attention, attention_varlen, attention_decode, matmul, scaled_matmul,  # noqa: E402
                        create_block_mask, BlockMask)
from . import distributed  # noqa: E402
