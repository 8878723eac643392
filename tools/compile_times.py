"""Cold compile (trace + LLVM + PTX + ptxas) and warm start (disk cache) of the example kernels.

Each measurement runs in a fresh process so nothing is cached in memory; the cold run uses an
empty cache directory, the warm run the directory the cold run filled. Prints a markdown table.
"""
import os
import subprocess
import sys
import tempfile

KERNELS = [
    ("vector_add", "tylopy_kernels.examples.vector_add", "vector_add", {}),
    ("row_softmax", "tylopy_kernels.softmax.row", "row_softmax", {}),
    ("attention_fwd_sm90", "tylopy_kernels.attention.sm90.forward", "attention_fwd_sm90", {}),
]

PROBE = """
import time, importlib
t0 = time.perf_counter()
import tylopy
t1 = time.perf_counter()
mod = importlib.import_module({module!r})
kernel = getattr(mod, {name!r})
t2 = time.perf_counter()
ck = kernel.compile(**{cx!r})
t3 = time.perf_counter()
print(f"{{t1 - t0:.3f}} {{t3 - t2:.3f}} {{ck.from_cache}}")
"""


def main():
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TYLOPY_CACHE_DIR=cache)
        for label, module, name, cx in KERNELS:
            probe = PROBE.format(module=module, name=name, cx=cx)
            out = {}
            for phase in ("cold", "warm"):
                res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
                if res.returncode:
                    print(res.stderr, file=sys.stderr)
                    return 1
                imp, comp, hit = res.stdout.split()
                out[phase] = (float(imp), float(comp), hit)
            rows.append((label, out))
    print("| kernel | import tylopy (s) | cold compile (s) | warm from disk (s) |")
    print("|---|---|---|---|")
    for label, out in rows:
        print(f"| {label} | {out['cold'][0]:.2f} | {out['cold'][1]:.2f} | {out['warm'][1]:.3f} (hit={out['warm'][2]}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
