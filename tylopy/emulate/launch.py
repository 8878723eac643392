"""Binding a launch's arguments and running the grid (``Kernel.emulate`` ends here).

Pointer arguments are CPU torch tensors or C-contiguous numpy arrays of the pointee dtype
(bf16 may also be a ``uint16`` numpy array of raw bits); the kernel's stores land in them.
Scalars are Python numbers, range-checked like a real launch. A ``ty.tensormap`` parameter
takes a ``TensorMapSpec`` (no driver needed) or a ``TensorMap`` (its ``.spec`` is used).
"""
from __future__ import annotations

import logging
import math
import os
import random
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..errors import LaunchTypeError, LaunchValueError
from ..ir.types import FLOAT_MAX, float_fits, int_range
from ..ir.values import KernelIR
from ..ir.types import PointerType, ScalarType, TensorMapType
from .errors import EmulationError, ProtocolError
from .cluster import Cluster
from .machine import CTA, run_together
from .memory import GlobalMemory
from .ops_hopper import TensorMapInfo
from .program import Program
from .values import TENSORMAP_BASE, np_dtype, splat

OPTIONS = ("ctas", "check_races", "max_iterations", "max_steps", "seed")
DEFAULT_MAX_STEPS = 1_000_000  # loop iterations per launch: a runaway of a small loop body stops in ~10 s
MAX_STEPS_ENV = "TYLOPY_EMULATE_MAX_STEPS"
SEED_ENV = "TYLOPY_EMULATE_SEED"  # a default seed: every launch without one runs a random schedule
_SAMPLED_GRID = 1 << 16  # up to this many CTAs a seeded order is a uniform shuffle; beyond, a lazy permutation
_TORCH_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i32": "int32",
                "i64": "int64", "i16": "int16", "i8": "int8", "u8": "uint8", "i1": "bool", "b32": "int32",
                "u32": "uint32", "u64": "uint64", "u16": "uint16",
                "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_programs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_log = logging.getLogger("tylopy.emulate")
PROGRESS_SECONDS = 1.0  # a long emulation says how far it got (INFO) about this often


@dataclass
class EmulationReport:
    """What an emulated launch did: which CTAs ran, how long it took, and notes (e.g. ptxas caveats)."""

    kernel: str
    grid: tuple
    ctas: list
    warps_per_cta: int
    seconds: float
    notes: list = field(default_factory=list)
    prints: list = field(default_factory=list)  # the texts ty.printf printed, in execution order

    def __str__(self):
        s = (f"emulated {self.kernel}: {len(self.ctas)} CTA(s) of grid {self.grid}, {self.warps_per_cta} warps each, "
             f"{self.seconds:.2f} s")
        return s + "".join(f"\n  note: {n}" for n in self.notes)


class Launch:
    """One emulated launch: global memory, bound parameters, tensor maps, caches and options."""

    def __init__(self, prog: Program, args, grid, check_races=True, max_iterations=1_000_000, seed=None,
                 max_steps=None):
        self.prog, self.grid = prog, grid
        self.check_races = check_races
        self.max_iterations = _positive(prog.kir.name, "max_iterations", max_iterations)
        self.max_steps = max_steps_from(prog.kir.name, max_steps)
        self.steps = 0  # loop iterations run so far, by every warp of every CTA of this launch
        seed = seed_from(prog.kir.name, seed)
        self.rng = None if seed is None else random.Random(seed)
        self.cta_coords: list = []  # by the CTAs' serial numbers (their order of execution)
        self.gmem = GlobalMemory(check_races)
        self.tensormaps: dict[int, TensorMapInfo] = {}
        self.desc_cache: dict = {}
        self.notes: list[str] = []
        self._debug = None
        kir = prog.kir
        if len(args) != len(kir.params):
            names = ", ".join(p.name for p in kir.params)
            raise LaunchTypeError(f"{kir.name}: expects {len(kir.params)} arguments ({names}), but got {len(args)}")
        self.template = prog.template({p.name: self._bind(p, x) for p, x in zip(kir.params, args)})

    def start_cta(self, coord, total: int):
        """Charge one step for a CTA starting: a huge grid of straight-line CTAs also stops."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise EmulationError(
                f"{self.prog.kir.name}: the emulated launch exhausted its step budget max_steps={self.max_steps} (loop "
                f"iterations and CTA starts together) after starting {len(self.cta_coords) - 1} of the {total} CTAs "
                f"to run (next: CTA {coord}); emulate a subset with ctas=[...], or raise max_steps= / {MAX_STEPS_ENV}")

    def debug_record(self) -> np.ndarray:
        if self._debug is None:
            self._debug = splat(self.gmem.add("debug_record", np.zeros(4, dtype=np.int32)), _U64)
        return self._debug

    def note(self, text: str):
        if text not in self.notes:
            self.notes.append(text)

    def tensormap(self, addr: int, op) -> TensorMapInfo:
        info = self.tensormaps.get(addr)
        if info is None:
            from .errors import where
            raise ProtocolError(f"{op.opcode} at {where(op)}: the tensor-map operand ({addr:#x}) is not a tensor-map "
                                "parameter of the kernel")
        return info

    def _bind(self, p, x):
        kname = self.prog.kir.name
        t = p.type
        if isinstance(t, PointerType):
            _check_buffer(kname, p.name, t, x)
            try:
                addr = self.gmem.add(p.name, x)
            except ValueError as e:
                raise LaunchValueError(f"{kname}: argument {p.name!r} {e}") from None
            return splat(addr, _U64)
        if isinstance(t, TensorMapType):
            spec = getattr(x, "spec", x)
            if not all(hasattr(spec, a) for a in ("tensor", "dims", "strides_bytes", "box", "swizzle")):
                raise LaunchTypeError(f"{kname}: argument {p.name!r} expects a TensorMapSpec or TensorMap, "
                                      f"but got {type(x).__name__}")
            addr = TENSORMAP_BASE + 128 * len(self.tensormaps)
            self.tensormaps[addr] = TensorMapInfo(p.name, spec, self.gmem)
            return splat(addr, _U64)
        return splat(_scalar(kname, p.name, t, x), t)


_U64 = ScalarType("u64", 64, "uint")


def _check_buffer(kname, name, t: PointerType, x):
    want = t.pointee.name
    if isinstance(x, np.ndarray):
        ok = x.dtype == np_dtype(t.pointee) or (want == "b32" and x.dtype in (np.int32, np.uint32))
        if not ok:
            raise LaunchTypeError(f"{kname}: argument {name!r} expects a numpy array of {np_dtype(t.pointee)} "
                                  f"({want}), but got {x.dtype}")
        return
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is None or not isinstance(x, torch.Tensor):
        raise LaunchTypeError(f"{kname}: argument {name!r} expects a CPU torch.Tensor or numpy array of {want}, "
                              f"but got {type(x).__name__}")
    tname = str(x.dtype).replace("torch.", "")
    if tname != _TORCH_NAMES.get(want) and not (want == "b32" and tname in ("int32", "uint32")):
        raise LaunchTypeError(f"{kname}: argument {name!r} expects dtype torch.{_TORCH_NAMES.get(want)}, "
                              f"but got {x.dtype}")
    from ..ir.arguments import strided_last_dim_error
    error = strided_last_dim_error(kname, name, x)
    if error is not None:  # refused as a launch refuses it
        raise error
    if x.device.type != "cpu":
        raise LaunchValueError(f"{kname}: argument {name!r} expects a CPU tensor for emulation, but got one on "
                               f"{x.device}")


def _scalar(kname, name, t: ScalarType, x):
    if isinstance(x, np.generic):
        x = x.item()
    if t.is_fp8:  # as on the GPU (runtime/launch.py): no Python value packs into an fp8 parameter
        raise LaunchTypeError(f"{kname}: scalar parameter {name!r} of type {t} cannot be passed from Python")
    if t.is_float:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise LaunchTypeError(f"{kname}: argument {name!r} expects a Python float for {t}, but got "
                                  f"{type(x).__name__}")
        if not float_fits(t, x):
            raise LaunchValueError(f"{kname}: argument {name!r} expects a value of magnitude at most "
                                   f"{FLOAT_MAX[t.name]:.8g} ({t}), inf or nan, but got {x!r}")
        return float(x)
    if t.is_bool:
        if not isinstance(x, bool):
            raise LaunchTypeError(f"{kname}: argument {name!r} expects a bool, but got {type(x).__name__}")
        return x
    if isinstance(x, bool) or not isinstance(x, int):
        raise LaunchTypeError(f"{kname}: argument {name!r} expects a Python int for {t}, but got {type(x).__name__}")
    lo, hi = int_range(t)
    if not lo <= x <= hi:
        raise LaunchValueError(f"{kname}: argument {name!r} expects a value in {lo}..{hi} ({t}), but got {x}")
    return x


def _positive(kname, name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise LaunchValueError(f"{kname}: option {name!r} expects a positive int, but got {value!r}")
    return int(value)


def max_steps_from(kname, max_steps) -> int:
    """The launch's step budget: ``max_steps``, else ``$TYLOPY_EMULATE_MAX_STEPS``, else the default."""
    if max_steps is not None:
        return _positive(kname, "max_steps", max_steps)
    text = os.environ.get(MAX_STEPS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_STEPS
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise LaunchValueError(f"{kname}: environment variable {MAX_STEPS_ENV} expects a positive int, but got "
                               f"{text!r}")
    return value


def seed_from(kname, seed):
    """The launch's schedule seed: ``seed``, else ``$TYLOPY_EMULATE_SEED`` (so a whole test suite can
    run under random schedules, where races between warps show), else None (round robin)."""
    if seed is not None:
        return seed
    text = os.environ.get(SEED_ENV, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise LaunchValueError(f"{kname}: environment variable {SEED_ENV} expects an int, but got {text!r}") from None


class GridOrder:
    """The block indices of a whole grid in x-fastest order, made on demand (a huge grid is not a list).

    With an ``rng``, a random order: a uniform shuffle up to ``_SAMPLED_GRID`` blocks, beyond that a
    random affine permutation of the serial numbers (``a*i + b mod n``, ``a`` coprime to ``n``).
    """

    def __init__(self, grid, rng=None):
        self.grid, self.n = grid, grid[0] * grid[1] * grid[2]
        self.shuffled = None
        self.affine = (1, 0)
        if rng is not None and self.n > 1:
            if self.n <= _SAMPLED_GRID:
                self.shuffled = rng.sample(range(self.n), self.n)
            else:
                a = rng.randrange(1, self.n)
                while math.gcd(a, self.n) != 1:
                    a = rng.randrange(1, self.n)
                self.affine = (a, rng.randrange(self.n))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not -self.n <= i < self.n:
            raise IndexError(i)
        i %= self.n
        if self.shuffled is not None:
            i = self.shuffled[i]
        else:
            a, b = self.affine
            i = (a * i + b) % self.n
        gx, gy, _ = self.grid
        return i % gx, (i // gx) % gy, i // (gx * gy)

    def __iter__(self):
        return (self[i] for i in range(self.n))


def _grid3(kname, grid) -> tuple[int, int, int]:
    if isinstance(grid, (int, np.integer)):
        grid = (int(grid),)
    if not isinstance(grid, (tuple, list)) or not 1 <= len(grid) <= 3 or not all(
            isinstance(g, (int, np.integer)) and g >= 0 for g in grid):
        raise LaunchTypeError(f"{kname}: grid expects an int or a tuple of 1 to 3 non-negative ints, but got {grid!r}")
    g = [int(x) for x in grid] + [1] * (3 - len(grid))
    return g[0], g[1], g[2]


def _ctas(kname, grid, ctas):
    if ctas is None:
        return GridOrder(grid)
    out = []
    for c in ctas:
        c = (int(c),) if isinstance(c, (int, np.integer)) else tuple(int(v) for v in c)
        c = c + (0,) * (3 - len(c))
        if len(c) != 3 or not all(0 <= v < g for v, g in zip(c, grid)):
            raise LaunchValueError(f"{kname}: ctas expects block indices inside the grid {grid}, but got {c}")
        out.append(c)
    return out


def program_for(kernel, constexprs: dict) -> Program:
    """The compiled emulator program of one specialization (cached per kernel object, and traced
    again when a compile would trace again: an environment option or a value the trace read changed)."""
    if isinstance(kernel, KernelIR):
        return Program(kernel)
    key = tuple(sorted((k, repr(v)) for k, v in constexprs.items()))
    per = _programs.setdefault(kernel, {})
    entry = per.get(key)
    if entry is None or not entry[1]():
        kir, is_current = kernel.traced(**constexprs)
        entry = per[key] = (Program(kir), is_current)
    return entry[0]


def emulate_kernel(kernel, args, grid, **kwargs) -> EmulationReport:
    """Run ``kernel`` (a ``Kernel`` or a ``KernelIR``) on the CPU over ``grid`` with ``args``.

    Keyword arguments that name the kernel's constexprs specialize it; the others are options:
    ``ctas`` (the block indices to run, default all), ``check_races`` (default True) and
    ``max_iterations`` (per execution of a loop, default 10**6), ``max_steps`` (the loop iterations
    of the whole launch, all warps and CTAs together; default ``$TYLOPY_EMULATE_MAX_STEPS`` or 10**6,
    so a loop that never ends, or spins on a flag no CTA sets, stops within seconds with an error
    naming it) and ``seed`` (None: warps run
    round robin, CTAs in grid order, and asynchronous copies land at the latest point, the wait
    that covers them; an int: a random schedule of warps and CTAs, and copies landing at random
    points before their waits, reproducible from the seed; default ``$TYLOPY_EMULATE_SEED``, else
    None). ``grid`` may be a function of the
    constexprs, as for a launch. See docs/emulator.md.
    """
    names = [] if isinstance(kernel, KernelIR) else kernel.constexpr_names
    constexprs = {k: v for k, v in kwargs.items() if k in names}
    options = {k: v for k, v in kwargs.items() if k not in names}
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        kname = getattr(kernel, "name", "kernel")
        raise TypeError(f"{kname}.emulate got an unexpected keyword {unknown[0]!r}: expects the kernel's constexprs "
                        f"{names} or the options {list(OPTIONS)}")
    t0 = time.perf_counter()
    prog = program_for(kernel, constexprs)
    kname = prog.kir.name
    if callable(grid):
        grid = grid(constexprs)
    grid3 = _grid3(kname, grid)
    cluster = prog.kir.launch.cluster
    if cluster and any(g % c for g, c in zip(grid3, cluster)):
        raise LaunchValueError(f"{kname}: grid expects a multiple of the cluster shape {cluster} in every dimension, "
                               f"but got {grid3}")
    ctas = _ctas(kname, grid3, options.pop("ctas", None))
    launch = Launch(prog, tuple(args), grid3, **options)
    if launch.rng is None:
        order = ctas  # a GridOrder for a whole grid: coordinates made as they are run
    elif isinstance(ctas, GridOrder):
        order = GridOrder(grid3, launch.rng)
    else:
        order = launch.rng.sample(list(ctas), len(ctas))
    nwarps = -(-prog.kir.launch.max_threads // 32)
    _log.info("emulating %s: %d block(s) of grid %s, %d warps each", kname, len(ctas), grid3, nwarps)
    _run_ctas(launch, order, kname)
    report = EmulationReport(kname, grid3, ctas, nwarps, time.perf_counter() - t0, launch.notes,
                             getattr(launch, "prints", []))
    _log.info("%s", report)
    return report


def _run_cluster(launch: Launch, coord, total: int, dims, done: set) -> None:
    """The CTAs of the cluster holding ``coord``, run together (once per cluster)."""
    first = tuple(c - c % d for c, d in zip(coord, dims))
    if first in done:
        return
    done.add(first)
    cluster = Cluster(dims, first, launch.grid)
    ctas = []
    for c in cluster.coords():
        launch.cta_coords.append(c)
        launch.start_cta(c, total)
        ctas.append(CTA(launch, c, len(launch.cta_coords) - 1, cluster))
    run_together(ctas)


def _run_ctas(launch: Launch, order, kname: str) -> None:
    start = said = time.perf_counter()
    dims, clusters_done = launch.prog.kir.launch.cluster, set()
    with np.errstate(all="ignore"):  # inactive lanes compute on garbage; IEEE results are what we want
        for coord in order:
            if dims:
                _run_cluster(launch, coord, len(order), dims, clusters_done)
                continue
            launch.cta_coords.append(coord)
            launch.start_cta(coord, len(order))
            CTA(launch, coord, len(launch.cta_coords) - 1).run()
            now = time.perf_counter()
            if now - said >= PROGRESS_SECONDS and _log.isEnabledFor(logging.INFO):
                said = now
                _log.info("emulating %s: %d/%d blocks done, %.1f s", kname, len(launch.cta_coords), len(order),
                          now - start)
            elif _log.isEnabledFor(logging.DEBUG):
                _log.debug("emulating %s: block %s done (%d/%d)", kname, coord, len(launch.cta_coords), len(order))
