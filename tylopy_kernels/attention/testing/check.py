"""``tylopy check attention`` and ``tylopy check attention_portable`` (also ``streaming_attention``):
the attention kernels' GPU cases, one line per case.

    tylopy check attention              # the Hopper kernel, every case; ends with "N passed, M failed"
    tylopy check attention --quick      # a handful of small cases
    tylopy check attention -k causal    # only cases whose name contains "causal"
    tylopy check attention --list       # the case names; needs no GPU
    tylopy check attention --dry-run    # the same cases against a float32 model of the kernel on
                                        # the CPU: checks the checker, not the kernel
    tylopy check attention_portable     # the portable kernel: every case of its suite
    tylopy check attention_portable --quick -k causal

Both run the cases and pass rules of the kernels' GPU tests (tests/test_attention_hopper_gpu.py,
tests/test_streaming_attention_gpu.py), through the shared modules: ``cases.py`` (the suites),
``reference.py`` (an FP64 oracle and a same-boundary reference in the kernel's exponent form, P
rounded per key tile where the kernel rounds it), ``rules.py`` (the pass rules, parameterized by the
kernel's model) and ``scenarios.py`` (running a case; NaN padding, output canaries, causal future
perturbation, repeatability, (B, N, H, D) layouts, empty inputs, a CUDA graph, a side stream).
For the Hopper kernel also the other tile schedules. Known kernel failures print as XFAIL and
count in neither total (an unexpected pass counts as a failure). Exit status: 0 when nothing
failed, else 1 (also when there is no suitable GPU). A case that hangs kills the process after
``--timeout`` seconds, with the Python stacks printed, so one bad case cannot eat a device lease.
"""
from __future__ import annotations

import argparse
import faulthandler
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

import torch

from tylopy_kernels.attention.testing import scenarios as S
from tylopy_kernels.attention.testing.cases import (CONSTANT_CASES, NONPOSITIVE_SCALE_CASES, PORTABLE_CASES, PORTABLE_QUICK, Case, shape_cases,
                    special_cases)
from tylopy_kernels.attention.testing.float32_model import fp32_model, model_launch

OTHER_SCHEDULES = ({"BLOCK_N": 64, "CONSUMERS": 2, "STAGES": 4}, {"BLOCK_N": 128, "CONSUMERS": 3, "STAGES": 2},
                   {"PERSISTENT": True}, {"PERSISTENT": False})


@dataclass
class Target:
    """What the checks run against: the GPU kernel, or (``--dry-run``) the float32 model on the CPU."""

    attention: Callable
    launch: Callable
    device: str
    block_n: int | None  # None: the BLOCK_N of the recorded Hopper launch
    cuda: bool


def gpu_target() -> Target:
    from tylopy_kernels.attention import attention
    from tylopy_kernels.attention.sm90.launch import launch_hopper
    return Target(attention, launch_hopper, "cuda", None, True)


def model_target(block_n: int = 128) -> Target:
    return Target(fp32_model(block_n), model_launch(block_n), "cpu", block_n, False)


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Target], str]
    cuda_only: bool = False
    known_failure: str = ""  # why it fails today; empty for a case that must pass


def _numerics(case):
    return Check(case.name, lambda t: S.run_case(case, t.attention, t.device, t.block_n))


@contextmanager
def schedule(override: dict):
    """Launch with SCHEDULE updated by ``override`` (restored afterwards)."""
    from tylopy_kernels.attention.sm90 import launch as launch
    saved = launch.SCHEDULE
    launch.SCHEDULE = MappingProxyType(dict(saved, **override))  # (replaced whole: the tables are read-only)
    try:
        yield
    finally:
        launch.SCHEDULE = saved


def _with_schedule(override, case):
    def run(t):
        with schedule(override):
            return S.run_case(case, t.attention, t.device, t.block_n)
    label = ",".join(f"{k}={v}" for k, v in override.items())
    return Check(f"schedule {label}: {case.name}", run, cuda_only=True)


def build_checks(quick: bool = False) -> list[Check]:
    shapes = shape_cases(compact=True)
    if quick:
        shapes = [c for c in shapes if c.n_q * c.n_k <= 300 * 300][:8]
    checks = [_numerics(c) for c in shapes]
    if not quick:
        checks += [_numerics(c) for c in special_cases()]
    causal = Case("bf16", 1, 2, 300, 300, causal=True, lse=True)
    masked = Case("f16", 2, 3, 113, 203, mask="random", lse=True)
    checks += [
        Check("empty inputs", lambda t: S.check_empty(t.attention, device=t.device)),
        Check(f"NaN padding: {masked.name}", lambda t: S.check_nan_padding(masked, t.attention, t.device)),
        Check(f"canaries: {masked.name}", lambda t: S.check_canary(masked, t.launch, t.device)),
        Check(f"future perturbation: {causal.name}",
              lambda t: S.check_future_perturbation(causal, t.attention, (0, 63, 64, 127, 128, 200, 298), t.device)),
        Check(f"repeatable: {causal.name}", lambda t: S.check_repeatable(causal, t.attention, 100, t.device)),
        Check(f"(B, N, H, D) layout: {masked.name}",
              lambda t: S.check_transposed_layout(masked, t.attention, t.device, t.block_n)),
        Check(f"CUDA graph: {causal.name}", lambda t: S.check_cuda_graph(causal, t.attention), cuda_only=True),
        Check(f"side stream: {masked.name}", lambda t: S.check_side_stream(masked, t.attention), cuda_only=True),
    ]
    if not quick:
        checks += [_with_schedule(s, c) for s in OTHER_SCHEDULES
                   for c in (Case("bf16", 2, 3, 113, 203, lse=True), Case("f16", 1, 2, 1024, 1024, causal=True),
                             Case("bf16", 1, 1, 300, 257, mask="heads", lse=True))]
        checks += [_numerics(c) for c in CONSTANT_CASES + NONPOSITIVE_SCALE_CASES]
    return checks


def _hopper_problem() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU, but torch.cuda.is_available() is False (try --dry-run or --list)"
    cc = torch.cuda.get_device_capability()
    if cc != (9, 0):
        return f"needs a Hopper GPU (sm_90), but the current device is sm_{cc[0]}{cc[1]}"
    return None


def build_portable_checks(quick: bool = False) -> list[Check]:
    """The portable kernel's suite: numerics, causal future perturbation, the worked example."""
    return [Check(c.name, lambda t, c=c: S.PORTABLE_CHECKS[c.kind](c, t.device))
            for c in (PORTABLE_QUICK if quick else PORTABLE_CASES)]


def _portable_problem() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU, but torch.cuda.is_available() is False (try --list)"
    cc = torch.cuda.get_device_capability()
    if cc < (8, 0):
        return f"needs compute capability 8.0 or newer, but the current device is sm_{cc[0]}{cc[1]}"
    return None


def run_checks(checks: list[Check], target: Target, out=sys.stdout) -> tuple[int, int, int]:
    """Run and print; returns (passed, failed, known failures)."""
    passed = failed = known = 0
    for check in checks:
        if check.cuda_only and not target.cuda:
            continue
        t0 = time.perf_counter()
        try:
            msg = check.run(target)
            if target.cuda:
                torch.cuda.synchronize()
            ok, text = True, msg
        except Exception as e:  # noqa: BLE001 -- one line per case, whatever went wrong
            ok, text = False, f"{type(e).__name__}: {str(e)[:1500]}"
        secs = f"({time.perf_counter() - t0:.1f}s)"
        if check.known_failure:
            tag = "XPASS" if ok else "XFAIL"
            print(f"{tag} {check.name}: {check.known_failure}; {text} {secs}", file=out, flush=True)
            failed += ok
            known += not ok
        else:
            print(f"{'PASS' if ok else 'FAIL'} {check.name}: {text} {secs}", file=out, flush=True)
            passed += ok
            failed += not ok
    return passed, failed, known


def _watchdog(seconds: float):
    """Print every thread's stack and exit after ``seconds`` (to the real stderr, which pytest's
    capture would otherwise replace with a file that has no descriptor)."""
    try:
        faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stderr__)
    except (AttributeError, OSError, ValueError):  # no usable stderr: run without the watchdog
        pass


def _parser(prog: str, dry_run: bool, timeout: float):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a handful of small cases")
    ap.add_argument("-k", dest="keyword", default="", help="only cases whose name contains this text")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    if dry_run:
        ap.add_argument("--dry-run", action="store_true",
                        help="run against a float32 model of the kernel on the CPU (checks the checker)")
    ap.add_argument("--timeout", type=float, default=timeout,
                    help="kill the process after this many seconds (0: never)")
    return ap


def _run_cli(args, checks: list[Check], make_target: Callable[[], Target], device_problem) -> int:
    checks = [c for c in checks if args.keyword in c.name]
    if args.list:
        for c in checks:
            print(c.name + (" (known failure)" if c.known_failure else ""))
        return 0
    if args.timeout > 0:
        _watchdog(args.timeout)
    try:
        problem = None if getattr(args, "dry_run", False) else device_problem()
        if problem:
            print(f"FAIL device: {problem}", flush=True)
            print("0 passed, 1 failed")
            return 1
        passed, failed, known = run_checks(checks, make_target())
    finally:
        faulthandler.cancel_dump_traceback_later()
    if known:
        print(f"{known} known failures (XFAIL)")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main(argv=None) -> int:
    """``tylopy check attention``: the Hopper kernel."""
    args = _parser("tylopy check attention", dry_run=True, timeout=600).parse_args(argv)
    return _run_cli(args, build_checks(args.quick), model_target if args.dry_run else gpu_target, _hopper_problem)


def main_portable(argv=None) -> int:
    """``tylopy check attention_portable`` (also ``streaming_attention``): the portable kernel."""
    args = _parser("tylopy check attention_portable", dry_run=False, timeout=0).parse_args(argv)
    return _run_cli(args, build_portable_checks(args.quick), lambda: Target(None, None, "cuda", None, True),
                    _portable_problem)


if __name__ == "__main__":
    sys.exit(main())
