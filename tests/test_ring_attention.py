"""Ring attention on the CPU: the ring's schedule and merge in float64 with a reference attention
standing in for the kernels, W = 1..4 ranks simulated by threads (forward and backward against
full-sequence attention and autograd), the zig-zag shards and their per-pair masks, the work
balance, and the torch.distributed ring itself over gloo with two processes. GPU tests:
tests/test_ring_attention_gpu.py (world size 1) and tests/ring_attention_worker.py (torchrun)."""
import math
import os
import threading

import pytest
import torch

from tylopy_kernels.attention.distributed import ring as ra


def attend_reference(q, k, v, causal, scale):
    """(out, lse) in float64; key/value heads repeated for GQA; top-left causal on a square block."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1).double(), v.repeat_interleave(g, 1).double()
    s = torch.einsum("bhid,bhjd->bhij", q.double(), k) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.einsum("bhij,bhjd->bhid", torch.exp(s - lse[..., None]), v), lse


def attend_backward_reference(q, k, v, out, dout, lse, causal, scale):
    """One pair's gradients with the global out and lse (what the attention backward computes)."""
    g = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(g, 1).double(), v.repeat_interleave(g, 1).double()
    s = torch.einsum("bhid,bhjd->bhij", q.double(), kr) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - lse.double()[..., None])
    delta = (dout.double() * out.double()).sum(-1, keepdim=True)
    dp = torch.einsum("bhid,bhjd->bhij", dout.double(), vr)
    ds = p * (dp - delta) * scale
    dq = torch.einsum("bhij,bhjd->bhid", ds, kr)
    dk = torch.einsum("bhij,bhid->bhjd", ds, q.double())
    dv = torch.einsum("bhij,bhid->bhjd", p, dout.double())
    fold = lambda t: t.reshape(t.shape[0], k.shape[1], g, *t.shape[2:]).sum(2)  # noqa: E731
    return dq, fold(dk), fold(dv)


class Hub:
    """Mailboxes shared by simulated ranks: exchange number n of rank r lands in box (r, n)."""

    def __init__(self):
        self.cv = threading.Condition()
        self.box = {}


class SimRing:
    def __init__(self, hub, rank, world):
        self.hub, self.rank, self.world, self.count = hub, rank, world, 0

    def exchange(self, tensors):
        n = self.count
        self.count += 1
        with self.hub.cv:
            self.hub.box[(self.rank, n)] = [t.clone() for t in tensors]
            self.hub.cv.notify_all()
        hub, prev = self.hub, (self.rank - 1) % self.world

        class Pending:
            def wait(self):
                with hub.cv:
                    assert hub.cv.wait_for(lambda: (prev, n) in hub.box, timeout=30), "ring deadlock"
                    return hub.box.pop((prev, n))
        return Pending()


def run_ranks(world, fn):
    hub, results, errors = Hub(), [None] * world, []

    def body(r):
        try:
            results[r] = fn(SimRing(hub, r, world))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def full_reference(q, k, v, causal, scale):
    q, k, v = (t.detach().double().clone().requires_grad_() for t in (q, k, v))
    out, lse = attend_reference(q, k, v, causal, scale)
    return q, k, v, out, lse


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("mode", ["causal-zigzag", "causal-contiguous", "full"])
@pytest.mark.parametrize("gqa", [1, 2])
def test_simulated_ring_equals_full_attention(world, mode, gqa):
    causal, zigzag = mode.startswith("causal"), mode == "causal-zigzag"
    torch.manual_seed(world * 10 + gqa)
    B, H, N, D = 2, 4, 24 * world, 8
    scale = 0.3
    q = torch.randn(B, H, N, D, dtype=torch.float64)
    k = torch.randn(B, H // gqa, N, D, dtype=torch.float64)
    v = torch.randn(B, H // gqa, N, D, dtype=torch.float64)
    dout = torch.randn(B, H, N, D, dtype=torch.float64)
    lb = zigzag and world > 1

    def rank(ring):
        sh = lambda t: ra.shard_sequence(t, ring.rank, world, lb)  # noqa: E731
        steps = ra.RingSteps(ring, causal, scale, lb)
        out, lse = ra.ring_forward(sh(q), sh(k), sh(v), steps, attend_reference)
        grads = ra.ring_backward(sh(q), sh(k), sh(v), out, sh(dout), lse, steps, attend_backward_reference)
        return out, lse, grads
    results = run_ranks(world, rank)
    out = ra.unshard_sequence([r[0] for r in results], lb)
    lse = ra.unshard_sequence([r[1] for r in results], lb)
    rq, rk, rv, ref_out, ref_lse = full_reference(q, k, v, causal, scale)
    assert (out - ref_out).abs().max().item() < 1e-12
    assert (lse - ref_lse).abs().max().item() < 1e-12
    ref_out.backward(dout)
    for i, ref in enumerate((rq.grad, rk.grad, rv.grad)):
        got = ra.unshard_sequence([r[2][i] for r in results], lb)
        assert (got - ref).abs().max().item() < 1e-10, ("dq", "dk", "dv")[i]


def test_zigzag_shards_round_trip_and_hold_the_right_chunks():
    x = torch.arange(16).reshape(1, 1, 16, 1)
    shards = [ra.shard_sequence(x, r, 2, True) for r in range(2)]
    assert shards[0].flatten().tolist() == [0, 1, 2, 3, 12, 13, 14, 15]      # chunks 0 and 3
    assert shards[1].flatten().tolist() == [4, 5, 6, 7, 8, 9, 10, 11]        # chunks 1 and 2
    assert torch.equal(ra.unshard_sequence(shards, True), x)
    assert torch.equal(ra.unshard_sequence([ra.shard_sequence(x, r, 4, False) for r in range(4)], False), x)
    with pytest.raises(ValueError, match="ring_attention: sequence length expects a multiple of 6"):
        ra.shard_sequence(x, 0, 3, True)


def test_zigzag_pairs_and_balance():
    """Rank r against the K/V of rank s: the documented pairs, and every step's score count equal on every rank."""
    n = 8  # two chunks of 4
    assert ra.step_pairs(1, 1, n, True, True) == [(slice(0, 8), slice(0, 8), True)]
    assert ra.step_pairs(1, 0, n, True, True) == [(slice(0, 8), slice(0, 4), False)]    # s < r: early K/V half
    assert ra.step_pairs(0, 1, n, True, True) == [(slice(4, 8), slice(0, 8), False)]    # s > r: late queries
    assert ra.step_pairs(0, 1, n, True, False) == []                                    # contiguous: skipped
    for world in (2, 3, 4, 8):
        for t in range(1, world):
            work = set()
            for r in range(world):
                pairs = ra.step_pairs(r, (r - t) % world, n, True, True)
                work.add(sum((p[0].stop - p[0].start) * (p[1].stop - p[1].start) for p in pairs))
            assert work == {n * n // 2}, (world, t, work)


def test_merge_partial_edges():
    acc_o = torch.zeros(1, 1, 3, 2)
    acc_lse = torch.tensor([[[float("-inf"), 0.5, float("-inf")]]])
    o = torch.tensor([[[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]]])
    lse = torch.tensor([[[1.0, float("-inf"), float("-inf")]]])
    ra.merge_partial(acc_o, acc_lse, o, lse)
    assert acc_o[0, 0, 0].tolist() == [1.0, 2.0] and acc_lse[0, 0, 0].item() == 1.0       # empty row takes o
    assert acc_o[0, 0, 1].tolist() == [0.0, 0.0] and acc_lse[0, 0, 1].item() == 0.5       # -inf partial: no change
    assert acc_o[0, 0, 2].tolist() == [0.0, 0.0] and math.isinf(acc_lse[0, 0, 2].item())  # both empty


@pytest.mark.parametrize("causal", [False, True])
def test_world_size_one_without_a_process_group(causal):
    """No process group: one rank, through tylopy's operators (their float64 reference on the CPU),
    forward and autograd backward against full attention."""
    ring = ra.ring_of(None)
    assert (ring.rank, ring.world) == (0, 1)
    with pytest.raises(ValueError, match="ring_attention: group expects None"):
        ra.ring_of(object())
    torch.manual_seed(11)
    q = torch.randn(2, 4, 12, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 12, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 12, 8, dtype=torch.float64, requires_grad=True)
    out, lse = ra.ring_attention(q, k, v, is_causal=causal, scale=0.4, enable_gqa=True, return_lse=True)
    rq, rk, rv, ref_out, ref_lse = full_reference(q, k, v, causal, 0.4)
    assert (out - ref_out).abs().max().item() < 1e-12 and (lse - ref_lse).abs().max().item() < 1e-12
    dout = torch.randn_like(out)
    out.backward(dout)
    ref_out.backward(dout)
    for got, ref in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        assert (got - ref).abs().max().item() < 1e-12


def test_bad_inputs_are_named():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="ring_attention: key/value local length"):
        ra.ring_attention(q, q[:, :, :4], q[:, :, :4])
    with pytest.raises(ValueError, match="ring_attention: key/value heads expects 2"):
        ra.ring_attention(q, q[:, :1], q[:, :1])
    with pytest.raises(TypeError, match="ring_attention: scale expects a finite float"):
        ra.ring_attention(q, q, q, scale=float("inf"))


def _gloo_worker(rank, world, port, q, k, v, dout, results):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        ring = ra.ring_of(None)
        for causal in (True, False):
            sh = lambda t: ra.shard_sequence(t, rank, world, causal)  # noqa: E731
            steps = ra.RingSteps(ring, causal, 0.25, causal)
            out, lse = ra.ring_forward(sh(q), sh(k), sh(v), steps, attend_reference)
            grads = ra.ring_backward(sh(q), sh(k), sh(v), out, sh(dout), lse, steps, attend_backward_reference)
            results[(rank, causal)] = (out, lse, grads)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_torch_distributed_ring_over_gloo():
    """The TorchRing exchanges (functional all_to_all_single shifts between neighbours) in two real processes, causal
    (zig-zag shards) and not."""
    mp = torch.multiprocessing.get_context("spawn")
    world, port = 2, 29500 + (os.getpid() % 2000)
    torch.manual_seed(5)
    q, k, v, dout = (torch.randn(1, 2, 16, 8, dtype=torch.float64) for _ in range(4))
    with mp.Manager() as manager:
        results = manager.dict()
        procs = [mp.Process(target=_gloo_worker, args=(r, world, port, q, k, v, dout, results)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        res = dict(results)
    for causal in (True, False):
        ranks = [res[(r, causal)] for r in range(world)]
        out = ra.unshard_sequence([r[0] for r in ranks], causal)
        rq, rk, rv, ref_out, _ = full_reference(q, k, v, causal, 0.25)
        assert (out - ref_out).abs().max().item() < 1e-12
        ref_out.backward(dout)
        for i, ref in enumerate((rq.grad, rk.grad, rv.grad)):
            got = ra.unshard_sequence([r[2][i] for r in ranks], causal)
            assert (got - ref).abs().max().item() < 1e-10
