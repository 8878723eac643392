"""A user's ``score_mod_bwd`` on the reference (torch) path, shared by ``variants.py`` and
``varlen_variants.py`` (this module imports only torch, so neither imports the other for it).

``UserGrad.apply(s, mod, bwd)`` is ``mod(s)`` whose derivative with respect to ``s`` is the user's
``bwd(s, grad)`` instead of autograd's through ``mod``. A generated packed-sequence mod carries
``VARLEN_RUN`` and applies the user's derivative itself (``handles_grad``).
"""
from __future__ import annotations

import torch

VARLEN_RUN = "__tylopy_varlen_run__"   # the attribute a generated packed-sequence mod carries


class UserGrad(torch.autograd.Function):
    """A user's score_mod whose derivative is the user's ``score_mod_bwd`` (the reference path)."""

    @staticmethod
    def forward(s, mod, bwd):
        return mod(s).to(s.dtype).expand(s.shape)

    @staticmethod
    def setup_context(ctx, inputs, output):
        s, _, bwd = inputs
        ctx.save_for_backward(s)
        ctx.bwd = bwd

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return ctx.bwd(s, grad).to(s.dtype).expand(s.shape), None, None


def handles_grad(ref) -> bool:
    """Whether a variant's score_mod is a generated one (it applies the user's score_mod_bwd itself)."""
    return ref is not None and hasattr(ref.function(), VARLEN_RUN)
