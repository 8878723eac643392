"""Every ``tylopy::`` torch operator, registered by importing this module (``import tylopy`` does):

=================================  ==============================================================
``tylopy::attention_fwd``/``_bwd`` ``tylopy.attention`` (``attention/autograd.py``)
``tylopy::attention_varlen_fwd``   ``tylopy.attention_varlen`` and nested jagged ``attention``
``tylopy::attention_varlen_bwd``
``tylopy::attention_decode``       ``tylopy.attention_decode`` (``attention/decode/api.py``)
``tylopy::matmul``                 ``tylopy.matmul`` (``gemm/ops.py``), differentiable
``tylopy::scaled_matmul``          ``tylopy.scaled_matmul`` (``gemm/fp8_ops.py``), FP8
``tylopy::attention_variant_fwd``  ``tylopy.attention`` with variant keywords
``tylopy::attention_variant_bwd``  (``attention/autograd_variants.py``)
``tylopy::varlen_doc_tables``      ``tylopy.attention_varlen`` with variant keywords: the document
                                   tables of the packed route (``attention/varlen_variants.py``)
``tylopy::attention_fp8_fwd``      ``tylopy.attention`` with float8 inputs (``attention/fp8.py``)
=================================  ==============================================================

and their autocast rule: under ``torch.autocast(device)`` the attention operators run in the
autocast dtype, as ``scaled_dot_product_attention`` does (a compiled or exported graph that
calls the operator with fp32 tensors under autocast casts them first). The entry points apply
the same rule in Python before their checks (``autocast_inputs``).

These modules import only torch when loaded; the kernels are imported, traced and compiled on
the first call on CUDA tensors.
"""
from __future__ import annotations

import torch

from tylopy_kernels.attention import autograd as _attention_ops
from tylopy_kernels.attention import autograd_variants as _variant_ops
from tylopy_kernels.attention import fp8 as _fp8_attention_ops
from tylopy_kernels.attention import varlen_variants as _varlen_variant_ops
from tylopy_kernels.attention.decode import api as _decode_ops
from tylopy_kernels.gemm import fp8_ops as _fp8_gemm_ops
from tylopy_kernels.gemm import ops as _gemm_ops

OPERATORS = ("tylopy::attention_fwd", "tylopy::attention_bwd", "tylopy::attention_varlen_fwd",
             "tylopy::attention_varlen_bwd", "tylopy::attention_decode", "tylopy::matmul",
             "tylopy::scaled_matmul", "tylopy::attention_variant_fwd", "tylopy::attention_variant_bwd",
             "tylopy::varlen_doc_tables", "tylopy::attention_fp8_fwd")
AUTOCAST_OPERATORS = ("tylopy::attention_fwd", "tylopy::attention_varlen_fwd", "tylopy::attention_variant_fwd")


_library = torch.library.Library("tylopy", "FRAGMENT")  # the autocast kernels' registrations live here


def _autocast_kernel(op, device_type: str):
    """A kernel for ``op``'s Autocast key: fp32 tensors in the current autocast dtype (whatever the
    region asked for, as autocast's own rule for SDPA; ``torch.library.register_autocast`` fixes one
    dtype at registration), then the operator below autocast."""
    key = getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type))

    def kernel(_keyset, *args):
        dtype = torch.get_autocast_dtype(device_type)
        args = [a.to(dtype) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a for a in args]
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return op(*args)
    return kernel


def _register_autocast():
    for qualname in AUTOCAST_OPERATORS:
        name = qualname.split("::")[1]
        op = getattr(torch.ops.tylopy, name).default
        for device_type in ("cuda", "cpu"):
            key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
            _library.impl(name, _autocast_kernel(op, device_type), key, with_keyset=True)


_register_autocast()

__all__ = ["OPERATORS", "AUTOCAST_OPERATORS"]
