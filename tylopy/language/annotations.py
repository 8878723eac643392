"""Kernel parameter annotations: evaluated where the kernel was defined, checked to be a tylopy type."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from ..errors import KernelSourceError
from ..ir.types import PointerType, ScalarType, TensorMapType
from .diagnostics import param_loc
from .lang import NoAliasPointer, _Constexpr
from .tensor import TensorSpec


def _evaluate_annotation(fn: Callable, name: str, text: str) -> Any:
    """A string annotation (``from __future__ import annotations``, or quoted) evaluated where the
    kernel was defined: its module's globals, the names it closes over and, since a name used only in
    an annotation is not closed over, the locals of the enclosing function while it is decorating
    (found on the stack as the frame whose code holds the kernel's code)."""
    scope = dict(fn.__globals__)
    frame = inspect.currentframe()
    while frame is not None:
        if fn.__code__ in frame.f_code.co_consts:
            scope.update(frame.f_locals)
            break
        frame = frame.f_back
    del frame
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            scope[var] = cell.cell_contents
        except ValueError:  # an empty cell: the name is not bound yet
            pass
    try:
        return eval(text, scope)  # noqa: S307 - the kernel author's own annotation text
    except Exception as e:  # noqa: BLE001 - reported at the parameter
        raise KernelSourceError(f"kernel parameter {name!r}: its annotation {text!r} could not be evaluated "
                                f"({type(e).__name__}: {e})", param_loc(fn, name)) from None


def param_kind(fn: Callable, name: str, ann) -> Any:
    if isinstance(ann, str):
        ann = _evaluate_annotation(fn, name, ann)
    if isinstance(ann, (_Constexpr, ScalarType, PointerType, TensorMapType, NoAliasPointer, TensorSpec)):
        return ann
    raise KernelSourceError(
        f"kernel parameter {name!r} expects an annotation such as ty.ptr(ty.f32), ty.tensor(ty.f32, 2), ty.i32, "
        f"ty.f32, ty.tensormap or ty.constexpr, but got {ann!r}", param_loc(fn, name))
