"""Host side of the Hopper GEMM: operand layouts, tensor maps, schedules, autotuned launch.

``run(a, b, out, bias, epilogue)`` launches ``gemm_sm90`` for 2-D tensors that TMA can read
(``prepare`` makes them so); the schedule (tile shape, consumer arrangement, ring depth, tile
order, store path) comes from ``ty.autotune`` over ``CONFIGS`` keyed by the shapes, dtypes,
strides, bias, epilogue and device.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

import tylopy as ty
from tylopy.benchmarking import median_ms
from tylopy.runtime.devices import sm_count
from tylopy.runtime.tensormap import TensorMap, TensorMapSpec

from tylopy_kernels.gemm.hopper import gemm_sm90
from tylopy_kernels.gemm.splitk import blocks as splitk_blocks
from tylopy_kernels.gemm.splitk import splitk_reduce
from tylopy_kernels.gemm.plan import BLOCK_K, CHUNK_ROWS, SMEM_LIMIT, Plan

TY_DTYPE = {torch.bfloat16: ty.bf16, torch.float16: ty.f16, torch.float32: ty.f32}
MAP_DTYPE = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
STORE = "tma"                 # the epilogue path of every config ("direct": register -> global stores)
TMA_STORE_AVAILABLE = True


def fit_stages(block_m, block_n, schedule, store=STORE, most=8) -> int:
    """The deepest ring (up to ``most``) that fits in shared memory with this tile and store path."""
    Plan(block_m, block_n, 2, schedule, "bf16", store)  # names a bad tile, schedule or store
    for stages in range(most, 2, -1):
        try:
            Plan(block_m, block_n, stages, schedule, "bf16", store)
            return stages
        except ValueError:
            continue
    return 2


def schedule(block_m, block_n, kind, group_m=8, stages=None, store=STORE, split_k=1) -> dict:
    out = dict(BLOCK_M=block_m, BLOCK_N=block_n, SCHEDULE=kind, GROUP_M=group_m, STORE=store,
               STAGES=stages or fit_stages(block_m, block_n, kind, store))
    if split_k != 1:
        out["SPLIT_K"] = split_k
    return out


# Candidates, large tiles first. The autotuner times them per problem; ``prune`` puts the
# heuristic default first (what runs with TYLOPY_AUTOTUNE=0). Measured on an H200 (sweep of
# every schedule x GROUP_M 8/16 x store path): cooperative 128x256 with GROUP_M=16 and TMA stores
# led at 4096^3 (723 TFLOP/s) and 8192^3 (700); GROUP_M=16 beat 8 by 2-3% on the large shapes.
LARGE = [schedule(128, 256, "cooperative", group_m=16), schedule(128, 128, "pingpong", group_m=16), schedule(256, 128, "cooperative"),
         schedule(64, 256, "pingpong"), schedule(128, 128, "cooperative")]
SMALL = [schedule(64, 128, "pingpong"), schedule(64, 64, "pingpong"), schedule(128, 64, "cooperative"),
         schedule(64, 128, "pingpong", split_k="auto"), schedule(128, 128, "cooperative", split_k="auto")]
CONFIGS = LARGE + SMALL


def full_schedule(partial: dict) -> dict:
    """A user's partial schedule completed from the first config (the deepest ring that fits
    when the tile or store changes and STAGES is not given)."""
    out = dict(CONFIGS[0], **partial)
    if "STAGES" not in partial:
        out["STAGES"] = fit_stages(out["BLOCK_M"], out["BLOCK_N"], out["SCHEDULE"], out["STORE"])
    return out


def tiles(m, n, cfg) -> int:
    bm = cfg["BLOCK_M"]
    return -(-m // bm) * -(-n // cfg["BLOCK_N"])


def prune(arguments: dict, configs: list) -> list:
    """Every config, the likely best first: big tiles when they fill the SMs, small ones otherwise."""
    a, b = arguments["a"], arguments["b"]
    m, n = a.shape[0], b.shape[1]
    sms = sm_count(a.device.index) if a.is_cuda else 132
    k = a.shape[1]
    # a split-K config that would not split here duplicates its unsplit twin
    dicts = [c.kwargs for c in configs if c.kwargs.get("SPLIT_K", 1) == 1 or split_of(m, n, k, c.kwargs, sms) > 1]
    big = [c for c in dicts if tiles(m, n, c) >= sms]
    if m <= 64:
        first = schedule(64, 128, "pingpong") if tiles(m, n, schedule(64, 128, "pingpong")) >= sms \
            else schedule(64, 64, "pingpong")
    else:
        first = big[0] if big else max(dicts, key=lambda c: (tiles(m, n, c) >= sms // 2, c["BLOCK_M"] * c["BLOCK_N"]))
    return [first] + [c for c in dicts if c != first]


def a_major(t: torch.Tensor) -> str | None:
    """'k' when each row of A (M x K) is contiguous, 'm' when each column is, else None."""
    if t.stride(1) == 1 or t.shape[1] == 1:
        return "k"
    if t.stride(0) == 1 or t.shape[0] == 1:
        return "m"
    return None


def b_major(t: torch.Tensor) -> str | None:
    """'n' when each row of B (K x N) is contiguous (row-major), 'k' when each column is."""
    if t.stride(1) == 1 or t.shape[1] == 1:
        return "n"
    if t.stride(0) == 1 or t.shape[0] == 1:
        return "k"
    return None


def _lead(t: torch.Tensor, inner_dim: int) -> int:
    """The stride of the dimension that is not contiguous; for a single row or column (whose
    stride addresses nothing) the inner extent rounded up to 16 bytes."""
    outer = 1 - inner_dim
    if t.shape[outer] > 1:
        return t.stride(outer)
    per = 16 // t.element_size()
    return -(-t.shape[inner_dim] // per) * per


def _tma_ready(t: torch.Tensor, inner_dim: int) -> bool:
    return t.data_ptr() % 16 == 0 and (_lead(t, inner_dim) * t.element_size()) % 16 == 0


def _aligned_copy(t: torch.Tensor, inner_dim: int) -> torch.Tensor:
    """The same matrix in a buffer whose rows along ``inner_dim`` start every 16 bytes."""
    per = 16 // t.element_size()
    if inner_dim == 1:
        rows, cols = t.shape
        buf = torch.empty((rows, -(-cols // per) * per), dtype=t.dtype, device=t.device)
        buf[:, :cols] = t
        return buf[:, :cols]
    rows, cols = t.shape
    buf = torch.empty((cols, -(-rows // per) * per), dtype=t.dtype, device=t.device)
    buf[:, :rows] = t.t()
    return buf[:, :rows].t()


class PreparedOperands(NamedTuple):
    """A (M, K) and B (K, N) as TMA reads them, with the dimension each is contiguous along
    (``a_major`` "k" or "m", ``b_major`` "n" or "k")."""

    a: torch.Tensor
    b: torch.Tensor
    a_major: str
    b_major: str


def prepare(a: torch.Tensor, b: torch.Tensor) -> PreparedOperands:
    """PreparedOperands TMA can read (copies only for other strides or misalignment)."""
    am = a_major(a)
    if am is None:
        a, am = a.contiguous(), "k"
    if not _tma_ready(a, 1 if am == "k" else 0):
        a = _aligned_copy(a, 1 if am == "k" else 0)
    bm = b_major(b)
    if bm is None:
        b, bm = b.contiguous(), "n"
    if not _tma_ready(b, 1 if bm == "n" else 0):
        b = _aligned_copy(b, 1 if bm == "n" else 0)
    return PreparedOperands(a, b, am, bm)


def _row_elems(n: int, dtype) -> int:
    """A row of ``n`` elements rounded up to 16 bytes (TMA strides, paired stores)."""
    per = 16 // dtype.itemsize
    return -(-n // per) * per


def output_buffer(m, n, dtype, device) -> torch.Tensor:
    """(M, N) output whose row stride is a multiple of 16 bytes (a view into padding if N needs it)."""
    ldc = _row_elems(n, dtype)
    buf = torch.empty((m, ldc), dtype=dtype, device=device)
    return buf if ldc == n else buf[:, :n]


def workspace(splits, m, n, device) -> torch.Tensor:
    """(S, M, ldw) f32 partial sums, rows of 16-byte multiples."""
    return torch.empty((splits, m, _row_elems(n, torch.float32)), dtype=torch.float32, device=device)


def _tensor_map(t: torch.Tensor, dims, strides_bytes, box) -> TensorMap:
    return TensorMap.cached(t, tuple(dims), tuple(strides_bytes), tuple(box), MAP_DTYPE[t.dtype])


def _spec(t: torch.Tensor, dims, strides_bytes, box) -> TensorMapSpec:
    return TensorMapSpec(t, dims, strides_bytes, box, MAP_DTYPE[t.dtype], 128)


def split_of(m, n, k, cfg, sms) -> int:
    """SPLIT_K of a config: "auto" splits K so that about every SM gets a unit (at most 8 ways,
    at least 4 k-blocks each); 1 when the tiles already fill the SMs. A fixed count is capped at
    the number of k-blocks (every unit needs one)."""
    s = cfg.get("SPLIT_K", 1)
    k_blocks = max(1, -(-k // BLOCK_K))
    if s != "auto":
        return max(1, min(int(s), k_blocks))
    t = tiles(m, n, cfg)
    return max(1, min(8, sms // t, k_blocks // 4))


class LaunchPlan:
    """Everything about a launch that depends only on shapes, strides, dtypes and the schedule:
    tensor-map geometry, constexprs, grids and (once needed) the compiled kernels' launchers. A
    call then only looks up tensor maps for the tensors' addresses and launches.

    ``ops``: A (M, K) and B (K, N), TMA-ready (``prepare``); the output is an ``output_buffer``.
    With SPLIT_K = S > 1 the GEMM writes f32 partial sums to a ``workspace`` and ``splitk_reduce``
    adds them (then bias, epilogue, rounding).
    """

    def __init__(self, ops: PreparedOperands, out_dtype, bias, epilogue, cfg, sms):
        a, b, am, bm = ops
        m, k = a.shape
        n = b.shape[1]
        self.m, self.n, self.k = m, n, k
        self.splits = split_of(m, n, k, cfg, sms)
        cfg = dict(cfg, SPLIT_K=self.splits)
        es = a.element_size()
        bm_, bn_ = cfg["BLOCK_M"], cfg["BLOCK_N"]
        if am == "k":
            self.ga = ((k, m), (_lead(a, 1) * es,), (BLOCK_K, bm_))
        else:
            self.ga = ((m, k), (_lead(a, 0) * es,), (CHUNK_ROWS, BLOCK_K))
        if bm == "n":
            self.gb = ((n, k), (_lead(b, 1) * es,), (CHUNK_ROWS, BLOCK_K))
        else:
            self.gb = ((k, n), (_lead(b, 0) * es,), (BLOCK_K, bn_))
        gemm_out = out_dtype if self.splits == 1 else torch.float32
        self.ld = _row_elems(n, gemm_out)  # row stride of what the GEMM writes (C or the workspace)
        self.ldc = _row_elems(n, out_dtype)
        self.gc = None
        if cfg["STORE"] == "tma":
            plan = Plan(bm_, bn_, cfg["STAGES"], cfg["SCHEDULE"], MAP_DTYPE[gemm_out], cfg["STORE"])
            ob = gemm_out.itemsize
            if self.splits > 1:  # (N, M, S): the TMA clips each split's rows at M
                self.gc = ((n, m, self.splits), (self.ld * ob, m * self.ld * ob), (plan.epi_cols, plan.wm, 1))
            else:
                self.gc = ((n, m), (self.ld * ob,), (plan.epi_cols, plan.wm))
        split_out = self.splits > 1
        self.cx = dict(DTYPE=TY_DTYPE[a.dtype], OUT_DTYPE=TY_DTYPE[gemm_out], A_MAJOR=am, B_MAJOR=bm,
                       HAS_BIAS=bias is not None and not split_out,
                       BIAS_DTYPE=TY_DTYPE[bias.dtype] if bias is not None and not split_out else ty.f32,
                       EPILOGUE=None if split_out else epilogue, **cfg)
        self.rcx = dict(SPLITS=self.splits, OUT_DTYPE=TY_DTYPE[out_dtype], HAS_BIAS=bias is not None,
                        BIAS_DTYPE=TY_DTYPE[bias.dtype] if bias is not None else ty.f32, EPILOGUE=epilogue)
        self.grid = (max(1, min(tiles(m, n, cfg) * self.splits, sms)),)
        self.reduce_grid = (splitk_blocks(m, n),)
        self._gemm = self._reduce = None

    def gemm_args(self, a, b, target, bias, spec=False) -> tuple:
        """``gemm_sm90``'s arguments writing into ``target`` (the output, or the workspace)."""
        make = _spec if spec else _tensor_map
        ma, mb = make(a, *self.ga), make(b, *self.gb)
        mc = make(target, *self.gc) if self.gc is not None else ma  # the map is a placeholder for "direct"
        # The kernel writes column pairs, so with an odd N the last pair reaches one column into the
        # row padding: hand it whole rows of ld elements.
        rows = target.as_strided((self.splits * self.m, self.ld), (self.ld, 1)).view(torch.uint8)
        b_ptr = bias.view(torch.uint8) if bias is not None and self.splits == 1 else rows
        return (ma, mb, mc, rows, b_ptr, self.m, self.n, self.k, self.ld)

    def reduce_args(self, ws, out, bias) -> tuple:
        rows = out.as_strided((self.m, self.ldc), (self.ldc, 1)).view(torch.uint8)
        b_ptr = bias.view(torch.uint8) if bias is not None else rows
        return (ws, rows, b_ptr, self.m, self.n, self.ld, self.ldc)

    def __call__(self, a, b, out, bias):
        if self._gemm is None:
            self._gemm = gemm_sm90.compile(**self.cx).launcher()
            if self.splits > 1:
                self._reduce = splitk_reduce.compile(**self.rcx).launcher()
        if self.splits == 1:
            self._gemm.launch(self.grid, self.gemm_args(a, b, out, bias))
            return
        ws = workspace(self.splits, self.m, self.n, a.device)
        self._gemm.launch(self.grid, self.gemm_args(a, b, ws, None))
        self._reduce.launch(self.reduce_grid, self.reduce_args(ws, out, bias))


def kernel_args(ops: PreparedOperands, out, bias, epilogue, cfg, spec=False):
    """(arguments, constexprs) of ``gemm_sm90`` on ``ops`` (``prepare``) writing into ``out`` (an
    ``output_buffer``, or with an integer SPLIT_K > 1 in ``cfg`` a ``workspace`` and no bias or
    epilogue): the emulator's way in."""
    splits = cfg.get("SPLIT_K", 1)
    p = LaunchPlan(ops, out.dtype, bias, epilogue, cfg, sms=1 << 20)
    assert p.splits == splits or splits == "auto"
    return p.gemm_args(ops.a, ops.b, out, bias, spec), p.cx


def splitk_args(ws, out, bias, epilogue, m, n):
    """(arguments, constexprs) of the split-K reduction of workspace ``ws`` into ``out``."""
    rows = out.as_strided((m, out.stride(0)), (out.stride(0), 1)).view(torch.uint8)
    b_ptr = bias.view(torch.uint8) if bias is not None else rows
    cx = dict(SPLITS=ws.shape[0], OUT_DTYPE=TY_DTYPE[out.dtype], HAS_BIAS=bias is not None,
              BIAS_DTYPE=TY_DTYPE[bias.dtype] if bias is not None else ty.f32, EPILOGUE=epilogue)
    return (ws, rows, b_ptr, m, n, ws.stride(1), out.stride(0)), cx


def make_plan(a, b, out, bias, epilogue, am, bm, cfg) -> LaunchPlan:
    return LaunchPlan(PreparedOperands(a, b, am, bm), out.dtype, bias, epilogue, cfg, sm_count(a.device.index))


@ty.autotune(configs=CONFIGS, key=["a", "b", "out", "bias", "epilogue"], prune=prune,
             timer=functools.partial(median_ms, warmup_ms=25, rep_ms=100), name="tylopy_kernels.gemm")
def run(a, b, out, bias, epilogue, am, bm, **cfg):
    """C = epilogue(A B + bias) into ``out`` with the autotuned schedule (or ``cfg`` when given)."""
    make_plan(a, b, out, bias, epilogue, am, bm, cfg)(a, b, out, bias)
