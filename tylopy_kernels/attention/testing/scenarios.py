"""Running attention cases (``cases.py``) on a kernel: numerics through the pass rules (``rules.py``)
with the launch's ``KernelModel``, and the behaviour checks beyond numerics. Shared by both
kernels' GPU tests, their CPU tests (against ``float32_model.py`` or the emulator) and ``tylopy
check`` (``check.py``).

* The Hopper kernel: ``run_case`` calls an ``attention``-like function (``tylopy.attention``, or the
  float32 model) and judges it with the BLOCK_N the launcher actually chose: ``recorded_launches``
  records the Hopper kernel's launch, which also proves the Hopper kernel ran.
* The portable kernel: ``run_portable_case`` runs one case of the portable suite (its numerics,
  causal future perturbation, or the worked example) with the case's BLOCK_N and warp count.
* Behaviour checks, for any ``attention``-like function: NaN padding past N and D changes no bit;
  a launcher writes every element of a strided output view and nothing around it; causal outputs
  ignore future keys bit for bit; repeated runs are bit-identical; (B, N, H, D) memory works;
  empty inputs; a CUDA graph; a side stream.

Everything imports no GPU code at import time; functions that launch take the launcher
(``attention`` or ``launch``) as an argument, or import it when called.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Callable

import torch

import tylopy as ty

from tylopy_kernels.attention.testing.cases import Case, make_inputs, worked_example_inputs
from tylopy_kernels.attention.testing.reference import HOPPER, NEG_INF, PORTABLE, AttentionInputs
from tylopy_kernels.attention.testing.rules import check_output

HEAD_DIM = 64


def _call(attention, q, k, v, mask, case: Case):
    return attention(q, k, v, attn_mask=mask, is_causal=case.causal, scale=case.scale, return_lse=case.lse)


def _equal(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_equal(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and bool(torch.equal(a.view(torch.int16) if a.element_size() == 2 else a,
                                                   b.view(torch.int16) if b.element_size() == 2 else b))


# -- the Hopper kernel -----------------------------------------------------------------------------

@contextmanager
def recorded_launches():
    """Record the compile-time parameters (and the grid) of every launch of the Hopper forward made
    inside, through ``ty.observe`` (so launches of a kept plan count too): a list of dicts such as
    {"BLOCK_N": 128, ..., "grid": (132, 1, 1)}, filled as the block runs."""
    seen: list[dict] = []
    with ty.observe() as events:
        try:
            yield seen
        finally:
            seen.extend(dict(e.constexprs, grid=e.grid) for e in events
                        if e.kind == "launch" and e.kernel == "attention_fwd_sm90")


def attend(attention, q, k, v, mask, case: Case, block_n: int | None = None):
    """(result, launch): call ``attention`` on a case's tensors. With ``block_n`` None it must
    launch the Hopper kernel, and ``launch`` holds that launch's constexprs (BLOCK_N,
    RESCALE_THRESHOLD, POLY_EXP2, ...); with a given block_n (a model) it is {"BLOCK_N": block_n}:
    eager rescaling, no polynomial."""
    if block_n is not None:
        return _call(attention, q, k, v, mask, case), {"BLOCK_N": block_n}
    with recorded_launches() as seen:
        res = _call(attention, q, k, v, mask, case)
    if not seen:
        raise AssertionError("the Hopper kernel did not run (no launch of attention_fwd_sm90)")
    return res, seen[-1]


def hopper_model(case: Case, launch: dict):
    """The Hopper kernel's model for one launch of ``case`` with the constexprs ``launch``: its
    BLOCK_N, lazy-rescale threshold and polynomial share (with the dtype's coefficients)."""
    from tylopy_kernels.attention.sm90.softmax import POLY_COEFFS, POLY_DEGREE  # the kernel's numbers (imports tylopy)
    poly = int(launch.get("POLY_EXP2") or 0)
    coeffs = POLY_COEFFS[POLY_DEGREE["bf16" if case.torch_dtype == torch.bfloat16 else "f16"]] if poly else ()
    return HOPPER.replace(block_n=int(launch["BLOCK_N"]), lse=case.lse, dtype=case.torch_dtype,
                          rescale_threshold=launch.get("RESCALE_THRESHOLD"), poly_exp2=poly, poly_coeffs=coeffs)


def run_case(case: Case, attention: Callable, device="cuda", block_n: int | None = None) -> str:
    """Run ``attention`` on a case and apply ``check_output`` with the Hopper kernel's model."""
    q, k, v, mask = make_inputs(case, device)
    res, launch = attend(attention, q, k, v, mask, case, block_n)
    out, lse = res if case.lse else (res, None)
    inputs = AttentionInputs(q, k, v, mask, case.causal, case.scale)
    return check_output(out, lse, inputs, hopper_model(case, launch), stats=case.stats)


# -- the portable kernel ---------------------------------------------------------------------------

def run_portable(case: Case, q, k, v, mask, scale=None):
    """The portable kernel's (out, lse) into NaN-poisoned buffers; lse is None without ``case.lse``."""
    from tylopy_kernels.attention.portable.launch import streaming_attention
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    res = streaming_attention(q, k, v, attn_mask=mask, is_causal=case.causal, scale=scale or case.resolved_scale,
                              return_lse=case.lse, block_n=case.block_n, warps=case.warps, out=out)
    return res if case.lse else (res, None)


def portable_attention(case: Case):
    """An ``attention``-like function running the portable kernel with the case's tile and warps."""
    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, return_lse=False):
        out, lse = run_portable(replace(case, causal=is_causal, lse=return_lse), q, k, v, attn_mask, scale)
        return (out, lse) if return_lse else out
    return attention


def portable_model(case: Case):
    return PORTABLE.replace(block_n=case.block_n, lse=case.lse, dtype=case.torch_dtype)


def check_portable_numerics(case: Case, device="cuda") -> str:
    """The pass rules with the portable kernel's model; a poisoned layout must give the bits of the
    same inputs laid out contiguously."""
    q, k, v, mask = make_inputs(case, device)
    out, lse = run_portable(case, q, k, v, mask)
    inputs = AttentionInputs(q, k, v, mask, case.causal, case.resolved_scale)
    msg = check_output(out, lse, inputs, portable_model(case), stats=False)
    if case.layout.startswith("poison"):
        same = run_portable(replace(case, layout="contiguous"), *(t.contiguous() for t in (q, k, v)), mask)
        if not torch.equal(same[0], out):
            raise AssertionError("output differs from the same inputs laid out contiguously")
    return msg


def check_portable_future(case: Case, device="cuda") -> str:
    n, bn = case.n_q, case.block_n
    cuts = sorted({0, 1, bn - 1, bn, n // 2, n - 2})
    return check_future_perturbation(case, portable_attention(case), cuts, device, magnitude=3.0, seed=7)


def check_worked_example(case: Case, device="cuda") -> str:
    """The worked example through the kernel: every output is 6 (7 would mean a was not rescaled)."""
    q, k, v, mask, scale = worked_example_inputs(case.head_dim, case.dtype, case.block_n, "two_tiles" in case.extra,
                                               device)
    out, _ = run_portable(case, q, k, v, mask, scale=scale)
    worst = (out.double() - 6.0).abs().max().item()
    msg = f"outputs {out.double().min().item():.4f}..{out.double().max().item():.4f} (expected 6)"
    if not worst <= 1e-2:
        raise AssertionError(msg)
    return msg


PORTABLE_CHECKS = {"numerics": check_portable_numerics, "future": check_portable_future, "worked": check_worked_example}


def run_portable_case(case: Case, device="cuda"):
    """(ok, message) for one case of the portable suite; an exception counts as a failure with its text."""
    try:
        return True, PORTABLE_CHECKS[case.kind](case, device)
    except Exception as e:  # noqa: BLE001 - a checker reports, it does not stop at the first failure
        return False, f"{type(e).__name__}: {str(e)[:500]}"


# -- behaviour beyond numerics ----------------------------------------------------------------------

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


def check_future_perturbation(case: Case, attention, cuts, device="cuda", magnitude=100.0, seed=1234) -> str:
    """Causal: changing K and V rows after t (to ``magnitude`` x randn, drawn where the case draws its
    inputs) leaves queries <= t bit-for-bit unchanged, and changes some later output."""
    if not case.causal:
        raise ValueError("check_future_perturbation needs a causal case")
    q, k, v, _ = make_inputs(case, device)
    base = _call(attention, q, k, v, None, case)
    base_out = base[0] if case.lse else base
    g = torch.Generator(device=device if case.draw == "device" else "cpu").manual_seed(seed)

    def noise(t):
        return (torch.randn(t.shape, generator=g, device=g.device) * magnitude).to(t.dtype).to(device)
    for t in cuts:
        k2, v2 = k.clone(), v.clone()
        k2[:, :, t + 1:] = noise(k2[:, :, t + 1:])
        v2[:, :, t + 1:] = noise(v2[:, :, t + 1:])
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
    a different layout from Q still give the right answer (Hopper model; ``block_n`` as in ``attend``)."""
    q, k, v, mask = make_inputs(case, device)
    want = _call(attention, q, k, v, mask, case)

    def bnhd(t):
        return t.transpose(1, 2).contiguous().transpose(1, 2)

    got = _call(attention, bnhd(q), bnhd(k), bnhd(v), mask, case)
    if not _equal(got, want):
        raise AssertionError("(B, N, H, D) memory gave different bits from (B, H, N, D)")
    mixed, launch = attend(attention, q, bnhd(k), bnhd(v), mask, case, block_n)
    out, lse = mixed if case.lse else (mixed, None)
    inputs = AttentionInputs(q, k, v, mask, case.causal, case.scale)
    return "bits equal; mixed layouts: " + check_output(out, lse, inputs,
                                                        hopper_model(case, launch), stats=case.stats)


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
    """``launch(ForwardTensors(q, k, v, out, lse, mask), HopperOptions(scale, causal))`` into views of
    NaN buffers: every output element is written, nothing around it is, and the bits equal a
    contiguous launch's."""
    from tylopy_kernels.attention.common import ForwardTensors
    from tylopy_kernels.attention.sm90.launch import HopperOptions
    q, k, v, mask = make_inputs(case, device)
    B, H, n_q, D = q.shape
    scale = case.resolved_scale
    buf = torch.full((B + 2, H + 1, n_q + 5, D + 32), float("nan"), dtype=q.dtype, device=device)
    before = buf.view(torch.int16).clone()
    region = (slice(1, B + 1), slice(1, H + 1), slice(2, n_q + 2), slice(16, D + 16))
    out = buf[region]
    lse_buf = lse = None
    if case.lse:
        lse_buf = torch.full((B * H * n_q + 64,), float("nan"), device=device)
        lse = lse_buf[32:32 + B * H * n_q].view(B, H, n_q)
    launch(ForwardTensors(q, k, v, out, lse, mask), HopperOptions(scale, case.causal))
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
    launch(ForwardTensors(q, k, v, out2, lse2, mask), HopperOptions(scale, case.causal))
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
