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


def barrier(id: int, count: int | None, arrive: bool = False) -> tuple[str, str]:
    op = "bar.arrive" if arrive else "bar.sync"
    text = f"{op} {id};" if count is None else f"{op} {id}, {count};"
    return text, "~{memory}"


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


def wgmma(n: int, dtype: str, a_kind: str, trans_b: int, scale_a: int = 1, scale_b: int = 1) -> tuple[str, str]:
    """m64n{n}k16 f32 += {dtype} x {dtype}; SS takes desc_a, RS four b32 registers of A."""
    nacc = n // 2
    d = ", ".join(f"${i}" for i in range(nacc))
    base = 2 * nacc  # outputs then tied inputs
    if a_kind == "ss":
        a = f"${base}"
        nb = base + 1
        a_cons = "l"
    else:
        a = "{" + ", ".join(f"${base + i}" for i in range(4)) + "}"
        nb = base + 4
        a_cons = "r,r,r,r"
    b = f"${nb}"
    pred = f"${nb + 1}"
    ty = {"bf16": "bf16", "f16": "f16"}[dtype]
    if a_kind == "ss":
        tail = f"p, {scale_a}, {scale_b}, 0, {trans_b}"
    else:
        tail = f"p, {scale_a}, {scale_b}, {trans_b}"
    text = ("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, " + pred + ", 0;\n\t"
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{d}}}, {a}, {b}, {tail};\n\t}}")
    cons = ",".join(["=f"] * nacc + [str(i) for i in range(nacc)] + [a_cons, "l", "r"])
    return text, cons


def tma_load(rank: int) -> tuple[str, str]:
    coords = ", ".join(f"${3 + i}" for i in range(rank))
    text = (f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes "
            f"[$0], [$1, {{{coords}}}], [$2];")
    return text, ",".join(["r", "l", "r"] + ["r"] * rank + ["~{memory}"])


def mma_sync(dtype: str) -> tuple[str, str]:
    text = (f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32 "
            "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")
    return text, "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3"


def ldmatrix(num: int, trans: bool) -> tuple[str, str]:
    outs = ", ".join(f"${i}" for i in range(num))
    text = f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16 {{{outs}}}, [${num}];"
    return text, ",".join(["=r"] * num + ["r"])
