"""Small attention launches for compute-sanitizer (memcheck, racecheck, synccheck):

    compute-sanitizer --tool memcheck python3 tools/sanitize_attention.py
"""
import torch

import tylopy


def main():
    torch.manual_seed(0)
    for (b, h, n_q, n_k, causal, masked) in [(1, 2, 200, 200, True, False), (2, 1, 129, 300, False, True),
                                             (1, 1, 64, 64, False, False)]:
        for d in (64, 32):
            q = torch.randn(b, h, n_q, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, h, n_k, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            mask = (torch.rand(n_q, n_k, device="cuda") > 0.3) if masked else None
            out = tylopy.attention(q, k, v, attn_mask=mask, is_causal=causal)
            torch.cuda.synchronize()
            print(f"ran b={b} h={h} n_q={n_q} n_k={n_k} d={d} causal={causal} masked={masked}: "
                  f"finite={bool(torch.isfinite(out).all())}", flush=True)


if __name__ == "__main__":
    main()
