"""Type rules of Hopper's asynchronous machinery: mbarriers, TMA, proxy fences, setmaxnreg, wgmma."""
from __future__ import annotations

from ..types import PointerType, TensorMapType, b32, f32, i1, i32, u32, u64
from .base import expect, none, passthrough

def _mbar(n, result=()):
    def rule(ts, attrs):
        expect(len(ts) == n, f"expects {n} operands, but got {len(ts)}")
        expect(isinstance(ts[0], PointerType) and ts[0].space == "shared" and ts[0].pointee == u64,
                f"mbarrier expects a ptr<u64, shared>, but got {ts[0]}")
        for t in ts[1:]:
            expect(t in (i32, u32), f"mbarrier operand expects i32, but got {t}")
        return result
    return rule


def _tma_load(ts, attrs):
    rank = attrs["rank"]
    if attrs.get("multicast"):
        expect(len(ts) == 4 + rank and ts[-1] in (i32, u32),
               f"tma_load multicast expects (dst, tensormap, mbarrier, {rank} coordinates, i32 CTA mask)")
        ts = ts[:-1]
    expect(len(ts) == 3 + rank, f"tma_load expects (dst, tensormap, mbarrier, {rank} coordinates)")
    expect(isinstance(ts[0], PointerType) and ts[0].space == "shared", f"tma_load destination expects shared memory, but got {ts[0]}")
    expect(isinstance(ts[1], TensorMapType), f"tma_load expects a tensormap, but got {ts[1]}")
    expect(isinstance(ts[2], PointerType) and ts[2].pointee == u64, f"tma_load expects an mbarrier ptr<u64, shared>, but got {ts[2]}")
    for t in ts[3:]:
        expect(t == i32, f"tma_load coordinates expect i32, but got {t}")
    return ()


FP8 = ("e4m3", "e5m2")


def _wgmma_types(attrs) -> tuple:
    """(k, accumulator register type, accumulator count) of a wgmma's attributes, checked."""
    n, a, b = attrs["n"], attrs["dtype"], attrs.get("b_dtype", attrs["dtype"])
    acc = attrs.get("acc", "f32")
    expect(a in ("bf16", "f16") + FP8, f"wgmma dtype expects bf16, f16, e4m3 or e5m2, but got {a!r}")
    expect(b == a or (a in FP8 and b in FP8), f"wgmma b_dtype expects {'e4m3 or e5m2' if a in FP8 else a} with "
                                             f"dtype {a}, but got {b!r}")
    expect(acc == "f32" or (acc == "f16" and a != "bf16"), f"wgmma acc expects f32 (or f16 for f16/fp8 inputs), "
                                                           f"but got {acc!r} with dtype {a}")
    if a in FP8:
        expect(not attrs.get("trans_a") and not attrs.get("trans_b"),
               "wgmma with 8-bit operands expects trans_a=0 and trans_b=0 (K-major only)")
    return (32 if a in FP8 else 16), (b32 if acc == "f16" else f32), (n // 4 if acc == "f16" else n // 2)


def _wgmma(ts, attrs):
    """Operands: [accumulators unless zero_init], A (desc u64 or 4 b32), desc_b u64, [scale_d i1].

    Accumulators: n/2 f32, or n/4 b32 (packed f16 pairs) with ``acc`` "f16"."""
    n = attrs["n"]
    kind = attrs["a_kind"]
    expect(kind in ("ss", "rs"), f"wgmma a_kind expects 'ss' or 'rs', but got {kind!r}")
    expect(n % 8 == 0 and 8 <= n <= 256, f"wgmma N expects a multiple of 8 in 8..256, but got {n}")
    kk, acc_t, nacc = _wgmma_types(attrs)
    zero = attrs.get("zero_init", False)
    na = 4 if kind == "rs" else 1
    want = (0 if zero else nacc) + na + 1 + (0 if zero else 1)
    expect(len(ts) == want, f"wgmma m64n{n}k{kk} ({kind}{', zero_init' if zero else ''}) expects {want} operands, "
                             f"but got {len(ts)}")
    k = 0
    if not zero:
        expect(all(t == acc_t for t in ts[:nacc]), f"wgmma accumulators expect {acc_t}")
        k = nacc
    if kind == "rs":
        expect(all(t == b32 for t in ts[k:k + 4]), "wgmma register A expects four b32 words")
    else:
        expect(ts[k] == u64, f"wgmma desc_a expects u64, but got {ts[k]}")
    expect(ts[k + na] == u64, f"wgmma desc_b expects u64, but got {ts[k + na]}")
    if not zero:
        expect(ts[-1] == i1, f"wgmma scale_d expects i1, but got {ts[-1]}")
    return (acc_t,) * nacc




RULES = {
    "mbarrier_init": _mbar(2), "mbarrier_arrive": _mbar(1), "mbarrier_arrive_cluster": _mbar(2),
    "mbarrier_arrive_expect_tx_cluster": _mbar(3), "mbarrier_arrive_expect_tx": _mbar(2),
    "mbarrier_try_wait": _mbar(2, (i1,)), "fence_proxy_async": none(0), "fence_mbarrier_init": none(0),
    "tma_load": _tma_load, "prefetch_tensormap": none(1), "setmaxnreg": none(0),
    "wgmma_fence": none(0), "wgmma_commit": none(0), "wgmma_wait": passthrough, "wgmma": _wgmma,
    "fence_operand": passthrough, "elect_one": lambda ts, attrs: (i1,),
}
SIDE_EFFECTS = frozenset({
    "mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_cluster", "mbarrier_arrive_expect_tx_cluster", "mbarrier_arrive_expect_tx", "mbarrier_try_wait", "fence_proxy_async",
    "fence_mbarrier_init", "tma_load", "prefetch_tensormap", "setmaxnreg", "wgmma_fence", "wgmma_commit",
    "wgmma_wait", "wgmma", "fence_operand",
})
