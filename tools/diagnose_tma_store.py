"""Which property of a TMA store kernel makes the H200 raise an illegal instruction?

The f32 probe of tests/test_primitives_async_copy.py (static shared memory, no swizzle, a box at
x=30, y=30 hanging over both edges) raised CUDA_ERROR_ILLEGAL_INSTRUCTION while the GEMM's and the
attention's TMA stores run. Changing one property at a time showed that the box's position is
what matters: at x=0 every variant ran. The variants below test the rule the emulator now
enforces: the innermost start coordinate times the element size must be a multiple of 16 bytes
(x=30 f32 is 120 bytes, x=28 is 112). Each variant runs in its own process (an illegal
instruction ruins the CUDA context).

    python tools/diagnose_tma_store.py          # prints one line per variant
"""
import subprocess
import sys
import tempfile

VARIANTS = {
    "f32, x=30 (120 bytes), box over both edges": dict(dynamic=False, dtype="f32", swizzle=0, x=30, y=30),
    "f32, x=28 (112 bytes), box over both edges": dict(dynamic=False, dtype="f32", swizzle=0, x=28, y=30),
    "f32, dynamic smem, 128-byte swizzle, x=28, over both edges": dict(dynamic=True, dtype="f32", swizzle=128,
                                                                      x=28, y=30),
    "bf16, x=56 (112 bytes), over both edges": dict(dynamic=True, dtype="bf16", swizzle=0, x=56, y=30),
    "bf16, x=60 (120 bytes), over both edges": dict(dynamic=True, dtype="bf16", swizzle=0, x=60, y=30),
}

CHILD = r'''
import sys, torch, tylopy as ty
from tylopy import hopper
from tylopy.runtime.tensormap import TensorMap
dynamic, dtype, swizzle, x, y = {args}
T = ty.f32 if dtype == "f32" else ty.bf16
ROWS, COLS = 16, (32 if dtype == "f32" else 64)

@ty.kernel(threads=128, arch="sm_90a", name="tma_store_variant")
def k(dst: ty.tensormap, x: ty.i32, y: ty.i32, DYN: ty.constexpr):
    if DYN:
        tile = ty.dynamic_shared(T, ROWS * COLS * (4 if dtype == "f32" else 2), align=1024)
    else:
        tile = ty.shared(T, ROWS * COLS, align=128)
    tid = ty.thread_idx()
    for i in range(ROWS * COLS // 128):
        e = tid + 128 * i
        tile[e] = ty.cast(ty.cast(e, ty.f32) + 0.5, T)
    hopper.fence_proxy_async()
    ty.syncthreads()
    if tid == 0:
        hopper.tma_store(dst, tile, x, y)
        hopper.bulk_commit()
        hopper.bulk_wait(0, read=True)
    ty.syncthreads()

torch_dtype = torch.float32 if dtype == "f32" else torch.bfloat16
g = torch.full((40, 52 if dtype == "f32" else 112), 7.0, device="cuda", dtype=torch_dtype)
rows, cols = g.shape
tm = TensorMap.tiled(g, (cols, rows), (cols * g.element_size(),), (COLS, ROWS), dtype, swizzle=swizzle)
k[(1,)](tm, x, y, DYN=dynamic)
torch.cuda.synchronize()
print("ok", float(g[y, x]))
'''


def main():
    for name, v in VARIANTS.items():
        args = (v["dynamic"], v["dtype"], v["swizzle"], v["x"], v["y"])
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:  # kernels need a source file
            f.write(CHILD.replace("{args}", repr(args)))
        proc = subprocess.run([sys.executable, f.name], capture_output=True, text=True, timeout=120)
        out = (proc.stdout.strip().splitlines() or [""])[-1]
        err = [line for line in proc.stderr.splitlines() if "Error" in line or "error" in line][-1:]
        print(f"{name}: {out if proc.returncode == 0 else 'FAILED ' + ' '.join(err)[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
