"""The functions built from tylopy's kernels, as plain names of the package:

    import tylopy as ty
    out = ty.attention(q, k, v, is_causal=True)          # tylopy_kernels.attention
    out = ty.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    out = ty.attention_decode(q, k_cache, v_cache, cache_seqlens)
    c = ty.matmul(a, b)                                   # tylopy_kernels.gemm
    c = ty.scaled_matmul(a8, w8.t(), scale_a, scale_b)    # tylopy_kernels.gemm.fp8_ops

Importing this module (``import tylopy`` does, last) registers the ``tylopy::`` torch operators
behind them (``tylopy_kernels.ops``), so a ``torch.export`` program that calls them loads in a
process that did nothing but ``import tylopy``. It imports only the modules that define the
entry points and the operators (torch, no kernel definitions): the kernels are traced and
compiled on first use.

This is the one place where the language package names the kernels package above it. The
kernels import ``tylopy`` for the language; ``tylopy/__init__`` imports this facade after its
namespace is complete, so the names the kernels need are there whichever package is imported
first (docs/pytorch.md, docs/design.md).
"""
from __future__ import annotations

from tylopy_kernels import ops as _ops  # noqa: F401  (registers the tylopy:: operators)
from tylopy_kernels.attention import attention, attention_varlen
from tylopy_kernels.attention.block_mask import BlockMask, create_block_mask
from tylopy_kernels.attention.decode.api import attention_decode
from tylopy_kernels.gemm import matmul
from tylopy_kernels.gemm.fp8_ops import scaled_matmul

__all__ = ["attention", "attention_varlen", "attention_decode", "matmul", "scaled_matmul", "create_block_mask",
           "BlockMask"]
