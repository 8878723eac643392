"""Where a variant's error or time goes, on an H100/H200: the packed window + softcap case of
``tylopy bench attention_variants`` checked element by element (which gradient, document, head and
rows are off, under changes of heads, tokens, softcap and window), and the sliding-window forward
timed beside the same work through other routes (dense causal, the variant kernel on wider windows).

    python tools/diagnose_variants.py [--check] [--time] [--persistent] [--backward] [--bench-check]
"""
import argparse

import torch

import tylopy as ty
from tylopy.benchmarking import median_ms
from tylopy_kernels.attention.bench import variant_cases as cases
from tylopy_kernels.attention.bench import variant_libs as libs
from tylopy_kernels.attention.bench.variants import reference_grads

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def check_packed(heads, tokens, mean, softcap, window, label):
    spec = cases.make_spec("document_window", 128, mean, tokens=tokens, heads=heads)
    x = cases.make_inputs(spec, device=DEVICE)
    saved = cases.SOFTCAP, cases.WINDOW, cases.SOFTCAP_VARIANTS
    cases.SOFTCAP, cases.WINDOW = softcap, window
    if not softcap:  # the reference's tanh would divide by 0; tylopy takes softcap=0 as none
        cases.SOFTCAP_VARIANTS = ("softcap",)
    try:
        ref = reference_grads(spec, x)
        run = libs.build("tylopy", spec, x)
        for call in range(2):
            grads = [run.to_common(g)[:1].float() for g in run.backward_fn()()]
            cu = x["cu_seqlens"].tolist()
            for name, g, r in zip(("dq", "dk", "dv"), grads, ref[1:]):
                err = (g - r).abs()
                worst = err.max().item()
                line = f"{label} call {call} {name}: max err {worst:.3e} (|ref| max {r.abs().max().item():.2f})"
                if worst > 0.1:
                    bad = (err > 0.1).nonzero()
                    rows = bad[:, 2]
                    docs = torch.searchsorted(torch.tensor(cu[1:], device=rows.device), rows, right=True)
                    line += (f" bad elements {bad.shape[0]}, heads {bad[:, 1].unique().tolist()[:8]}, docs "
                             f"{docs.unique().tolist()[:8]}, rows {rows.min().item()}..{rows.max().item()}, "
                             f"first rows {rows.unique().tolist()[:6]}, doc starts {cu[:6]}")
                print(line, flush=True)
    finally:
        cases.SOFTCAP, cases.WINDOW, cases.SOFTCAP_VARIANTS = saved


def time_window():
    B, H, N, D = 4, 16, 4096, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    pairs = lambda w: sum(min(i, w) + 1 for i in range(N))
    for label, kw, w in (("dense causal", dict(is_causal=True), N), ("window 1024", dict(window_size=(1024, 0), is_causal=True), 1024),
                         ("window 2048", dict(window_size=(2048, 0), is_causal=True), 2048),
                         ("window 4096 (causal work, variant kernel)", dict(window_size=(4096, 0), is_causal=True), N),
                         ("window (1024, 1024) non-causal", dict(window_size=(1024, 1024)), None)):
        fn = lambda: ty.attention(q, k, v, **kw)
        fn()
        ms = median_ms(fn, 20, 100)
        p = pairs(w) if w is not None else sum(min(i, 1024) + min(N - 1 - i, 1024) + 1 for i in range(N))
        print(f"fwd {label}: {ms:.3f} ms, {4 * D * p * B * H / ms / 1e9:.0f} TFLOP/s", flush=True)


def time_persistent():
    """The variant forward's launcher called directly (no autograd or entry checks), one work tile per
    CTA against PERSISTENT, on the bench's window and block-sparse shapes (B=4, N=4096, D=128)."""
    from tylopy_kernels.attention import variants as V
    from tylopy_kernels.attention.common import ForwardTensors, VariantCall
    from tylopy_kernels.attention.sm90.variant_launch import launch_variant
    B, H, N, D = 4, 16, 4096, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(B, H, N, device="cuda")
    spec = cases.make_spec("block_sparse", D, N)
    mod = cases.mask_mod(spec, "cuda")
    for label, kw in (("window 1024", dict(is_causal=True, window_size=(1024, 0))),
                      ("causal", dict(is_causal=True, softcap=30.0)),
                      ("block_sparse", dict(mask_mod=mod, block_mask=ty.create_block_mask(mod, 1, 1, N, N,
                                                                                         device="cuda")))):
        variant, tensors = V.make_variant(B, H, N, N, q.device, **kw)
        call = VariantCall(variant, tensors, 1 / D ** 0.5)
        times = []
        for persistent in (False, True):
            fn = (lambda p=persistent: launch_variant(ForwardTensors(q, k, v, out, lse), call, {"PERSISTENT": p}))
            fn()
            times.append(median_ms(fn, 20, 100))
        print(f"variant fwd {label}: one tile per CTA {times[0]:.3f} ms, persistent {times[1]:.3f} ms "
              f"({times[0] / times[1]:.2f}x)", flush=True)


def backward_runs(repeats=3):
    """The dense causal backward (B=4, N=4096) and the packed-document backward over the same 16k
    tokens (``document_varlen``), D=128, each run ``repeats`` times (for ncu's -k filters)."""
    for variant in ("causal", "document_varlen"):
        spec = cases.make_spec(variant, 128, 4096)
        x = cases.make_inputs(spec, device=DEVICE)
        run = libs.build("tylopy", spec, x)
        bwd = run.backward_fn()
        for _ in range(repeats):
            bwd()
        torch.cuda.synchronize()
        ms = median_ms(bwd, 20, 100)
        print(f"bwd {variant}: {ms:.3f} ms, {cases.flops(spec, 'bwd') / ms / 1e9:.0f} TFLOP/s", flush=True)


def bench_check(variant="document_window"):
    """The bench's own check of ``variant`` (a no-grad forward, then the backward), then its forward time."""
    from tylopy_kernels.attention.bench.variants import check_one
    spec = cases.make_spec(variant, 128, 4096)
    x = cases.make_inputs(spec, device=DEVICE)
    got = check_one("tylopy", spec, x, reference_grads(spec, x), ("fwd", "bwd"))
    run = libs.build("tylopy", spec, x)

    def fwd():
        with torch.no_grad():
            return run.forward()
    fwd()
    ms = median_ms(fwd, 20, 100)
    print(f"bench check {variant}: {got}, fwd {ms:.3f} ms {cases.flops(spec, 'fwd') / ms / 1e9:.0f} TFLOP/s",
          flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--persistent", action="store_true", help="the variant forward, one tile per CTA vs PERSISTENT")
    ap.add_argument("--bench-check", action="store_true")
    ap.add_argument("--check-first", action="store_true", help="the element check before the bench's check")
    a = ap.parse_args()
    if a.time:
        time_window()
    if a.check_first:
        check_packed(16, 16384, 4096, 30.0, 1024, "bench case")
    if a.bench_check:
        bench_check()
    if a.persistent:
        time_persistent()
    if a.backward:
        backward_runs()
    if a.check:
        check_packed(16, 16384, 4096, 30.0, 1024, "bench case")
        check_packed(16, 16384, 4096, 0.0, 1024, "no softcap")
        check_packed(2, 16384, 4096, 30.0, 1024, "2 heads")
        check_packed(16, 4096, 1024, 30.0, 256, "4k tokens, window 256")
        check_packed(16, 16384, 4096, 30.0, 100000, "window past the documents")
