"""The Hopper attention backward on an H100/H200: gradients, determinism, graphs, schedules.

Every numerics case follows FlashAttention's rule (``backward_reference.gradient_rule``): dQ, dK
and dV each within twice the error of torch's autograd in the input dtype against a float64
oracle, plus 2**-9 of the largest gradient. The forward's output and LSE come from the float64
oracle (rounded to the input dtype and fp32), so the backward is tested on its own; one case
takes them from ``tylopy.attention`` where the forward supports the head dim. Inputs and
outputs are views inside NaN-filled buffers: nothing past an end may be read into a result or
written. Also: dK and dV (and, in deterministic mode, dQ) are bitwise repeatable; a CUDA graph
replays the launches; a side stream works; every schedule of the sweep grid is correct.

    python -m pytest -q -m gpu tests/test_attention_backward_hopper_gpu.py --timeout=300 --timeout-method=thread
"""
import math

import pytest
import torch

from conftest import requires_sm90
from tylopy_kernels.attention.sm90 import backward_launch as L
from tylopy_kernels.attention.testing.backward_reference import attention_grads, gradient_rule

try:
    import pytest_timeout  # noqa: F401
    _TIMEOUT = [pytest.mark.timeout(300)]
except ImportError:  # CPU CI: the marker would be unknown there
    _TIMEOUT = []

pytestmark = [pytest.mark.gpu, pytest.mark.sm90, requires_sm90, *_TIMEOUT]
DEV = "cuda"


def _padded(shape, dtype, bnhd=False, fill=None):
    B, H, N, D = shape
    if bnhd:
        buf = torch.full((B, N + 3, H + 1, D), float("nan"), dtype=dtype, device=DEV)
        view = buf[:, :N, :H].transpose(1, 2)
    else:
        buf = torch.full((B, H, N + 5, D), float("nan"), dtype=dtype, device=DEV)
        view = buf[:, :, :N]
    if fill is not None:
        view.copy_(fill)
    return buf, view


def make_inputs(B, H, H_kv, n_q, n_k, D, dtype, bnhd=False, seed=0, spread=1.0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    shapes = ((B, H, n_q, D), (B, H_kv, n_k, D), (B, H_kv, n_k, D), (B, H, n_q, D))
    return [_padded(s, dtype, bnhd, spread * torch.randn(s, generator=g, device=DEV))[1] for s in shapes]


def run(q, k, v, dout, *, causal=False, mask=None, deterministic=False, schedule=None, scale=None, out=None,
        lse=None, bnhd_grads=False):
    """(grads, bufs, oracle) after one backward; out/lse default to the float64 oracle's."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    oracle = attention_grads(q, k, v, dout, is_causal=causal, scale=scale, attn_mask=mask)
    if out is None:
        out = _padded(q.shape, q.dtype, False, oracle[0])[1]
        lse = oracle[1].float()
    bufs, grads = zip(*(_padded(t.shape, q.dtype, bnhd_grads) for t in (q, k, v)))
    L.launch_backward_hopper(L.BackwardTensors(q, k, v, out, dout, lse, *grads, mask),
                             L.HopperBackwardOptions(scale, causal, deterministic, schedule))
    torch.cuda.synchronize()
    return grads, bufs, oracle


def check(q, k, v, dout, **kw):
    grads, bufs, oracle = run(q, k, v, dout, **kw)
    for buf, g in zip(bufs, grads):
        assert buf.isnan().sum().item() == buf.numel() - g.numel(), "a write outside the gradient view"
        assert torch.isfinite(g).all()
    base = attention_grads(q, k, v, dout, is_causal=kw.get("causal", False), scale=kw.get("scale") or
                           1 / math.sqrt(q.shape[-1]), attn_mask=kw.get("mask"), dtype=q.dtype)[2:]
    for name, got, want, low in zip(("dq", "dk", "dv"), grads, oracle[2:], base):
        ok, msg = gradient_rule(got, want, low)
        assert ok, f"{name}: {msg}"
    return grads


SHAPES = [  # (B, H, H_kv, n_q, n_k, D, causal)
    (2, 4, 4, 256, 256, 64, False),
    (2, 4, 4, 256, 256, 64, True),
    (1, 2, 2, 1000, 1000, 128, True),
    (1, 2, 2, 333, 777, 64, False),
    (1, 2, 2, 777, 333, 128, False),
    (3, 8, 2, 200, 300, 128, False),
    (2, 6, 1, 513, 513, 64, True),
    (1, 1, 1, 1, 1, 64, False),
    (1, 1, 1, 17, 129, 128, False),
    (4, 16, 16, 2048, 2048, 128, True),
    (1, 4, 4, 4096, 4096, 64, False),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s[:6])) + ("-causal" if s[6] else "")
                                                for s in SHAPES])
def test_gradients_match_float64(shape, dtype):
    B, H, H_kv, n_q, n_k, D, causal = shape
    check(*make_inputs(B, H, H_kv, n_q, n_k, D, dtype), causal=causal)


@pytest.mark.parametrize("D", [64, 128])
def test_deterministic_mode(D):
    args = make_inputs(2, 4, 2, 300, 500, D, torch.bfloat16, seed=3)
    first = check(*args, deterministic=True)
    for _ in range(3):
        again, _, _ = run(*args, deterministic=True)
        for a, b in zip(first, again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("D", [64, 128])
def test_dk_dv_are_bitwise_repeatable(D):
    args = make_inputs(2, 4, 4, 1024, 1024, D, torch.bfloat16, seed=4)
    first, _, _ = run(*args, causal=True)
    for _ in range(5):
        again, _, _ = run(*args, causal=True)
        for a, b in zip(first[1:], again[1:]):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("broadcast", [True, False], ids=["mask-1x1xNxN", "mask-BxHxNxN"])
@pytest.mark.parametrize("D,deterministic", [(64, False), (128, False), (64, True), (128, True)])
def test_boolean_masks(D, deterministic, broadcast):
    B, H, n_q, n_k = 2, 3, 300, 500
    g = torch.Generator(device=DEV).manual_seed(5)
    mask = torch.rand((1, 1, n_q, n_k) if broadcast else (B, H, n_q, n_k), generator=g, device=DEV) > 0.3
    mask[..., 7, :] = False                               # a query row with no key left
    mask[..., :, 11] = False                              # a key nobody attends to
    check(*make_inputs(B, H, H, n_q, n_k, D, torch.bfloat16, seed=6), mask=mask, deterministic=deterministic)


@pytest.mark.parametrize("D", [64, 128])
def test_bnhd_views(D):
    args = make_inputs(2, 4, 2, 300, 300, D, torch.float16, bnhd=True, seed=8)
    check(*args, causal=True, bnhd_grads=True)


@pytest.mark.parametrize("D", [64, 128])
def test_large_scores(D):
    """Scores of a few hundred (scale c |q||k| large): P saturates to one-hot rows."""
    check(*make_inputs(1, 2, 2, 256, 256, D, torch.bfloat16, seed=9, spread=4.0))


def test_with_the_forwards_output_and_lse():
    import tylopy
    q, k, v, dout = make_inputs(2, 4, 4, 500, 500, 64, torch.bfloat16, seed=10)
    out, lse = tylopy.attention(q, k, v, is_causal=True, return_lse=True)
    check(q, k, v, dout, causal=True, out=out, lse=lse)


SWEEP_CASES = [(D, s) for D in L.HEAD_DIMS for s in L.SWEEP[D]] + [(D, s) for D in L.HEAD_DIMS for s in L.DQ_SWEEP[D]]


@pytest.mark.parametrize("D,sched", SWEEP_CASES, ids=[f"d{d}-" + "-".join(map(str, s.values())) for d, s in SWEEP_CASES])
def test_every_sweep_schedule(D, sched):
    det = "DQ_BLOCK_N" in sched
    check(*make_inputs(2, 2, 2, 700, 600, D, torch.bfloat16, seed=11), causal=False, deterministic=det, schedule=sched)


@pytest.mark.parametrize("D", [64, 128])
def test_key_value_expanded_over_heads(D):
    """MQA through ``expand`` (stride 0 over heads): head 0 of dk/dv holds the sum, the others 0."""
    q, k1, v1, dout = make_inputs(2, 8, 1, 600, 700, D, torch.bfloat16, seed=14)
    k, v = k1.expand(2, 8, 700, D), v1.expand(2, 8, 700, D)
    oracle = attention_grads(q, k1, v1, dout, is_causal=False)
    out, lse = oracle[0].to(q.dtype), oracle[1].float()
    grads = [torch.full(t.shape, float("nan"), dtype=t.dtype, device=DEV) for t in (q, k, v)]
    L.launch_backward_hopper(L.BackwardTensors(q, k, v, out, dout, lse, *grads), L.HopperBackwardOptions(1 / math.sqrt(D)))
    base = attention_grads(q, k1, v1, dout, dtype=q.dtype)[2:]
    for got, want, low in zip((grads[0], grads[1][:, :1], grads[2][:, :1]), oracle[2:], base):
        ok, msg = gradient_rule(got, want, low)
        assert ok, msg
    assert (grads[1][:, 1:] == 0).all() and (grads[2][:, 1:] == 0).all()


def test_cuda_graph_replay():
    q, k, v, dout = make_inputs(2, 4, 4, 512, 512, 128, torch.bfloat16, seed=12)
    oracle = attention_grads(q, k, v, dout, is_causal=True)
    out, lse = oracle[0].to(q.dtype), oracle[1].float()
    grads = [torch.empty_like(t) for t in (q, k, v)]
    tensors, options = L.BackwardTensors(q, k, v, out, dout, lse, *grads), L.HopperBackwardOptions(1 / math.sqrt(128), True)
    L.launch_backward_hopper(tensors, options)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        L.launch_backward_hopper(tensors, options)
    for g in grads:
        g.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    base = attention_grads(q, k, v, dout, is_causal=True, dtype=q.dtype)[2:]
    for got, want, low in zip(grads, oracle[2:], base):
        ok, msg = gradient_rule(got, want, low)
        assert ok, msg


def test_side_stream():
    args = make_inputs(1, 2, 2, 400, 400, 64, torch.bfloat16, seed=13)
    want, _, _ = run(*args, deterministic=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got, _, _ = run(*args, deterministic=True)
    side.synchronize()
    for a, b in zip(want, got):
        assert torch.equal(a, b)
