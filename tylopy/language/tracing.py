"""What rewritten kernel code calls at trace time: ``if_``, ``for_``, ``while_``, ``range``.

This is tylopy's one implementation of structured control flow. Compile-time conditions and
bounds run as plain Python (the untaken branch is never traced, loops unroll). Run-time ones
build IR regions (``if``, ``for``, ``while`` ops); the values they carry may be scalars, tuples,
lists and dicts of them, or any object with ``__tylopy_flatten__`` (``pytree.py``).

``break``, ``continue`` and ``return`` arrive as flag variables (``jumps.py``): a loop given
``stop`` flags ends when one is true. A run-time ``for`` with stop flags becomes an IR
``while`` over (index, carried values, flags); an unrolled loop guards each later iteration
with a run-time ``if`` once a flag is a run-time value; a compile-time ``while`` whose
condition or flags become run-time values continues as an IR ``while``.
"""
from __future__ import annotations

import builtins
import itertools

from ..errors import KernelSourceError
from ..ir.types import ScalarType, i1, i32
from .builder import current_builder, user_location
from .proxy import RuntimeValue, as_value, handle, maximum, minimum
from .pytree import (NORET, Undefined, copy_tree, display, flatten, is_container, is_defined, lookup,  # noqa: F401
                     number_fits, promote, same_static, unflatten, zero_like)

# A compile-time loop that unrolls more iterations than this at trace time is almost surely
# meant to run at run time (unrolled code also grows LLVM's compile time faster than linearly).
MAX_UNROLL = 8192
# Nested compile-time loops multiply: their product is checked when an inner loop starts, before
# it unrolls, so a runaway nest fails in milliseconds instead of after minutes of tracing.
MAX_UNROLL_TOTAL = 65536
# ``range(..., unroll=N)``: the largest count LLVM is asked to unroll a run-time loop by.
MAX_UNROLL_COUNT = 1024
_RV = "__tyf_rv"


# -- the flags of lowered jumps ---------------------------------------------------------------

def not_any(*flags):
    """``not (f1 or f2 ...)``: a Python bool when every flag is one, else a run-time i1."""
    runtime = []
    for f in flags:
        if isinstance(f, RuntimeValue):
            runtime.append(f if f.type == i1 else (f != 0))
        elif f:
            return False
    if not runtime:
        return True
    acc = runtime[0]
    for f in runtime[1:]:
        acc = acc | f
    return ~acc


def no_return():
    return NORET


def assert_(cond, message=None):
    """``assert`` in kernel code: a compile-time check; a run-time condition needs ty.device_assert."""
    if isinstance(cond, RuntimeValue):
        current_builder().error("assert needs a compile-time condition, but this one is a run-time value",
                                hint="check it on the device with ty.device_assert(cond, \"message\") (compiled in "
                                     "with TYLOPY_DEBUG=1)")
    if not cond:
        raise AssertionError(message) if message is not None else AssertionError()


def finish_return(ret, rv, always_returns: bool):
    """The value a function with lowered returns gives back (see ``jumps.py``)."""
    if rv is NORET or rv is None:
        return None
    if ret is True or always_returns:
        return rv
    current_builder().error(
        "this function returns a value on some paths, but on others it reaches its end without a return "
        "(Python would return None there)", hint="end the function with a return statement")


# -- if ---------------------------------------------------------------------------------------

def _passthrough(names, values, mutated) -> set:
    """Names only stored through (``out[i] = v``, ``t[i, j] = v``) that hold no container whose
    elements can change (a pointer, a tensor argument): nothing to carry."""
    return {n for n, v in zip(names, values)
            if n in mutated and (not is_container(v) or getattr(type(v), "__tylopy_immutable__", False))}


def if_(cond, then_fn, else_fn, names, values, mutated=()):
    """``if cond`` with the branches as functions of the names' values, returning their new values."""
    if not isinstance(cond, RuntimeValue):
        return (then_fn if cond else else_fn)(*values)
    if cond.type != i1:
        cond = cond != 0
    bld = current_builder()
    skip = _passthrough(names, values, mutated)
    boundary = bld.next_id  # values numbered from here on are made inside the branches
    # Trace both branches into their own blocks; each gives the names' values at its end.
    branches = []  # [open block, {name: output}]
    for fn in (then_fn, else_fn):
        bld.push_block(())
        try:
            outs = fn(*[copy_tree(v) for v in values])
        except BaseException:
            bld.discard_block()
            raise
        branches.append([bld.suspend_block(), dict(zip(names, outs))])

    def in_branch(k, f):
        bld.resume_block(branches[k][0])
        try:
            return f()
        finally:
            branches[k][0] = bld.suspend_block()

    merged = []  # (name, aux, [leaves per branch])
    for name in names:
        if name in skip:
            continue
        outs = [br[1][name] for br in branches]
        if not all(is_defined(o) for o in outs):
            continue
        if name == _RV and (outs[0] is NORET) != (outs[1] is NORET):
            k = 0 if outs[0] is NORET else 1
            outs[k] = outs[1 - k] if outs[1 - k] is None else in_branch(k, lambda: zero_like(outs[1 - k], name, boundary))
        for k in (0, 1):
            other = outs[1 - k]
            outs[k] = in_branch(k, lambda: promote(outs[k], other, name))
        (l0, a0), (l1, a1) = (flatten(o) for o in outs)
        if len(l0) != len(l1) or [v.type for v in l0] != [v.type for v in l1]:
            if l0 and l1 and len(l0) == len(l1):
                bld.error(f"{display(name)} has type {[str(v.type) for v in l0]} on one path of a run-time if and "
                          f"{[str(v.type) for v in l1]} on the other", hint="convert one side with ty.cast")
            if name == _RV:
                bld.error(f"the function returns {outs[0]!r} on one run-time path and {outs[1]!r} on another",
                          hint="return values of the same structure and types on every path")
            continue
        if not same_static(a0, a1):
            bld.error(f"{display(name)} holds different compile-time values on the two paths of a run-time if",
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
        elif name in skip or all(br[1][name] is v for br in branches):
            out.append(v)  # untouched on both paths
        else:
            out.append(Undefined(name))
    return tuple(out)


def if_else(cond, then_fn, else_fn):
    """Library form of a run-time if: each branch returns a pytree of the same structure."""
    (result,) = if_(cond, lambda _: (then_fn(),), lambda _: (else_fn(),), ("result",), (None,))
    return result


# -- ranges ---------------------------------------------------------------------------------------

class DynamicRange:
    """``range`` over run-time bounds (or ``unroll=False``): becomes an IR loop."""

    def __init__(self, start, stop=None, step=1, unroll=None):
        if stop is None:
            start, stop = 0, start
        self.start, self.stop, self.step = start, stop, step
        self.unroll = unroll  # an int: the count LLVM unrolls the run-time loop by (None: LLVM decides)

    def __iter__(self):
        current_builder().error(
            "a range with a run-time bound (or unroll=False) can only drive a for statement, not a comprehension, "
            "list(), zip() or a for loop whose target is not a name",
            hint="write it as a for loop over names, or give the range compile-time bounds")

    def values(self):
        given = (("start", self.start), ("stop", self.stop), ("step", self.step))
        for name, x in given:
            if isinstance(x, RuntimeValue) and (not isinstance(x.type, ScalarType) or not x.type.is_int
                                                or x.type.is_bool):
                current_builder().error(f"range {name} expects an integer, but got a {x.type} value",
                                        hint="convert it with ty.cast(..., ty.i32)")
        like = next((x.type for _, x in given if isinstance(x, RuntimeValue)), i32)
        vals = tuple(as_value(x, like) for _, x in given)
        if len({v.type for v in vals}) != 1:
            current_builder().error(f"range expects bounds of one integer type, but got "
                                    f"{', '.join(str(v.type) for v in vals)}",
                                    hint="convert them with ty.cast")
        return vals


def range(*args, unroll=None):  # noqa: A001 - mirrors Python's range inside kernels
    """Python's ``range`` when every bound is a compile-time int, a run-time loop otherwise.

    ``unroll=False`` makes a loop with compile-time bounds a run-time loop too; ``unroll=True``
    insists on unrolling (compile-time bounds only). Without a hint, compile-time loops unroll
    at trace time (up to ``MAX_UNROLL`` iterations) and LLVM's unroller decides for run-time
    ones. ``unroll=N`` (an int, 1..``MAX_UNROLL_COUNT``) makes a run-time loop whose body the
    compiler repeats N times per trip, with a remainder loop for the last trip count mod N
    (LLVM's ``llvm.loop.unroll.count``); ``unroll=1`` keeps it rolled. A step may be negative or
    a run-time value (its sign decides the comparison); a compile-time zero step is an error.
    """
    bld = current_builder()
    if not 1 <= builtins.len(args) <= 3:
        bld.error(f"range expects 1 to 3 arguments, but got {builtins.len(args)}")
    for a in args:
        if not isinstance(a, RuntimeValue) and (not isinstance(a, int) or isinstance(a, bool)):
            bld.error(f"range expects integer bounds, but got {type(a).__name__} {a!r}",
                      hint="convert with int(...) at compile time, or ty.cast(..., ty.i32) for a run-time value")
    if builtins.len(args) == 3 and not isinstance(args[2], RuntimeValue) and args[2] == 0:
        bld.error("range step expects a non-zero value, but got 0")
    runtime = any(isinstance(a, RuntimeValue) for a in args)
    if unroll is not None and not isinstance(unroll, bool):
        if isinstance(unroll, RuntimeValue) or not hasattr(type(unroll), "__index__") \
                or not 1 <= int(unroll) <= MAX_UNROLL_COUNT:
            bld.error(f"range unroll expects True, False or a compile-time int count in 1..{MAX_UNROLL_COUNT}, "
                      f"but got {unroll!r}", hint="unroll=4 repeats the body four times per trip of the run-time loop")
        return DynamicRange(*args, unroll=int(unroll))
    if runtime and unroll is True:
        bld.error("range(..., unroll=True) expects compile-time bounds, but got a run-time value")
    if runtime or unroll is False:
        return DynamicRange(*args)
    return builtins.range(*args)  # (for_ checks the trip count before unrolling it)


def _extreme(which: str, args, kwargs):
    """Python's ``min``/``max`` unless a run-time value is among two or more arguments (or among the
    items of one list or tuple): then ``ty.minimum``/``ty.maximum`` folded left to right (for
    floats, a NaN operand gives the other one, as fminf/fmaxf)."""
    items = tuple(args[0]) if builtins.len(args) == 1 and isinstance(args[0], (list, tuple)) else args
    if kwargs or builtins.len(items) < 2 or not any(isinstance(a, RuntimeValue) for a in items):
        return getattr(builtins, which)(*args, **kwargs)
    fold = minimum if which == "min" else maximum
    acc = items[0]
    for a in items[1:]:
        acc = fold(acc, a)
    return acc


def min(*args, **kwargs):  # noqa: A001 - mirrors Python's min inside kernels
    return _extreme("min", args, kwargs)


def max(*args, **kwargs):  # noqa: A001 - mirrors Python's max inside kernels
    return _extreme("max", args, kwargs)


def _check_unroll(n: int):
    if n > MAX_UNROLL:
        current_builder().error(
            f"this loop unrolls {n} iterations at trace time (limit {MAX_UNROLL})",
            hint="make it a run-time loop: ty.range(..., unroll=False), or give it a run-time bound")


def static_range(*args):
    """A loop that always unrolls at trace time; its bounds must be compile-time ints."""
    if any(isinstance(a, RuntimeValue) for a in args):
        current_builder().error("static_range expects compile-time bounds, but got a run-time value",
                                hint="use range(...) for a run-time loop")
    return range(*args, unroll=True)


# -- for ----------------------------------------------------------------------------------------

def _carried(names, values, mutated) -> list[int]:
    skip = _passthrough(names, values, mutated)
    return [i for i, (n, v) in enumerate(zip(names, values)) if is_defined(v) and n not in skip]


def _stops(vals, stop_idx):
    return not_any(*(vals[i] for i in stop_idx))


def for_(iterable, body, names, values, mutated=(), stop=()):
    stop_idx = tuple(names.index(s) for s in stop)
    if not isinstance(iterable, DynamicRange):
        if isinstance(iterable, RuntimeValue):
            current_builder().error("cannot iterate over a run-time value", hint="use range(n) with a run-time n")
        if isinstance(iterable, builtins.range):
            _check_unroll(builtins.len(iterable))
        return _unrolled(iterable, body, names, values, mutated, stop_idx)
    lo, hi, step = iterable.values()
    carried_idx = _carried(names, values, mutated)
    if not stop_idx:
        return _traced_loop(
            values, names, carried_idx,
            lambda init, fn, rebuild: _for_op(lo, hi, step, init, [names[i] for i in carried_idx],
                                              lambda iv, args: fn(body, rebuild(args), iv), iterable.unroll))
    # A loop that can stop early: while (index in range and no stop flag) { body; index += step }.

    def cond(iv, *vals):
        going = _in_range(iv, hi, step)
        s = _stops(vals, stop_idx)
        return going if s is True else (as_value(False, i1) if s is False else going & s)

    def step_body(iv, *vals):
        return (iv + step, *body(iv, *vals))

    out = _runtime_while(cond, step_body, ("the loop index", *names), (lo, *values),
                         [0] + [i + 1 for i in carried_idx], iterable.unroll)
    return out[1:]


def _in_range(iv, hi, step):
    if not isinstance(step, RuntimeValue) or _constant(step) is not None:
        s = _constant(step) if isinstance(step, RuntimeValue) else step
        return iv < hi if s > 0 else iv > hi
    return ((step > 0) & (iv < hi)) | ((step < 0) & (iv > hi))


def _constant(v):
    """The value of a RuntimeValue made by a const op in this trace, else None."""
    return current_builder().constant_value(handle(v))


def _unrolled(iterable, body, names, values, mutated, stop_idx):
    """A compile-time loop: the body runs once per element, as Python would run it."""
    bld = current_builder()
    vals = tuple(values)
    n = builtins.len(iterable) if isinstance(iterable, (builtins.range, list, tuple)) else 1
    total = n
    for _, outer in bld.unrolling:
        total *= outer
    loc = user_location()
    if total > MAX_UNROLL_TOTAL:
        outer_loc = bld.unrolling[0][0] if bld.unrolling else loc
        raise KernelSourceError(
            f"nested compile-time loops would unroll {total} iterations at trace time (limit {MAX_UNROLL_TOTAL}): "
            f"this loop's {n} times the {total // n} of the loops around it, starting at {outer_loc}", loc,
            hint="make the outer loop a run-time loop: ty.range(..., unroll=False)")
    bld.unrolling.append((loc, n))
    try:
        for count, x in enumerate(iterable):
            if count >= MAX_UNROLL:
                _check_unroll(count + 1)
            g = _stops(vals, stop_idx) if stop_idx else True
            if g is False:
                break
            if g is True:
                vals = tuple(body(x, *vals))
            else:  # a run-time break or return happened in an earlier iteration
                vals = if_(g, lambda *v, x=x: body(x, *v), lambda *v: v, names, vals, mutated)
    finally:
        bld.unrolling.pop()
    return vals


def _loop_attrs(unroll) -> dict:
    return {} if unroll is None else {"unroll": int(unroll)}


def _for_op(lo, hi, step, init, names, body, unroll=None):
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
                       result_types=tuple(types), **_loop_attrs(unroll))
    return tuple(RuntimeValue(r) for r in results)


def _check_types(what: str, expected, got, names):
    bld = current_builder()
    for name, t, v in zip(names, expected, got):
        if v.type != t:
            raise KernelSourceError(
                f"{what}: {display(name)} is {t} before and {v.type} after; a loop-carried value keeps its type",
                bld.definition_loc(handle(v)) or user_location(), hint="convert it with ty.cast so both sides agree")


# -- while ----------------------------------------------------------------------------------------

def _while_op(init, names, cond_fn, body_fn, unroll=None):
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
                       result_types=tuple(types), **_loop_attrs(unroll))
    return tuple(RuntimeValue(r) for r in results)


def _as_i1(c):
    if not isinstance(c, RuntimeValue):
        return as_value(bool(c), i1)
    return c if c.type == i1 else (c != 0)


def _runtime_while(cond_fn, body, names, values, carried_idx, unroll=None):
    def build(init, run_body, rebuild):
        return _while_op(init, [names[i] for i in carried_idx], lambda args: _as_i1(cond_fn(*rebuild(args))),
                         lambda args: run_body(body, rebuild(args)), unroll)
    return _traced_loop(values, names, carried_idx, build)


def while_(cond_fn, body, names, values, mutated=(), stop=()):
    bld = current_builder()
    stop_idx = tuple(names.index(s) for s in stop)
    vals = tuple(values)
    loc = user_location()
    for count in itertools.count():
        g = _stops(vals, stop_idx) if stop_idx else True
        if g is False:
            return vals
        if g is True:
            bld.push_block(())  # probe: is the condition a run-time value? (its ops are thrown away)
            try:
                c = cond_fn(*vals)
            finally:
                bld.discard_block()
            if not isinstance(c, RuntimeValue):
                if not c:
                    return vals
                if count >= MAX_UNROLL:
                    bld.error(f"this while loop ran {count} iterations at trace time (limit {MAX_UNROLL}); its "
                              "condition never became false", hint="make the condition a run-time value "
                                                                   "(e.g. compare against a kernel argument)")
                bld.unrolling.append((loc, 1))
                try:
                    vals = tuple(body(*vals))
                finally:
                    bld.unrolling.pop()
                continue
        # From here the loop runs at run time (the remaining iterations, if some were unrolled).
        return _runtime_while(_guarded_condition(cond_fn, stop_idx), body, names, vals,
                              _carried(names, vals, mutated))


def _guarded_condition(cond_fn, stop_idx):
    """The loop condition, evaluated only while no stop flag is set (it may read memory)."""
    if not stop_idx:
        return cond_fn

    def cond(*vals):
        s = _stops(vals, stop_idx)
        if s is False:
            return False
        if s is True:
            return cond_fn(*vals)
        return if_else(s, lambda: _as_i1(cond_fn(*vals)), lambda: as_value(False, i1))
    return cond


# -- loop-carried values --------------------------------------------------------------------------

class _Retrace(Exception):
    def __init__(self, index, value):
        self.index, self.value = index, value


def _promote_for_carry(x, result, name, boundary):
    """A Python value carried into a run-time loop becomes a value of the type the body gives it."""
    if x is NORET and result is not NORET:
        return result if result is None else zero_like(result, name, boundary)
    if isinstance(x, (bool, int, float)) and isinstance(result, RuntimeValue) and \
            isinstance(result.type, ScalarType) and not number_fits(x, result.type):
        current_builder().error(
            f"a loop-carried name ({display(name)}) holds the Python {type(x).__name__} {x!r} before the loop "
            f"and a {result.type} value inside it", hint=f"start it as ty.cast({x!r}, ty.{result.type})")
    if isinstance(x, (bool, int, float)) and isinstance(result, (bool, int, float)):
        return as_value(x)  # a number the loop changes must live in a register
    return promote(x, result, name)


def _traced_loop(values, names, carried_idx, build):
    """Build a run-time loop over the carried values; retrace once if Python numbers must become values.

    ``build(init, run_body, rebuild)`` builds the loop op: ``rebuild(block_args)`` gives the full
    list of names' values inside a region, ``run_body(body, vals, *extra)`` calls the user's body
    and returns the flat values to yield.
    """
    values = list(values)
    carried_idx = list(carried_idx)
    offered = set(carried_idx)
    for attempt in itertools.count():
        boundary = current_builder().next_id  # values numbered from here on are made inside the loop
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
                if len(l) != len(flat[k][0]) or not same_static(aux, flat[k][1]):
                    raise _Retrace(i, outs[i])
                leaves += l
            return leaves

        try:
            results = build(init, run_body, rebuild)
        except _Retrace as r:
            promoted = _promote_for_carry(values[r.index], r.value, names[r.index], boundary)
            if promoted is values[r.index]:
                # Not a number we can put in a register: the name is local to the loop body
                # (like ``upd = softmax_update(...)``); after the loop it has no value.
                carried_idx = [i for i in carried_idx if i != r.index]
            elif attempt >= 8:
                current_builder().error(
                    f"{display(names[r.index])} changes its structure inside a run-time loop "
                    f"(it enters as {values[r.index]!r} and leaves as {r.value!r})")
            else:
                values[r.index] = promoted
            continue
        out = rebuild(results)
        # Names never carried keep their value (undefined ones, pointers only stored through);
        # names dropped because their structure changed inside the loop have none after it.
        return tuple(out[i] if i in carried_idx or i not in offered else Undefined(names[i])
                     for i in builtins.range(len(values)))
