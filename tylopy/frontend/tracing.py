"""What rewritten kernel code calls at trace time: ``if_``, ``for_``, ``while_``, ``range``.

This is tylopy's one implementation of structured control flow. Compile-time conditions and
bounds run as plain Python (the untaken branch is never traced, loops unroll). Run-time ones
build IR regions (``if``, ``for``, ``while`` ops); the values they carry may be scalars, tuples
and lists of them, or any object with ``__tylopy_flatten__`` (fragments, softmax states).
"""
from __future__ import annotations

import builtins
import itertools
from typing import Any

from ..errors import KernelSourceError
from ..ir.types import ScalarType, i1, i32
from .builder import current_builder, user_location
from .proxy import RuntimeValue, as_value, handle

# A compile-time loop that unrolls more iterations than this at trace time is almost surely
# meant to run at run time (unrolled code also grows LLVM's compile time faster than linearly).
MAX_UNROLL = 8192


class _Undefined:
    """A name that has no value on this path (assigned in one branch only, or not yet)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def _fail(self, *args, **kwargs):
        raise KernelSourceError(
            f"{self.name!r} has no value here: it is assigned on only one path of a run-time "
            "if, or only inside a run-time loop", user_location(),
            hint="assign it before the if/loop so every path defines it")

    __getattr__ = _fail
    undefined_error = _fail  # found on the class by proxy.handle/as_value, which cannot import this module
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _fail
    __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __index__ = __call__ = __getitem__ = _fail
    __iter__ = _fail


def lookup(scope: dict, name: str) -> Any:
    return scope.get(name, _Undefined(name))


def is_defined(x) -> bool:
    return not isinstance(x, _Undefined)


# -- pytrees of values ----------------------------------------------------------------------

def flatten(x) -> tuple[list[RuntimeValue], Any]:
    """Split ``x`` into its run-time values and a static description to rebuild it."""
    if isinstance(x, _Undefined):
        return [], ("static", x)
    if isinstance(x, RuntimeValue):
        return [x], ("v",)
    if isinstance(x, (tuple, list)):
        leaves, auxes = [], []
        for e in x:
            l, a = flatten(e)
            leaves += l
            auxes.append((len(l), a))
        return leaves, ("seq", type(x), tuple(auxes))
    if hasattr(x, "__tylopy_flatten__"):
        leaves, aux = x.__tylopy_flatten__()
        return list(leaves), ("obj", type(x), aux, len(leaves))
    return [], ("static", x)


def unflatten(aux, leaves: list[RuntimeValue]):
    kind = aux[0]
    if kind == "v":
        return leaves[0]
    if kind == "seq":
        out, i = [], 0
        for n, a in aux[2]:
            out.append(unflatten(a, leaves[i:i + n]))
            i += n
        return aux[1](out)
    if kind == "obj":
        return aux[1].__tylopy_unflatten__(aux[2], list(leaves))
    return aux[1]


def _static_equal(a, b) -> bool:
    if isinstance(a, RuntimeValue) or isinstance(b, RuntimeValue):  # comparing would build an op
        return a is b
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object whose == misbehaves is compared by identity
        return a is b


def _same_static(a, b) -> bool:
    """Do two flatten() descriptions agree on everything that is not a run-time value?"""
    if a[0] != b[0]:
        return False
    if a[0] == "static":
        return type(a[1]) is type(b[1]) and _static_equal(a[1], b[1])
    if a[0] == "seq":
        return a[1] is b[1] and len(a[2]) == len(b[2]) and all(
            n1 == n2 and _same_static(x, y) for (n1, x), (n2, y) in zip(a[2], b[2]))
    if a[0] == "obj":
        return a[1] is b[1] and a[3] == b[3] and _static_equal(a[2], b[2])
    return True


def _number_fits(x, t: ScalarType) -> bool:
    """May the Python number ``x`` stand for a value of ``t`` where two paths meet?"""
    if isinstance(x, bool):
        return t.is_bool or t.is_int
    if isinstance(x, float):
        return t.is_float  # 0.0 on one path never silently becomes an integer
    return isinstance(x, int) and not t.is_bool


def _promote_for_carry(x, result):
    """A Python number carried into a run-time loop becomes a value of the type the body gives it."""
    if isinstance(x, (bool, int, float)) and isinstance(result, RuntimeValue) and isinstance(result.type, ScalarType):
        if not _number_fits(x, result.type):
            current_builder().error(
                f"a loop-carried name holds the Python {type(x).__name__} {x!r} before the loop and a "
                f"{result.type} value inside it", hint=f"start it as ty.cast({x!r}, ty.{result.type})")
        return as_value(x, result.type)
    if isinstance(x, (bool, int, float)) and isinstance(result, (bool, int, float)):
        return as_value(x)  # a number the loop changes must live in a register
    if isinstance(x, (tuple, list)) and isinstance(result, (tuple, list)) and len(x) == len(result):
        return type(x)(_promote_for_carry(a, r) for a, r in zip(x, result))
    return x


def _check_types(what: str, expected, got, names):
    for name, t, v in zip(names, expected, got):
        if v.type != t:
            current_builder().error(
                f"{what}: {name!r} is {t} before and {v.type} after; a loop-carried value keeps its type",
                hint="convert it with ty.cast so both sides agree")


# -- if ---------------------------------------------------------------------------------------

def if_(cond, then_fn, else_fn, names, values):
    """``if cond`` with the branches as functions of the names' values, returning their new values."""
    if not isinstance(cond, RuntimeValue):
        return (then_fn if cond else else_fn)(*values)
    if cond.type != i1:
        cond = cond != 0
    bld = current_builder()
    # Trace both branches into their own blocks; each gives the names' values at its end.
    branches = []  # (open block, {name: output})
    for fn in (then_fn, else_fn):
        bld.push_block(())
        try:
            outs = fn(*values)
        except BaseException:
            bld.discard_block()
            raise
        branches.append((bld.suspend_block(), dict(zip(names, outs))))
    # A name survives the if when both paths define it with the same structure; a Python number
    # on one path and a scalar value on the other becomes a constant on the first.
    merged = []  # (name, aux, [leaves per branch])
    for name in names:
        outs = [br[1][name] for br in branches]
        if not all(is_defined(o) for o in outs):
            continue
        for k in (0, 1):
            other = outs[1 - k]
            if isinstance(outs[k], (bool, int, float)) and isinstance(other, RuntimeValue) and \
                    isinstance(other.type, ScalarType):
                if not _number_fits(outs[k], other.type):
                    bld.error(f"{name!r} is the Python {type(outs[k]).__name__} {outs[k]!r} on one path of a "
                              f"run-time if and a {other.type} value on the other",
                              hint=f"write ty.cast({outs[k]!r}, ty.{other.type}) if that is what you mean")
                bld.resume_block(branches[k][0])
                outs[k] = as_value(outs[k], other.type)
                branches[k] = (bld.suspend_block(), branches[k][1])
        (l0, a0), (l1, a1) = (flatten(o) for o in outs)
        if len(l0) != len(l1) or [v.type for v in l0] != [v.type for v in l1]:
            if l0 and l1 and len(l0) == len(l1):
                bld.error(f"{name!r} has type {[str(v.type) for v in l0]} on one path of a run-time if and "
                          f"{[str(v.type) for v in l1]} on the other", hint="convert one side with ty.cast")
            continue
        if not _same_static(a0, a1):
            bld.error(f"{name!r} holds different compile-time values on the two paths of a run-time if",
                      hint="compute it with run-time values (e.g. ty.select) or decide it at compile time")
        merged.append((name, a0, (l0, l1)))
    blocks = []
    for k, (blk, _) in enumerate(branches):
        bld.resume_block(blk)
        bld.emit("yield", [handle(v) for _, _, leaves in merged for v in leaves[k]])
        blocks.append(bld.pop_block())
    result_types = tuple(v.type for _, _, leaves in merged for v in leaves[0])
    results = [RuntimeValue(r) for r in bld.emit("if", (handle(cond),), regions=tuple(blocks),
                                                 result_types=result_types)]
    by_name, i = {}, 0
    for name, aux, leaves in merged:
        n = len(leaves[0])
        by_name[name] = unflatten(aux, results[i:i + n])
        i += n
    out = []
    for name, v in zip(names, values):
        if name in by_name:
            out.append(by_name[name])
        elif all(br[1][name] is v for br in branches):
            out.append(v)  # untouched on both paths
        else:
            out.append(_Undefined(name))
    return tuple(out)


def if_else(cond, then_fn, else_fn):
    """Library form of a run-time if: each branch returns a pytree of the same structure."""
    (result,) = if_(cond, lambda _: (then_fn(),), lambda _: (else_fn(),), ("result",), (None,))
    return result


# -- for ----------------------------------------------------------------------------------------

class DynamicRange:
    """``range`` over run-time bounds (or ``unroll=False``): becomes an IR ``for`` loop."""

    def __init__(self, start, stop=None, step=1):
        if stop is None:
            start, stop = 0, start
        self.start, self.stop, self.step = start, stop, step

    def values(self):
        like = next((x.type for x in (self.start, self.stop, self.step) if isinstance(x, RuntimeValue)), i32)
        vals = tuple(as_value(x, like) for x in (self.start, self.stop, self.step))
        for name, v in zip(("start", "stop", "step"), vals):
            if not isinstance(v.type, ScalarType) or not v.type.is_int or v.type.is_bool:
                current_builder().error(f"range {name} expects an integer, but got a {v.type} value")
        if len({v.type for v in vals}) != 1:
            current_builder().error(f"range expects bounds of one integer type, but got "
                                    f"{', '.join(str(v.type) for v in vals)}",
                                    hint="convert them with ty.cast")
        return vals


def range(*args, unroll=None):  # noqa: A001 - mirrors Python's range inside kernels
    """Python's ``range`` when every bound is a compile-time int, a run-time loop otherwise.

    ``unroll=False`` makes a loop with compile-time bounds a run-time loop too; ``unroll=True``
    insists on unrolling (compile-time bounds only). Without a hint, compile-time loops unroll
    at trace time (up to ``MAX_UNROLL`` iterations) and LLVM's unroller decides for run-time ones.
    """
    if not 1 <= len(args) <= 3:
        current_builder().error(f"range expects 1 to 3 arguments, but got {len(args)}")
    runtime = any(isinstance(a, RuntimeValue) for a in args)
    if runtime and unroll is True:
        current_builder().error("range(..., unroll=True) expects compile-time bounds, but got a run-time value")
    if runtime or unroll is False:
        if builtins.len(args) == 3 and not isinstance(args[2], RuntimeValue) and args[2] == 0:
            current_builder().error("range step expects a non-zero value, but got 0")
        return DynamicRange(*args)
    for a in args:
        if not isinstance(a, int) or isinstance(a, bool):
            current_builder().error(f"range expects integer bounds, but got {type(a).__name__} {a!r}")
    r = builtins.range(*args)
    if builtins.len(r) > MAX_UNROLL:
        current_builder().error(f"this loop unrolls {builtins.len(r)} iterations at trace time (limit {MAX_UNROLL})",
                                hint="make it a run-time loop: ty.range(..., unroll=False)")
    return r


def static_range(*args):
    """A loop that always unrolls at trace time; its bounds must be compile-time ints."""
    if any(isinstance(a, RuntimeValue) for a in args):
        current_builder().error("static_range expects compile-time bounds, but got a run-time value",
                                hint="use range(...) for a run-time loop")
    return range(*args, unroll=True)


def _run_python_loop(iterable, body, values):
    for x in iterable:
        values = body(x, *values)
    return tuple(values)


def for_(iterable, body, names, values):
    if not isinstance(iterable, DynamicRange):
        if isinstance(iterable, RuntimeValue):
            current_builder().error("cannot iterate over a run-time value", hint="use range(n) with a run-time n")
        if isinstance(iterable, builtins.range) and builtins.len(iterable) > MAX_UNROLL:
            current_builder().error(f"this loop unrolls {builtins.len(iterable)} iterations at trace time "
                                    f"(limit {MAX_UNROLL})", hint="make it a run-time loop: ty.range(..., unroll=False)")
        return _run_python_loop(iterable, body, values)
    lo, hi, step = iterable.values()
    carried_idx = [i for i, v in enumerate(values) if is_defined(v)]
    return _traced_loop(
        values, names, carried_idx,
        lambda init, fn, rebuild: _for_op(lo, hi, step, init, [names[i] for i in carried_idx],
                                          lambda iv, args: fn(body, rebuild(args), iv)))


def _for_op(lo, hi, step, init, names, body):
    """Emit ``for iv in range(lo, hi, step)`` carrying ``init``; ``body(iv, args)`` gives the next values."""
    bld = current_builder()
    types = [v.type for v in init]
    args = [RuntimeValue(a) for a in bld.push_block([lo.type, *types])]
    try:
        out = tuple(body(args[0], tuple(args[1:])))
        _check_types("for loop", types, out, names)
        bld.emit("yield", [handle(v) for v in out])
    except BaseException:
        bld.discard_block()
        raise
    region = bld.pop_block()
    results = bld.emit("for", [handle(v) for v in (lo, hi, step, *init)], regions=(region,),
                       result_types=tuple(types))
    return tuple(RuntimeValue(r) for r in results)


def _while_op(init, names, cond_fn, body_fn):
    bld = current_builder()
    types = [v.type for v in init]
    args = tuple(RuntimeValue(a) for a in bld.push_block(types))
    try:
        c = cond_fn(args)
        if not isinstance(c, RuntimeValue) or c.type != i1:
            bld.error(f"a while condition expects a run-time bool (i1), but got {c!r}")
        bld.emit("condition", (handle(c),))
    except BaseException:
        bld.discard_block()
        raise
    cond_region = bld.pop_block()
    args = tuple(RuntimeValue(a) for a in bld.push_block(types))
    try:
        out = tuple(body_fn(args))
        _check_types("while loop", types, out, names)
        bld.emit("yield", [handle(v) for v in out])
    except BaseException:
        bld.discard_block()
        raise
    body_region = bld.pop_block()
    results = bld.emit("while", [handle(v) for v in init], regions=(cond_region, body_region),
                       result_types=tuple(types))
    return tuple(RuntimeValue(r) for r in results)


class _Retrace(Exception):
    def __init__(self, index, value):
        self.index, self.value = index, value


def _traced_loop(values, names, carried_idx, build):
    """Build a run-time loop over the carried values; retrace once if Python numbers must become values.

    ``build(init, run_body, rebuild)`` builds the loop op: ``rebuild(block_args)`` gives the full
    list of names' values inside a region, ``run_body(body, vals, *extra)`` calls the user's body
    and returns the flat values to yield.
    """
    values = list(values)
    for attempt in itertools.count():
        flat = [flatten(values[i]) for i in carried_idx]
        init = [v for leaves, _ in flat for v in leaves]

        def rebuild(args):
            vals = list(values)
            j = 0
            for k, i in enumerate(carried_idx):
                n = len(flat[k][0])
                vals[i] = unflatten(flat[k][1], list(args[j:j + n]))
                j += n
            return vals

        def run_body(body, vals, *extra):
            outs = body(*extra, *vals)
            leaves = []
            for k, i in enumerate(carried_idx):
                l, aux = flatten(outs[i])
                if len(l) != len(flat[k][0]) or not _same_static(aux, flat[k][1]):
                    raise _Retrace(i, outs[i])
                leaves += l
            return leaves

        try:
            results = build(init, run_body, rebuild)
        except _Retrace as r:
            promoted = _promote_for_carry(values[r.index], r.value)
            if promoted is values[r.index]:
                # Not a number we can put in a register: the name is local to the loop body
                # (like ``upd = softmax_update(...)``); after the loop it has no value.
                carried_idx = [i for i in carried_idx if i != r.index]
            elif attempt >= 8:
                current_builder().error(
                    f"{names[r.index]!r} changes its structure inside a run-time loop "
                    f"(it enters as {values[r.index]!r} and leaves as {r.value!r})")
            else:
                values[r.index] = promoted
            continue
        out = rebuild(results)
        for i, v in enumerate(values):
            if i not in carried_idx:
                out[i] = _Undefined(names[i])
        return tuple(out)


def while_(cond_fn, body, names, values):
    bld = current_builder()
    bld.push_block(())  # probe: is the condition a run-time value? (its ops are thrown away)
    try:
        first = cond_fn(*values)
    finally:
        bld.discard_block()
    if not isinstance(first, RuntimeValue):
        vals = tuple(values)
        c = first
        for _ in itertools.count():
            if not c:
                return vals
            vals = tuple(body(*vals))
            c = cond_fn(*vals)
    carried_idx = [i for i, v in enumerate(values) if is_defined(v)]

    def build(init, run_body, rebuild):
        def cond(args):
            c = cond_fn(*rebuild(args))
            if not isinstance(c, RuntimeValue):
                c = as_value(bool(c), i1)
            return c if c.type == i1 else (c != 0)

        return _while_op(init, [names[i] for i in carried_idx], cond, lambda args: run_body(body, rebuild(args)))

    return _traced_loop(values, names, carried_idx, build)
