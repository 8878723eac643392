"""Host side of the Hopper GEMM: operand layouts, tensor maps, schedules, autotuned launch.

``run(a, b, out, bias, epilogue)`` launches ``gemm_sm90`` for 2-D tensors that TMA can read
(``prepare`` makes them so); the schedule (tile shape, consumer arrangement, ring depth, tile
order, store path) comes from ``ty.autotune`` over ``CONFIGS`` keyed by the shapes, dtypes,
strides, bias, epilogue and device.
"""
from __future__ import annotations

import functools

import torch

import tylopy as ty
from tylopy.benchmarking import median_ms
from tylopy.runtime.tensormap import TensorMap, TensorMapSpec

from .hopper import gemm_sm90
from .splitk import blocks as splitk_blocks
from .splitk import splitk_reduce
from .plan import BLOCK_K, CHUNK_ROWS, SMEM_LIMIT, Plan

TY_DTYPE = {torch.bfloat16: ty.bf16, torch.float16: ty.f16, torch.float32: ty.f32}
MAP_DTYPE = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
STORE = "tma"                 # the epilogue path of every config ("direct": register -> global stores)
TMA_STORE_AVAILABLE = True
_maps: dict = {}


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
# heuristic default first (what runs with TYLOPY_AUTOTUNE=0).
LARGE = [schedule(128, 256, "cooperative"), schedule(128, 128, "pingpong"), schedule(256, 128, "cooperative"),
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


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


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


def prepare(a: torch.Tensor, b: torch.Tensor):
    """(a, b, A major, B major): operands TMA can read (copies only for other strides or misalignment)."""
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
    return a, b, am, bm


def output_buffer(m, n, dtype, device) -> torch.Tensor:
    """(M, N) output whose row stride is a multiple of 16 bytes (a view into padding if N needs it)."""
    per = 16 // torch.empty((), dtype=dtype).element_size()
    ldc = -(-n // per) * per
    buf = torch.empty((m, ldc), dtype=dtype, device=device)
    return buf if ldc == n else buf[:, :n]


def _tensor_map(t: torch.Tensor, dims, strides_bytes, box) -> TensorMap:
    key = (t.data_ptr(), tuple(dims), tuple(strides_bytes), tuple(box), t.dtype, t.device.index)
    tm = _maps.get(key)
    if tm is None:
        if len(_maps) > 256:
            _maps.clear()
        tm = TensorMap.tiled(t, dims, strides_bytes, box, MAP_DTYPE[t.dtype], swizzle=128)
        _maps[key] = tm
    return tm


def _spec(t: torch.Tensor, dims, strides_bytes, box) -> TensorMapSpec:
    return TensorMapSpec(t, tuple(dims), tuple(strides_bytes), tuple(box), MAP_DTYPE[t.dtype], 128)


def operand_maps(a, b, am, bm, block_m, block_n, spec=False):
    """Tensor maps of A and B with the boxes the kernel loads (``spec``: unencoded, for the emulator)."""
    m, k = a.shape
    n = b.shape[1]
    es = a.element_size()
    make = _spec if spec else _tensor_map
    if am == "k":
        ma = make(a, (k, m), (_lead(a, 1) * es,), (BLOCK_K, block_m))
    else:
        ma = make(a, (m, k), (_lead(a, 0) * es,), (CHUNK_ROWS, BLOCK_K))
    if bm == "n":
        mb = make(b, (n, k), (_lead(b, 1) * es,), (CHUNK_ROWS, BLOCK_K))
    else:
        mb = make(b, (k, n), (_lead(b, 0) * es,), (BLOCK_K, block_n))
    return ma, mb


def kernel_args(a, b, am, bm, out, bias, epilogue, cfg, spec=False):
    """(positional arguments, constexprs) of one launch of ``gemm_sm90``.

    ``out`` is (M, N) with a row stride of 16-byte multiples or, with SPLIT_K = S > 1, the f32
    workspace (S, M, ldw) of partial sums.
    """
    m, k = a.shape
    n = b.shape[1]
    splits = cfg.get("SPLIT_K", 1)
    make = _spec if spec else _tensor_map
    ma, mb = operand_maps(a, b, am, bm, cfg["BLOCK_M"], cfg["BLOCK_N"], spec)
    ld = out.stride(-2)
    mc = ma  # a placeholder: the output map is used only by STORE="tma"
    if cfg["STORE"] == "tma":
        plan = Plan(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["STAGES"], cfg["SCHEDULE"], MAP_DTYPE[out.dtype],
                    cfg["STORE"])
        es = out.element_size()
        if splits > 1:  # (N, M, S): the TMA clips each split's rows at M
            mc = make(out, (n, m, splits), (ld * es, m * ld * es), (plan.epi_cols, plan.wm, 1))
        else:
            mc = make(out, (n, m), (ld * es,), (plan.epi_cols, plan.wm))
    # The kernel writes column pairs, so with an odd N the last pair reaches one column into the
    # row padding: hand it whole rows of ld elements.
    rows = out.as_strided((splits * m, ld), (ld, 1))
    bias_t = bias if bias is not None else rows  # a placeholder pointer the kernel never reads
    args = (ma, mb, mc, rows.view(torch.uint8), bias_t.view(torch.uint8), m, n, k, ld)
    cx = dict(DTYPE=TY_DTYPE[a.dtype], OUT_DTYPE=TY_DTYPE[out.dtype], A_MAJOR=am, B_MAJOR=bm,
              HAS_BIAS=bias is not None, BIAS_DTYPE=TY_DTYPE[bias.dtype] if bias is not None else ty.f32,
              EPILOGUE=epilogue, **cfg)
    return args, cx


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


def grid_of(m, n, cfg, device_index, splits=1) -> tuple:
    return (max(1, min(tiles(m, n, cfg) * splits, sm_count(device_index))),)


def splitk_args(ws, out, bias, epilogue, m, n):
    """(positional arguments, constexprs) of the split-K reduction into ``out``."""
    rows = out.as_strided((m, out.stride(0)), (out.stride(0), 1))
    bias_t = bias if bias is not None else rows
    args = (ws, rows.view(torch.uint8), bias_t.view(torch.uint8), m, n, ws.stride(1), out.stride(0))
    cx = dict(SPLITS=ws.shape[0], OUT_DTYPE=TY_DTYPE[out.dtype], HAS_BIAS=bias is not None,
              BIAS_DTYPE=TY_DTYPE[bias.dtype] if bias is not None else ty.f32, EPILOGUE=epilogue)
    return args, cx


def workspace(splits, m, n, device) -> torch.Tensor:
    """(S, M, ldw) f32 partial sums, rows of 16-byte multiples."""
    return torch.empty((splits, m, -(-n // 4) * 4), dtype=torch.float32, device=device)


def _launch(a, b, out, bias, epilogue, am, bm, **cfg):
    m, k = a.shape
    n = b.shape[1]
    dev = a.device.index
    splits = split_of(m, n, k, cfg, sm_count(dev))
    cfg = dict(cfg, SPLIT_K=splits)
    if splits == 1:
        args, cx = kernel_args(a, b, am, bm, out, bias, epilogue, cfg)
        gemm_sm90[grid_of(m, n, cfg, dev)](*args, **cx)
        return
    ws = workspace(splits, m, n, a.device)
    args, cx = kernel_args(a, b, am, bm, ws, None, None, cfg)
    gemm_sm90[grid_of(m, n, cfg, dev, splits)](*args, **cx)
    args, cx = splitk_args(ws, out, bias, epilogue, m, n)
    splitk_reduce[(splitk_blocks(m, n),)](*args, **cx)


@ty.autotune(configs=CONFIGS, key=["a", "b", "out", "bias", "epilogue"], prune=prune,
             timer=functools.partial(median_ms, warmup_ms=25, rep_ms=100), name="tylopy_kernels.gemm")
def run(a, b, out, bias, epilogue, am, bm, **cfg):
    """C = epilogue(A B + bias) into ``out`` with the autotuned schedule (or ``cfg`` when given)."""
    _launch(a, b, out, bias, epilogue, am, bm, **cfg)
