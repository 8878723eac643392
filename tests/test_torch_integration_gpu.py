"""GPU tier of the PyTorch integration (docs/pytorch.md): an exported program run on CUDA in a process
that only imports tylopy; ``matmul`` gradients through ``tylopy::matmul`` and compiled; decode and
matmul under ``torch.compile(fullgraph=True)`` equal to eager; SDPA's autocast rule (eager and
compiled); nested jagged tensors against per-sequence attention; ``tools/explain_entry_points.py``
on CUDA; ring attention compiled over NCCL (two GPUs). References are float64 on fresh random data.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tylopy

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tylopy.__file__)))
sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                          reason="tylopy.matmul runs on Hopper (sm_90) only")


def _python(code, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda").to(dtype)


@sm90
def test_exported_program_runs_on_cuda_after_import_tylopy(tmp_path):
    path = str(tmp_path / "model.pt2")
    export = _python(f"""
        import torch, tylopy
        class Model(torch.nn.Module):
            def forward(self, q, k, v, a, b, k_cache, v_cache, lens):
                o = tylopy.attention(q, k, v, is_causal=True)
                return o, tylopy.matmul(a, b), tylopy.attention_decode(q.transpose(1, 2)[:, -1:].contiguous(),
                                                                        k_cache, v_cache, lens)
        g = torch.Generator(device="cuda").manual_seed(0)
        r = lambda *s: torch.randn(*s, generator=g, device="cuda").bfloat16()
        args = (r(1, 4, 256, 128), r(1, 4, 256, 128), r(1, 4, 256, 128), r(256, 512), r(512, 384), r(1, 1024, 4, 128),
                r(1, 1024, 4, 128), torch.tensor([777], dtype=torch.int32, device="cuda"))
        torch.export.save(torch.export.export(Model(), args), {path!r})
        torch.save(args, {path!r} + ".args")
    """)
    assert export.returncode == 0, export.stderr[-3000:]
    run = _python(f"""
        import math, torch, tylopy
        program = torch.export.load({path!r})
        q, k, v, a, b, kc, vc, lens = torch.load({path!r} + ".args")
        o, c, d = program.module()(q, k, v, a, b, kc, vc, lens)
        ref_o = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        ref_c = a.double() @ b.double()
        s = torch.einsum("bihd,bjhd->bhij", q.transpose(1, 2)[:, -1:].double(), kc[:, :777].double()) / math.sqrt(128)
        ref_d = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), vc[:, :777].double())
        print("ERRS", [(x.double() - y).abs().max().item() / y.abs().max().item() for x, y in
                       ((o, ref_o), (c, ref_c), (d, ref_d))])
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    errs = [float(e) for e in run.stdout.split("ERRS [")[1].split("]")[0].split(",")]
    assert all(e < 2 ** -7 for e in errs), errs  # relative to each output's largest magnitude; bf16 outputs


@sm90
def test_matmul_gradients_eager_and_compiled():
    a = _randn(3, 100, 256, seed=1).requires_grad_()
    w = _randn(192, 256, seed=2).requires_grad_()
    bias = _randn(192, seed=3).requires_grad_()
    dc = _randn(3, 100, 192, seed=4)
    a64, w64, b64 = (t.detach().double().requires_grad_() for t in (a, w, bias))
    (a64 @ w64.t() + b64).backward(dc.double())
    for compiled in (False, True):
        for t in (a, w, bias):
            t.grad = None
        fn = (lambda a, w, b: tylopy.matmul(a, w.t(), b))
        if compiled:
            torch._dynamo.reset()
            fn = torch.compile(fn, fullgraph=True)
        fn(a, w, bias).backward(dc)
        for got, ref in ((a.grad, a64.grad), (w.grad, w64.grad), (bias.grad, b64.grad)):
            assert (got.double() - ref).abs().max().item() <= 2 ** -7 * ref.abs().max().item(), compiled


@sm90
def test_compiled_decode_and_matmul_equal_eager():
    from tylopy_kernels.gemm import epilogues
    q, kc, vc = _randn(4, 2, 8, 128, seed=5), _randn(4, 2048, 2, 128, seed=6), _randn(4, 2048, 2, 128, seed=7)
    kc[:, 1900:] = float("nan")  # past every sequence's end
    lens = torch.tensor([1, 700, 1900, 1024], dtype=torch.int32, device="cuda")
    x, w = _randn(64, 256, seed=8), _randn(256, 512, seed=9)

    def step(q, kc, vc, x, w):
        return (tylopy.attention_decode(q, kc, vc, lens, is_causal=True, return_lse=True),
                tylopy.matmul(x, w, epilogue=epilogues.silu))

    eager = step(q, kc, vc, x, w)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(q, kc, vc, x, w)
    assert torch.equal(eager[0][0], compiled[0][0]) and torch.equal(eager[0][1], compiled[0][1])
    assert torch.equal(eager[1], compiled[1])


def test_autocast_runs_fp32_inputs_in_bf16_like_sdpa():
    q, k, v = (_randn(2, 4, 300, 64, dtype=torch.float32, seed=s) for s in (10, 11, 12))
    expected = tylopy.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = tylopy.attention(q, k, v, is_causal=True)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch._dynamo.reset()
        compiled = torch.compile(lambda q, k, v: tylopy.attention(q, k, v, is_causal=True), fullgraph=True)(q, k, v)
        with torch.autocast("cuda", dtype=torch.float16):
            half = tylopy.attention(q, k, v, is_causal=True)
    assert out.dtype == sdpa.dtype == compiled.dtype == torch.bfloat16 and half.dtype == torch.float16
    assert torch.equal(out, expected)  # the same kernel on the same bf16 inputs
    # the compiled graph reaches the kernel through tylopy::attention_fwd's autocast rule
    assert (compiled.float() - expected.float()).abs().max().item() <= 2 ** -7 * expected.float().abs().max().item()
    # varlen follows the same rule
    cu = torch.tensor([0, 250, 600], dtype=torch.int32, device="cuda")
    pq, pk, pv = (_randn(600, 4, 64, dtype=torch.float32, seed=s) for s in (13, 14, 15))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        packed = tylopy.attention_varlen(pq, pk, pv, cu, cu, 350, 350)
    assert torch.equal(packed, tylopy.attention_varlen(pq.bfloat16(), pk.bfloat16(), pv.bfloat16(), cu, cu, 350, 350))


@pytest.mark.parametrize("causal", [False, True])
def test_nested_jagged_attention_matches_each_sequence(causal):
    lengths = [37, 256, 1, 129]
    values = [_randn(sum(lengths), h, 64, seed=s) for h, s in ((8, 20), (2, 21), (2, 22))]
    offsets = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device="cuda")
    q, k, v = (torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in values)
    out, lse = tylopy.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    assert out.is_nested and lse.is_nested
    start = 0
    for b, n in enumerate(lengths):
        sl = [t[start:start + n].transpose(0, 1)[None] for t in values]
        qq, kk, vv = (t.double() for t in sl)
        s = (qq @ kk.repeat_interleave(4, dim=1).transpose(-1, -2)) / 8.0
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        ref = s.softmax(-1) @ vv.repeat_interleave(4, dim=1)
        assert (out[b].double() - ref[0]).abs().max().item() <= 2 ** -7 * ref.abs().max().item()
        assert (lse[b].double() - torch.logsumexp(s, -1)[0]).abs().max().item() < 1e-3
        start += n


@sm90
def test_explain_tool_finds_one_graph_per_entry_point(capsys):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import explain_entry_points
    finally:
        sys.path.pop(0)
    assert explain_entry_points.main(["--run"]) == 0, capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_ring_attention_compiles_without_graph_breaks_over_nccl():
    worker = os.path.join(ROOT, "tests", "ring_compile_worker.py")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    port = str(29000 + os.getpid() % 3000)
    procs = [subprocess.Popen([sys.executable, worker, str(r), "2", port, "nccl"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    for rank, (stdout, _) in enumerate(outs):
        _, r, graphs, breaks, diff = next(ln for ln in stdout.splitlines() if ln.startswith("RING")).split()
        assert (int(graphs), int(breaks)) == (1, 0) and float(diff) == 0.0, stdout
