"""The package's shape: layers import only the layers below them, there are no import circles,
and the same kernel gives the same IR text and PTX on every trace, in every checkout.

The import graph is read from the source (every ``import`` statement, function-local ones
included, except those under ``if TYPE_CHECKING``), so a circle cannot hide behind a lazy import.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

import pytest

import tylopy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tylopy.__file__)))
PACKAGES = {"tylopy": os.path.join(ROOT, "tylopy"), "tylopy_kernels": os.path.join(ROOT, "tylopy_kernels")}

# The public functions built from the kernels: the one place tylopy names the kernels package above it.
# tylopy/__init__ imports them last, once the kernel language they import is complete, and they load
# only modules that import torch (test_torch_integration checks both orders of import at run time).
FACADE = ("tylopy.functions", "tylopy.distributed")

# What each layer may import (besides itself and the standard library / third-party packages).
ALLOWED = {
    "tylopy.errors": set(),
    "tylopy.ir": {"tylopy.errors"},
    "tylopy.semantics": {"tylopy.ir", "tylopy.errors"},
    "tylopy.codegen": {"tylopy.ir", "tylopy.errors"},
    "tylopy.runtime": {"tylopy.ir", "tylopy.errors"},
    "tylopy.emulate": {"tylopy.ir", "tylopy.semantics", "tylopy.errors"},
    "tylopy.language": {"tylopy.ir", "tylopy.semantics", "tylopy.codegen", "tylopy.runtime", "tylopy.errors"},
    "tylopy.jit": {"tylopy.language", "tylopy.ir", "tylopy.semantics", "tylopy.codegen", "tylopy.runtime",
                   "tylopy.emulate", "tylopy.errors"},
    "tylopy.tile": {"tylopy.language", "tylopy.ir", "tylopy.semantics", "tylopy.errors"},
    "tylopy.benchmarking": {"tylopy.runtime"},
    "tylopy._plugins": set(),
    "tylopy._logging": set(),
    "tylopy.testing": {"tylopy.runtime"},
    "tylopy.hopper": {"tylopy.language", "tylopy.tile"},
    "tylopy.cli": {"tylopy", "tylopy._plugins", "tylopy.language", "tylopy.jit", "tylopy.ir", "tylopy.codegen", "tylopy.emulate",
                   "tylopy.errors", "tylopy.runtime"},
}


def module_name(path: str) -> str:
    for top, folder in PACKAGES.items():
        if path.startswith(folder + os.sep):
            rel = os.path.relpath(path, folder)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel.pop()
            return ".".join([top, *rel])
    raise ValueError(path)


def _type_checking_lines(tree) -> set:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                for n in ast.walk(sub):
                    if hasattr(n, "lineno"):
                        lines.add(n.lineno)
    return lines


def imports_of(path: str, name: str) -> set[str]:
    """The modules of ours that ``path`` (module ``name``) imports anywhere in its body."""
    with open(path) as f:
        tree = ast.parse(f.read())
    skip = _type_checking_lines(tree)
    is_pkg = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            for a in node.names:  # `from . import x` imports the submodule x
                out.add(f"{mod}.{a.name}")
    return {m for m in out if m.split(".")[0] in PACKAGES}


def all_modules() -> dict[str, str]:
    mods = {}
    for top, folder in PACKAGES.items():
        for dirpath, _, files in os.walk(folder):
            for f in files:
                if f.endswith(".py"):
                    p = os.path.join(dirpath, f)
                    mods[module_name(p)] = p
    return mods


@pytest.fixture(scope="module")
def graph():
    mods = all_modules()
    g = {}
    for name, path in mods.items():
        deps = set()
        for m in imports_of(path, name):
            # `from pkg import name` may name an attribute, not a module: keep the longest module prefix.
            while m and m not in mods:
                m = m.rpartition(".")[0]
            if m and m != name:
                deps.add(m)
        g[name] = deps
    # The package's own import of its facade closes no circle that matters at run time (see FACADE);
    # every other edge, lazy ones included, must form a DAG.
    g["tylopy"] -= set(FACADE)
    return g


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def test_no_import_circles(graph):
    # A package imports its own __init__ when a submodule is imported; that edge is implicit in Python
    # and not a circle of ours. Everything else must form a DAG.
    index, low, stack, on, cycles = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w in _parents(v):
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    for v in graph:
        if v not in index:
            strong(v)
    assert not cycles, f"import circles: {cycles}"


def _layer(name: str) -> str | None:
    best = None
    for layer in ALLOWED:
        if name == layer or name.startswith(layer + "."):
            if best is None or len(layer) > len(best):
                best = layer
    return best


def test_layers_import_only_layers_below(graph):
    bad = []
    for name, deps in graph.items():
        layer = _layer(name)
        if layer is None or not name.startswith("tylopy"):
            continue
        for d in deps:
            dl = _layer(d)
            if d.startswith("tylopy_kernels") and name not in FACADE:
                bad.append(f"{name} -> {d} (tylopy never imports the kernels package)")
            elif dl is not None and dl != layer and dl not in ALLOWED[layer] and not (layer == "tylopy.cli"):
                bad.append(f"{name} -> {d}")
    assert not bad, "layering violations:\n" + "\n".join(sorted(bad))


def test_ir_imports_nothing_else_of_ours(graph):
    offenders = {n: sorted(d for d in deps if not (d.startswith("tylopy.ir") or d == "tylopy.errors"))
                 for n, deps in graph.items() if n.startswith("tylopy.ir")}
    assert not any(offenders.values()), offenders


def test_kernels_use_only_public_names():
    """Kernels import tylopy's public namespace, not its internals (launch helpers may use the runtime)."""
    internal = ("tylopy.language.proxy", "tylopy.language.builder", "tylopy.ir")
    bad = []
    for name, path in all_modules().items():
        if not name.startswith("tylopy_kernels"):
            continue
        with open(path) as f:
            src = f.read()
        for mod in internal:
            if f"from {mod}" in src or f"import {mod}" in src:
                bad.append(f"{name} imports {mod}")
        if "inline_ptx" in src:
            bad.append(f"{name} uses inline_ptx")
    assert not bad, bad


# -- determinism ---------------------------------------------------------------------------------------

def test_two_traces_print_identical_ir():
    from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90 as k
    assert k.trace().__class__.__name__ == "KernelIR"
    from tylopy.ir import format_ir
    assert format_ir(k.trace()) == format_ir(k.trace())


@pytest.mark.slow
def test_same_ptx_in_two_checkouts(tmp_path):
    """Copy the package to two folders and compile the same kernel in fresh interpreters: byte-identical PTX."""
    outs = []
    for n in ("one", "two"):
        dest = tmp_path / n / "checkout"
        shutil.copytree(os.path.join(ROOT, "tylopy"), dest / "tylopy", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(os.path.join(ROOT, "tylopy_kernels"), dest / "tylopy_kernels",
                        ignore=shutil.ignore_patterns("__pycache__"))
        code = ("from tylopy_kernels.examples.vector_add import vector_add; import sys; "
                "sys.stdout.write(vector_add.compile().ptx)")
        env = dict(os.environ, PYTHONPATH=str(dest), TYLOPY_CACHE="0")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(dest),
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert str(dest) not in proc.stdout
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
    assert '.file\t1 "vector_add.py"' in outs[0] or '.file 1 "vector_add.py"' in outs[0]


def test_no_test_module_imports_another():
    """Shared probes live in helper modules (emulate_probes, primitive_probes, ...) or conftest."""
    tests = os.path.join(ROOT, "tests")
    bad = []
    for f in sorted(os.listdir(tests)):
        if not f.endswith(".py"):
            continue
        with open(os.path.join(tests, f)) as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{f}:{node.lineno} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not bad, bad


def test_no_source_file_over_600_lines():
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    long = []
    for f in out.stdout.split():
        with open(os.path.join(ROOT, f)) as fh:
            n = sum(1 for _ in fh)
        if n > 600:
            long.append(f"{f} ({n} lines)")
    assert not long, long


def test_the_facade_is_imported_last():
    """tylopy/__init__ imports tylopy.functions and tylopy.distributed after every other statement,
    so a kernel module that imports tylopy first finds the whole kernel language."""
    with open(os.path.join(ROOT, "tylopy", "__init__.py")) as f:
        tree = ast.parse(f.read())
    facade_lines = [n.lineno for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1 and (
        n.module in ("functions", "distributed") or any(a.name in ("functions", "distributed") for a in n.names))]
    assert len(facade_lines) == 2
    assert all(n.lineno <= min(facade_lines) or n.lineno in facade_lines for n in tree.body), \
        "a statement follows the facade imports in tylopy/__init__.py"
