"""References for attention numerics, shared by both attention kernels' checkers and tests.

Everything here is computed in float64 (or reproduces a kernel's float32 roundings) on the inputs'
device, works on CPU or CUDA tensors, and imports no GPU code.

* ``oracle``: softmax(scale q k^T, masked) v, straight from the definition in float64. Rows whose
  keys are all masked give zeros and LSE -inf.
* ``same_boundary``: the kernel's own algorithm, exact except where the kernel rounds on purpose:
  key tiles of ``model.block_n``, the running max m_j after tile j, p = exp(s - m_j) rounded to the
  input dtype once per tile before the PV product, l summing the unrounded p, numerator and l
  rescaled by exp(m_{j-1} - m_j). With ``model.rescale_threshold`` T the maximum is lazy, as the
  Hopper kernel's: m_j moves to the tile's maximum only when that exceeds m_{j-1} by more than T
  in the log2 domain of the scaled scores, (t - m) log2(e) > T, whatever the scale's sign (weights
  up to 2^T are rounded then). With ``model.poly_exp2`` the weights that the kernel computes with
  its polynomial carry that polynomial's error (``poly_factor``, ``poly_lanes``). A kernel that
  rounds P elsewhere, or on other tile boundaries, lands measurably away from it (``rules.py``
  says how far is too far).

``KernelModel`` says which kernel arithmetic the same-boundary reference follows; its
``exponent`` picks one of two forms:

* "exact": scores and exp(s - m) in float64, P rounded through float32 (the kernel converts a
  float32 p). The kernel's float32 score noise is left to the tolerance: ``score_noise`` bounds it
  per row. The Hopper kernel is checked this way.
* "fast": the kernel's float32 arithmetic reproduced: scores in float32 (no TF32), m in float32,
  the exponent (s - m) c with c = scale log2(e), each step rounded to float32, then exp2 in
  float64 and P rounded straight to the dtype. What stays unmodelled (ex2.approx, the tensor
  cores' summation order, P's rounding direction near a boundary) the reference measures per row:
  ``SameBoundary.magnitude``, ``.ambiguous``, ``.score_rel``. The portable kernel is checked this
  way.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

LOG2E = 1.4426950408889634
NEG_INF = float("-inf")
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24,
                 torch.float64: 2.0 ** -53}
# The fast form's window around a rounding boundary of p, relative: ex2.approx (2^-22) and the
# float32 roundings of the exponent can push a p this close to a boundary across it.
AMBIGUOUS = 2.0 ** -20


@dataclass(frozen=True)
class KernelModel:
    """What the references and the pass rules know about one launch of an attention kernel.

    ``block_n``: keys per tile (P is rounded once per tile). ``exponent``: "exact" or "fast" (the
    module docstring). ``p_dtype``: the dtype P is rounded to before the PV product (None: the
    inputs' dtype; torch.float64: not rounded). ``lse``: whether the launch returns the row LSE.
    ``dtype``: the inputs' dtype (None: q's). ``oracle_rule``: what the output's distance from the
    oracle is measured against (``rules.py``): "math" (SDPA's math backend, float32 inside and
    one rounding) or "sdpa" (SDPA's default backend, which on a GPU rounds P as the kernel does).
    ``rescale_threshold``: None (the running maximum after every tile) or T >= 0, the lazy maximum
    of the exact form (the module docstring). ``poly_exp2``: how many of every 8 exponentials the
    kernel computes with a polynomial on the FMA pipe (0: none), ``poly_coeffs`` its coefficients
    (``poly_factor``); the exact form then follows the polynomial's own error (``poly_lanes``
    says which scores take it).
    """

    block_n: int
    exponent: str = "exact"
    p_dtype: torch.dtype | None = None
    lse: bool = False
    dtype: torch.dtype | None = None
    oracle_rule: str = "math"
    rescale_threshold: float | None = None
    poly_exp2: int = 0
    poly_coeffs: tuple = ()

    def __post_init__(self):
        if self.exponent not in ("exact", "fast"):
            raise ValueError(f"KernelModel.exponent expects 'exact' or 'fast', but got {self.exponent!r}")
        if self.oracle_rule not in ("math", "sdpa"):
            raise ValueError(f"KernelModel.oracle_rule expects 'math' or 'sdpa', but got {self.oracle_rule!r}")
        if not (isinstance(self.block_n, int) and self.block_n > 0):
            raise ValueError(f"KernelModel.block_n expects a positive int, but got {self.block_n!r}")
        if not (isinstance(self.poly_exp2, int) and 0 <= self.poly_exp2 <= 8):
            raise ValueError(f"KernelModel.poly_exp2 expects an int 0..8, but got {self.poly_exp2!r}")
        if self.poly_exp2 and (self.exponent != "exact" or not self.poly_coeffs):
            raise ValueError("KernelModel.poly_exp2 expects the exact exponent form and poly_coeffs, but got "
                             f"exponent={self.exponent!r}, poly_coeffs={self.poly_coeffs!r}")

    def replace(self, **changes) -> "KernelModel":
        """This model with some fields changed (e.g. the BLOCK_N a launcher chose)."""
        return replace(self, **changes)


# The two kernels' models; their launches fill in block_n, lse and dtype.
HOPPER = KernelModel(block_n=128, exponent="exact", oracle_rule="math")
PORTABLE = KernelModel(block_n=64, exponent="fast", oracle_rule="sdpa")


class AttentionInputs(NamedTuple):
    """One attention problem as the references and pass rules take it: q, k, v (B, H, n, D), the
    optional mask (bool or additive float), SDPA's top-left ``causal`` and the scale (None:
    1/sqrt(D))."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None = None
    causal: bool = False
    scale: float | None = None


class Reference(NamedTuple):
    out: torch.Tensor      # (B, H, n_q, D) float64
    lse: torch.Tensor      # (B, H, n_q) float64, -inf for empty rows
    row_max: torch.Tensor  # (B, H, n_q) float64, the max scaled score (-inf for empty rows)


class SameBoundary(NamedTuple):
    """The same-boundary reference; the last four fields are the fast form's per-row tolerance
    terms (None in the exact form), each (B, H, n_q) float64."""

    out: torch.Tensor
    lse: torch.Tensor
    row_max: torch.Tensor
    magnitude: torch.Tensor | None = None  # sum |p_rounded| max|v| / l
    ambiguous: torch.Tensor | None = None  # sum over boundary-close p of one dtype ulp of p, x max|v| / l
    score_rel: torch.Tensor | None = None  # bound on p's relative error from float32 scores (0 if exact)
    score_abs: torch.Tensor | None = None  # the same bound in score units (times scale)


# -- masks and scales -------------------------------------------------------------------------------

def resolve_scale(scale, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def allowed_keys(q, k, mask=None, causal=False, cols=slice(None)) -> torch.Tensor:
    """Bool (B, H, n_q, len(cols)): key j may be attended by query i (causal: j <= i; mask True)."""
    B, H, n_q = q.shape[:3]
    n_k = k.shape[2]
    col_idx = torch.arange(n_k, device=q.device)[cols]
    ok = torch.ones((n_q, col_idx.numel()), dtype=torch.bool, device=q.device)
    if causal:
        ok = col_idx[None, :] <= torch.arange(n_q, device=q.device)[:, None]
    if mask is not None:
        ok = ok & mask.expand(B, H, n_q, n_k)[..., cols].to(q.device)
    return ok.expand(B, H, n_q, col_idx.numel())


def empty_rows(q, k, mask=None, causal=False) -> torch.Tensor:
    """Bool (B, H, n_q): rows with no key to attend."""
    if k.shape[2] == 0:
        return torch.ones(q.shape[:3], dtype=torch.bool, device=q.device)
    return ~allowed_keys(q, k, mask, causal).any(-1)


def _scores(q, k, scale, cols=slice(None)):
    return (q.double() @ k[:, :, cols].double().transpose(-1, -2)) * scale


def _empty_reference(q, v) -> Reference:
    B, H, n_q, _ = q.shape
    out = torch.zeros((B, H, n_q, v.shape[-1]), dtype=torch.float64, device=q.device)
    inf = torch.full((B, H, n_q), NEG_INF, dtype=torch.float64, device=q.device)
    return Reference(out, inf, inf.clone())


# -- the oracle ---------------------------------------------------------------------------------------

def oracle(q, k, v, mask=None, causal=False, scale=None) -> Reference:
    """The FP64 oracle: softmax(scale q k^T, masked) v, straight from the definition."""
    B, H, n_q, D = q.shape
    scale = resolve_scale(scale, D)
    if k.shape[2] == 0:
        return _empty_reference(q, v)
    s = _scores(q, k, scale).masked_fill(~allowed_keys(q, k, mask, causal), NEG_INF)
    m = s.amax(-1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m_safe)
    l = p.sum(-1, keepdim=True)
    out = (p @ v.double()) / torch.where(l > 0, l, torch.ones_like(l))
    lse = torch.where(l > 0, m_safe + torch.log(l), torch.full_like(l, NEG_INF))
    return Reference(out, lse.squeeze(-1), m.squeeze(-1))


# -- score error bounds ------------------------------------------------------------------------------

def _max_abs_dot(q, k) -> torch.Tensor:
    """Per row (B, H, n_q): max_j sum_d |q_d k_jd|, in float64."""
    return (q.double().abs() @ k.double().abs().transpose(-1, -2)).amax(-1)


def score_bound(q, k, scale=1.0) -> torch.Tensor:
    """Per row (B, H, n_q): |scale| (D + 4) 2^-23 max_j sum_d |q_d k_jd|, a bound on the float32
    error of a score computed by tensor cores (D exact products, float32 accumulation in any order)."""
    return abs(scale) * (q.shape[-1] + 4) * 2.0 ** -23 * _max_abs_dot(q, k)


def score_noise(q, k, scale=None) -> torch.Tensor:
    """eta per row (B, H, n_q, 1): the exact form's bound on the float32 error of a scaled score, in
    exp units: ``score_bound`` plus ex2.approx and the exponent's FMA."""
    scale = resolve_scale(scale, q.shape[-1])
    if k.shape[2] == 0:
        return torch.zeros(q.shape[:3] + (1,), dtype=torch.float64, device=q.device)
    return score_bound(q, k, scale)[..., None] + 4e-6


def fp32_score_bound(q, k) -> torch.Tensor:
    """The fast form's score bound (unscaled, per row): ``score_bound``, or 0 where integer Q and K
    make every product and partial sum exact in float32 (then the kernel's scores are the
    reference's, bit for bit)."""
    sums = _max_abs_dot(q, k)
    exact = bool((q == q.round()).all() and (k == k.round()).all() and sums.max() < 2 ** 24)
    return torch.zeros_like(sums) if exact else (q.shape[-1] + 4) * 2.0 ** -23 * sums


@contextlib.contextmanager
def exact_fp32_matmul():
    """float32 matmuls without TF32 inside (the default on CPU; opt-in on CUDA)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


# -- the same-boundary reference ---------------------------------------------------------------------

def round_p(p: torch.Tensor, dtype) -> torch.Tensor:
    """p rounded as the kernel rounds it: a float32 value converted (RNE) to bf16/fp16."""
    if dtype in (torch.bfloat16, torch.float16):
        return p.to(torch.float32).to(dtype).to(torch.float64)
    return p


def poly_factor(x: torch.Tensor, coeffs) -> torch.Tensor:
    """The kernel's polynomial 2^x in float64 (its float32 FMAs add ~2^-24): x clamped at -127,
    r = x rounded half to even, f = x - r, 2^r q(f) with q(f) = 1 + f (c_1 + f (c_2 + ...)); 0 at
    and below 2^-127 (the kernel's exponent bits underflow there; what it makes of (-127, -126.5)
    is below 2^-125, nothing next to any tolerance)."""
    x = torch.clamp(x, min=-127.0)
    r = torch.round(x)
    f = x - r
    qf = torch.full_like(f, float(coeffs[-1]))
    for c in reversed(coeffs[:-1]):
        qf = qf * f + float(c)
    qf = qf * f + 1.0
    return torch.where(r > -127, torch.ldexp(qf, r), torch.zeros_like(qf))


def poly_lanes(n_q: int, cols: int, poly: int, device=None) -> torch.Tensor:
    """Bool (n_q, cols): which scores of a key tile take the polynomial when ``poly`` of every 8
    do. The kernel picks by register index i mod 8 of the m64nN accumulator, i = 4 (col // 8) +
    2 ((row mod 16) >= 8) + (col mod 2) (``tylopy.tile.layouts.wgmma_acc``), columns counted from
    the tile's first key (as the kernel counts them, except in the second half of a split S whose
    halves are not a multiple of 16 keys wide)."""
    row = torch.arange(n_q, device=device)[:, None]
    col = torch.arange(cols, device=device)[None, :]
    reg = 4 * ((col // 8) % 2) + 2 * ((row % 16) >= 8).long() + col % 2
    return reg < poly


def same_boundary(q, k, v, mask=None, causal=False, scale=None, model: KernelModel = HOPPER) -> SameBoundary:
    """The kernel's tiling, P rounded per key tile of ``model.block_n`` where ``model`` says the
    kernel rounds it, in the model's exponent form."""
    scale = resolve_scale(scale, q.shape[-1])
    if k.shape[2] == 0:
        return SameBoundary(*_empty_reference(q, v))
    p_dtype = model.p_dtype if model.p_dtype is not None else model.dtype if model.dtype is not None else q.dtype
    if model.exponent == "exact":
        return _same_boundary_exact(q, k, v, mask, causal, scale, model, p_dtype)
    return _same_boundary_fast(q, k, v, mask, causal, scale, model.block_n, p_dtype)


def _same_boundary_exact(q, k, v, mask, causal, scale, model: KernelModel, p_dtype) -> SameBoundary:
    block_n, threshold = model.block_n, model.rescale_threshold
    poly = (model.poly_exp2, tuple(model.poly_coeffs)) if model.poly_exp2 else None
    B, H, n_q, _ = q.shape
    n_k = k.shape[2]
    m = torch.full((B, H, n_q, 1), NEG_INF, dtype=torch.float64, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((B, H, n_q, v.shape[-1]), dtype=torch.float64, device=q.device)
    q64 = q.double()
    for c0 in range(0, n_k, block_n):
        cols = slice(c0, min(c0 + block_n, n_k))
        s = _scores(q64, k, scale, cols).masked_fill(~allowed_keys(q, k, mask, causal, cols), NEG_INF)
        t = s.amax(-1, keepdim=True)
        if threshold is None:
            m_new = torch.maximum(m, t)
        else:  # lazy, in the log2 domain of the scaled scores s (the kernel: raw scores times
            # scale log2 e); a NaN (both -inf) compares false and keeps -inf
            m_new = torch.where((t - m) * LOG2E > threshold, t, m)
        m_use = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # never -inf - (-inf)
        alpha = torch.exp(m - m_use)
        p = torch.exp(s - m_use)
        if poly is not None:  # those scores' weights carry the polynomial's error (1e-4 in bf16)
            take = poly_lanes(n_q, p.shape[-1], poly[0], q.device)
            p = torch.where(take, poly_factor((s - m_use) * LOG2E, poly[1]), p)
        l = alpha * l + p.sum(-1, keepdim=True)
        acc = alpha * acc + round_p(p, p_dtype) @ v[:, :, cols].double()
        m = m_new
    out = torch.where(l > 0, acc / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(acc))
    m_use = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = torch.where(l > 0, m_use + torch.log(l), torch.full_like(l, NEG_INF))
    return SameBoundary(out, lse.squeeze(-1), m.squeeze(-1))


def _same_boundary_fast(q, k, v, mask, causal, scale, block_n, p_dtype) -> SameBoundary:
    B, H, n_q, _ = q.shape
    dev = q.device
    with exact_fp32_matmul():
        s = torch.matmul(q.float(), k.float().transpose(-1, -2))
    s = s.masked_fill(~allowed_keys(q, k, mask, causal), NEG_INF)
    c = torch.tensor(scale, dtype=torch.float32, device=dev) * torch.tensor(LOG2E, dtype=torch.float32, device=dev)
    m = torch.full((B, H, n_q), NEG_INF, dtype=torch.float32, device=dev)
    zeros = torch.zeros((B, H, n_q), dtype=torch.float64, device=dev)
    l, amb, mag = zeros.clone(), zeros.clone(), zeros.clone()
    a = torch.zeros((B, H, n_q, v.shape[-1]), dtype=torch.float64, device=dev)
    vd = v.double()
    vmax = vd.abs().amax(-1, keepdim=True)
    bound = fp32_score_bound(q, k)
    p_rel = bound * float(c) * math.log(2.0)               # relative error of p from the scores
    window = (AMBIGUOUS + p_rel)[..., None]
    for t0 in range(0, k.shape[2], block_n):
        st = s[..., t0:t0 + block_n]
        m_new = torch.maximum(m, st.amax(-1))
        m_use = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
        alpha = torch.exp2(((m - m_use) * c).double())                 # ex2((m_old - m) c), FP32 sub and mul
        arg = (st - m_use[..., None]) * c                              # the kernel's exponent: (s - m) c in FP32
        p = torch.exp2(arg.double())
        p_rounded = p.to(p_dtype).double()
        flip = (p * (1 + window)).to(p_dtype).double() - (p * (1 - window)).to(p_dtype).double()
        vt, vmt = vd[..., t0:t0 + block_n, :], vmax[..., t0:t0 + block_n, :]
        l = alpha * l + p.sum(-1)
        a = alpha[..., None] * a + p_rounded @ vt
        amb = alpha * amb + (flip.abs() @ vmt)[..., 0]
        mag = alpha * mag + (p_rounded @ vmt)[..., 0]
        m = m_new
    has_keys = l > 0
    inv = torch.where(has_keys, 1.0 / torch.where(has_keys, l, torch.ones_like(l)), torch.zeros_like(l))
    lse = torch.where(has_keys, m.double() * scale + torch.log(torch.where(has_keys, l, torch.ones_like(l))),
                      torch.full_like(l, NEG_INF))
    row_max = torch.where(has_keys, m.double() * scale, torch.full_like(l, NEG_INF))
    return SameBoundary(a * inv[..., None], lse, row_max, mag * inv, amb * inv, p_rel, bound * scale)
