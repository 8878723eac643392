"""Asynchronous copies: ``cp.async`` (global -> shared, sm_80+) with its commit groups, and TMA
stores and reductions (shared -> global, sm_90) with their bulk groups.

Both complete *asynchronously*: the issuing thread goes on, and the data is guaranteed to have
arrived (or, for a store, to have been read out of shared memory) only after the wait that
covers its group. The rules (PTX ISA, "cp.async", "cp.async.bulk.tensor", "Async proxy"):

cp.async (``ty.cp_async``, ``ty.cp_async_commit``, ``ty.cp_async_wait``)
    1. Issue copies; ``cp_async_commit()`` closes this thread's open group (copies issued
       after it start a new one).
    2. ``cp_async_wait(n)`` waits until at most ``n`` of this thread's most recent groups are
       pending: the copies of every older group have landed, *for this thread*.
    3. Other threads may read the bytes only after a barrier that follows every copying
       thread's wait (``ty.syncthreads()``): wait, then sync, then read.
    4. Overwriting a buffer with cp.async while other warps may still read it is a race:
       sync before issuing the copies that refill it.

TMA store (``ty.hopper.tma_store``, ``ty.hopper.bulk_commit``, ``ty.hopper.bulk_wait``)
    1. Every thread that wrote the source tile with ordinary stores executes
       ``ty.hopper.fence_proxy_async()`` (generic-proxy writes -> visible to the async proxy),
       then a barrier publishes the tile to the thread that issues the store.
    2. One thread issues ``tma_store`` and ``bulk_commit()``.
    3. Before that tile's shared memory is written again (or the CTA exits), the issuing thread
       waits with ``bulk_wait(n, read=True)``; a barrier then tells the writers it is free.
       ``bulk_wait(n)`` without ``read`` also waits for the global writes to be performed.

docs/primitives.md, "Matrix and asynchronous copies", has the same rules with an example.
"""
from __future__ import annotations

from ..codegen.targets import family
from ..ir.types import PointerType, TensorMapType, i32, u32
from .builder import current_builder
from .proxy import RuntimeValue, as_value, emit

_REDUCE = (None, "add", "min", "max")


def _pointer(what: str, p, spaces, hint: str) -> RuntimeValue:
    bld = current_builder()
    if not isinstance(p, RuntimeValue) or not isinstance(p.type, PointerType):
        bld.error(f"{what} expects a pointer, but got {p!r}")
    if p.type.space not in spaces:
        bld.error(f"{what} expects a {' or '.join(spaces)} pointer, but got {p.type}", hint=hint)
    return p


def _group_count(what: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 63:
        current_builder().error(f"{what} n expects a compile-time int in 0..63 (groups left pending), but got {n!r}",
                                hint="n is an immediate of the instruction: use a Python int or a constexpr")
    return n


def cp_async(dst, src, nbytes: int = 16, src_bytes=None, cache: str | None = None) -> None:
    """Start copying ``nbytes`` (4, 8 or 16) from global ``src`` to shared ``dst`` (``cp.async``).

    Both addresses must be ``nbytes``-aligned. ``src_bytes`` (a compile-time int or a run-time
    i32 in 0..nbytes) reads only that many bytes and fills the rest of the destination with
    zeros: ``src_bytes=ty.select(in_bounds, 16, 0)`` zero-fills rows past a tensor's end
    without reading them. ``cache``: "ca" (cache in L1 and L2) or "cg" (L2 only, 16 bytes
    only); the default is "cg" for 16 bytes and "ca" otherwise. The copy belongs to this
    thread's open group: close it with ``cp_async_commit()``, wait with ``cp_async_wait(n)``.
    """
    bld = current_builder()
    d = _pointer("cp_async destination", dst, ("shared",), "the destination is shared memory (ty.shared / "
                 "ty.dynamic_shared)")
    s = _pointer("cp_async source", src, ("global", "generic"), "the source is global memory (a kernel's "
                 "ty.ptr parameter)")
    if isinstance(nbytes, bool) or nbytes not in (4, 8, 16):
        bld.error(f"cp_async nbytes expects 4, 8 or 16, but got {nbytes!r}")
    if cache is None:
        cache = "cg" if nbytes == 16 else "ca"
    if cache not in ("ca", "cg"):
        bld.error(f"cp_async cache expects 'ca' or 'cg', but got {cache!r}")
    if cache == "cg" and nbytes != 16:
        bld.error(f"cp_async cache='cg' expects nbytes=16 (PTX has cp.async.cg only for 16 bytes), but got {nbytes}",
                  hint="use cache='ca' for 4- and 8-byte copies")
    operands = [d, s]
    if src_bytes is not None:
        if isinstance(src_bytes, RuntimeValue):
            if src_bytes.type not in (i32, u32):
                bld.error(f"cp_async src_bytes expects an i32 value, but got {src_bytes.type}")
            operands.append(src_bytes if src_bytes.type == i32 else emit("bitcast", (src_bytes,), to=i32)[0])
        elif isinstance(src_bytes, bool) or not isinstance(src_bytes, int) or not 0 <= src_bytes <= nbytes:
            bld.error(f"cp_async src_bytes expects an int in 0..{nbytes} or a run-time i32, but got {src_bytes!r}")
        elif src_bytes != nbytes:
            operands.append(as_value(src_bytes, i32))
    emit("cp_async", operands, nbytes=int(nbytes), cache=cache)


def cp_async_commit() -> None:
    """Close this thread's open cp.async group (``cp.async.commit_group``); an empty group is fine."""
    emit("cp_async_commit", ())


def cp_async_wait(n: int = 0) -> None:
    """Wait until at most ``n`` of this thread's most recent cp.async groups are pending
    (``cp.async.wait_group n``). Other threads see the bytes only after a barrier that follows
    every copying thread's wait."""
    emit("cp_async_wait", (), n=_group_count("cp_async_wait", n))


def _hopper(what: str):
    bld = current_builder()
    if family(bld.arch) < (9, 0):
        bld.error(f"{what} expects a kernel for sm_90a (TMA), but this kernel targets {bld.arch}",
                  hint="declare the kernel with arch='sm_90a'")
    return bld


def tma_store(tensormap, src, *coords, reduce: str | None = None) -> None:
    """Store (or reduce) a shared-memory tile into the global tensor a tensor map describes.

    ``cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group`` (``reduce=None``) or
    ``cp.reduce.async.bulk.tensor...{add,min,max}`` (element-wise into the global tile; "add"
    takes f32, f16, bf16 and integer tensors, "min"/"max" f16, bf16 and integers but not f32).
    The box at ``coords`` (element coordinates, innermost first) is written; elements outside
    the tensor are not written. The innermost coordinate times the element size must be a
    multiple of 16 bytes. Either violation is an illegal instruction on the GPU and an error in
    the emulator. One thread issues it. ``src`` must be 128-byte aligned, in the
    tensor map's box layout (and swizzle). Before issuing: every thread that wrote ``src``
    with ordinary stores ran ``fence_proxy_async()``, and a barrier ordered those writes
    before this call. Afterwards: ``bulk_commit()``, and ``bulk_wait(n, read=True)`` before
    ``src`` is overwritten or the CTA exits.
    """
    bld = _hopper("tma_store")
    if not isinstance(tensormap, RuntimeValue) or not isinstance(tensormap.type, TensorMapType):
        bld.error(f"tma_store expects a tensor map (a ty.tensormap parameter) first, but got {tensormap!r}")
    s = _pointer("tma_store source", src, ("shared",), "the source tile is in shared memory")
    if not 1 <= len(coords) <= 5:
        bld.error(f"tma_store expects 1 to 5 coordinates (one per tensor dimension), but got {len(coords)}")
    if reduce not in _REDUCE:
        bld.error(f"tma_store reduce expects None, 'add', 'min' or 'max', but got {reduce!r}")
    cs = []
    for i, c in enumerate(coords):
        v = as_value(c, i32)
        if v.type != i32:
            bld.error(f"tma_store coordinate {i} expects an i32, but got {v.type}")
        cs.append(v)
    emit("tma_store", (tensormap, s, *cs), rank=len(cs), reduce=reduce)


def bulk_commit() -> None:
    """Close this thread's open bulk group of TMA stores (``cp.async.bulk.commit_group``)."""
    _hopper("bulk_commit")
    emit("bulk_commit", ())


def bulk_wait(n: int = 0, read: bool = False) -> None:
    """Wait until at most ``n`` of this thread's most recent bulk groups are pending
    (``cp.async.bulk.wait_group[.read] n``).

    ``read=True`` waits only until those stores have finished *reading* their shared-memory
    source (enough to overwrite it); without it, until their global writes are done too.
    """
    _hopper("bulk_wait")
    if not isinstance(read, bool):
        current_builder().error(f"bulk_wait read expects a compile-time bool, but got {read!r}")
    emit("bulk_wait", (), n=_group_count("bulk_wait", n), read=read)


__all__ = ["cp_async", "cp_async_commit", "cp_async_wait"]
HOPPER_ALL = ["tma_store", "bulk_commit", "bulk_wait"]
