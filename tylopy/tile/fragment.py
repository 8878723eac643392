"""``Fragment``: per-lane register values, the layout that places them, and who owns each row.

A fragment runs in one of two modes with the same code:

* traced (inside a kernel): ``data`` is this thread's registers, a tuple of IR values; every op
  builds IR through the active builder (shuffles become ``shfl.sync.bfly``);
* reference (the CPU semantics): ``data`` is every lane's registers, one numpy array of shape
  (threads,) per register; shuffles index the lane axis. This is the numpy model that tests
  compare with independent oracles and with the GPU, lane by lane.

>>> from tylopy.tile.fragment import Fragment
>>> from tylopy.tile.layouts import LocalOwnership
>>> f = Fragment((1.0, 3.0), LocalOwnership(2, 2))
>>> f.reduce("max", dims=2).data
(3.0,)
"""
from __future__ import annotations

import numpy as np

from ..errors import KernelSourceError, LayoutError, OwnershipError
from ..language import lang
from ..language.builder import user_location
from ..language.proxy import RuntimeValue as Value
from ..language.proxy import as_value
from ..ir.types import f32
from ..semantics import scalar
from ..semantics.conversions import pack2_bits
from .layouts import Layout, Ownership, local, reduced_layout

NEG_INF = float("-inf")


# -- element backends: the same arithmetic on IR values or on numpy lane vectors -----------------

class _TracedOps:
    """Element ops on run-time values: the kernel language's own functions."""

    traced = True

    @staticmethod
    def const(x, like=None):
        return as_value(float(x), f32)

    add = staticmethod(lambda a, b: a + b)
    sub = staticmethod(lambda a, b: a - b)
    mul = staticmethod(lambda a, b: a * b)
    max = staticmethod(lambda a, b: lang.maximum(as_value(a, f32), b))
    min = staticmethod(lambda a, b: lang.minimum(as_value(a, f32), b))
    exp2 = staticmethod(lambda a: lang.exp2(a))
    log2 = staticmethod(lambda a: lang.log2(a))
    fma = staticmethod(lambda a, b, c: lang.fma(a, b, c))
    rcp = staticmethod(lambda a: lang.rcp(a))
    select = staticmethod(lambda c, a, b: lang.select(c, as_value(a, f32), as_value(b, f32)))
    eq = staticmethod(lambda a, b: a == b)
    gt = staticmethod(lambda a, b: a > b)
    ne = staticmethod(lambda a, b: a != b)
    shfl_xor = staticmethod(lambda a, mask: lang.shfl_xor(a, mask))
    pack2 = staticmethod(lambda lo, hi, dtype: lang.pack2(lo, hi, dtype))


class _RefOps:
    """The same element ops on numpy lane vectors, with the GPU's scalar semantics (``tylopy.semantics``)."""

    traced = False

    @staticmethod
    def const(x, like=None):
        return np.full(like.shape if like is not None else (1,), x, dtype=np.float32)

    add = staticmethod(lambda a, b: scalar.binary_f32("add", a, b))
    sub = staticmethod(lambda a, b: scalar.binary_f32("sub", a, b))
    mul = staticmethod(lambda a, b: scalar.binary_f32("mul", a, b))
    max = staticmethod(lambda a, b: scalar.binary_f32("max", a, b))
    min = staticmethod(lambda a, b: scalar.binary_f32("min", a, b))
    exp2 = staticmethod(lambda a: scalar.ex2_approx_ftz(np.asarray(a, np.float32)))
    log2 = staticmethod(lambda a: scalar.lg2_approx_ftz(np.asarray(a, np.float32)))
    fma = staticmethod(lambda a, b, c: scalar.fma_f32(*(np.asarray(x, np.float32) for x in (a, b, c))))
    rcp = staticmethod(lambda a: scalar.rcp_rn(np.asarray(a, np.float32)))
    select = staticmethod(lambda c, a, b: np.where(c, a, b).astype(np.float32))
    eq = staticmethod(lambda a, b: np.asarray(a) == np.asarray(b))
    gt = staticmethod(lambda a, b: np.asarray(a) > np.asarray(b))
    ne = staticmethod(lambda a, b: np.asarray(a) != np.asarray(b))

    @staticmethod
    def shfl_xor(a, mask):
        a = np.asarray(a)
        return a[np.arange(a.shape[0]) ^ mask]

    @staticmethod
    def pack2(lo, hi, dtype):
        return pack2_bits(lo, hi, dtype.name)


def _fold(ops, fn, xs):
    acc = xs[0]
    for x in xs[1:]:
        acc = fn(acc, x)
    return acc


_REDUCERS = {"max": "max", "sum": "add", "min": "min"}
_PENDING = "pending wgmma group"  # a loop-carried fragment's static mark: pending, in some group


class Fragment:
    """Registers of a tile spread over lanes: ``data``, its ``layout`` and its ``ownership``.

    ``pack`` > 1 means each register holds that many 16-bit elements (an MMA A/B operand): the
    layout then describes elements, register r holding elements r*pack .. r*pack+pack-1.
    ``group`` marks the accumulator of a wgmma that has not been waited for: such a fragment
    cannot be read until ``wgmma_wait`` returns it.
    """

    __slots__ = ("_cols", "layout", "ownership", "pack", "group", "dtype")

    def __init__(self, data, ownership: Ownership | Layout, layout: Layout | None = None, pack: int = 1,
                 group: int | None = None, dtype=None):
        if isinstance(ownership, Layout) and layout is None:  # Fragment(data, layout): ownership from the layout
            layout = ownership
            ownership = layout.ownership
        if not isinstance(ownership, Ownership):
            raise LayoutError(f"Fragment expects a Layout (e.g. ty.wgmma_acc(64)) or an Ownership (e.g. "
                              f"LocalOwnership(2, 2)), but got {ownership!r}")
        cols = self._columns(data)
        if layout is None:
            if ownership.kind != "local":
                raise LayoutError(f"Fragment with {ownership} needs an explicit layout")
            layout = local(len(cols) * pack, ownership.row_length)
        if len(cols) * pack != layout.nvalues:
            raise LayoutError(f"Fragment data has {len(cols)} registers x {pack} elements, but layout {layout} "
                              f"holds {layout.nvalues} values per thread")
        if not (cols and isinstance(cols[0], Value)):
            for c in cols:
                if c.shape[0] != layout.threads:
                    raise LayoutError(f"reference Fragment data expects {layout.threads} lanes per register, "
                                      f"but got {c.shape[0]}")
        self._cols = cols
        self.layout = layout
        self.ownership = ownership
        self.pack = pack
        self.group = group
        self.dtype = dtype
        _check_ownership(layout, ownership)

    @staticmethod
    def _columns(data) -> tuple:
        if isinstance(data, np.ndarray) and data.ndim == 2:  # (threads, registers)
            return tuple(np.ascontiguousarray(data[:, i]) for i in range(data.shape[1]))
        data = tuple(data)
        if data and all(isinstance(x, Value) for x in data):
            return data
        if data and isinstance(data[0], np.ndarray):
            return tuple(np.asarray(x) for x in data)
        return tuple(np.asarray([x], dtype=np.float32) for x in data)  # one lane, plain numbers

    # -- inspection ------------------------------------------------------------------------------
    @property
    def traced(self) -> bool:
        return bool(self._cols) and isinstance(self._cols[0], Value)

    @property
    def ops(self):
        return _TracedOps if self.traced else _RefOps

    @property
    def values(self) -> tuple:
        """The registers: IR values (traced) or per-register lane arrays (reference)."""
        self._check_ready()
        return self._cols

    @property
    def data(self):
        """Reference data: a tuple of floats for one lane, else an array (threads, registers)."""
        self._check_ready()
        if self.traced:
            return self._cols
        if self.layout.threads == 1:
            return tuple(float(c[0]) if c.dtype.kind == "f" else int(c[0]) for c in self._cols)
        return np.stack(self._cols, axis=1)

    def item(self) -> float:
        d = self.data
        if len(d) != 1:
            raise ValueError(f"item() expects a fragment of one value, but it has {len(d)}")
        return d[0]

    def __len__(self):
        return len(self._cols)

    def __repr__(self):
        mode = "traced" if self.traced else "reference"
        pending = f", pending group {self.group}" if self.group is not None else ""
        return f"Fragment({mode}, {self.layout}, {self.ownership}{pending})"

    def lane_map(self) -> str:
        return self.layout.lane_map()

    def _check_ready(self):
        if self.group is not None:
            raise KernelSourceError(
                f"a wgmma accumulator (commit group {self.group}) is read before the wgmma_wait that completes it",
                user_location(), hint="pass it through ty.wgmma_wait(n, acc) first")

    def with_data(self, cols, layout=None, ownership=None, pack=None, dtype=None) -> "Fragment":
        return Fragment(tuple(cols), ownership or self.ownership, layout or self.layout,
                        self.pack if pack is None else pack, None, dtype if dtype is not None else self.dtype)

    # -- pytree for run-time loops ---------------------------------------------------------------
    # A pending accumulator may be carried around a run-time loop (a pipelined mainloop keeps the
    # last k-block's wgmmas in flight with wgmma_wait(1)). Commit-group numbers are trace-time
    # counts that differ between loop entry and the body's end, so the loop's structure records
    # only *that* it is pending; rebuilt, it is pending in the latest closed group, which only a
    # wait covering every group completes (conservative, and exact at the loop's end).
    def __tylopy_flatten__(self):
        group = _PENDING if self.group is not None else None
        return list(self._cols), (self.layout, self.ownership, self.pack, group, self.dtype)

    @classmethod
    def __tylopy_unflatten__(cls, aux, leaves):
        layout, ownership, pack, group, dtype = aux
        if group is _PENDING:
            from ..language.builder import current_builder
            group = max(current_builder().state.get("wgmma_committed", 0), 1)
        return cls(tuple(leaves), ownership, layout, pack, group, dtype)

    # -- elementwise -----------------------------------------------------------------------------
    def map(self, fn) -> "Fragment":
        """Apply ``fn`` to every register (an IR value or a lane array)."""
        return self.with_data([fn(x) for x in self.values])

    def _binary(self, other, fn_name, reverse=False):
        ops = self.ops
        fn = getattr(ops, fn_name)
        if isinstance(other, Fragment):
            _check_compatible(self, other, fn_name)
            if other.layout.replicated and not self.layout.replicated:
                return broadcast_rows(self, other, fn, reverse)
            pairs = zip(self.values, other.values)
            return self.with_data([fn(b, a) if reverse else fn(a, b) for a, b in pairs])
        return self.with_data([fn(ops.const(other, a) if not ops.traced else other, a) if reverse
                               else fn(a, ops.const(other, a) if not ops.traced else other) for a in self.values])

    def __add__(self, o):
        return self._binary(o, "add")

    def __radd__(self, o):
        return self._binary(o, "add", True)

    def __sub__(self, o):
        return self._binary(o, "sub")

    def __rsub__(self, o):
        return self._binary(o, "sub", True)

    def __mul__(self, o):
        return self._binary(o, "mul")

    def __rmul__(self, o):
        return self._binary(o, "mul", True)

    # -- reductions ------------------------------------------------------------------------------
    def reduce(self, op: str, dims: int) -> "Fragment":
        """``op`` in {'sum', 'max', 'min'} along logical axis ``dims`` (2: over each row's columns).

        In-lane fold in register order, then ``shfl.sync.bfly`` over exactly the lanes that share
        the row (``ownership.row_lanes``). Every lane takes part; call it in warp-uniform code.
        """
        if op not in _REDUCERS:
            raise ValueError(f"reduce op expects one of {sorted(_REDUCERS)}, but got {op!r}")
        if dims not in (1, 2):
            raise ValueError(f"reduce dims expects 1 (over rows) or 2 (over columns), but got {dims!r}")
        if self.pack != 1:
            raise LayoutError("reduce expects an unpacked fragment (pack == 1)")
        own = self.ownership
        warps = max(own.row_warps if dims == 2 else own.col_warps,
                    self.layout.sharing_warps(0 if dims == 2 else 1) if not self.layout.replicated else 1)
        if warps > 1:
            raise OwnershipError(f"a dims={dims} reduction of {self.layout} spans {warps} warps ({own}); "
                                 "that needs shared memory, not shuffles", None)
        ops = self.ops
        fn = getattr(ops, _REDUCERS[op])
        slots = self.layout.row_slots if dims == 2 else self.layout.col_slots
        vals = self.values
        out = []
        for s in range(max(slots) + 1):
            acc = _fold(ops, fn, [v for v, k in zip(vals, slots) if k == s])
            for m in (own.row_lanes if dims == 2 else own.col_lanes):
                acc = fn(acc, ops.shfl_xor(acc, m))
            out.append(acc)
        return Fragment(tuple(out), own.reduced(dims), reduced_layout(self.layout, dims), 1, None, self.dtype)


def broadcast_rows(full: Fragment, rows: Fragment, fn, reverse=False) -> Fragment:
    """``fn(x, r)`` for each register x of ``full`` and the value r of its row in ``rows``."""
    dims = 2 if rows.layout.shape[1] == 1 else 1
    slots = full.layout.row_slots if dims == 2 else full.layout.col_slots
    rv = rows.values
    return full.with_data([fn(rv[s], x) if reverse else fn(x, rv[s]) for x, s in zip(full.values, slots)])


def _check_compatible(a: Fragment, b: Fragment, what: str):
    """Raise unless ``a`` and ``b`` agree on ownership (and on layout, or rows for a reduced ``b``)."""
    if a.traced != b.traced:
        raise LayoutError(f"{what}: cannot combine a traced fragment with a reference one")
    if b.layout.replicated and not a.layout.replicated:
        dims = 2 if b.layout.shape[1] == 1 else 1
        want = a.ownership.reduced(dims)
        if (b.ownership.row_lanes, b.ownership.col_lanes) != (want.row_lanes, want.col_lanes):
            raise OwnershipError(f"{what}: ownership of {a.layout} ({a.ownership}) disagrees with "
                                 f"the row summary's ({b.ownership})", None)
        if not rows_agree(a.layout, b.layout, dims):
            raise OwnershipError(f"{what}: the rows of {a.layout} are not the rows of {b.layout}", None)
        return
    if a.ownership != b.ownership:
        raise OwnershipError(f"{what}: fragments with different ownership: {a.ownership} and {b.ownership}", None)
    if a.layout != b.layout:
        raise LayoutError(f"{what}: fragments with different layouts: {a.layout} and {b.layout}")


def rows_agree(full: Layout, summary: Layout, dims: int = 2) -> bool:
    """Does ``summary`` (a dims-reduction layout) hold, per thread and slot, the rows of ``full``?"""
    try:
        mine = reduced_layout(full, dims).table
    except LayoutError:
        return False
    return mine.shape == summary.table.shape and bool(np.array_equal(mine, summary.table))


_checked: set = set()


def _check_ownership(layout: Layout, own: Ownership):
    """The declared ownership must be what the layout does: the lanes (and warps) that share a
    row or a column. A narrower declaration would make reductions return partial results."""
    key = (layout, own)
    if key in _checked:
        return
    if own.kind == "local":
        if layout.threads != 1:
            raise OwnershipError(f"LocalOwnership expects a one-lane layout, but got {layout}", None)
    elif layout.threads >= 32 and not layout.replicated and own.kind != "reduced":
        # Lanes must match exactly; warps are checked where they matter, in ``reduce``, against the
        # layout itself (an accumulator tiled over M warps is still quad-owned along its rows).
        for axis, name, lanes in ((0, "row", own.row_lanes), (1, "column", own.col_lanes)):
            have = layout.sharing_lanes(axis)
            if have != tuple(lanes):
                raise OwnershipError(f"{own} says lanes xor {list(lanes)} share a {name}, but in {layout} "
                                     f"lanes xor {list(have)} do", None)
    _checked.add(key)


def ownership_of(layout: Layout, kind: str | None = None) -> Ownership:
    """The ownership a layout implies (who shares its rows and columns): ``layout.ownership``."""
    return layout.ownership
