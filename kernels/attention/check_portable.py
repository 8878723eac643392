"""``tylopy check streaming_attention``: the portable kernel against two references, case by case.

Every case runs ``streaming_attention`` on the GPU and passes when all of these hold:

* FP64 oracle (``reference_fp64``, an independent softmax(QK^T)V in float64):
  max|out - ref64| <= 2 * max|sdpa - ref64| + floor, where sdpa is
  ``torch.nn.functional.scaled_dot_product_attention`` on the same inputs in the same dtype and
  floor = 1e-3 (bf16) or 2e-4 (fp16) times max(1, max|ref64|): a fraction of an output ulp at
  |out| ~ 1, for cases where SDPA happens to be exact (one key, uniform or one-hot weights).
* No NaN or inf in the output for finite inputs; outputs (and LSE) pre-filled with NaN are all
  overwritten.
* Same-boundary reference (``reference_same_boundary``): the kernel's own recipe in torch
  (scores in FP32, the exp2-domain update with the FP32 roundings of (s - m) and of its product with c,
  p rounded to the input dtype once per BLOCK_N-key tile, l summing the unrounded p, a and l in
  FP64). Per row the output may differ by half an output ulp (the kernel stores bf16/fp16) plus
  ``SAME_BOUNDARY_RTOL`` = 3e-5 of the row's magnitude sum|p||v|/l: ex2.approx (2^-22), the
  tensor cores' summation order and FP32 accumulation of l and a over up to ~8k keys stay well
  below it. Two terms are added where they apply: unless Q and K are integers whose dot products
  are exact in FP32, the scores may differ by (D + 4) 2^-23 sum|q||k| (the tensor cores' summation
  order and precision, as ``attention_reference.py`` bounds it), i.e. by that times
  scale*log2(e)*ln(2) relative in p; and where p sits within 2^-20 plus that relative distance of
  a rounding boundary of the dtype, the kernel may round it the other way, so such an element may
  contribute one dtype ulp of p times max|v| (both scaled like every other term by the later
  rescalings and 1/l).
* LSE (``return_lse``): within 4e-6 (1 + |lse|) of the FP64 one (plus scale times the same score
  bound), -inf exactly for rows whose keys are all masked.

Extra cases: the seed's worked example through the kernel (output 6), the causal
future-perturbation test (change K and V after position t: outputs for queries <= t unchanged
bit for bit), and inputs whose memory around the slice is NaN (same output bit for bit).

    tylopy check streaming_attention                 # every case
    tylopy check streaming_attention --quick -k causal
    pytest -m gpu tests/test_streaming_attention_gpu.py   # the same cases under pytest
"""
import argparse
import contextlib
import math
import sys
import time
import zlib
from dataclasses import dataclass, field, replace

LOG2E = 1.4426950408889634
SAME_BOUNDARY_RTOL = 3e-5
LSE_RTOL = 4e-6
AMBIGUOUS = 2.0 ** -20     # relative window around a rounding boundary of p (ex2.approx, FP32 roundings)
FLOOR = {"bfloat16": 1e-3, "float16": 2e-4}
OUT_HALF_ULP = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}   # >= half an ulp, relative


# -- references -------------------------------------------------------------------------------------------

def allowed_keys(B, H, n_q, n_k, causal, mask, device):
    """Boolean (B|1, H|1, n_q, n_k): which keys each query may see."""
    import torch
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if causal:
        allowed = torch.tril(allowed)
    if mask is not None:
        allowed = allowed & mask.to(device)
    return torch.broadcast_to(allowed, (B, H, n_q, n_k))


def reference_fp64(q, k, v, scale, causal=False, mask=None):
    """softmax(scale q k^T) v and the row LSE in float64; all-masked rows give 0 and -inf."""
    import torch
    B, H, n_q, _ = q.shape
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed_keys(B, H, n_q, k.shape[2], causal, mask, q.device), float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    out = (p @ v.double()) / torch.where(l == 0, torch.ones_like(l), l)
    lse = torch.where(l[..., 0] == 0, torch.full_like(l[..., 0], float("-inf")), m[..., 0] + torch.log(l[..., 0]))
    return out, lse


@contextlib.contextmanager
def _exact_fp32_matmul():
    import torch
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@dataclass
class SameBoundary:
    """The same-boundary reference: out and lse in FP64, and per-row tolerance terms."""

    out: object
    lse: object
    magnitude: object   # sum |p_rounded| max|v| / l per row
    ambiguous: object   # sum over boundary-close p of (one dtype ulp of p) max|v| / l per row
    score_rel: object   # bound on the relative error of p from FP32 score rounding, per row (0 if exact)
    score_abs: object   # the same bound in score units (times scale), per row


def score_error_bound(q, k):
    """Per row, (D + 4) 2^-23 max_j sum_d |q_d k_jd| -- or 0 where integer Q and K make FP32 scores exact."""
    import torch
    with _exact_fp32_matmul():
        sabs = (q.double().abs() @ k.double().abs().transpose(-1, -2)).amax(-1)
    exact = bool((q == q.round()).all() and (k == k.round()).all() and sabs.max() < 2 ** 24)
    return torch.zeros_like(sabs) if exact else (q.shape[-1] + 4) * 2.0 ** -23 * sabs


def reference_same_boundary(q, k, v, scale, block_n, causal=False, mask=None) -> SameBoundary:
    """The kernel's recipe, tile by tile: p rounded to q.dtype exactly where the kernel rounds it."""
    import torch
    B, H, n_q, _ = q.shape
    n_k = k.shape[2]
    dev = q.device
    with _exact_fp32_matmul():
        s = torch.matmul(q.float(), k.float().transpose(-1, -2))
    s = s.masked_fill(~allowed_keys(B, H, n_q, n_k, causal, mask, dev), float("-inf"))
    c = torch.tensor(scale, dtype=torch.float32, device=dev) * torch.tensor(LOG2E, dtype=torch.float32, device=dev)
    m = torch.full((B, H, n_q), float("-inf"), dtype=torch.float32, device=dev)
    zeros = torch.zeros((B, H, n_q), dtype=torch.float64, device=dev)
    l, amb, mag = zeros.clone(), zeros.clone(), zeros.clone()
    a = torch.zeros((B, H, n_q, v.shape[-1]), dtype=torch.float64, device=dev)
    vd = v.double()
    vmax = vd.abs().amax(-1, keepdim=True)
    bound = score_error_bound(q, k)
    p_rel = bound * float(c) * math.log(2.0)               # relative error of p from the scores
    window = (AMBIGUOUS + p_rel)[..., None]
    for t0 in range(0, n_k, block_n):
        st = s[..., t0:t0 + block_n]
        m_new = torch.maximum(m, st.amax(-1))
        m_use = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        alpha = torch.exp2(((m - m_use) * c).double())                 # ex2((m_old - m) c), FP32 sub and mul
        arg = (st - m_use[..., None]) * c                              # the kernel's exponent: (s - m) c in FP32
        p = torch.exp2(arg.double())
        p_rounded = p.to(q.dtype).double()
        flip = (p * (1 + window)).to(q.dtype).double() - (p * (1 - window)).to(q.dtype).double()
        vt, vmt = vd[..., t0:t0 + block_n, :], vmax[..., t0:t0 + block_n, :]
        l = alpha * l + p.sum(-1)
        a = alpha[..., None] * a + p_rounded @ vt
        amb = alpha * amb + (flip.abs() @ vmt)[..., 0]
        mag = alpha * mag + (p_rounded @ vmt)[..., 0]
        m = m_new
    inv = torch.where(l > 0, 1.0 / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(l))
    lse = torch.where(l > 0, m.double() * scale + torch.log(torch.where(l > 0, l, torch.ones_like(l))),
                      torch.full_like(l, float("-inf")))
    return SameBoundary(a * inv[..., None], lse, mag * inv, amb * inv, p_rel, bound * scale)


def compare_same_boundary(out, ref: SameBoundary):
    """(max excess over the tolerance, max error): passes when the excess is <= 0."""
    half_ulp = OUT_HALF_ULP[str(out.dtype).replace("torch.", "")]
    err = (out.double() - ref.out).abs()
    row_tol = SAME_BOUNDARY_RTOL * ref.magnitude + ref.ambiguous + 2 * ref.score_rel * ref.magnitude
    tol = ref.out.abs() * half_ulp + 1e-7 + row_tol[..., None]
    return (err - tol).max().item(), err.max().item()


def compare_lse(lse, ref_lse, score_abs):
    """Max excess of |lse - ref| over its tolerance; -inf must match -inf exactly."""
    import torch
    lse = lse.double()
    inf_ok = torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) and torch.equal(lse[torch.isinf(lse)],
                                                                                 ref_lse[torch.isinf(ref_lse)])
    if not inf_ok:
        return float("inf")
    fin = ~torch.isinf(ref_lse)
    if not fin.any():
        return 0.0
    err = (lse - ref_lse).abs()[fin]
    tol = LSE_RTOL * (1 + ref_lse.abs()[fin]) + score_abs[fin]
    return (err - tol).max().item()


# -- cases ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One checked launch. ``inputs``: randn, uniform (all scores equal), large (integer Q, K with scores
    around +-3e4), seed (the worked example). ``mask``: None, "qk" (n_q x n_k), "bhk" (B x 1 x 1 x n_k
    broadcast), "hqk" (1 x H x n_q x n_k). ``layout``: contiguous, bnhd (a (B, N, H, D) buffer
    transposed), poison (a NaN-filled larger buffer, 16-byte aligned slice), poison_odd (misaligned:
    copied by the launcher)."""

    name: str
    n_q: int
    n_k: int = -1
    D: int = 64
    dtype: str = "bfloat16"
    block_n: int = 64
    causal: bool = False
    B: int = 1
    H: int = 1
    mask: str | None = None
    lse: bool = False
    inputs: str = "randn"
    layout: str = "contiguous"
    scale: float | None = None
    kind: str = "numerics"      # numerics, future, seed
    warps: int = 4
    extra: tuple = field(default=())

    @property
    def keys(self):
        return self.n_q if self.n_k < 0 else self.n_k


def _cases():
    cases = []
    ns = (1, 2, 15, 17, 63, 65, 2047, 2048, 4096, 5000)
    for n in ns:
        heads = 2 if n <= 2048 else 1
        for D in (16, 32, 64):
            for bn in (32, 64):
                cases.append(Case(f"N{n}-D{D}-BN{bn}-bf16", n, D=D, block_n=bn, H=heads))
            cases.append(Case(f"N{n}-D{D}-BN64-f16", n, D=D, dtype="float16", H=heads))
        cases.append(Case(f"N{n}-D64-BN64-bf16-causal", n, causal=True, H=heads, lse=True))
        cases.append(Case(f"N{n}-D32-BN32-f16-causal", n, D=32, block_n=32, dtype="float16", causal=True, H=heads))
    cases += [
        Case("single-D16-f16-lse", 1, D=16, dtype="float16", lse=True),
        Case("ragged-rect-100x300-D32", 100, 300, D=32, block_n=32, B=2, H=3, lse=True),
        Case("ragged-rect-300x7-D64", 300, 7, lse=True),
        Case("ragged-rect-1x5000-D16", 1, 5000, D=16),
        Case("ragged-rect-129x33-D64-BN32-f16", 129, 33, block_n=32, dtype="float16"),
        Case("batch-heads-3x5-N77-D32", 77, D=32, B=3, H=5, lse=True),
        Case("uniform-N1000-D64", 1000, inputs="uniform", H=2),
        Case("uniform-N999-D16-BN32-f16-causal", 999, D=16, block_n=32, dtype="float16", inputs="uniform", causal=True),
        Case("large-N777-D64-bf16", 777, inputs="large", lse=True),
        Case("large-N2048-D64-f16-causal", 2048, dtype="float16", inputs="large", causal=True, lse=True),
        Case("large-N500-D16-BN32-bf16", 500, D=16, block_n=32, inputs="large", H=2),
        Case("mask-qk-D64-lse", 200, 333, mask="qk", lse=True, H=2),
        Case("mask-bhk-D32-BN32", 150, 150, D=32, block_n=32, mask="bhk", B=2, H=2, lse=True),
        Case("mask-hqk-D16-f16", 90, 200, D=16, dtype="float16", mask="hqk", H=3, lse=True),
        Case("layout-bnhd-D64-causal", 300, B=2, H=4, layout="bnhd", causal=True),
        Case("layout-bnhd-D16-rect", 100, 250, D=16, B=2, H=3, layout="bnhd", lse=True),
        Case("poison-aligned-D32", 200, 150, D=32, layout="poison", lse=True),
        Case("poison-aligned-D64-causal-BN32", 129, block_n=32, layout="poison", causal=True, lse=True),
        Case("poison-misaligned-D16-f16", 70, 90, D=16, dtype="float16", layout="poison_odd"),
        Case("scale-0.5-D32", 128, D=32, scale=0.5),
        Case("warps1-N100-D64-causal", 100, causal=True, warps=1, lse=True),
        Case("warps2-N200x150-D32-BN32", 200, 150, D=32, block_n=32, warps=2),
        Case("warps8-N300-D16-f16-causal", 300, D=16, dtype="float16", causal=True, warps=8, lse=True),
        Case("warps8-N1000x70-D64-mask", 1000, 70, mask="qk", warps=8),
        Case("seed-example-D16", 3, D=16, kind="seed"),
        Case("seed-example-D64-BN32-f16", 3, D=64, block_n=32, dtype="float16", kind="seed"),
        Case("seed-example-two-tiles-D32-BN32", 1, D=32, block_n=32, kind="seed", extra=("two_tiles",)),
        Case("seed-example-two-tiles-D64-BN64", 1, D=64, block_n=64, kind="seed", extra=("two_tiles",)),
    ]
    for D, bn, dtype in ((16, 32, "bfloat16"), (64, 64, "bfloat16"), (32, 64, "float16"), (64, 32, "float16")):
        cases.append(Case(f"future-D{D}-BN{bn}-{dtype}", 300, D=D, block_n=bn, dtype=dtype, causal=True, H=2,
                          lse=True, kind="future"))
    return cases


CASES = _cases()
QUICK = [c for c in CASES if c.keys <= 2048 and (c.kind != "numerics" or c.n_q in (1, 17, 65, 2048) or
                                                 not c.name.startswith("N"))]


# -- inputs ---------------------------------------------------------------------------------------------

def _dtype(name):
    import torch
    return getattr(torch, name)


def _tensor(shape, fill, dtype, layout, device, gen):
    """A (B, H, N, D) tensor of ``fill``'s values in the case's memory layout."""
    import torch
    B, H, N, D = shape
    if layout == "bnhd":
        buf = torch.empty(B, N, H, D, dtype=dtype, device=device)
        t = buf.transpose(1, 2)
    elif layout in ("poison", "poison_odd"):
        pad = 8 if layout == "poison" else 3
        buf = torch.full((B, H, N + 5, D + pad), float("nan"), dtype=dtype, device=device)
        t = buf[:, :, 2:N + 2, pad:pad + D] if layout == "poison_odd" else buf[:, :, 2:N + 2, :D]
    else:
        t = torch.empty(B, H, N, D, dtype=dtype, device=device)
    t.copy_(fill)
    return t


def make_inputs(case: Case, device="cuda"):
    """(q, k, v, mask) for a case, deterministic."""
    import torch
    gen = torch.Generator(device="cpu").manual_seed(zlib.crc32(case.name.encode()))
    dt = _dtype(case.dtype)
    B, H, n_q, n_k, D = case.B, case.H, case.n_q, case.keys, case.D

    def randn(*shape):
        return torch.randn(*shape, generator=gen)
    if case.inputs == "uniform":
        qf, kf = torch.zeros(B, H, n_q, D), randn(B, H, n_k, D)
    elif case.inputs == "large":   # integers: every product and partial sum is exact in FP32; scores ~ +-3e4
        qf = torch.randint(-128, 129, (B, H, n_q, D), generator=gen).float()
        kf = torch.randint(-128, 129, (B, H, n_k, D), generator=gen).float()
    else:
        qf, kf = randn(B, H, n_q, D), randn(B, H, n_k, D)
    vf = randn(B, H, n_k, D)
    q = _tensor((B, H, n_q, D), qf.to(dt).to(device), dt, case.layout, device, gen)
    k = _tensor((B, H, n_k, D), kf.to(dt).to(device), dt, case.layout, device, gen)
    v = _tensor((B, H, n_k, D), vf.to(dt).to(device), dt, case.layout, device, gen)
    mask = None
    if case.mask == "qk":
        mask = torch.rand(n_q, n_k, generator=gen) > 0.4
        mask[0] = False            # a row that sees no key: zeros, LSE -inf
        mask[1, :] = False
        mask[1, -1] = True         # a row that sees only the last key
    elif case.mask == "bhk":
        mask = torch.rand(B, 1, 1, n_k, generator=gen) > 0.3
        mask[..., 0] = True
    elif case.mask == "hqk":
        mask = torch.rand(1, H, n_q, n_k, generator=gen) > 0.5
        mask[0, 0, 3] = False
    return q, k, v, (mask.to(device) if mask is not None else None)


# -- running cases ---------------------------------------------------------------------------------------

def _scale(case):
    return case.scale if case.scale is not None else 1.0 / math.sqrt(case.D)


def run_kernel(case: Case, q, k, v, mask, scale=None):
    """The kernel's (out, lse) into NaN-poisoned buffers; lse is None without ``case.lse``."""
    import torch
    from tylopy_kernels.attention.portable import streaming_attention
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    res = streaming_attention(q, k, v, attn_mask=mask, is_causal=case.causal, scale=scale or _scale(case),
                              return_lse=case.lse, block_n=case.block_n, warps=case.warps, out=out)
    return res if case.lse else (res, None)


def check_numerics(case: Case, device="cuda"):
    """FP64 oracle, same-boundary reference, LSE, NaN/inf and poisoned-output checks: (ok, message)."""
    import torch
    q, k, v, mask = make_inputs(case, device)
    scale = _scale(case)
    out, lse = run_kernel(case, q, k, v, mask)
    problems = []
    if not torch.isfinite(out).all():
        problems.append(f"{int((~torch.isfinite(out)).sum())} non-finite outputs (poisoned NaN left or overflow)")
    ref64, lse64 = reference_fp64(q, k, v, scale, case.causal, mask)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=case.causal,
                                                            scale=scale)
    err = (out.double() - ref64).abs().nan_to_num(float("inf")).max().item()
    err_sdpa = (sdpa.double() - ref64).abs().nan_to_num(0.0).max().item()
    floor = FLOOR[case.dtype] * max(1.0, ref64.abs().max().item())
    if not err <= 2 * err_sdpa + floor:
        problems.append(f"fp64 error {err:.3e} > 2 x sdpa {err_sdpa:.3e} + {floor:.1e}")
    sb = reference_same_boundary(q, k, v, scale, case.block_n, case.causal, mask)
    excess, err_sb = compare_same_boundary(out, sb)
    if not excess <= 0:
        problems.append(f"same-boundary error {err_sb:.3e} exceeds its tolerance by {excess:.3e}")
    msg = f"fp64 {err:.2e} (sdpa {err_sdpa:.2e}), same-boundary {err_sb:.2e}"
    if case.lse:
        if torch.isnan(lse).any():
            problems.append("NaN left in the LSE")
        lse_excess = compare_lse(lse, lse64, sb.score_abs)
        if not lse_excess <= 0:
            problems.append(f"LSE exceeds its tolerance by {lse_excess:.3e}")
        msg += f", lse excess {lse_excess:.1e}"
    if case.layout.startswith("poison"):
        same = run_kernel(replace(case, layout="contiguous"), *(t.contiguous() for t in (q, k, v)), mask)
        if not torch.equal(same[0], out):
            problems.append("output differs from the same inputs laid out contiguously")
    return not problems, "; ".join(problems) or msg


def check_future(case: Case, device="cuda"):
    """Causal: perturbing K and V after position t leaves the outputs (and LSE) of queries <= t unchanged."""
    import torch
    q, k, v, _ = make_inputs(case, device)
    out, lse = run_kernel(case, q, k, v, None)
    gen = torch.Generator(device="cpu").manual_seed(7)
    n = case.n_q
    for t in sorted({0, 1, case.block_n - 1, case.block_n, n // 2, n - 2}):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, t + 1:] = (torch.randn(k2[:, :, t + 1:].shape, generator=gen) * 3).to(k.dtype).to(device)
        v2[:, :, t + 1:] = (torch.randn(v2[:, :, t + 1:].shape, generator=gen) * 3).to(v.dtype).to(device)
        out2, lse2 = run_kernel(case, q, k2, v2, None)
        if not torch.equal(out[:, :, :t + 1], out2[:, :, :t + 1]):
            return False, f"perturbing keys > {t} changed outputs of queries <= {t}"
        if lse is not None and not torch.equal(lse[:, :, :t + 1], lse2[:, :, :t + 1]):
            return False, f"perturbing keys > {t} changed the LSE of queries <= {t}"
        if torch.equal(out2, out):
            return False, f"perturbing keys > {t} changed nothing at all (the test did not test)"
    return True, "outputs of earlier queries bit-for-bit unchanged"


def seed_example_inputs(D, dtype, block_n, two_tiles, device="cuda"):
    """q, k, v, mask, scale whose scaled logits are [0, 0] then [log 2] and values [1, 3] then [10].

    q = e0 and the keys are 0, 0, e0 with scale = log 2, so q.k * scale = [0, 0, log 2]. With
    ``two_tiles`` the third key sits at index block_n (the next tile), and a mask hides the keys
    in between: the first tile's maximum 0 grows to log 2 in the second, as in the seed.
    """
    import torch
    dt = _dtype(dtype)
    n_k = block_n + 1 if two_tiles else 3
    last = n_k - 1
    q = torch.zeros(1, 1, 3 if not two_tiles else 1, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, n_k, D)
    k[0, 0, last, 0] = 1.0
    v = torch.zeros(1, 1, n_k, D)
    v[0, 0, 0], v[0, 0, 1], v[0, 0, last] = 1.0, 3.0, 10.0
    mask = None
    if two_tiles:
        mask = torch.zeros(1, n_k, dtype=torch.bool)
        mask[0, [0, 1, last]] = True
        mask = mask.to(device)
    return q.to(dt).to(device), k.to(dt).to(device), v.to(dt).to(device), mask, math.log(2.0)


def check_seed(case: Case, device="cuda"):
    """The seed's worked example through the kernel: every output is 6 (7 would mean a was not rescaled)."""
    q, k, v, mask, scale = seed_example_inputs(case.D, case.dtype, case.block_n, "two_tiles" in case.extra, device)
    out, _ = run_kernel(case, q, k, v, mask, scale=scale)
    worst = (out.double() - 6.0).abs().max().item()
    return worst <= 1e-2, f"outputs {out.double().min().item():.4f}..{out.double().max().item():.4f} (expected 6)"


CHECKS = {"numerics": check_numerics, "future": check_future, "seed": check_seed}


def run_case(case: Case, device="cuda"):
    """(ok, message) for one case; an exception counts as a failure with its text."""
    try:
        return CHECKS[case.kind](case, device)
    except Exception as e:  # noqa: BLE001 - a checker reports, it does not stop at the first failure
        return False, f"{type(e).__name__}: {str(e)[:500]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tylopy check streaming_attention", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N <= 2048 and a subset of the N sweep")
    ap.add_argument("-k", dest="pattern", default="", help="only cases whose name contains this text")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    args = ap.parse_args(argv)
    cases = [c for c in (QUICK if args.quick else CASES) if args.pattern in c.name]
    if args.list:
        print("\n".join(c.name for c in cases))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("check streaming_attention needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    passed = failed = 0
    t_all = time.time()
    for case in cases:
        t0 = time.time()
        ok, msg = run_case(case)
        passed, failed = passed + ok, failed + (not ok)
        print(f"{'PASS' if ok else 'FAIL'} {case.name}: {msg} ({time.time() - t0:.2f}s)", flush=True)
    print(f"{passed} passed, {failed} failed ({time.time() - t_all:.0f}s, {torch.cuda.get_device_name()})")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
