"""What rewritten kernel code calls at trace time: ``if_``, ``for_``, ``while_``, ``range``.

Compile-time conditions and bounds run as plain Python (the untaken branch is never traced,
loops unroll). Run-time ones build IR regions; the values they carry may be scalars, tuples
and lists of them, or any object with ``__tylopy_flatten__`` (fragments, softmax states).
"""
from __future__ import annotations

from typing import Any

from .errors import KernelSourceError
from .ir import builder as _b
from .ir.core import Value
from .ir.types import ScalarType, i32


class _Undefined:
    """A name that has no value on this path (assigned in one branch only, or not yet)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def _fail(self, *args, **kwargs):
        raise KernelSourceError(
            f"{self.name!r} has no value here: it is assigned on only one path of a run-time "
            "if, or only inside a run-time loop", _b.user_location(),
            hint="assign it before the if/loop so every path defines it")

    __getattr__ = _fail
    undefined_error = _fail  # found on the class by builder.as_value, which cannot import this module
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _fail
    __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __index__ = __call__ = __getitem__ = _fail
    __iter__ = _fail


def lookup(scope: dict, name: str) -> Any:
    return scope.get(name, _Undefined(name))


def is_defined(x) -> bool:
    return not isinstance(x, _Undefined)


# -- pytrees of values ----------------------------------------------------------------------

def flatten(x) -> tuple[list[Value], Any]:
    """Split ``x`` into its IR values and a static description to rebuild it."""
    if isinstance(x, _Undefined):
        return [], ("static", x)
    if isinstance(x, Value):
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


def unflatten(aux, leaves: list[Value]):
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
    if isinstance(a, Value) or isinstance(b, Value):  # comparing would build an op
        return a is b
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _same_static(a, b) -> bool:
    """Do two flatten() descriptions agree on everything that is not an IR value?"""
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


def _promote_for_carry(x, result):
    """A Python number carried into a run-time loop becomes a value of the type the body gives it."""
    if isinstance(x, (bool, int, float)) and isinstance(result, Value) and isinstance(result.type, ScalarType):
        return _b.as_value(x, result.type)
    if isinstance(x, (bool, int, float)) and isinstance(result, (bool, int, float)):
        return _b.as_value(x)  # a number the loop changes must live in a register
    if isinstance(x, (tuple, list)) and isinstance(result, (tuple, list)) and len(x) == len(result):
        return type(x)(_promote_for_carry(a, r) for a, r in zip(x, result))
    return x


# -- if ---------------------------------------------------------------------------------------

def if_(cond, then_fn, else_fn, names, values):
    if not isinstance(cond, Value):
        return (then_fn if cond else else_fn)(*values)
    if cond.type != _b.i1:
        cond = cond != 0
    bld = _b.current_builder()
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
            if isinstance(outs[k], (bool, int, float)) and isinstance(other, Value) and \
                    isinstance(other.type, ScalarType):
                bld.resume_block(branches[k][0])
                outs[k] = _b.as_value(outs[k], other.type)
                branches[k] = (bld.suspend_block(), branches[k][1])
        flat = [flatten(o) for o in outs]
        (l0, a0), (l1, a1) = flat
        if len(l0) != len(l1) or [v.type for v in l0] != [v.type for v in l1]:
            continue
        if not _same_static(a0, a1):
            bld.error(f"{name!r} holds different compile-time values on the two paths of a run-time if",
                      hint="compute it with run-time values (e.g. ty.select) or decide it at compile time")
        merged.append((name, a0, (l0, l1)))
    blocks = []
    for k, (blk, _) in enumerate(branches):
        bld.resume_block(blk)
        bld.emit("yield", [v for _, _, leaves in merged for v in leaves[k]])
        blocks.append(bld.pop_block())
    result_types = tuple(v.type for _, _, leaves in merged for v in leaves[0])
    results = list(bld.emit("if", (cond,), regions=tuple(blocks), result_types=result_types))
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


# -- for ----------------------------------------------------------------------------------------

class DynamicRange:
    """``range`` over run-time bounds: becomes an IR ``for`` loop."""

    def __init__(self, start, stop=None, step=1):
        if stop is None:
            start, stop = 0, start
        self.start, self.stop, self.step = start, stop, step

    def values(self):
        like = next((x.type for x in (self.start, self.stop, self.step) if isinstance(x, Value)), i32)
        return tuple(_b.as_value(x, like) for x in (self.start, self.stop, self.step))


def range(*args):  # noqa: A001 - mirrors Python's range inside kernels
    """Python's ``range`` when every bound is a compile-time int, a run-time loop otherwise.

    There is no unroll hint (llvmlite cannot attach LLVM's self-referencing loop metadata): LLVM's
    unroller decides; unroll by hand with an inner ``static_range`` where it matters.
    """
    if all(not isinstance(a, Value) for a in args):
        import builtins
        return builtins.range(*args)
    return DynamicRange(*args)


def static_range(*args):
    """A loop that always unrolls at trace time; its bounds must be compile-time ints."""
    for a in args:
        if isinstance(a, Value):
            _b.current_builder().error("static_range expects compile-time bounds, but got a run-time value")
    import builtins
    return builtins.range(*args)


def _run_python_loop(iterable, body, values):
    for x in iterable:
        values = body(x, *values)
    return tuple(values)


def for_(iterable, body, names, values):
    if not isinstance(iterable, DynamicRange):
        if isinstance(iterable, Value):
            _b.current_builder().error("cannot iterate over a run-time value", hint="use range(n) with a run-time n")
        return _run_python_loop(iterable, body, values)
    lo, hi, step = iterable.values()
    carried_idx = [i for i, v in enumerate(values) if is_defined(v)]
    return _traced_loop(
        values, names, carried_idx,
        lambda init, fn, rebuild: _b.for_loop(lo, hi, step, init, [names[i] for i in carried_idx],
                                              lambda iv, args: fn(body, rebuild(args), iv)))


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
    for attempt in __import__("itertools").count():
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
                _b.current_builder().error(
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
    bld = _b.current_builder()
    bld.push_block(())  # probe: is the condition a run-time value? (its ops are thrown away)
    try:
        first = cond_fn(*values)
    finally:
        bld.discard_block()
    if not isinstance(first, Value):
        vals = tuple(values)
        c = first
        while c:
            vals = tuple(body(*vals))
            c = cond_fn(*vals)
        return vals
    carried_idx = [i for i, v in enumerate(values) if is_defined(v)]

    def build(init, run_body, rebuild):
        def cond(args):
            c = cond_fn(*rebuild(args))
            if not isinstance(c, Value):
                c = _b.as_value(bool(c), _b.i1)
            return c if c.type == _b.i1 else (c != 0)

        return _b.while_loop(init, [names[i] for i in carried_idx], cond,
                             lambda args: run_body(body, rebuild(args)))

    return _traced_loop(values, names, carried_idx, build)
