"""Atomics and reductions: oracles from the PTX ISA text, emulation, PTX spelling, ptxas legality.

The ISA defines ``atom`` as ``d = *a; *a = op(*a, b)`` performed atomically, with
``inc(r, s) = r >= s ? 0 : r + 1``, ``dec(r, s) = (r == 0 || r > s) ? s : r - 1``,
``exch(r, s) = s`` and ``cas(r, s, t) = r == s ? t : r``; float adds round to nearest even,
``atom/red.add.f32`` on global memory flushes subnormal inputs and results to zero while on
shared memory it keeps them; the ``.noftz`` f16/bf16 (packed) adds keep subnormals. The
oracles below apply those formulas in the emulator's documented order (lanes in increasing
order; with one warp per test there is no other order to choose). Same-address results on a
GPU may come in another order: the GPU tests compare order-free facts.
"""
import re

import numpy as np
import pytest
import torch

import tylopy as ty
from tylopy.codegen.ptxas import assemble
from tylopy.emulate import MemoryAccessError, ProtocolError
from tylopy.errors import CompileError
from emulate_dsl import line_of
from primitive_probes import INT_KERNELS, LEGAL, NP, cas_lock, counters, int_atomics, to_words  # noqa: F401

HERE = __file__
RNG = np.random.default_rng(99)


def wrap(x: int, bits: int, signed: bool) -> int:
    x &= (1 << bits) - 1
    return x - (1 << bits) if signed and x >= 1 << (bits - 1) else x


def isa_update(op, r, s, bits, signed, t=None):
    """The ISA's ``op(r, s)`` (``cas(r, s, t)``) on Python ints."""
    if op == "add":
        return wrap(r + s, bits, signed)
    table = {"min": min(r, s), "max": max(r, s), "and": r & s, "or": r | s, "xor": r ^ s, "exch": s,
             "inc": 0 if r >= s else r + 1, "dec": s if (r == 0 or r > s) else r - 1}
    if op == "cas":
        return t if r == s else r
    return wrap(table[op], bits, signed)


# -- integer atomics: returned values and final memory -----------------------------------------------------


@pytest.mark.parametrize("op,name", [(op, n) for op, names in LEGAL.items() for n in names])
def test_integer_atomics_follow_the_isa_formulas(op, name):
    dt = np.dtype(NP[name])
    bits, signed = dt.itemsize * 8, dt.kind == "i"
    slots = 3
    if op in ("inc", "dec"):
        x = RNG.integers(0, 6, 32).astype(dt)
        mem0 = RNG.integers(0, 8, slots).astype(dt)
    else:
        info = np.iinfo(dt)
        x = RNG.integers(info.min, info.max, 32, dtype=dt, endpoint=True)
        mem0 = RNG.integers(info.min, info.max, slots, dtype=dt, endpoint=True)
    mem, old = mem0.copy(), np.zeros(32, dt)
    INT_KERNELS[name].emulate(mem, x, old, grid=1, OP=op, SLOTS=slots)
    cur = [int(v) for v in mem0]
    for lane in range(32):
        k = lane % slots
        assert int(old[lane]) == cur[k], (lane, op)
        cur[k] = isa_update(op, cur[k], int(x[lane]), bits, signed)
    assert [int(v) for v in mem] == cur


def test_counter_returns_each_ticket_once():
    ctr, old = np.zeros(3, np.uint32), np.full(128, 777, np.uint32)
    counters.emulate(ctr, old, grid=1, K=3)
    lanes = np.arange(0, 128, 2)
    assert list(ctr) == [int((lanes % 3 == k).sum()) for k in range(3)]
    for k in range(3):
        got = sorted(int(old[t]) for t in lanes if t % 3 == k)
        assert got == list(range(int(ctr[k])))  # the ISA: every ticket 0..n-1 handed out exactly once
    assert (old[1::2] == 777).all()


def test_compare_and_swap_lets_one_lane_win():
    lock, old = np.zeros(1, np.int32), np.zeros(32, np.int32)
    cas_lock.emulate(lock, old, grid=1)
    winners = [t for t in range(32) if old[t] == 0]
    assert winners == [0] and lock[0] == 1 and (old[1:] == 1).all()  # lane order: lane 0 wins


# -- float adds: rounding, flushing, packed halves, vectors --------------------------------------------------

@ty.kernel(threads=32)
def float_adds(g: ty.ptr(ty.f32), x: ty.ptr(ty.f32), old: ty.ptr(ty.f32), s_out: ty.ptr(ty.f32)):
    t = ty.thread_idx()
    old[t] = ty.atomic_add(g, x[t])
    s = ty.shared(ty.f32, 1)
    if t == 0:
        s[0] = g[1]
    ty.syncthreads()
    ty.red_add(s, x[t])
    ty.syncthreads()
    if t == 0:
        s_out[0] = s[0]


def sequential_f32(start, xs, flush: bool):
    def ftz(v):
        return np.float32(0.0) * np.sign(v) if abs(v) < 2.0 ** -126 else v
    cur, olds = np.float32(start), []
    for v in xs:
        olds.append(cur)
        cur = np.float32((ftz(cur) + ftz(np.float32(v))) if flush else (cur + np.float32(v)))
        cur = ftz(cur) if flush else cur
    return np.array(olds, np.float32), cur


def test_f32_adds_round_in_lane_order():
    x = (RNG.standard_normal(32) * 10.0 ** RNG.integers(-5, 6, 32)).astype(np.float32)
    g = np.array([0.25, 1.5], np.float32)
    old, s_out = np.zeros(32, np.float32), np.zeros(1, np.float32)
    float_adds.emulate(g, x, old, s_out, grid=1)
    want_old, want = sequential_f32(0.25, x, flush=True)
    assert np.array_equal(old, want_old) and g[0] == want
    assert s_out[0] == sequential_f32(1.5, x, flush=False)[1]


def test_f32_add_flushes_subnormals_on_global_memory_only():
    tiny = np.float32(1e-39)  # subnormal
    x = np.full(32, tiny, np.float32)
    g = np.array([0.0, 0.0], np.float32)
    old, s_out = np.zeros(32, np.float32), np.zeros(1, np.float32)
    float_adds.emulate(g, x, old, s_out, grid=1)
    assert g[0] == 0.0 and (old == 0.0).all()
    assert s_out[0] == sequential_f32(0.0, x, flush=False)[1] and s_out[0] > 0


@ty.kernel(threads=32)
def packed_adds(own: ty.ptr(ty.b32), common: ty.ptr(ty.b32), x: ty.ptr(ty.b32), old: ty.ptr(ty.b32),
                HALF: ty.constexpr):
    t = ty.thread_idx()
    old[t] = ty.atomic_add(own + t, x[t], packed=HALF)
    ty.red_add(common, x[t], packed=HALF)


def halves(words, dtype):
    return torch.from_numpy(np.ascontiguousarray(words).view(np.int16)).view(dtype).float().numpy()


@pytest.mark.parametrize("half,dtype", [("f16x2", torch.float16), ("bf16x2", torch.bfloat16)])
def test_packed_half_adds_round_each_half_once(half, dtype):
    # moderate exponents: every f32 sum of two halves is exact, so rounding it once is the oracle
    a = (RNG.standard_normal(64) * 4).astype(np.float32)
    b = (RNG.standard_normal(64) * 4).astype(np.float32)
    a[0], b[0] = 6e-8 if half == "f16x2" else 1e-38, 0.0  # a subnormal half survives (.noftz)
    own, x = to_words(a, dtype), to_words(b, dtype)
    common = to_words([0.5, -0.25], dtype)
    old = np.zeros(32, np.uint32)
    common0 = common.copy()
    packed_adds.emulate(own, common, x, old, grid=1, HALF=half)
    want = to_words(halves(to_words(a, dtype), dtype) + halves(x, dtype), dtype)  # f32 sum exact; one rounding
    assert np.array_equal(own, want)
    assert np.array_equal(old, to_words(a, dtype))
    assert halves(own, dtype)[0] != 0.0
    cur = halves(common0, dtype)
    xs = halves(x, dtype).reshape(32, 2)
    for lane in range(32):
        cur = halves(to_words(cur + xs[lane], dtype), dtype)  # lane order, one rounding per add
    assert np.array_equal(common, to_words(cur, dtype))


@ty.kernel(threads=32)
def vector_red(out: ty.ptr(ty.f32), x: ty.ptr(ty.f32)):
    t = ty.thread_idx()
    ty.red_add(out + 4 * (t % 2), (x[4 * t], x[4 * t + 1], x[4 * t + 2], x[4 * t + 3]))


def test_vector_reduction_adds_four_floats_per_lane():
    x = RNG.standard_normal(128).astype(np.float32)
    out = np.zeros(8, np.float32)
    vector_red.emulate(out, x, grid=1)
    want = np.zeros(8, np.float32)
    for lane in range(32):
        for j in range(4):
            want[4 * (lane % 2) + j] = np.float32(want[4 * (lane % 2) + j] + x[4 * lane + j])
    assert np.array_equal(out, want)


@ty.kernel(threads=32)
def misaligned_vector(out: ty.ptr(ty.f32)):
    ty.red_add(out + 2, (1.0, 2.0, 3.0, 4.0))  # <- misaligned_red


def test_a_misaligned_vector_reduction_is_a_memory_error():
    with pytest.raises(MemoryAccessError, match=f"misaligned atomic at .*:{line_of(HERE, 'misaligned_red')}.*16"):
        misaligned_vector.emulate(np.zeros(8, np.float32), grid=1)


@ty.kernel(threads=64)
def generic_atomics(g: ty.ptr(ty.u32), out: ty.ptr(ty.u32)):
    t = ty.thread_idx()
    s = ty.shared(ty.u32, 1)
    if t == 0:
        s[0] = 0
    ty.syncthreads()
    ty.atomic_add(ty.ptr_cast(s, space="generic"), 2)
    ty.atomic_add(ty.ptr_cast(g, space="generic"), 3)
    ty.syncthreads()
    if t == 0:
        out[0] = s[0]


def test_generic_pointers_reach_shared_and_global_memory():
    g, out = np.zeros(1, np.uint32), np.zeros(1, np.uint32)
    generic_atomics.emulate(g, out, grid=1)
    assert out[0] == 128 and g[0] == 192


# -- races with ordinary shared-memory accesses ---------------------------------------------------------------

@ty.kernel(threads=64)
def shared_race(out: ty.ptr(ty.u32), CASE: ty.constexpr):
    t = ty.thread_idx()
    s = ty.shared(ty.u32, 4)
    if t == 0:
        s[0] = 5  # <- plain_store
    if CASE != "unordered":
        ty.syncthreads()
    if CASE == "read" and t == 0:
        out[0] = s[0]  # <- unordered_read
    if CASE == "both":
        ty.atomic_add(s, 1)
    elif ty.warp_idx() == 1:
        ty.atomic_add(s, 1)  # <- racing_atomic
    if CASE != "read":
        ty.syncthreads()
        out[t] = s[0]


def race_message(case: str) -> str:
    with pytest.raises(ProtocolError) as e:
        shared_race.emulate(np.zeros(64, np.uint32), grid=1, CASE=case)
    return str(e.value)


def test_atomic_and_an_unordered_store_race():
    msg = race_message("unordered")  # whichever warp runs first, the message names both lines
    assert msg.startswith("shared-memory race at ")
    assert f":{line_of(HERE, 'racing_atomic')} " in msg and f":{line_of(HERE, 'plain_store')} " in msg
    if msg.index("racing_atomic") < msg.index("plain_store"):
        assert "atomically updates smem0+0, which warp 0 wrote with an ordinary store" in msg


def test_atomic_and_an_unordered_read_race():
    msg = race_message("read")
    assert msg.startswith("shared-memory race at ")
    assert f":{line_of(HERE, 'racing_atomic')} " in msg and f":{line_of(HERE, 'unordered_read')} " in msg


@pytest.mark.parametrize("case,total", [("ordered", 5 + 32), ("both", 5 + 64)])
def test_ordered_atomics_are_clean_and_atomics_do_not_race_each_other(case, total):
    out = np.zeros(64, np.uint32)
    shared_race.emulate(out, grid=1, CASE=case)
    assert (out == total).all()


# -- PTX spelling, ptxas, and rejections that match ptxas' -----------------------------------------------------

@ty.kernel(threads=32)
def spelled(g32: ty.ptr(ty.u32), gi: ty.ptr(ty.i32), g64: ty.ptr(ty.u64), gi64: ty.ptr(ty.i64), f: ty.ptr(ty.f32),
            d: ty.ptr(ty.f64), h: ty.ptr(ty.f16), bh: ty.ptr(ty.bf16), w: ty.ptr(ty.b32), SM90: ty.constexpr):
    t = ty.thread_idx()
    s = ty.shared(ty.u32, 32)
    sw = ty.shared(ty.b32, 32)
    x = ty.cast(t, ty.u32)
    g32[0] = ty.atomic_add(g32 + 1, x, sem="acquire")
    ty.red_add(s + t, x, sem="release", scope="cta")
    gi[0] = ty.atomic_min(gi + 1, t)
    g64[0] = ty.atomic_cas(g64 + 1, 0, ty.cast(t, ty.u64), sem="acq_rel", scope="sys")
    gi64[0] = ty.atomic_max(gi64 + 1, ty.cast(t, ty.i64))
    ty.red_and(g64 + 2, ty.cast(t, ty.u64))
    f[0] = ty.atomic_exch(f + 1, 2.0)
    ty.red_add(f + 2, 1.0)
    d[0] = ty.atomic_add(d + 1, 1.0)
    g32[2] = ty.atomic_inc(g32 + 3, 7)
    ty.red_dec(g32 + 4, 7)
    h[0] = ty.atomic_add(h + 1, 1.0)
    ty.red_add(sw + t, w[t], packed="f16x2")
    ty.red_xor(s + t, x)
    ty.red_add(ty.ptr_cast(f, space="generic") + 3, 1.0)
    if SM90:
        bh[0] = ty.atomic_add(bh + 1, 1.0)
        ty.red_add(w + 1, w[0], packed="bf16x2")
        ty.red_add(f + 4, (1.0, 2.0, 3.0, 4.0))
        ty.red_add(f + 8, (1.0, 2.0))
        ty.red_add(g32 + 5, x, scope="cluster")


COMMON_PTX = ["atom.acquire.gpu.global.add.u32", "red.release.cta.shared.add.u32", "atom.global.min.s32",
              "atom.acq_rel.sys.global.cas.b64", "atom.global.max.s64", "red.global.and.b64", "atom.global.exch.b32",
              "red.global.add.f32", "atom.global.add.f64", "atom.global.inc.u32", "red.global.dec.u32",
              "atom.global.add.noftz.f16", "red.shared.add.noftz.f16x2", "red.shared.xor.b32", "red.add.f32 "]
SM90_PTX = ["atom.global.add.noftz.bf16", "red.global.add.noftz.bf16x2", "red.global.v4.f32.add",
            "red.global.v2.f32.add", "red.relaxed.cluster.global.add.u32"]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_each_atomic_is_spelled_as_written_and_assembles(arch):
    ck = spelled.with_arch(arch).compile(SM90=arch == "sm_90a")  # compile runs ptxas
    ptx = "\n".join(line for line in ck.ptx.splitlines() if not line.strip().startswith("//"))
    for ins in COMMON_PTX + (SM90_PTX if arch == "sm_90a" else []):
        assert ins in ptx, ins
    assert "red.global.v4.f32.add [%rd" in ptx or arch == "sm_80"


@ty.kernel(threads=32)
def rejected(g32: ty.ptr(ty.u32), g64: ty.ptr(ty.u64), gi64: ty.ptr(ty.i64), f: ty.ptr(ty.f32),
             bh: ty.ptr(ty.bf16), WHICH: ty.constexpr):
    s = ty.shared(ty.f32, 8)
    if WHICH == "add_s64":
        ty.atomic_add(gi64, 1)  # <- rejected
    elif WHICH == "inc_u64":
        ty.atomic_inc(g64, 1)  # <- rejected
    elif WHICH == "red_acquire":
        ty.red_add(g32, 1, sem="acquire")  # <- rejected
    elif WHICH == "min_f32":
        ty.atomic_min(f, 1.0)  # <- rejected
    elif WHICH == "and_f32":
        ty.atomic_and(f, 1.0)  # <- rejected
    elif WHICH == "cas_f32":
        ty.atomic_cas(f, 1.0, 2.0)  # <- rejected
    elif WHICH == "vec_shared":
        ty.red_add(s, (1.0, 2.0, 3.0, 4.0))  # <- rejected
    elif WHICH == "bf16_sm80":
        ty.atomic_add(bh, 1.0)  # <- rejected
    elif WHICH == "cluster_sm80":
        ty.red_add(g32, 1, scope="cluster")  # <- rejected
    elif WHICH == "vec_sm80":
        ty.red_add(f, (1.0, 2.0, 3.0, 4.0))  # <- rejected


PTXAS_REJECTS = {  # what each rejected call would be in PTX; ptxas must refuse it too
    "add_s64": ("sm_90a", "atom.global.add.s64 %rd2, [%rd1], %rd3;", "atomic_add expects a pointer to"),
    "inc_u64": ("sm_90a", "atom.global.inc.u64 %rd2, [%rd1], %rd3;", "atomic_inc expects a pointer to u32"),
    "red_acquire": ("sm_90a", "red.acquire.gpu.global.add.u32 [%rd1], %r3;", "red_add sem expects one of 'relaxed', "
                                                                               "'release', but got 'acquire'"),
    "min_f32": ("sm_90a", "atom.global.min.f32 %f1, [%rd1], %f2;", "atomic_min expects a pointer to i32, u32"),
    "and_f32": ("sm_90a", "atom.global.and.f32 %f1, [%rd1], %f2;", "atomic_and expects a pointer to"),
    "cas_f32": ("sm_90a", "atom.global.cas.f32 %f1, [%rd1], %f2, %f3;", "atomic_cas expects a pointer to"),
    "vec_shared": ("sm_90a", "red.shared.v4.f32.add [%r1], {%f1, %f2, %f3, %f4};", "red_add with a tuple expects 2 "
                                                                                  "or 4 f32 values added to a global"),
    "bf16_sm80": ("sm_80", "atom.global.add.noftz.bf16 %h1, [%rd1], %h2;", "atomic_add with bf16 values needs sm_90"),
    "cluster_sm80": ("sm_80", "red.relaxed.cluster.global.add.u32 [%rd1], %r3;", "red_add with scope='cluster' needs "
                                                                                 "sm_90"),
    "vec_sm80": ("sm_80", "red.global.v4.f32.add [%rd1], {%f1, %f2, %f3, %f4};", "red_add with a vector of values "
                                                                                "needs sm_90"),
}

PTX_FRAME = """.version 8.5
.target {arch}
.address_size 64
.visible .entry k(.param .u64 p){{
.reg .b32 %r<8>; .reg .b64 %rd<8>; .reg .f32 %f<8>; .reg .b16 %h<4>;
ld.param.u64 %rd1, [p];
mov.u32 %r1, 0;
{body}
ret;
}}
"""


@pytest.mark.parametrize("which", sorted(PTXAS_REJECTS))
def test_the_rules_reject_what_ptxas_rejects(which):
    arch, ptx_line, message = PTXAS_REJECTS[which]
    with pytest.raises(CompileError):
        assemble(PTX_FRAME.format(arch=arch, body=ptx_line), arch)
    assemble(PTX_FRAME.format(arch=arch, body="atom.global.add.u32 %r2, [%rd1], %r3;"), arch)  # the frame is fine
    with pytest.raises(ty.KernelSourceError) as e:
        rejected.with_arch(arch).trace(WHICH=which)
    assert message in str(e.value)
    line = int(re.search(r'test_primitives_atomics.py", line (\d+)', str(e.value)).group(1))
    assert open(HERE).read().splitlines()[line - 1].endswith("# <- rejected") and which in rejected_case(line)


def rejected_case(line: int) -> str:
    """The WHICH value of the branch that holds ``line`` in ``rejected``."""
    src = open(HERE).read().splitlines()
    return re.search(r'WHICH == "(\w+)"', src[line - 2]).group(1)


def test_bad_sem_scope_and_packed_arguments_name_the_argument():
    @ty.kernel(threads=32)
    def bad(g: ty.ptr(ty.u32), f: ty.ptr(ty.f32), WHICH: ty.constexpr):
        if WHICH == 0:
            ty.atomic_add(g, 1, sem="seq_cst")
        elif WHICH == 1:
            ty.atomic_add(g, 1, scope="device")
        elif WHICH == 2:
            ty.atomic_add(f, 1.0, packed="f16x2")
        elif WHICH == 3:
            ty.atomic_add(g, 1.5)
        else:
            ty.atomic_add(7, 1)
    texts = ["atomic_add sem expects one of 'relaxed', 'acquire', 'release', 'acq_rel', but got 'seq_cst'",
             "atomic_add scope expects one of 'cta', 'cluster', 'gpu', 'sys', but got 'device'",
             "atomic_add with packed='f16x2' expects a pointer to b32 words, but got ptr<f32, global>",
             "the float literal 1.5 cannot be combined with a u32 value",
             "atomic_add expects a pointer as its first argument, but got 7"]
    for which, text in enumerate(texts):
        with pytest.raises(ty.KernelSourceError, match=text.replace("(", "\\(").replace("+", "\\+")):
            bad.trace(WHICH=which)


@pytest.mark.parametrize("case,other", [("unordered", "plain_store"), ("read", "unordered_read")])
def test_races_are_caught_in_every_schedule(case, other):
    for seed in range(6):  # random warp orders: the atomic's check or the plain access's check fires
        with pytest.raises(ProtocolError) as e:
            shared_race.emulate(np.zeros(64, np.uint32), grid=1, CASE=case, seed=seed)
        msg = str(e.value)
        assert f":{line_of(HERE, 'racing_atomic')} " in msg and f":{line_of(HERE, other)} " in msg, (seed, msg)
    for seed in range(3):
        out = np.zeros(64, np.uint32)
        shared_race.emulate(out, grid=1, CASE="both", seed=seed)
        assert (out == 5 + 64).all()
