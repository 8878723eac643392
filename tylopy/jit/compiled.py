"""``CompiledKernel``: one specialization of a kernel, with what each compile stage made of it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import TylopyError, user_facing
from ..ir.printer import format_ir
from ..ir.types import Type
from ..ir.values import KernelIR
from .options import CompileOptions, environment_snapshot


@dataclass
class CompiledKernel:
    """One specialization: its IR, LLVM IR, PTX, ptxas report and (once launched) its CUfunction."""

    name: str
    arch: str
    threads: int
    params: tuple[tuple[str, Type], ...]
    constexprs: dict
    ptx: str
    cubin: bytes | None
    report: Any
    dynamic_shared_bytes: int
    cache_key: str = ""
    compile_seconds: float = 0.0
    from_cache: bool = False
    options: CompileOptions | None = None
    wait_sites: tuple = ()
    cluster: tuple | None = None  # (x, y, z) CTAs per cluster: launched with cuLaunchKernelEx
    _ir: KernelIR | None = None
    _llvm_ir: str | None = None
    _llvm_ir_optimized: str | None = None
    _retrace: Callable | None = field(default=None, repr=False)
    _launcher: Any = field(default=None, repr=False)
    _guards: Any = field(default=None, repr=False)  # capture.Guards: the reads this process must still see
    _env: tuple = field(default=(), repr=False)  # the environment options it was compiled under

    def is_current(self) -> bool:
        """Would ``compile()`` with the same constexprs still give this specialization? (The
        environment options are the same, and so is every value its trace read.)"""
        return self._env == environment_snapshot() and (self._guards is None or self._guards.valid())

    @property
    def ir(self) -> KernelIR:
        if self._ir is None and self._retrace is not None:
            self._ir = self._retrace()
        return self._ir

    @property
    def ir_text(self) -> str:
        return format_ir(self.ir)

    @property
    def llvm_ir(self) -> str:
        if self._llvm_ir is None:
            from ..codegen.llvm import lower_kernel
            self._llvm_ir = str(lower_kernel(self.ir, self.options))
        return self._llvm_ir

    def launcher(self):
        if self._launcher is None:
            from ..runtime.launch import Launcher
            self._launcher = Launcher(self)
        return self._launcher

    def __call__(self, grid, *args, stream=None):
        try:
            return self.launcher().launch(grid, args, stream)
        except TylopyError as e:
            raise user_facing(e)  # tylopy's own frames hidden (TYLOPY_TRACEBACK=1 shows them)

    def prepare(self, grid, *args):
        """This specialization's launch with ``args`` checked and packed once (``PreparedLaunch``)."""
        try:
            return self.launcher().prepare(grid, args)
        except TylopyError as e:
            raise user_facing(e)  # tylopy's own frames hidden (TYLOPY_TRACEBACK=1 shows them)
