"""Global and shared memory as bytes, with bounds, alignment, race and proxy bookkeeping.

Global memory: every tensor argument's storage gets a fake device base address (a multiple
of 2**40), so a pointer is ``base + byte offset`` and a load or store maps back to the numpy
view of the torch storage (or numpy array) that the caller passed; writes land in it. Each
argument is a region ``[address, address + extent)`` covering its elements' span; an access
outside every region is an error naming the nearest argument. For a non-contiguous view the
bytes inside the span that belong to no element of the view (the gaps of a slice) are out of
bounds too.

Global write races: with race checks on, every plain store records, per byte of the storage,
which CTA and warp wrote it last and when; a second write by another CTA (CTAs cannot order
their plain writes to each other), or by another warp of the same CTA with nothing ordering
the two, is a ``ProtocolError``. Atomics and reductions are exempt.

Shared memory (``shared.py``) is laid out here: static allocations first, each at its
alignment, then the dynamic window at its own.
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryAccessError, ProtocolError, where

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
    __slots__ = ("name", "base", "size", "buf", "what", "key", "soff", "inview")

    def __init__(self, name, base, size, buf, what, key=None, soff=0, inview=None):
        self.name, self.base, self.size, self.buf, self.what = name, base, size, buf, what
        self.key, self.soff = key, soff  # the storage and the region's byte offset in it
        self.inview = inview  # bool per byte of the span: part of an element of the view (None: all are)


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


def _view_bytes(t, extent: int):
    """Which bytes of a tensor's span belong to its elements (None when all do)."""
    import torch
    es = t.element_size()
    if t.numel() == 0 or t.numel() * es == extent:
        return None
    elems = torch.as_strided(torch.arange(extent // es), t.shape, t.stride()).reshape(-1).numpy()
    mask = np.zeros(extent, dtype=np.bool_)
    mask[(elems.astype(np.int64)[:, None] * es + np.arange(es)).ravel()] = True
    return None if mask.all() else mask


class _Writers:
    """Per storage byte: the last plain writer (``cta serial * 64 + warp + 1``, 0: none), its epoch, its op."""

    __slots__ = ("who", "epoch", "op")

    def __init__(self, n: int):
        self.who = np.zeros(n, dtype=np.int64)
        self.epoch = np.zeros(n, dtype=np.int64)
        self.op = np.full(n, -1, dtype=np.int32)


def _numpy_bytes(a: np.ndarray):
    if not a.flags.c_contiguous:
        raise ValueError("expects a C-contiguous numpy array (pass np.ascontiguousarray(x))")
    raw = a.reshape(-1).view(np.uint8)
    return raw, ("numpy", a.__array_interface__["data"][0]), 0, a.nbytes


class GlobalMemory:
    """Fake device addresses over the callers' buffers."""

    def __init__(self, check_races: bool = True):
        self.regions: list[Region] = []
        self._bases: dict = {}  # storage key -> fake base
        self._storages: dict = {}  # storage key -> uint8 view
        self._sorted = None
        self.check_races = check_races
        self._writers: dict = {}  # storage key -> _Writers, for the storages written so far
        self._ops: list = []
        self._op_ids: dict = {}

    def _storage_base(self, key, raw) -> int:
        if key not in self._bases:
            self._bases[key] = (len(self._bases) + 1) << GLOBAL_BASE_SHIFT
            self._storages[key] = raw
        return self._bases[key]

    def add(self, name: str, x) -> int:
        """Register an argument (torch tensor or numpy array); returns its device address."""
        inview = None
        if isinstance(x, np.ndarray):
            raw, key, off, extent = _numpy_bytes(x)
            what = f"{x.size} x {x.dtype}"
        else:
            raw, key, off, extent = _torch_bytes(x)
            what = f"{x.numel()} x {str(x.dtype).replace('torch.', '')}"
            inview = _view_bytes(x, extent)
            if inview is not None:
                what += f" viewed with strides {tuple(x.stride())}"
        base = self._storage_base(key, raw)
        self.regions.append(Region(name, base + off, extent, raw[off:off + extent], what, key, off, inview))
        self._sorted = None
        return base + off

    def storage_of(self, t):
        """(uint8 view of t's whole storage, device address of t's first element) for TMA."""
        raw, key, off, _ = _torch_bytes(t) if not isinstance(t, np.ndarray) else _numpy_bytes(t)
        return raw, self._storage_base(key, raw) + off

    def storage_key(self, t):
        raw, key, _, _ = _torch_bytes(t) if not isinstance(t, np.ndarray) else _numpy_bytes(t)
        self._storage_base(key, raw)
        return key

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

    def _outside_view(self, r, off, nbytes, op, who, verb, lanes):
        bad = ~r.inview[off[:, None] + np.arange(nbytes)].all(axis=1)
        if bad.any():
            i = int(np.argmax(bad))
            raise MemoryAccessError(
                f"global {verb} out of bounds at {where(op)}: lane {int(lanes[i])} of {who.describe()} {verb}s "
                f"{nbytes} bytes at {r.name}+{int(off[i])} bytes, inside the span of {r.name!r} ({r.what}) but "
                f"outside its elements (a gap of the non-contiguous view)")

    def access(self, addrs: np.ndarray, nbytes: int, op, who: str, verb: str, lanes: np.ndarray):
        """Bounds-check; returns list of (region, offsets, lane positions)."""
        r, off = self.locate(addrs, nbytes)
        if r is not None:
            if r.inview is not None:
                self._outside_view(r, off, nbytes, op, who, verb, lanes)
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
        out = [(g[0], np.array(g[1], dtype=np.int64), np.array(g[2])) for g in groups.values()]
        for r, off, pos in out:
            if r.inview is not None:
                self._outside_view(r, off, nbytes, op, who, verb, lanes[pos])
        return out

    def load(self, addrs, dtype, vec, op, who, lanes) -> np.ndarray:
        nb = dtype.itemsize * vec
        out = np.zeros((len(addrs), vec), dtype=dtype)
        for r, off, pos in self.access(addrs, nb, op, who, "read", lanes):
            out[pos] = gather(r.buf, off, dtype, vec)
        return out

    def store(self, addrs, values, dtype, op, who, lanes) -> None:
        nb = dtype.itemsize * values.shape[1]
        track = self.check_races and op.opcode not in ("atomic", "reduce")
        for r, off, pos in self.access(addrs, nb, op, who, "write", lanes):
            if track:
                bi = (off[:, None] + (r.soff + np.arange(nb, dtype=np.int64))).ravel()
                self.track_write(r.key, bi, who.cta, who.wid, who.cta.clock[who.wid], op)
            scatter(r.buf, off, values[pos], dtype)

    def track_write(self, key, bi: np.ndarray, cta, wid: int, clock: np.ndarray, op):
        """Record a plain write of storage bytes ``bi`` by warp ``wid`` of ``cta``; a racing earlier write is an
        error."""
        if not self.check_races:
            return
        st = self._writers.get(key)
        if st is None:
            st = self._writers[key] = _Writers(len(self._storages[key]))
        me = cta.serial * 64 + wid + 1
        prev = st.who[bi]
        hit = (prev != 0) & (prev != me)
        if hit.any():
            pc, pw = (prev - 1) // 64, (prev - 1) % 64
            racy = hit & ((pc != cta.serial) | (st.epoch[bi] > clock[np.minimum(pw, len(clock) - 1)]))
            if racy.any():
                j = int(np.argmax(racy))
                raise self._race(key, int(bi[j]), int(pc[j]), int(pw[j]), st, cta, wid, op)
        k = self._op_ids.get(op)
        if k is None:
            k = self._op_ids[op] = len(self._ops)
            self._ops.append(op)
        st.who[bi] = me
        st.epoch[bi] = clock[wid]
        st.op[bi] = k

    def _race(self, key, b: int, pcta: int, pwarp: int, st, cta, wid, op) -> ProtocolError:
        prev_op = self._ops[int(st.op[b])]
        base = self._bases[key] + b
        other = cta.launch.cta_coords[pcta]
        if pcta != cta.serial:
            why = (f"CTA {other} wrote them at {where(prev_op)} (warp {pwarp}); CTAs cannot order plain writes to "
                   "each other, so the result depends on which runs last (use an atomic, or write disjoint parts)")
        else:
            why = (f"warp {pwarp} of the same CTA wrote them at {where(prev_op)} with no barrier or mbarrier ordering "
                   "the two writes")
        return ProtocolError(f"global-memory write race at {where(op)}: warp {wid} of CTA {cta.coord} writes "
                             f"{self.describe(base)}; {why}")


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
