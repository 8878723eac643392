"""Global and shared memory as bytes, with bounds, alignment, race and proxy bookkeeping.

Global memory: every tensor argument's storage gets a fake device base address (a multiple
of 2**40), so a pointer is ``base + byte offset`` and a load or store maps back to the numpy
view of the torch storage (or numpy array) that the caller passed; writes land in it. Each
argument is a region ``[address, address + extent)``; an access outside every region is an
error naming the nearest argument.

Shared memory (``shared.py``) is laid out here: static allocations first, each at its
alignment, then the dynamic window at its own.
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryAccessError, where

GLOBAL_BASE_SHIFT = 40


def gather(buf: np.ndarray, offs: np.ndarray, dtype: np.dtype, vec: int) -> np.ndarray:
    """``vec`` consecutive ``dtype`` elements at each byte offset: shape (len(offs), vec)."""
    nb = dtype.itemsize * vec
    bi = offs.astype(np.int64)[:, None] + np.arange(nb, dtype=np.int64)
    return np.ascontiguousarray(buf[bi]).view(dtype).reshape(len(offs), vec)


def scatter(buf: np.ndarray, offs: np.ndarray, values: np.ndarray, dtype: np.dtype) -> None:
    """Write rows of ``values`` (shape (n, vec) of ``dtype``) at each byte offset."""
    vals = np.ascontiguousarray(values, dtype=dtype)
    n, vec = vals.shape
    nb = dtype.itemsize * vec
    bi = offs.astype(np.int64)[:, None] + np.arange(nb, dtype=np.int64)
    buf[bi] = vals.view(np.uint8).reshape(n, nb)


# -- global memory ------------------------------------------------------------------------------------

class Region:
    __slots__ = ("name", "base", "size", "buf", "what")

    def __init__(self, name, base, size, buf, what):
        self.name, self.base, self.size, self.buf, self.what = name, base, size, buf, what


def _torch_bytes(t):
    """(uint8 numpy view of the whole storage, storage key, byte offset of t, extent of t in bytes)."""
    import torch
    if t.device.type != "cpu":
        raise ValueError(f"expects a CPU tensor, but got one on {t.device}")
    s = t.untyped_storage()
    raw = torch.empty(0, dtype=torch.uint8).set_(s, 0, (s.nbytes(),), (1,)).numpy()
    es = t.element_size()
    extent = 0 if t.numel() == 0 else (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * es
    return raw, ("torch", s.data_ptr()), t.storage_offset() * es, extent


def _numpy_bytes(a: np.ndarray):
    if not a.flags.c_contiguous:
        raise ValueError("expects a C-contiguous numpy array (pass np.ascontiguousarray(x))")
    raw = a.reshape(-1).view(np.uint8)
    return raw, ("numpy", a.__array_interface__["data"][0]), 0, a.nbytes


class GlobalMemory:
    """Fake device addresses over the callers' buffers."""

    def __init__(self):
        self.regions: list[Region] = []
        self._bases: dict = {}  # storage key -> fake base
        self._storages: dict = {}  # storage key -> uint8 view
        self._sorted = None

    def _storage_base(self, key, raw) -> int:
        if key not in self._bases:
            self._bases[key] = (len(self._bases) + 1) << GLOBAL_BASE_SHIFT
            self._storages[key] = raw
        return self._bases[key]

    def add(self, name: str, x) -> int:
        """Register an argument (torch tensor or numpy array); returns its device address."""
        if isinstance(x, np.ndarray):
            raw, key, off, extent = _numpy_bytes(x)
            what = f"{x.size} x {x.dtype}"
        else:
            raw, key, off, extent = _torch_bytes(x)
            what = f"{x.numel()} x {str(x.dtype).replace('torch.', '')}"
        base = self._storage_base(key, raw)
        self.regions.append(Region(name, base + off, extent, raw[off:off + extent], what))
        self._sorted = None
        return base + off

    def storage_of(self, t):
        """(uint8 view of t's whole storage, device address of t's first element) for TMA."""
        raw, key, off, _ = _torch_bytes(t) if not isinstance(t, np.ndarray) else _numpy_bytes(t)
        return raw, self._storage_base(key, raw) + off

    def _index(self):
        if self._sorted is None:
            order = sorted(range(len(self.regions)), key=lambda i: self.regions[i].base)
            self._sorted = ([self.regions[i] for i in order],
                            np.array([self.regions[i].base for i in order], dtype=np.uint64))
        return self._sorted

    def locate(self, addrs: np.ndarray, nbytes: int):
        """The region holding every address (fast path), or None; plus per-lane checks."""
        regs, bases = self._index()
        if not regs:
            return None, None
        k = np.searchsorted(bases, addrs, side="right") - 1
        if k.size and k.min() == k.max() and k[0] >= 0:
            r = regs[int(k[0])]
            off = (addrs - np.uint64(r.base)).astype(np.int64)
            if (off + nbytes <= r.size).all():
                return r, off
        return None, k

    def describe(self, addr: int) -> str:
        regs, bases = self._index()
        best = None
        for r in regs:
            if r.base <= addr:
                best = r
        if best is None:
            return f"address {addr:#x}, below every argument"
        off = addr - best.base
        return f"{best.name}+{off} bytes ({best.name!r} spans {best.size} bytes, {best.what})"

    def _slow(self, addrs, nbytes):
        """Per-lane lookup when lanes touch several regions; returns list of (region, off) or raises."""
        out = []
        for a in addrs.tolist():
            hit = next((r for r in self.regions if r.base <= a and a + nbytes <= r.base + r.size), None)
            out.append((hit, a - hit.base if hit else None))
        return out

    def access(self, addrs: np.ndarray, nbytes: int, op, who: str, verb: str, lanes: np.ndarray):
        """Bounds-check; returns list of (region, offsets, lane positions)."""
        r, off = self.locate(addrs, nbytes)
        if r is not None:
            return [(r, off, slice(None))]
        groups: dict[int, list] = {}
        for i, (hit, o) in enumerate(self._slow(addrs, nbytes)):
            if hit is None:
                a = int(addrs[i])
                raise MemoryAccessError(
                    f"global {verb} out of bounds at {where(op)}: lane {int(lanes[i])} of {who.describe()} {verb}s "
                    f"{nbytes} bytes at {self.describe(a)}")
            groups.setdefault(id(hit), [hit, [], []])
            groups[id(hit)][1].append(o)
            groups[id(hit)][2].append(i)
        return [(g[0], np.array(g[1], dtype=np.int64), np.array(g[2])) for g in groups.values()]

    def load(self, addrs, dtype, vec, op, who, lanes) -> np.ndarray:
        nb = dtype.itemsize * vec
        out = np.zeros((len(addrs), vec), dtype=dtype)
        for r, off, pos in self.access(addrs, nb, op, who, "read", lanes):
            out[pos] = gather(r.buf, off, dtype, vec)
        return out

    def store(self, addrs, values, dtype, op, who, lanes) -> None:
        nb = dtype.itemsize * values.shape[1]
        for r, off, pos in self.access(addrs, nb, op, who, "write", lanes):
            scatter(r.buf, off, values[pos], dtype)


# -- shared memory -------------------------------------------------------------------------------------

def shared_layout(kir) -> tuple[dict, int, int, list]:
    """Offsets of the static allocations, the dynamic window's offset, total bytes, and names."""
    offs, names, cur = {}, [], 0
    for a in kir.shared:
        cur = -(-cur // a.align) * a.align
        offs[a.name] = cur
        names.append((cur, cur + a.nbytes, a.name))
        cur += a.nbytes
    dyn = -(-cur // max(kir.dynamic_shared_align, 1)) * max(kir.dynamic_shared_align, 1)
    total = dyn + kir.dynamic_shared_bytes
    if kir.dynamic_shared_bytes:
        names.append((dyn, total, "dynamic_smem"))
    return offs, dyn, total, names
