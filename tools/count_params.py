"""List the functions that take more than 8 parameters, by package (read with ``ast``, nothing imported).

    python tools/count_params.py                      # tylopy/, tylopy_kernels/ and tools/
    python tools/count_params.py tylopy --max 8       # one tree, the default limit
    python tools/count_params.py --check tools/params_allowlist.txt
    python tools/count_params.py --write-allowlist tools/params_allowlist.txt   # regenerate it

The rule: no function takes more than 8 parameters, except kernel signatures (functions decorated
with ``@ty.kernel``, or a JIT of another library, Triton's ``@triton.jit`` and CuTe's ``@cute.jit``
in the benchmarks: their parameters are a kernel's arguments). ``@ty.func`` device helpers follow the
rule like host code: what travels together goes in a holder the kernel builds.
Counted: every named parameter (positional-only, positional, keyword-only, ``*args`` and
``**kwargs`` one each), less a method's ``self`` or ``cls``. Nested functions and lambdas count too,
named by their qualified name (``outer.<locals>.inner``, ``<lambda>`` at its line); of functions that
share a qualified name in one file (the ``_`` functions of ``register_fake``) the largest is listed.

``--check FILE`` compares with an allowlist (lines ``path::qualname count  # reason``, other lines
starting with ``#`` are comments): exit 1 when a function not on it is over the limit, one on it grew,
one on it is no longer over the limit (delete its line: the list only shrinks), or a line has no reason.

``--write-allowlist FILE`` rewrites the allowlist from the functions now over the limit: the header
comments and the reason of every entry still over the limit are kept, entries no longer over the
limit are dropped, and new ones get the reason ``--reason`` (default ``to split``); it prints what
changed, counts that grew included (the list should only shrink). Use it after a merge, then review
the added lines (a public API, an operator schema or a kernel-facing view deserves a real reason;
everything else stays "to split" until it is split).
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TREES = ("tylopy", "tylopy_kernels", "tools")
# ty.kernel (also imported bare, or called with options), and triton.jit / cute.jit (the other libraries'
# kernels and score functions the benchmarks compare with): their parameters are a kernel's arguments
KERNEL_DECORATORS = {"kernel", "jit"}


def _decorator_name(node) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _is_kernel(fn) -> bool:
    return any(_decorator_name(d) in KERNEL_DECORATORS for d in getattr(fn, "decorator_list", ()))


def count(fn, in_class: bool) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    n = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    is_static = any(_decorator_name(d) == "staticmethod" for d in getattr(fn, "decorator_list", ()))
    if in_class and names and names[0] in ("self", "cls") and not is_static:
        n -= 1
    return n


def functions(tree):
    """(qualified name, line, parameter count, is a kernel signature) of every function in ``tree``."""
    out = []

    def walk(node, prefix, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.", True)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                name = getattr(child, "name", f"<lambda>@{child.lineno}")
                out.append((prefix + name, child.lineno, count(child, in_class), _is_kernel(child)))
                walk(child, f"{prefix}{name}.<locals>.", False)
            else:
                walk(child, prefix, in_class)
    walk(tree, "", False)
    return out


def package_of(rel: str) -> str:
    parts = rel.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def over_limit(trees, limit: int = 8, root: str = ROOT) -> dict:
    """{"path::qualname": (count, line)} of the non-kernel functions with more than ``limit`` parameters."""
    found = {}
    for tree in trees:
        base = os.path.join(root, tree)
        files = [base] if base.endswith(".py") else [
            os.path.join(d, f) for d, _, fs in os.walk(base) for f in fs if f.endswith(".py")]
        for path in sorted(files):
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, encoding="utf-8") as fh:
                module = ast.parse(fh.read(), rel)
            for name, line, n, kernel in functions(module):
                key = f"{rel}::{name}"  # functions sharing a name (``_`` of register_fake): the largest
                if n > limit and not kernel and n > found.get(key, (0, 0))[0]:
                    found[key] = (n, line)
    return found


PLACEHOLDER_REASON = "to split"


def read_entries(path: str):
    """(header comment lines, {"path::qualname": (count, reason)}) of an allowlist file."""
    header, entries = [], {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            text, _, reason = line.partition("#")
            if not text.strip():
                if line.strip() and not entries:
                    header.append(line.rstrip("\n"))
                continue
            name, n = text.strip().rsplit(None, 1)
            entries[name] = (int(n), reason.strip())
    return header, entries


def read_allowlist(path: str) -> dict:
    """{"path::qualname": allowed count} of an allowlist file."""
    return {name: n for name, (n, _) in read_entries(path)[1].items()}


def missing_reasons(path: str) -> list:
    """The allowlist entries that give no reason (each line needs ``# why``)."""
    return [f"{name} on the allowlist gives no reason (add '  # why' to its line)"
            for name, (_, reason) in sorted(read_entries(path)[1].items()) if not reason]


def write_allowlist(path: str, found: dict, reason: str = PLACEHOLDER_REASON) -> list:
    """Rewrite the allowlist at ``path`` to list exactly ``found``, keeping its header and the reasons
    of the entries it already has; returns the changes, one line each."""
    header, old = read_entries(path) if os.path.exists(path) else ([], {})
    changes, lines = [], list(header)
    for name, (n, line) in sorted(found.items()):
        if name in old:
            if old[name][0] != n:
                changes.append(f"changed {name}: {old[name][0]} -> {n} parameters")
            lines.append(f"{name} {n}  # {old[name][1] or reason}")
        else:
            changes.append(f"added {name} {n} (line {line})  # {reason}")
            lines.append(f"{name} {n}  # {reason}")
    changes += [f"removed {name} (no longer over the limit)" for name in sorted(set(old) - set(found))]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return changes


def compare(found: dict, allowed: dict) -> list:
    """The problems of ``found`` against the allowlist (empty when it keeps the rule)."""
    problems = []
    for name, (n, line) in sorted(found.items()):
        if name not in allowed:
            problems.append(f"{name} (line {line}) takes {n} parameters; the limit is 8 outside kernel "
                            "signatures (group related ones into a dataclass)")
        elif n > allowed[name]:
            problems.append(f"{name} (line {line}) takes {n} parameters, {allowed[name]} on the allowlist")
    for name in sorted(set(allowed) - set(found)):
        problems.append(f"{name} is on the allowlist but no longer over the limit: delete its line")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="*", default=list(DEFAULT_TREES), help="folders or files, relative to the root")
    ap.add_argument("--max", type=int, default=8, help="the most parameters a function may take (8)")
    ap.add_argument("--check", metavar="ALLOWLIST", help="compare with an allowlist file")
    ap.add_argument("--write-allowlist", metavar="ALLOWLIST",
                    help="rewrite an allowlist file from the functions now over the limit, keeping its reasons")
    ap.add_argument("--reason", default=PLACEHOLDER_REASON,
                    help=f"the reason --write-allowlist gives new entries ({PLACEHOLDER_REASON!r})")
    args = ap.parse_args(argv)
    found = over_limit(args.trees, args.max)
    if args.write_allowlist:
        for change in write_allowlist(args.write_allowlist, found, args.reason):
            print(change)
        print(f"{args.write_allowlist}: {len(found)} entries")
        return 0
    by_package = defaultdict(list)
    for name, (n, line) in found.items():
        by_package[package_of(name.split("::")[0])].append((n, name, line))
    for pkg in sorted(by_package):
        rows = sorted(by_package[pkg], key=lambda r: (-r[0], r[1]))
        print(f"{pkg}: {len(rows)}")
        for n, name, line in rows:
            print(f"  {n:3d}  {name}  (line {line})")
    print(f"total: {len(found)} function(s) over {args.max} parameters (kernel signatures excluded)")
    if args.check:
        problems = compare(found, read_allowlist(args.check)) + missing_reasons(args.check)
        for p in problems:
            print("error:", p, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
