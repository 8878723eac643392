"""The planted-bug harness (``tools/mutations.py``) stays in step with the kernels: every mutation's
text is still in the source it edits, and every test it runs still exists. A refactor that moves
the code a mutation plants its bug in would otherwise turn that mutation into "not applied" and the
harness would quietly check less. (Running the mutations takes minutes: ``python tools/mutations.py``.)"""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _harness():
    spec = importlib.util.spec_from_file_location("tylopy_mutations", os.path.join(ROOT, "tools", "mutations.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tylopy_mutations", module)  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


H = _harness()


@pytest.mark.parametrize("mut", H.MUTATIONS, ids=[m.id for m in H.MUTATIONS])
def test_every_mutation_applies_to_the_current_source(mut):
    files = H.read_sources([mut])
    texts = H.apply(mut, files)
    assert texts is not None, f"{mut.id}: an edit's text is no longer in {mut.files}: update the mutation"
    assert all(texts[rel] != files[rel] for rel in texts), f"{mut.id}: the edit changes nothing"


def test_every_mutation_names_existing_tests():
    import ast
    functions = {}  # test file -> the names of its functions, each file parsed once
    missing = []
    for mut in H.MUTATIONS:
        for test in mut.tests:
            path, _, name = test.partition("::")
            if path not in functions:
                with open(os.path.join(ROOT, path)) as f:
                    functions[path] = {n.name for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.FunctionDef)}
            if name.split("[")[0] not in functions[path]:
                missing.append(f"{mut.id}: {test}")
    assert not missing, missing
