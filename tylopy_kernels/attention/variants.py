"""Programmable attention: what modifies the scores, as one hashable description.

``tylopy.attention`` takes, beside SDPA's arguments, the keywords below; ``make_variant`` turns
them into a frozen, hashable ``Variant`` (the structure: what is on, compile-time) and a list of
tensors (the data: run-time kernel arguments, in the order ``Variant.tensor_names`` gives).
The forward and backward kernels, the torch reference and the custom operators all read the
same two things.

Keywords (B batch, H query heads, N queries, Nk keys):

``window_size=(left, right)``
    key j is visible from query i iff ``i + diag - left <= j <= i + diag + right``; -1 is
    unbounded on that side (FlashAttention's semantics; ``diag`` is the causal alignment below).
``softcap``
    ``s -> softcap * tanh(s / softcap)`` on the scaled score (a float > 0).
``alibi_slopes``
    fp32 (H,) or (B, H): adds ``-slope * |i + Nk - N - j|`` (FlashAttention: bottom-right
    aligned whatever ``causal_align`` says).
``sinks``
    fp32 (H,): one logit per head that joins every row's normalizer (FA3 / gpt-oss):
    ``out_i = sum_j p_ij v_j / (sum_j p_ij + exp(sink_h))`` with ``p_ij = exp(s_ij)``; the
    returned LSE includes it: ``lse_i = log(sum_j exp(s_ij) + exp(sink_h))``, so
    ``out_i = sum_j exp(s_ij - lse_i) v_j`` still holds (the backward uses that).
``attn_mask``
    as SDPA: bool (True = takes part) or float (added to the score), broadcastable to
    (B, H, N, Nk); the float mask's dtype is the query's or fp32.
``is_causal`` and ``causal_align``
    key j is visible from query i iff ``j <= i + diag``: ``causal_align="top_left"`` (the
    default, SDPA's rule) has ``diag = 0``, ``"bottom_right"`` (FlashAttention's, varlen's)
    ``diag = Nk - N``. The same ``diag`` places the window.
``score_mod(score, b, h, q_idx, kv_idx) -> score``
    a function of the scaled score (natural units, FlexAttention's convention).
``mask_mod(b, h, q_idx, kv_idx) -> bool``
    True where the key takes part.
``block_mask``
    a ``BlockMask`` from ``tylopy.create_block_mask(mask_mod, B, H, N, Nk)``: the kernel visits
    only the tiles it lists, and evaluates ``mask_mod`` only on its partial tiles. With a block
    mask, ``mask_mod`` defaults to the block mask's.
``aux``
    a tuple of tensors the mods read: a mod then takes it as one more, last argument
    (``mask_mod(b, h, q_idx, kv_idx, aux)``). Tensors a mod captures (closure variables or
    module globals of its code) are found and passed the same way, without ``aux``.

Mods are plain Python functions or ``@ty.func``. They run twice over: with torch tensors (the
reference, ``create_block_mask``: b, h, q_idx, kv_idx are broadcastable int64 index tensors,
score an fp32 tensor) and traced into the kernel as DSL code (b, h, q_idx, kv_idx are i32
run-time values, score an f32 one; ``torch.where/tanh/exp/abs/minimum/maximum/sigmoid/log``
and tensors' ``[...]`` map to the DSL's; see ``sm90/mods.py``).

Order of the score transform (``score_transform`` is its definition, in torch):

1. ``s = (q . k) * scale``                     (natural units)
2. ``s = softcap * tanh(s / softcap)``         (softcap)
3. ``s = score_mod(s, b, h, i, j)``             (score_mod)
4. ``s = s - slope[b, h] * |i + Nk - N - j|``   (alibi)
5. ``s = s + attn_mask[b, h, i, j]``            (float attn_mask)
6. ``s = -inf`` where not visible: causal, window, bool attn_mask, mask_mod, block mask
   (outside the listed tiles), and j >= Nk.
7. softmax over j (with the sink in the normalizer); a row with nothing visible (and no sink)
   gives output 0 and LSE -inf; with a sink, output 0 and LSE = sink.

The kernels run the softmax in the log2 domain (``exp2``). Without steps 2-5 they keep the raw
score q . k and fold ``scale * log2(e)`` into the exponent's FMA (as the dense kernel does);
with any of them, they first form ``s = (q . k) * scale`` in fp32, apply steps 2-5 in natural
units (so a ``score_mod`` sees exactly what FlexAttention's sees), then run the same softmax
with the scale 1 (``log2(e)`` folded). The LSE is in natural units either way.
The gradient of steps 2-5 with respect to s is ``score_grad`` (1 for 4-5; 1 - tanh^2 for 2;
torch autograd through a user's ``score_mod``).

Kernel coverage: Hopper (sm_90) with D = 64 or 128 runs ``sm90/forward_variant.py``; elsewhere a
torch fp32 path (``reference_forward``) runs, with one warning saying why.

Operators (``autograd_variants.py``; mods are not tensors, so they travel as registry ids):

    tylopy::attention_variant_fwd(q, k, v, tensors: list[Tensor], variant_id: str, scale: float,
                                  return_lse: bool) -> (out, lse)
    tylopy::attention_variant_bwd(dout, q, k, v, out, lse, tensors, variant_id, scale,
                                  dlse: Tensor?) -> (dq, dk, dv, dsinks)

``variant_id`` comes from ``register_variant`` (``lookup_variant`` gives the Variant back);
``dsinks`` is fp32 (H,) with sinks, an empty (0,) tensor without. On CUDA the backward operator
calls ``tylopy_kernels.attention.sm90.backward_variant_launch.launch_backward_variant(
BackwardTensors(q, k, v, out, dout, lse, dq, dk, dv), dsinks, VariantCall(variant, tensors, scale))``
when that module exists and its
``supports(q, k, v, variant)`` says yes, else the torch reference (``reference_backward``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tylopy_kernels.attention.mod_registry import (ModError, ModRef, _is_tensor, captured_tensors, lookup_mod,  # noqa: F401,E501
                                                   lookup_variant, mod_ref, register_mod, register_variant,
                                                   captured_slots, with_bwd_slots)

NEG_INF = float("-inf")


def _constant_result(fn):
    """torch.compiler.assume_constant_result where torch has it (imported lazily: this module loads
    without torch for the kernels' constexprs)."""
    try:
        import torch
        return torch.compiler.assume_constant_result(fn)
    except (ImportError, AttributeError):
        return fn


ALIGNS = ("top_left", "bottom_right")
# Names of the run-time tensors a variant may carry, in the order they appear in the list.
BUILTIN_TENSORS = ("alibi_slopes", "sinks", "attn_mask", "kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                   "full_kv_indices")


@dataclass(frozen=True)
class Variant:
    """What modifies the scores (compile-time structure). Tensors are not here: ``tensor_names``
    says which tensors come with the call, in order (builtins from ``BUILTIN_TENSORS`` then
    ``aux<k>`` for each tensor the mods read)."""

    causal: bool = False
    causal_align: str = "top_left"
    window: tuple = (-1, -1)          # (left, right), -1 unbounded; (-1, -1) is no window
    softcap: float = 0.0              # 0: none
    alibi: str = ""                   # "", "h" (H,) or "bh" (B, H) slopes
    sinks: bool = False
    attn_mask: str = ""               # "", "bool" or "float"
    score_mod: ModRef | None = None
    mask_mod: ModRef | None = None
    block_mask: tuple | None = None   # (BLOCK_SIZE, B, H, N, Nk) of the BlockMask, or None
    tensor_names: tuple = ()
    # The user's d score_mod / d score (ModRef) or None: not compared (the forward kernel does not read
    # it; the registry tells variants apart by it, see ``register_variant``).
    score_mod_bwd: ModRef | None = field(default=None, compare=False, repr=False)

    @property
    def transforms_scores(self) -> bool:
        """Steps 2-5 (the kernel then forms scale * q.k in fp32 first)."""
        return bool(self.softcap or self.alibi or self.attn_mask == "float" or self.score_mod is not None)

    @property
    def masks(self) -> bool:
        return bool(self.causal or self.window != (-1, -1) or self.attn_mask == "bool" or self.mask_mod is not None
                    or self.block_mask is not None)

    @property
    def is_dense(self) -> bool:
        """Nothing beyond what the dense kernel does (no keyword, or causal with equal lengths)."""
        return not (self.transforms_scores or self.sinks or self.window != (-1, -1) or self.mask_mod is not None
                    or self.block_mask is not None or self.score_mod is not None)

    def diag(self, n_q: int, n_k: int) -> int:
        """Key j is on the causal diagonal of query i when j == i + diag."""
        return n_k - n_q if self.causal_align == "bottom_right" else 0

    def index(self, name: str) -> int:
        return self.tensor_names.index(name)


# -- building a variant from the keywords ------------------------------------------------------------------


def _fail(exc, arg, expected, got):
    raise exc(f"attention: {arg} expects {expected}, but got {got}")


class VariantKeywords(NamedTuple):
    """``attention``'s variant keywords as the caller passed them, with SDPA's ``is_causal`` and
    ``attn_mask`` (docs/attention-variants.md); ``make_variant_id`` checks them."""

    is_causal: bool = False
    causal_align: str = "top_left"
    attn_mask: Any = None
    window_size: Any = None
    softcap: Any = None
    alibi_slopes: Any = None
    sinks: Any = None
    score_mod: Any = None
    mask_mod: Any = None
    block_mask: Any = None
    aux: Any = None
    score_mod_bwd: Any = None


class VariantChoices(NamedTuple):
    """The non-tensor choices of a Variant, as ``make_variant_id`` resolved them: causal and its
    alignment, the window (left, right), softcap (0: none), the ALiBi kind ("", "h", "bh"), sinks,
    the mask kind ("", "bool", "float") and the block mask's (BLOCK_SIZE, B, H, n_q, n_k) or None."""

    causal: bool
    causal_align: str
    window: tuple
    softcap: float
    alibi: str
    sinks: bool
    mask_kind: str
    block_mask: Any


def make_variant(B, H, n_q, n_k, device, **keywords):
    """(Variant, all its tensors, captured ones included) for one call (not under torch.compile: the
    entry point uses ``make_variant_id``); ``keywords``: ``VariantKeywords``' fields."""
    vid, tensors = make_variant_id(B, H, n_q, n_k, device, VariantKeywords(**keywords))
    variant = lookup_variant(vid)
    return variant, with_captured(variant, tensors)


def make_variant_id(B, H, n_q, n_k, device, keywords: VariantKeywords = VariantKeywords()):
    """(variant id, the explicit tensors the operators take) for one call, every keyword checked (errors
    name the keyword); traceable by torch.compile (``describe`` is a constant there)."""
    import torch
    if isinstance(device, str):  # "cuda:0" and torch.device("cuda:0") compare unequal
        device = torch.device(device)
    (is_causal, causal_align, attn_mask, window_size, softcap, alibi_slopes, sinks, score_mod, mask_mod, block_mask,
     aux, score_mod_bwd) = keywords
    tensors, names = [], []
    if causal_align not in ALIGNS:
        _fail(ValueError, "causal_align", "'top_left' or 'bottom_right'", repr(causal_align))
    window = (-1, -1)
    if window_size is not None:
        ok = isinstance(window_size, (tuple, list)) and len(window_size) == 2 and all(
            isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size)
        if not ok:
            _fail(ValueError, "window_size", "(left, right) of ints >= -1 (-1: unbounded)", repr(window_size))
        window = tuple(int(w) for w in window_size)
    cap = 0.0
    if softcap is not None and softcap != 0:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not (softcap > 0 and
                                                                                    math.isfinite(softcap)):
            _fail(ValueError, "softcap", "a finite float > 0 (or None)", repr(softcap))
        cap = float(softcap)
    alibi = ""
    if alibi_slopes is not None:
        if not _is_tensor(alibi_slopes) or alibi_slopes.dtype != torch.float32:
            _fail(TypeError, "alibi_slopes", "an fp32 tensor of shape (H,) or (B, H)",
                  getattr(alibi_slopes, "dtype", type(alibi_slopes).__name__))
        if tuple(alibi_slopes.shape) == (H,):
            alibi = "h"
        elif tuple(alibi_slopes.shape) == (B, H):
            alibi = "bh"
        else:
            _fail(ValueError, "alibi_slopes", f"shape ({H},) or ({B}, {H})", tuple(alibi_slopes.shape))
        _same_device("alibi_slopes", alibi_slopes, device)
        tensors.append(alibi_slopes.contiguous())
        names.append("alibi_slopes")
    if sinks is not None:
        if not _is_tensor(sinks) or sinks.dtype != torch.float32 or tuple(sinks.shape) != (H,):
            _fail(TypeError if not _is_tensor(sinks) else ValueError, "sinks", f"an fp32 tensor of shape ({H},)",
                  f"{getattr(sinks, 'dtype', type(sinks).__name__)} {tuple(getattr(sinks, 'shape', ()))}")
        _same_device("sinks", sinks, device)
        tensors.append(sinks.contiguous())
        names.append("sinks")
    mask_kind = ""
    if attn_mask is not None:
        if not _is_tensor(attn_mask):
            _fail(TypeError, "attn_mask", "a torch.Tensor (bool, or float added to the scores)",
                  type(attn_mask).__name__)
        if attn_mask.dtype == torch.bool:
            mask_kind = "bool"
        elif attn_mask.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            mask_kind = "float"
        else:
            _fail(TypeError, "attn_mask", "dtype torch.bool or a float dtype", attn_mask.dtype)
        if attn_mask.dim() > 4:
            _fail(ValueError, "attn_mask", "at most 4 dimensions", attn_mask.dim())
        try:
            torch.broadcast_shapes(attn_mask.shape, (B, H, n_q, n_k))
            attn_mask = attn_mask.expand(B, H, n_q, n_k)
        except RuntimeError:
            _fail(ValueError, "attn_mask", f"a shape broadcastable to {(B, H, n_q, n_k)}", tuple(attn_mask.shape))
        _same_device("attn_mask", attn_mask, device)
        if is_causal:
            _fail(ValueError, "attn_mask", "None when is_causal=True (as SDPA)", "a mask")
        keep_dtype = mask_kind == "bool" or attn_mask.dtype in (torch.float32, torch.float64)
        tensors.append(attn_mask if keep_dtype else attn_mask.float())
        names.append("attn_mask")
    bm = None
    if block_mask is not None:
        if type(block_mask).__name__ != "BlockMask" or not hasattr(block_mask, "check_shapes"):  # (block_mask.py
            # imports this module: no import back)
            _fail(TypeError, "block_mask", "a BlockMask from tylopy.create_block_mask", type(block_mask).__name__)
        block_mask.check_shapes(B, H, n_q, n_k, device)
        bm = (block_mask.BLOCK_SIZE, block_mask.B, block_mask.H, n_q, n_k)
        for name in BUILTIN_TENSORS[3:]:
            tensors.append(getattr(block_mask, name))
            names.append(name)
        if mask_mod is None:
            mask_mod = block_mask.mask_mod
    if aux is not None:
        if not isinstance(aux, (tuple, list)) or not all(_is_tensor(t) for t in aux):
            _fail(TypeError, "aux", "a tuple of tensors", type(aux).__name__)
    aux = tuple(aux) if aux is not None else None
    if aux is not None:
        if score_mod is None and mask_mod is None:
            _fail(ValueError, "aux", "None without a score_mod or mask_mod (the mods read it)", "a tuple")
        for k, t in enumerate(aux):
            _same_device("aux", t, device)
            tensors.append(t)
            names.append(f"aux{k}")
    choices = VariantChoices(bool(is_causal), causal_align, window, cap, alibi, sinks is not None, mask_kind, bm)
    vid = describe(tuple(choices), score_mod, mask_mod, tuple(names), aux is not None, str(device))
    if score_mod_bwd is not None:
        vid = with_score_mod_bwd(vid, score_mod, score_mod_bwd)
    return vid, tensors


def _where(fn) -> str:
    inner = getattr(fn, "fn", fn)
    code = getattr(inner, "__code__", None)
    return f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""


def check_score_mod_bwd(score_mod, score_mod_bwd, takes_aux=False):
    """``score_mod_bwd(score, grad, b, h, q_idx, kv_idx[, aux]) -> grad``: with a score_mod, six positional
    parameters (seven, ``aux`` last, when the call has ``aux``: as the score_mod); it may read captured
    tensors as the score_mod does. Errors name the keyword and the user's line."""
    if score_mod_bwd is None:
        return
    import inspect
    where = _where(score_mod_bwd)
    if score_mod is None:
        raise ValueError(f"attention: score_mod_bwd expects a score_mod beside it (it is that mod's derivative)"
                         f"{where}, but got score_mod=None")
    inner = getattr(score_mod_bwd, "fn", score_mod_bwd)
    if not callable(score_mod_bwd) or not hasattr(inner, "__code__"):
        _fail(TypeError, "score_mod_bwd", "a Python function (score, grad, b, h, q_idx, kv_idx) -> grad",
              type(score_mod_bwd).__name__)
    try:
        inspect.signature(inner).bind(*range(7 if takes_aux else 6))
    except TypeError:
        params = "score, grad, b, h, q_idx, kv_idx, aux" if takes_aux else "score, grad, b, h, q_idx, kv_idx"
        raise TypeError(f"attention: score_mod_bwd expects a function ({params}) -> grad"
                        f"{where}, but got one taking {inspect.signature(inner)}") from None


@_constant_result
def with_score_mod_bwd(variant_id, score_mod, score_mod_bwd):
    """The id of ``variant_id``'s Variant with the user's ``score_mod_bwd`` (checked against ``score_mod``,
    the user's; a constant under compile)."""
    variant = lookup_variant(variant_id)
    check_score_mod_bwd(score_mod, score_mod_bwd, variant.score_mod is not None and variant.score_mod.takes_aux)
    return register_variant(with_bwd_slots(variant, score_mod_bwd))


@_constant_result
def describe(choices: tuple, score_mod, mask_mod, names, takes_aux, device):
    """The registry id of the Variant of these (non-tensor) choices and mods: the mods' captured tensors
    take the slots after the explicit tensors ``names``. A constant under torch.compile (it reads the
    mods' closures and globals, which dynamo need not trace). ``choices``: a ``VariantChoices`` as a
    plain tuple (dynamo passes a NamedTuple to a constant-result function without its fields)."""
    causal, causal_align, window, softcap, alibi, sinks, mask_kind, block_mask = choices
    names = list(names)
    refs = {}
    for arg, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is None:
            refs[arg] = None
            continue
        first = sum(1 for n in names if n.startswith("aux"))
        ref, captured = mod_ref(fn, arg, first, takes_aux)
        for k, t in enumerate(captured):
            if device != "None" and str(t.device) != device and not (t.device.type == "cuda" and device.startswith("cuda")
                                                 and t.device.index in (None, torch_device_index(device))):
                _fail(ValueError, f"{arg} (captured tensor {ref.tensor_slots[k][0]})", f"the query's device {device}",
                      t.device)
            names.append(ref.tensor_slots[k][1])
        refs[arg] = ref
    variant = Variant(causal, causal_align, window, softcap, alibi, sinks, mask_kind, refs["score_mod"],
                      refs["mask_mod"], block_mask, tuple(names))
    return register_variant(variant)


def torch_device_index(device: str):
    return int(device.split(":")[1]) if ":" in device else 0


def explicit_count(variant: Variant) -> int:
    """How many of ``tensor_names`` the operators carry: the captured tensors (last) are read from the
    mods when the operator runs (they are not graph inputs under torch.compile, nor differentiated)."""
    captured = len(captured_slots(variant))
    return len(variant.tensor_names) - captured


def with_captured(variant: Variant, tensors) -> list:
    """The operator's explicit tensors followed by the mods' captured ones, as ``tensor_names`` lists them."""
    tensors = list(tensors)[:explicit_count(variant)]
    found = {}
    for ref, where, _ in captured_slots(variant):
        if ref.mod_id not in found:
            found[ref.mod_id] = {f"{w}:{name}": t for w, name, t in captured_tensors(ref.function())}
        tensors.append(found[ref.mod_id][where])
    return tensors


def _same_device(arg, t, device):
    if device is not None and t.device != device and not (t.device.type == "cpu" and t.dim() == 0):
        _fail(ValueError, arg, f"the query's device {device}", t.device)


# -- the score transform in torch (the reference, the backward's definition) -----------------------------


def aux_of(variant: Variant, tensors) -> tuple:
    """The tuple a mod taking ``aux`` receives (the user's aux tensors, in order)."""
    n_aux = 0
    for name in variant.tensor_names:
        if name.startswith("aux"):
            n_aux = n_aux + 1
    n_user = n_aux - len(captured_slots(variant))
    return tuple(tensors[variant.index(f"aux{k}")] for k in range(n_user))


def call_mod(ref: ModRef, args, variant, tensors, arg: str):
    """Call a user mod with torch arguments; a failure names the keyword and the user's line."""
    fn = ref.function()
    if ref.takes_aux:
        args = (*args, aux_of(variant, tensors))
    try:
        return fn(*args)
    except ModError:  # already names the keyword and the user's line (a generated mod's inner call)
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with the argument and the line named
        raise ModError.from_exception(arg, fn, e) from e


def index_grids(B, H, n_q, n_k, device):
    """b, h, q_idx, kv_idx as broadcastable int64 tensors of shapes (B,1,1,1) ... (1,1,1,Nk)."""
    import torch
    ar = (lambda n: torch.arange(n, device=device, dtype=torch.int64))
    return (ar(B).view(B, 1, 1, 1), ar(H).view(1, H, 1, 1), ar(n_q).view(1, 1, n_q, 1),
            ar(n_k).view(1, 1, 1, n_k))


def visible(variant: Variant, tensors, B, H, n_q, n_k, device, grids=None):
    """Boolean, broadcastable to (B, H, N, Nk): step 6 of the transform (True = takes part)."""
    import torch
    b, h, i, j = grids if grids is not None else index_grids(B, H, n_q, n_k, device)
    keep = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
    diag = variant.diag(n_q, n_k)
    if variant.causal:
        keep = keep & (j <= i + diag)
    left, right = variant.window
    if left >= 0:
        keep = keep & (j >= i + diag - left)
    if right >= 0:
        keep = keep & (j <= i + diag + right)
    if variant.attn_mask == "bool":
        keep = keep & tensors[variant.index("attn_mask")]
    keep_before_mod = keep
    if variant.mask_mod is not None:
        got = call_mod(variant.mask_mod, (b, h, i, j), variant, tensors, "mask_mod")
        if not _is_tensor(got) or got.dtype != torch.bool:
            raise ModError(f"attention: mask_mod expects a function returning bool{_where(variant.mask_mod.function())}, "
                           f"but got {getattr(got, 'dtype', type(got).__name__)}")
        keep = keep & got
    if variant.block_mask is not None:
        # FlexAttention's rule: keys of full tiles take part (mask_mod is not asked there), keys of
        # partial tiles where mask_mod says so, keys of tiles not listed never.
        full, partial = listed_tiles(variant, tensors, n_q, n_k, device)
        keep = keep_before_mod & (full | (partial & keep))
    return keep


def tile_flags(num, idx, full_num, full_idx):
    """(full, partial) bool (B, H, Q tiles, KV tiles) from a block mask's counts and index lists."""
    import torch
    n_kv = idx.shape[-1]
    out = []
    for cnt, lst in ((full_num, full_idx), (num, idx)):
        live = torch.arange(n_kv, device=lst.device).view(1, 1, 1, n_kv) < cnt.unsqueeze(-1)
        # a sum, not scatter_'s last write: entries past the count may repeat a listed index (a
        # padded list), and which duplicate write lands last is unspecified on CUDA
        hits = torch.zeros(lst.shape, dtype=torch.int32, device=lst.device)
        hits.scatter_add_(-1, lst.clamp(0, n_kv - 1).long(), live.expand(lst.shape).to(torch.int32))
        out.append(hits > 0)
    return out[0], out[1]


def listed_tiles(variant, tensors, n_q, n_k, device):
    """(full, partial) bool (B|1, H|1, N, Nk) of a variant's block mask, per key (the reference)."""
    import torch
    block = variant.block_mask[0]
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
    full, partial = tile_flags(*(tensors[variant.index(n)] for n in names))
    qt = torch.arange(n_q, device=device) // block
    kt = torch.arange(n_k, device=device) // block
    return full[:, :, qt][:, :, :, kt], partial[:, :, qt][:, :, :, kt]


def score_transform(variant: Variant, s, tensors, n_q, n_k, grids=None):
    """Steps 2-5 on scaled scores ``s`` (B, H, N, Nk) (any float dtype; fp32 or fp64 advised)."""
    import torch
    B, H = s.shape[0], s.shape[1]
    b, h, i, j = grids if grids is not None else index_grids(B, H, n_q, n_k, s.device)
    if variant.softcap:
        s = variant.softcap * torch.tanh(s / variant.softcap)
    if variant.score_mod is not None:
        bwd = variant.score_mod_bwd
        from tylopy_kernels.attention.user_grad import handles_grad
        if bwd is not None and not handles_grad(variant.score_mod):
            # the user's derivative replaces autograd's through the mod (reference path)
            from tylopy_kernels.attention.user_grad import UserGrad
            got = UserGrad.apply(s, lambda x: call_mod(variant.score_mod, (x, b, h, i, j), variant, tensors,
                                                        "score_mod"),
                                  lambda x, g: call_mod(bwd, (x, g, b, h, i, j), variant, tensors, "score_mod_bwd"))
        else:
            got = call_mod(variant.score_mod, (s, b, h, i, j), variant, tensors, "score_mod")
        if not _is_tensor(got) or not got.is_floating_point():
            raise ModError(f"attention: score_mod expects a function returning a float score, but got "
                           f"{getattr(got, 'dtype', type(got).__name__)}")
        s = got.to(s.dtype).expand(s.shape)
    if variant.alibi:
        slopes = tensors[variant.index("alibi_slopes")].to(s.dtype)
        slopes = slopes.view(1, H, 1, 1) if variant.alibi == "h" else slopes.view(B, H, 1, 1)
        s = s - slopes * (i + (n_k - n_q) - j).abs().to(s.dtype)
    if variant.attn_mask == "float":
        s = s + tensors[variant.index("attn_mask")].to(s.dtype)
    return s


def transformed_scores(variant: Variant, s, tensors, n_q, n_k):
    """Steps 2-6: the scores the softmax sees (-inf where not visible)."""
    B, H = s.shape[0], s.shape[1]
    grids = index_grids(B, H, n_q, n_k, s.device)
    s = score_transform(variant, s, tensors, n_q, n_k, grids)
    keep = visible(variant, tensors, B, H, n_q, n_k, s.device, grids)
    return s.masked_fill(~keep, NEG_INF)


def score_grad(variant: Variant, s, tensors, n_q, n_k):
    """d(steps 2-5)/ds elementwise at scaled scores ``s`` (what the backward multiplies dS by)."""
    import torch
    if not (variant.softcap or variant.score_mod is not None):
        return torch.ones_like(s)
    with torch.enable_grad():
        x = s.detach().requires_grad_()
        y = score_transform(variant, x, tensors, n_q, n_k)
        (g,) = torch.autograd.grad(y.sum(), x)
    return g


def _grouped(t, heads):
    return t.repeat_interleave(heads // t.shape[1], dim=1) if t.shape[1] != heads else t


def reference_forward(q, k, v, variant: Variant, tensors, scale):
    """(out, lse) of the variant in q's dtype if float64, else fp32 math (out in q's dtype, lse fp32):
    the torch path and the tests' oracle."""
    import torch
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf, kf, vf = q.to(work), _grouped(k, H).to(work), _grouped(v, H).to(work)
    s = (qf @ kf.transpose(-1, -2)) * scale
    s = transformed_scores(variant, s, tensors, n_q, n_k)
    if variant.sinks:
        sink = tensors[variant.index("sinks")].to(work).view(1, H, 1, 1).expand(B, H, n_q, 1)
        s = torch.cat([s, sink], -1)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0).unsqueeze(-1))
    if variant.sinks:
        p = p[..., :-1]
    out = p @ vf
    return out.to(q.dtype), lse.to(torch.float64 if work == torch.float64 else torch.float32)


def reference_backward(forward, dout, call, dlse=None):
    """(dq, dk, dv, dsinks) of ``reference_forward`` (a vector-Jacobian product through it, so it
    also runs inside an operator, where autograd is off), in fp32 (fp64 for fp64 inputs); dsinks
    is fp32 (H,) with sinks, else an empty (0,) tensor. ``forward``: a ``ForwardTensors`` whose
    q, k, v are read (its out and lse are not: the forward is recomputed); ``call``: a
    ``VariantCall``. This is the definition the kernels are tested against."""
    import torch
    q, k, v = forward[:3]
    variant, tensors, scale = call
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    si = variant.index("sinks") if variant.sinks else None

    def fwd(qq, kk, vv, *sink):
        ts = list(tensors)
        if sink:
            ts[si] = sink[0]
        return reference_forward(qq, kk, vv, variant, ts, scale)

    leaves = [t.detach().to(work) for t in (q, k, v)]
    if si is not None:
        leaves.append(tensors[si].detach().to(work))
    (o, l), pull = torch.func.vjp(fwd, *leaves)
    dl = torch.zeros_like(l) if dlse is None else dlse.to(l.dtype).masked_fill(torch.isinf(l), 0.0)
    grads = pull((dout.to(o.dtype), dl))
    dq, dk, dv = (g.to(t.dtype) for g, t in zip(grads[:3], (q, k, v)))
    dsinks = grads[3].float() if si is not None else torch.empty(0, dtype=torch.float32, device=q.device)
    return dq, dk, dv, dsinks


__all__ = ["Variant", "ModRef", "ModError", "make_variant", "register_variant", "lookup_variant", "lookup_mod",
           "make_variant_id", "with_captured", "check_score_mod_bwd", "with_score_mod_bwd", "explicit_count", "score_transform", "transformed_scores", "visible", "score_grad", "reference_forward", "reference_backward", "index_grids",
           "BUILTIN_TENSORS"]
