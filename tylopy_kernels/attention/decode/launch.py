"""``attention_decode``: attention of a few new query rows against a KV cache, split over the keys.

    out = tylopy.attention_decode(q, k_cache, v_cache, cache_seqlens)
    out, lse = tylopy.attention_decode(q, k_cache, v_cache, cache_seqlens, is_causal=True, return_lse=True)
    out = tylopy.attention_decode(q, k_pages, v_pages, cache_seqlens, block_table=table)   # paged cache

Layouts (``layout="bshd"``, the default, as FlashAttention's ``flash_attn_with_kvcache``):

* q: (B, n_q, H_q, D), bf16 or fp16, D in {64, 128}; n_q is small (1 for plain decoding, a few
  for speculative decoding); the output has q's shape and dtype.
* k_cache, v_cache: (B, N_max, H_kv, D), H_q a multiple of H_kv (GQA: query head h reads kv head
  h // (H_q / H_kv)); or, with ``block_table``, pages (num_pages, page_size, H_kv, D), page_size a
  multiple of 16, and ``block_table`` (B, max_pages) int32: keys p * page_size .. of sequence b
  live in page ``block_table[b, p]`` (vLLM's and FlashAttention's paged KV cache).
* cache_seqlens: (B,) int32 on the device, the number of valid keys of each sequence (the new
  tokens included: the query rows are its last n_q positions). Keys past it, and table entries
  and pages past it, are never read; values are clamped to [0, capacity].
* ``layout="bhsd"``: q (B, H_q, n_q, D) and unpaged caches (B, H_kv, N_max, D) (SDPA's order);
  paged caches keep (num_pages, page_size, H_kv, D).

``is_causal`` aligns the mask bottom-right, as FlashAttention does for a cache: query i is
position L - n_q + i (L = cache_seqlens[b]) and sees key j iff j <= i + L - n_q. (``tylopy.attention``'s
``is_causal`` stays SDPA's top-left alignment.) Rows that see no key give 0 and LSE -inf.
``return_lse`` adds the fp32 log-sum-exp, shape (B, H_q, n_q), natural log.

``num_splits`` (default: chosen from the SM count, the cache capacity and the batch) cuts each
sequence's keys into that many ranges, one CTA each, merged with ``softmax_merge`` semantics by
the last CTA to finish (``merge="atomic"``, the default: an arrival counter per (batch, kv head);
the counters belong to the current stream, and the last CTA resets them) or by a second launch
(``merge="kernel"``). Both merge the splits in the same fixed order (deterministic). On an H200
the atomic merge read the cache 0-30% faster than the second launch at every measured shape
(B 1/8/64, cache 4k-128k, docs/performance.md). The heuristic never reads
cache_seqlens (no host synchronization); launches can be captured in a CUDA graph.

A ``Step`` holds a kernel's run-time arguments by parameter name; each tensor goes as one argument,
a view in the kernels' order (``token_view``: q and out as (B, n_q, H_q, D), an unpaged cache as
(B, N_max, H_kv, D)), and a tensor a specialization never reads as ``unused``'s placeholder.
"""
from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import NamedTuple, Optional

import torch

import tylopy as ty
from tylopy.runtime import devices

from tylopy_kernels.attention.decode import kernel as kd
from tylopy_kernels.attention.common import positional, rejecter
from tylopy_kernels.attention.decode.status import (BlockTableStatus, block_table_status, check_block_table,
                                                    check_table_on_host, status_buffer)

LAYOUTS = ("bshd", "bhsd")
MERGES = ("kernel", "atomic")
SMEM_PER_SM = 227 * 1024       # shared memory one SM gives its blocks (sm_80: 164 KB; see max_ctas_per_sm)
MAX_SPLITS = 256
MIN_TILES_PER_SPLIT = 2        # a split streams at least this many CTA tiles (pipeline fill and merge amortized)
# Compile-time schedule per head dim (``tylopy bench attention_decode --sweep`` measures the alternatives); read-only:
# a plan's ``schedule=`` overrides it.
SCHEDULE = MappingProxyType({
    64: MappingProxyType(dict(WARPS=4, WARP_KEYS=32, STAGES=4, Q_SMEM=True)),
    128: MappingProxyType(dict(WARPS=4, WARP_KEYS=16, STAGES=3, Q_SMEM=True)),
})


_fail = rejecter("attention_decode")
SEQLENS_EXPECTED = ("a (batch,) torch.int32 tensor on q's device (one length for every sequence: "
                    "torch.full((batch,), n, dtype=torch.int32, device=q.device))")


class DecodeTensors(NamedTuple):
    """The tensors of a call: q, the caches, their lengths and the page table (None: unpaged)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor
    block_table: Optional[torch.Tensor] = None


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """The keyword options of ``tylopy.attention_decode`` (its docstring and this module's)."""

    scale: Optional[float] = None
    is_causal: bool = False
    num_splits: Optional[int] = None
    return_lse: bool = False
    layout: str = "bshd"
    merge: str = "atomic"
    schedule: Optional[dict] = None


class DecodeShape(NamedTuple):
    """What the checks read off the tensors (page_size 0: unpaged; cap: keys per sequence)."""

    B: int
    n_q: int
    H_q: int
    H_kv: int
    D: int
    cap: int
    page_size: int


class Scratch(NamedTuple):
    """A launch's working buffers: the split partials, the arrival counters and the status word."""

    o_part: torch.Tensor
    lse_part: torch.Tensor
    counters: torch.Tensor
    status: torch.Tensor


@dataclasses.dataclass
class Step:
    """One launch: ``launch()`` on the GPU, or ``emulate()`` with CPU tensors. ``args``: the kernel's
    run-time arguments by parameter name."""

    kernel: object
    grid: tuple
    args: dict
    constexprs: dict

    def launch(self, device):
        compiled_for(self.kernel, device, **self.constexprs)(self.grid, *positional(self.kernel, self.args))

    def emulate(self, **options):
        return self.kernel.emulate(grid=self.grid, **self.args, **self.constexprs, **options)


# -- checks ------------------------------------------------------------------------------------------

def _check_tensor(name, t, dims):
    if not isinstance(t, torch.Tensor):
        _fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dim() != dims:
        _fail(ValueError, name, f"a {dims}-D tensor", f"shape {tuple(t.shape)}")


def check_decode_inputs(ins: DecodeTensors, opts: DecodeOptions):
    """Validate; returns (DecodeShape, scale)."""
    q, k_cache, v_cache, cache_seqlens, block_table = ins
    scale, is_causal, num_splits, layout, merge = opts.scale, opts.is_causal, opts.num_splits, opts.layout, opts.merge
    if layout not in LAYOUTS:
        _fail(ValueError, "layout", f"one of {LAYOUTS}", repr(layout))
    if merge not in MERGES:
        _fail(ValueError, "merge", f"one of {MERGES}", repr(merge))
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t, 4)
        if t.dtype not in (torch.bfloat16, torch.float16):
            _fail(TypeError, name, "dtype torch.bfloat16 or torch.float16", t.dtype)
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            _fail(ValueError, name, "a contiguous last dimension (stride 1)", f"stride {t.stride(-1)}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        _fail(TypeError, "k_cache/v_cache", f"q's dtype {q.dtype}", f"{k_cache.dtype} and {v_cache.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens)):
        if isinstance(t, torch.Tensor) and t.device != q.device:
            _fail(ValueError, name, f"q's device {q.device}", t.device)
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        _fail(ValueError, "v_cache", f"k_cache's shape {tuple(k_cache.shape)}", tuple(v_cache.shape))
    if layout == "bshd":
        B, n_q, H_q, D = q.shape
    else:
        B, H_q, n_q, D = q.shape
    if D not in kd.HEAD_DIMS:
        _fail(ValueError, "q head_dim", f"one of {kd.HEAD_DIMS}", D)
    if block_table is None:
        kB, cap, H_kv, kD = k_cache.shape if layout == "bshd" else (k_cache.shape[0], k_cache.shape[2],
                                                                     k_cache.shape[1], k_cache.shape[3])
        if kB != B:
            _fail(ValueError, "k_cache batch", f"q's batch {B}", kB)
        page_size = 0
    else:
        _check_tensor("block_table", block_table, 2)
        if block_table.dtype != torch.int32:
            _fail(TypeError, "block_table", "dtype torch.int32", block_table.dtype)
        if block_table.device != q.device:
            _fail(ValueError, "block_table", f"q's device {q.device}", block_table.device)
        if block_table.shape[0] != B:
            _fail(ValueError, "block_table", f"{B} rows (one per sequence)", block_table.shape[0])
        _pages, page_size, H_kv, kD = k_cache.shape
        if page_size <= 0 or page_size % 16:
            _fail(ValueError, "k_cache page size (dim 1 of a paged cache)", "a positive multiple of 16", page_size)
        cap = page_size * block_table.shape[1]
    if kD != D:
        _fail(ValueError, "k_cache head_dim", f"q's head dim {D}", kD)
    if H_kv == 0 or H_q % H_kv:
        _fail(ValueError, "k_cache heads", f"a divisor of the {H_q} query heads", H_kv)
    if not isinstance(cache_seqlens, torch.Tensor):
        _fail(TypeError, "cache_seqlens", SEQLENS_EXPECTED, type(cache_seqlens).__name__)
    _check_tensor("cache_seqlens", cache_seqlens, 1)
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.shape[0] != B:
        _fail(TypeError if cache_seqlens.dtype != torch.int32 else ValueError, "cache_seqlens",
              f"a torch.int32 tensor of shape ({B},)", f"{cache_seqlens.dtype} of shape {tuple(cache_seqlens.shape)}")
    if not isinstance(is_causal, bool):
        _fail(TypeError, "is_causal", "a bool", type(is_causal).__name__)
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or not 1 <= num_splits <= 65535):
        _fail(ValueError, "num_splits", "None or an int in 1..65535", repr(num_splits))
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(float(scale)):
        _fail(TypeError if not isinstance(scale, (int, float)) else ValueError, "scale", "a finite float or None",
              repr(scale))
    if B > kd.MAX_GRID_YZ:
        _fail(ValueError, "batch", f"at most {kd.MAX_GRID_YZ} (a grid dimension)", B)
    return DecodeShape(B, n_q, H_q, H_kv, D, cap, page_size), float(scale)


# -- the schedule ------------------------------------------------------------------------------------------

def max_ctas_per_sm(constexprs, smem_per_sm=SMEM_PER_SM) -> int:
    """Blocks of this schedule one SM holds at once (shared memory and 64K registers at <= 255 each)."""
    by_smem = smem_per_sm // kd.smem_bytes(**constexprs)
    by_regs = 65536 // (32 * constexprs["WARPS"] * 256)
    return max(1, min(by_smem, by_regs, 8))


def choose_splits(base_ctas: int, tiles: int, slots: int, max_splits: int = MAX_SPLITS) -> int:
    """Splits per (batch, kv head, row block), after FlashAttention's rule on the wave efficiency
    (CTAs / (waves * slots)): the fewest splits within 95% of the best (FlashAttention takes 85%;
    the K/V stream does not care how many partials there are, and idle slots cost bandwidth at
    long caches), each split at least MIN_TILES_PER_SPLIT tiles of the capacity."""
    if base_ctas >= slots:
        return 1
    limit = max(1, min(max_splits, tiles // MIN_TILES_PER_SPLIT, 65535))
    eff = []
    for s in range(1, limit + 1):
        waves = base_ctas * s / slots
        eff.append(waves / math.ceil(waves))
    best = max(eff)
    return next(s for s, e in enumerate(eff, start=1) if e >= 0.95 * best)


def plan_schedule(shape: DecodeShape, sm_count, num_splits=None, schedule=None):
    """(constexprs without DTYPE and flags, row blocks, splits): a pure function of the shapes."""
    n_q, H_q, H_kv, D, cap, page_size = shape[1:]
    cx = dict(SCHEDULE[D], HEAD_DIM=D)
    cx.update(schedule or {})
    rows = n_q * (H_q // H_kv)
    cx.setdefault("ROW_TILES", 1 if rows <= 16 else 2)
    if page_size and page_size % cx["WARP_KEYS"]:
        cx["WARP_KEYS"] = 16  # a warp block must lie in one page
    row_blocks = -(-rows // (16 * cx["ROW_TILES"]))
    if num_splits is None:
        tiles = -(-cap // (cx["WARPS"] * cx["WARP_KEYS"]))
        num_splits = choose_splits(shape.B * H_kv * row_blocks, tiles, sm_count * max_ctas_per_sm(cx))
        # a full-length sequence gives each split ceil(tiles / splits) tiles: drop the splits that
        # would be left empty (same longest split, fewer partials to merge)
        num_splits = -(-tiles // -(-tiles // num_splits))
    return cx, row_blocks, num_splits


# -- launch --------------------------------------------------------------------------------------------

_kernels = ty.PlanCache("attention_decode kernels", capacity=256)  # (kernel name, arch, constexprs) -> CompiledKernel
_archs: dict = {}       # device index -> (arch, jit): one entry per GPU
_counters: dict = {}    # (device, ...) -> the split-merge counters (device memory the kernels reset)


def compiled_for(kernel, device, **constexprs):
    """The CompiledKernel of ``kernel`` for ``device``'s arch (cached; sm_80 PTX for the driver to JIT
    on an arch tylopy does not list)."""
    from tylopy_kernels.attention.portable.launch import device_arch
    index = device.index if device.index is not None else torch.cuda.current_device()
    arch = _archs.get(index)
    if arch is None:
        arch = _archs[index] = device_arch(torch.cuda.get_device_capability(index), "attention_decode", "q")
    key = (kernel.name, arch, tuple(sorted((k, repr(v)) for k, v in constexprs.items())))
    ck = _kernels.get(key)
    if ck is None or not ck.is_current():  # a global its trace read changed: compile again (docs/design.md)
        name, jit = arch
        ck = kernel.with_arch(name).compile(**constexprs)
        if jit:
            ck = dataclasses.replace(ck, cubin=None, _launcher=None)
        _kernels.put(key, ck)
    return ck


def _counter_buffer(device, n):
    """The arrival counters of launches on ``device``'s current stream: launches on one stream run
    one after another, so they can share them; another stream gets its own."""
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    buf = _counters.get(key)
    if buf is None or buf.numel() < n:
        buf = _counters[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return buf


def _rows_aligned(t) -> bool:
    """16-byte aligned rows: the kernel copies 16-byte chunks."""
    return t.data_ptr() % 16 == 0 and all(t.shape[d] == 1 or t.stride(d) % 8 == 0 for d in range(3))


def _aligned(t):
    return t if _rows_aligned(t) else t.contiguous()


def token_view(t, layout, paged=False):
    """q, out or a cache as the kernels take it: its 16-bit elements as int16 (DTYPE says bf16 or
    fp16), (B, N, H, D) (a paged cache is always (page, slot, head)); a view, no copy."""
    t = t.view(torch.int16)
    return t if layout == "bshd" or paged else t.transpose(1, 2)


_unused: dict = {}  # (device, dtype, ndim) -> the placeholder's view (a view costs ~3 us a call)


def unused(device, dtype, ndim: int):
    """A tensor argument the specialization never reads (no LSE, no partials, no table, no
    counters): the shared placeholder as an ``ndim``-D view of stride 0."""
    key = (device, dtype, ndim)
    t = _unused.get(key)
    if t is None:
        base = _placeholder(device, dtype)
        t = base.as_strided((1,) * ndim, (0,) * ndim)
        if base is _placeholder(device, dtype):  # kept (not one made during a CUDA-graph capture)
            _unused[key] = t
    return t


@dataclasses.dataclass
class DecodePlan:
    """What a call's shapes, strides, dtypes and options decide: the specialization, grids and
    scalar arguments. ``steps`` binds tensors to it; ``launch`` allocates the partials and runs."""

    shape: DecodeShape
    num_pages: int
    scale: float
    is_causal: bool
    layout: str
    paged: bool
    splits: int
    row_blocks: int
    fused: bool
    cx: dict
    merge_cx: dict
    compiled: dict = dataclasses.field(default_factory=dict)

    @property
    def split(self) -> bool:
        return self.splits > 1

    @property
    def n_rows(self) -> int:
        return self.shape.B * self.shape.H_q * self.shape.n_q

    def steps(self, ins: DecodeTensors, out, lse, scratch: Scratch):
        """[main] or [main, merge] on the given (aligned) tensors; ``ins.block_table`` a placeholder
        when unpaged."""
        q, k, v, lens, table = ins
        o_part, lse_part, counters, status = scratch
        B, H_q, H_kv, D = self.shape.B, self.shape.H_q, self.shape.H_kv, self.shape.D
        out_v = token_view(out, self.layout)
        args = dict(q=token_view(q, self.layout), k=token_view(k, self.layout, self.paged),
                    v=token_view(v, self.layout, self.paged), out=out_v, lse=lse, o_part=o_part, lse_part=lse_part,
                    seqlens=lens, block_table=table, counters=counters, status=status, kv_group=H_q // H_kv,
                    scale=self.scale, causal=int(self.is_causal))
        steps = [Step(kd.attention_decode_fwd, (self.splits, H_kv * self.row_blocks, B), args, self.cx)]
        if self.split and not self.fused:
            grid = (-(-self.n_rows * (D // 4) // kd.MERGE_THREADS),)
            steps.append(Step(kd.attention_decode_merge, grid, dict(o_part=o_part, lse_part=lse_part, out=out_v,
                                                                    lse=lse), self.merge_cx))
        return steps

    def buffers(self, device, lse):
        """(Scratch without its status word, lse or a placeholder) for a launch: the partials as (rows,
        splits x D) and (rows, splits), rows ordered (b, h, i) as the LSE; one arrival counter per CTA
        column, (B, H_kv x row blocks)."""
        f32 = torch.float32
        if self.split:
            o_part = torch.empty((self.n_rows, self.splits * self.shape.D), dtype=f32, device=device)
            lse_part = torch.empty((self.n_rows, self.splits), dtype=f32, device=device)
        else:
            o_part = lse_part = unused(device, f32, 2)
        shape = (self.shape.B, self.shape.H_kv * self.row_blocks)
        if not self.fused:
            counters = unused(device, torch.int32, 2)
        elif device.type == "cuda":
            counters = _counter_buffer(device, shape[0] * shape[1])[:shape[0] * shape[1]].view(shape)
        else:
            counters = torch.zeros(shape, dtype=torch.int32, device=device)
        return (o_part, lse_part, counters), (lse if lse is not None else unused(device, f32, 3))

    def launch(self, ins: DecodeTensors, out, lse):
        dev = ins.q.device
        parts, lse_t = self.buffers(dev, lse)
        for step in self.steps(_bound(ins, unused(dev, torch.int32, 2)), out, lse_t,
                               Scratch(*parts, status_buffer(dev))):
            ck = self.compiled.get(step.kernel.name)
            if ck is None:
                ck = self.compiled[step.kernel.name] = compiled_for(step.kernel, dev, **step.constexprs)
            ck(step.grid, *positional(step.kernel, step.args))


def _placeholder(device, dtype):
    from tylopy_kernels.attention.common import placeholder
    return placeholder(device, dtype)


def _bound(ins: DecodeTensors, table_placeholder):
    """``ins`` with 16-byte aligned q and caches and a table tensor in every case (one whose entries
    are not contiguous along a row is copied: the kernel reads a row's entries at stride 1)."""
    table = ins.block_table
    if table is None:
        table = table_placeholder
    elif table.shape[1] > 1 and table.stride(1) != 1:
        table = table.contiguous()
    return DecodeTensors(_aligned(ins.q), _aligned(ins.k_cache), _aligned(ins.v_cache), ins.cache_seqlens, table)


def make_plan(ins: DecodeTensors, opts: DecodeOptions, sm_count=132) -> DecodePlan:
    """Check the inputs and decide the launch (see the module docstring)."""
    shape, scale = check_decode_inputs(ins, opts)
    cx, row_blocks, splits = plan_schedule(shape, sm_count, opts.num_splits, opts.schedule)
    dtype = ty.bf16 if ins.q.dtype == torch.bfloat16 else ty.f16
    fused = splits > 1 and opts.merge == "atomic"
    paged = ins.block_table is not None
    cx = dict(cx, DTYPE=dtype, PAGED=paged, SPLIT=splits > 1, FUSED_MERGE=fused, RETURN_LSE=opts.return_lse)
    num_pages = ins.k_cache.shape[0] if paged else 0
    return DecodePlan(shape, num_pages, scale, opts.is_causal, opts.layout, paged, splits, row_blocks, fused, cx,
                      dict(DTYPE=dtype, HEAD_DIM=shape.D, RETURN_LSE=opts.return_lse))


def plan_decode(ins: DecodeTensors, out, lse, opts: DecodeOptions, sm_count=132):
    """The launches that fill ``out`` (and ``lse``) as Steps: [main] or [main, merge]. CPU tensors give
    steps to emulate; ``out`` must have q's shape (in q's layout; any strides) and be contiguous in its last
    dim, ``lse`` (B, H_q, n_q) too. ``opts.return_lse`` follows ``lse``."""
    plan = make_plan(ins, dataclasses.replace(opts, return_lse=lse is not None), sm_count)
    dev = ins.q.device
    parts, lse_t = plan.buffers(dev, lse)
    return plan.steps(_bound(ins, unused(dev, torch.int32, 2)), out, lse_t, Scratch(*parts, status_buffer(dev)))




_plans = ty.PlanCache("attention_decode plans", capacity=256)


def _signature(t):
    if not isinstance(t, torch.Tensor):  # None, or a wrong argument the checks will name
        return None if t is None else ("not a tensor", type(t).__name__)
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def attention_decode(ins: DecodeTensors, opts: DecodeOptions, check_inputs=False):
    """Attention of q's n_q rows per head against each sequence's first cache_seqlens[b] cached keys
    (see the module docstring); returns out, or (out, lse) with ``opts.return_lse``. The plan of a
    call is remembered by its shapes, strides, dtypes, devices and options: a repeat skips the checks.
    ``block_table`` entries outside the page pool are caught on the device (``check_block_table()``,
    see ``decode/status.py``); ``check_inputs=True`` checks them on the host first (a synchronization)."""
    q, k_cache, v_cache, cache_seqlens, block_table = ins
    scale, schedule, return_lse = opts.scale, opts.schedule, opts.return_lse
    key = (_signature(q), _signature(k_cache), _signature(v_cache), _signature(cache_seqlens),
           _signature(block_table), scale, opts.is_causal, opts.num_splits, return_lse, opts.layout, opts.merge,
           tuple(sorted(schedule.items())) if isinstance(schedule, dict) else schedule)
    plan = _plans.get(key)  # None too for an unhashable argument: the checks name it
    if plan is None:
        if not isinstance(q, torch.Tensor) or q.device.type != "cuda":
            check_decode_inputs(ins, opts)
            _fail(ValueError, "q", "a CUDA tensor", f"a tensor on {q.device}")
        s = scale
        if s is not None and not isinstance(s, bool) and isinstance(s, (int, float)) and s <= 0:
            s = 1.0 if s == 0 else -s  # the kernels keep the maximum of raw scores: the sign goes into q
        plan = make_plan(ins, dataclasses.replace(opts, scale=s), devices.sm_count(q.device))
        _plans.put(key, plan)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((plan.shape.B, plan.shape.H_q, plan.shape.n_q), dtype=torch.float32, device=q.device) if return_lse else None
    if out.numel() == 0:
        return (out, lse) if return_lse else out
    if check_inputs and block_table is not None:
        check_table_on_host(block_table, cache_seqlens, plan.shape.page_size, plan.num_pages, plan.shape.cap)
    if scale is not None and scale <= 0:
        ins = ins._replace(q=torch.zeros_like(q) if scale == 0 else -q)
    plan.launch(ins, out, lse)
    return (out, lse) if return_lse else out


# -- the FP64 reference -------------------------------------------------------------------------------------

def gather_cache(cache, block_table, B, cap, layout="bshd"):
    """The cache as (B, cap, H_kv, D): pages gathered through the table (entries < 0 read as page 0;
    the keys they hold are past the sequence's end and masked)."""
    if block_table is None:
        return cache if layout == "bshd" else cache.transpose(1, 2)
    pages = block_table.long().clamp(min=0)
    g = cache[pages.reshape(-1)]  # (B * max_pages, page_size, H, D)
    return g.reshape(B, cap, cache.shape[2], cache.shape[3])


def reference_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, block_table=None, is_causal=False,
                     layout="bshd"):
    """(out, lse) in float64 on q's device; out in q's layout, lse (B, H_q, n_q). Keys past the
    sequence's end never enter the sum (NaN there stays out)."""
    qq = q.double() if layout == "bshd" else q.double().transpose(1, 2)  # (B, n_q, H_q, D)
    B, n_q, H_q, D = qq.shape
    cap = k_cache.shape[1] * block_table.shape[1] if block_table is not None else (
        k_cache.shape[1] if layout == "bshd" else k_cache.shape[2])
    kk = gather_cache(k_cache, block_table, B, cap, layout).double()
    vv = gather_cache(v_cache, block_table, B, cap, layout).double()
    G = H_q // kk.shape[2]
    kk = kk.repeat_interleave(G, dim=2)
    vv = vv.repeat_interleave(G, dim=2)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    lens = cache_seqlens.long().clamp(0, cap).to(q.device)
    j = torch.arange(cap, device=q.device)
    i = torch.arange(n_q, device=q.device)
    visible = j[None, None, :] < lens[:, None, None]                       # (B, 1, cap)
    if is_causal:
        visible = visible & (j[None, None, :] <= i[None, :, None] + (lens[:, None, None] - n_q))
    visible = visible.expand(B, n_q, cap)
    kk = torch.where(visible.any(1)[:, :, None, None], kk, 0.0)          # NaN past the end never multiplies
    vv = torch.where(visible.any(1)[:, :, None, None], vv, 0.0)
    s = torch.einsum("bihd,bjhd->bhij", qq, kk) * scale
    s = s.masked_fill(~visible[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                       # (B, H_q, n_q)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    out = torch.einsum("bhij,bjhd->bihd", p, vv)
    if layout == "bhsd":
        out = out.transpose(1, 2)
    return out, lse


# ``tylopy.attention_decode.check_block_table()``: the host's view of the device-side table checks.
attention_decode.block_table_status = block_table_status
attention_decode.check_block_table = check_block_table
attention_decode.BlockTableStatus = BlockTableStatus
