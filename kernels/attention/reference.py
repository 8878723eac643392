"""References and pass rules for attention numerics, shared by ``tests/test_attention_hopper_gpu.py``
and ``tylopy check attention`` (``check_attention.py``).

Two references (design.md, "Attention numerics"), both in float64 on the inputs' device:

* ``oracle``: softmax(scale q k^T, masked) v computed directly. Rows whose keys are all masked
  give zeros and LSE -inf.
* ``same_boundary``: the kernel's algorithm with exact arithmetic everywhere except where the
  kernel rounds on purpose: key tiles of ``block_n``, running max m_j after tile j,
  p = exp(s - m_j) rounded to the input dtype (through float32, as the kernel's cvt does) before
  the PV product, l summing the unrounded p, numerator and l rescaled by exp(m_{j-1} - m_j).

Pass rules (``check_output``), for finite inputs:

1. Nothing is NaN or +inf; empty rows are exactly 0 with LSE exactly -inf.
2. Oracle: max|out - oracle| <= 2 max|torch - oracle| + FLOOR_REL max|v|, where torch is SDPA's
   math backend on the same-dtype inputs (it computes in float32 and rounds once, so its error
   is about one output rounding). The kernel also rounds P, hence the factor 2; the floor
   (2^-10 max|v|, about 1e-3 for unit-scale values) covers cases where torch happens to be
   exact (one key, uniform rows).
3. Same boundary, elementwise: |out - sb| <= u_out |sb| + max|v| (u_in + 4 eta + (n_k + 64) 2^-23).
   u_out |sb| is the final rounding. u_in max|v| bounds one "flip": float32 noise pushing one p
   across a rounding midpoint changes it by one ulp (<= 2 u_in p), which moves the output by at
   most 2 u_in w (1 - w) 2 max|v| <= u_in max|v| (w = p / l). eta bounds the float32 score error
   (a dot product of D exact products, tensor-core accumulation: (D + 4) 2^-23 sum|q||k| scale)
   as a relative error of p; the last term covers float32 accumulation over n_k keys.
4. Same boundary, statistically (where score noise is small next to P's rounding, i.e. not for
   huge logits): the fraction of outputs that differ from round(sb) must stay below
   0.25 x the fraction that differ from round(oracle) + 0.05, over at least 256 rows (one flip
   moves a whole row of outputs, so fewer rows make the fraction noisy). A kernel that rounds P
   elsewhere, or on other tile boundaries, differs from round(sb) in 15-40% of its outputs; a
   correct one in under 5% (float32 noise crossing an output midpoint: at most 4.2% over these
   cases for a float32 model of the kernel with round-toward-zero tensor-core accumulation and
   ex2.approx-sized noise, against thresholds of 12-15%). ``fp32_model`` below is the plain
   float32 model; tests/test_attention_hopper.py checks that the rules accept it and reject it
   with one step of the algorithm changed.
5. LSE: |lse - oracle| <= 2^-21 (|lse| + |m|) + 2 eta + (n_k + 64) 2^-23 + 1e-5 (m the row max
   of the scaled scores: the kernel's m scale and its rounded m log2(e) scale each cost ~2^-24 of
   it).

The same-boundary reference uses the BLOCK_N the launcher actually chose: ``run_case`` records
the Hopper kernel's launch (``recorded_launches``), which also proves the Hopper kernel ran.

Everything here works on CPU or CUDA tensors and imports no GPU code at import time; functions
that launch take the launcher (``attention`` or ``launch``) as an argument.
"""
from __future__ import annotations

import math
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

LOG2E = 1.4426950408889634
HEAD_DIM = 64
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24,
                 torch.float64: 2.0 ** -53}
FLOOR_REL = 2.0 ** -10
STATS_SLOPE, STATS_FLOOR, STATS_MIN_ROWS = 0.25, 0.05, 256
NEG_INF = float("-inf")


# -- references ------------------------------------------------------------------------------------

class Reference(NamedTuple):
    out: torch.Tensor      # (B, H, n_q, D) float64
    lse: torch.Tensor      # (B, H, n_q) float64, -inf for empty rows
    row_max: torch.Tensor  # (B, H, n_q) float64, the max scaled score (-inf for empty rows)


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


def _empty_reference(q, v) -> Reference:
    B, H, n_q, _ = q.shape
    out = torch.zeros((B, H, n_q, v.shape[-1]), dtype=torch.float64, device=q.device)
    inf = torch.full((B, H, n_q), NEG_INF, dtype=torch.float64, device=q.device)
    return Reference(out, inf, inf.clone())


def round_p(p: torch.Tensor, dtype) -> torch.Tensor:
    """p rounded as the kernel rounds it: a float32 value converted (RNE) to bf16/fp16."""
    if dtype in (torch.bfloat16, torch.float16):
        return p.to(torch.float32).to(dtype).to(torch.float64)
    return p


def same_boundary(q, k, v, mask=None, causal=False, scale=None, block_n=128, p_dtype=None) -> Reference:
    """The kernel's tiling in float64: P rounded to ``p_dtype`` (default q.dtype) per key tile."""
    B, H, n_q, D = q.shape
    scale = resolve_scale(scale, D)
    n_k = k.shape[2]
    if n_k == 0:
        return _empty_reference(q, v)
    p_dtype = q.dtype if p_dtype is None else p_dtype
    m = torch.full((B, H, n_q, 1), NEG_INF, dtype=torch.float64, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((B, H, n_q, v.shape[-1]), dtype=torch.float64, device=q.device)
    q64 = q.double()
    for c0 in range(0, n_k, block_n):
        cols = slice(c0, min(c0 + block_n, n_k))
        s = _scores(q64, k, scale, cols).masked_fill(~allowed_keys(q, k, mask, causal, cols), NEG_INF)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_use = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # never -inf - (-inf)
        alpha = torch.exp(m - m_use)
        p = torch.exp(s - m_use)
        l = alpha * l + p.sum(-1, keepdim=True)
        acc = alpha * acc + round_p(p, p_dtype) @ v[:, :, cols].double()
        m = m_new
    out = torch.where(l > 0, acc / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(acc))
    m_use = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = torch.where(l > 0, m_use + torch.log(l), torch.full_like(l, NEG_INF))
    return Reference(out, lse.squeeze(-1), m.squeeze(-1))


def torch_same_dtype(q, k, v, mask=None, causal=False, scale=None) -> torch.Tensor:
    """SDPA's math backend on the same-dtype inputs; rows with no key are set to 0 (some torch
    versions return NaN there)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                               scale=resolve_scale(scale, q.shape[-1]))
    return out.masked_fill(empty_rows(q, k, mask, causal)[..., None], 0)


def score_error_bound(q, k, scale=None) -> torch.Tensor:
    """eta per row (B, H, n_q, 1): a bound on the float32 error of a scaled score, in exp units."""
    D = q.shape[-1]
    scale = abs(resolve_scale(scale, D))
    if k.shape[2] == 0:
        return torch.zeros(q.shape[:3] + (1,), dtype=torch.float64, device=q.device)
    mags = q.double().abs() @ k.double().abs().transpose(-1, -2)
    return scale * (D + 4) * 2.0 ** -23 * mags.amax(-1, keepdim=True) + 4e-6  # + ex2.approx and the FMA


# -- pass rules ------------------------------------------------------------------------------------

def _maxabs(x: torch.Tensor) -> float:
    return float(x.abs().max()) if x.numel() else 0.0


def _mismatch(out, ref64, keep) -> float:
    if not bool(keep.any()):
        return 0.0
    differ = (out != ref64.to(torch.float32).to(out.dtype))[keep]
    return float(differ.double().mean())


def check_output(out, lse, q, k, v, mask=None, causal=False, scale=None, block_n=128, stats=True) -> str:
    """Apply the pass rules of the module docstring; returns a one-line summary or raises
    AssertionError with it."""
    problems = []
    dtype = q.dtype
    u_in = u_out = UNIT_ROUNDOFF[dtype]
    empty = empty_rows(q, k, mask, causal)
    keep = ~empty[..., None].expand_as(out)
    vmax = _maxabs(v)
    ref = oracle(q, k, v, mask, causal, scale)
    if out.shape != ref.out.shape or out.dtype != dtype:
        raise AssertionError(f"output is {tuple(out.shape)} {out.dtype}, expected {tuple(ref.out.shape)} {dtype}")
    if not bool(torch.isfinite(out).all()):
        problems.append(f"{int((~torch.isfinite(out)).sum())} outputs are NaN/inf")
    if bool(empty.any()) and not bool((out[empty] == 0).all()):
        problems.append("rows with no key are not all zeros")
    o = out.double()
    err = _maxabs(torch.nan_to_num(o - ref.out, nan=math.inf))
    ref_torch = torch_same_dtype(q, k, v, mask, causal, scale).double() if k.shape[2] else ref.out
    err_t = _maxabs(ref_torch - ref.out)
    if not math.isfinite(err_t):
        err_t = 2 * u_out * vmax  # torch overflowed: judge against one output rounding instead
    bound = 2 * err_t + FLOOR_REL * vmax
    if not err <= bound:
        problems.append(f"oracle error {err:.3e} > 2 x torch {err_t:.3e} + floor")
    summary = f"err {err:.2e} (torch {err_t:.2e}, bound {bound:.2e})"
    if k.shape[2]:
        sb = same_boundary(q, k, v, mask, causal, scale, block_n)
        eta = score_error_bound(q, k, scale)
        tol = u_out * sb.out.abs() + vmax * (u_in + 4 * eta + (k.shape[2] + 64) * 2.0 ** -23)
        excess = float(torch.nan_to_num((o - sb.out).abs() - tol, nan=math.inf).max())
        worst = _maxabs(torch.nan_to_num(o - sb.out, nan=math.inf))
        summary += f"; same-boundary BLOCK_N={block_n} err {worst:.2e}"
        if excess > 0:
            problems.append(f"same-boundary (BLOCK_N={block_n}) error {worst:.3e} exceeds its bound by {excess:.2e}")
        if stats and int((~empty).sum()) >= STATS_MIN_ROWS:
            mis_sb, mis_64 = _mismatch(out, sb.out, keep), _mismatch(out, ref.out, keep)
            summary += f", differs from round(sb) in {mis_sb:.1%} (round(oracle) {mis_64:.1%})"
            if mis_sb > STATS_SLOPE * mis_64 + STATS_FLOOR:
                problems.append(f"{mis_sb:.1%} of outputs differ from the same-boundary reference rounded "
                                f"(BLOCK_N={block_n}), {mis_64:.1%} from the oracle rounded: P is not rounded "
                                "where the kernel should round it")
    if lse is not None:
        summary += "; " + _check_lse(lse, ref, q, k, scale, empty, problems)
    if problems:
        raise AssertionError("; ".join(problems) + f" [{summary}]")
    return summary


def _check_lse(lse, ref, q, k, scale, empty, problems) -> str:
    if lse.shape != ref.lse.shape or lse.dtype != torch.float32:
        problems.append(f"lse is {tuple(lse.shape)} {lse.dtype}, expected {tuple(ref.lse.shape)} float32")
        return "lse: wrong shape"
    if bool(empty.any()) and not bool((lse[empty] == NEG_INF).all()):
        problems.append("LSE of rows with no key is not -inf")
    full = ~empty
    if not bool(full.any()):
        return "lse: all rows empty"
    got, want = lse.double()[full], ref.lse[full]
    if not bool(torch.isfinite(got).all()):
        problems.append("LSE is not finite on rows with keys")
        return "lse: not finite"
    eta = score_error_bound(q, k, scale).squeeze(-1)[full]
    tol = 2.0 ** -21 * (want.abs() + ref.row_max[full].abs()) + 2 * eta + (k.shape[2] + 64) * 2.0 ** -23 + 1e-5
    diff = (got - want).abs()
    if bool((diff > tol).any()):
        problems.append(f"LSE error {float(diff.max()):.3e} exceeds its bound")
    return f"lse err {float(diff.max()):.2e}"


# -- cases and their inputs ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One numerics case. ``mask``: None, "random" ((n_q, n_k), row 0 empty), "heads" ((B, H, n_q,
    n_k), one empty row), "keys" ((B, 1, 1, n_k) key padding: batch b keeps n_k b / (B - 1) keys, so batch 0 has none),
    "transposed" (a non-contiguous (n_q, n_k) view). ``inputs``: "randn", "uniform" (q = 0),
    "large" (scores reach +-3e4), "large_uniform" (every score +3e4; -3e4 with ``negate``),
    "constant" (q = k = v = ``value``)."""

    dtype: str
    batch: int
    heads: int
    n_q: int
    n_k: int
    causal: bool = False
    mask: str | None = None
    lse: bool = False
    inputs: str = "randn"
    scale: float | None = None
    value: float = 0.0
    negate: bool = False

    def __post_init__(self):
        if self.causal and self.n_q != self.n_k:
            raise ValueError(f"Case expects n_q == n_k with causal=True, but got {self.n_q} and {self.n_k}")
        if self.causal and self.mask:
            raise ValueError("Case expects no mask with causal=True (the entry point rejects both)")

    @property
    def torch_dtype(self):
        return DTYPES[self.dtype]

    @property
    def name(self) -> str:
        parts = [self.dtype, f"{self.batch}x{self.heads}", f"{self.n_q}x{self.n_k}"]
        parts += ["causal"] if self.causal else []
        parts += [f"mask={self.mask}"] if self.mask else []
        parts += ["lse"] if self.lse else []
        if self.inputs != "randn":
            parts.append(self.inputs + (f"={self.value:g}" if self.inputs == "constant" else "")
                         + ("-neg" if self.negate else ""))
        parts += [f"scale={self.scale:g}"] if self.scale is not None else []
        return " ".join(parts)

    @property
    def stats(self) -> bool:
        """Whether the statistical same-boundary rule applies (not where score noise dominates)."""
        return self.inputs not in ("large", "large_uniform", "constant")


def _generator(case: Case, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(zlib.crc32(case.name.encode()))


def make_inputs(case: Case, device="cuda"):
    """(q, k, v, mask) for a case, reproducible from its name."""
    g = _generator(case, device)
    B, H, dt = case.batch, case.heads, case.torch_dtype
    shape_q, shape_k = (B, H, case.n_q, HEAD_DIM), (B, H, case.n_k, HEAD_DIM)
    q = torch.randn(shape_q, generator=g, device=device)
    k = torch.randn(shape_k, generator=g, device=device)
    v = torch.randn(shape_k, generator=g, device=device)
    if case.inputs == "uniform":
        q.zero_()
    elif case.inputs == "large" and case.n_q and case.n_k:
        s = (q @ k.transpose(-1, -2)) * resolve_scale(case.scale, HEAD_DIM)
        grow = math.sqrt(3e4 / float(s.abs().max()))
        q, k = q * grow, k * grow
    elif case.inputs == "large_uniform":  # 75 * 50 * 64 / 8 = 3e4 exactly, in bf16 and fp16
        if case.scale is not None:
            raise ValueError("large_uniform inputs assume the default scale 1/8")
        q.fill_(-75.0 if case.negate else 75.0)
        k.fill_(50.0)
    elif case.inputs == "constant":
        q.fill_(case.value), k.fill_(case.value), v.fill_(case.value)
    mask = make_mask(case, g, device)
    return q.to(dt), k.to(dt), v.to(dt), mask


def make_mask(case: Case, g, device):
    B, H, n_q, n_k = case.batch, case.heads, case.n_q, case.n_k
    if case.mask is None:
        return None
    if case.mask == "random":
        m = torch.rand((n_q, n_k), generator=g, device=device) > 0.3
        if n_q > 1:
            m[0] = False
    elif case.mask == "heads":
        m = torch.rand((B, H, n_q, n_k), generator=g, device=device) > 0.5
        m[0, -1, n_q // 2] = False
    elif case.mask == "keys":
        lengths = [n_k * b // (B - 1) for b in range(B)] if B > 1 else [max(1, 2 * n_k // 3)]
        m = torch.arange(n_k, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
        m = m[:, None, None, :]
    elif case.mask == "transposed":
        m = (torch.rand((n_k, n_q), generator=g, device=device) > 0.3).t()
        m[n_q - 1] = False
    else:
        raise ValueError(f"mask kind expects random, heads, keys or transposed, but got {case.mask!r}")
    return m


PAIRS = ((1, 1), (1, 239), (239, 1), (17, 17), (64, 128), (113, 203), (127, 129), (128, 128), (129, 127),
         (1023, 1024), (2048, 2048), (4097, 4097))
BATCH_HEADS = {(1, 1): (1, 1), (1, 239): (2, 3), (239, 1): (1, 2), (17, 17): (9, 6), (64, 128): (1, 1),
               (113, 203): (2, 3), (127, 129): (3, 2), (128, 128): (1, 4), (129, 127): (9, 6),
               (1023, 1024): (1, 2), (2048, 2048): (1, 2), (4097, 4097): (1, 1)}
MASK_KINDS = ("random", "heads", "keys", "transposed")


def shape_cases(compact: bool = False) -> list[Case]:
    """Every (n_q, n_k) pair in bf16 and fp16: plain, masked, and causal where n_q == n_k. The
    compact list (for ``tylopy check``) takes one dtype per pair, alternating."""
    cases = []
    for i, (n_q, n_k) in enumerate(PAIRS):
        B, H = BATCH_HEADS[(n_q, n_k)]
        for j, dt in enumerate(("bf16", "f16")):
            if compact and j != i % 2:
                continue
            lse = (i + j) % 2 == 0
            cases.append(Case(dt, B, H, n_q, n_k, lse=lse))
            cases.append(Case(dt, B, H, n_q, n_k, mask=MASK_KINDS[(i + j) % 4], lse=not lse))
            if n_q == n_k:
                cases.append(Case(dt, B, H, n_q, n_k, causal=True, lse=not lse))
    return cases


def special_cases() -> list[Case]:
    """Uniform and large logits, many work tiles (more than the SM count), non-default scales."""
    return [
        Case("bf16", 2, 2, 200, 333, inputs="uniform", lse=True),
        Case("f16", 1, 2, 300, 300, causal=True, inputs="uniform"),
        Case("bf16", 1, 2, 256, 256, inputs="large", lse=True),
        Case("f16", 2, 1, 300, 257, inputs="large", mask="random", lse=True),
        Case("bf16", 1, 1, 384, 384, causal=True, inputs="large", lse=True),
        Case("bf16", 1, 2, 300, 300, causal=True, inputs="large_uniform", lse=True),
        Case("f16", 1, 2, 200, 333, inputs="large_uniform", negate=True, lse=True),
        Case("bf16", 4, 8, 1024, 1024, causal=True, lse=True),
        Case("f16", 9, 6, 640, 640, mask="keys"),
        Case("bf16", 9, 6, 512, 700),
        Case("bf16", 1, 2, 300, 200, scale=0.3, lse=True),
        Case("f16", 1, 1, 129, 300, scale=1, mask="random"),
    ]


# Former failures, kept as cases. Each constant's square has so few significant bits that every
# partial sum of q.k is exact in float32, whatever the order: the score is exactly 64 value^2, and
# the old exponent fma(s, c, -round(m c)) missed by 7916 (bf16) and 2044.5 (fp16).
CONSTANT_CASES = (Case("bf16", 1, 2, 300, 300, inputs="constant", value=133120.0),
                  Case("f16", 1, 1, 200, 200, inputs="constant", value=54656.0))
NONPOSITIVE_SCALE_CASES = (Case("bf16", 1, 1, 128, 128, scale=0.0),
                           Case("bf16", 1, 2, 100, 300, scale=-0.125, lse=True))


@contextmanager
def recorded_launches():
    """Record the compile-time parameters (and the grid) of every launch of the Hopper kernel
    made inside: a list of dicts such as {"BLOCK_N": 128, ..., "grid": (132,)}."""
    from . import hopper_launch as launch
    real = launch.attention_fwd_sm90
    seen: list[dict] = []

    class Recorder:
        def __getitem__(self, grid):
            bound = real[grid]

            def launch_and_record(*args, **constexprs):
                seen.append(dict(constexprs, grid=grid))
                return bound(*args, **constexprs)
            return launch_and_record

        def __getattr__(self, name):
            return getattr(real, name)

    launch.attention_fwd_sm90 = Recorder()
    try:
        yield seen
    finally:
        launch.attention_fwd_sm90 = real


def attend(attention, q, k, v, mask, case: Case, block_n: int | None = None):
    """(result, block_n): call ``attention`` on a case's tensors. With ``block_n`` None it must
    launch the Hopper kernel, and block_n is the BLOCK_N that launch used."""
    if block_n is not None:
        return _call(attention, q, k, v, mask, case), block_n
    with recorded_launches() as seen:
        res = _call(attention, q, k, v, mask, case)
    if not seen:
        raise AssertionError("the Hopper kernel did not run (no launch of attention_fwd_sm90)")
    return res, int(seen[-1]["BLOCK_N"])


def run_case(case: Case, attention: Callable, device="cuda", block_n: int | None = None) -> str:
    """Run ``attention`` on a case and apply ``check_output``."""
    q, k, v, mask = make_inputs(case, device)
    res, block_n = attend(attention, q, k, v, mask, case, block_n)
    out, lse = res if case.lse else (res, None)
    return check_output(out, lse, q, k, v, mask, case.causal, case.scale, block_n, stats=case.stats)


# -- scenarios beyond numerics ---------------------------------------------------------------------

def _call(attention, q, k, v, mask, case: Case):
    return attention(q, k, v, attn_mask=mask, is_causal=case.causal, scale=case.scale, return_lse=case.lse)


def _equal(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_equal(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and bool(torch.equal(a.view(torch.int16) if a.element_size() == 2 else a,
                                                   b.view(torch.int16) if b.element_size() == 2 else b))


def nan_padded(t: torch.Tensor, pad_n: int, pad_d: int = 0) -> torch.Tensor:
    """A copy of (B, H, N, D) ``t`` living in a NaN-filled (B, H, N + pad_n, D + pad_d) buffer."""
    B, H, N, D = t.shape
    buf = torch.full((B, H, N + pad_n, D + pad_d), float("nan"), dtype=t.dtype, device=t.device)
    view = buf[:, :, :N, :D]
    view.copy_(t)
    return view


def check_nan_padding(case: Case, attention, device="cuda") -> str:
    """NaN beyond N (and beyond D in the row pitch) must not change a single output bit."""
    q, k, v, mask = make_inputs(case, device)
    want = _call(attention, q, k, v, mask, case)
    for pad_n, pad_d in ((5, 0), (130, 64)):
        got = _call(attention, nan_padded(q, pad_n, pad_d), nan_padded(k, pad_n, pad_d),
                    nan_padded(v, pad_n, pad_d), mask, case)
        if not _equal(got, want):
            raise AssertionError(f"NaN padding (+{pad_n} rows, +{pad_d} columns) changed the output")
    return "NaN padding left every bit unchanged"


def check_future_perturbation(case: Case, attention, cuts, device="cuda") -> str:
    """Causal: changing K and V rows after t leaves queries <= t bit-for-bit unchanged."""
    if not case.causal:
        raise ValueError("check_future_perturbation needs a causal case")
    q, k, v, _ = make_inputs(case, device)
    base = _call(attention, q, k, v, None, case)
    base_out = base[0] if case.lse else base
    g = torch.Generator(device=device).manual_seed(1234)
    for t in cuts:
        k2, v2 = k.clone(), v.clone()
        k2[:, :, t + 1:] = (torch.randn(k2[:, :, t + 1:].shape, generator=g, device=device) * 100).to(k.dtype)
        v2[:, :, t + 1:] = (torch.randn(v2[:, :, t + 1:].shape, generator=g, device=device) * 100).to(v.dtype)
        res = _call(attention, q, k2, v2, None, case)
        out = res[0] if case.lse else res
        if not _equal(out[:, :, :t + 1], base_out[:, :, :t + 1]):
            raise AssertionError(f"changing keys/values after row {t} changed outputs of rows <= {t}")
        if case.lse and not _equal(res[1][:, :, :t + 1], base[1][:, :, :t + 1]):
            raise AssertionError(f"changing keys/values after row {t} changed the LSE of rows <= {t}")
        if t + 1 < case.n_q and _equal(out[:, :, t + 1:], base_out[:, :, t + 1:]):
            raise AssertionError(f"changing keys/values after row {t} changed no later output: test is void")
    return f"rows <= t unchanged for t in {list(cuts)}"


def check_repeatable(case: Case, attention, runs: int = 100, device="cuda") -> str:
    """``runs`` launches on the same inputs give bit-identical outputs (and LSE)."""
    q, k, v, mask = make_inputs(case, device)
    first = _call(attention, q, k, v, mask, case)
    for i in range(1, runs):
        if not _equal(_call(attention, q, k, v, mask, case), first):
            raise AssertionError(f"run {i} differs from run 0")
    return f"{runs} runs bit-identical"


def check_transposed_layout(case: Case, attention, device="cuda", block_n: int | None = None) -> str:
    """(B, N, H, D) buffers viewed as (B, H, N, D) give the bits of contiguous inputs, and K/V in
    a different layout from Q still give the right answer."""
    q, k, v, mask = make_inputs(case, device)
    want = _call(attention, q, k, v, mask, case)

    def bnhd(t):
        return t.transpose(1, 2).contiguous().transpose(1, 2)

    got = _call(attention, bnhd(q), bnhd(k), bnhd(v), mask, case)
    if not _equal(got, want):
        raise AssertionError("(B, N, H, D) memory gave different bits from (B, H, N, D)")
    mixed, block_n = attend(attention, q, bnhd(k), bnhd(v), mask, case, block_n)
    out, lse = mixed if case.lse else (mixed, None)
    return "bits equal; mixed layouts: " + check_output(out, lse, q, k, v, mask, case.causal, case.scale, block_n,
                                                        stats=case.stats)


def check_empty(attention, dtype=torch.bfloat16, device="cuda") -> str:
    """n_k = 0: zeros and LSE -inf; n_q = 0 and batch 0: empty results."""
    q = torch.randn(2, 3, 37, HEAD_DIM, device=device).to(dtype)
    kv = torch.randn(2, 3, 0, HEAD_DIM, device=device).to(dtype)
    out, lse = attention(q, kv, kv, return_lse=True)
    if out.shape != q.shape or not bool((out == 0).all()) or not bool((lse == NEG_INF).all()):
        raise AssertionError("n_k = 0 must give zeros and LSE -inf")
    out = attention(q, kv, kv, attn_mask=torch.ones(37, 0, dtype=torch.bool, device=device))
    if not bool((out == 0).all()):
        raise AssertionError("n_k = 0 with a mask must give zeros")
    for qs, ks in (((2, 3, 0, HEAD_DIM), (2, 3, 5, HEAD_DIM)), ((0, 3, 5, HEAD_DIM), (0, 3, 5, HEAD_DIM))):
        q0 = torch.randn(qs, device=device).to(dtype)
        k0 = torch.randn(ks, device=device).to(dtype)
        out, lse = attention(q0, k0, k0, return_lse=True)
        if out.shape != qs or lse.shape != qs[:3]:
            raise AssertionError(f"empty query {qs}: got {tuple(out.shape)} and {tuple(lse.shape)}")
    return "empty keys give zeros and -inf; empty queries give empty outputs"


def check_canary(case: Case, launch, device="cuda") -> str:
    """``launch(q, k, v, mask, causal, scale, out, lse)`` into views of NaN buffers: every output
    element is written, nothing around it is, and the bits equal a contiguous launch's."""
    q, k, v, mask = make_inputs(case, device)
    B, H, n_q, D = q.shape
    scale = resolve_scale(case.scale, D)
    buf = torch.full((B + 2, H + 1, n_q + 5, D + 32), float("nan"), dtype=q.dtype, device=device)
    before = buf.view(torch.int16).clone()
    region = (slice(1, B + 1), slice(1, H + 1), slice(2, n_q + 2), slice(16, D + 16))
    out = buf[region]
    lse_buf = lse = None
    if case.lse:
        lse_buf = torch.full((B * H * n_q + 64,), float("nan"), device=device)
        lse = lse_buf[32:32 + B * H * n_q].view(B, H, n_q)
    launch(q, k, v, mask, case.causal, scale, out, lse)
    outside = torch.ones(buf.shape, dtype=torch.bool, device=device)
    outside[region] = False
    if not bool(torch.equal(buf.view(torch.int16)[outside], before[outside])):
        raise AssertionError("the kernel wrote outside the output view")
    if not bool(torch.isfinite(out).all()):
        raise AssertionError(f"{int((~torch.isfinite(out)).sum())} output elements were not written")
    if lse_buf is not None:
        if not (bool(torch.isnan(lse_buf[:32]).all()) and bool(torch.isnan(lse_buf[32 + B * H * n_q:]).all())):
            raise AssertionError("the kernel wrote outside the LSE view")
        if bool(torch.isnan(lse).any()):
            raise AssertionError("LSE elements were not written")
    out2 = torch.empty((B, H, n_q, D), dtype=q.dtype, device=device)
    lse2 = torch.empty((B, H, n_q), device=device) if case.lse else None
    launch(q, k, v, mask, case.causal, scale, out2, lse2)
    if not _equal(out, out2) or (case.lse and not _equal(lse, lse2)):
        raise AssertionError("a strided output view got different bits from a contiguous one")
    return "every element written, canaries intact, bits equal to a contiguous launch"


def check_cuda_graph(case: Case, attention) -> str:
    """Capture one call in a CUDA graph; replays follow new contents of the captured inputs."""
    q, k, v, mask = make_inputs(case, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture: compile, load, tensor maps
        for _ in range(2):
            _call(attention, q, k, v, mask, case)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = _call(attention, q, k, v, mask, case)
    g = torch.Generator(device="cuda").manual_seed(99)
    for i in range(2):
        if i:  # new contents in the captured buffers
            for t in (q, k, v):
                t.copy_(torch.randn(t.shape, generator=g, device="cuda").to(t.dtype))
        graph.replay()
        torch.cuda.synchronize()
        if not _equal(static, _call(attention, q, k, v, mask, case)):
            raise AssertionError(f"graph replay {i} differs from an eager call")
    return "replays equal eager calls"


def check_side_stream(case: Case, attention) -> str:
    """A call on a non-default stream runs on that stream: it sees work queued before it there."""
    q, k, v, mask = make_inputs(case, "cuda")
    want = _call(attention, q, k, v, mask, case)
    q_late = torch.zeros_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(100_000_000)  # ~50 ms: a launch on another stream would read zeros
        q_late.copy_(q)
        got = _call(attention, q_late, k, v, mask, case)
    side.synchronize()
    if not _equal(got, want):
        raise AssertionError("the call on a side stream did not see the inputs written on that stream")
    return "side stream ordered"


# -- a float32 model of the kernel's arithmetic (CPU tests of the rules above) --------------------

def fp32_model(block_n: int = 128, round_p_to_input: bool = True, rescale: bool = True):
    """An ``attention``-like function computing as the kernel does, in float32: raw scores, the
    running max per tile, c = scale log2(e), p = exp2((s - m) c), l over the unrounded p, P
    rounded to the input dtype before PV, O rescaled by exp2((m_old - m_new) c). ``round_p_to_input``
    and ``rescale`` switch off one step each, to check that the rules catch it."""
    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, return_lse=False):
        B, H, n_q, D = q.shape
        sc = resolve_scale(scale, D)
        c = torch.tensor(sc, dtype=torch.float32) * torch.tensor(LOG2E, dtype=torch.float32)
        m = torch.full((B, H, n_q, 1), NEG_INF)
        l = torch.zeros_like(m)
        acc = torch.zeros((B, H, n_q, D))
        for c0 in range(0, k.shape[2], block_n):
            cols = slice(c0, min(c0 + block_n, k.shape[2]))
            s = q.float() @ k[:, :, cols].float().transpose(-1, -2)
            s = s.masked_fill(~allowed_keys(q, k, attn_mask, is_causal, cols), NEG_INF)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_use = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp2((m - m_use) * c) if rescale else torch.ones_like(m)
            p = torch.exp2((s - m_use) * c)
            l = alpha * l + p.sum(-1, keepdim=True)
            pr = p.to(q.dtype).float() if round_p_to_input else p
            acc = alpha * acc + pr @ v[:, :, cols].float()
            m = m_new
        inv = torch.where(l > 0, 1 / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(l))
        out = (acc * inv).to(q.dtype)
        m_use = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        lse = torch.where(l > 0, m_use * sc + torch.log(l), torch.full_like(l, NEG_INF)).squeeze(-1)
        return (out, lse) if return_lse else out
    return attention


def model_launch(block_n: int = 128):
    """A ``launch_hopper``-like function over ``fp32_model``: writes into the given out and lse."""
    model = fp32_model(block_n)

    def launch(q, k, v, attn_mask, is_causal, scale, out, lse):
        res = model(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, return_lse=lse is not None)
        if lse is not None:
            out.copy_(res[0])
            lse.copy_(res[1])
        else:
            out.copy_(res)
    return launch
