"""Type rules of pointers, loads and stores, special registers, shared memory and inline PTX."""
from __future__ import annotations

from ..types import PointerType, ScalarType, TensorMapType, i1, i32, u32, u64
from .base import expect, none

def _ptr_add(ts, attrs):
    expect(len(ts) == 2 and isinstance(ts[0], PointerType), f"pointer arithmetic expects (pointer, integer), but got {ts}")
    expect(isinstance(ts[1], ScalarType) and ts[1].is_int, f"pointer offset expects an integer, but got {ts[1]}")
    return (ts[0],)


def _ptr_cast(ts, attrs):
    expect(len(ts) == 1 and isinstance(ts[0], PointerType), f"ptr_cast expects a pointer, but got {ts}")
    to = attrs["to"]
    expect(isinstance(to, PointerType), f"ptr_cast expects a pointer type, but got {to}")
    src = ts[0]
    expect(src.space == to.space or "generic" in (src.space, to.space),
            f"ptr_cast from {src.space} to {to.space} memory is not allowed (only to and from generic)")
    return (to,)


def _ptr_to_int(ts, attrs):
    expect(len(ts) == 1 and isinstance(ts[0], (PointerType, TensorMapType)), f"ptr_to_int expects a pointer, but got {ts}")
    t = ts[0]
    width = u32 if isinstance(t, PointerType) and t.space == "shared" else u64
    return (width,)


def _load(ts, attrs):
    expect(len(ts) in (1, 2), "load expects (pointer[, mask])")
    p = ts[0]
    expect(isinstance(p, PointerType), f"load expects a pointer, but got {p}")
    expect(p.space in ("global", "shared", "generic"), f"load expects global, shared or generic memory, but got {p.space}")
    vec = attrs.get("vec", 1)
    expect(vec in (1, 2, 4, 8, 16), f"load vec expects 1, 2, 4, 8 or 16 (8-bit elements), but got {vec}")
    expect(p.pointee.bits * vec <= 128, f"load vec expects at most {max(128 // p.pointee.bits, 1)} {p.pointee} elements "
                                         f"(one access moves at most 16 bytes), but got vec={vec} ({vec}x{p.pointee})")
    if len(ts) == 2:
        expect(ts[1] == i1, f"load mask expects i1, but got {ts[1]}")
    return (p.pointee,) * vec


def _store(ts, attrs):
    expect(len(ts) >= 2, "store expects (pointer, value...)")
    p = ts[0]
    expect(isinstance(p, PointerType), f"store expects a pointer, but got {p}")
    expect(p.space in ("global", "shared", "generic"), f"store expects global, shared or generic memory, but got {p.space}")
    for t in ts[1:]:
        expect(t == p.pointee, f"store to {p} expects {p.pointee} values, but got {t}")
    n = len(ts) - 1
    expect(n in (1, 2, 4, 8, 16), f"store expects 1, 2, 4, 8 or 16 values (16 for 8-bit elements), but got {n}")
    expect(p.pointee.bits * n <= 128, f"store expects at most {max(128 // p.pointee.bits, 1)} {p.pointee} values "
                                      f"(one access moves at most 16 bytes), but got {n} ({n}x{p.pointee})")
    return ()


SPECIAL_REGS = ("tid.x", "tid.y", "tid.z", "ntid.x", "ntid.y", "ntid.z", "ctaid.x", "ctaid.y", "ctaid.z",
                "nctaid.x", "nctaid.y", "nctaid.z", "laneid", "warpid", "clock", "globaltimer_lo",
                # thread-block clusters (sm_90): a launch without clusters is one CTA per cluster
                "cluster.ctarank", "cluster.nctarank", "clusterid.x", "clusterid.y", "clusterid.z",
                "nclusterid.x", "nclusterid.y", "nclusterid.z", "cluster.ctaid.x", "cluster.ctaid.y",
                "cluster.ctaid.z", "cluster.nctaid.x", "cluster.nctaid.y", "cluster.nctaid.z")


def _special(ts, attrs):
    expect(attrs["reg"] in SPECIAL_REGS, f"special register expects one of {SPECIAL_REGS}, but got {attrs['reg']!r}")
    return (u32,) if attrs["reg"] in ("clock", "globaltimer_lo") else (i32,)


def _asm(ts, attrs):
    return tuple(attrs["results"])


def _shared_ptr(ts, attrs):
    return (attrs["type"],)


def passthrough(ts, attrs):
    return tuple(ts)




RULES = {
    "ptr_add": _ptr_add, "ptr_cast": _ptr_cast, "ptr_to_int": _ptr_to_int,
    "load": _load, "store": _store, "special": _special,
    "asm": _asm, "shared_ptr": _shared_ptr, "dynamic_shared_ptr": _shared_ptr,
    "debug_record": lambda ts, a: (PointerType(i32, "global"),),
}
SIDE_EFFECTS = frozenset({"store", "asm"})
