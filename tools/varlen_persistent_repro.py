"""The persistent packed (varlen) forward on a GPU, past the launcher's refusal: the reproduction of
the open problem that ``launch_varlen_hopper`` refuses ``schedule={"PERSISTENT": True}`` for.

    timeout 60 python3 tools/varlen_persistent_repro.py --consumers 3      # on an H100/H200

Not yet tried, to find which part of the persistent packed path the hang needs: one document
(``--lengths 4096``), ``--not-causal``, ``--schedule ORDER=heads`` (causal takes "lpt"), ``--d 128``,
two short documents at two heads (``--lengths 300 200 --heads 2``).

On an H200 this launch (D=64, 16 heads, the seven default documents of 0.7-4.2k tokens, three
consumers) did not finish within 40 s, nor did a benchmark's two-consumer launch over 32 heads of
0.5-1.5k-token documents, while the emulator runs the same launches (``plan_varlen_launch``, even
these documents over 132 CTAs) to the right numbers and the dense persistent kernel with three
consumers finishes. Run it under ``timeout``: a kernel that never finishes holds the GPU
until the process is killed. Prints the largest difference from SDPA per document when it finishes.
"""
import argparse
import math

import torch

from tylopy.benchmarking import parse_schedule
from tylopy_kernels.attention.common import ForwardTensors, PackedDocs
from tylopy_kernels.attention.sm90 import launch as dense
from tylopy_kernels.attention.sm90.launch import HopperOptions, MapTarget
from tylopy_kernels.attention.sm90.varlen_forward import attention_varlen_fwd_sm90
from tylopy_kernels.attention.sm90.varlen_launch import plan_varlen_launch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--lengths", type=int, nargs="+", default=[700, 1500, 3000, 900, 2000, 4096, 4188])
    ap.add_argument("--not-causal", action="store_true")
    ap.add_argument("--schedule", default="", help="further schedule keys, K=V,... (parse_schedule's form)")
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    total = sum(a.lengths)
    q, k, v = (torch.randn(total, a.heads, a.d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    cu = torch.tensor([0] + [sum(a.lengths[:i + 1]) for i in range(len(a.lengths))], dtype=torch.int32, device="cuda")
    out = torch.zeros_like(q)
    lse = torch.full((a.heads, total), float("-inf"), device="cuda")
    top = max(a.lengths)
    schedule = {"PERSISTENT": True, "CONSUMERS": a.consumers, **(parse_schedule(a.schedule) if a.schedule else {})}
    causal = not a.not_causal
    plan = plan_varlen_launch(ForwardTensors(q, k, v, out, lse), PackedDocs(cu, cu, top, top),
                              HopperOptions(1 / math.sqrt(a.d), causal, schedule),
                              MapTarget(dense.device_map, dense.sm_count(q.device)))
    print(f"grid {plan.grid}, {plan.constexprs['ORDER']} order, causal={causal}, {schedule}; launching", flush=True)
    attention_varlen_fwd_sm90[plan.grid](*plan.args, **plan.constexprs)
    torch.cuda.synchronize()
    worst = 0.0
    for i, n in enumerate(a.lengths):
        s = slice(sum(a.lengths[:i]), sum(a.lengths[:i]) + n)
        want = torch.nn.functional.scaled_dot_product_attention(
            *(t[s].transpose(0, 1).float() for t in (q, k, v)), is_causal=causal).transpose(0, 1)
        worst = max(worst, (out[s].float() - want).abs().max().item())
    print(f"finished; largest difference from SDPA {worst:.3e}", flush=True)


if __name__ == "__main__":
    main()
