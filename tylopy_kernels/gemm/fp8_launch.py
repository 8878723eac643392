"""Host side of the scaled FP8 GEMM (``fp8.py``): argument checks, scale forms, tensor maps,
schedules and the autotuned launch behind ``tylopy.scaled_matmul``.

Operand requirements (FP8 wgmma reads both operands K-major and TMA needs 16-byte strides):

* ``a`` (M x K) row-major: ``a.stride(1) == 1``, its row stride a multiple of 16 elements;
* ``b`` (K x N) column-major, i.e. ``w.t()`` of a row-major (N x K) weight: ``b.stride(0) == 1``,
  its column stride a multiple of 16;
* K a multiple of 16 (16 bytes of fp8 codes; torch._scaled_mm asks the same), both data pointers
  16-byte aligned. M and N are free (tiles past them are clipped).

Other layouts are refused with the argument named, never copied silently: ``a.contiguous()``
or ``w.t()`` of a contiguous weight (``b.t().contiguous().t()``, one pass over B) make them.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch

import tylopy as ty
from tylopy.benchmarking import median_ms
from tylopy.runtime.devices import sm_count
from tylopy.runtime.tensormap import TensorMap, TensorMapSpec

from tylopy_kernels.gemm.fp8 import BLOCK_K, BLOCK_M, Fp8Plan, fit_stages, gemm_fp8_sm90
from tylopy_kernels.gemm.launch import output_buffer, _row_elems

FP8 = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
TY_DTYPE = {"e4m3": ty.e4m3, "e5m2": ty.e5m2, torch.bfloat16: ty.bf16, torch.float16: ty.f16,
            torch.float32: ty.f32}
MAP_DTYPE = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SCHEDULE_KEYS = ("BLOCK_N", "STAGES", "GROUP_M")


def _fail(exc, arg, expected, got):
    raise exc(f"scaled_matmul: {arg} expects {expected}, but got {got}")


def scale_form(m, n, k, scale_a, scale_b) -> str:
    """'tensor', 'row' or 'block' from the scales' shapes (torch._scaled_mm's conventions), or an
    error naming the scale that fits none."""
    kb, nb = -(-k // BLOCK_K), -(-n // 128)
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return "tensor"
    if sa == (m, 1) and sb == (1, n):
        return "row"
    if sa == (m, kb) and sb == (kb, nb):
        return "block"
    forms = (f"one element each (per tensor), ({m}, 1) and (1, {n}) (per row of a, per column of b), or "
             f"({m}, {kb}) and ({kb}, {nb}) (1 x 128 blocks of a, 128 x 128 blocks of b)")
    if scale_a.numel() == 1 or sa in ((m, 1), (m, kb)):
        _fail(ValueError, "scale_b", f"the shape matching scale_a {sa}, among {forms}", f"shape {sb}")
    _fail(ValueError, "scale_a", forms, f"shape {sa} (scale_b {sb})")


def _address_known(t) -> bool:
    """Whether ``t`` has a data pointer (not a meta or fake tensor, not under a trace)."""
    return type(t) is torch.Tensor and not t.is_meta and not torch.compiler.is_compiling()


def _check_tensor(name, t, dtypes, what):
    if not isinstance(t, torch.Tensor):
        _fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dtype not in dtypes:
        _fail(TypeError, name, what, t.dtype)


def check_inputs(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16, use_fast_accum=False, schedule=None):
    """Validate; returns (M, N, K, scale form, out_dtype)."""
    fp8 = "dtype torch.float8_e4m3fn or torch.float8_e5m2"
    _check_tensor("a", a, FP8, fp8)
    _check_tensor("b", b, FP8, fp8)
    if a.dim() != 2:
        _fail(ValueError, "a", "a 2-D (M, K) tensor", f"shape {tuple(a.shape)}")
    if b.dim() != 2:
        _fail(ValueError, "b", "a 2-D (K, N) tensor", f"shape {tuple(b.shape)}")
    m, k = a.shape
    if b.shape[0] != k:
        _fail(ValueError, "b", f"{k} rows (a.shape[1], the K dimension)", f"shape {tuple(b.shape)}")
    n = b.shape[1]
    for name, t in (("b", b), ("scale_a", scale_a), ("scale_b", scale_b), ("bias", bias)):
        if isinstance(t, torch.Tensor) and t.device != a.device:
            _fail(ValueError, name, f"a's device {a.device}", t.device)
    if k % 16:
        _fail(ValueError, "a", "K (a.shape[1]) a multiple of 16 (16-byte rows of fp8 codes for TMA)", k)
    if k and a.stride(1) != 1:
        _fail(ValueError, "a", "a row-major (M, K) tensor, a.stride(1) == 1 (FP8 wgmma reads A K-major; "
              "a.contiguous() makes one)", f"strides {tuple(a.stride())}")
    if k and b.stride(0) != 1:
        _fail(ValueError, "b", "a column-major (K, N) tensor, b.stride(0) == 1, e.g. w.t() of a row-major (N, K) "
              "weight (FP8 wgmma reads B K-major; b.t().contiguous().t() makes one, a pass over B)",
              f"strides {tuple(b.stride())}")
    for name, t, lead in (("a", a, a.stride(0) if m > 1 else 16), ("b", b, b.stride(1) if n > 1 else 16)):
        if k and (lead % 16 or (_address_known(t) and t.data_ptr() % 16)):
            _fail(ValueError, name, "16-byte aligned rows of K (TMA): a data pointer and a "
                  f"{'row' if name == 'a' else 'column'} stride that are multiples of 16",
                  f"strides {tuple(t.stride())}, address {t.data_ptr() % 16} mod 16")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        _check_tensor(name, s, (torch.float32,), "dtype torch.float32")
    form = scale_form(m, n, k, scale_a, scale_b)
    if bias is not None:
        _check_tensor("bias", bias, OUT_DTYPES, "dtype torch.bfloat16, torch.float16 or torch.float32")
        if bias.dim() != 1 or bias.shape[0] != n:
            _fail(ValueError, "bias", f"a 1-D tensor of N = {n} elements", f"shape {tuple(bias.shape)}")
    if out_dtype is None:
        out_dtype = torch.bfloat16
    if out_dtype not in OUT_DTYPES:
        _fail(TypeError, "out_dtype", "torch.bfloat16, torch.float16 or torch.float32 (fp8 output is not "
              "supported)", out_dtype)
    if not isinstance(use_fast_accum, bool):
        _fail(TypeError, "use_fast_accum", "a bool", type(use_fast_accum).__name__)
    if schedule is not None:
        check_schedule(schedule, form != "block" and use_fast_accum)
    return m, n, k, form, out_dtype


def check_schedule(schedule, fast_accum):
    if not isinstance(schedule, dict):
        _fail(TypeError, "schedule", "a dict of the kernel's schedule constexprs or None", type(schedule).__name__)
    unknown = set(schedule) - set(SCHEDULE_KEYS)
    if unknown:
        _fail(ValueError, "schedule", f"keys among {SCHEDULE_KEYS}", sorted(unknown))
    full = full_schedule(schedule, not fast_accum)
    try:
        Fp8Plan(full["BLOCK_N"], full["STAGES"], "bf16", not fast_accum)
    except ValueError as e:
        raise ValueError(f"scaled_matmul: schedule {schedule} is not valid: {e}") from None
    g = full["GROUP_M"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        _fail(ValueError, "schedule GROUP_M", "a positive int", g)


# -- schedules -----------------------------------------------------------------------------------------

def schedule(block_n, group_m=8, promote=False) -> dict:
    return dict(BLOCK_N=block_n, GROUP_M=group_m, STAGES=fit_stages(block_n, "bf16", promote), PROMOTE=promote)


# Candidates, the heuristic default of each accumulation mode first. The chained (fast-accum)
# kernel's 128 x 256 tile is the example's measured best (1442 TFLOP/s at 4096^3 on an H200);
# promotion keeps two accumulators, so its tiles are at most 128 wide.
CHAINED = [schedule(256), schedule(256, 16), schedule(128), schedule(128, 16)]
PROMOTED = [schedule(128, promote=True), schedule(128, 16, promote=True), schedule(64, promote=True)]
CONFIGS = CHAINED + PROMOTED


def full_schedule(partial: dict, promote: bool) -> dict:
    """A user's partial schedule completed from the mode's first config (the deepest ring that fits
    when BLOCK_N changes and STAGES is not given)."""
    out = dict((PROMOTED if promote else CHAINED)[0], **partial, PROMOTE=promote)
    if "STAGES" not in partial:
        out["STAGES"] = fit_stages(out["BLOCK_N"], "bf16", promote) if out["BLOCK_N"] in (64, 128, 256) else 2
    return out


def tiles(m, n, cfg) -> int:
    return -(-m // BLOCK_M) * -(-n // cfg["BLOCK_N"])


def prune(arguments: dict, configs: list) -> list:
    """The configs of the call's accumulation mode, the one likely best first: the widest tile
    that still fills the SMs, else the one with the most tiles."""
    a, b, promote = arguments["a"], arguments["b"], arguments["promote"]
    m, n = a.shape[0], b.shape[1]
    sms = sm_count(a.device.index) if a.is_cuda else 132
    dicts = [c.kwargs for c in configs if c.kwargs["PROMOTE"] == promote]
    big = [c for c in dicts if tiles(m, n, c) >= sms]
    first = big[0] if big else max(dicts, key=lambda c: tiles(m, n, c))
    return [first] + [c for c in dicts if c != first]


# -- launch plans ----------------------------------------------------------------------------------------

def _lead(t, outer_dim) -> int:
    """Stride of the non-contiguous dimension in bytes (K rounded up to 16 for a single row)."""
    return t.stride(outer_dim) if t.shape[outer_dim] > 1 else -(-t.shape[1 - outer_dim] // 16) * 16


def scale_strides(form, scale_a, scale_b) -> tuple:
    """(sa_m, sa_k, sb_k, sb_n) in elements for the kernel."""
    if form == "tensor":
        return 0, 0, 0, 0
    if form == "row":
        return scale_a.stride(0), 0, 0, scale_b.stride(1)
    return scale_a.stride(0), scale_a.stride(1), scale_b.stride(0), scale_b.stride(1)


def _by_strides(s):
    """A scale tensor for a ``ty.ptr`` parameter: the kernel addresses it through the strides it
    gets (a view marked as such when its last dimension is not contiguous)."""
    if s.dim() and s.shape[-1] > 1 and s.stride(-1) != 1:
        return ty.strided(s.as_strided(s.shape, s.stride()))
    return s


class Fp8Operands(NamedTuple):
    """The operands of one scaled product: a (M, K) and b (K, N) in FP8, their float32 scales in
    one of torch._scaled_mm's forms (``scale_form``) and an optional bias (N,)."""

    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    bias: Optional[torch.Tensor] = None


class LaunchPlan:
    """Everything about a launch that depends only on shapes, strides, dtypes and the schedule;
    a call then looks up tensor maps for the tensors' addresses and launches."""

    def __init__(self, operands: Fp8Operands, out_dtype, form, cfg, sms):
        a, b, scale_a, scale_b, bias = operands
        m, k = a.shape
        n = b.shape[1]
        self.m, self.n, self.k, self.out_dtype = m, n, k, out_dtype
        promote = cfg["PROMOTE"]
        self.ga = ((k, m), (_lead(a, 0),), (BLOCK_K, BLOCK_M), FP8[a.dtype])
        self.gb = ((k, n), (_lead(b, 1),), (BLOCK_K, cfg["BLOCK_N"]), FP8[b.dtype])
        plan = Fp8Plan(cfg["BLOCK_N"], cfg["STAGES"], MAP_DTYPE[out_dtype], promote)
        self.ld = _row_elems(n, out_dtype)
        self.gc = ((n, m), (self.ld * out_dtype.itemsize,), (plan.epi_cols, 64), MAP_DTYPE[out_dtype])
        self.strides = scale_strides(form, scale_a, scale_b)
        self.cx = dict(A_DTYPE=TY_DTYPE[FP8[a.dtype]], B_DTYPE=TY_DTYPE[FP8[b.dtype]], OUT_DTYPE=TY_DTYPE[out_dtype],
                       SCALE=form, HAS_BIAS=bias is not None,
                       BIAS_DTYPE=TY_DTYPE[bias.dtype] if bias is not None else ty.f32, **cfg)
        self.grid = (max(1, min(tiles(m, n, cfg), sms)),)

    def args(self, a, b, out, scale_a, scale_b, bias, spec=False) -> tuple:
        if spec:
            maps = [TensorMapSpec(t, g[0], g[1], g[2], g[3], 128) for t, g in ((a, self.ga), (b, self.gb), (out, self.gc))]
        else:
            maps = [TensorMap.cached(t, *g) for t, g in ((a, self.ga), (b, self.gb), (out, self.gc))]
        b_ptr = bias.view(torch.uint8) if bias is not None else a.view(torch.uint8)  # a placeholder without bias
        return (*maps, b_ptr, _by_strides(scale_a), _by_strides(scale_b), self.m, self.n, self.k, *self.strides)

    def __call__(self, a, b, out, scale_a, scale_b, bias):
        # repeat(): a layer calls with the same weights, scales and (the allocator's) output buffer
        # again and again; only the arguments that changed are checked and packed
        gemm_fp8_sm90[self.grid].repeat(*self.args(a, b, out, scale_a, scale_b, bias), **self.cx)


def emulate(operands: Fp8Operands, out_dtype=torch.bfloat16, use_fast_accum=False, schedule=None, grid=2):
    """The kernel in the emulator on CPU tensors (the tests' way in): returns C."""
    a, b, scale_a, scale_b, bias = operands
    m, n, k, form, out_dtype = check_inputs(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, schedule)
    promote = form == "block" or not use_fast_accum
    cfg = full_schedule(schedule or {}, promote)
    out = output_buffer(m, n, out_dtype, a.device)
    out.as_strided((m, out.stride(0)), (out.stride(0), 1)).fill_(float("nan"))  # the row padding too
    p = LaunchPlan(operands, out_dtype, form, cfg, sms=grid)
    gemm_fp8_sm90.emulate(*p.args(a, b, out, scale_a, scale_b, bias, spec=True), grid=p.grid, **p.cx)
    return out


@ty.autotune(configs=CONFIGS, key=["a", "b", "out", "scale_a", "scale_b", "bias", "promote"], prune=prune,
             timer=functools.partial(median_ms, warmup_ms=25, rep_ms=100), name="tylopy_kernels.gemm.fp8")
def run(a, b, out, scale_a, scale_b, bias, promote, **cfg):
    """C = scale(A B) + bias into ``out`` with the autotuned schedule (or ``cfg`` when given); the
    scales' shapes give their form (``scale_form``)."""
    form = scale_form(a.shape[0], b.shape[1], a.shape[1], scale_a, scale_b)
    make_plan(a, b, out, scale_a, scale_b, bias, form, cfg)(a, b, out, scale_a, scale_b, bias)


def make_plan(a, b, out, scale_a, scale_b, bias, form, cfg) -> LaunchPlan:
    return LaunchPlan(Fp8Operands(a, b, scale_a, scale_b, bias), out.dtype, form, cfg, sm_count(a.device.index))
