"""Run the LLVM IR that code generation makes for a scalar kernel on the host CPU (llvmlite MCJIT).

The emulator executes the IR's meaning as ``tylopy/emulate`` defines it; this module executes what
``llvm.lower_kernel`` turned that IR into, the very text the NVPTX backend compiles to PTX. Comparing
the two on random inputs checks the lowerings on the CPU: a comparison lowered with the wrong
predicate, a select with its operands swapped or a loop bound off by one gives different numbers
(``tests/test_host_llvm.py``, ``tests/test_mutations.py``).

Only scalar kernels run here: threads that share nothing, so each thread can run alone, one after
another. Their IR may read the special registers ``tid``, ``ctaid``, ``ntid``, ``nctaid``, ``laneid``
and ``warpid`` and use global pointers, integer and float arithmetic, comparisons, selects,
conversions and structured control flow. The module is retargeted to the host: the NVPTX triple and
data layout are replaced, address spaces dropped (global memory is the host's), the special
registers become reads of globals the runner sets per thread. Anything else (shared memory, inline
PTX, barriers, shuffles, other ``llvm.nvvm`` intrinsics) is refused with ``HostLoweringError``.

    host = HostKernel(kernel.trace(**constexprs))
    host.run([x, out, n], grid=(4,))    # numpy arrays for pointers, Python numbers for scalars

Differences from the GPU that the comparison must avoid: LLVM leaves ``fptosi`` of NaN or an
out-of-range value undefined (PTX saturates), so compare conversions on in-range inputs.
"""
from __future__ import annotations

import ctypes
import functools
import re
import threading

import llvmlite.binding as llvm
import numpy as np

from ..errors import TylopyError
from ..ir.types import PointerType, ScalarType
from ..ir.values import KernelIR

SREGS = ("tid.x", "tid.y", "tid.z", "ctaid.x", "ctaid.y", "ctaid.z", "ntid.x", "ntid.y", "ntid.z",
         "nctaid.x", "nctaid.y", "nctaid.z", "laneid", "warpid")
_CTYPES = {"i1": ctypes.c_bool, "i8": ctypes.c_int8, "u8": ctypes.c_uint8, "i16": ctypes.c_int16,
           "u16": ctypes.c_uint16, "i32": ctypes.c_int32, "u32": ctypes.c_uint32, "b32": ctypes.c_uint32,
           "i64": ctypes.c_int64, "u64": ctypes.c_uint64, "f32": ctypes.c_float, "f64": ctypes.c_double}
_NP = {"i8": np.int8, "u8": np.uint8, "i16": np.int16, "u16": np.uint16, "i32": np.int32, "u32": np.uint32,
       "b32": np.uint32, "i64": np.int64, "u64": np.uint64, "f32": np.float32, "f64": np.float64,
       "f16": np.float16, "i1": np.bool_}
_lock = threading.Lock()
_SREG_CALL = re.compile(r'@"?llvm\.nvvm\.read\.ptx\.sreg\.([a-z.]+)"?')
_REFUSED = [(re.compile(r"addrspace\(3\)"), "shared memory"), (re.compile(r"\basm\b"), "inline PTX"),
            (re.compile(r"addrspacecast"), "an address-space cast"),
            (re.compile(r'@"?llvm\.nvvm\.(?!read\.ptx\.sreg\.)[\w.]+'), "an NVVM intrinsic")]


class HostLoweringError(TylopyError):
    """The kernel's generated IR uses something the host run cannot execute."""


@functools.lru_cache(maxsize=None)
def _native_target():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_default_triple()


def _host_target():
    """The host target and a new target machine: an MCJIT engine takes ownership of the machine it
    is given and frees it with itself, so one machine shared by two engines would be used after
    the first engine is collected (a crash in the next compile)."""
    target = _native_target()
    return target, target.create_target_machine(opt=0)


def host_ir(llvm_text: str, kernel_name: str) -> str:
    """The generated IR retargeted to the host (see the module docstring); ``HostLoweringError``
    names what a scalar host run cannot execute."""
    for pattern, what in _REFUSED:
        m = pattern.search(llvm_text)
        if m:
            raise HostLoweringError(f"{kernel_name}: the host run executes scalar kernels only, but the generated "
                                    f"IR uses {what} ({m.group(0)!r})")
    target, tm = _host_target()
    lines = []
    for line in llvm_text.splitlines():
        if line.startswith("target triple"):
            line = f'target triple = "{llvm.get_process_triple()}"'
        elif line.startswith("target datalayout"):
            line = f'target datalayout = "{tm.target_data}"'
        elif line.startswith("!nvvm.annotations") or re.match(r'declare .*@"?llvm\.nvvm\.read\.ptx\.sreg\.', line):
            continue
        lines.append(line)
    text = "\n".join(lines)
    text = text.replace("define ptx_kernel ", "define ")
    text = re.sub(r"\s*addrspace\(\d+\)", "", text)
    used = sorted(set(_SREG_CALL.findall(text)))
    unknown = [r for r in used if r not in SREGS]
    if unknown:
        raise HostLoweringError(f"{kernel_name}: the host run knows the special registers {', '.join(SREGS)}, but "
                                f"the generated IR reads {', '.join(unknown)}")
    text = _SREG_CALL.sub(lambda m: f'@"host.sreg.{m.group(1)}"', text)
    defs = [f'@"host.value.{r}" = global i32 0\n'
            f'define i32 @"host.sreg.{r}"() {{\n  %v = load i32, ptr @"host.value.{r}"\n  ret i32 %v\n}}'
            for r in SREGS]
    return text + "\n" + "\n".join(defs) + "\n"


class HostKernel:
    """One kernel specialization's generated IR, compiled for the host and callable per thread."""

    def __init__(self, kir: KernelIR, llvm_text: str | None = None):
        from .llvm import lower_kernel
        self.kir = kir
        self.llvm_text = llvm_text if llvm_text is not None else str(lower_kernel(kir))
        self.text = host_ir(self.llvm_text, kir.name)
        for p in kir.params:
            if not isinstance(p.type, (PointerType, ScalarType)) or (
                    isinstance(p.type, ScalarType) and p.type.name not in _CTYPES):
                raise HostLoweringError(f"{kir.name}: the host run takes pointer and scalar parameters, but "
                                        f"parameter {p.name!r} is {p.type}")
        with _lock:
            _, tm = _host_target()
            try:
                mod = llvm.parse_assembly(self.text)
                mod.verify()
            except RuntimeError as e:
                raise HostLoweringError(f"{kir.name}: LLVM rejected the retargeted IR: {e}") from None
            self.engine = llvm.create_mcjit_compiler(mod, tm)
            self.engine.finalize_object()
            self.module = mod
        types = [ctypes.c_void_p if isinstance(p.type, PointerType) else _CTYPES[p.type.name] for p in kir.params]
        self.fn = ctypes.CFUNCTYPE(None, *types)(self.engine.get_function_address(kir.name))
        self.regs = {r: ctypes.c_int32.from_address(self.engine.get_global_value_address(f"host.value.{r}"))
                     for r in SREGS}
        self.threads = kir.launch.max_threads

    def _arg(self, p, x):
        if isinstance(p.type, PointerType):
            want = _NP.get(p.type.pointee.name)
            if not isinstance(x, np.ndarray) or not x.flags.c_contiguous or (want is not None and x.dtype != want):
                raise HostLoweringError(f"{self.kir.name}: argument {p.name!r} expects a C-contiguous numpy array "
                                        f"of {np.dtype(want) if want else p.type.pointee}, but got "
                                        f"{getattr(x, 'dtype', type(x).__name__)}")
            return x.ctypes.data
        return x

    def run(self, args, grid, threads: int | None = None) -> None:
        """Every thread of every block of ``grid`` (an int or 1 to 3 ints), one after another."""
        if len(args) != len(self.kir.params):
            raise HostLoweringError(f"{self.kir.name}: expects {len(self.kir.params)} arguments, got {len(args)}")
        values = [self._arg(p, x) for p, x in zip(self.kir.params, args)]
        g = (grid,) if isinstance(grid, int) else tuple(grid)
        g = g + (1,) * (3 - len(g))
        nthreads = threads or self.threads
        regs = self.regs
        for name, v in (("ntid.x", nthreads), ("ntid.y", 1), ("ntid.z", 1), ("nctaid.x", g[0]), ("nctaid.y", g[1]),
                        ("nctaid.z", g[2]), ("tid.y", 0), ("tid.z", 0)):
            regs[name].value = v
        for z in range(g[2]):
            for y in range(g[1]):
                for x in range(g[0]):
                    regs["ctaid.x"].value, regs["ctaid.y"].value, regs["ctaid.z"].value = x, y, z
                    for t in range(nthreads):
                        regs["tid.x"].value, regs["laneid"].value, regs["warpid"].value = t, t % 32, t // 32
                        self.fn(*values)
