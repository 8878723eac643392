"""User score_mod / mask_mod functions traced into the variant kernel.

A mod is written against torch (it runs on index tensors in the reference and in
``create_block_mask``); in the kernel the same code runs on the DSL's run-time values. To make
that work without rewriting it, the kernel calls a *copy* of the function whose

* captured tensors (closure cells, module globals its code names, and the ``aux`` tuple) are
  ``AuxTensor`` views of kernel tensor parameters (``aux0..aux3``): ``t[i]``/``t[i, j]`` load
  through their strides, an index outside the tensor reads 0 (the reference path raises there);
* global ``torch`` is ``TORCH``, which maps ``torch.where/tanh/exp/exp2/log/sigmoid/abs/minimum/
  maximum/clamp`` to the DSL's element functions (anything else is an error naming it).

Mods cannot branch on run-time values with Python ``if`` (as FlexAttention's: use
``torch.where``). Every failure while tracing a mod is a ``ModError`` naming the keyword and the
line of the user's function.
"""
from __future__ import annotations

import traceback
import types

import tylopy as ty

from tylopy_kernels.attention.mod_registry import captured_slots
from tylopy_kernels.attention.variants import ModError

AUX_SLOTS = 4   # tensors the mods of one call may read (aux tuple and captured ones together)
AUX_NDIM = 4    # every aux tensor travels as 4-D (leading dimensions of 1)


class AuxTensor:
    """A captured tensor inside the kernel: indexing loads (0 outside its shape)."""

    def __init__(self, arg, ndim, is_bool, name):
        self.arg, self.ndim, self.is_bool, self.name = arg, ndim, is_bool, name
        self.memo = {}

    def forget(self):
        """Start a new scope: loads traced before may lie in blocks that do not dominate what follows."""
        self.memo = {}

    def __getitem__(self, index):
        idx = tuple(raw(i) for i in (index if isinstance(index, tuple) else (index,)))
        # The same index values (doc[q_idx] for every key of a row) load once per scope: the
        # predicated loads are not merged by the compiler, and 64 of them a tile cost registers.
        key = tuple(("v", id(i)) if not isinstance(i, int) else ("c", i) for i in idx)
        hit = self.memo.get(key)
        if hit is not None:
            return Val(hit[1])
        val = self._load(idx)
        self.memo[key] = (idx, val)  # (the index objects are kept alive: their ids stay theirs)
        return Val(val)

    def _load(self, idx):
        if len(idx) != self.ndim:
            raise IndexError(f"tensor {self.name} has {self.ndim} dimension(s), but is indexed with {len(idx)}")
        full = (0,) * (AUX_NDIM - self.ndim) + tuple(idx)
        inside = None
        for d in range(AUX_NDIM - self.ndim, AUX_NDIM):
            i = full[d]
            ok = (i >= 0) & (i < self.arg.shape[d])
            inside = ok if inside is None else inside & ok
        # an index outside the tensor reads 0: the load is predicated off (its address is never used)
        val = ty.load(self.arg.address(full), mask=inside)
        if self.is_bool:
            return val != 0
        return val

    def __setitem__(self, index, value):
        raise TypeError(f"a mod may read the tensor {self.name}, not write it")


def _is_float(x) -> bool:
    if isinstance(x, float):
        return True
    t = getattr(x, "type", None)
    return t is not None and str(t) in ("f32", "f16", "bf16", "f64")


def _is_int(x) -> bool:
    t = getattr(x, "type", None)
    return t is not None and str(t) in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")


def raw(x):
    """The DSL value of a ``Val`` (anything else as it is)."""
    return x.v if isinstance(x, Val) else x


def _f32(x):
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    return ty.cast(x, ty.f32) if _is_int(x) else x


def _promote(a, b):
    """torch's promotion for the cases mods meet: an integer with a float becomes f32."""
    a, b = raw(a), raw(b)
    if _is_float(a) or _is_float(b):
        return _f32(a), _f32(b)
    return a, b


def _binary(fn):
    def method(self, other):
        a, b = _promote(self, other)
        return Val(fn(a, b))

    def reflected(self, other):
        a, b = _promote(other, self)
        return Val(fn(a, b))
    return method, reflected


class Val:
    """A run-time value as a traced mod sees it: torch's arithmetic (an integer index with a float
    becomes a float, ``/`` divides as floats), ``.abs()``, and no Python truth value."""

    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v

    def __bool__(self):
        raise TypeError("a run-time value was used where Python needs a bool (an if, and/or/not, a chained "
                        "comparison): write torch.where(c, x, y), a & b, a | b, ~a")

    def __truediv__(self, other):
        return Val(_f32(raw(self)) / _f32(raw(other)))

    def __rtruediv__(self, other):
        return Val(_f32(raw(other)) / _f32(raw(self)))

    def __neg__(self):
        return Val(-self.v)

    def __invert__(self):
        return Val(~self.v)

    def __abs__(self):
        return Val(abs(self.v))

    def abs(self):
        return Val(abs(self.v))

    def float(self):
        return Val(_f32(self.v))

    __hash__ = object.__hash__


for _name, _fn in (("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
                   ("floordiv", lambda a, b: a // b), ("mod", lambda a, b: a % b), ("and", lambda a, b: a & b),
                   ("or", lambda a, b: a | b), ("xor", lambda a, b: a ^ b)):
    _m, _r = _binary(_fn)
    setattr(Val, f"__{_name}__", _m)
    setattr(Val, f"__r{_name}__", _r)
for _name, _fn in (("eq", lambda a, b: a == b), ("ne", lambda a, b: a != b), ("lt", lambda a, b: a < b),
                   ("le", lambda a, b: a <= b), ("gt", lambda a, b: a > b), ("ge", lambda a, b: a >= b)):
    setattr(Val, f"__{_name}__", _binary(_fn)[0])


def _lifted(fn, floats=False):
    """A DSL function taking and giving ``Val``s (its float arguments promoted when ``floats``)."""
    def call(*args, **kwargs):
        args = [raw(a) for a in args]
        if floats or any(_is_float(a) for a in args):
            args = [_f32(a) for a in args]
        return Val(fn(*args, **{k: raw(v) for k, v in kwargs.items()}))
    return call


def _select(cond, a, b):
    a, b = _promote(a, b)
    return ty.select(raw(cond), a, b)


class _Torch:
    """``torch`` as a traced mod sees it."""

    where = staticmethod(_lifted(_select))
    tanh = staticmethod(_lifted(ty.tanh, floats=True))
    exp = staticmethod(_lifted(ty.exp, floats=True))
    exp2 = staticmethod(_lifted(ty.exp2, floats=True))
    log = staticmethod(_lifted(ty.log, floats=True))
    sigmoid = staticmethod(_lifted(ty.sigmoid, floats=True))
    minimum = staticmethod(_lifted(ty.minimum))
    maximum = staticmethod(_lifted(ty.maximum))
    abs = staticmethod(_lifted(abs))

    @staticmethod
    def clamp(x, min=None, max=None):  # noqa: A002 - torch's keyword names
        if min is not None:
            x = _lifted(ty.maximum)(x, min)
        if max is not None:
            x = _lifted(ty.minimum)(x, max)
        return x

    def __getattr__(self, name):
        raise AttributeError(f"torch.{name} is not available inside a traced mod (use torch.where, tanh, exp, exp2, "
                             "log, sigmoid, abs, minimum, maximum, clamp, or tylopy's ty.* functions)")


TORCH = _Torch()


def _tensor_type():
    import torch
    return torch.Tensor


def substituted(fn, replace):
    """A copy of ``fn`` whose captured tensors are ``replace[(where, name)]`` and whose ``torch`` is TORCH."""
    inner = getattr(fn, "fn", fn)  # a @ty.func: its plain function
    T = _tensor_type()
    cells = []
    for name, cell in zip(inner.__code__.co_freevars, inner.__closure__ or ()):
        try:
            val = cell.cell_contents
        except ValueError:
            cells.append(cell)
            continue
        if isinstance(val, T):
            val = replace[("closure", name)]
        elif isinstance(val, types.ModuleType) and val.__name__ == "torch":
            val = TORCH
        cells.append(types.CellType(val))
    glob = dict(inner.__globals__)
    for name, val in list(glob.items()):
        if isinstance(val, T) and ("global", name) in replace:
            glob[name] = replace[("global", name)]
        elif isinstance(val, types.ModuleType) and val.__name__ == "torch":
            glob[name] = TORCH
    return types.FunctionType(inner.__code__, glob, inner.__name__, inner.__defaults__,
                              tuple(cells) if inner.__closure__ is not None else None)


def _user_line(fn, e) -> str:
    inner = getattr(fn, "fn", fn)
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.filename == inner.__code__.co_filename and frame.name == inner.__code__.co_name:
            return f"{frame.filename}:{frame.lineno}: {frame.line}"
    return f"{inner.__code__.co_filename}:{inner.__code__.co_firstlineno}"


def call_traced(arg, ref, variant, aux_args, args):
    """Trace one call of the user's function (``arg`` is "score_mod", "mask_mod" or "score_mod_bwd") on
    run-time values: its captured tensors are the views of their slots, ``aux`` the user's aux views."""
    fn = ref.function()
    names = variant.tensor_names
    views = {}
    for slot_name in names:
        if slot_name.startswith("aux"):
            k = int(slot_name[3:])
            views[slot_name] = aux_args[k]
    replace = {tuple(where.split(":", 1)): views[slot] for where, slot in ref.tensor_slots}
    copy = substituted(fn, replace)
    if ref.takes_aux:
        n_user = sum(1 for n in names if n.startswith("aux")) - len(captured_slots(variant))
        args = (*args, tuple(views[f"aux{k}"] for k in range(n_user)))
    args = tuple(a if isinstance(a, tuple) else Val(a) for a in args)
    try:
        got = raw(copy(*args))
    except ModError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised naming the keyword and the user's line
        raise ModError(f"attention: {arg} expects a function the kernel can trace (torch.where instead of a Python "
                       f"if on values; the torch functions listed in docs/attention-variants.md) ({_user_line(fn, e)}), but got "
                       f"{type(e).__name__}: {e}") from None
    return _checked_result(arg, fn, got)


def _checked_result(arg, fn, got):
    inner = getattr(fn, "fn", fn)
    where = f"{inner.__code__.co_filename}:{inner.__code__.co_firstlineno}"
    if arg == "mask_mod":
        if isinstance(got, bool):
            return ty.cast(int(got), ty.i1)
        t = getattr(got, "type", None)
        if t is None or str(t) != "i1":
            raise ModError(f"attention: mask_mod expects a function returning bool ({where}), but got "
                           f"{t if t is not None else type(got).__name__}")
        return got
    if isinstance(got, (int, float)) and not isinstance(got, bool):
        return ty.cast(float(got), ty.f32)
    t = getattr(got, "type", None)
    if t is None or not str(t).startswith(("f", "bf")):
        what = "gradient" if arg == "score_mod_bwd" else "score"
        raise ModError(f"attention: {arg} expects a function returning a float {what} ({where}), but got "
                       f"{t if t is not None else type(got).__name__}")
    return ty.cast(got, ty.f32) if str(t) != "f32" else got
