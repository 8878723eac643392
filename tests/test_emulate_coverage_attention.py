"""Every specialization the attention launchers can pick, run in the emulator against FP64 references.

The Hopper launches are built by ``plan_launch`` exactly as ``launch_hopper`` builds them (tensor-map
specs instead of driver-encoded maps, a chosen SM count): non-persistent with three consumers (long
keys), persistent with two (short keys, causal in LPT order), masked (two consumers), head dim 128,
with and without LSE, grouped K/V heads, and the TMA-store epilogue. The portable launches are built by
``plan_forward``: each head dim, both key tiles, cp.async and ld/st copies, causal (bottom-right for
rectangular shapes), masked, grouped K/V heads, packed variable-length sequences, LSE. Sizes make every ring
wrap at least twice (the K/V stages, the Q buffer of a persistent CTA, the double buffer of the
portable kernel) and leave a ragged last key tile and a ragged last query block. Outputs start as
NaN (every row must be written); the portable kernel's K and V sit in NaN-filled buffers, so a read
past n_k shows. Results must pass ``rules.check_output`` (FP64 oracle, same-boundary reference, LSE).

``tools/mutations.py`` runs these tests against planted bugs; the ``ids`` are its handles.
"""
import math

import pytest
import torch

from tylopy.runtime.tensormap import TensorMapSpec

L = pytest.importorskip("tylopy_kernels.attention.sm90.launch")
PL = pytest.importorskip("tylopy_kernels.attention.portable.launch")
from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90  # noqa: E402
from tylopy_kernels.attention.testing.reference import HOPPER, PORTABLE  # noqa: E402
from tylopy_kernels.attention.testing.reference import AttentionInputs  # noqa: E402
from tylopy_kernels.attention.testing.rules import check_output  # noqa: E402

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
    inputs = AttentionInputs(q[:, :, rows], k, v, sub_mask, False, scale)
    return check_output(out[:, :, rows], None if lse is None else lse[:, :, rows], inputs, model, stats=False)


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
    "persistent": case(300, 520, {"CONSUMERS": 2, "PERSISTENT": True, "ORDER": "lpt", "TMA_STORE": True,
                                   "RETURN_LSE": False},
                       dtype="f16", lse=False, sm_count=1, inputs="rising"),
    "persistent-causal-lpt": case(520, 520, {"CONSUMERS": 2, "PERSISTENT": True, "ORDER": "lpt"}, causal=True,
                                  sm_count=2),
    "masked-gqa": case(150, 520, {"CONSUMERS": 2, "PERSISTENT": True, "HAS_MASK": True}, H=2, mask="random",
                       sm_count=1),
    "masked-long": case(130, 1100, {"PERSISTENT": False, "HAS_MASK": True}, dtype="f16", mask="random", slow=True),
    "c3-causal-520": case(520, 520, {"CONSUMERS": 3, "PERSISTENT": False}, causal=True,
                          schedule={"PERSISTENT": False, "CONSUMERS": 3}),
    "d128": case(200, 520, {"CONSUMERS": 2, "PERSISTENT": True, "HEAD_DIM": 128}, D=128, sm_count=1, slow=True),
    "d128-long": case(64, 2100, {"PERSISTENT": False, "HEAD_DIM": 128}, D=128, dtype="f16", lse=False, slow=True),
    "d128-masked": case(64, 520, {"PERSISTENT": True, "HEAD_DIM": 128, "HAS_MASK": True}, D=128, mask="random",
                        sm_count=1, slow=True),
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
    plan = L.plan_launch(L.ForwardTensors(q, k, v, out, lse, mask), L.HopperOptions(scale, causal, c["schedule"]),
                         L.MapTarget(_spec, sm_count=c["sm_count"]))
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
    missing = picks - covered - {(128, True, True)}  # D=128, long and masked: the same kernel as d128-long + mask
    assert not missing, f"launcher picks without an emulated case: {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("n", [576, 640])
def test_hopper_causal_lengths_that_once_hung(n):
    """With three consumers the turn barriers have run-time ids; when the emulator merged them, these
    lengths (and 520, the fast case c3-causal-520) reported a deadlock the GPU does not have."""
    HOPPER_CASES[f"c3-causal-{n}"] = dict(HOPPER_CASES["c3-causal-520"], n_q=n, n_k=n)
    try:
        run_hopper(f"c3-causal-{n}")
    finally:
        del HOPPER_CASES[f"c3-causal-{n}"]


# -- the portable kernel -------------------------------------------------------------------------------------

def pcase(n_q, n_k, D=64, dtype="bf16", block_n=64, warps=4, H=1, H_kv=1, causal=False, mask=None, lse=True,
          async_copy=True, inputs="randn", varlen=None, slow=False):
    return dict(n_q=n_q, n_k=n_k, D=D, dtype=dtype, block_n=block_n, warps=warps, H=H, H_kv=H_kv, causal=causal,
                mask=mask, lse=lse, async_copy=async_copy, inputs=inputs, varlen=varlen, slow=slow)


PORTABLE_CASES = {
    "d64": pcase(50, 300, inputs="rising"),
    "d32-causal": pcase(300, 300, D=32, dtype="f16", causal=True),
    "d16-masked": pcase(70, 170, D=16, block_n=32, mask="random"),
    "bn32-nolse": pcase(40, 200, dtype="f16", block_n=32, warps=2, lse=False, inputs="negative"),
    "ldst": pcase(50, 300, async_copy=False),
    "d128-gqa-causal": pcase(100, 330, D=128, H=2, H_kv=1, causal=True, slow=True),  # bottom-right diagonal
    "varlen": pcase(0, 0, H=2, H_kv=1, causal=True, varlen=((40, 330), (70, 300)), slow=True),
}


def _causal_mask(n_q, n_k):
    """The bottom-right causal diagonal as a mask: query i sees keys j <= i + n_k - n_q."""
    return (torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q))[None, None]


def _nan_padded(t, dim=2, extra=8):
    """``t`` as the first rows (along ``dim``) of a NaN-filled buffer: a read past its end reads NaN."""
    shape = list(t.shape)
    shape[dim] += extra
    buf = torch.full(shape, float("nan"), dtype=t.dtype)
    buf.narrow(dim, 0, t.shape[dim]).copy_(t)
    return buf.narrow(dim, 0, t.shape[dim])


def run_portable(case_id, seed=None):
    c = PORTABLE_CASES[case_id]
    if c["varlen"]:
        return run_portable_varlen(case_id, seed)
    n_q, n_k, D, H, block_n = c["n_q"], c["n_k"], c["D"], c["H"], c["block_n"]
    dtype = DTYPES[c["dtype"]]
    q, k, v, mask = _inputs(1, H, c["H_kv"], n_q, n_k, D, dtype, c["mask"], len(case_id), c["inputs"])
    k, v = _nan_padded(k), _nan_padded(v)
    assert -(-n_k // block_n) >= 5 and n_k % block_n, "the double buffer must wrap twice, the last tile be ragged"
    out = torch.full(q.shape, float("nan"), dtype=dtype)
    lse = torch.full((1, H, n_q), float("nan")) if c["lse"] else None
    scale = 1 / math.sqrt(D)
    plan = PL.plan_forward(PL.ForwardTensors(q, k, v, out, lse, mask),
                           PL.ForwardOptions(scale, c["causal"], block_n=block_n, warps=c["warps"],
                                             async_copy=c["async_copy"]))
    plan.run(emulate=True, seed=seed)
    model = PORTABLE.replace(block_n=block_n, lse=c["lse"], dtype=dtype)
    if c["causal"]:
        mask = _causal_mask(n_q, n_k)
    return check_rows(out, lse, q, k, v, mask, False, scale, model)


def run_portable_varlen(case_id, seed=None):
    """Packed sequences: each checked on its own against the references."""
    c = PORTABLE_CASES[case_id]
    D, H, H_kv, dtype = c["D"], c["H"], c["H_kv"], DTYPES[c["dtype"]]
    lens = c["varlen"]
    cu_q = torch.tensor([0] + [sum(a for a, _ in lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(b for _, b in lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(int(cu_q[-1]), H, D, generator=g).to(dtype)
    k = _nan_padded(torch.randn(int(cu_k[-1]), H_kv, D, generator=g).to(dtype), dim=0)
    v = _nan_padded(torch.randn(int(cu_k[-1]), H_kv, D, generator=g).to(dtype), dim=0)
    out = torch.full(q.shape, float("nan"), dtype=dtype)
    lse = torch.full((H, int(cu_q[-1])), float("nan"))
    scale = 1 / math.sqrt(D)
    plan = PL.plan_forward(PL.ForwardTensors(q, k, v, out, lse),
                           PL.ForwardOptions(scale, c["causal"], varlen=(cu_q, cu_k, max(a for a, _ in lens)),
                                             block_n=c["block_n"], warps=c["warps"]))
    assert plan.constexprs["VARLEN"]
    plan.run(emulate=True, seed=seed)
    model = PORTABLE.replace(block_n=c["block_n"], lse=True, dtype=dtype)
    for i, (n_q, n_k) in enumerate(lens):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        seq = [t[r].permute(1, 0, 2)[None] for t, r in ((q, rq), (k, rk), (v, rk), (out, rq))]
        mask = _causal_mask(n_q, n_k) if c["causal"] else None
        check_rows(seq[3], lse[:, rq][None], seq[0], seq[1], seq[2], mask, False, scale, model)


@pytest.mark.parametrize("case_id", [c for c, v in PORTABLE_CASES.items() if not v["slow"]])
def test_portable(case_id):
    run_portable(case_id)


@pytest.mark.slow
@pytest.mark.parametrize("case_id", [c for c, v in PORTABLE_CASES.items() if v["slow"]])
def test_portable_long(case_id):
    run_portable(case_id)


@pytest.mark.slow
def test_portable_random_schedule():
    run_portable("d16-masked", seed=4)
