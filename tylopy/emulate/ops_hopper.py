"""Barriers, mbarriers, proxy fences, setmaxnreg and TMA tile loads.

TMA (``cp.async.bulk.tensor``): the box starting at the coordinates (innermost first) is read
from the tensor map's tensor; elements outside the map's dims are zero (FLOAT_OOB_FILL_NONE)
and still counted. The box is written densely (dim 0 fastest) at the destination, and each
16-byte chunk is moved by the map's swizzle applied to the absolute shared address: for 128B,
chunk bits 4-6 are XORed with bits 7-9, so chunk c of row r of a 1024-byte-aligned tile lands
at c ^ (r % 8) (CuTe Swizzle<3,4,3>; 64B and 32B use 2 and 1 bits). The global bytes are read
at the issue; they land in shared memory, and complete their bytes on the mbarrier, later
(``asynccopy.py``). TMA stores use the same box addressing in the other direction.

Named barriers are keyed by their id, a constant or a warp-uniform run-time value.
"""
from __future__ import annotations

import numpy as np

from .asynccopy import TmaLoad
from .multicast import absorb, issue_remote, multicast_ranks
from .errors import MemoryAccessError, ProtocolError, where
from .ops_scalar import check_converged
from .compiled import handler
from .sync import MBarrier, Wait, check_lap, mbarrier_lookup
from .values import bf16_to_f32, f32_to_bf16

SWIZZLE_BITS = {0: 0, 32: 1, 64: 2, 128: 3}


def swizzle(addr: np.ndarray, swizzle_bytes: int) -> np.ndarray:
    """Swizzle<B,4,3> on byte addresses: bits [7, 7+B) XORed into bits [4, 4+B)."""
    b = SWIZZLE_BITS[swizzle_bytes]
    if b == 0:
        return addr
    mask = (1 << b) - 1
    return addr ^ (((addr >> 7) & mask) << 4)


class TensorMapInfo:
    """A tensor map's box, precomputed for TMA reads (from a ``TensorMapSpec``)."""

    def __init__(self, name: str, spec, gmem):
        self.name, self.spec = name, spec
        t = spec.tensor
        self.es = t.element_size() if hasattr(t, "element_size") else t.itemsize
        self.raw, _ = gmem.storage_of(t)
        self.gmem, self.key = gmem, gmem.storage_key(t)
        self.base_off = (t.storage_offset() * self.es) if hasattr(t, "storage_offset") else 0
        self.dims = [int(x) for x in spec.dims]
        self.strides = [self.es] + [int(x) for x in spec.strides_bytes]
        self.box = [int(x) for x in spec.box]
        self.rank = len(self.dims)
        idx = np.indices(tuple(reversed(self.box))).reshape(self.rank, -1)[::-1]  # dim 0 fastest
        self.box_idx = idx.astype(np.int64)
        self.rel = sum(idx[i].astype(np.int64) * self.strides[i] for i in range(self.rank))
        self.nelem = idx.shape[1]
        self.box_bytes = self.nelem * self.es
        self.lin = np.arange(self.nelem, dtype=np.int64) * self.es

    def smem_bytes(self, addr: int) -> np.ndarray:
        """The shared-memory byte indices of the box at ``addr``, element by element (swizzled)."""
        addrs = swizzle(addr + self.lin, self.spec.swizzle)
        return (addrs[:, None] + np.arange(self.es)).ravel()

    def _offsets(self, coords, op, who, verb):
        """(in-bounds mask, storage byte offset) of each box element at ``coords``."""
        inb = np.ones(self.nelem, dtype=np.bool_)
        start = self.base_off
        for i, c in enumerate(coords):
            g = c + self.box_idx[i]
            inb &= (g >= 0) & (g < self.dims[i])
            start += c * self.strides[i]
        off = np.where(inb, start + self.rel, 0)
        if inb.any():
            lo, hi = int(off[inb].min()), int(off[inb].max()) + self.es
            if lo < 0 or hi > len(self.raw):
                raise MemoryAccessError(
                    f"TMA at {where(op)} ({who.describe()}) {verb} outside the memory of tensor map {self.name!r}: its "
                    f"dims and strides reach byte {hi} but the tensor's storage has {len(self.raw)} bytes")
        return inb, off

    def read(self, coords, op, who) -> np.ndarray:
        """The box's bytes, shape (nelem, es); out-of-bounds elements are zero."""
        inb, off = self._offsets(coords, op, who, "reads")
        data = self.raw[off[:, None] + np.arange(self.es)]
        data[~inb] = 0
        return data

    def write(self, coords, data: np.ndarray, reduce, op, who):
        """A TMA store (or reduction) of the box's bytes ``data`` (nelem, es); out-of-bounds elements are skipped."""
        inb, off = self._offsets(coords, op, who, "writes")
        bi = (off[inb][:, None] + np.arange(self.es)).ravel()
        new = data[inb]
        if reduce is not None:
            new = reduce_elements(self.spec.dtype, self.raw[bi].reshape(-1, self.es), new, reduce, op)
        if reduce is None:  # a reduction is atomic per element: it races with nothing
            self.gmem.track_write(self.key, bi, who.cta, who.wid, who.clock, op)
        self.raw[bi] = new.ravel()


@handler("barrier", "barrier_arrive")
def make_barrier(prog, op):
    const_id, count = op.attr("id"), op.attr("count")
    sync = op.opcode == "barrier"
    id_slot = prog.slot(op.operands[0]) if op.operands else None
    name = "bar.sync" if sync else "bar.arrive"

    def barrier_id(w) -> int:
        if id_slot is None:
            return const_id
        ids = w.env[id_slot][w.mask]
        if len(ids) and not (ids == ids[0]).all():
            raise ProtocolError(f"{name} at {where(op)} ({w.describe()}): the barrier id differs between the "
                                f"warp's threads ({', '.join(str(int(x)) for x in np.unique(ids))}); it must be "
                                "warp-uniform")
        bid = int(ids[0]) if len(ids) else 0
        if not 0 <= bid <= 15:
            raise ProtocolError(f"{name} at {where(op)} ({w.describe()}): barrier id expects 0..15, but got {bid}")
        return bid

    def run(w):
        bid = barrier_id(w)
        check_converged(w, op, f"{name} {bid}")
        cta = w.cta
        b = cta.named_barrier(bid)
        gen = b.arrive(cta, w, op, count, sync)
        if not sync:
            return
        if gen is None:
            gen = b.generation - 1
        else:
            yield Wait(lambda: b.generation > gen, op, b.describe, b)
        cta.acquire(w.wid, b.clocks[gen])

    return True, run


def _by_address(addrs: np.ndarray, lanes: np.ndarray):
    if len(lanes) == 1 or (addrs == addrs[0]).all():
        return [(int(addrs[0]), lanes)]
    return [(int(a), lanes[addrs == a]) for a in np.unique(addrs)]


def _lanes(w):
    return np.flatnonzero(w.mask)


@handler("mbarrier_init")
def make_mbarrier_init(prog, op):
    b, c = (prog.slot(v) for v in op.operands)

    def run(w):
        cta = w.cta
        lanes = _lanes(w)
        for lane in lanes:
            addr, count = int(w.env[b][lane]), int(w.env[c][lane])
            if addr % 8:
                raise MemoryAccessError(f"mbarrier_init at {where(op)}: address {addr} is not 8-byte aligned")
            cta.smem.check(np.array([addr]), 8, op, w, "write", np.array([lane]))
            if not 1 <= count < (1 << 20):
                raise ProtocolError(f"mbarrier_init at {where(op)} ({w.describe()}): count expects 1..2**20-1, "
                                    f"but got {count}")
            cta.mbars[addr] = MBarrier(cta, addr, count, op, w)
    return False, run


@handler("mbarrier_arrive")
def make_mbarrier_arrive(prog, op):
    b = prog.slot(op.operands[0])

    def run(w):
        lanes = _lanes(w)
        if not len(lanes):
            return
        for addr, ls in _by_address(w.env[b][lanes], lanes):
            mbarrier_lookup(w.cta, w, op, addr).arrive(w.cta, w, op, len(ls))
    return False, run


@handler("mbarrier_arrive_expect_tx")
def make_mbarrier_arrive_expect_tx(prog, op):
    b, n = (prog.slot(v) for v in op.operands)

    def run(w):
        lanes = _lanes(w)
        for lane in lanes:
            addr, nbytes = int(w.env[b][lane]), int(w.env[n][lane])
            mbarrier_lookup(w.cta, w, op, addr).arrive(w.cta, w, op, 1, nbytes)
    return False, run


@handler("mbarrier_try_wait")
def make_mbarrier_try_wait(prog, op):
    b, p = (prog.slot(v) for v in op.operands)
    r = prog.slot(op.result)
    label = str(op.attr("label", "") or "")

    def run(w):
        cta, env = w.cta, w.env
        lanes = _lanes(w)
        keys = sorted({(int(env[b][i]), int(env[p][i]) & 1) for i in lanes})
        for addr, parity in keys:
            mb = mbarrier_lookup(cta, w, op, addr)
            if label and not mb.wait_label:
                mb.wait_label = label
            check_lap(cta, w, op, mb, parity)
            if (mb.phase & 1) == parity:
                cta.copies.land_for(mb)
            if (mb.phase & 1) == parity:
                target = mb.phase

                def ready(mb=mb, t=target):
                    if mb.phase <= t:
                        cta.copies.land_for(mb)
                    return mb.phase > t

                yield Wait(ready, op, lambda mb=mb, par=parity: mb.describe_wait(par), (mb, parity))
            cta.acquire(w.wid, mb.done_clock[parity])
            absorb(w, mb, parity)
            w.note_wait(mb, op, parity)
        env[r] = w.mask.copy()

    return True, run


def _publish_inits(w):
    for mb in w.cta.mbars.values():
        if mb.init_warp == w.wid:
            mb.async_visible = True


@handler("fence_proxy_async")
def make_fence_proxy_async(prog, op):
    def run(w):
        lanes = _lanes(w)
        if len(lanes):
            w.cta.smem.fence_proxy(w.tids[lanes])
            _publish_inits(w)
    return False, run


@handler("fence_mbarrier_init")
def make_fence_mbarrier_init(prog, op):
    def run(w):
        if w.nactive:
            _publish_inits(w)
    return False, run


@handler("setmaxnreg")
def make_setmaxnreg(prog, op):
    n, inc = op.attr("n"), bool(op.attr("inc"))
    what = f"setmaxnreg.{'inc' if inc else 'dec'} {n}"

    def run(w):
        check_converged(w, op, what)
        cta = w.cta
        pool = cta.regpool
        if not pool.known:
            cta.launch.note(f"{what} at {where(op)}: the kernel declares neither min_blocks_per_sm nor "
                            "max_registers, so ptxas ignores setmaxnreg (C7508); emulated with 1 block per SM")
        cta.collective(w, op, ("setmaxnreg", n, inc))
        if not 24 <= n <= 256 or n % 8:
            raise ProtocolError(f"{what} at {where(op)}: the count expects a multiple of 8 in 24..256")
        if inc:
            if n < w.regs:
                raise ProtocolError(f"{what} at {where(op)} ({w.describe()}) asks for fewer registers than the "
                                    f"warp holds ({w.regs}); use the dec form")
            need = 32 * (n - w.regs)
            if pool.free < need:
                yield Wait(lambda: pool.free >= need, op, lambda: f"{what}: " + pool.describe_need(need), pool)
            pool.free -= need
        else:
            if n > w.regs:
                raise ProtocolError(f"{what} at {where(op)} ({w.describe()}) would raise the warp's registers "
                                    f"from {w.regs}; use the inc form")
            pool.free += 32 * (w.regs - n)
        w.regs = n

    return True, run


@handler("tma_load")
def make_tma_load(prog, op):
    rank = op.attr("rank")
    d, tm, b = (prog.slot(v) for v in op.operands[:3])
    cs = [prog.slot(v) for v in op.operands[3:3 + rank]]
    mask_slot = prog.slot(op.operands[3 + rank]) if op.attr("multicast", False) else None

    def run(w):
        cta, env = w.cta, w.env
        smem = cta.smem
        for lane in _lanes(w):
            dst, taddr, bar = int(env[d][lane]), int(env[tm][lane]), int(env[b][lane])
            coords = [int(env[c][lane]) for c in cs]
            info = cta.launch.tensormap(taddr, op)
            if info.rank != rank:
                raise ProtocolError(f"tma_load at {where(op)} gives {rank} coordinates, but tensor map "
                                    f"{info.name!r} has rank {info.rank}")
            if mask_slot is not None:
                ranks = multicast_ranks(w, op, int(env[mask_slot][lane]) & 0xFFFF)
                if dst % 128:
                    raise MemoryAccessError(f"tma_load at {where(op)} ({w.describe()}): the destination "
                                            f"{smem.name(dst)} is not 128-byte aligned, as TMA requires")
                data = info.read(coords, op, w)
                for r in ranks:
                    if r != cta.rank:
                        issue_remote(w, op, cta.cluster.target(w, op, r, "TMA multicast write"), dst, bar, info, data)
                if cta.rank not in ranks:
                    continue
            if dst % 128:
                raise MemoryAccessError(f"tma_load at {where(op)} ({w.describe()}): the destination {smem.name(dst)} is not "
                                        "128-byte aligned, as TMA requires")
            smem.check(np.array([dst]), info.box_bytes, op, w, "write", np.array([lane]))
            mb = mbarrier_lookup(cta, w, op, bar, async_use=True)
            data = info.read(coords, op, w)
            bi = info.smem_bytes(dst)
            if smem.check_races and smem.copies_w:  # two copies in flight into the same bytes
                smem.check_write(bi, w.wid, cta.clock[w.wid], op, w)
            rec = TmaLoad(cta, w, op, mb, bi, data.ravel())
            smem.mark(bi, rec)
            cta.copies.issue(rec)
    return False, run


def reduce_elements(dtype: str, old: np.ndarray, new: np.ndarray, how: str, op) -> np.ndarray:
    """``cp.reduce.async.bulk`` element-wise: ``old`` and ``new`` as (n, element bytes) raw bytes."""
    floats = {"f32": np.float32, "f64": np.float64, "f16": np.float16}
    ints = {"u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "i32": np.int32, "u64": np.uint64, "i64": np.int64}
    if dtype == "bf16":
        a = bf16_to_f32(old.copy().view(np.uint16).ravel()).astype(np.float64)
        b = bf16_to_f32(new.copy().view(np.uint16).ravel()).astype(np.float64)
        out = {"add": a + b, "min": np.minimum(a, b), "max": np.maximum(a, b)}[how]
        return f32_to_bf16(out.astype(np.float32)).view(np.uint8).reshape(old.shape)
    dt = floats.get(dtype) or ints.get(dtype)
    if dt is None:
        raise ProtocolError(f"tma_store at {where(op)}: reduce={how!r} on a {dtype} tensor map is not emulated")
    a, b = old.copy().view(dt).ravel(), new.copy().view(dt).ravel()
    if how == "add" and dt in (np.float32, np.float16):
        out = (a.astype(np.float64) + b.astype(np.float64)).astype(dt)  # one rounding of the exact sum
    else:
        out = {"add": a + b, "min": np.minimum(a, b), "max": np.maximum(a, b)}[how].astype(dt)
    return out.view(np.uint8).reshape(old.shape)
