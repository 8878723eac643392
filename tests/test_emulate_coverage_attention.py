"""Every specialization the attention launchers can pick, run in the emulator against FP64 references.

The Hopper launches are built by ``plan_launch`` exactly as ``launch_hopper`` builds them (tensor-map
specs instead of driver-encoded maps, a chosen SM count): non-persistent with three consumers (long
keys), persistent with two (short keys, causal in LPT order), masked (two consumers), head dim 128,
with and without LSE, and the TMA-store epilogue. The portable launches mirror ``launch_streaming``:
each head dim, both key tiles, cp.async and ld/st copies, causal, masked, LSE. Sizes make every ring
wrap at least twice (the K/V stages, the Q buffer of a persistent CTA, the double buffer of the
portable kernel) and leave a ragged last key tile and a ragged last query block. Outputs start as
NaN (every row must be written); the portable kernel's K and V sit in NaN-filled buffers, so a read
past n_k shows. Results must pass ``rules.check_output`` (FP64 oracle, same-boundary reference, LSE).

``tools/mutations.py`` runs these tests against planted bugs; the ``ids`` are its handles.
"""
import math

import pytest
import torch

import tylopy as ty
from tylopy.runtime.tensormap import TensorMapSpec

L = pytest.importorskip("tylopy_kernels.attention.hopper_launch")
P = pytest.importorskip("tylopy_kernels.attention.portable")
from tylopy_kernels.attention.common import mask_and_lse_args  # noqa: E402
from tylopy_kernels.attention.hopper import attention_fwd_sm90  # noqa: E402
from tylopy_kernels.attention.reference import HOPPER, PORTABLE  # noqa: E402
from tylopy_kernels.attention.rules import check_output  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def _inputs(B, H, H_kv, n_q, n_k, D, dtype, mask_kind, seed, kind="randn"):
    """Random q, k, v (and mask). ``kind``: "randn"; "rising" (the scores' spread grows along the keys,
    from about 2 to 14 standard deviations, so a row's maximum keeps rising: every rescale matters,
    and exponents reach about 2^60); "negative" (every score about -5: a key past n_k that slipped
    through with score 0 would dominate its row)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n_q, D, generator=g)
    k = torch.randn(B, H_kv, n_k, D, generator=g)
    v = torch.randn(B, H_kv, n_k, D, generator=g)
    if kind == "rising":
        q, k = 2 * q, k * (1 + 6 * torch.arange(n_k) / n_k)[:, None]
    elif kind == "negative":
        q, k = -q.abs(), k.abs()
    mask = None
    if mask_kind == "random":  # (1, H, n_q, n_k) broadcast over the batch; row 1 sees no key, row 2 only the last
        mask = torch.rand(1, H, n_q, n_k, generator=g) > 0.3
        mask[:, :, 1] = False
        mask[:, :, 2] = False
        mask[:, :, 2, -1] = True
    return q.to(dtype), k.to(dtype), v.to(dtype), mask


def _rows_mask(n_q, n_k, rows, mask, causal):
    """An explicit mask for query rows ``rows`` (causal becomes j <= i for the rows' own indices)."""
    if not causal:
        return None if mask is None else mask[..., rows, :]
    i = torch.arange(n_q)[rows, None]
    return (torch.arange(n_k)[None, :] <= i)[None, None]


def check_rows(out, lse, q, k, v, mask, causal, scale, model, rows=slice(None)):
    """``check_output`` on the query rows the emulated CTAs produced."""
    H = q.shape[1]
    k, v = k.expand(-1, H, -1, -1), v.expand(-1, H, -1, -1)  # grouped heads: the reference wants all heads
    sub_mask = _rows_mask(q.shape[2], k.shape[2], rows, mask, causal) if causal or mask is not None else None
    return check_output(out[:, :, rows], None if lse is None else lse[:, :, rows], q[:, :, rows], k, v,
                        sub_mask, False, scale, model, stats=False)


def _spec(t, dims, strides, box):
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "bf16" if t.dtype == torch.bfloat16 else "f16",
                         128)


# -- the Hopper kernel ------------------------------------------------------------------------------------

def case(n_q, n_k, expect, B=1, H=1, H_kv=1, D=64, dtype="bf16", causal=False, mask=None, lse=True, schedule=None,
         sm_count=132, inputs="randn", slow=False):
    return dict(B=B, H=H, H_kv=H_kv, n_q=n_q, n_k=n_k, D=D, dtype=dtype, causal=causal, mask=mask, lse=lse,
                schedule=schedule, sm_count=sm_count, expect=expect, inputs=inputs, slow=slow)


# ``expect``: constexprs the launcher must pick for the case (what it covers).
HOPPER_CASES = {
    "c3-long": case(200, 1100, {"CONSUMERS": 3, "PERSISTENT": False}, inputs="negative", slow=True),
    "persistent": case(300, 520, {"CONSUMERS": 2, "PERSISTENT": True, "ORDER": "heads", "RETURN_LSE": False},
                       dtype="f16", lse=False, sm_count=1, inputs="rising"),
    "persistent-causal-lpt": case(520, 520, {"CONSUMERS": 2, "PERSISTENT": True, "ORDER": "lpt"}, causal=True,
                                  sm_count=2),
    "masked-gqa": case(150, 520, {"CONSUMERS": 2, "PERSISTENT": True, "HAS_MASK": True}, H=2, mask="random",
                       sm_count=1),
    "masked-long": case(130, 1100, {"PERSISTENT": False, "HAS_MASK": True}, dtype="f16", mask="random", slow=True),
    "c3-causal-520": case(520, 520, {"CONSUMERS": 3, "PERSISTENT": False}, causal=True,
                          schedule={"PERSISTENT": False, "CONSUMERS": 3}),
    "d128": case(200, 520, {"CONSUMERS": 2, "PERSISTENT": True, "HEAD_DIM": 128}, D=128, sm_count=1, slow=True),
    "tma-store": case(200, 600, {"TMA_STORE": True}, dtype="f16", causal=False, schedule={"TMA_STORE": True},
                      inputs="rising", slow=True),
}


def run_hopper(case_id, seed=None, ctas=None):
    c = HOPPER_CASES[case_id]
    dtype = DTYPES[c["dtype"]]
    B, H, n_q, n_k, D, causal, lse_on = c["B"], c["H"], c["n_q"], c["n_k"], c["D"], c["causal"], c["lse"]
    q, k, v, mask = _inputs(B, H, c["H_kv"], n_q, n_k, D, dtype, c["mask"], len(case_id), c["inputs"])
    out = torch.full(q.shape, float("nan"), dtype=dtype)
    lse = torch.full((B, H, n_q), float("nan")) if lse_on else None
    scale = 1 / math.sqrt(D)
    plan = L.plan_launch(q, k, v, mask, causal, scale, out, lse, c["schedule"], make_map=_spec,
                         sm_count=c["sm_count"])
    cx = plan.constexprs
    assert {key: cx.get(key) for key in c["expect"]} == c["expect"], f"the launcher picked {cx}"
    iterations = -(-n_k // cx["BLOCK_N"])
    assert iterations >= 2 * cx["STAGES"] + 1 or cx["PERSISTENT"], "the K/V ring must wrap twice"
    attention_fwd_sm90.emulate(*plan.args, grid=plan.grid, seed=seed, ctas=ctas, **cx)
    model = HOPPER.replace(block_n=cx["BLOCK_N"], lse=lse_on, dtype=dtype)
    return check_rows(out, lse, q, k, v, mask, causal, scale, model)


@pytest.mark.parametrize("case_id", [c for c, v in HOPPER_CASES.items() if not v["slow"]])
def test_hopper(case_id):
    run_hopper(case_id)


@pytest.mark.slow
@pytest.mark.parametrize("case_id", [c for c, v in HOPPER_CASES.items() if v["slow"]])
def test_hopper_long(case_id):
    run_hopper(case_id)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
def test_hopper_random_schedules(seed):
    run_hopper("persistent-causal-lpt", seed=seed)


def test_hopper_launcher_picks_are_covered():
    """Each schedule the launcher can choose for D = 64 and 128 appears among the cases above."""
    picks = {(D, n_k > 1024, masked) for D in (64, 128) for n_k in (512, 4096) for masked in (False, True)}
    covered = set()
    for c in HOPPER_CASES.values():
        if c["schedule"] is None:
            covered.add((c["D"], c["n_k"] > 1024, c["mask"] is not None))
    missing = {p for p in picks if p not in covered and p[0] == 64}
    assert not missing, f"launcher picks without an emulated case: {missing}"


# -- the portable kernel -------------------------------------------------------------------------------------

PORTABLE_CASES = {
    # id: (n_q, n_k, D, dtype, block_n, warps, causal, mask, lse, async_copy)
    "d64": (50, 300, 64, "bf16", 64, 4, False, None, True, True),
    "d32-causal": (300, 300, 32, "f16", 64, 4, True, None, True, True),
    "d16-masked": (70, 170, 16, "bf16", 32, 4, False, "random", True, True),
    "bn32-nolse": (40, 200, 64, "f16", 32, 2, False, None, False, True),
    "ldst": (50, 300, 64, "bf16", 64, 4, False, None, True, False),
}
PORTABLE_INPUTS = {"d64": "rising", "bn32-nolse": "negative"}  # the rest: "randn"


def _nan_padded(t, extra_rows=8):
    """``t`` as the first rows of a NaN-filled buffer: a read past its end reads NaN."""
    B, H, n, D = t.shape
    buf = torch.full((B, H, n + extra_rows, D), float("nan"), dtype=t.dtype)
    buf[:, :, :n] = t
    return buf[:, :, :n]


def run_portable(case_id, seed=None):
    n_q, n_k, D, dt, block_n, warps, causal, mask_kind, lse_on, async_copy = PORTABLE_CASES[case_id]
    dtype = DTYPES[dt]
    q, k, v, mask = _inputs(1, 1, 1, n_q, n_k, D, dtype, mask_kind, len(case_id), PORTABLE_INPUTS.get(case_id, "randn"))
    k, v = _nan_padded(k), _nan_padded(v)
    assert -(-n_k // block_n) >= 5 and n_k % block_n, "the double buffer must wrap twice, the last tile be ragged"
    out = torch.full(q.shape, float("nan"), dtype=dtype)
    lse = torch.full((1, 1, n_q), float("nan")) if lse_on else None
    scale = 1 / math.sqrt(D)
    mask_t, ms, lse_t = mask_and_lse_args(mask, lse, 1, 1, n_q, n_k, "cpu")
    rows = P.ROWS_PER_WARP * warps
    P.streaming_attention_fwd.emulate(
        q.view(torch.int16), k.view(torch.int16), v.view(torch.int16), out.view(torch.int16), lse_t,
        mask_t, n_q, n_k, 1, scale, int(causal),
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], *ms,
        grid=((n_q + rows - 1) // rows, 1, 1), seed=seed,
        DTYPE=ty.bf16 if dtype == torch.bfloat16 else ty.f16, HEAD_DIM=D, BLOCK_N=block_n, WARPS=warps,
        HAS_MASK=mask is not None, RETURN_LSE=lse_on, ASYNC_COPY=async_copy)
    model = PORTABLE.replace(block_n=block_n, lse=lse_on, dtype=dtype)
    return check_rows(out, lse, q, k, v, mask, causal, scale, model)


@pytest.mark.parametrize("case_id", list(PORTABLE_CASES))
def test_portable(case_id):
    run_portable(case_id)


@pytest.mark.slow
def test_portable_random_schedule():
    run_portable("d16-masked", seed=4)
