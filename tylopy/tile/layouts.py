"""Fragment layouts and ownership: which lane and register hold which logical (row, col).

A ``Layout`` maps (warp, lane, value index) to a logical (row, col) through one small function
that works on Python ints (to build the table, print lane maps and run the CPU semantics) and on
IR values (to compute a thread's own coordinates inside a kernel). An ``Ownership`` says which
lanes share a logical row and which share a column: a reduction along the columns of a row
combines exactly the lanes in ``row_lanes`` (by ``shfl.sync.bfly`` with those masks).

Example: the f32 accumulator of ``mma.sync.m16n8k16`` (PTX ISA, "Matrix Fragments for
mma.m16n8k16", figure for the C/D layout). Lane l = 4g + t holds, in c0..c3::

        col:  0    1    2    3    4    5    6    7
    row 0   T0:c0 T0:c1 T1:c0 T1:c1 T2:c0 T2:c1 T3:c0 T3:c1
    row 1   T4:c0 T4:c1 ...
    row 8   T0:c2 T0:c3 T1:c2 T1:c3 ...

so row = g + 8*(i >> 1), col = 2t + (i & 1): the four lanes of a quad (same g) share a row.
``print(MMA_SYNC_C.lane_map())`` prints the whole table.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import LayoutError


# -- ownership ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ownership:
    """Who shares a logical row and a logical column of a fragment.

    ``row_lanes``: lane xor masks connecting the lanes that together hold one row (a dims=2
    reduction shuffles over exactly these). ``col_lanes``: the same for columns (dims=1).
    ``row_warps``/``col_warps``: how many warps share a row/column (more than one cannot be
    reduced with shuffles). ``row_length`` (lane-local only): values per row. ``kind`` is a
    name for printing; two ownerships are equal when they share the same lanes and warps.

    A layout determines its ownership (``Layout.ownership``); a declared one is checked against it.
    """

    kind: str = field(compare=False)
    row_lanes: tuple[int, ...] = ()
    col_lanes: tuple[int, ...] = ()
    row_warps: int = 1
    col_warps: int = 1
    row_length: int | None = None

    def __post_init__(self):
        if self.kind not in ("local", "quad", "warp", "warpgroup", "lanes", "reduced"):
            raise LayoutError(f"Ownership kind expects local, quad, warp, warpgroup, lanes or reduced, but got {self.kind!r}")
        for m in self.row_lanes + self.col_lanes:
            if m not in (1, 2, 4, 8, 16):
                raise LayoutError(f"Ownership lane masks expect powers of two below 32, but got {m}")

    def __str__(self) -> str:
        if self.kind == "local":
            return f"LocalOwnership(row_length={self.row_length})"
        return (f"{self.kind.capitalize()}Ownership(row lanes xor {list(self.row_lanes)}, col lanes xor "
                f"{list(self.col_lanes)}, {self.col_warps} warp(s) per column)")

    def reduced(self, dims: int) -> "Ownership":
        """Ownership of a reduction's result: every lane that shared the reduced axis holds it."""
        if dims == 2:
            return Ownership("reduced", self.row_lanes, (), self.row_warps, 1, None)
        return Ownership("reduced", (), self.col_lanes, 1, self.col_warps, None)


def LocalOwnership(ndims: int = 2, row_length: int | None = None) -> Ownership:
    """One lane holds its fragment alone: reductions never leave the lane.

    ``LocalOwnership(2, 2)``: a 2-D lane-local fragment whose rows hold 2 values.
    """
    if ndims not in (1, 2):
        raise LayoutError(f"LocalOwnership ndims expects 1 or 2, but got {ndims}")
    return Ownership("local", (), (), 1, 1, row_length)


QUAD = Ownership("quad", row_lanes=(1, 2), col_lanes=(4, 8, 16))
"""mma.sync C/D: the 4 lanes of a quad share a row, the 8 lanes with the same t share a column."""

WARPGROUP = Ownership("warpgroup", row_lanes=(1, 2), col_lanes=(4, 8, 16), col_warps=4)
"""wgmma accumulator: rows are quad-owned inside one warp, columns span the 4 warps."""

WARP = Ownership("warp", row_lanes=(1, 2, 4, 8, 16), col_lanes=())
"""One row spread over all 32 lanes of a warp (a warp-per-row softmax)."""


# -- layouts --------------------------------------------------------------------------------------

Coord = Callable[[object, object, int], tuple]


@dataclass(frozen=True)
class Layout:
    """(warp, lane, value index) -> logical (row, col) over a ``shape`` tile held by ``threads``."""

    name: str
    shape: tuple[int, int]
    threads: int
    nvalues: int
    coord: Coord = field(compare=False, repr=False)
    replicated: bool = False  # several lanes hold the same element (a reduction's result)
    tiling: tuple = field(default=(), compare=False)  # how an atom was repeated, e.g. ("mma_c", m, n, wm, wn)

    def __post_init__(self):
        if self.threads not in (1, 32, 64, 128, 256):
            raise LayoutError(f"Layout {self.name}: threads expects 1, 32, 64, 128 or 256, but got {self.threads}")
        if self.nvalues <= 0:
            raise LayoutError(f"Layout {self.name}: nvalues expects a positive count, but got {self.nvalues}")

    def __eq__(self, other):
        return isinstance(other, Layout) and (self.name, self.shape, self.threads, self.nvalues) == (
            other.name, other.shape, other.threads, other.nvalues)

    def __hash__(self):
        return hash((self.name, self.shape, self.threads, self.nvalues))

    def __str__(self):
        return f"{self.name} ({self.shape[0]}x{self.shape[1]}, {self.threads} threads x {self.nvalues} values)"

    @functools.cached_property
    def table(self) -> np.ndarray:
        """int array [threads, nvalues, 2] of (row, col); checked to be a bijection onto the tile."""
        t = np.zeros((self.threads, self.nvalues, 2), dtype=np.int64)
        for th in range(self.threads):
            w, l = divmod(th, 32) if self.threads > 1 else (0, 0)
            for i in range(self.nvalues):
                t[th, i] = self.coord(w, l, i)
        rows, cols = self.shape
        flat = t[..., 0] * cols + t[..., 1]
        if t[..., 0].min() < 0 or t[..., 0].max() >= rows or t[..., 1].min() < 0 or t[..., 1].max() >= cols:
            raise LayoutError(f"Layout {self.name} maps outside its {rows}x{cols} shape")
        if not self.replicated and len(np.unique(flat)) != flat.size:
            raise LayoutError(f"Layout {self.name} maps two (lane, value) pairs to the same element")
        return t

    def lane_map(self, warp: int = 0, max_cols: int = 32) -> str:
        """The tile as the PTX ISA draws it: each cell shows ``T<lane>:<value>`` of the owning thread."""
        rows, cols = self.shape
        grid = [["." for _ in range(cols)] for _ in range(rows)]
        for th in range(self.threads):
            for i in range(self.nvalues):
                r, c = self.table[th, i]
                grid[r][c] = f"T{th}:{i}"
        width = max(len(x) for row in grid for x in row)
        shown = min(cols, max_cols)
        head = "     " + " ".join(f"{c:>{width}}" for c in range(shown))
        lines = [f"{self}", head]
        for r in range(rows):
            lines.append(f"{r:>4} " + " ".join(f"{x:>{width}}" for x in grid[r][:shown]))
        return "\n".join(lines)

    @functools.cached_property
    def ownership(self) -> "Ownership":
        """Who shares this layout's rows and columns, read off its table."""
        if self.threads == 1:
            return Ownership("local", (), (), 1, 1, self.shape[1])
        rows, cols = self.sharing_lanes(0), self.sharing_lanes(1)
        row_warps, col_warps = self.sharing_warps(0), self.sharing_warps(1)
        if self.replicated:
            kind = "reduced"
        elif rows == (1, 2, 4, 8, 16):
            kind = "warp"
        elif rows == (1, 2) and col_warps == 4:
            kind = "warpgroup"
        elif rows == (1, 2):
            kind = "quad"
        else:
            kind = "lanes"
        return Ownership(kind, rows, cols, row_warps, col_warps, None)

    @functools.cached_property
    def row_slots(self) -> tuple[int, ...]:
        """For each value index, which of the thread's rows it lies in (the same for every thread)."""
        return self._slots(0)

    @functools.cached_property
    def col_slots(self) -> tuple[int, ...]:
        return self._slots(1)

    def _slots(self, axis: int) -> tuple[int, ...]:
        ref = None
        for th in range(self.threads):
            seen: dict[int, int] = {}
            slots = tuple(seen.setdefault(int(x), len(seen)) for x in self.table[th, :, axis])
            if ref is None:
                ref = slots
            elif slots != ref:
                raise LayoutError(f"Layout {self.name}: threads disagree on which values share a "
                                  f"{'row' if axis == 0 else 'column'}; it cannot be reduced lane by lane")
        return ref

    def sharing_warps(self, axis: int) -> int:
        """How many warps hold elements of one row (axis 0) or column (axis 1), at most."""
        if self.threads < 64:
            return 1
        owners: dict[int, set] = {}
        for th in range(self.threads):
            for x in self.table[th, :, axis]:
                owners.setdefault(int(x), set()).add(th // 32)
        return max(len(v) for v in owners.values())

    def sharing_lanes(self, axis: int) -> tuple[int, ...]:
        """xor masks that connect lanes holding the same row (axis 0) or column (axis 1) in a warp."""
        masks = []
        for m in (1, 2, 4, 8, 16):
            if self.threads < 32:
                break
            ok = all(set(self.table[l, :, axis]) == set(self.table[l ^ m, :, axis]) for l in range(32))
            if ok:
                masks.append(m)
        return tuple(masks)


def _gt(lane):
    return lane >> 2, lane & 3


# mma.sync.aligned.m16n8k16 (PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type")
def _mma_c(w, lane, i):
    g, t = _gt(lane)
    return g + 8 * (i >> 1), 2 * t + (i & 1)


def _mma_a(w, lane, i):  # element i = 2*register + half; register r: a0..a3
    g, t = _gt(lane)
    r, h = i >> 1, i & 1
    return g + 8 * (r & 1), 2 * t + h + 8 * (r >> 1)


def _mma_b(w, lane, i):  # (k, n): b0 = k 2t..2t+1, b1 = k 2t+8..2t+9; n = g
    g, t = _gt(lane)
    r, h = i >> 1, i & 1
    return 2 * t + h + 8 * r, g


MMA_SYNC_C = Layout("mma.m16n8k16 C/D f32", (16, 8), 32, 4, _mma_c)
MMA_SYNC_A = Layout("mma.m16n8k16 A 16-bit", (16, 16), 32, 8, _mma_a)
MMA_SYNC_B = Layout("mma.m16n8k16 B 16-bit", (16, 8), 32, 4, _mma_b)


def tiled_mma_c(m_reps: int = 1, n_reps: int = 1, warps_m: int = 1, warps_n: int = 1) -> Layout:
    """The C/D atom repeated over M and N in each warp, and warps tiled over M (then N).

    Value index v = (m_rep * n_reps + n_rep) * 4 + i; warp w covers M block w % warps_m and
    N block w // warps_m.
    """
    for name, x in (("m_reps", m_reps), ("n_reps", n_reps), ("warps_m", warps_m), ("warps_n", warps_n)):
        if not isinstance(x, int) or x < 1:
            raise LayoutError(f"tiled_mma_c {name} expects a positive int, but got {x!r}")

    def coord(w, lane, v):
        rep, i = divmod(v, 4)
        mr, nr = divmod(rep, n_reps)
        wm, wn = (w % warps_m, w // warps_m) if isinstance(w, int) else (w % warps_m, w // warps_m)
        r, c = _mma_c(0, lane, i)
        return (wm * m_reps + mr) * 16 + r, (wn * n_reps + nr) * 8 + c

    return Layout(f"mma.m16n8k16 C x ({m_reps}m, {n_reps}n) x warps ({warps_m}m, {warps_n}n)",
                  (16 * m_reps * warps_m, 8 * n_reps * warps_n), 32 * warps_m * warps_n, 4 * m_reps * n_reps, coord,
                  tiling=("mma_c", m_reps, n_reps, warps_m, warps_n))


# wgmma.mma_async m64nNk16 (PTX ISA "Register Fragments and Shared Memory Matrix Layouts" for wgmma)
def wgmma_acc(n: int) -> Layout:
    """f32 accumulator of m64n{n}k16: row = 16w + g + 8((i>>1)&1), col = 8(i>>2) + 2t + (i&1)."""
    if n % 8 or not 8 <= n <= 256:
        raise LayoutError(f"wgmma N expects a multiple of 8 in 8..256, but got {n}")
    return _wgmma_acc(n)


@functools.lru_cache(maxsize=None)
def _wgmma_acc(n: int) -> Layout:
    def coord(w, lane, i):
        g, t = _gt(lane)
        return 16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)
    return Layout(f"wgmma m64n{n} accumulator f32", (64, n), 128, n // 2, coord)


def _wgmma_a(w, lane, i):
    g, t = _gt(lane)
    r, h = i >> 1, i & 1
    return 16 * w + g + 8 * (r & 1), 2 * t + h + 8 * (r >> 1)


WGMMA_A_RS = Layout("wgmma m64k16 register A 16-bit", (64, 16), 128, 8, _wgmma_a)


# 8-bit operands (fp8): the same byte positions as the 16-bit tables, four codes per register.
# Element i = 4 r + h (register r, byte h): the k32 A tile of a warp's 16 rows, and the k32 B tile.
def _k32_a(w, lane, i):
    g, t = _gt(lane)
    r, h = i >> 2, i & 3
    return 16 * w + g + 8 * (r & 1), 4 * t + h + 16 * (r >> 1)


def _k32_b(w, lane, i):
    g, t = _gt(lane)
    r, h = i >> 2, i & 3
    return 4 * t + h + 16 * r, g


WGMMA_A_RS_FP8 = Layout("wgmma m64k32 register A 8-bit", (64, 32), 128, 16, _k32_a)
MMA_SYNC_A_K32 = Layout("mma.m16n8k32 A 8-bit", (16, 32), 32, 16, _k32_a)
MMA_SYNC_B_K32 = Layout("mma.m16n8k32 B 8-bit", (32, 8), 32, 8, _k32_b)


def local(nvalues: int, row_length: int | None = None) -> Layout:
    """One lane holding ``nvalues`` in rows of ``row_length`` (default: one row)."""
    rl = row_length or nvalues
    if nvalues % rl:
        raise LayoutError(f"a lane-local layout of {nvalues} values cannot have rows of {rl}")
    return Layout(f"lane-local {nvalues // rl}x{rl}", (nvalues // rl, rl), 1, nvalues,
                  lambda w, l, i: (i // rl, i % rl))


def reduced_layout(layout: Layout, dims: int) -> Layout:
    """The layout of a dims-reduction: one value per row slot (dims=2) or column slot (dims=1)."""
    slots = layout.row_slots if dims == 2 else layout.col_slots
    n = max(slots) + 1
    first = [slots.index(s) for s in range(n)]

    def coord(w, lane, s):
        r, c = layout.coord(w, lane, first[s])
        return (r, 0) if dims == 2 else (0, c)

    shape = (layout.shape[0], 1) if dims == 2 else (1, layout.shape[1])
    return Layout(f"{layout.name} reduced over dims={dims}", shape, layout.threads, n, coord, replicated=True)
