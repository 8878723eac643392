"""Pass rules for attention outputs, one function for both kernels: ``check_output`` applies them to
a launch's output (and LSE), parameterized by the launch's ``KernelModel`` (``reference.py``):

    check_output(out, lse, AttentionInputs(q, k, v, mask, causal, scale), model, stats=True)

For finite inputs:

1. Nothing is NaN or inf; rows with no key are exactly 0 with LSE exactly -inf.
2. Oracle: max|out - oracle| <= 2 max|torch - oracle| + floor. ``model.oracle_rule`` picks torch
   and the floor:
   * "math": SDPA's math backend on the same-dtype inputs (it computes in float32 and rounds once,
     so its error is about one output rounding; where it overflows, one output rounding is used).
     The kernel also rounds P, hence the factor 2; the floor FLOOR_REL max|v| (about 1e-3 for
     unit-scale values) covers cases where torch happens to be exact (one key, uniform rows).
   * "sdpa": SDPA's default backend (on a GPU a fused kernel that rounds P as the kernel does);
     floor = ORACLE_FLOOR[dtype] max(1, max|oracle|), a fraction of an output ulp at |out| ~ 1.
3. Same boundary, elementwise, with a tolerance that follows the reference's exponent form:
   * "exact": |out - sb| <= u_out |sb| + max|v| (u_in + 4 eta + (n_k + 64) 2^-23). u_out |sb| is
     the final rounding. u_in max|v| bounds one "flip": float32 noise pushing one p across a
     rounding midpoint changes it by one ulp (<= 2 u_in p), which moves the output by at most
     2 u_in w (1 - w) 2 max|v| <= u_in max|v| (w = p / l). eta (``reference.score_noise``) bounds
     the float32 score error as a relative error of p; the last term covers float32 accumulation
     over n_k keys.
   * "fast": per row, |out - sb| <= u_out |sb| + 1e-7 + SAME_BOUNDARY_RTOL magnitude + ambiguous
     + 2 score_rel magnitude (the reference's per-row terms): SAME_BOUNDARY_RTOL = 3e-5 of the
     row's magnitude sum|p||v|/l covers ex2.approx (2^-22), the tensor cores' summation order and
     float32 accumulation over ~8k keys; ``ambiguous`` lets a p near a rounding boundary round the
     other way; score_rel is the float32 score error unless Q and K are exact integers.
4. Same boundary, statistically (``stats``; meant for the exact form where score noise is small
   next to P's rounding, i.e. not for huge logits): the fraction of outputs that differ from
   round(sb) must stay below STATS_SLOPE x the fraction that differ from round(oracle) +
   STATS_FLOOR, over at least STATS_MIN_ROWS rows (one flip moves a whole row of outputs, so fewer
   rows make the fraction noisy). A kernel that rounds P elsewhere, or on other tile boundaries,
   differs from round(sb) in 15-40% of its outputs; a correct one in under 5% (float32 noise
   crossing an output midpoint: at most 4.2% over the Hopper cases for a float32 model of the
   kernel with round-toward-zero tensor-core accumulation and ex2.approx-sized noise, against
   thresholds of 12-15%). ``float32_model.py`` is such a model; tests/test_attention_hopper.py
   checks that the rules accept it and reject it with one step of the algorithm changed.
5. LSE against the oracle's, on rows with keys:
   * "exact": |lse - oracle| <= 2^-21 (|lse| + |m|) + 2 eta + (n_k + 64) 2^-23 + 1e-5 (m the row
     max of the scaled scores: the kernel's m scale and its rounded m log2(e) scale each cost
     ~2^-24 of it).
   * "fast": |lse - oracle| <= LSE_RTOL (1 + |lse|) + the score bound times scale.
"""
from __future__ import annotations

import math

import torch

from tylopy_kernels.attention.testing.reference import (NEG_INF, UNIT_ROUNDOFF, AttentionInputs, KernelModel,
                                                       empty_rows, fp32_score_bound, oracle, resolve_scale,
                                                       same_boundary, score_noise)

FLOOR_REL = 2.0 ** -10
ORACLE_FLOOR = {torch.bfloat16: 1e-3, torch.float16: 2e-4}
SAME_BOUNDARY_RTOL = 3e-5
LSE_RTOL = 4e-6
STATS_SLOPE, STATS_FLOOR, STATS_MIN_ROWS = 0.25, 0.05, 256


def torch_same_dtype(q, k, v, mask=None, causal=False, scale=None) -> torch.Tensor:
    """SDPA's math backend on the same-dtype inputs; rows with no key are set to 0 (some torch
    versions return NaN there)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                               scale=resolve_scale(scale, q.shape[-1]))
    return out.masked_fill(empty_rows(q, k, mask, causal)[..., None], 0)


def _maxabs(x: torch.Tensor) -> float:
    return float(x.abs().max()) if x.numel() else 0.0


def _mismatch(out, ref64, keep) -> float:
    if not bool(keep.any()):
        return 0.0
    differ = (out != ref64.to(torch.float32).to(out.dtype))[keep]
    return float(differ.double().mean())


def check_output(out, lse, inputs: AttentionInputs, model: KernelModel = None, stats=True) -> str:
    """Apply the rules of the module docstring to one launch of ``inputs`` described by ``model``;
    returns a one-line summary or raises AssertionError with it."""
    if not isinstance(inputs, AttentionInputs):
        raise TypeError(f"check_output expects inputs=AttentionInputs(q, k, v, ...), but got {type(inputs).__name__}")
    if model is None:
        raise TypeError("check_output expects model=KernelModel(...), but got None")
    q, k, v, mask, causal, scale = inputs
    problems = []
    dtype = q.dtype
    empty = empty_rows(q, k, mask, causal)
    ref = oracle(q, k, v, mask, causal, scale)
    if out.shape != ref.out.shape or out.dtype != dtype:
        raise AssertionError(f"output is {tuple(out.shape)} {out.dtype}, expected {tuple(ref.out.shape)} {dtype}")
    if not bool(torch.isfinite(out).all()):
        problems.append(f"{int((~torch.isfinite(out)).sum())} outputs are NaN/inf")
    if bool(empty.any()) and not bool((out[empty] == 0).all()):
        problems.append("rows with no key are not all zeros")
    summary = _oracle_rule(out, ref, inputs, model, problems)
    if k.shape[2]:
        summary += "; " + _same_boundary_rule(out, ref, inputs, model, stats, empty, problems)
    if model.lse and lse is None:
        problems.append("the launch returned no LSE")
    if lse is not None:
        summary += "; " + _lse_rule(lse, ref, q, k, scale, model, empty, problems)
    if problems:
        raise AssertionError("; ".join(problems) + f" [{summary}]")
    return summary


def _oracle_rule(out, ref, inputs: AttentionInputs, model, problems) -> str:
    q, k, v, mask, causal, scale = inputs
    err = _maxabs(torch.nan_to_num(out.double() - ref.out, nan=math.inf))
    if model.oracle_rule == "math":
        vmax = _maxabs(v)
        ref_torch = torch_same_dtype(q, k, v, mask, causal, scale).double() if k.shape[2] else ref.out
        err_t = _maxabs(ref_torch - ref.out)
        if not math.isfinite(err_t):
            err_t = 2 * UNIT_ROUNDOFF[q.dtype] * vmax  # torch overflowed: judge against one output rounding instead
        bound = 2 * err_t + FLOOR_REL * vmax
    else:
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                                scale=resolve_scale(scale, q.shape[-1]))
        err_t = (sdpa.double() - ref.out).abs().nan_to_num(0.0).max().item()
        bound = 2 * err_t + ORACLE_FLOOR[q.dtype] * max(1.0, ref.out.abs().max().item())
    if not err <= bound:
        problems.append(f"oracle error {err:.3e} > 2 x torch {err_t:.3e} + floor")
    return f"err {err:.2e} (torch {err_t:.2e}, bound {bound:.2e})"


def _same_boundary_rule(out, ref, inputs: AttentionInputs, model, stats, empty, problems) -> str:
    q, k, v, mask, causal, scale = inputs
    o = out.double()
    u_out = UNIT_ROUNDOFF[out.dtype]
    sb = same_boundary(q, k, v, mask, causal, scale, model)
    if model.exponent == "exact":
        eta = score_noise(q, k, scale)
        u_in = UNIT_ROUNDOFF[q.dtype]
        tol = u_out * sb.out.abs() + _maxabs(v) * (u_in + 4 * eta + (k.shape[2] + 64) * 2.0 ** -23)
    else:
        row_tol = SAME_BOUNDARY_RTOL * sb.magnitude + sb.ambiguous + 2 * sb.score_rel * sb.magnitude
        tol = u_out * sb.out.abs() + 1e-7 + row_tol[..., None]
    excess = float(torch.nan_to_num((o - sb.out).abs() - tol, nan=math.inf).max())
    worst = _maxabs(torch.nan_to_num(o - sb.out, nan=math.inf))
    block_n = model.block_n
    summary = f"same-boundary BLOCK_N={block_n} err {worst:.2e}"
    if excess > 0:
        problems.append(f"same-boundary (BLOCK_N={block_n}) error {worst:.3e} exceeds its bound by {excess:.2e}")
    if stats and int((~empty).sum()) >= STATS_MIN_ROWS:
        keep = ~empty[..., None].expand_as(out)
        mis_sb, mis_64 = _mismatch(out, sb.out, keep), _mismatch(out, ref.out, keep)
        summary += f", differs from round(sb) in {mis_sb:.1%} (round(oracle) {mis_64:.1%})"
        if mis_sb > STATS_SLOPE * mis_64 + STATS_FLOOR:
            problems.append(f"{mis_sb:.1%} of outputs differ from the same-boundary reference rounded "
                            f"(BLOCK_N={block_n}), {mis_64:.1%} from the oracle rounded: P is not rounded "
                            "where the kernel should round it")
    return summary


def _lse_rule(lse, ref, q, k, scale, model, empty, problems) -> str:
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
    if model.exponent == "exact":
        eta = score_noise(q, k, scale).squeeze(-1)[full]
        tol = 2.0 ** -21 * (want.abs() + ref.row_max[full].abs()) + 2 * eta + (k.shape[2] + 64) * 2.0 ** -23 + 1e-5
    else:
        score_abs = fp32_score_bound(q, k) * resolve_scale(scale, q.shape[-1])
        tol = LSE_RTOL * (1 + want.abs()) + score_abs[full]
    diff = (got - want).abs()
    if bool((diff > tol).any()):
        problems.append(f"LSE error {float(diff.max()):.3e} exceeds its bound")
    return f"lse err {float(diff.max()):.2e}"
