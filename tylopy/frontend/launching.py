"""``kernel[grid](*args)``: the launch object a kernel's subscript gives."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import TylopyError, user_facing

if TYPE_CHECKING:
    from .kernel import Kernel


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

    def _specialize(self, args, constexprs):
        """(the specialization these arguments launch, the grid, the runtime arguments)."""
        k = self.kernel
        if constexprs and not k._runtime_names.isdisjoint(constexprs):
            args, constexprs = k.bind_keywords(args, constexprs)
        ck = k._compile_for_arguments(args, constexprs) if k._open_tensors else k.compile(**constexprs)
        return ck, self.grid(constexprs) if callable(self.grid) else self.grid, args
