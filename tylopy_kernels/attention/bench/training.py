"""``tylopy bench attention_training``: one training step of a transformer block under ``torch.compile``,
with ``tylopy.attention`` against SDPA's default backend, in one process.

The block is pre-norm: x + proj(attention(qkv(norm(x)))), then x + mlp(norm(x)) with a 4x GELU
MLP; bf16 weights and activations, causal attention, B = 4, N = 4096, 16 heads of 128 (model
width 2048) by default, K/V heads selectable (GQA). A step is zero_grad + forward + a squared-mean
loss + backward. Both blocks hold the same weights and are compiled with ``fullgraph=True``
(default inductor mode); before timing, one step of each is compared (loss and gradients) and
dynamo is asked for graph breaks in the tylopy block (there must be none). Times are CUDA-event
medians after warm-up; the attention forward+backward alone (eager) is timed too, so the step's
difference can be traced to it, and the portable (mma.sync) backward alone, which GPUs without
Hopper's backward kernels run. TFLOP/s count the matmuls (2 x 12 width^2 per token forward,
x3 for forward+backward) and attention (4 B H N^2 D forward, halved for causal, x3.5 for
forward+backward).

    tylopy bench attention_training                          # B=4, N=4096, 16 x 128, causal
    tylopy bench attention_training --kv-heads 4 --output results/attention_training.json
    tylopy bench attention_training --eager                  # also the eager steps
"""
from __future__ import annotations

import argparse
import sys


def make_block(dim, heads, kv_heads, attention, dtype, device):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = dim // heads
            self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
            self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
            self.proj = torch.nn.Linear(dim, dim, bias=False)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim, bias=False), torch.nn.GELU(),
                                           torch.nn.Linear(4 * dim, dim, bias=False))

        def forward(self, x):
            B, N, C = x.shape
            qkv = self.qkv(self.norm1(x)).view(B, N, heads + 2 * kv_heads, self.head_dim).transpose(1, 2)
            q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
            y = attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)
            x = x + self.proj(y.transpose(1, 2).reshape(B, N, C))
            return x + self.mlp(self.norm2(x))

    return Block().to(device=device, dtype=dtype)


def _sdpa(q, k, v, is_causal, enable_gqa):
    import torch
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)


def _tylopy(q, k, v, is_causal, enable_gqa):
    import tylopy
    return tylopy.attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)


def _step(block, x):
    def step():
        block.zero_grad(set_to_none=True)
        loss = block(x).float().square().mean()
        loss.backward()
        return loss
    return step


def _agreement(a, b, x):
    """Relative differences of the loss and of each weight gradient after one step of each block."""
    la, lb = _step(a, x)(), _step(b, x)()
    worst = 0.0
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        den = pb.grad.float().abs().max().item() or 1.0
        worst = max(worst, (pa.grad.float() - pb.grad.float()).abs().max().item() / den)
    return abs(la.item() - lb.item()) / max(abs(lb.item()), 1e-12), worst


def _attention_alone(attention, q, k, v, dout, gqa):
    def run():
        for t in (q, k, v):
            t.grad = None
        attention(q, k, v, True, gqa).backward(dout)
    return run


def _portable_backward(q, k, v, dout):
    """The portable backward kernels alone (what GPUs without Hopper's kernels run)."""
    import torch

    import tylopy
    from tylopy_kernels.attention.portable.backward_launch import launch_backward_portable
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = tylopy.attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1], return_lse=True)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    scale = q.shape[-1] ** -0.5
    return lambda: launch_backward_portable(q, k, v, out, dout, lse, *grads, is_causal=True, scale=scale)


def step_flops(B, N, dim, heads, head_dim):
    tokens = B * N
    matmul = 3 * 2 * tokens * 12 * dim * dim
    attn = 3.5 * 4 * B * heads * N * N * head_dim / 2
    return matmul + attn


def run(args) -> dict:
    import torch

    from tylopy.benchmarking import median_ms
    dim = args.heads * args.head_dim
    dev, dtype = "cuda", torch.bfloat16
    torch.manual_seed(0)
    blocks = {"tylopy": make_block(dim, args.heads, args.kv_heads, _tylopy, dtype, dev)}
    blocks["sdpa"] = make_block(dim, args.heads, args.kv_heads, _sdpa, dtype, dev)
    blocks["sdpa"].load_state_dict(blocks["tylopy"].state_dict())
    x = torch.randn(args.batch, args.seq, dim, device=dev, dtype=dtype)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(blocks["tylopy"])(x)
    breaks = explained.graph_break_count
    print(f"dynamo: {explained.graph_count} graph(s), {breaks} break(s) in the tylopy block")
    compiled = {name: torch.compile(b, fullgraph=True, mode=args.mode) for name, b in blocks.items()}
    loss_diff, grad_diff = _agreement(compiled["tylopy"], compiled["sdpa"], x)
    print(f"one step, tylopy against sdpa: loss {loss_diff:.1e} relative, weight gradients {grad_diff:.1e} "
          "relative to each gradient's largest entry")
    flops = step_flops(args.batch, args.seq, dim, args.heads, args.head_dim)
    rows = []
    for name in ("tylopy", "sdpa"):
        for kind, model in (("compiled", compiled[name]), ("eager", blocks[name])):
            if kind == "eager" and not args.eager:
                continue
            ms = median_ms(_step(model, x), args.warmup_ms, args.rep_ms)
            rows.append(dict(attention=name, kind=kind, step_ms=ms, tflops=flops / ms / 1e9))
            print(f"{name:7s} {kind:8s} step {ms:8.3f} ms   {flops / ms / 1e9:6.1f} TFLOP/s")
    gen = torch.Generator(device=dev).manual_seed(1)
    shapes = [(args.batch, h, args.seq, args.head_dim) for h in (args.heads, args.kv_heads, args.kv_heads)]
    q, k, v = (torch.randn(s, generator=gen, device=dev, dtype=dtype).requires_grad_() for s in shapes)
    dout = torch.randn(shapes[0], generator=gen, device=dev, dtype=dtype)
    gqa = args.kv_heads != args.heads
    for name, fn in (("tylopy", _tylopy), ("sdpa", _sdpa)):
        ms = median_ms(_attention_alone(fn, q, k, v, dout, gqa), args.warmup_ms, args.rep_ms)
        rows.append(dict(attention=name, kind="attention fwd+bwd (eager)", step_ms=ms))
        print(f"{name:7s} attention forward+backward alone {ms:8.3f} ms")
    ms = median_ms(_portable_backward(q, k, v, dout), args.warmup_ms, args.rep_ms)
    rows.append(dict(attention="tylopy", kind="portable backward alone", step_ms=ms))
    print(f"tylopy  portable (mma.sync) backward alone {ms:8.3f} ms")
    step = {r["attention"]: r["step_ms"] for r in rows if r["kind"] == "compiled"}
    print(f"compiled step: tylopy {step['tylopy']:.3f} ms, sdpa {step['sdpa']:.3f} ms, "
          f"tylopy / sdpa = {step['tylopy'] / step['sdpa']:.3f}")
    return dict(shape=dict(batch=args.batch, seq=args.seq, heads=args.heads, kv_heads=args.kv_heads,
                           head_dim=args.head_dim, causal=True, dtype="bf16"),
                compile_mode=args.mode or "default", graph_breaks=breaks, loss_rel_diff=loss_diff,
                grad_rel_diff=grad_diff, rows=rows, speedup=step["sdpa"] / step["tylopy"])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tylopy bench attention_training", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=None, help="K/V heads (default: as many as query heads)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--mode", default=None, help="torch.compile mode (default: inductor's default)")
    ap.add_argument("--eager", action="store_true", help="also time the eager steps")
    ap.add_argument("--warmup-ms", type=float, default=200)
    ap.add_argument("--rep-ms", type=float, default=1000)
    ap.add_argument("--output", help="JSON path (default results/attention_training-<device>-<date>.json)")
    args = ap.parse_args(argv)
    args.kv_heads = args.kv_heads or args.heads
    if args.heads % args.kv_heads:
        print(f"--kv-heads expects a divisor of --heads ({args.heads}), but got {args.kv_heads}", file=sys.stderr)
        return 2
    import torch
    if not torch.cuda.is_available():
        print("bench attention_training needs a CUDA GPU", file=sys.stderr)
        return 2
    from tylopy.benchmarking import write_results
    data = run(args)
    write_results("attention_training", data, args.output)
    return 0 if data["graph_breaks"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
