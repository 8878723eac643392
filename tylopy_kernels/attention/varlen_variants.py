"""Programmable attention on packed sequences: ``attention_varlen`` with variant keywords.

    out = tylopy.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True,
                                  window_size=(256, 0), softcap=30.0, score_mod=..., mask_mod=...)

The packed tokens run through the variant kernel (``sm90/forward_variant.py``, its backward) as
one batch entry, q (1, H, total_q, D), k/v (1, H_kv, total_k, D), with

* a *document table* ``info`` int32 (total_q, 7): per query row, its document d, its index in the
  document, the document's query and key lengths, first key row, and the packed key rows [lo, hi)
  it may see: its document's, cut by causal/window at document-relative positions (bottom-right
  per document, as FlashAttention's varlen) (``doc_table``; device ops from cu_seqlens, no host sync);
* a generated ``mask_mod`` (``wrap_mod``) that keeps key j for query i iff lo_i <= j < hi_i and the
  user's mask_mod at (d, h, i - q start, j - k start) says so;
* a generated ``score_mod`` (only with a user score_mod or ALiBi) that calls the user's at the
  same document-relative indices, then subtracts ALiBi's ``slope[d, h] * |i' + n_k - n_q - j'|``;
* with a user ``score_mod_bwd``, a generated one that calls it at those indices (ALiBi's derivative
  is 1): the backward kernel traces it as the mod, so it reads the document table too;
* a block mask (``doc_block_mask``) from the per-row key intervals: key tiles no query of a tile
  can see are skipped, tiles every query sees whole (without a user mask_mod) are full (no mask
  evaluation). Table and block mask are cached per cu_seqlens (values for host lists/tensors, the
  tensor's storage and version for device ones), so the layers of a step reuse them.

softcap and sinks are position-free: they stay the kernel's builtins. The user's mods see b = the
document index and positions relative to the document; a pair across documents is never visible
(its mods may be evaluated there with kv_idx 0, the result is discarded).
"""
from __future__ import annotations

import hashlib
import types

import torch

from tylopy.runtime.plancache import PlanCache, identity_key
from tylopy_kernels.attention import variants as V
from tylopy_kernels.attention.block_mask import _lists
from tylopy_kernels.attention.mod_registry import ModError, captured_tensors, mod_ref
from tylopy_kernels.attention.user_grad import VARLEN_RUN, UserGrad
from tylopy_kernels.attention.varlen import cu_key, held_sums

BLOCK = 128
AUX_SLOTS = 4      # the variant kernel's tensor slots for the mods (``sm90/mods.py``)
INFO_COLUMNS = 7   # doc, index in doc, n_q of doc, n_k of doc, first key row of doc, visible keys [lo, hi)
_tables = PlanCache("packed-sequence document tables", capacity=64)  # cu_seqlens key -> ((info, block mask), held)
_wrappers = PlanCache("packed-sequence generated mods", capacity=64)  # (kind, user fns' ids, ...) -> wrapper


# -- the document table and its block mask (device ops only) ---------------------------------------------


def doc_table(cu_q, cu_k, total_q: int, flags):
    """int32 (max(total_q, 1), 7): see the module text; rows outside every document have n_k = 0 and
    no visible key. ``flags`` = (causal, causal_align, window left, window right) place [lo, hi)."""
    dev = cu_q.device
    n_docs = cu_q.shape[0] - 1
    rows = torch.arange(max(total_q, 1), device=dev, dtype=torch.int64)
    cq, ck = cu_q.to(torch.int64), cu_k.to(torch.int64)
    doc = torch.searchsorted(cq[1:].contiguous(), rows, right=True)
    valid = (doc < n_docs) & (rows < total_q)
    d = doc.clamp(0, max(n_docs - 1, 0))
    if n_docs == 0:
        cq = ck = torch.zeros(2, dtype=torch.int64, device=dev)
    q0, nq = cq[d], cq[d + 1] - cq[d]
    k0, nk = ck[d], ck[d + 1] - ck[d]
    zero = torch.zeros_like(rows)
    info = torch.stack([d, torch.where(valid, rows - q0, zero), torch.where(valid, nq, zero),
                        torch.where(valid, nk, zero), torch.where(valid, k0, zero)], -1)
    lo, hi = key_interval(info, flags)
    return torch.cat([info, lo.view(-1, 1), hi.view(-1, 1)], 1).to(torch.int32).contiguous()


def key_interval(info, flags):
    """(lo, hi) int64 per query row: the keys it may see, [lo, hi) in packed key rows (causal and
    window applied document-relatively; a user mask_mod may still drop some)."""
    causal, align, left, right = flags
    lq, nq, nk, k0 = (info[:, c].to(torch.int64) for c in (1, 2, 3, 4))
    diag = lq + (nk - nq if align == "bottom_right" else 0)   # the document-relative diagonal key
    lo, hi = torch.zeros_like(lq), nk.clone()
    if causal:
        hi = torch.minimum(hi, diag + 1)
    if left >= 0:
        lo = torch.maximum(lo, diag - left)
    if right >= 0:
        hi = torch.minimum(hi, diag + right + 1)
    hi = torch.maximum(hi, lo)
    return k0 + lo, k0 + hi


def doc_block_mask(info, total_q: int, total_k: int, user_mask: bool):
    """The four block-mask tensors (B = H = 1) of the per-row key intervals: a key tile is listed for a
    query tile when some row sees a key in it, full when every row of the tile sees all its keys."""
    lo, hi = (info[:total_q, c].to(torch.int64) for c in (5, 6))
    n_qt, n_kt = -(-total_q // BLOCK), -(-total_k // BLOCK)
    pad = n_qt * BLOCK - total_q
    k0 = torch.arange(n_kt, device=info.device, dtype=torch.int64) * BLOCK
    k1 = torch.clamp(k0 + BLOCK, max=total_k)
    lo2, hi2 = lo.view(-1, 1), hi.view(-1, 1)
    seen = (lo2 < k1) & (hi2 > k0)                      # (total_q, key tiles)
    whole = (lo2 <= k0) & (hi2 >= k1)
    seen = torch.nn.functional.pad(seen, (0, 0, 0, pad), value=False).view(n_qt, BLOCK, n_kt).any(1)
    whole = torch.nn.functional.pad(whole, (0, 0, 0, pad), value=True).view(n_qt, BLOCK, n_kt).all(1)
    full = seen & whole if not user_mask else torch.zeros_like(seen)
    partial = seen & ~full
    return (*_lists(partial.view(1, 1, n_qt, n_kt)), *_lists(full.view(1, 1, n_qt, n_kt)))


def packed_tables(cu_args, device_sums, sizes, flags, user_mask, device):
    """(info, block mask tensors), cached per cu_seqlens (the caller's arguments ``cu_args``: values
    on the host, storage and version on the device) unless tracing or capturing a CUDA graph (then
    the device ops are recorded, so a replay with new sums rebuilds them). ``device_sums``: the
    (cu_q, cu_k) on ``device`` the tables are built from, or a function returning them, called only
    when they are (a repeated call skips the sums' repair and copy: its own launches and host time);
    ``sizes``: (total_q, total_k)."""
    cu_q_arg, cu_k_arg = cu_args
    total_q, total_k = sizes
    device = torch.device(device)
    cacheable = not torch.compiler.is_compiling() and not (
        device.type == "cuda" and torch.cuda.is_current_stream_capturing())
    key = None
    if cacheable:
        key = (cu_key(cu_q_arg), cu_key(cu_k_arg), total_q, total_k, flags, user_mask, str(device))
        hit = _tables.get(key)
        if hit is not None:
            return hit[0]
    cu_q, cu_k = device_sums() if callable(device_sums) else device_sums
    if torch.compiler.is_compiling():  # one opaque operator in the graph (the compiler does not fuse it)
        causal, align, left, right = flags
        info, *bm = varlen_doc_tables(cu_q, cu_k, [total_q, total_k],
                                      [int(causal), int(align == "bottom_right"), left, right, int(user_mask)])
        return info, tuple(bm)
    info = doc_table(cu_q, cu_k, total_q, flags)
    made = (info, doc_block_mask(info, total_q, total_k, user_mask))
    if key is not None:
        _tables.put(key, (made, held_sums(cu_q_arg, cu_k_arg)))
    return made


@torch.library.custom_op("tylopy::varlen_doc_tables", mutates_args=())
def varlen_doc_tables(cu_q: torch.Tensor, cu_k: torch.Tensor, totals: list[int],
                      mask: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(document table, the block mask's four tensors) as one operator: ``totals`` = (total_q, total_k),
    ``mask`` = (causal, bottom-right aligned, window left, window right, user mask_mod)."""
    total_q, total_k = totals
    causal, bottom_right, left, right, user_mask = mask
    info = doc_table(cu_q, cu_k, total_q, (bool(causal), "bottom_right" if bottom_right else "top_left", left, right))
    return (info, *doc_block_mask(info, total_q, total_k, bool(user_mask)))


@varlen_doc_tables.register_fake
def _(cu_q, cu_k, totals, mask):
    total_q, total_k = totals
    n_qt, n_kt = -(-total_q // BLOCK), -(-total_k // BLOCK)
    i32 = (lambda *shape: cu_q.new_empty(shape, dtype=torch.int32))
    return i32(max(total_q, 1), INFO_COLUMNS), i32(1, 1, n_qt), i32(1, 1, n_qt, n_kt), i32(1, 1, n_qt), i32(1, 1, n_qt, n_kt)


# -- the generated mods ----------------------------------------------------------------------------------


class _DocRun:
    """What a generated mod does (hashable by value: its repr enters the kernel's fingerprint)."""

    def __init__(self, kind, user, user_bwd, takes_user_aux, alibi):
        self.kind, self.user, self.user_bwd = kind, user, user_bwd   # "score_mod"/"mask_mod"/"score_mod_bwd"
        self.takes_user_aux, self.alibi = takes_user_aux, alibi
        ident = []
        for fn in (user, user_bwd):
            if fn is not None:
                ref, _ = mod_ref(fn, kind, 0, False)
                code = ref.code
                ident.append((ref.qualname, hashlib.sha256(code.co_code + repr(
                    (code.co_consts, code.co_names, code.co_filename, ref.captured)).encode()).hexdigest()[:24]))
        self.ident = (kind, tuple(ident), takes_user_aux, alibi)

    def __eq__(self, other):
        return isinstance(other, _DocRun) and other.ident == self.ident

    def __hash__(self):
        return hash(self.ident)

    def __repr__(self):
        return f"DocRun{self.ident!r}"

    def __tylopy_fingerprint__(self):  # (a kernel constexpr reaches it through a generated score_mod_bwd)
        return repr(self)

    def __call__(self, env, args):
        from tylopy_kernels.attention.sm90 import mods
        traced = any(isinstance(a, mods.Val) for a in args[:-1])
        T = mods.TORCH if traced else torch
        *front, aux = args
        values = front[:{"score_mod": 1, "mask_mod": 0, "score_mod_bwd": 2}[self.kind]]   # score (, grad)
        h, q_idx, kv_idx = front[-3:]
        info = aux[0]
        user_aux = tuple(aux[1 + (self.alibi != ""):])
        if self.kind == "mask_mod":
            # the row's visible keys (document, causal, window) were placed by the table: two values
            # per row stay live in the kernel, whatever the window
            keep = (kv_idx >= info[q_idx, 5]) & (kv_idx < info[q_idx, 6])
            if self.user is None:
                return keep
        d, lq, nq, nk, k0 = (info[q_idx, c] for c in range(5))
        lk = kv_idx - k0
        lk_user = T.where((lk >= 0) & (lk < nk), lk, 0)     # the user's mod sees in-range indices everywhere
        if self.kind == "mask_mod":
            return keep & self._user(env, traced, (d, h, lq, lk_user), user_aux)
        if self.kind == "score_mod_bwd":  # (ALiBi's derivative is 1)
            return self._user(env, traced, (*values, d, h, lq, lk_user), user_aux)
        s = values[0]
        if self.user is not None:
            s = self._user(env, traced, (s, d, h, lq, lk_user), user_aux)
        if self.alibi:
            slopes = aux[1]
            slope = slopes[h] if self.alibi == "h" else slopes[d, h]
            if not traced:
                slope = slope.to(s.dtype)
            s = s - slope * T.abs(lq + nk - nq - lk)
        return s

    def _user(self, env, traced, args, user_aux):
        """The user's mod at document-relative indices; errors name the keyword and the user's line."""
        from tylopy_kernels.attention.sm90 import mods
        fn = self.user
        call_args = (*args, user_aux) if self.takes_user_aux else args
        try:
            if traced:
                got = mods.raw(mods.substituted(fn, env)(*call_args))
                return mods.Val(mods._checked_result(self.kind, fn, got))
            if self.user_bwd is not None:
                got = UserGrad.apply(args[0], lambda s: fn(s, *call_args[1:]),
                                      lambda s, g: self.user_bwd(s, g, *call_args[1:]))
            else:
                got = fn(*call_args)
        except ModError:
            raise
        except Exception as e:  # noqa: BLE001 - named with the keyword and the user's line
            if traced:
                raise ModError(f"attention: {self.kind} expects a function the kernel can trace (torch.where instead "
                               f"of a Python if on values; the torch functions listed in docs/attention-variants.md) "
                               f"({mods._user_line(fn, e)}), but got {type(e).__name__}: {e}") from None
            raise ModError.from_exception(self.kind, fn, e) from e
        want_bool = self.kind == "mask_mod"   # (score_mod_bwd: a float gradient, as a score)
        if not isinstance(got, torch.Tensor) or (got.dtype == torch.bool) != want_bool or not (
                want_bool or got.is_floating_point()):
            inner = getattr(fn, "fn", fn)
            raise ModError(f"attention: {self.kind} expects a function returning "
                           f"{'bool' if want_bool else 'a float score'} ({inner.__code__.co_filename}:"
                           f"{inner.__code__.co_firstlineno}), but got {getattr(got, 'dtype', type(got).__name__)}")
        return got


def wrap_mod(run: _DocRun, user):
    """A function ``(*args) -> run(env, args)`` whose closure cells are the user's tensor cells (shared)
    and whose globals are the user's module's, naming the user's global tensors: the variant machinery
    finds, passes and (in the kernel) substitutes the user's captured tensors through it."""
    inner = getattr(user, "fn", user) if user is not None else None
    cells, glob_names, env_items = {}, [], []
    if inner is not None:
        for where, name, _ in captured_tensors(inner):
            if where == "closure":
                cells[name] = inner.__closure__[inner.__code__.co_freevars.index(name)]
            else:
                glob_names.append(name)
            env_items.append(f"({where!r}, {name!r}): {name}")
    params = ", ".join(["__ty_run", *cells])
    src = (f"def __ty_factory({params}):\n"
           f"    def __ty_{run.kind}(*__ty_args):\n"
           f"        return __ty_run({{{', '.join(env_items)}}}, __ty_args)\n"
           f"    return __ty_{run.kind}\n")
    ns: dict = {}
    exec(compile(src, f"<tylopy varlen {run.kind}>", "exec"), ns)  # noqa: S102 - generated above
    code = next(c for c in ns["__ty_factory"].__code__.co_consts if isinstance(c, types.CodeType))
    cells["__ty_run"] = _cell(run)
    closure = tuple(cells[n] for n in code.co_freevars)
    glob = inner.__globals__ if inner is not None else {}
    fn = types.FunctionType(code, glob, f"varlen_{run.kind}", None, closure)
    setattr(fn, VARLEN_RUN, run)
    return fn


def _cell(value):
    return types.CellType(value)


def varlen_mod(kind, user, user_bwd, takes_user_aux, alibi):
    """The generated mod for these choices (one object per choice: the variant registry keys on it)."""
    captured = mod_ref(user, kind, 0, False)[0].captured if user is not None else None
    fns = (user, user_bwd)
    key = (kind, identity_key(fns), captured, takes_user_aux, alibi)
    hit = _wrappers.get_held(key, fns)
    if hit is not None:
        return hit
    fn = wrap_mod(_DocRun(kind, user, user_bwd, takes_user_aux, alibi), user)
    _wrappers.put_held(key, fn, fns)
    return fn


# -- the entry point -------------------------------------------------------------------------------------

KEYWORDS = ("window_size", "softcap", "alibi_slopes", "sinks", "score_mod", "mask_mod", "aux", "score_mod_bwd")


@V._constant_result
def describe_varlen(choices, score_mod, mask_mod, score_mod_bwd, names, device):
    """The variant id of a packed call (a constant under torch.compile): ``choices`` = (softcap,
    sinks, alibi kind, takes user aux, (BLOCK, 1, 1, -1, -1): the block mask's lengths are each call's)."""
    cap, sinks, alibi, takes_aux, bm = choices
    V.check_score_mod_bwd(score_mod, score_mod_bwd, takes_aux)
    mask = varlen_mod("mask_mod", mask_mod, None, takes_aux, alibi)  # (alibi: where the user's aux start)
    score = (varlen_mod("score_mod", score_mod, score_mod_bwd, takes_aux, alibi)
             if score_mod is not None or alibi else None)
    vid = V.describe(tuple(V.VariantChoices(False, "top_left", (-1, -1), cap, "", sinks, "", bm)), score, mask, names,
                     True, device)
    if score_mod_bwd is not None:  # the user's derivative at the document-relative indices, in the kernel too
        vid = V.with_score_mod_bwd(vid, score, varlen_mod("score_mod_bwd", score_mod_bwd, None, takes_aux, alibi))
    read = [n for n in V.lookup_variant(vid).tensor_names if n.startswith("aux")]
    if len(read) > AUX_SLOTS:
        mine = 2 if alibi else 1
        V._fail(ValueError, "aux", f"at most {AUX_SLOTS - mine} tensors read by the mods on packed sequences (aux and "
                f"captured together: the document table takes one of the kernel's {AUX_SLOTS} slots"
                f"{', ALiBi another' if alibi else ''})", len(read) - mine)
    return vid


def _alibi(slopes, H, n_docs, device):
    if slopes is None:
        return ""
    if not isinstance(slopes, torch.Tensor) or slopes.dtype != torch.float32:
        V._fail(TypeError, "alibi_slopes", "an fp32 tensor of shape (H,) or (documents, H)",
                getattr(slopes, "dtype", type(slopes).__name__))
    if tuple(slopes.shape) not in ((H,), (n_docs, H)):
        V._fail(ValueError, "alibi_slopes", f"shape ({H},) or ({n_docs}, {H}) (one row per document)",
                tuple(slopes.shape))
    V._same_device("alibi_slopes", slopes, device)
    return "h" if slopes.dim() == 1 else "bh"


def varlen_variant(q, k, v, cu, options):
    """(q, k, v as one batch entry, variant id, explicit tensors) of a packed call with variant
    keywords. ``cu`` = (cu_q as given, cu_k as given, then cu_q and cu_k on q's device, or one
    function returning them: ``packed_tables``' device_sums); ``options``: the keyword values by
    name, ``is_causal`` and ``causal_align``."""
    cu_q_arg, cu_k_arg, *sums = cu
    device_sums = sums[0] if len(sums) == 1 else tuple(sums)
    total_q, H, _ = q.shape
    total_k = k.shape[0]
    n_docs = len(cu_q_arg) - 1
    align = options["causal_align"]
    if align not in V.ALIGNS:
        V._fail(ValueError, "causal_align", "'bottom_right' (FlashAttention's varlen) or 'top_left'", repr(align))
    _, sink_tensors = V.make_variant_id(1, H, total_q, total_k, q.device,
                                        V.VariantKeywords(window_size=options["window_size"], softcap=options["softcap"],
                                                          sinks=options["sinks"]))
    window = tuple(options["window_size"]) if options["window_size"] is not None else (-1, -1)
    cap = float(options["softcap"] or 0.0)
    alibi = _alibi(options["alibi_slopes"], H, n_docs, q.device)
    score_mod, mask_mod, aux = options["score_mod"], options["mask_mod"], options["aux"]
    for arg, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is not None and not (callable(fn) and hasattr(getattr(fn, "fn", fn), "__code__")):
            V._fail(TypeError, arg, "a Python function (or @ty.func)", type(fn).__name__)
    if aux is not None:
        if not isinstance(aux, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in aux):
            V._fail(TypeError, "aux", "a tuple of tensors", type(aux).__name__)
        if score_mod is None and mask_mod is None:
            V._fail(ValueError, "aux", "None without a score_mod or mask_mod (the mods read it)", "a tuple")
        for t in aux:
            V._same_device("aux", t, q.device)
    flags = (bool(options["is_causal"]), align, window[0], window[1])
    info, bm = packed_tables((cu_q_arg, cu_k_arg), device_sums, (total_q, total_k), flags, mask_mod is not None,
                             q.device)
    names = (["sinks"] if options["sinks"] is not None else []) + list(V.BUILTIN_TENSORS[3:]) + ["aux0"]
    tensors = list(sink_tensors) + list(bm) + [info]
    if alibi:
        names.append("aux1")
        tensors.append(options["alibi_slopes"].contiguous())
    for t in aux or ():
        names.append(f"aux{sum(1 for n in names if n.startswith('aux'))}")
        tensors.append(t)
    # the block mask's lengths are the call's (its tensors' shapes): the variant leaves them out, so one
    # variant serves every total (and a compiled graph with dynamic lengths passes no symbols here)
    choices = (cap, options["sinks"] is not None, alibi, aux is not None, (BLOCK, 1, 1, -1, -1))
    vid = describe_varlen(choices, score_mod, mask_mod, options["score_mod_bwd"], tuple(names), str(q.device))
    as_batch = (lambda t: t.unsqueeze(0).transpose(1, 2))
    return as_batch(q), as_batch(k), as_batch(v), vid, tensors
