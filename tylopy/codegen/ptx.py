"""LLVM IR text to PTX text with LLVM's NVPTX backend, and source-line comments in the PTX."""
from __future__ import annotations

import functools
import linecache
import os
import re
import threading

import llvmlite.binding as llvm

from ..errors import CompileError

from .targets import PTX_FEATURES, SUPPORTED_ARCHS  # noqa: F401  (re-exported)
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _init():
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm.Target.from_triple("nvptx64-nvidia-cuda")


@functools.lru_cache(maxsize=None)
def _target_machine(arch: str):
    if arch not in PTX_FEATURES:
        raise ValueError(f"arch expects one of {', '.join(SUPPORTED_ARCHS)}, but got {arch!r}")
    return _init().create_target_machine(cpu=arch, features=PTX_FEATURES[arch], opt=3)


def llvm_version() -> str:
    return ".".join(map(str, llvm.llvm_version_info))


def optimize_and_emit(llvm_text: str, arch: str, opt_level: int = 3) -> tuple[str, str]:
    """Run LLVM's O``opt_level`` pipeline and the NVPTX backend: returns (optimized IR, PTX)."""
    with _lock:  # llvmlite's global LLVM state is not thread safe
        tm = _target_machine(arch)
        try:
            mod = llvm.parse_assembly(llvm_text)
            mod.verify()
        except RuntimeError as e:
            raise CompileError(f"LLVM rejected the generated IR: {e}") from None
        if opt_level:
            pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
            pb = llvm.create_pass_builder(tm, pto)
            pb.getModulePassManager().run(mod, pb)
        ptx = tm.emit_assembly(mod)
        return str(mod), ptx


_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s*,\s*"([^"]*)")?')


def annotate_source_lines(ptx: str, source_file: str = "") -> str:
    """After each ``.loc`` that moves to a new line, add ``// file.py:N  <source text>``.

    The PTX's ``.file`` names only the file (so the PTX is the same in every checkout); its
    text comes from ``source_file``, the kernel's own file, when the names agree.
    """
    files: dict[str, str] = {}
    for line in ptx.splitlines():
        m = _FILE.match(line)
        if m:
            idx, a, b = m.groups()
            path = os.path.join(b, a) if b else a
            if source_file and os.path.basename(source_file) == os.path.basename(path):
                path = source_file
            files[idx] = path
    out = []
    last = None
    for line in ptx.splitlines():
        out.append(line)
        m = _LOC.match(line)
        if m:
            idx, ln = m.group(1), int(m.group(2))
            if (idx, ln) != last and ln > 0:
                last = (idx, ln)
                path = files.get(idx, "")
                text = linecache.getline(path, ln).strip()
                indent = line[: len(line) - len(line.lstrip())]
                out.append(f"{indent}// {os.path.basename(path)}:{ln}  {text}")
    return "\n".join(out) + "\n"
