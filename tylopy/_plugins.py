"""What packages built on tylopy add to its command line: checks and benchmarks.

A package declares them as entry points::

    [project.entry-points."tylopy.checks"]        # tylopy check <name>: main(argv) -> exit status
    [project.entry-points."tylopy.benchmarks"]    # tylopy bench <name>: main(argv) -> exit status

tylopy loads an entry on first use (``tylopy check``/``tylopy bench`` name the installed ones
when asked for a missing one). The functions themselves (``ty.attention``, ...) are plain
modules (``tylopy/functions.py``), found without installed metadata.
"""
from __future__ import annotations

import functools
from importlib import metadata

CHECKS, BENCHMARKS = "tylopy.checks", "tylopy.benchmarks"


@functools.lru_cache(maxsize=None)
def _entry_points(group: str) -> dict:
    try:
        eps = metadata.entry_points(group=group)
    except Exception:  # noqa: BLE001 - broken metadata of some other package must not break tylopy
        return {}
    return {ep.name: ep for ep in eps}


def names(group: str) -> list[str]:
    return sorted(_entry_points(group))


_loaded: dict = {}


def load(group: str, name: str):
    """The object registered as ``name`` in ``group``, loaded on first use; None when there is none."""
    key = (group, name)
    if key in _loaded:
        return _loaded[key]
    ep = _entry_points(group).get(name)
    if ep is None:
        return None
    value = _loaded[key] = ep.load()
    return value
