"""Type rules of barriers and warp shuffles."""
from __future__ import annotations

from ..types import b32, f32, i32, u32
from .base import expect, none

def _shfl(ts, attrs):
    expect(len(ts) == 2, "shfl expects (value, lane)")
    expect(ts[0] in (i32, f32, u32, b32), f"shfl expects a 32-bit value, but got {ts[0]}")
    expect(ts[1] in (i32, u32), f"shfl lane expects i32, but got {ts[1]}")
    expect(attrs["mode"] in ("bfly", "idx", "up", "down"), f"shfl mode {attrs['mode']!r}")
    return (ts[0],)




def _barrier(ts, attrs):
    expect(len(ts) <= 1, "a barrier takes at most one operand (a run-time id)")
    if ts:
        expect(ts[0] in (i32, u32), f"barrier id expects i32, but got {ts[0]}")
    else:
        expect(isinstance(attrs.get("id"), int), "a barrier needs an id")
    return ()




RULES = {
    "shfl": _shfl, "barrier": _barrier, "barrier_arrive": _barrier, "membar": none(0),
}
SIDE_EFFECTS = frozenset({"barrier", "barrier_arrive", "membar"})
