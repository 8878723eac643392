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

from tylopy_kernels.attention.variants import ModError

AUX_SLOTS = 4   # tensors the mods of one call may read (aux tuple and captured ones together)
AUX_NDIM = 4    # every aux tensor travels as 4-D (leading dimensions of 1)


class AuxTensor:
    """A captured tensor inside the kernel: indexing loads (0 outside its shape)."""

    def __init__(self, arg, ndim, is_bool, name):
        self.arg, self.ndim, self.is_bool, self.name = arg, ndim, is_bool, name

    def __getitem__(self, index):
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) != self.ndim:
            raise IndexError(f"tensor {self.name} has {self.ndim} dimension(s), but is indexed with {len(idx)}")
        full = (0,) * (AUX_NDIM - self.ndim) + tuple(idx)
        inside = None
        for d in range(AUX_NDIM - self.ndim, AUX_NDIM):
            i = full[d]
            ok = (i >= 0) & (i < self.arg.shape[d])
            inside = ok if inside is None else inside & ok
        # an index outside the tensor is clamped to element 0 and its value replaced by 0
        safe = tuple(ty.select(inside, i, 0) if not isinstance(i, int) else i for i in full)
        val = ty.load(self.arg.address(safe), mask=inside)
        if self.is_bool:
            return val != 0
        return val

    def __setitem__(self, index, value):
        raise TypeError(f"a mod may read the tensor {self.name}, not write it")


def _select(cond, a, b):
    return ty.select(cond, a, b)


class _Torch:
    """``torch`` as a traced mod sees it."""

    where = staticmethod(_select)
    tanh = staticmethod(ty.tanh)
    exp = staticmethod(ty.exp)
    exp2 = staticmethod(ty.exp2)
    log = staticmethod(ty.log)
    sigmoid = staticmethod(ty.sigmoid)
    minimum = staticmethod(ty.minimum)
    maximum = staticmethod(ty.maximum)

    @staticmethod
    def abs(x):
        return abs(x)

    @staticmethod
    def clamp(x, min=None, max=None):  # noqa: A002 - torch's keyword names
        if min is not None:
            x = ty.maximum(x, min)
        if max is not None:
            x = ty.minimum(x, max)
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
    """Trace one call of the user's mod (``arg`` is "score_mod" or "mask_mod") on run-time values."""
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
        n_user = sum(1 for n in names if n.startswith("aux")) - sum(
            len(m.tensor_slots) for m in (variant.score_mod, variant.mask_mod) if m is not None)
        args = (*args, tuple(views[f"aux{k}"] for k in range(n_user)))
    try:
        got = copy(*args)
    except ModError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised naming the keyword and the user's line
        raise ModError(f"attention: {arg} expects a function the kernel can trace (torch.where instead of a Python "
                       f"if on values; the torch functions TORCH lists) ({_user_line(fn, e)}), but got "
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
        raise ModError(f"attention: score_mod expects a function returning a float score ({where}), but got "
                       f"{t if t is not None else type(got).__name__}")
    return ty.cast(got, ty.f32) if str(t) != "f32" else got
