"""``tylopy.attention_decode`` and its torch operator ``tylopy::attention_decode``.

The entry point checks its arguments (``launch.check_decode_inputs``) and, for plain CUDA
tensors outside a trace, launches directly (``launch.attention_decode``: the plan of a repeated
call is cached). Under ``torch.compile`` / ``torch.export``, for meta or fake tensors and other
tensor subclasses it calls the operator instead, whose fake implementation gives the shapes, so
a decoding step traces into one graph:

    tylopy::attention_decode(q, k_cache, v_cache, cache_seqlens, block_table, scale, is_causal,
                             num_splits, return_lse, layout, merge) -> (out, lse)

``lse`` is (B, H_q, n_q) fp32 when ``return_lse`` and an empty (0,) tensor otherwise (the kernel
skips it). On CUDA the operator runs the kernels; on any other device it computes the float64
reference (``launch.reference_decode``) and rounds to q's dtype, so an exported program runs on
the CPU too. The operator has no gradient (decoding is inference).

This module imports only torch at load time: ``import tylopy`` registers the operator without
tracing or compiling a kernel.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tylopy_kernels.attention.common import rejecter
from tylopy_kernels.attention.decode.status import block_table_status, check_block_table

_fail = rejecter("attention_decode")


@torch.library.custom_op("tylopy::attention_decode", mutates_args=())
def attention_decode_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                        block_table: Optional[Tensor], scale: Optional[float], is_causal: bool,
                        num_splits: Optional[int], return_lse: bool, layout: str, merge: str) -> tuple[Tensor, Tensor]:
    from tylopy_kernels.attention.decode import launch
    if q.device.type == "cuda":
        res = launch.attention_decode(launch.DecodeTensors(q, k_cache, v_cache, cache_seqlens, block_table),
                                      launch.DecodeOptions(scale, is_causal, num_splits, return_lse, layout, merge))
        return res if return_lse else (res, _no_lse(q))
    out, lse = launch.reference_decode(q, k_cache, v_cache, cache_seqlens, scale=scale, block_table=block_table,
                                       is_causal=is_causal, layout=layout)
    return out.to(q.dtype).contiguous(), (lse.to(torch.float32).contiguous() if return_lse else _no_lse(q))


def _no_lse(q):
    return torch.empty((0,), dtype=torch.float32, device=q.device)


@attention_decode_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, scale, is_causal, num_splits, return_lse, layout, merge):
    if not return_lse:
        return q.new_empty(q.shape), q.new_empty((0,), dtype=torch.float32)
    B, n_q, H_q = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bshd" else (q.shape[0], q.shape[2], q.shape[1])
    return q.new_empty(q.shape), q.new_empty((B, H_q, n_q), dtype=torch.float32)


def _through_op(q) -> bool:
    """A trace, meta/fake tensors or a tensor subclass take the operator; plain CUDA tensors launch."""
    return type(q) is not torch.Tensor or q.is_meta or torch.compiler.is_compiling()


_launch = None  # decode/launch.py, imported on the first call: loading this module compiles nothing


def attention_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, block_table=None, is_causal=False,
                     num_splits=None, return_lse=False, layout="bshd", merge="atomic", schedule=None,
                     check_inputs=False):
    """Attention of q's few rows per head against each sequence's first ``cache_seqlens[b]``
    cached keys; ``out`` or ``(out, lse)``. ``launch.py``'s docstring has the layouts, the paged
    cache and the split-KV schedule. ``check_inputs=True`` checks ``block_table`` on the host before
    launching (a synchronization); ``attention_decode.block_table_status()`` and
    ``attention_decode.check_block_table()`` read what the device found without one."""
    if not isinstance(cache_seqlens, torch.Tensor):  # before any cache key reads its shape
        from tylopy_kernels.attention.decode.launch import SEQLENS_EXPECTED
        _fail(TypeError, "cache_seqlens", SEQLENS_EXPECTED, type(cache_seqlens).__name__)
    if isinstance(q, torch.Tensor) and _through_op(q):
        from tylopy_kernels.attention.decode.launch import DecodeOptions, DecodeTensors, check_decode_inputs
        scale = check_decode_inputs(DecodeTensors(q, k_cache, v_cache, cache_seqlens, block_table),
                                    DecodeOptions(scale, is_causal, num_splits, False, layout, merge))[-1]
        if schedule is not None:
            _fail(ValueError, "schedule", "None under torch.compile / torch.export or for fake tensors (it is a "
                  "benchmark setting)", schedule)
        if type(return_lse) is not bool:
            _fail(TypeError, "return_lse", "a bool", type(return_lse).__name__)
        if check_inputs:
            _fail(ValueError, "check_inputs", "False under torch.compile / torch.export or for fake tensors (it "
                  "reads block_table on the host)", check_inputs)
        out, lse = attention_decode_op(q, k_cache, v_cache, cache_seqlens, block_table, scale, is_causal, num_splits,
                                       return_lse, layout, merge)
        return (out, lse) if return_lse else out
    global _launch
    if _launch is None:
        from tylopy_kernels.attention.decode import launch
        _launch = launch
    return _launch.attention_decode(_launch.DecodeTensors(q, k_cache, v_cache, cache_seqlens, block_table),
                                    _launch.DecodeOptions(scale, is_causal, num_splits, return_lse, layout, merge,
                                                          schedule),
                                    check_inputs=check_inputs)


# what the device found in block_table since the last read (docs/serving.md); these import only torch
attention_decode.block_table_status = block_table_status
attention_decode.check_block_table = check_block_table


__all__ = ["attention_decode", "attention_decode_op"]
