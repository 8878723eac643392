"""FP8 conversion kernels and inputs shared by the CPU and GPU tests (tests/test_fp8_conversions*.py).

``convert_all`` takes every code of one format through every conversion the DSL offers, and a
list of f32 values through every conversion to fp8, so one launch on the GPU and one in the
emulator can be compared bit for bit.
"""
import numpy as np
import torch

import tylopy as ty

TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
DTYPE = {"e4m3": ty.e4m3, "e5m2": ty.e5m2}
N_VALUES = 2048  # f32 inputs of the rounding direction (8 per thread)


@ty.kernel(threads=256, arch="sm_90a")
def convert_all(codes: ty.ptr(ty.u8), values: ty.ptr(ty.f32), wide: ty.ptr(ty.f32), halves: ty.ptr(ty.u16),
                brains: ty.ptr(ty.u16), other: ty.ptr(ty.u8), rounded: ty.ptr(ty.u8), from_half: ty.ptr(ty.u8),
                packed2: ty.ptr(ty.u16), packed4: ty.ptr(ty.b32), unpacked: ty.ptr(ty.f32),
                FMT: ty.constexpr = ty.e4m3, OTHER: ty.constexpr = ty.e5m2):
    i = ty.thread_idx()
    x = ty.load(ty.ptr_cast(codes, FMT) + i)
    wide[i] = ty.cast(x, ty.f32)
    halves[i] = ty.bitcast(ty.cast(x, ty.f16), ty.u16)
    brains[i] = ty.bitcast(ty.cast(x, ty.bf16), ty.u16)
    ty.store(ty.ptr_cast(other, OTHER) + i, ty.cast(x, OTHER))
    for j in range(8):  # 2048 values, 8 per thread
        k = 256 * j + i
        v = values[k]
        ty.store(ty.ptr_cast(rounded, FMT) + k, ty.cast(v, FMT))
        ty.store(ty.ptr_cast(from_half, FMT) + k, ty.cast(ty.cast(v, ty.f16), FMT))
    base = 4 * i
    v0, v1, v2, v3 = values[base], values[base + 1], values[base + 2], values[base + 3]
    packed2[2 * i] = ty.pack_fp8x2(v0, v1, FMT)
    packed2[2 * i + 1] = ty.pack_fp8x2(v2, v3, FMT)
    word = ty.pack_fp8x4(v0, v1, v2, v3, FMT)
    packed4[i] = word
    u0, u1, u2, u3 = ty.unpack_fp8x4(word, FMT)
    w0, w1 = ty.unpack_fp8x2(packed2[2 * i + 1], FMT)
    ty.store(unpacked + 6 * i, (u0, u1))
    ty.store(unpacked + 6 * i + 2, (u2, u3))
    ty.store(unpacked + 6 * i + 4, (w0, w1))


def interesting_values(fmt: str, seed: int = 0) -> np.ndarray:
    """2048 f32: every code's value, the midpoints between neighbours (ties) and one f32 ulp either
    side, values past the largest finite, infinities, NaN, signed zeros, tiny subnormal inputs."""
    from tylopy.semantics.fp8 import fp8_to_f64
    rng = np.random.default_rng(seed)
    table = fp8_to_f64(np.arange(256), fmt)
    finite = np.unique(table[np.isfinite(table)])
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)
    vals = [finite.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
            np.nextafter(mids, np.float32(-np.inf)),
            np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, 2.0 ** -30, -2.0 ** -30, 3.4e38], np.float32)]
    top = finite.max()
    vals.append(np.array([top * 1.03, top * 1.0625, top * 1.07, top * 1.2, -top * 1.0625, -top * 1.5], np.float32))
    out = np.concatenate(vals).astype(np.float32)
    rest = N_VALUES - len(out)
    wild = (rng.standard_normal(rest) * 2.0 ** rng.integers(-24, 18, rest)).astype(np.float32)
    return np.concatenate([out, wild])[:N_VALUES]


def buffers(fmt: str, device: str = "cpu") -> dict:
    """The kernel's arguments, outputs NaN-/0xFF-filled so a missed store shows (u16 outputs as int16)."""
    vals = torch.from_numpy(interesting_values(fmt))
    return {"codes": torch.arange(256, dtype=torch.uint8), "values": vals,
            "wide": torch.full((256,), float("nan")), "halves": torch.full((256,), -1, dtype=torch.int16),
            "brains": torch.full((256,), -1, dtype=torch.int16), "other": torch.full((256,), 0xFF, dtype=torch.uint8),
            "rounded": torch.full((N_VALUES,), 0xFF, dtype=torch.uint8),
            "from_half": torch.full((N_VALUES,), 0xFF, dtype=torch.uint8),
            "packed2": torch.full((512,), -1, dtype=torch.int16), "packed4": torch.full((256,), -1, dtype=torch.int32),
            "unpacked": torch.full((6 * 256,), float("nan"))}


def run(fmt: str, device: str = "cpu") -> dict:
    """Launch (device "cuda") or emulate (device "cpu") ``convert_all``; the outputs as numpy."""
    b = buffers(fmt)
    args = {k: v.to(device) for k, v in b.items()}
    for k in ("halves", "brains", "packed2"):  # u16 outputs: int16 storage (CUDA has few uint16 kernels)
        args[k] = args[k].view(torch.uint16)
    order = ["codes", "values", "wide", "halves", "brains", "other", "rounded", "from_half", "packed2", "packed4",
             "unpacked"]
    call = [args[k] for k in order]
    other = "e5m2" if fmt == "e4m3" else "e4m3"
    if device == "cpu":
        convert_all.emulate(*call, grid=(1,), FMT=DTYPE[fmt], OTHER=DTYPE[other])
    else:
        convert_all[(1,)](*call, FMT=DTYPE[fmt], OTHER=DTYPE[other])
        torch.cuda.synchronize()
    out = {k: (c.view(torch.int16) if c.dtype == torch.uint16 else c).cpu() for k, c in zip(order, call)}
    res = {k: out[k].numpy() for k in ("wide", "other", "rounded", "from_half", "unpacked")}
    for k in ("halves", "brains", "packed2"):
        res[k] = out[k].view(torch.int16).numpy().view(np.uint16)
    res["packed4"] = out["packed4"].numpy().view(np.uint32)
    res["values"] = b["values"].numpy()
    return res


@ty.kernel(threads=32, arch="sm_90a")
def copy16(src: ty.tensor(ty.e4m3, 1), dst: ty.ptr(ty.e4m3), n: ty.i32):
    """16 codes per thread, one 16-byte load and store each (a float8 tensor parameter)."""
    i = ty.thread_idx()
    if 16 * i < n:
        vals = ty.load(src.ptr + 16 * i, vec=16)
        ty.store(dst + 16 * i, vals)


def mma_fp8_kernel(a_dt, b_dt, arch="sm_89"):
    """One mma.sync m16n8k32 fp8 tile: A (16 x 32) and B^T (8 x 32) row-major codes, C and D f32."""
    @ty.kernel(threads=32, arch=arch, name=f"mma_k32_{a_dt.name}_{b_dt.name}")
    def mma_k32(a: ty.ptr(ty.b32), bt: ty.ptr(ty.b32), c: ty.ptr(ty.f32), d: ty.ptr(ty.f32)):
        lane = ty.lane_id()
        g, t = lane >> 2, lane & 3
        atom = ty.MmaSyncAtom(a_dt, "m16n8k32", b_dtype=b_dt)
        # word r of A: row g + 8(r & 1), codes 4t + 16(r >> 1) .. + 3 (8 words per 32-code row)
        A = atom.a_fragment([a[(g + 8 * (r & 1)) * 8 + t + 4 * (r >> 1)] for r in range(4)])
        # word r of B: column g, k = 4t + 16 r .. + 3: four consecutive codes of row g of B^T
        B = atom.b_fragment([bt[g * 8 + t + 4 * r] for r in range(2)])
        C = atom.c_fragment([c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] for i in range(4)])
        D = ty.mma(atom, A, B, C)
        for i in range(4):
            d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = D.values[i]
    return mma_k32


def mma_fp8_inputs(a_fmt: str, b_fmt: str, seed: int = 0):
    rng = np.random.default_rng(seed)

    def codes(shape, fmt):
        top = 0x7E if fmt == "e4m3" else 0x7B
        return torch.from_numpy(rng.integers(0, top + 1, shape).astype(np.uint8)
                                | (rng.integers(0, 2, shape) << 7).astype(np.uint8)).view(TORCH_FP8[fmt])
    c = torch.from_numpy((rng.standard_normal((16, 8)) * 2.0 ** rng.integers(-4, 8, (16, 8))).astype(np.float32))
    return codes((16, 32), a_fmt), codes((8, 32), b_fmt), c


def words_of(t):
    return t.contiguous().view(torch.uint8).view(torch.int32).reshape(-1)  # b32 words: int32 storage
