"""Type rules of warp-wide votes, matches and integer reductions (``vote.sync``, ``match.sync``,
``activemask``, ``redux.sync``). Every lane named by the full mask takes part."""
from __future__ import annotations

from ..types import ScalarType, b32, i1, i32, i64, u32, u64
from .base import expect

VOTE_MODES = ("all", "any", "uni", "ballot")
MATCH_MODES = ("any", "all")
REDUX_OPS = ("add", "min", "max", "and", "or", "xor")


def _vote(ts, attrs):
    expect(len(ts) == 1 and ts[0] == i1, f"vote expects one i1 predicate, but got {', '.join(map(str, ts))}")
    mode = attrs.get("mode")
    expect(mode in VOTE_MODES, f"vote mode expects one of {', '.join(VOTE_MODES)}, but got {mode!r}")
    return (u32,) if mode == "ballot" else (i1,)


def _match(ts, attrs):
    expect(len(ts) == 1 and ts[0] in (i32, u32, b32, i64, u64),
           f"match expects one 32- or 64-bit integer value, but got {', '.join(map(str, ts))}")
    mode = attrs.get("mode")
    expect(mode in MATCH_MODES, f"match mode expects 'any' or 'all', but got {mode!r}")
    return (u32,) if mode == "any" else (u32, i1)


def _redux(ts, attrs):
    expect(len(ts) == 1 and ts[0] in (i32, u32),
           f"redux expects one i32 or u32 value, but got {', '.join(map(str, ts))}")
    op = attrs.get("op")
    expect(op in REDUX_OPS, f"redux op expects one of {', '.join(REDUX_OPS)}, but got {op!r}")
    return (ts[0],)


def _activemask(ts, attrs):
    expect(not ts, f"activemask expects no operands, but got {', '.join(map(str, ts))}")
    return (u32,)


RULES = {"vote": _vote, "match": _match, "redux": _redux, "activemask": _activemask}
SIDE_EFFECTS: frozenset = frozenset({"vote", "match", "redux", "activemask"})  # convergent: never moved
