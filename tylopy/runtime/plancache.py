"""One bounded cache type for the per-call state launchers keep (checked signatures, launch plans,
schedules), and ``clear_caches()``, which empties every such cache at once.

A plan is what a launcher derives from a call's signature (shapes, strides, dtypes, device,
options) and may reuse for the next call of the same signature: which kernel, which schedule, a
prepared launch. Each ``PlanCache`` holds at most ``capacity`` plans and evicts the least recently
used. Plans must be correct for every call of their key; what else they depend on (a global a
kernel read, the environment) is checked by the plan's user through ``CompiledKernel.is_current()``
(docs/design.md, "Caches and invalidation").
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

_all: "weakref.WeakSet[PlanCache]" = weakref.WeakSet()
_clear_hooks: list = []  # other in-process caches (compiled kernels, tensor maps) to empty too


class PlanCache:
    """A least-recently-used mapping of bounded size; ``get`` refreshes an entry, ``put`` may evict."""

    def __init__(self, name: str, capacity: int = 256):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"PlanCache capacity expects a positive int, but got {capacity!r}")
        self.name, self.capacity = name, capacity
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        _all.add(self)

    def get(self, key, default=None):
        try:
            value = self._entries[key]
        except (KeyError, TypeError):  # a missing or unhashable key
            return default
        try:
            self._entries.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile
            pass
        return value

    def put(self, key, value) -> None:
        """Keep ``value`` under ``key``; an unhashable key keeps nothing (that call plans again)."""
        try:
            hash(key)
        except TypeError:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def get_held(self, key, held):
        """The value ``put_held`` kept under ``key`` with these very objects (by identity), or None. For
        keys made with ``identity_key``: an id is only unique while its object lives, so the entry holds
        the objects and a hit must find the same ones."""
        hit = self.get(key)
        if hit is None or len(hit[1]) != len(held) or any(a is not b for a, b in zip(hit[1], held)):
            return None
        return hit[0]

    def put_held(self, key, value, held) -> None:
        self.put(key, (value, tuple(held)))

    def pop(self, key, default=None):
        with self._lock:
            return self._entries.pop(key, default)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __repr__(self) -> str:
        return f"PlanCache({self.name!r}, {len(self)}/{self.capacity})"


def identity_key(objs) -> tuple:
    """A key part for objects that count by identity and, for tensors, version (an in-place write
    bumps it): use with ``PlanCache.get_held``/``put_held``, which keep the objects alive."""
    return tuple((id(o), getattr(o, "_version", 0)) for o in objs)


def on_clear(fn) -> None:
    """Have ``clear_caches()`` call ``fn()`` too (for caches that are not PlanCaches)."""
    _clear_hooks.append(fn)


def clear_caches() -> None:
    """Forget every plan, checked signature, tensor map and compiled specialization this process keeps
    (the disk cache of compiled kernels stays). The next call of each kernel plans again."""
    for cache in list(_all):
        cache.clear()
    for fn in list(_clear_hooks):
        fn()


def caches() -> list:
    """The live plan caches (name, size, capacity), for tools and tests."""
    return sorted(((c.name, len(c), c.capacity) for c in list(_all)), key=lambda x: x[0])
