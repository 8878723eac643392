"""How each library runs each attention variant, in its own tensor layout.

A builder takes a ``Spec`` and the common inputs (batch, heads, seq, D) and returns a ``Run``:
``forward()`` calls the library on leaves of its own layout (so no transpose is timed),
``to_common(t)`` turns an output or gradient back into (batch, heads, seq, D) for checking.
Builders raise ``Unavailable`` when the library is absent or does not offer the variant; an
exception from the library's own call is reported on the row as "not supported (<error>)".
"""
from __future__ import annotations

from tylopy_kernels.attention.bench import variant_cases as cases

LIBRARIES = ("tylopy", "fa3_cute", "flex")


class Unavailable(Exception):
    """The library is not installed here, or has no form of this variant."""


class Run:
    """One library's call of one variant: ``forward()`` returns the output in the library's
    layout; ``leaves`` (q, k, v in that layout) require grad; ``dout`` is in that layout."""

    def __init__(self, forward, leaves, dout, to_common, note=""):
        self.forward, self.leaves, self.dout, self.to_common, self.note = forward, leaves, dout, to_common, note

    def backward_fn(self):
        """A forward with grad, then a function that runs only the backward (graph kept)."""
        import torch
        out = self.forward()
        return lambda: torch.autograd.grad(out, self.leaves, self.dout, retain_graph=True)


def _leaves(x, layout):
    """q, k, v, dout of the common (B, H, N, D) inputs as ``layout`` wants them."""
    if layout == "bhnd":
        qkv = [x[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]
        return qkv, x["dout"], lambda t: t
    if layout == "bnhd":
        qkv = [x[n].transpose(1, 2).contiguous().requires_grad_() for n in ("q", "k", "v")]
        return qkv, x["dout"].transpose(1, 2).contiguous(), lambda t: t.transpose(1, 2)
    if layout == "thd":  # packed varlen: (total, H, D) from batch 1
        qkv = [x[n][0].transpose(0, 1).contiguous().requires_grad_() for n in ("q", "k", "v")]
        return qkv, x["dout"][0].transpose(0, 1).contiguous(), lambda t: t.transpose(0, 1).unsqueeze(0)
    raise ValueError(f"layout expects bhnd, bnhd or thd, but got {layout!r}")


# -- tylopy ---------------------------------------------------------------------------------------

def tylopy_run(spec, x):
    import tylopy
    if spec.variant in ("document_varlen", "document_window"):
        (q, k, v), dout, to_common = _leaves(x, "thd")
        cu, top = x["cu_seqlens"], x["max_seqlen"]
        kw = _varlen_kwargs(spec)  # window + softcap: the packed variant route (varlen_variants.py)
        return Run(lambda: tylopy.attention_varlen(q, k, v, cu, cu, top, top, is_causal=True, **kw),
                   [q, k, v], dout, to_common, ", ".join(["attention_varlen", *sorted(kw)]))
    (q, k, v), dout, to_common = _leaves(x, "bhnd")
    kwargs = _tylopy_kwargs(spec, x)
    return Run(lambda: tylopy.attention(q, k, v, **kwargs), [q, k, v], dout, to_common,
               ", ".join(sorted(kwargs)))


def _varlen_kwargs(spec):
    """The variant keywords of a packed (varlen) call, the same names in tylopy and flash-attn."""
    return {"window_size": (cases.WINDOW, 0), "softcap": cases.SOFTCAP} if spec.variant == "document_window" else {}


def _tylopy_kwargs(spec, x):
    if spec.variant in ("document_mask", "block_sparse"):
        mod = cases.mask_mod(spec, x["q"].device)
        return {"mask_mod": mod, "block_mask": _tylopy_block_mask(mod, spec, x["q"].device)}
    kwargs = {"is_causal": True}
    if spec.variant == "sliding_window":
        kwargs["window_size"] = (cases.WINDOW, 0)
    elif spec.variant == "softcap":
        kwargs["softcap"] = cases.SOFTCAP
    elif spec.variant == "alibi":
        kwargs["alibi_slopes"] = x["slopes"]
    elif spec.variant == "sinks":
        kwargs["sinks"] = x["sinks"]
    return kwargs


def _tylopy_block_mask(mod, spec, device):
    """The block mask broadcast over batch and heads (the mask reads neither); the full
    (batch, heads) form where the broadcast one is refused."""
    import tylopy
    try:
        return tylopy.create_block_mask(mod, 1, 1, spec.seq, spec.seq, device=device)
    except (ValueError, TypeError):
        return tylopy.create_block_mask(mod, spec.batch, spec.heads, spec.seq, spec.seq, device=device)


# -- the FA3-class kernel (flash-attn-4's CuTe DSL interface) --------------------------------------

def fa3_import():
    """(the flash_attn.cute.interface module, None) or (None, why it does not import here)."""
    try:
        from flash_attn.cute import interface
        return interface, None
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        return None, f"{type(e).__name__}: {e}"[:200]


def fa3_run(spec, x):
    fa, why = fa3_import()
    if fa is None:
        raise Unavailable(f"flash_attn.cute does not import ({why})")
    if spec.variant in ("document_varlen", "document_window"):
        (q, k, v), dout, to_common = _leaves(x, "thd")
        cu, top = x["cu_seqlens"], x["max_seqlen"]
        kw = _varlen_kwargs(spec)
        return Run(lambda: _first(fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                             max_seqlen_q=top, max_seqlen_k=top, causal=True, **kw)),
                   [q, k, v], dout, to_common, ", ".join(["flash_attn_varlen_func", *sorted(kw)]))
    (q, k, v), dout, to_common = _leaves(x, "bnhd")
    kwargs, note = _fa3_kwargs(spec, x)
    return Run(lambda: _first(fa.flash_attn_func(q, k, v, **kwargs)), [q, k, v], dout, to_common, note)


def _first(res):
    return res[0] if isinstance(res, tuple) else res


def _fa3_kwargs(spec, x):
    """flash_attn_func's keywords for the variant: its built-ins where it has them (causal,
    window_size, softcap, learnable_sink), a CuTe-DSL score_mod for ALiBi, and a CuTe-DSL
    mask_mod with block-sparse tensors (from FlexAttention's block mask) for the masks."""
    if spec.variant in CAUSAL_OR_BUILTIN:
        kwargs = {"causal": True}
        if spec.variant == "sliding_window":
            kwargs["window_size"] = (cases.WINDOW, 0)
        elif spec.variant == "softcap":
            kwargs["softcap"] = cases.SOFTCAP
        elif spec.variant == "sinks":
            kwargs["learnable_sink"] = x["sinks"]
        elif spec.variant == "alibi":
            from tylopy_kernels.attention.bench import variant_cute
            kwargs["score_mod"], kwargs["score_mod_bwd"] = variant_cute.alibi_score_mod(spec.heads)
        return kwargs, ", ".join(sorted(kwargs))
    from tylopy_kernels.attention.bench import variant_cute
    if spec.variant == "document_mask":
        mod, aux = variant_cute.document_mask_mod(), [x["doc_ids"]]
    else:
        mod, aux = variant_cute.block_table_mask_mod(spec.block, len(spec.table)), [x["table"].reshape(-1)]
    fwd, bwd = variant_cute.block_sparse_tensors(_flex_block_mask(spec, x))
    return ({"mask_mod": mod, "aux_tensors": aux, "block_sparse_tensors": fwd, "block_sparse_tensors_bwd": bwd},
            "mask_mod + block_sparse_tensors")


CAUSAL_OR_BUILTIN = ("causal", "sliding_window", "softcap", "alibi", "sinks")


# -- torch.compile(flex_attention) ----------------------------------------------------------------

_COMPILED = {}


def _flex():
    """torch.compile(flex_attention) (one compiled callable; it specializes per shape and mods),
    with dynamo's recompile limit raised: every (variant, D, N) is a new specialization, and
    past the limit dynamo would fall back to the eager flex_attention."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    if "flex" not in _COMPILED:
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 4096))
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
        _COMPILED["flex_sinks"] = torch.compile(_flex_with_sinks, dynamic=False)
    return _COMPILED


def _flex_with_sinks(q, k, v, block_mask, sinks):
    """flex_attention has no sink: rescale its output by sigmoid(lse - sink), the share of the
    row's softmax mass that stays on the keys once exp(sink) joins the denominator."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    out, lse = flex_attention(q, k, v, block_mask=block_mask, return_lse=True)
    return out * torch.sigmoid(lse - sinks[None, :, None]).unsqueeze(-1).to(out.dtype)


def _flex_block_mask(spec, x):
    """FlexAttention's BlockMask (128 x 128 blocks) of the variant, broadcast over batch and heads."""
    from torch.nn.attention.flex_attention import create_block_mask
    mod = cases.mask_mod(spec, x["q"].device)
    return create_block_mask(mod, None, None, spec.seq, spec.seq, device=x["q"].device)


def flex_run(spec, x):
    try:
        from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401
    except ImportError as e:
        raise Unavailable(f"torch.nn.attention.flex_attention does not import ({e})") from e
    compiled = _flex()
    (q, k, v), dout, to_common = _leaves(x, "bhnd")
    block_mask = _flex_block_mask(spec, x)
    note = ("packed B=1, document mask_mod (no varlen form)" if spec.variant in ("document_varlen", "document_window")
            else "")
    if spec.variant == "sinks":
        sinks = x["sinks"]
        return Run(lambda: compiled["flex_sinks"](q, k, v, block_mask, sinks), [q, k, v], dout, to_common,
                   "output x sigmoid(lse - sink)")
    mod = cases.score_mod(spec, x["slopes"])
    return Run(lambda: compiled["flex"](q, k, v, score_mod=mod, block_mask=block_mask), [q, k, v], dout,
               to_common, note or ("score_mod" if mod else "mask_mod"))


BUILDERS = {"tylopy": tylopy_run, "fa3_cute": fa3_run, "flex": flex_run}


def build(library, spec, x):
    """The library's Run for the variant; raises Unavailable (or the library's own error)."""
    if library not in BUILDERS:
        raise ValueError(f"library expects one of {', '.join(BUILDERS)}, but got {library!r}")
    return BUILDERS[library](spec, x)
