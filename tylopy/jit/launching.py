"""``kernel[grid](*args)``: the launch object a kernel's subscript gives."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..errors import TylopyError, user_facing
from ..runtime.kept import KeptArguments

if TYPE_CHECKING:
    from .kernel import Kernel


_KEPT_SITES = 64  # repeat()'s sites per kernel (grid, constexprs, device, thread); all forgotten past it


def _first_device(args):
    """The device index of the first tensor or tensor map among ``args`` (None: neither)."""
    for a in args:
        get = getattr(a, "get_device", None)
        if get is not None:
            return get()
        dev = getattr(a, "device", None)
        if type(dev) is int:
            return dev
    return None


class _BoundLaunch:
    __slots__ = ("kernel", "grid")

    def __init__(self, kernel: Kernel, grid):
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args, stream=None, **constexprs):
        try:
            ck, grid, args = self._specialize(args, constexprs)
            return ck.launcher().launch(grid, args, stream)
        except TylopyError as e:
            raise user_facing(e)  # tylopy's own frames hidden (TYLOPY_TRACEBACK=1 shows them)

    def prepare(self, *args, **constexprs):
        """The launch ``kernel[grid](*args, **constexprs)`` would make, with its arguments checked and
        packed once: ``.set(name, value)`` changes one, ``.launch()`` sends it (``PreparedLaunch``).
        It keeps the specialization compiled now, whatever globals change later."""
        try:
            ck, grid, args = self._specialize(args, constexprs)
            return ck.launcher().prepare(grid, args)
        except TylopyError as e:
            raise user_facing(e)  # tylopy's own frames hidden (TYLOPY_TRACEBACK=1 shows them)

    def repeat(self, *args, stream=None, **constexprs):
        """Launch as ``kernel[grid](*args, **constexprs)`` does, for a site that launches again and
        again: the arguments whose packed value is the same as at this thread's last ``repeat``
        with the same grid, constexprs and device are not checked and packed again (a tensor with
        the same address, shape, strides and dtype; an equal number; the same tensor map). The
        specialization is looked up again when a global it read changes, as in a plain launch.
        Keyword arguments of the kernel's runtime parameters take the plain launch."""
        k = self.kernel
        if constexprs and not k._runtime_names.isdisjoint(constexprs):
            return self(*args, stream=stream, **constexprs)
        try:
            key = (self.grid, tuple(constexprs.items()), _first_device(args), threading.get_ident(),
                   *[args[i].dtype for i, _ in k._open_tensors])
            kept = k._kept.get(key)
        except (TypeError, IndexError, AttributeError):  # an unhashable constexpr, a missing argument
            return self(*args, stream=stream, **constexprs)
        try:
            if kept is None or not kept.launcher.ck.is_current():
                ck, grid, args = self._specialize(args, dict(constexprs))
                if len(k._kept) >= _KEPT_SITES:
                    k._kept.clear()
                kept = k._kept[key] = KeptArguments(ck.launcher(), grid)
            kept.launch(args, stream)
        except TylopyError as e:
            raise user_facing(e)

    def _specialize(self, args, constexprs):
        """(the specialization these arguments launch, the grid, the runtime arguments)."""
        k = self.kernel
        if constexprs and not k._runtime_names.isdisjoint(constexprs):
            args, constexprs = k.bind_keywords(args, constexprs)
        ck = k._compile_for_arguments(args, constexprs) if k._open_tensors else k.compile(**constexprs)
        return ck, self.grid(constexprs) if callable(self.grid) else self.grid, args
