"""The variants the FA3-class kernel (flash-attn-4's CuTe DSL interface) has no built-in for,
written as its CuTe-DSL modifiers: ALiBi as a score_mod (with its backward, the identity: the
bias does not depend on the score), the document and block-table masks as mask_mods reading an
aux tensor, and its block-sparse tensors taken from FlexAttention's BlockMask of the same mask.

Imported only where ``flash_attn.cute`` imports (it needs cutlass).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from flash_attn.cute import utils


def alibi_score_mod(heads):
    """(score_mod, score_mod_bwd): score - 2^(-8 (h + 1) / heads) (q_idx - kv_idx). The variant is
    causal, so q_idx - kv_idx = |q_idx - kv_idx| on every pair that stays visible."""
    step = -8.0 / heads

    @cute.jit
    def alibi(score, b_idx, h_idx, q_idx, kv_idx, seqlen_info=None, aux_tensors=None, aux_scalars=None):
        slope = cute.math.exp2((h_idx + cute.full_like(h_idx, 1)).to(cutlass.Float32) * cute.full_like(score, step))
        return score - slope * (q_idx - kv_idx).to(cutlass.Float32)

    @cute.jit
    def alibi_bwd(grad, score, b_idx, h_idx, q_idx, kv_idx, seqlen_info=None, aux_tensors=None, aux_scalars=None):
        return grad

    return alibi, alibi_bwd


def document_mask_mod():
    """Causal inside a document: aux_tensors[0] is the int32 document id of every packed token."""
    @cute.jit
    def document_causal(b_idx, h_idx, q_idx, kv_idx, seqlen_info=None, aux_tensors=None, aux_scalars=None):
        doc = aux_tensors[0]
        q_doc = utils.scalar_to_ssa(doc[q_idx[0]], cutlass.Int32)
        kv_doc = utils.scalar_to_ssa(doc[kv_idx[0]], cutlass.Int32)
        return (q_doc == kv_doc) & (q_idx >= kv_idx)
    return document_causal


def block_table_mask_mod(block, columns):
    """aux_tensors[0] is the int32 block table, flattened row-major (``columns`` blocks a row)."""
    @cute.jit
    def block_table(b_idx, h_idx, q_idx, kv_idx, seqlen_info=None, aux_tensors=None, aux_scalars=None):
        table = aux_tensors[0]
        keep = utils.scalar_to_ssa(table[(q_idx[0] // block) * columns + kv_idx[0] // block], cutlass.Int32)
        return keep > utils.scalar_to_ssa(0, cutlass.Int32)
    return block_table


def block_sparse_tensors(block_mask):
    """(forward, backward) BlockSparseTensorsTorch from a FlexAttention BlockMask: the forward
    lists key blocks per query block, the backward query blocks per key block."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    size = tuple(block_mask.BLOCK_SIZE)
    fwd = BlockSparseTensorsTorch(mask_block_cnt=block_mask.kv_num_blocks, mask_block_idx=block_mask.kv_indices,
                                  full_block_cnt=block_mask.full_kv_num_blocks,
                                  full_block_idx=block_mask.full_kv_indices, block_size=size)
    bwd = BlockSparseTensorsTorch(mask_block_cnt=block_mask.q_num_blocks, mask_block_idx=block_mask.q_indices,
                                  full_block_cnt=block_mask.full_q_num_blocks,
                                  full_block_idx=block_mask.full_q_indices, block_size=size)
    return fwd, bwd
