"""Assemble PTX with ptxas and read its resource report (registers, spills, stack, shared memory)."""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

from ..errors import CompileError, ResourceLimitError


@dataclass(frozen=True)
class PtxasReport:
    """What ptxas said about one kernel. ``available`` is False when no ptxas was found."""

    available: bool
    arch: str = ""
    registers: int | None = None
    spill_stores: int = 0
    spill_loads: int = 0
    stack_frame: int = 0
    shared_bytes: int = 0
    barriers: int = 0
    warnings: tuple[str, ...] = ()
    note: str = ""
    log: str = field(default="", repr=False)

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    @property
    def has_local_memory(self) -> bool:
        return self.stack_frame > 0 or self.spills > 0

    def codes(self) -> set[str]:
        """The diagnostic codes in the log, e.g. {'C7515'} for serialized wgmma."""
        return set(re.findall(r"\((C\d{4})\)", self.log))

    def __str__(self) -> str:
        if not self.available:
            return f"ptxas report: not available ({self.note})"
        lines = [f"ptxas report ({self.arch}): {self.registers} registers, {self.spill_stores} bytes spill stores, "
                 f"{self.spill_loads} bytes spill loads, {self.stack_frame} bytes stack frame, "
                 f"{self.shared_bytes} bytes static shared memory, {self.barriers} barriers"]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


# Where NVIDIA's PyPI wheel nvidia-cuda-nvcc (the ``[ptxas]`` extra) puts ptxas inside the ``nvidia``
# namespace package: nvidia/cu13/bin for CUDA 13 releases, nvidia/cuda_nvcc/bin for 12.x ones.
_WHEEL_BIN_DIRS = (("cu13", "bin"), ("cuda_nvcc", "bin"))


def _wheel_ptxas() -> str | None:
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        for parts in _WHEEL_BIN_DIRS:
            cand = os.path.join(base, *parts, "ptxas")
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
    return None


@functools.lru_cache(maxsize=None)
def find_ptxas() -> str | None:
    """ptxas from $TYLOPY_PTXAS, PATH, $CUDA_HOME/$CUDA_PATH, /usr/local/cuda, or PyPI's
    nvidia-cuda-nvcc wheel (``pip install tylopy[ptxas]``), in that order."""
    env = os.environ.get("TYLOPY_PTXAS")
    if env:
        return env if os.path.exists(env) else None
    found = shutil.which("ptxas")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "ptxas")):
            return os.path.join(root, "bin", "ptxas")
    return _wheel_ptxas()


@functools.lru_cache(maxsize=None)
def ptxas_version() -> str:
    exe = find_ptxas()
    if exe is None:
        return "none"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), (V[\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


_USED = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARS = re.compile(r"used (\d+) barriers")


def parse_report(log: str, arch: str) -> PtxasReport:
    regs = _USED.search(log)
    spill = _SPILL.search(log)
    smem = _SMEM.search(log)
    bars = _BARS.search(log)
    warnings = tuple(line.split(":", 1)[1].strip() if ":" in line else line
                     for line in log.splitlines()
                     if "warning" in line.lower() or re.search(r"\(C75\d\d\)", line))
    return PtxasReport(
        available=True, arch=arch,
        registers=int(regs.group(1)) if regs else None,
        stack_frame=int(spill.group(1)) if spill else 0,
        spill_stores=int(spill.group(2)) if spill else 0,
        spill_loads=int(spill.group(3)) if spill else 0,
        shared_bytes=int(smem.group(1)) if smem else 0,
        barriers=int(bars.group(1)) if bars else 0,
        warnings=warnings, log=log)


def _failure(log: str, arch: str, kernel: str, dynamic_shared_bytes: int) -> Exception:
    """ptxas' rejection as a tylopy error; resource overflows get a ResourceLimitError with a hint."""
    name = f" kernel {kernel!r}" if kernel else ""
    m = re.search(r"uses too much shared data \((0x[0-9a-f]+|\d+) bytes, (0x[0-9a-f]+|\d+) max\)", log)
    if m:
        used, limit = (int(x, 0) for x in m.groups())
        return ResourceLimitError(f"ptxas ({arch}):{name} asks for {used} bytes of static shared memory, but a block "
                                  f"may have at most {limit} statically; hint: allocate it with ty.dynamic_shared "
                                  "(up to 227 KB on Hopper, opted in at launch)")
    if "too much parameter space" in log or "Entry function" in log and "uses too much" in log:
        return ResourceLimitError(f"ptxas ({arch}):{name} exceeds a resource limit:\n{log.strip()}")
    return CompileError(f"ptxas failed for {arch}{name}:\n{log.strip()}")


def assemble(ptx: str, arch: str, kernel: str = "", dynamic_shared_bytes: int = 0) -> tuple[bytes | None, PtxasReport]:
    """Run ``ptxas -v``; returns (cubin, report). Without ptxas: (None, report with a note)."""
    exe = find_ptxas()
    if exe is None:
        return None, PtxasReport(available=False, arch=arch,
                                 note="ptxas not found: install the CUDA toolkit or set TYLOPY_PTXAS")
    with tempfile.TemporaryDirectory(prefix="tylopy-ptxas-") as d:
        src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([exe, f"-arch={arch}", "-v", "-warn-spills", "-warn-lmem-usage", "-o", out, src],
                              capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise _failure(log, arch, kernel, dynamic_shared_bytes)
        with open(out, "rb") as f:
            cubin = f.read()
    return cubin, parse_report(log, arch)
