"""Warp votes, matches and reductions: oracles from the PTX ISA text, emulation, PTX and ptxas.

The expected values are written here from the ISA's definitions, not from tylopy's semantics:
``vote.sync.ballot.b32`` sets bit i to lane i's predicate (a lane that does not take part
contributes 0); ``vote.sync.all/any/uni`` reduce the predicate over the member lanes;
``match.any.sync`` gives the mask of lanes holding the same value, ``match.all.sync`` the
member mask (and true) if all hold the same value, else 0 (and false); ``redux.sync.add``
truncates the sum to 32 bits. ``ty.warp_reduce``'s float sums follow the documented
butterfly order (offsets 16, 8, 4, 2, 1), which the float oracle spells out lane by lane.
"""
import re

import numpy as np
import pytest

import tylopy as ty
from tylopy.emulate import ProtocolError
from tylopy.semantics import warp as W
from emulate_dsl import line_of
from primitive_probes import REDUCERS, lanes_here, matches, partial_warp_votes, reducer, votes  # noqa: F401

HERE = __file__
RNG = np.random.default_rng(1234)


def ballot_oracle(pred) -> int:
    return sum(1 << i for i in range(32) if pred[i])


# -- votes -------------------------------------------------------------------------------------------------


def test_votes_and_ballot_bit_order():
    pred = np.zeros((4, 32), dtype=np.int32)
    pred[0] = RNG.integers(0, 2, 32)      # mixed
    pred[1] = 1                           # all true
    pred[2, 5] = 1                        # one lane: bit 5
    pred[3] = 0                           # all false
    out = np.zeros(128 * 5, dtype=np.uint32)
    votes.emulate(pred.ravel(), out, grid=1)
    out = out.reshape(4, 32, 5)
    for w in range(4):
        p = pred[w]
        want = [ballot_oracle(p), int(p.all()), int(p.any()), int(p.all() or not p.any()), 0xFFFFFFFF]
        for lane in range(32):
            assert list(out[w, lane]) == want, (w, lane)
    assert out[2, 0, 0] == 1 << 5 and out[1, 7, 0] == 0xFFFFFFFF


def test_partial_warp_lanes_past_the_block_take_no_part():
    out = np.zeros(96, dtype=np.uint32)
    partial_warp_votes.emulate(out, grid=1)
    out = out.reshape(48, 2)
    assert (out[:32, 0] == 0xFFFFFFFF).all() and (out[:32, 1] == 0).all()
    assert (out[32:, 0] == 0x0000FFFF).all() and (out[32:, 1] == 1).all()


def test_activemask_in_a_branch_is_the_lanes_in_it():
    out = np.zeros(32, dtype=np.uint32)
    lanes_here.emulate(out, grid=1)
    want = ballot_oracle([i % 3 == 0 for i in range(32)])
    assert all(out[i] == (want if i % 3 == 0 else 7) for i in range(32))


@ty.kernel(threads=32)
def diverged_ballot(out: ty.ptr(ty.u32)):
    t = ty.thread_idx()
    if t < 16:
        out[t] = ty.ballot(t > 3)  # <- diverged_ballot


@ty.kernel(threads=32)
def diverged_reduce(out: ty.ptr(ty.f32)):
    t = ty.thread_idx()
    if t != 5:
        out[t] = ty.warp_reduce("max", ty.cast(t, ty.f32))  # <- diverged_reduce


def test_a_diverged_warp_is_a_protocol_error_at_the_line():
    with pytest.raises(ProtocolError, match=f"vote.sync.ballot at .*:{line_of(HERE, 'diverged_ballot')} .*diverged.*"
                                            "lanes 16-31 inactive"):
        diverged_ballot.emulate(np.zeros(32, np.uint32), grid=1)
    with pytest.raises(ProtocolError, match=f"at .*:{line_of(HERE, 'diverged_reduce')} .*lanes 5 inactive"):
        diverged_reduce.emulate(np.zeros(32, np.float32), grid=1)


# -- matches -----------------------------------------------------------------------------------------------


def match_any_oracle(vals) -> list[int]:
    return [sum(1 << j for j in range(32) if vals[j] == vals[i]) for i in range(32)]


def test_match_any_and_all():
    v32 = RNG.integers(0, 4, 64).astype(np.uint32)
    v32[32:] = 9  # warp 1: all equal
    v64 = (RNG.integers(0, 3, 64).astype(np.uint64) << np.uint64(40)) + np.uint64(3)
    f = RNG.choice(np.array([1.5, 0.0, -0.0, np.nan], dtype=np.float32), 64)
    out = np.zeros(64 * 5, dtype=np.uint32)
    matches.emulate(v32, v64, f, out, grid=1)
    out = out.reshape(2, 32, 5)
    fbits = f.view(np.uint32)
    for w in range(2):
        sl = slice(32 * w, 32 * w + 32)
        uniform = len(set(v32[sl])) == 1
        assert list(out[w, :, 0]) == match_any_oracle(list(v32[sl]))
        assert (out[w, :, 1] == (0xFFFFFFFF if uniform else 0)).all()
        assert (out[w, :, 2] == int(uniform)).all()
        assert list(out[w, :, 3]) == match_any_oracle(list(v64[sl]))
        assert list(out[w, :, 4]) == match_any_oracle(list(fbits[sl]))  # by bits: 0.0 and -0.0 differ


# -- reductions ---------------------------------------------------------------------------------------------


NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64}


def butterfly_oracle(x: np.ndarray, fn) -> np.ndarray:
    """Lane by lane: at offset d each lane combines its value with lane (lane xor d)'s."""
    v = list(x)
    for d in (16, 8, 4, 2, 1):
        v = [fn(v[i], v[i ^ d]) for i in range(32)]
    return np.array(v, dtype=x.dtype)


def int_oracle(op: str, x: np.ndarray, bits: int, signed: bool):
    vals = [int(a) for a in x]
    if op == "sum":
        r = sum(vals) & ((1 << bits) - 1)
        return r - (1 << bits) if signed and r >= 1 << (bits - 1) else r
    if op in ("max", "min"):
        return max(vals) if op == "max" else min(vals)
    acc = vals[0]
    for a in vals[1:]:
        acc = {"and": acc & a, "or": acc | a, "xor": acc ^ a}[op]
    return acc


@pytest.mark.parametrize("name", ["i32", "u32", "i64", "u64"])
@pytest.mark.parametrize("op", ["sum", "max", "min", "and", "or", "xor"])
def test_integer_warp_reduce_is_exact(name, op):
    dt = np.dtype(NP[name])
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max, 64, dtype=dt, endpoint=True)  # sums wrap
    out = np.zeros(64, dtype=dt)
    REDUCERS[name].emulate(x, out, grid=1, OP=op)
    for w in range(2):
        want = int_oracle(op, x[32 * w:32 * w + 32], dt.itemsize * 8, dt.kind == "i")
        assert all(int(o) == want for o in out[32 * w:32 * w + 32]), (name, op, w)


@pytest.mark.parametrize("name", ["f32", "f64"])
def test_float_warp_sum_follows_the_butterfly_order_bit_for_bit(name):
    dt = NP[name]
    x = (RNG.standard_normal(64) * 10.0 ** RNG.integers(-6, 7, 64)).astype(dt)  # rounding matters
    out = np.zeros(64, dtype=dt)
    REDUCERS[name].emulate(x, out, grid=1, OP="sum")
    for w in range(2):
        xs = x[32 * w:32 * w + 32]
        want = butterfly_oracle(xs, lambda a, b: dt(a + b))
        assert (want == want[0]).all()  # every lane ends with the same bits
        assert np.array_equal(out[32 * w:32 * w + 32].view(np.uint8), want.view(np.uint8))
        assert np.array_equal(want, W.butterfly(np.add, xs))


def test_float_max_and_min_ignore_nan():
    x = RNG.standard_normal(64).astype(np.float32)
    x[3] = np.nan
    x[40:50] = np.nan
    for op, fn in (("max", np.nanmax), ("min", np.nanmin)):
        out = np.zeros(64, dtype=np.float32)
        REDUCERS["f32"].emulate(x, out, grid=1, OP=op)
        assert (out[:32] == fn(x[:32])).all() and (out[32:] == fn(x[32:])).all()


# -- type errors at the kernel line ---------------------------------------------------------------------------

@ty.kernel(threads=32)
def vote_on_float(x: ty.ptr(ty.f32)):
    ty.vote_any(x[0])  # <- vote_float


@ty.kernel(threads=32)
def bad_reduce(x: ty.ptr(ty.f16), WHICH: ty.constexpr):
    if WHICH == 0:
        ty.warp_reduce("prod", ty.cast(x[0], ty.f32))  # <- prod
    elif WHICH == 1:
        ty.warp_reduce("sum", x[0])  # <- f16
    else:
        ty.warp_reduce("xor", ty.cast(x[0], ty.f32))  # <- xor_float


def test_misuse_is_an_error_at_the_line():
    with pytest.raises(ty.KernelSourceError, match=f"{line_of(HERE, 'vote_float')}.*\n(.*\n)*.*vote_any expects an "
                                                   "i1 predicate .*but got a f32 value"):
        vote_on_float.trace()
    cases = [(0, "prod", "warp_reduce op (its first argument) expects one of 'sum'"), (1, "f16", "expects an f32, f64, i32, u32, i64 or "
             "u64 value, but got f16"), (2, "xor_float", "warp_reduce 'xor' expects an integer value, but got f32")]
    for which, marker, text in cases:
        with pytest.raises(ty.KernelSourceError) as e:
            bad_reduce.trace(WHICH=which)
        assert f"line {line_of(HERE, marker)}," in str(e.value) and text in str(e.value)


# -- PTX and ptxas -------------------------------------------------------------------------------------------

def _instructions(ptx: str) -> str:
    return "\n".join(line for line in ptx.splitlines() if not line.strip().startswith("//"))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_ptx_has_the_instructions_and_ptxas_assembles(arch):
    ptx = _instructions(votes.with_arch(arch).compile().ptx)
    for ins in ("vote.sync.ballot.b32", "vote.sync.all.pred", "vote.sync.any.pred", "vote.sync.uni.pred",
                "activemask.b32"):
        assert ins in ptx, ins
    ptx = _instructions(matches.with_arch(arch).compile().ptx)
    assert "match.any.sync.b32" in ptx and "match.all.sync.b32" in ptx and "match.any.sync.b64" in ptx
    assert re.search(r"match\.all\.sync\.b32\s+%r\d+\|%p\d+", ptx)
    ptx = _instructions(REDUCERS["i32"].with_arch(arch).compile(OP="sum").ptx)
    assert "redux.sync.add.s32" in ptx and "shfl" not in ptx
    ptx = _instructions(REDUCERS["u32"].with_arch(arch).compile(OP="min").ptx)
    assert "redux.sync.min.u32" in ptx
    ptx = _instructions(REDUCERS["i32"].with_arch(arch).compile(OP="max").ptx)
    assert "redux.sync.max.s32" in ptx
    ptx = _instructions(REDUCERS["f32"].with_arch(arch).compile(OP="sum").ptx)
    offsets = re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+), 31, -1;", ptx)
    assert offsets == ["16", "8", "4", "2", "1"] and "redux" not in ptx
    ptx = _instructions(REDUCERS["f64"].with_arch(arch).compile(OP="sum").ptx)
    assert len(re.findall(r"shfl\.sync\.bfly\.b32", ptx)) == 10  # two halves per step
