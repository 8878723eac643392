"""``tylopy bench attention --fp8``: tylopy's FP8 (e4m3) attention forward beside tylopy's bf16
forward and, when importable, an FA3-class FP8 forward (FlashAttention-3's ``flash_attn_interface``
or flash-attn-4's CuTe path, given e4m3 inputs; skipped with the reason otherwise), in one process.

Shapes: D = 128 (16 heads) and D = 64 (32 heads) (``--d`` picks; both by default), batch x N =
16384 tokens, N 1k..16k, causal and not. bf16 inputs N(0, 1) are quantized per tensor (amax / 448
descales) once. ``tylopy_fp8`` is the ``tylopy.attention`` call, its host-side V transpose (one
pass over V) included; ``tylopy_fp8_kernel`` launches the kernel alone on a V^T made once. Per
shape, each candidate runs once (it compiles), its error on the first and last (batch, head)
against an FP64 reference on the dequantized inputs is measured next to SDPA in bf16 on the same
inputs (the error table), then it is timed (CUDA-event medians). TFLOP/s counts 4 B H N^2 D (half
causal); the ratio table gives FP8 / bf16 (call and kernel alone) and FP8 / FA3-class.
``--ptxas`` prints the registers and spills of the FP8 kernel's default specializations (no GPU).

    tylopy bench attention --fp8 --output results/attention-fp8.json
    tylopy bench attention --fp8 --ptxas
    tylopy bench attention --fp8 --variant STAGES=3 --variant BLOCK_N=256,STAGES=3   # schedule options
    tylopy bench attention --fp8 --schedule STAGES=3     # change the FP8 defaults for the whole run
"""
from __future__ import annotations

import contextlib

TOKENS = 16384
HEADS = {64: 32, 128: 16}
NS = (1024, 2048, 4096, 8192, 16384)


def fa3_fp8():
    """(name, fn(q8, k8, v8, descales, causal) -> (B, N, H, D) output) or (None, why not)."""
    why = []
    try:
        from flash_attn_interface import flash_attn_func as fa3

        def run(q, k, v, descales, causal):
            res = fa3(q, k, v, causal=causal, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
            return res[0] if isinstance(res, tuple) else res
        return "fa3_fp8", run
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        why.append(f"flash_attn_interface: {type(e).__name__}: {e}"[:160])
    try:
        from flash_attn.cute import flash_attn_func as fa4

        def run_cute(q, k, v, descales, causal):  # no descales in its interface: unit descales only
            res = fa4(q, k, v, causal=causal)
            return res[0] if isinstance(res, tuple) else res
        return "fa3_cute_fp8", run_cute
    except Exception as e:  # noqa: BLE001
        why.append(f"flash_attn.cute: {type(e).__name__}: {e}"[:160])
    return None, "; ".join(why)


def flops(b, n, d, causal):
    return 4 * b * HEADS[d] * n * n * d / (2 if causal else 1)


def _inputs(b, n, d, seed):
    import torch

    from tylopy_kernels.attention.testing import fp8 as F
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, HEADS[d], n, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = (F.quantize(t, False) for t in (q, k, v))
    x = {"q": q, "k": k, "v": v, "q8": q8, "k8": k8, "v8": v8, "descales": (qd, kd, vd)}
    # the FA3-class interfaces take (B, N, H, D); unit descales for the one without them
    x.update({name + "t": x[name].transpose(1, 2).contiguous() for name in ("q8", "k8", "v8")})
    return x


@contextlib.contextmanager
def fp8_schedule(changes):
    """The FP8 launcher's defaults with ``changes`` while inside (the read-only table replaced, then
    put back)."""
    from types import MappingProxyType

    from tylopy_kernels.attention.sm90 import fp8_launch
    saved = fp8_launch.SCHEDULE
    fp8_launch.SCHEDULE = MappingProxyType(dict(saved, **changes))
    try:
        yield
    finally:
        fp8_launch.SCHEDULE = saved


def _variant(changes, causal):
    import tylopy

    def run(x):
        with fp8_schedule(changes):
            return tylopy.attention(x["q8"], x["k8"], x["v8"], is_causal=causal, q_descale=x["descales"][0],
                                    k_descale=x["descales"][1], v_descale=x["descales"][2])
    return run


def _kernel_only(causal):
    """The FP8 kernel alone: V^T and the launch planned once per input set, then only the launch
    timed (what the call costs without its host-side V transpose)."""
    import torch

    from tylopy_kernels.attention.sm90.forward_fp8 import attention_fwd_fp8_sm90
    from tylopy_kernels.attention.sm90.fp8_launch import Fp8Problem, plan_fp8
    held = {}

    def run(x):
        if held.get("inputs") is not x:
            q8 = x["q8"]
            out = torch.empty(q8.shape, dtype=torch.bfloat16, device=q8.device)
            prob = Fp8Problem(q8, x["k8"], x["v8"], None, causal, q8.shape[-1] ** -0.5, x["descales"])
            launch, vt = plan_fp8(prob, out, None)
            held.update(inputs=x, launch=launch, vt=vt, out=out)
        launch = held["launch"]
        attention_fwd_fp8_sm90[launch.grid](*launch.args, **launch.constexprs)
        return held["out"]
    return run


def candidates(causal, variants=()):
    """name -> fn(inputs); each of ``variants`` ("K=V,...", as --variant takes them) adds
    ``tylopy_fp8[K=V,...]``: the FP8 forward under those schedule changes."""
    import tylopy

    from tylopy.benchmarking import parse_schedule
    out = {"tylopy_fp8": lambda x: tylopy.attention(x["q8"], x["k8"], x["v8"], is_causal=causal,
                                                    q_descale=x["descales"][0], k_descale=x["descales"][1],
                                                    v_descale=x["descales"][2]),
           "tylopy_fp8_kernel": _kernel_only(causal),
           "tylopy_bf16": lambda x: tylopy.attention(x["q"], x["k"], x["v"], is_causal=causal)}
    name, fa = fa3_fp8()
    if name is not None:
        out[name] = lambda x: fa(x["q8t"], x["k8t"], x["v8t"], x["descales"], causal).transpose(1, 2)
    for text in variants:
        out[f"tylopy_fp8[{text}]"] = _variant(parse_schedule(text), causal)
    return out


def check(name, out, x, causal):
    """Errors on the first and last (batch, head) against FP64 on the dequantized inputs (for
    tylopy_bf16: on its own bf16 inputs), with SDPA bf16 on the dequantized inputs beside."""
    from tylopy_kernels.attention.testing import fp8 as F
    row = {}
    b, h = out.shape[0] - 1, out.shape[1] - 1
    for bb, hh in ((0, 0), (b, h)):
        sl = (slice(bb, bb + 1), slice(hh, hh + 1))
        if name.startswith("tylopy_bf16"):
            qd, kd, vd = (x[t][sl].double() for t in ("q", "k", "v"))
        else:
            qd, kd, vd = (F.dequantized(x[t][sl], d) for t, d in zip(("q8", "k8", "v8"), x["descales"]))
        want, _ = F.reference(qd, kd, vd, causal)
        e = F.errors(out[sl], want)
        s = F.errors(F.sdpa_bf16(qd, kd, vd, causal), want)
        row["max_abs"] = max(row.get("max_abs", 0.0), e["max_abs"])
        row["mean_abs"] = max(row.get("mean_abs", 0.0), e["mean_abs"])
        row["sdpa_bf16_max_abs"] = max(row.get("sdpa_bf16_max_abs", 0.0), s["max_abs"])
        row["sdpa_bf16_mean_abs"] = max(row.get("sdpa_bf16_mean_abs", 0.0), s["mean_abs"])
    return row


def run(ns=NS, dims=(128,), causal_modes=(False, True), bench=None, variants=()):
    import torch
    rows = []
    for d, causal, n in ((d, c, n) for d in dims for c in causal_modes for n in ns):
        b = max(TOKENS // n, 1)
        x = _inputs(b, n, d, seed=n)
        for name, fn in candidates(causal, variants).items():
            row = {"name": name, "d": d, "n": n, "batch": b, "heads": HEADS[d], "causal": causal}
            try:
                out = fn(x)
                torch.cuda.synchronize()
                row.update(check(name, out, x, causal))
                ms = bench(lambda: fn(x))
                row.update(ms=ms, tflops=flops(b, n, d, causal) / ms / 1e9)
            except Exception as e:  # noqa: BLE001 - a candidate may not support a shape
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            rows.append(row)
            print_row(row)
    return rows


def print_row(r):
    tag = f"D={r['d']:<3} N={r['n']:>6} {'causal' if r['causal'] else 'full  '} {r['name']:<20}"
    if "error" in r:
        print(f"{tag} error: {r['error']}")
        return
    print(f"{tag} {r['tflops']:8.1f} TFLOP/s {r['ms']:8.3f} ms | max err {r['max_abs']:.3e} mean {r['mean_abs']:.3e}"
          f" | SDPA bf16 (same inputs) max {r['sdpa_bf16_max_abs']:.3e} mean {r['sdpa_bf16_mean_abs']:.3e}")


def ratios(rows):
    """{"N=.. causal": {"fp8/bf16": x, "fp8/fa3": y}} where both ran."""
    by = {((r["d"], r["n"], r["causal"]), r["name"]): r.get("tflops") for r in rows}
    out = {}
    for key in sorted({k for k, _ in by}):
        d, n, causal = key
        fp8 = by.get((key, "tylopy_fp8"))
        entry = {}
        others = [("tylopy_bf16", "fp8/bf16"), ("fa3_fp8", "fp8/fa3"), ("fa3_cute_fp8", "fp8/fa3_cute")]
        if by.get((key, "tylopy_fp8_kernel")) and by.get((key, "tylopy_bf16")):
            entry["fp8 kernel only/bf16"] = by[(key, "tylopy_fp8_kernel")] / by[(key, "tylopy_bf16")]
        others += [(name, f"{name}/fp8") for (k, name) in by if k == key and "[" in name]
        for other, label in others:
            if fp8 and by.get((key, other)):
                entry[label] = (by[(key, other)] / fp8) if "[" in other else fp8 / by[(key, other)]
        out[f"D{d} N={n} {'causal' if causal else 'non-causal'}"] = entry
    return out


def ptxas_reports():
    """{specialization: "registers R, spills S/L"} of the FP8 kernel's default specializations."""
    from tylopy_kernels.attention.sm90.forward_fp8 import attention_fwd_fp8_sm90
    from tylopy_kernels.attention.sm90.fp8_launch import resolve_schedule
    out = {}
    for d in (128, 64):
        for lse in (False, True):
            for mask in (False, True):
                cx = dict(resolve_schedule(d, mask), HEAD_DIM=d, RETURN_LSE=lse, HAS_MASK=mask)
                rep = attention_fwd_fp8_sm90.compile(**cx).report
                out[f"D={d} CONSUMERS={cx['CONSUMERS']} RETURN_LSE={lse} HAS_MASK={mask}"] = (
                    f"{rep.registers} registers, spills {rep.spill_stores}/{rep.spill_loads} bytes (stores/loads)")
    return out


def main(args, timer):
    """Run from ``tylopy bench attention --fp8`` (``args`` its parsed options)."""
    import sys

    if args.ptxas:
        for k, v in ptxas_reports().items():
            print(f"{k}: {v}")
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench attention --fp8 needs a CUDA GPU", file=sys.stderr)
        return 2
    from tylopy.benchmarking import write_results
    from tylopy_kernels.attention.sm90.fp8_launch import SCHEDULE
    from tylopy.benchmarking import parse_schedule
    ns = tuple(n for n in args.n if n >= 1024) or NS
    dims = tuple(args.d) if args.d else (128,)
    with fp8_schedule(parse_schedule(args.schedule)):
        rows = run(ns, dims, bench=timer, variants=tuple(args.variant))
    table = ratios(rows)
    print("\nratios (TFLOP/s):")
    for k, v in table.items():
        print(f"  {k}: " + ", ".join(f"{a} {b:.2f}x" for a, b in v.items()))
    reports = ptxas_reports()
    print("\nptxas:", reports)
    path = write_results("attention-fp8", {"rows": rows, "ratios": table, "fa3": fa3_fp8()[0] or fa3_fp8()[1],
                                           "schedule": dict(SCHEDULE, **parse_schedule(args.schedule)),
                                           "ptxas": reports,
                                           "flops": "4 B H N^2 D, half causal", "heads": HEADS,
                                           "tokens": TOKENS}, args.output)
    print(f"wrote {path}")
    return 0

