"""docs/environment.md lists every environment variable tylopy reads, and tylopy reads them only
through ``os.environ`` (or ``os.getenv``), never through a private mapping behind it."""
from __future__ import annotations

import ast
import os
import re

import tylopy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tylopy.__file__)))
SOURCES = ("tylopy", "tylopy_kernels")
TEST_SETUP = os.path.join(ROOT, "tests", "conftest.py")  # the test suite's own switches
DOC = os.path.join(ROOT, "docs", "environment.md")
TYLOPY_NAME = re.compile(r"\bTYLOPY_[A-Z0-9_]+\b")


def source_files():
    for top in SOURCES:
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            yield from (os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))


def _is_environ(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _literal(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def environment_reads(path: str) -> set[str]:
    """The variable names read with a literal key: os.environ.get("X"), os.environ["X"],
    "X" in os.environ, os.getenv("X"); plus every TYLOPY_* name the file spells (the option
    variables are read from a tuple of names)."""
    with open(path) as f:
        text = f.read()
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and node.args:
            fn = node.func
            if isinstance(fn, ast.Attribute) and ((fn.attr == "get" and _is_environ(fn.value)) or
                                                  (fn.attr == "getenv" and getattr(fn.value, "id", "") == "os")):
                names.add(_literal(node.args[0]))
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            names.add(_literal(node.slice))
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(_is_environ(c) for c in node.comparators):
            names.add(_literal(node.left))
    names.discard(None)
    return names | set(TYLOPY_NAME.findall(text))


def documented() -> set[str]:
    """The names in the first column of the tables (`NAME` or `NAME`, `OTHER`)."""
    with open(DOC) as f:
        rows = [line.split("|")[1] for line in f if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row)}


def test_every_variable_read_is_documented():
    missing = {}
    for path in [*source_files(), TEST_SETUP]:
        for name in environment_reads(path) - documented():
            missing.setdefault(name, os.path.relpath(path, ROOT))
    assert not missing, f"read but not listed in docs/environment.md: {missing}"


def test_every_documented_variable_is_read():
    read = set().union(*(environment_reads(p) for p in [*source_files(), TEST_SETUP]))
    assert documented(), "docs/environment.md has no variable table"
    assert not documented() - read, f"listed in docs/environment.md but read nowhere: {documented() - read}"


def test_the_reader_sees_every_form_of_read(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import os\na = os.environ.get("ALPHA")\nb = os.environ["BETA"]\nc = "GAMMA" in os.environ\n'
                     'd = os.getenv("DELTA", "1")\nos.environ["WRITTEN"] = "x"\n# TYLOPY_SPELLED\n')
    assert environment_reads(str(probe)) == {"ALPHA", "BETA", "GAMMA", "DELTA", "TYLOPY_SPELLED"}


def test_no_private_environment_mapping():
    """os.environ._data skips what a replaced or patched os.environ would answer."""
    offenders = [os.path.relpath(p, ROOT) for p in source_files() if re.search(r"environ\._data|\bencodekey\(",
                                                                               open(p).read())]
    assert not offenders, f"read the environment through os.environ, not its private mapping: {offenders}"


def test_option_variables_follow_os_environ(monkeypatch):
    """The per-launch snapshot sees a value set through os.environ at once."""
    from tylopy.jit.options import ENVIRONMENT, environment_snapshot
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    assert environment_snapshot() == (None,) * len(ENVIRONMENT)
    monkeypatch.setenv("TYLOPY_DEBUG", "1")
    assert environment_snapshot()[ENVIRONMENT.index("TYLOPY_DEBUG")] == "1"
