"""Shared test setup: GPU tiers, a private compile cache, and skip helpers.

* Tests marked ``gpu`` skip (with the reason) where torch sees no CUDA device, so the CPU
  tier runs everything else.
* ``requires_sm90`` (also the ``sm90`` marker) skips unless the current device is compute
  capability 9.0 (Hopper), like numba-cuda's ``skip_unless_cc_90``.
* ``TYLOPY_REQUIRE_GPU=1`` (set by the GPU script) turns a skip for a missing GPU into a failure
  and fails the run when no ``gpu`` test passed; ``TYLOPY_REQUIRE_PTXAS=1`` does the same for a
  skip because ptxas is missing. A green run then means the tests ran.
* ``TYLOPY_CACHE_DIR`` points at a temporary folder made for this session, so tests never
  read or write ``~/.cache/tylopy``; tests that need an empty cache use the ``cache_dir``
  fixture. ``XDG_CONFIG_HOME`` is a temporary folder too, so the cache's per-user key made for the
  tests is not the user's.
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile

import pytest

_SESSION_CACHE: str | None = None
_SESSION_CONFIG: str | None = None


@functools.lru_cache(maxsize=None)
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@functools.lru_cache(maxsize=None)
def compute_capability() -> tuple[int, int] | None:
    if not cuda_available():
        return None
    import torch
    return tuple(torch.cuda.get_device_capability())


def _sm90_skip_reason() -> str | None:
    cc = compute_capability()
    if cc is None:
        return "needs a Hopper GPU (sm_90), but torch.cuda.is_available() is False"
    if cc != (9, 0):
        return f"needs a Hopper GPU (sm_90), but the current device is sm_{cc[0]}{cc[1]}"
    return None


ARCH_FOR_CC = {(9, 0): "sm_90a", (8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89"}


def for_this_gpu(kernel):
    """The kernel compiled for the GPU at hand (the launcher loads the cubin of the kernel's arch)."""
    cc = compute_capability()
    arch = ARCH_FOR_CC.get(cc)
    if arch is None:
        pytest.skip(f"no tylopy target for compute capability {cc}")
    return kernel.with_arch(arch)


requires_gpu = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False")
requires_sm90 = pytest.mark.skipif(_sm90_skip_reason() is not None, reason=_sm90_skip_reason() or "")


def pytest_configure(config):
    global _SESSION_CACHE, _SESSION_CONFIG
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "sm90: needs a Hopper (sm_90) GPU")
    _SESSION_CACHE = tempfile.mkdtemp(prefix="tylopy-test-cache-")
    os.environ["TYLOPY_CACHE_DIR"] = _SESSION_CACHE  # set before any test module compiles a kernel
    _SESSION_CONFIG = tempfile.mkdtemp(prefix="tylopy-test-config-")
    os.environ["XDG_CONFIG_HOME"] = _SESSION_CONFIG  # (the cache key lives there)


_REQUIRED = {  # environment switch -> the words of the skip reasons it turns into failures
    "TYLOPY_REQUIRE_GPU": ("needs a CUDA GPU", "torch.cuda.is_available() is False", "needs a GPU", "needs a Hopper"),
    "TYLOPY_REQUIRE_PTXAS": ("ptxas not found", "needs ptxas", "ptxas report: not available"),
}
_gpu_passed = [0]


def _required_reasons() -> tuple:
    return tuple(w for var, words in _REQUIRED.items() if os.environ.get(var) == "1" for w in words)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2]
        if any(w in reason for w in _required_reasons()):
            report.outcome = "failed"
            report.longrepr = f"required by the environment, but skipped: {reason}"


def pytest_runtest_logreport(report):  # on the controller too under xdist
    if report.passed and report.when == "call" and "gpu" in report.keywords:
        _gpu_passed[0] += 1


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller decides
    if os.environ.get("TYLOPY_REQUIRE_GPU") == "1" and exitstatus == 0 and not _gpu_passed[0]:
        session.exitstatus = 1
        print("\nTYLOPY_REQUIRE_GPU=1, but no test marked gpu passed")


def pytest_unconfigure(config):
    for folder in (_SESSION_CACHE, _SESSION_CONFIG):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    gpu_skip = None if cuda_available() else pytest.mark.skip(
        reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    sm90_reason = _sm90_skip_reason()
    # exhaustive: the second head dim of the heaviest emulations and assemblies (minutes each on two
    # cores); CI runs the first, TYLOPY_EXHAUSTIVE=1 or a -m expression naming it runs them all
    exhaustive_skip = None if os.environ.get("TYLOPY_EXHAUSTIVE") == "1" or "exhaustive" in (
        config.option.markexpr or "") else pytest.mark.skip(reason="exhaustive: set TYLOPY_EXHAUSTIVE=1")
    for item in items:
        if exhaustive_skip is not None and "exhaustive" in item.keywords:
            item.add_marker(exhaustive_skip)
        if gpu_skip is not None and "gpu" in item.keywords:
            item.add_marker(gpu_skip)
        if sm90_reason is not None and "sm90" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=sm90_reason))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty compile cache for one test."""
    d = tmp_path / "tylopy-cache"
    d.mkdir()
    monkeypatch.setenv("TYLOPY_CACHE_DIR", str(d))
    monkeypatch.delenv("TYLOPY_CACHE", raising=False)
    return d


@pytest.fixture
def no_disk_cache(monkeypatch):
    """Compile from scratch every time (the in-memory cache of a Kernel object still applies)."""
    monkeypatch.setenv("TYLOPY_CACHE", "0")


def fresh(kernel):
    """A new Kernel object over the same function: no in-memory compile cache carried over."""
    import tylopy as ty
    return ty.Kernel(kernel.fn, kernel.threads, kernel.arch, kernel.min_blocks_per_sm, kernel.max_registers,
                     kernel.name)


@pytest.fixture
def fake():
    """A fake CUDA driver (``tylopy.testing.FakeDriver``) for the test: launches are checked, packed
    and recorded in ``fake.launches``; nothing runs."""
    from tylopy.testing import fake_driver
    with fake_driver() as d:
        yield d
