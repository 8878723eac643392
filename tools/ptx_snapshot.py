"""The instructions of the shipped kernels' PTX, written to a folder or compared with one: the check
for a refactor that should not change what a kernel emits (regrouping the Python holders a trace
reads, moving a helper, renaming). No GPU needed; ptxas is not run.

    python tools/ptx_snapshot.py write /tmp/before      # on the commit before the change
    python tools/ptx_snapshot.py compare /tmp/before    # after it: exit 1 and the names that differ

Source-line annotations (``.loc``, ``.file``) and comments are dropped, so moved lines do not
count; any other difference (an instruction, a register, a label) does. ``--only NAME`` limits the
run to specializations whose name contains NAME.
"""
from __future__ import annotations

import argparse
import difflib
import inspect
import os
import sys
import warnings

os.environ.setdefault("TYLOPY_CACHE", "0")   # compile each one here, from this tree's source


def instructions(ptx: str) -> str:
    lines = (ln.split("//")[0].rstrip() for ln in ptx.splitlines())
    return "\n".join(ln for ln in lines if ln and not ln.lstrip().startswith((".loc", ".file")))


def _spec(t, dims, strides, box):
    from tylopy.runtime.tensormap import TensorMapSpec
    import torch
    return TensorMapSpec(t, tuple(dims), tuple(strides), tuple(box), "bf16" if t.dtype == torch.bfloat16 else "f16",
                         128)


def _dtypes(step, names):
    """The open tensor parameters' dtypes of a planned launch (``compile`` takes them by name)."""
    import torch
    import tylopy as ty
    table = {torch.float32: ty.f32, torch.int32: ty.i32, torch.uint8: ty.u8, torch.bfloat16: ty.bf16,
             torch.int64: ty.i64, torch.float16: ty.f16}
    params = list(inspect.signature(step.kernel.fn).parameters)
    return {n: table[step.args[params.index(n)].dtype] for n in names}


def dense_cases():
    """(name, kernel, constexprs) of the dense, varlen and FP8 kernels at their shipped schedules."""
    from tylopy_kernels.attention.sm90.backward import attention_bwd_sm90
    from tylopy_kernels.attention.sm90.backward_dq import attention_bwd_dq_sm90
    from tylopy_kernels.attention.sm90.backward_varlen import attention_bwd_varlen_sm90
    from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90
    from tylopy_kernels.attention.sm90.forward_fp8 import attention_fwd_fp8_sm90
    from tylopy_kernels.attention.sm90 import fp8_launch
    from tylopy_kernels.attention.sm90.varlen_forward import attention_varlen_fwd_sm90
    from tylopy_kernels.gemm.fp8 import fit_stages, gemm_fp8_sm90
    import tylopy as ty
    yield "fwd-d64", attention_fwd_sm90, dict(HEAD_DIM=64, CONSUMERS=3, EXPONENT="shared")
    yield "fwd-d128-persistent-lse", attention_fwd_sm90, dict(HEAD_DIM=128, CONSUMERS=2, PERSISTENT=True, ORDER="lpt",
                                                             RETURN_LSE=True)
    yield "fwd-d128-mask", attention_fwd_sm90, dict(HEAD_DIM=128, CONSUMERS=2, HAS_MASK=True)
    yield "fwd-d64-tma-store-split", attention_fwd_sm90, dict(HEAD_DIM=64, CONSUMERS=3, PERSISTENT=True,
                                                              TMA_STORE=True, SPLIT_S=True)
    yield "varlen-fwd-d128", attention_varlen_fwd_sm90, dict(HEAD_DIM=128, CONSUMERS=2, EXPONENT="ffma",
                                                              RETURN_LSE=True)
    yield "varlen-fwd-d64-persistent", attention_varlen_fwd_sm90, dict(HEAD_DIM=64, CONSUMERS=2, PERSISTENT=True,
                                                                        SEQUSED_Q=True)
    yield "bwd-d64", attention_bwd_sm90, dict(HEAD_DIM=64, BLOCK_M=128)
    yield "bwd-d128-mask-atomic", attention_bwd_sm90, dict(HEAD_DIM=128, BLOCK_M=64, HAS_MASK=True, DQ="atomic",
                                                           DQ_ORDER="serial")
    yield "bwd-dq-d128-mask", attention_bwd_dq_sm90, dict(HEAD_DIM=128, HAS_MASK=True)
    yield "varlen-bwd-d128", attention_bwd_varlen_sm90, dict(HEAD_DIM=128, BLOCK_M=64)
    for d, masked in ((128, True), (64, False)):
        yield (f"fp8-fwd-d{d}", attention_fwd_fp8_sm90,
               dict(fp8_launch.resolve_schedule(d, masked), HEAD_DIM=d, RETURN_LSE=True, HAS_MASK=masked))
    for n, cfg in ((256, dict(PROMOTE=False)), (128, dict(PROMOTE=True, SCALE="block", HAS_BIAS=True,
                                                          BIAS_DTYPE=ty.bf16))):
        yield (f"gemm-fp8-n{n}", gemm_fp8_sm90,
               dict(cfg, BLOCK_N=n, STAGES=fit_stages(n, "bf16", cfg["PROMOTE"])))


def gemm_cases():
    """(name, kernel, constexprs) of the bf16 GEMM's schedules and the cluster GEMM example."""
    from tylopy_kernels.examples import gemm_cluster as cluster
    from tylopy_kernels.gemm.hopper import gemm_sm90
    import tylopy as ty

    @ty.func
    def relu(x):
        return ty.maximum(x, 0.0)
    yield "gemm-cooperative-tma", gemm_sm90, dict()
    yield "gemm-pingpong-direct-mn", gemm_sm90, dict(SCHEDULE="pingpong", STORE="direct", A_MAJOR="m", B_MAJOR="k",
                                                     BLOCK_N=128)
    yield "gemm-splitk", gemm_sm90, dict(SPLIT_K=2, OUT_DTYPE=ty.f32, STORE="direct")
    yield "gemm-bias-epilogue", gemm_sm90, dict(HAS_BIAS=True, EPILOGUE=relu)
    yield "gemm-cluster2", cluster.gemm_kernel(2), dict(BLOCK_N=256, STAGES=cluster.stages_for(256, "tma"))


def variant_cases():
    """(name, kernel, constexprs) of the variant forward and backward, planned like a call."""
    import torch
    from tylopy_kernels.attention import variants as V
    from tylopy_kernels.attention.common import ForwardTensors, VariantCall
    from tylopy_kernels.attention.sm90.backward_variant_launch import BackwardTensors, plan_backward_variant
    from tylopy_kernels.attention.sm90.forward_variant import attention_variant_fwd_sm90
    from tylopy_kernels.attention.sm90.variant_launch import open_dtypes, plan_variant_launch
    kinds = {"alibi-sinks-softcap": dict(is_causal=True, alibi_slopes=torch.ones(2), sinks=torch.zeros(2), softcap=3.0),
             "window": dict(window_size=(64, 16)),
             "mods": dict(score_mod=lambda s, b, h, i, j: s * 0.5, mask_mod=lambda b, h, i, j: i >= j)}
    for d in (64, 128):
        q = torch.zeros(1, 2, 256, d, dtype=torch.bfloat16)
        lse = torch.zeros(1, 2, 256)
        for name, kw in kinds.items():
            variant, tensors = V.make_variant(1, 2, 256, 256, q.device, **kw)
            call = VariantCall(variant, tensors, 0.1)
            plan = plan_variant_launch(ForwardTensors(q, q, q, q.clone(), lse), call, make_map=_spec)
            yield f"variant-fwd-{name}-d{d}", attention_variant_fwd_sm90, dict(plan.constexprs, **open_dtypes(plan))
            io = BackwardTensors(q, q, q, q, q, lse, q.clone(), q.clone(), q.clone())
            for step in plan_backward_variant(io, call, encode=False):
                if "variant" in step.kernel.name:
                    yield (f"variant-bwd-{name}-d{d}", step.kernel,
                           dict(step.constexprs, **_dtypes(step, ("mask", "aux0", "aux1", "aux2", "aux3"))))


def snapshot(only=None) -> dict:
    warnings.filterwarnings("ignore")
    out = {}
    for cases in (dense_cases, variant_cases, gemm_cases):
        for name, kernel, cx in cases():
            if only and not any(o in name for o in only):
                continue
            out[name] = instructions(kernel.compile(**cx).ptx)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/ptx_snapshot.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("write", "compare"))
    ap.add_argument("folder")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only specializations whose name contains one of these")
    args = ap.parse_args(argv)
    now = snapshot(args.only)
    if args.mode == "write":
        os.makedirs(args.folder, exist_ok=True)
        for name, text in now.items():
            with open(os.path.join(args.folder, f"{name}.ptx"), "w") as f:
                f.write(text)
        print(f"wrote {len(now)} specializations to {args.folder}")
        return 0
    differ, missing = [], []
    for name, text in now.items():
        path = os.path.join(args.folder, f"{name}.ptx")
        if not os.path.exists(path):
            missing.append(name)
            continue
        with open(path) as f:
            before = f.read()
        if before != text:
            differ.append(name)
            diff = list(difflib.unified_diff(before.splitlines(), text.splitlines(), "before", "now", lineterm="", n=1))
            print(f"--- {name}: {sum(1 for d in diff if d[:1] in '+-') - 2} lines differ")
            print("\n".join(diff[2:14]))
    print(f"{len(now) - len(differ) - len(missing)} of {len(now)} the same" + (f"; differ: {', '.join(differ)}" if differ
          else "") + (f"; not in {args.folder}: {', '.join(missing)}" if missing else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
