"""Where a variant's error or time goes, on an H100/H200: the packed window + softcap case of
``tylopy bench attention_variants`` checked element by element (which gradient, document, head and
rows are off, under changes of heads, tokens, softcap and window), and the sliding-window forward
timed beside the same work through other routes (dense causal, the variant kernel on wider windows).

    python tools/diagnose_variants.py [--check] [--time] [--persistent] [--backward] [--bench-check] [--host] [--sync] [--layers] [--kernels]
"""
import argparse
import contextlib

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


def host_costs(libraries=("tylopy", "fa3_cute"), profile=("sliding_window", "document_window")):
    """Per variant and library at the bench's shape (D=128, N=4096): the bench's time (triton's
    do_bench, which clears L2 before each call), 30 calls back to back between two events, and the
    host's time to enqueue one call (30 calls without a synchronization, the GPU busy meanwhile: a
    time near the kernel's says the call waits for the GPU somewhere)."""
    import time
    for variant, library, direction, call in bench_calls(cases.VARIANTS, libraries):
        bench = median_ms(call, 20, 100)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(30):
            call()
        host = (time.perf_counter() - t0) / 30 * 1e3
        end.record()
        torch.cuda.synchronize()
        loop = start.elapsed_time(end) / 30
        print(f"host {variant} {library} {direction}: bench {bench:.3f} ms, back to back {loop:.3f} ms, "
              f"host enqueue {host:.3f} ms per call", flush=True)
        if library == "tylopy" and variant in profile:
            profile_calls(call, f"{variant} {direction}")


def kernels_per_call(variants=("causal", "document_varlen", "sliding_window"), calls=3):
    """Every GPU kernel and copy one call launches, by count (torch.profiler), forward and backward."""
    from torch.profiler import ProfilerActivity, profile
    for variant, _, direction, call in bench_calls(variants):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if "cuda" in str(e.device_type).lower()]
        rows = sorted(((e.count / calls, e.key[:70], e.device_time_total / calls) for e in events), key=lambda r: -r[2])
        print(f"kernels {variant} {direction}: {sum(r[0] for r in rows):.0f} per call", flush=True)
        for count, name, us in rows[:14]:
            print(f"    {count:4.1f} x {name}: {us:.1f} us per call", flush=True)


def profile_calls(call, label, calls=30):
    """Where the host time of ``calls`` calls goes (cProfile, by own time)."""
    import cProfile
    import pstats
    torch.cuda.synchronize()
    p = cProfile.Profile()
    p.enable()
    for _ in range(calls):
        call()
    p.disable()
    torch.cuda.synchronize()
    print(f"--- profile {label}", flush=True)
    pstats.Stats(p).sort_stats("tottime").print_stats(18)


def bench_calls(variants, libraries=("tylopy",)):
    """(variant, library, direction, call) for each case of the bench at D=128, N=4096, the call run
    once: a forward under no_grad, or the backward alone (its forward's graph kept); a library that
    does not build a case is reported and skipped (``host_profile.calls``)."""
    from host_profile import calls  # (tools/, beside this script)
    return calls(variants, 128, 4096, libraries)


def sync_probe(variants=("causal", "sliding_window", "document_varlen")):
    """Which call waits for the GPU: each runs once behind ~100 ms of GPU sleep, under cProfile; a
    call that synchronizes takes ~100 ms of host time, and the profile's top entry holds the wait."""
    import cProfile
    import pstats
    import time
    import warnings
    for variant, _, direction, call in bench_calls(variants):
        torch.cuda._sleep(200_000_000)
        p = cProfile.Profile()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            p.enable()
            call()
            p.disable()
            host = (time.perf_counter() - t0) * 1e3
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        print(f"sync {variant} {direction}: {host:.2f} ms of host time behind ~100 ms of GPU sleep; "
              f"torch sync warnings: {[str(w.message)[:120] for w in caught]}", flush=True)
        if host > 20:
            pstats.Stats(p).sort_stats("tottime").print_stats(6)


def host_layers(calls=300):
    """Host microseconds per call of each layer of the sliding-window forward, outermost first, at a
    tiny shape (the GPU keeps up, so the time is the host's), beside the dense causal call."""
    import time
    from tylopy_kernels.attention import variants as V
    from tylopy_kernels.attention import autograd_variants as AV
    from tylopy_kernels.attention.common import ForwardTensors, VariantCall
    from tylopy_kernels.attention.sm90 import variant_launch as VL
    B, H, N, D = 1, 1, 256, 128
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(B, H, N, device="cuda")
    kw = dict(is_causal=True, window_size=(64, 0))
    scale = D ** -0.5
    vk = V.VariantKeywords(**kw)
    vid, tensors = V.make_variant_id(B, H, N, N, q.device, vk)
    variant, vtensors = V.make_variant(B, H, N, N, q.device, **kw)
    call = VariantCall(variant, vtensors, scale)
    io = ForwardTensors(q, k, v, out, lse)
    launch = VL.plan_variant_launch(io, call)
    kernel = VL.attention_variant_fwd_sm90
    grid = kernel[launch.grid]
    layers = (("tylopy.attention(window)", lambda: ty.attention(q, k, v, **kw)),
              ("variants.make_variant_id", lambda: V.make_variant_id(B, H, N, N, q.device, vk)),
              ("variant_op", lambda: AV.variant_op(q, k, v, vid, tensors, scale)),
              ("operator attention_variant_fwd", lambda: AV.attention_variant_fwd(q, k, v, list(tensors), vid,
                                                                                 scale, False)),
              ("forward_variant", lambda: AV.forward_variant(q, k, v, variant, vtensors, scale)),
              ("launch_variant", lambda: VL.launch_variant(io, call)),
              ("plan_variant_launch", lambda: VL.plan_variant_launch(io, call)),
              ("kernel[grid](...)", lambda: kernel[launch.grid](*launch.args, **launch.constexprs)),
              ("launcher held grid(...)", lambda: grid(*launch.args, **launch.constexprs)),
              ("kernel[grid].repeat(...)", lambda: grid.repeat(*launch.args, **launch.constexprs)),
              ("tylopy.attention(causal)", lambda: ty.attention(q, k, v, is_causal=True)))
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    out_g = ty.attention(qg, kg, vg, is_causal=True)
    lse = torch.randn(B, H, N, device="cuda")
    from tylopy_kernels.attention import dispatch as TA
    from tylopy_kernels.attention.common import BackwardTensors
    from tylopy_kernels.attention.sm90.backward_launch import HopperBackwardOptions, plan_backward_hopper
    bt = BackwardTensors(q, k, v, out, dout, lse, *(torch.empty_like(t) for t in (q, k, v)), None)
    steps = plan_backward_hopper(bt, HopperBackwardOptions(scale, True))
    backward = (("causal backward only (autograd.grad)", lambda: torch.autograd.grad(out_g, (qg, kg, vg), dout,
                                                                                    retain_graph=True)),
                ("causal backward body (dispatch.backward)", lambda: TA.backward(
                    ForwardTensors(q, k, v, out, lse, None), dout, None, True, scale)),
                ("plan_backward_hopper", lambda: plan_backward_hopper(bt, HopperBackwardOptions(scale, True))),
                *((f"backward step {n} {st.kernel.name}", st.launch) for n, st in enumerate(steps)))
    train = backward + (("window forward + backward", lambda: torch.autograd.grad(ty.attention(qg, kg, vg, **kw), (qg, kg, vg),
                                                                         dout)),
             ("causal forward + backward", lambda: torch.autograd.grad(ty.attention(qg, kg, vg, is_causal=True),
                                                                         (qg, kg, vg), dout)))
    for label, fn in train + tuple((f"{label} (no grad)", fn) for label, fn in layers):
        with torch.no_grad() if "no grad" in label else contextlib.nullcontext():
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            us = (time.perf_counter() - t0) / calls * 1e6
            torch.cuda.synchronize()
        print(f"layer {label}: {us:.1f} us per call", flush=True)


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
    ap.add_argument("--kernels", action="store_true", help="the GPU kernels one call launches")
    ap.add_argument("--layers", action="store_true", help="host time of each layer of a variant call")
    ap.add_argument("--sync", action="store_true", help="which call waits for the GPU")
    ap.add_argument("--host", action="store_true", help="bench time, back-to-back time and host time per call")
    ap.add_argument("--check-first", action="store_true", help="the element check before the bench's check")
    a = ap.parse_args()
    if a.layers:
        host_layers()
    if a.kernels:
        kernels_per_call()
    if a.sync:
        sync_probe()
    if a.host:
        host_costs()
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
