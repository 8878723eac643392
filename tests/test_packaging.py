"""What `pip install tylopy` gets: the wheel holds every package, the typing markers and the
license; the sdist holds the docs; the metadata's floors and extras; ptxas from NVIDIA's wheel.

The wheel and sdist are built from a copy of the checkout in a temporary folder (a stale
``build/`` in the checkout must not hide a missing file)."""
from __future__ import annotations

import email
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile

import pytest

import tylopy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tylopy.__file__)))
PACKAGES = ("tylopy", "tylopy_kernels")
SDIST_FILES = ("LICENSE", "README.md", "pyproject.toml", "MANIFEST.in", "docs/environment.md",
               "tools/check_floors.sh", "tools/smoke_installed.sh")


def source_packages() -> set[str]:
    """Every folder of the checkout's packages that has an __init__.py, as a dotted name."""
    found = set()
    for top in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if "__init__.py" in files:
                found.add(os.path.relpath(folder, ROOT).replace(os.sep, "."))
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """(wheel path, sdist path), built without network from a copy of the checkout."""
    pytest.importorskip("setuptools", minversion="77")
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in (*PACKAGES, "docs", "tests", "tools", ".ci"):
        shutil.copytree(os.path.join(ROOT, name), src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    out = tmp_path_factory.mktemp("dist")
    code = "import sys; from setuptools import build_meta as b; d = sys.argv[1]; b.build_sdist(d); b.build_wheel(d)"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,), (sdist,) = out.glob("tylopy-*.whl"), out.glob("tylopy-*.tar.gz")
    return wheel, sdist


def test_wheel_holds_every_package_and_marker(dist):
    wheel, _ = dist
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    in_wheel = {os.path.dirname(n).replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert source_packages() - in_wheel == set(), "packages missing from the wheel"
    assert not in_wheel - source_packages(), "the wheel holds packages the checkout does not"
    for top in PACKAGES:
        assert f"{top}/py.typed" in names
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert f"{info}/licenses/LICENSE" in names
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "docs/"))]


def test_wheel_metadata(dist):
    wheel, _ = dist
    with zipfile.ZipFile(wheel) as z:
        info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(z.read(info))
        entry_points = z.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert meta["Version"] == tylopy.__version__
    assert meta["License-Expression"] == "BSD-3-Clause"
    requires = meta.get_all("Requires-Dist")
    assert "llvmlite<0.51,>=0.48" in requires and "torch>=2.5" in requires  # docs/install.md says why
    assert 'nvidia-cuda-nvcc==13.0.*; extra == "ptxas"' in requires
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert "tylopy = tylopy.cli:main" in entry_points and "[tylopy.benchmarks]" in entry_points


def test_sdist_holds_docs_license_and_tools(dist):
    _, sdist = dist
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    missing = [f for f in SDIST_FILES if f not in names]
    assert not missing, f"missing from the sdist: {missing}"
    docs = {f"docs/{n}" for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")}
    assert docs <= names


def test_license_is_bsd3_of_the_project():
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert text.startswith("BSD 3-Clause License") and "Copyright (c) 2026, the tylopy developers" in text


def test_shell_tools_are_executable():
    for name in ("check_floors.sh", "smoke_installed.sh"):
        mode = os.stat(os.path.join(ROOT, "tools", name)).st_mode
        assert mode & stat.S_IXUSR, f"tools/{name} is not executable"


def test_ptxas_from_nvidias_wheel(tmp_path, monkeypatch):
    """The [ptxas] extra's nvidia-cuda-nvcc puts ptxas at nvidia/cu13/bin (12.x: nvidia/cuda_nvcc/bin)."""
    from tylopy.codegen import ptxas
    for sub in ("cu13", "cuda_nvcc"):
        site = tmp_path / sub
        exe = site / "nvidia" / sub / "bin" / "ptxas"
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
        exe.chmod(0o755)
        monkeypatch.syspath_prepend(str(site))
        assert ptxas._wheel_ptxas() == str(exe)
        monkeypatch.syspath_prepend(str(tmp_path))  # keep the next one's namespace separate
        monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
    # The whole search, with nothing before the wheel: no TYLOPY_PTXAS, no ptxas on PATH or in CUDA_HOME.
    monkeypatch.syspath_prepend(str(tmp_path / "cu13"))
    monkeypatch.delenv("TYLOPY_PTXAS", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(ptxas.shutil, "which", lambda name: None)
    real_exists = os.path.exists
    monkeypatch.setattr(ptxas.os.path, "exists", lambda p: False if p.startswith("/usr/local/cuda") else real_exists(p))
    ptxas.find_ptxas.cache_clear()
    try:
        assert ptxas.find_ptxas() == str(tmp_path / "cu13" / "nvidia" / "cu13" / "bin" / "ptxas")
    finally:
        ptxas.find_ptxas.cache_clear()


def test_no_ptxas_wheel_is_none(tmp_path, monkeypatch):
    from tylopy.codegen import ptxas
    (tmp_path / "nvidia" / "cu13" / "bin").mkdir(parents=True)  # the folder without the program
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert ptxas._wheel_ptxas() is None
