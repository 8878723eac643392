"""The score transform of programmable attention (steps 2-5 of ``attention/variants.py``) as DSL
code, and its derivative for the backward.

``score_and_grad(prob, b, h, q_idx, kv_idx, x, with_grad)`` gives ``(T(x), dT/dx)`` at the scaled
score x of one element (``dT/dx`` None when ``with_grad`` is False):

* by default ``dT/dx`` is ``ty.value_and_derivative`` of the very DSL function that gives T(x):
  the chain rule over the ops T traced (softcap's tanh, a user score_mod, ALiBi's and the float
  mask's additions, whose loads carry no derivative). A user score_mod made of operations without
  a derivative rule is an error naming the op and the line of the mod.
* with an explicit ``score_mod_bwd(score, grad, b, h, q_idx, kv_idx) -> grad`` (FlexAttention's
  joint-graph convention: the gradient with respect to the mod's input ``score`` given ``grad``, the
  gradient of its output; linear in ``grad``), the mod's derivative is ``score_mod_bwd(s, 1)``
  chained with softcap's; ALiBi and the float mask add constants.

Mods receive indices clamped into [0, N) and [0, N_k): a mod may index a tensor with them, and the
elements outside are masked anyway.
"""
import tylopy as ty


def transform_has_slope(variant) -> bool:
    """Whether dT/dx can differ from 1 (softcap or a score_mod): else the backward skips it."""
    return bool(variant.softcap) or variant.score_mod is not None


@ty.func
def clamped(vb, q_idx, kv_idx):
    return ty.minimum(q_idx, vb.n_q - 1), ty.minimum(kv_idx, vb.n_k - 1)


@ty.func
def softcapped(variant, x):
    if variant.softcap:
        return ty.tanh(x * (1.0 / variant.softcap)) * variant.softcap
    return x


@ty.func
def additive(vb, s, b, h, q_idx, kv_idx):
    """Steps 4-5: ALiBi's -slope |i + N_k - N - j| and the float mask's value (constants in s)."""
    var = vb.variant
    if var.alibi:
        slope = vb.slopes[b * vb.slope_stride_b + h]
        dist = ty.abs(q_idx + (vb.n_k - vb.n_q) - kv_idx)
        s = s - slope * ty.cast(dist, ty.f32)
    if var.attn_mask == "float":
        qc, kc = clamped(vb, q_idx, kv_idx)
        st = vb.fm_strides
        off = (ty.cast(b, ty.i64) * st[0] + ty.cast(h, ty.i64) * st[1] + ty.cast(qc, ty.i64) * st[2]
               + ty.cast(kc, ty.i64) * st[3])
        s = s + vb.fmask[off]
    return s


def score_transform(vb, x, b, h, q_idx, kv_idx):
    """T(x): steps 2-5 on one scaled score (an f32 run-time value), natural units."""
    var = vb.variant
    s = softcapped(var, x)
    if var.score_mod is not None:
        qc, kc = clamped(vb, q_idx, kv_idx)
        s = var.score_mod.function()(s, b, h, qc, kc)
    return additive(vb, s, b, h, q_idx, kv_idx)


def score_and_grad(prob, b, h, q_idx, kv_idx, x, with_grad):
    """(T(x), dT/dx or None): see the module text."""
    vb = prob.variant
    if not with_grad:
        return score_transform(vb, x, b, h, q_idx, kv_idx), None
    if vb.score_mod_bwd is None:
        return ty.value_and_derivative(lambda v: score_transform(vb, v, b, h, q_idx, kv_idx), x)
    var = vb.variant
    s, ds = ty.value_and_derivative(lambda v: softcapped(var, v), x)
    qc, kc = clamped(vb, q_idx, kv_idx)
    t = s
    grad = ds
    if var.score_mod is not None:
        t = var.score_mod.function()(s, b, h, qc, kc)
        grad = vb.score_mod_bwd(s, ds, b, h, qc, kc)
    return additive(vb, t, b, h, q_idx, kv_idx), grad
