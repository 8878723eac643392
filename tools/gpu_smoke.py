"""First-contact GPU check: each case prints one line; a hang kills the process (faulthandler)
after --timeout seconds with the case named, so one bad case cannot eat the device lease."""
from __future__ import annotations

import argparse
import faulthandler
import math
import sys
import time

import torch


def ref_attention(q, k, v, mask=None, causal=False, scale=None):
    qd, kd, vd = q.double(), k.double(), v.double()
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (qd @ kd.transpose(-1, -2)) * scale
    n_q, n_k = s.shape[-2:]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        allowed = torch.tril(allowed)
    if mask is not None:
        allowed = allowed & mask
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    o = (p @ vd) / torch.where(l == 0, torch.ones_like(l), l)
    lse = torch.where(l.squeeze(-1) == 0, torch.full_like(l.squeeze(-1), float("-inf")), m.squeeze(-1) + torch.log(l.squeeze(-1)))
    return o, lse


def case(name, fn):
    t0 = time.time()
    try:
        msg = fn()
        torch.cuda.synchronize()
        print(f"PASS {name}: {msg} ({time.time() - t0:.1f}s)", flush=True)
        return True
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    import tylopy
    from tylopy_kernels.examples import vector_add

    def vadd():
        x = torch.randn(1_000_003, device="cuda")
        y = torch.randn_like(x)
        out = vector_add.add(x, y)
        return f"max err {(out - (x + y)).abs().max().item():.2e}"

    case("vector_add", vadd)

    def attn(shape, dtype=torch.bfloat16, causal=False, masked=False, lse=False, scale_inputs=1.0):
        B, H, n_q, n_k = shape

        def run():
            q = torch.randn(B, H, n_q, 64, device="cuda", dtype=dtype) * scale_inputs
            k = torch.randn(B, H, n_k, 64, device="cuda", dtype=dtype) * scale_inputs
            v = torch.randn(B, H, n_k, 64, device="cuda", dtype=dtype)
            mask = None
            if masked:
                mask = torch.rand(n_q, n_k, device="cuda") > 0.3
                mask[0] = False
            res = tylopy.attention(q, k, v, attn_mask=mask, is_causal=causal, return_lse=lse)
            o = res[0] if lse else res
            ro, rl = ref_attention(q, k, v, mask, causal)
            ref_same = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
            err = (o.double() - ro).abs().max().item()
            err_t = (ref_same.double() - ro).abs().nan_to_num(0).max().item()
            ok = err <= 2 * err_t + 1e-3 and torch.isfinite(o).all().item()
            out = f"err {err:.3e} (sdpa {err_t:.3e})"
            if lse:
                lerr = (res[1].double() - rl).abs().nan_to_num(0).max().item()
                out += f" lse err {lerr:.2e}"
            if not ok:
                raise AssertionError(out)
            return out
        return run

    torch.manual_seed(0)
    for spec in [(1, 1, 128, 128), (1, 1, 64, 128), (1, 1, 17, 17), (1, 1, 1, 239), (1, 1, 239, 1),
                 (2, 3, 113, 203), (1, 2, 1023, 1024), (9, 6, 129, 127), (2, 2, 2048, 2048)]:
        case(f"attn {spec}", attn(spec))
    case("attn causal 256", attn((1, 2, 256, 256), causal=True))
    case("attn causal 1000", attn((2, 2, 1000, 1000), causal=True))
    case("attn fp16", attn((1, 2, 300, 300), dtype=torch.float16))
    case("attn lse", attn((1, 2, 200, 333), lse=True))
    case("attn masked", attn((1, 2, 200, 333), masked=True, lse=True))
    case("attn big logits", attn((1, 1, 256, 256), scale_inputs=30.0))
    case("attn many tiles per CTA", attn((16, 32, 512, 512)))
    case("attn many tiles per CTA causal", attn((16, 32, 640, 640), causal=True, lse=True))
    case("attn many tiles masked", attn((4, 32, 700, 900), masked=True))

    def bench():
        from triton.testing import do_bench
        lines = []
        for n, causal in [(4096, False), (4096, True), (16384, False)]:
            B, H = 16384 // n, 32
            q = torch.randn(B, H, n, 64, device="cuda", dtype=torch.bfloat16)
            k, v = torch.randn_like(q), torch.randn_like(q)
            flops = 4 * B * H * n * n * 64 / (2 if causal else 1)
            t = do_bench(lambda: tylopy.attention(q, k, v, is_causal=causal), warmup=50, rep=200, return_mode="median")
            t2 = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
                          warmup=50, rep=200, return_mode="median")
            lines.append(f"N={n} causal={causal}: tylopy {flops / t / 1e9:.0f} TFLOP/s, sdpa {flops / t2 / 1e9:.0f}")
        return "; ".join(lines)

    case("bench", bench)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    sys.exit(main())
