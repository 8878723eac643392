"""The score transform of programmable attention (steps 2-5 of ``attention/variants.py``) and its
derivative, for the backward kernel.

The transform itself is the forward kernel's (``variant_tiles._transform``: softcap, the user's
score_mod traced by ``mods.call_traced``, ALiBi, the float mask), so both passes compute the same
scores bit for bit. ``score_and_grad(vb, ElementAt(b, h, q_idx, kv_idx), x, with_grad, slope, mval)``
gives ``(T(x), dT/dx)`` at the scaled score x of one element (``dT/dx`` None when ``with_grad`` is
False):

* by default ``dT/dx`` is ``ty.value_and_derivative`` of that very DSL function: the chain rule
  over the ops T traced (softcap's tanh, a user score_mod, ALiBi's and the float mask's
  additions, whose loads carry no derivative). A user score_mod made of operations without a
  derivative rule is an error naming the op and the line of the mod.
* with an explicit ``score_mod_bwd(score, grad, b, h, q_idx, kv_idx) -> grad`` (FlexAttention's
  convention: the gradient with respect to the mod's input ``score`` given ``grad``, the gradient of
  its output; linear in ``grad``; written against torch like the mod), ``dT/dx`` is
  ``score_mod_bwd(s, ds)`` with ``s, ds`` softcap's value and derivative; ALiBi and the float mask
  add constants. It is traced as the mod is (``mods.call_traced``): the tensors it captures are the
  views of their aux slots (``mod_registry.with_bwd_slots``: a mod's slot for a tensor the mod
  captures too, else one after the mods'), and it takes the user's ``aux`` when the score_mod does. On packed sequences it is the generated
  document-relative wrapper of the user's (``varlen_variants``), which reads the document table.
"""
from typing import Any, NamedTuple

import tylopy as ty

from tylopy_kernels.attention.mod_registry import ModError, mod_ref
from tylopy_kernels.attention.sm90 import mods
from tylopy_kernels.attention.sm90.variant_tiles import _after_softcap, _transform, softcap_tanh


class ForwardView:
    """What ``variant_tiles``' element functions read of a problem: its variant and lengths."""

    def __init__(self, vp, n_q, n_k):
        self.variant, self.n_q, self.n_k = vp, n_q, n_k


def transform_has_slope(key) -> bool:
    """Whether dT/dx can differ from 1 (softcap or a score_mod): else the backward skips it."""
    return bool(key.softcap) or key.score_mod is not None


def float_mask_at(vb, b, h, q_idx, kv_idx):
    """The float mask at (q_idx, kv_idx), 0 outside [0, N) x [0, N_k) (the load predicated off),
    as the forward reads it."""
    fv = vb.fwd
    inside = (q_idx < fv.n_q) & (kv_idx < fv.n_k)
    return ty.load(fv.variant.mask.address((b, h, q_idx, kv_idx)), mask=inside)


class ElementAt(NamedTuple):
    """Where one score element is: batch entry, query head, query and key positions (traced values)."""

    b: Any
    h: Any
    q_idx: Any
    kv_idx: Any


def score_and_grad(vb, at: ElementAt, x, with_grad, slope, mval):
    """(T(x), dT/dx or None): see the module text (``mval``: the float mask's value, or None)."""
    b, h, q_idx, kv_idx = at
    fv = vb.fwd
    vp = fv.variant
    key = vp.v

    def transform(v):
        return _transform(fv, v, b, h, q_idx, kv_idx, mval, slope)

    if not with_grad:
        return transform(x), None
    if key.softcap and key.score_mod is None:
        # softcap alone (ALiBi and the float mask add constants): d/dx c tanh(x / c) = 1 - t^2,
        # from the t the value used (2 instructions, not the chain rule through ex2 and rsqrt)
        t = softcap_tanh(vp, x)
        return _after_softcap(fv, vp.softcap * t, b, h, q_idx, kv_idx, mval, slope), ty.fma(-t, t, 1.0)
    if vb.score_mod_bwd is None:
        return ty.value_and_derivative(transform, x)
    s, ds = x, 1.0
    if key.softcap:
        t = softcap_tanh(vp, x)
        s, ds = vp.softcap * t, ty.fma(-t, t, 1.0)
    grad = ds
    if key.score_mod is not None:
        live = vp.kv.live
        grad = mods.call_traced("score_mod_bwd", user_bwd_ref(vb, live), live, vp.aux, (s, ds, b, h, q_idx, kv_idx))
    return transform(x), grad


def user_bwd_ref(vb, live):
    """The ModRef of the kernel's ``score_mod_bwd``: the call's Variant's (its tensors have slots there);
    a derivative given to the launcher alone gets one without slots, so it may read no tensors."""
    ref = live.score_mod_bwd
    if ref is not None and ref.function() is vb.score_mod_bwd:
        return ref
    ref, captured = mod_ref(vb.score_mod_bwd, "score_mod_bwd", 0, False)
    if captured:
        inner = getattr(vb.score_mod_bwd, "fn", vb.score_mod_bwd)
        raise ModError(f"attention: score_mod_bwd expects a function reading no tensors when it is not part of the "
                       f"variant ({inner.__code__.co_filename}:{inner.__code__.co_firstlineno}): pass it as the "
                       f"score_mod_bwd keyword, but got one reading the tensor {ref.tensor_slots[0][0]!r}")
    return ref


def mask_mod_keep(vb, b, h, q_idx, kv_idx, full):
    """The user's mask_mod at one element (traced as the forward traces it); True on a block mask's
    full tiles (``full``: None without a block mask), where the forward does not ask it."""
    vp = vb.fwd.variant
    got = mods.call_traced("mask_mod", vp.kv.live.mask_mod, vp.kv.live, vp.aux, (b, h, q_idx, kv_idx))
    return got | full if full is not None else got
