"""The IR as text: one op per line, regions indented (what ``tylopy dump --ir`` prints)."""
from __future__ import annotations

from .values import Block, KernelIR


def format_ir(kernel: KernelIR) -> str:
    """A readable listing of the IR, one op per line, regions indented."""
    params = ", ".join(f"%{p.value.id} {p.name}: {p.type}{' noalias' if p.noalias else ''}" for p in kernel.params)
    lines = [f"kernel {kernel.name}({params})"]
    lines.append(f"  // threads={kernel.launch.max_threads} arch={kernel.arch} "
                 f"dynamic_shared={kernel.dynamic_shared_bytes}")
    if kernel.constexprs:
        lines.append("  // " + ", ".join(f"{k}={v}" for k, v in kernel.constexprs))

    def fmt_block(block: Block, depth: int):
        pad = "  " * depth
        for op in block.ops:
            res = ", ".join(f"%{r.id}" for r in op.results)
            head = f"{res} = " if res else ""
            args = ", ".join(f"%{v.id}" for v in op.operands)
            attrs = ", ".join(f"{k}={v!r}" for k, v in op.attrs if k not in ("template",))
            attrs = f" {{{attrs}}}" if attrs else ""
            types = ", ".join(str(r.type) for r in op.results)
            loc = f"  // line {op.loc.lineno}" if op.loc else ""
            lines.append(f"{pad}{head}{op.opcode}({args}){attrs}{' : ' + types if types else ''}{loc}")
            for i, region in enumerate(op.regions):
                bargs = ", ".join(f"%{a.id}:{a.type}" for a in region.args)
                lines.append(f"{pad}  ^region{i}({bargs}):")
                fmt_block(region, depth + 2)

    fmt_block(kernel.body, 1)
    return "\n".join(lines)
