"""What ``torch._dynamo.explain`` sees in each entry point: graphs, breaks and the tylopy operators
of the traced graph, one line per case (docs/pytorch.md).

    python tools/explain_entry_points.py                  # CUDA tensors (the GPU machine)
    python tools/explain_entry_points.py --device meta    # meta tensors: runs anywhere
    python tools/explain_entry_points.py --run            # also run each case compiled (fullgraph)

Every case should report ``graphs=1 breaks=0``; a break prints its reasons. ``ring_attention``
runs as one rank (no process group): the multi-rank trace is in tests/test_torch_integration.py
(gloo) and tests/test_torch_integration_gpu.py (NCCL). The exit status is the number of cases
with more than one graph or any break.
"""
from __future__ import annotations

import argparse
import sys

import torch

import tylopy
from tylopy_kernels.gemm import epilogues


def _cases(device, dtype):
    t = lambda *shape, **kw: torch.randn(*shape, device=device, dtype=kw.get("dtype", dtype))  # noqa: E731
    grad = lambda x: x.requires_grad_()  # noqa: E731
    q, k, v = t(2, 8, 256, 128), t(2, 2, 256, 128), t(2, 2, 256, 128)
    cu = torch.tensor([0, 100, 256], dtype=torch.int32, device=device)
    qp, kp, vp = t(256, 8, 64), t(256, 8, 64), t(256, 8, 64)
    kc, vc = t(2, 1024, 2, 128), t(2, 1024, 2, 128)
    lens = torch.tensor([700, 1024], dtype=torch.int32, device=device)
    a, w, bias = t(4, 128, 256), t(512, 256), t(512)
    yield "attention", lambda q, k, v: tylopy.attention(q, k, v, is_causal=True, enable_gqa=True), (q, k, v)
    yield "attention+grad", lambda q, k, v: tylopy.attention(q, k, v, is_causal=True, enable_gqa=True).sum(), \
        tuple(grad(x.clone()) for x in (q, k, v))
    yield "attention_varlen", lambda q, k, v: tylopy.attention_varlen(q, k, v, cu, cu, 156, 156, is_causal=True), \
        (qp, kp, vp)
    yield "attention_decode", lambda q, kc, vc: tylopy.attention_decode(q, kc, vc, lens, is_causal=True), \
        (t(2, 1, 4, 128), kc, vc)
    yield "matmul", lambda a, w: tylopy.matmul(a, w.t(), bias, epilogue=epilogues.gelu), (a, w)
    yield "matmul+grad", lambda a, w: tylopy.matmul(a, w.t(), bias).float().sum(), (grad(a.clone()), grad(w.clone()))
    if device.type == "cuda":  # nested tensors of meta values are not supported by torch
        offsets = torch.tensor([0, 100, 256], device=device)
        nested = lambda x: torch.nested.nested_tensor_from_jagged(x, offsets).transpose(1, 2)  # noqa: E731
        yield "attention nested", lambda q, k, v: tylopy.attention(nested(q), nested(k), nested(v)).values(), \
            (qp, kp, vp)
    yield "ring_attention", lambda q, k, v: tylopy.distributed.ring_attention(q, k, v, is_causal=True), (q, q, q)
    yield "attention window+softcap+grad", lambda q, k, v: tylopy.attention(
        q, k, v, is_causal=True, enable_gqa=True, window_size=(64, 0), softcap=30.0).sum(), \
        tuple(grad(x.clone()) for x in (q, k, v))
    yield "attention score_mod", lambda q, k, v: tylopy.attention(
        q, k, v, enable_gqa=True, score_mod=lambda s, b, h, qi, ki: s - 0.01 * (qi - ki).abs()), (q, k, v)
    yield "attention_varlen window+grad", lambda q, k, v: tylopy.attention_varlen(
        q, k, v, cu, cu, 156, 156, is_causal=True, window_size=(32, 0)).sum(), tuple(grad(x.clone()) for x in (qp, kp, vp))
    e4m3 = torch.float8_e4m3fn
    yield "scaled_matmul", lambda a, b, sa, sb: tylopy.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16), \
        (t(256, 128).to(e4m3), t(512, 128).to(e4m3).t(), t(1, dtype=torch.float32), t(1, dtype=torch.float32))
    yield "attention fp8", lambda q, k, v: tylopy.attention(q, k, v, is_causal=True), \
        (t(2, 8, 256, 128).to(e4m3), t(2, 8, 256, 128).to(e4m3), t(2, 8, 256, 128).to(e4m3))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or meta")
    parser.add_argument("--run", action="store_true", help="also call each case under torch.compile(fullgraph=True)")
    args = parser.parse_args(argv)
    failures = 0
    for name, fn, inputs in _cases(torch.device(args.device), torch.bfloat16):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(fn)(*inputs)
        ops = sorted({str(n.target) for g in explained.graphs for n in g.graph.nodes
                      if n.op == "call_function" and "tylopy" in str(n.target)})
        ok = explained.graph_count == 1 and explained.graph_break_count == 0
        failures += not ok
        print(f"{name:18s} graphs={explained.graph_count} breaks={explained.graph_break_count} ops={ops}", flush=True)
        for reason in explained.break_reasons:
            print(f"    break: {reason.reason}  at {reason.user_stack[-1] if reason.user_stack else '?'}")
        if args.run and args.device != "meta":
            torch._dynamo.reset()
            torch.compile(fn, fullgraph=True)(*inputs)
            torch.cuda.synchronize()
            print(f"{name:18s} compiled run ok", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(main())
