"""Hopper (sm_90a) instructions for kernels: mbarriers, TMA, setmaxnreg, proxy fences.

Thin, checked wrappers that build the IR ops; the wgmma side lives in the tile library
(``tylopy.tile.wgmma``) and ``tylopy.hopper`` re-exports it. The facts each instruction relies
on are in docs/hopper.md.
"""
from __future__ import annotations

from ..codegen.targets import family
from ..ir.types import PointerType, i32, u32
from ..ir.values import WaitSite
from . import lang
from .builder import current_builder, user_location
from .proxy import RuntimeValue, as_value, emit, emit1
from .tracing import if_, while_

Value = RuntimeValue


def _bar(bar) -> Value:
    if not isinstance(bar, Value) or not isinstance(bar.type, PointerType) or bar.type.space != "shared":
        current_builder().error(f"an mbarrier expects a shared-memory pointer, but got {bar!r}")
    return lang.ptr_cast(bar, lang.u64)


def mbarrier_init(bar, count, label: str = "") -> None:
    """mbarrier.init: expect ``count`` arrivals per phase. One thread initializes. ``label`` names
    the barrier in the emulator's protocol messages (as a wait's label does)."""
    if label:
        emit("mbarrier_init", (_bar(bar), as_value(count, i32)), label=str(label))
    else:
        emit("mbarrier_init", (_bar(bar), as_value(count, i32)))


def mbarrier_arrive(bar, cta=None, scope=None) -> None:
    """Arrive on ``bar`` (one arrival of this thread). With ``cta`` (a rank in the cluster), arrive on
    the mbarrier at the same shared-memory offset in CTA ``cta`` of the cluster instead: ``mapa`` then
    ``mbarrier.arrive.release.<scope>.shared::cluster``. ``cta=`` the own rank arrives locally
    through the same path; the other CTA must not have exited.

    ``scope`` (only with ``cta``): "cluster" (the default) publishes this thread's earlier writes to
    the CTA that observes the phase, at the price of a GPU-scope fence before every arrive (ptxas
    emits MEMBAR.ALL.GPU, which stalls the warp for a round trip to L2). "cta" is the bare arrive
    (PTX's default semantics): for an arrive that publishes no data of this thread, such as a
    consumer freeing a pipeline stage whose reads have completed (``wgmma_wait``) so that another
    CTA's producer may refill it by TMA multicast."""
    if cta is None:
        if scope is not None:
            current_builder().error(f"mbarrier_arrive scope expects a remote arrive (cta=...), but got scope={scope!r} "
                                    f"without cta", hint="a local arrive is always .release.cta")
        emit("mbarrier_arrive", (_bar(bar),))
        return
    _cluster_op("mbarrier_arrive(cta=...)")
    emit("mbarrier_arrive_cluster", (_bar(bar), _rank(cta, "mbarrier_arrive cta")),
         scope=_scope(scope, "mbarrier_arrive"))


def _scope(scope, what: str) -> str:
    if scope is None:
        return "cluster"
    if scope not in ("cluster", "cta"):
        current_builder().error(f"{what} scope expects 'cluster' or 'cta', but got {scope!r}")
    return scope


def _cluster_op(what: str, arch_specific: bool = False):
    bld = current_builder()
    if family(bld.arch) < (9, 0) or (arch_specific and not bld.arch.endswith("a")):
        bld.error(f"{what} expects a kernel for {'sm_90a' if arch_specific else 'sm_90 or sm_90a'} (thread-block "
                  f"clusters), but this kernel targets {bld.arch}", hint="declare the kernel with arch='sm_90a'")


def _rank(v, what: str) -> Value:
    r = as_value(v, i32)
    if r.type not in (i32, u32):
        current_builder().error(f"{what} expects an i32 CTA rank, but got {r.type}")
    return r


def mbarrier_arrive_expect_tx(bar, nbytes, cta=None, scope=None) -> None:
    """Arrive and add ``nbytes`` to the phase's expected transaction count (before the TMA copies).
    With ``cta`` (a rank in the cluster): on the barrier at the same offset in CTA ``cta``
    (``mbarrier.arrive.expect_tx.release.<scope>.shared::cluster``; ``scope`` as for
    ``mbarrier_arrive``)."""
    if cta is None:
        if scope is not None:
            current_builder().error(f"mbarrier_arrive_expect_tx scope expects a remote arrive (cta=...), but got "
                                    f"scope={scope!r} without cta", hint="a local arrive is always .release.cta")
        emit("mbarrier_arrive_expect_tx", (_bar(bar), as_value(nbytes, i32)))
        return
    _cluster_op("mbarrier_arrive_expect_tx(cta=...)")
    rank = _rank(cta, "mbarrier_arrive_expect_tx cta")
    emit("mbarrier_arrive_expect_tx_cluster", (_bar(bar), as_value(nbytes, i32), rank),
         scope=_scope(scope, "mbarrier_arrive_expect_tx"))


def mbarrier_try_wait(bar, parity) -> Value:
    """True once the phase with ``parity`` has completed (may time out and return false)."""
    return emit1("mbarrier_try_wait", (_bar(bar), as_value(parity, i32)))


def mbarrier_wait(bar, parity, label: str = "", stage=None) -> None:
    """Spin on try_wait until the phase with ``parity`` completes.

    With the compile option ``debug_waits`` (``TYLOPY_DEBUG_WAITS=1``) the wait is bounded: on
    timeout it records which wait it was (``label`` and the source line), the barrier's shared
    address, the parity and ``stage``, and returns; the launcher then raises
    ``MbarrierTimeoutError`` instead of hanging. ``label`` also names the barrier in the
    emulator's protocol messages.
    """
    bld = current_builder()
    b = _bar(bar)
    p = as_value(parity, i32)
    options = bld.options
    if options is None or not options.debug_waits:
        while_(lambda: ~emit1("mbarrier_try_wait", (b, p), label=str(label)), lambda: (), (), ())
        return
    bld.wait_sites.append(WaitSite(str(label), str(user_location())))
    site = len(bld.wait_sites)
    start = emit1("special", (), reg="globaltimer_lo")
    limit = as_value(int(options.debug_wait_seconds * 1e9), u32)

    def waiting(timed_out):
        done = emit1("mbarrier_try_wait", (b, p), label=str(label))
        return ~done & (timed_out == 0)

    def step(timed_out):
        now = emit1("special", (), reg="globaltimer_lo")
        return (lang.select(now - start > limit, 1, 0),)

    (timed_out,) = while_(waiting, step, ("timed_out",), (as_value(0, i32),))
    record = emit1("debug_record", ())

    def report():
        lang.store(record, as_value(site, i32))
        lang.store(record + 1, p)
        lang.store(record + 2, lang.bitcast(lang.address(bar), lang.i32))
        lang.store(record + 3, as_value(-1 if stage is None else stage, i32))
        return ()

    if_(timed_out != 0, report, lambda: (), (), ())


def fence_proxy_async() -> None:
    """fence.proxy.async.shared::cta: generic-proxy smem writes become visible to TMA/wgmma."""
    emit("fence_proxy_async", ())


def fence_mbarrier_init() -> None:
    emit("fence_mbarrier_init", ())


def tma_load(dst, tensormap, bar, *coords, multicast=None) -> None:
    """cp.async.bulk.tensor.{rank}d global -> shared, completing its bytes on ``bar``.

    ``coords`` are element coordinates, innermost dimension first (they may be out of range:
    those elements are zero-filled and still counted).

    ``multicast``: a 16-bit mask of CTA ranks in the cluster (bit r = rank r, an int or a run-time
    i32). The box is read once and written to ``dst`` in the shared memory of every CTA in the mask,
    each completing its bytes on the mbarrier at ``bar``'s offset in that CTA (``.multicast::cluster``).
    Every receiver must expect the bytes (``mbarrier_arrive_expect_tx`` on its own barrier).
    """
    bld = current_builder()
    if not isinstance(dst, Value) or not isinstance(dst.type, PointerType) or dst.type.space != "shared":
        bld.error(f"tma_load destination expects a shared-memory pointer, but got {dst!r}")
    if not 1 <= len(coords) <= 5:
        bld.error(f"tma_load expects 1 to 5 coordinates, but got {len(coords)}")
    operands = (dst, tensormap, _bar(bar), *[as_value(c, i32) for c in coords])
    if multicast is None:
        emit("tma_load", operands, rank=len(coords))
        return
    _cluster_op("tma_load(multicast=...)", arch_specific=True)
    if isinstance(multicast, int) and not 0 < multicast < (1 << 16):
        bld.error(f"tma_load multicast expects a CTA mask in 1..0xFFFF (bit r = CTA rank r), but got {multicast!r}")
    emit("tma_load", (*operands, _rank(multicast, "tma_load multicast")), rank=len(coords), multicast=True)


def prefetch_tensormap(tensormap) -> None:
    emit("prefetch_tensormap", (tensormap,))


def setmaxnreg(n: int, increase: bool) -> None:
    """setmaxnreg.{inc,dec}: move registers between warpgroups (needs launch bounds with min blocks)."""
    bld = current_builder()
    if isinstance(n, Value) or not 24 <= n <= 256 or n % 8:
        bld.error(f"setmaxnreg expects a compile-time multiple of 8 in 24..256, but got {n!r}")
    emit("setmaxnreg", (), n=int(n), inc=bool(increase))


def elect_one() -> Value:
    return lang.elect_one()


__all__ = ["mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_try_wait", "mbarrier_wait",
           "fence_proxy_async", "fence_mbarrier_init", "tma_load", "prefetch_tensormap", "setmaxnreg", "elect_one"]
