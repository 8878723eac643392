"""Host side of the Hopper attention kernel: schedule choice, tensor maps, specialization, launch.

``launch_hopper(ForwardTensors(q, k, v, out, lse, attn_mask), HopperOptions(scale, is_causal))`` takes q as (B, H, N_q, D) and
k, v as (B, H_kv, N_k, D) with H_kv dividing H (grouped-query attention: query head h reads
K/V head h // (H / H_kv); H_kv = 1 is multi-query attention). K/V views with a zero stride over
heads (``k1.expand(B, H, N, D)``) or over the batch are mapped over their storage, without a
copy. ``plan_launch`` builds the same launch without a GPU (the emulator runs it with tensor-map
specs, ``MapTarget(make_map=..., sm_count=...)``).
"""
from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, NamedTuple, Optional

import torch

import tylopy as ty
from tylopy.runtime.devices import l2_bytes, sm_count
from tylopy.runtime.tensormap import TensorMap

from tylopy_kernels.attention.common import ForwardTensors, mask_and_lse_args, tma_copy
from tylopy_kernels.attention.sm90.forward import attention_fwd_sm90
from tylopy_kernels.attention.sm90.tiles import Plan

# Defaults per head dim (docs/performance.md, "v5": what each option was predicted to do and what
# the H200 sweep measured, results/attention-sweep-H200-v5.json). At N >= 2k no guarded option
# beat these by more than the sweep's noise (identical SASS read up to 3.5% apart). D=64 takes the
# "shared" exponent sequence: the bits of "ffma" in 764 instead of 889 SASS instructions a tile;
# on the H200, same process, 1.015x "ffma" over the 12 D=64 shapes (0.98-1.09) and 2.9% less
# time under ncu at 16k. At D=128 it was 0.98x (0.91-1.05) while the row sums waited for the PV
# product; with EARLY_SUMS "ffma" still issues its 64 exponents as one run inside the branch of
# its form (the sums come after the branch), "shared" interleaves them (longest run 5), so D=128
# takes "shared" too (docs/performance.md, the account).
#
# The tables are read-only (MappingProxyType): a schedule is changed by passing overrides
# (HopperOptions.schedule) or by replacing a table whole, which a kept plan notices by identity.
SCHEDULE = MappingProxyType({"BLOCK_N": 128, "STAGES": 2, "CONSUMERS": 3, "PERSISTENT": "auto", "EXPONENT": "shared",
                             "RESCALE_THRESHOLD": 8.0, "SPLIT_S": False, "PV_WAIT": "pinned", "POLY_EXP2": 0,
                             "TMA_STORE": False, "ORDER": "auto", "DEFER_EPILOGUE": True})
# D=128: O takes 64 registers a thread, so two consumers (240 registers) as FA3; 128 x 128 tiles
# (176-key tiles, FA3's non-causal choice, lost 1.5-6% at N >= 4k and 9% causal at 2k).
SCHEDULE_128 = MappingProxyType(dict(SCHEDULE, CONSUMERS=2))
# Short sequences: a persistent grid (one CTA per SM looping over work tiles, the next Q loading
# under the current epilogue), longest work first ("lpt"), O through a TMA store. It needs a few
# more live registers than 160 a consumer thread allow, so it runs with two consumers; at D=128
# it spills with more than 128 keys a tile (24-56 bytes at 176).
SHORT = MappingProxyType({"PERSISTENT": True, "CONSUMERS": 2, "ORDER": "lpt", "TMA_STORE": True})
SHORT_128 = MappingProxyType(dict(SHORT, BLOCK_N=128))
# Per (head dim, causal), when PERSISTENT is "auto": (up to this many keys, schedule changes),
# first match wins, else the non-persistent default. Measured on an H200 (16k tokens, TFLOP/s,
# SHORT against what the table held before: persistent 2 x 128 without TMA store, "heads" order
# non-causal, "lpt" causal): D=64 N=512 323 vs 281 and causal 189 vs 166, N=1k 367 vs 340 and
# causal 246 vs 224; D=128 N=2k 601 vs 551 (non-persistent); D=128 causal N=1k-2k the
# non-persistent grid wins (353 vs 319 at 1k).
LENGTH_TABLE = MappingProxyType({(64, False): ((1024, SHORT),), (64, True): ((1024, SHORT),),
                                 (128, False): ((2048, SHORT_128),), (128, True): ((512, SHORT_128),)})
# With a user mask the per-element mask loads need more registers than 160 per consumer thread
# (3 consumers spill 96-200 bytes); two consumers get 240.
MASKED_SCHEDULE = MappingProxyType({"CONSUMERS": 2})
# D=128, persistent, with LSE: the "lpt" order spills (16 bytes with a TMA store, 32 with a mask
# and no TMA store); "heads" does not.
PERSISTENT_LSE_SCHEDULE_128 = MappingProxyType({"ORDER": "heads"})
L2_SHARE = 0.5  # the "lpt" order groups heads whose K and V fill about this share of L2
DIMS = {"b": 0, "h": 1, "n": 2}


def _coord_order(t: torch.Tensor) -> tuple:
    """(n, h, b) sorted by increasing stride: the tensor map lists dimensions innermost first."""
    return tuple(sorted(DIMS, key=lambda k: (t.stride(DIMS[k]), DIMS[k] == 0, k != "n")))


def _fits(t: torch.Tensor, order: tuple) -> bool:
    """A tensor map in ``order`` can describe t: its dimensions longer than one have positive,
    16-byte-multiple strides that increase along ``order`` (a dimension of one takes any stride)."""
    last = 0
    for k in order:
        n, s = t.shape[DIMS[k]], t.stride(DIMS[k]) * t.element_size()
        if n == 1:
            continue
        if s <= 0 or s % 16 or s < last:
            return False
        last = s
    return t.data_ptr() % 16 == 0


def _map_geometry(t: torch.Tensor, rows: int, order: tuple):
    """(dims, strides in bytes, box) innermost first. A dimension of one gets the stride that
    the one before it ends at (any stride addresses its single index)."""
    shape = [t.shape[-1]] + [t.shape[DIMS[k]] for k in order]
    strides, end = [], t.shape[-1] * t.element_size()
    for k in order:
        n, s = t.shape[DIMS[k]], t.stride(DIMS[k]) * t.element_size()
        s = s if n > 1 else max(end, 16)
        strides.append(s)
        end = s * n
    box = [64] + [rows if k == "n" else 1 for k in order]
    return shape, strides, box


def _dtype_name(t):
    return "bf16" if t.dtype == torch.bfloat16 else "f16"


def device_map(t: torch.Tensor, shape, strides, box) -> TensorMap:
    return TensorMap.cached(t, tuple(shape), tuple(strides), tuple(box), _dtype_name(t))


def resolve_schedule(D, n_k, is_causal, masked, schedule=None, return_lse=False) -> dict:
    """The constexprs of one call: the head dim's defaults, the length table where PERSISTENT is
    "auto", the mask's consumer count, the LSE rule at D=128, ``schedule`` overrides last."""
    sched = dict(SCHEDULE if D == 64 else SCHEDULE_128)
    user = dict(schedule or {})
    if user.get("PERSISTENT", sched["PERSISTENT"]) == "auto":
        sched["PERSISTENT"] = False
        for max_keys, change in LENGTH_TABLE.get((D, bool(is_causal)), ()):
            if n_k <= max_keys:
                sched.update(change)
                break
    if masked:
        sched.update(MASKED_SCHEDULE)
    if D == 128 and return_lse and user.get("PERSISTENT", sched["PERSISTENT"]) is True:
        sched.update(PERSISTENT_LSE_SCHEDULE_128)
    sched.update(user)
    if sched["ORDER"] == "auto":
        sched["ORDER"] = "lpt" if (is_causal and sched["PERSISTENT"]) else "heads"
    return sched


def _kv_view(q, t):
    """(t as a view over what it stores, whether it has its own batch): a zero stride over heads or
    batch is a broadcast -- map one head (or batch) and let the kernel index it."""
    own_batch = True
    if t.shape[1] > 1 and t.stride(1) == 0:
        t = t[:, :1]
    if t.shape[0] > 1 and t.stride(0) == 0:
        t, own_batch = t[:1], False
    return t, own_batch


@dataclass
class Launch:
    grid: tuple
    args: tuple
    constexprs: dict


@dataclass(frozen=True)
class HopperOptions:
    """What one Hopper forward computes: ``scale``, SDPA's top-left ``is_causal``, and ``schedule``
    (constexpr overrides of the defaults this module picks; None: none, and the plan may be reused)."""

    scale: float
    is_causal: bool = False
    schedule: Optional[dict] = None


EMULATED_SMS = 132  # an H100/H200's SM count: the persistent grid of a plan built without a GPU


class MapTarget(NamedTuple):
    """What a plan is built for: ``make_map(t, dims, strides, box)`` builds a tensor map (None: a
    device map; the emulator passes TensorMapSpec), ``sm_count`` sizes the persistent grid (None:
    EMULATED_SMS) and ``l2_bytes`` the head groups of the "lpt" order."""

    make_map: Optional[Callable] = None
    sm_count: Optional[int] = None
    l2_bytes: int = 50 << 20


def plan_launch(tensors: ForwardTensors, options: HopperOptions, target: MapTarget = MapTarget()) -> Launch:
    """The grid, arguments and constexprs of one launch of ``tensors`` (q (B, H, N_q, D), k/v
    (B, H_kv, N_k, D), out, lse or None, attn_mask or None)."""
    q, k, v, out, lse, attn_mask = tensors
    is_causal, scale, schedule = options.is_causal, options.scale, options.schedule
    make_map, sm_count, l2_bytes = target
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    if H % k.shape[1] or k.shape[1] != v.shape[1]:
        raise ValueError(f"launch_hopper: key/value heads expects a divisor of the {H} query heads (the same for "
                         f"both), but got {k.shape[1]} and {v.shape[1]}")
    sched = resolve_schedule(D, n_k, is_causal, attn_mask is not None, schedule, lse is not None)
    make_map = make_map or device_map
    (kk, k_batched), (vv, v_batched) = _kv_view(q, k), _kv_view(q, v)
    if kk.shape[1] != vv.shape[1] or k_batched != v_batched:  # broadcast one way only: map both fully
        kk, vv, k_batched = k, v, True
    order = _coord_order(q)
    if not all(_fits(t, order) for t in (q, kk, vv)):
        q, kk, vv = tma_copy(q), tma_copy(kk), tma_copy(vv)
        order = _coord_order(q)
    block_m = 64 * sched["CONSUMERS"]
    maps = [make_map(t, *_map_geometry(t, rows, order)) for t, rows in ((q, block_m), (kk, sched["BLOCK_N"]),
                                                                        (vv, sched["BLOCK_N"]))]
    o_order = _coord_order(out)
    if sched["TMA_STORE"] and _fits(out, o_order):
        maps.append(make_map(out, *_map_geometry(out, 64, o_order)))
    else:
        sched["TMA_STORE"] = False
        maps.append(maps[0])  # not read
    mask_t, ms, lse_t = mask_and_lse_args(attn_mask, lse, B, H, n_q, n_k, q.device)
    num_m = (n_q + block_m - 1) // block_m
    kv_group = H // kk.shape[1]
    kv_bytes = 2 * n_k * D * q.element_size()
    fit = max(1, min(B * H, int(l2_bytes * L2_SHARE) // max(kv_bytes, 1)))
    head_group_log2 = max(g for g in range(fit.bit_length()) if (B * H) % (1 << g) == 0 and (1 << g) <= fit)
    grid = (min(num_m * H * B, sm_count or EMULATED_SMS),) if sched["PERSISTENT"] else (num_m, H, B)
    args = (*maps, out.view(torch.int16), lse_t, mask_t, n_q, n_k, H, B, kv_group, int(k_batched), head_group_log2,
            scale, int(is_causal), out.stride(0), out.stride(1), out.stride(2), ms[0], ms[1], ms[2], ms[3])
    cx = dict(sched, DTYPE=ty.bf16 if q.dtype == torch.bfloat16 else ty.f16, HEAD_DIM=D,
              HAS_MASK=attn_mask is not None, RETURN_LSE=lse is not None, COORD_ORDER=order,
              O_ORDER=o_order if sched["TMA_STORE"] and o_order != order else None)
    Plan(D, cx["BLOCK_N"], cx["STAGES"], cx["CONSUMERS"], cx["TMA_STORE"])  # fails early on too much smem
    return Launch(grid, args, cx)


def launch_hopper(tensors: ForwardTensors, options: HopperOptions):
    """Run the kernel: q (B, H, N_q, D), k/v (B, H_kv, N_k, D) with H_kv | H, D in {64, 128}; out
    (B, H, N_q, D) and lse (B, H, N_q) float32 or None are written. Returns the ``Repeat`` that a
    call with the same shapes, strides, dtype, device and options can launch again (or None)."""
    q, k, v, out, lse, attn_mask = tensors
    is_causal, scale, schedule = options.is_causal, options.scale, options.schedule
    key = None
    if attn_mask is None and schedule is None and not (q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr()) & 15:
        key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), out.stride(), q.dtype, q.get_device(),
               is_causal, lse is None)
        again = _repeats.get(key)
        if again is not None and again.launch(q, k, v, out, lse, scale):
            return again
    dev = q.device
    made = []
    launch = plan_launch(ForwardTensors(q, k, v, out, lse, attn_mask), options,
                         MapTarget(_recording(made), sm_count(dev), l2_bytes(dev)))
    attention_fwd_sm90[launch.grid](*launch.args, **launch.constexprs)
    if key is None:
        return None
    again = Repeat.of(launch, made, (q, k, v, out), q.shape[3])
    if again is not None:
        _repeats.put(key, again)
    return again


# -- calls like one planned before ---------------------------------------------------------------------
# A call with the shapes, strides, dtype, device and options of an earlier one differs from it only
# in its pointers and scale: it reuses that launch (grid, constexprs, arguments) and looks its
# tensor maps up by address. plan_launch stays the one place that decides; a plan that copied an
# input (a layout TMA cannot map) is not reused.
_repeats = ty.PlanCache("Hopper attention launches", capacity=64)
# The arguments a repeated call sets, by the kernel's parameter names (their positions in the
# launch's argument list follow from its signature).
_MAP_NAMES = ("tm_q", "tm_k", "tm_v", "tm_o")
_PARAMS = tuple(inspect.signature(attention_fwd_sm90.fn).parameters)
assert _PARAMS[:len(_MAP_NAMES)] == _MAP_NAMES, _PARAMS
_MAP_SLOTS = len(_MAP_NAMES)
_OUT_SLOT, _LSE_SLOT, _SCALE_SLOT = (_PARAMS.index(name) for name in ("out", "lse_ptr", "scale"))


def _tables(D):
    """The tables a plan read (read-only: a change replaces one, which ``tables_unchanged`` sees by identity)."""
    return SCHEDULE if D == 64 else SCHEDULE_128, LENGTH_TABLE, MASKED_SCHEDULE, PERSISTENT_LSE_SCHEDULE_128, L2_SHARE


def _recording(made):
    def make_map(t, shape, strides, box):
        made.append((t, tuple(shape), tuple(strides), tuple(box)))
        return device_map(t, shape, strides, box)
    return make_map


@dataclass
class Repeat:
    grid: tuple
    args: list          # the launch's arguments; the maps, out, lse and scale are set per call
    maps: tuple         # per map slot: (source: 0 q, 1 k, 2 v, 3 out, view of it, shape, strides, box, dtype)
    constexprs: dict
    head_dim: int
    tables: tuple       # _tables() when planned
    last: tuple = ()    # (q, k, v, out addresses, their maps) of the last call
    maps_out: bool = False  # whether a map is over out (the TMA store)
    compiled: object = None  # the specialization it launches while its guards hold
    prepared: dict = field(default_factory=dict)  # per thread: (its PreparedLaunch, what that holds packed)

    def tables_unchanged(self) -> bool:
        now = _tables(self.head_dim)
        return all(a is b for a, b in zip(now, self.tables))

    @staticmethod
    def fits(q, k, v) -> bool:
        """TMA needs 16-byte aligned bases (a view can start anywhere its storage does)."""
        return not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15

    @staticmethod
    def of(launch, made, sources, head_dim):
        """The reusable form of ``launch`` whose maps ``made`` recorded, or None when a map is
        over a copy rather than over one of ``sources`` (q, k, v, out) or a leading slice of it."""
        if attention_fwd_sm90._open_tensors:  # its specialization would depend on the arguments too
            return None
        maps = []
        for t, shape, strides, box in made:
            src = next((i for i, s in enumerate(sources) if s.data_ptr() == t.data_ptr() and s.dtype == t.dtype), None)
            if src is None:
                return None
            view = tuple(min(n, m) for n, m in zip(t.shape, sources[src].shape))
            maps.append((src, view if view != tuple(sources[src].shape) else None, shape, strides, box,
                         _dtype_name(t)))
        maps += [maps[0]] * (_MAP_SLOTS - len(maps))  # no TMA store: the O map slot repeats Q's (not read)
        args = list(launch.args)
        args[:_MAP_SLOTS] = [None] * _MAP_SLOTS  # set per call: the template keeps no caller's tensor
        args[_OUT_SLOT] = None
        if launch.constexprs["RETURN_LSE"]:
            args[_LSE_SLOT] = None
        return Repeat(launch.grid, args, tuple(maps), launch.constexprs, head_dim,
                      _tables(head_dim), maps_out=any(m[0] == 3 for m in maps))

    def launch(self, q, k, v, out, lse, scale) -> bool:
        """Launch for these buffers (of the planned call's shapes, strides, dtype and device), or
        return False when a table the plan read was replaced or out is not 16-byte aligned."""
        if out.data_ptr() & 15 or not self.tables_unchanged():
            return False
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr() if self.maps_out else 0)
        last = self.last
        if last and last[0] == ptrs:  # the same buffers as last time (a loop, a benchmark)
            maps = last[1]
        else:  # a map is looked up again only if its own buffer moved (a new q, the same k and v)
            sources, maps = (q, k, v, out), []
            for i, (src, view, shape, strides, box, dtype) in enumerate(self.maps):
                if last and last[0][src] == ptrs[src]:
                    maps.append(last[1][i])
                    continue
                t = sources[src]
                if view is not None:
                    t = t[:view[0], :view[1]]
                maps.append(TensorMap.cached(t, shape, strides, box, dtype))
            self.last = (ptrs, maps)
        ck = self.compiled
        if ck is None or not ck.is_current():
            # first call, or a global the kernel read changed: compile() finds (or builds) what runs now
            ck = self.compiled = attention_fwd_sm90.compile(**self.constexprs)
            self.prepared = {}
        kept = self.prepared.get(threading.get_ident())
        lse_ptr = 0 if lse is None else lse.data_ptr()
        if kept is None or kept[0].launcher is not ck.launcher():
            args = self.args[:]
            args[:_MAP_SLOTS] = maps
            args[_OUT_SLOT], args[_SCALE_SLOT] = out.view(torch.int16), scale
            if lse is not None:
                args[_LSE_SLOT] = lse
            run = ck.prepare(self.grid, *args)
            self.prepared[threading.get_ident()] = (run, [maps, out.data_ptr(), lse_ptr, scale])
            run.launch()
            return True
        # pack again only what differs from this thread's last launch: maps, output, LSE, scale
        run, packed = kept
        if packed[0] is not maps:
            for i, name in enumerate(_MAP_NAMES):
                if packed[0][i] is not maps[i]:
                    run.set(name, maps[i])
            packed[0] = maps
        if packed[1] != out.data_ptr():
            run.set("out", out.view(torch.int16))
            packed[1] = out.data_ptr()
        if packed[2] != lse_ptr:
            run.set("lse_ptr", lse)
            packed[2] = lse_ptr
        if packed[3] != scale:
            run.set("scale", scale)
            packed[3] = scale
        run.launch()
        return True
