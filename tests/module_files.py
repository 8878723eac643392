"""Kernel modules written to files and imported for tests of what the compile cache keys on.

``import_file`` writes a module's text into a new folder and imports it under a fixed name (a
fresh module object, as another process would have); ``f32_hex`` is a float as PTX writes it.
This module has no tests of its own.
"""
from __future__ import annotations

import importlib
import itertools
import struct
import sys
import textwrap

_folders = itertools.count()


def f32_hex(v: float) -> str:
    return "0f" + struct.pack(">f", v).hex().upper()


def write_module(tmp_path, text: str, name: str):
    """Write ``text`` as ``name``.py in a new folder under ``tmp_path``; returns the file's path."""
    folder = tmp_path / f"m{next(_folders)}"
    folder.mkdir()
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return path


def import_path(path, name: str):
    """Import the file ``path`` as the module ``name`` (replacing one imported before)."""
    sys.modules.pop(name, None)
    sys.path.insert(0, str(path.parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(path.parent))


def import_file(tmp_path, text: str, name: str):
    return import_path(write_module(tmp_path, text, name), name)
