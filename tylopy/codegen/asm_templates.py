"""Inline-PTX templates for instructions LLVM has no intrinsic for (or whose intrinsic is unstable).

One table, op name to (template, constraints); templates use LLVM's ``$N`` operand syntax and
``{`` ``}`` scopes for predicates. Functions build the ones whose text depends on attributes.
"""
from __future__ import annotations

SIMPLE = {
    "cvt_bf16_f32": ("cvt.rn.bf16.f32 $0, $1;", "=h,f"),
    "cvt_f16x2": ("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f"),      # high half gets $2: operand order of PTX cvt
    "cvt_bf16x2": ("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f"),
    "mbarrier_init": ("mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}"),
    "mbarrier_arrive": ("mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}"),
    "mbarrier_arrive_expect_tx": ("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}"),
    "mbarrier_try_wait": ("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n\tselp.u32 $0, 1, 0, p;\n\t}",
                          "=r,r,r,~{memory}"),
    "fence_proxy_async": ("fence.proxy.async.shared::cta;", "~{memory}"),
    "fence_mbarrier_init": ("fence.mbarrier_init.release.cluster;", "~{memory}"),
    "prefetch_tensormap": ("prefetch.tensormap [$0];", "l,~{memory}"),
    "wgmma_fence": ("wgmma.fence.sync.aligned;", "~{memory}"),
    "wgmma_commit": ("wgmma.commit_group.sync.aligned;", "~{memory}"),
    "elect_one": ("{\n\t.reg .pred p;\n\telect.sync _|p, 0xffffffff;\n\tselp.u32 $0, 1, 0, p;\n\t}", "=r"),
}


def barrier(id, count: int | None, arrive: bool = False) -> tuple[str, str]:
    """bar.sync/bar.arrive; ``id`` None means a run-time id passed as operand $0."""
    op = "bar.arrive" if arrive else "bar.sync"
    ident = "$0" if id is None else str(id)
    text = f"{op} {ident};" if count is None else f"{op} {ident}, {count};"
    return text, ("r,~{memory}" if id is None else "~{memory}")


def setmaxnreg(n: int, inc: bool) -> tuple[str, str]:
    return f"setmaxnreg.{'inc' if inc else 'dec'}.sync.aligned.u32 {n};", "~{memory}"


def wgmma_wait(n: int, nvals: int, kinds: str) -> tuple[str, str]:
    """wait_group that ties every live accumulator through data flow (Triton's remedy)."""
    outs = ",".join(f"={k}" for k in kinds)
    ins = ",".join(str(i) for i in range(nvals))
    cons = ",".join(x for x in (outs, ins) if x)
    return f"wgmma.wait_group.sync.aligned {n};", (cons + ",~{memory}") if cons else "~{memory}"


def fence_operand(kinds: str) -> tuple[str, str]:
    outs = ",".join(f"={k}" for k in kinds)
    ins = ",".join(str(i) for i in range(len(kinds)))
    return "", f"{outs},{ins}"


FP8 = ("e4m3", "e5m2")


def wgmma(n: int, dtype: str, a_kind: str, trans_b: int, zero_init: bool = False, trans_a: int = 0,
          b_dtype: str | None = None, acc: str = "f32") -> tuple[str, str]:
    """m64n{n}k16 {acc} += {dtype} x {dtype}, or m64n{n}k32 for fp8 {dtype} x {b_dtype}; SS takes
    desc_a, RS four b32 registers of A.

    Operands: outputs d0..d(n/2-1) (f32; n/4 b32 words of f16 pairs with acc "f16"); unless
    zero_init, the same registers tied as inputs; then A, desc_b and the scale-d predicate as a
    b32 (zero_init writes the literal 0 instead). 8-bit operands take no transpose immediates.
    """
    fp8 = dtype in FP8
    b_dtype = b_dtype or dtype
    nacc = n // 4 if acc == "f16" else n // 2
    d = ", ".join(f"${i}" for i in range(nacc))
    base = nacc if zero_init else 2 * nacc
    if a_kind == "ss":
        a, nb, a_cons = f"${base}", base + 1, "l"
    else:
        a = "{" + ", ".join(f"${base + i}" for i in range(4)) + "}"
        nb, a_cons = base + 4, "r,r,r,r"
    b = f"${nb}"
    if fp8:
        trans = ""
    else:
        trans = (f", {int(trans_a)}" if a_kind == "ss" else "") + f", {trans_b}"
    if zero_init:
        head, scale = "", "0"
    else:
        head, scale = "\t.reg .pred p;\n\tsetp.ne.b32 p, $" + str(nb + 1) + ", 0;\n", "p"
    shape = f"m64n{n}k{32 if fp8 else 16}"
    text = ("{\n" + head + f"\twgmma.mma_async.sync.aligned.{shape}.{acc}.{dtype}.{b_dtype} "
            f"{{{d}}}, {a}, {b}, {scale}, 1, 1{trans};\n\t}}")
    ins = [] if zero_init else [str(i) for i in range(nacc)]
    tail = [a_cons, "l"] + ([] if zero_init else ["r"])
    return text, ",".join(["=" + ("r" if acc == "f16" else "f")] * nacc + ins + tail)


def tma_load(rank: int, multicast: bool = False) -> tuple[str, str]:
    """Operands: dst (u32 shared), the map's generic address, the mbarrier, the coordinates and, with
    ``multicast``, the 16-bit CTA mask (operand ``$3 + rank``, an ``h`` register)."""
    coords = ", ".join(f"${3 + i}" for i in range(rank))
    mc = ".multicast::cluster" if multicast else ""
    mask = f", ${3 + rank}" if multicast else ""
    text = (f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes{mc} "
            f"[$0], [$1, {{{coords}}}], [$2]{mask};")
    return text, ",".join(["r", "l", "r"] + ["r"] * rank + (["h"] if multicast else []) + ["~{memory}"])


def remote_mbarrier_arrive(scope: str, expect_tx: bool) -> tuple[str, str]:
    """mapa to the same offset in another CTA of the cluster, then a release arrive there at
    ``scope`` ("cluster" or "cta"). Operands: the barrier, [the bytes,] the CTA rank. ptxas 13.0
    precedes every ``.release.cluster`` arrive with MEMBAR.ALL.GPU (a GPU-scope fence that stalls
    the warp); ``.release.cta``, the PTX default, assembles to the bare arrive."""
    rank = "$2" if expect_tx else "$1"
    arrive = (f"mbarrier.arrive.expect_tx.release.{scope}.shared::cluster.b64 _, [remote], $1;" if expect_tx
              else f"mbarrier.arrive.release.{scope}.shared::cluster.b64 _, [remote];")
    return (f"{{\n\t.reg .b32 remote;\n\tmapa.shared::cluster.u32 remote, $0, {rank};\n\t{arrive}\n\t}}",
            "r,r,r,~{memory}" if expect_tx else "r,r,~{memory}")

