"""Mutation test of the CPU suite: plant one realistic bug at a time in the attention and softmax
kernels and see whether the emulator tests catch it, and how.

    python tools/mutations.py              # every mutation, a table and a summary
    python tools/mutations.py -j 2         # two at a time
    python tools/mutations.py -k hopper    # only mutations whose id contains "hopper"
    python tools/mutations.py --list       # the mutations and the tests each runs

Each mutation is a list of textual edits (``old`` -> ``new``) applied to the kernel source as it
is when the script runs, in a temporary copy of the source tree (``tylopy``, ``tylopy_kernels``,
``tests``) where the tests then run (the folder a test run starts in comes first on ``sys.path``,
so its packages shadow the installed ones); a mutation whose text no longer matches is reported as
"not applied". For each mutation the script runs a few CPU tests chosen for it (the emulator coverage
tests, ``tests/test_emulate_coverage_*.py``) and classifies the first failure: "protocol" (the
emulator's ProtocolError: a race, a deadlock, an mbarrier or wgmma misuse), "trace" (a protocol check
of the tile library while tracing, e.g. a wgmma result read before its wait), "memory" (an access
out of bounds), "numbers" (a result that fails the FP64 reference checks), "error" (anything else),
or "not caught". ``real`` marks the mutations that are real protocol bugs; those
should be caught by a protocol check, not only by wrong numbers. Exit status: 0 when at least
90% are caught and every real protocol bug is caught by a protocol check, else 1.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "tylopy_kernels")
HOPPER = ["attention/sm90/forward.py", "attention/sm90/consumer.py", "attention/sm90/tiles.py",
          "attention/sm90/softmax.py"]
PORTABLE = ["attention/portable/forward.py"]
SOFTMAX = ["softmax/streaming.py", "softmax/row.py"]
BACKWARD = ["attention/sm90/backward_common.py", "attention/sm90/backward_aux.py", "attention/sm90/backward_varlen.py"]
VARLEN = ["attention/sm90/varlen_tiles.py"]
BWD_T = "tests/test_attention_backward_hopper_emulate.py"
VARIANT_BWD_T = "tests/test_attention_variants_backward_emulate.py"
VARLEN_BWD_T = "tests/test_attention_varlen_hopper_backward_emulate.py"
VARLEN_T = "tests/test_attention_varlen_hopper_emulate.py"
COV_A = "tests/test_emulate_coverage_attention.py"
COV_S = "tests/test_emulate_coverage_softmax.py"


def hopper(case: str) -> str:
    slow = case in ("c3-long", "masked-long", "d128", "tma-store")
    return f"{COV_A}::test_hopper{'_long' if slow else ''}[{case}]"


def portable(case: str) -> str:
    return f"{COV_A}::test_portable[{case}]"


def softmax(case: str) -> str:
    return f"{COV_S}::test_softmax[{case}]"


@dataclass
class Mutation:
    id: str
    files: list  # candidate files (relative to kernels/) holding the text, searched in order
    edits: list  # (old, new): each old must occur; its first occurrence is replaced
    tests: list
    real: bool  # a real protocol bug (a protocol check should catch it)
    what: str = ""
    result: str = ""
    detail: str = ""
    seconds: float = 0.0
    where: list = field(default_factory=list)


M = Mutation
MUTATIONS = [
    # -- the Hopper kernel: protocol bugs ----------------------------------------------------------------
    M("hopper-missing-k-full-wait", HOPPER,
      [('    stage = hopper.ring_wait(smem, plan.k_ring, j, "k_full")\n', "    stage = j % plan.stages\n")],
      [hopper("persistent")], True, "consumer issues S = Q K^T without waiting for K"),
    M("hopper-k-full-wrong-parity", HOPPER,
      [('hopper.ring_wait(smem, plan.k_ring, j, "k_full")', 'hopper.ring_wait(smem, plan.k_ring, j + plan.stages, "k_full")')],
      [hopper("persistent")], True, "consumer waits for the other parity of K's full barrier"),
    M("hopper-k-full-wrong-stage", HOPPER,
      [('    stage = hopper.ring_wait(smem, plan.k_ring, j, "k_full")\n',
        '    hopper.ring_wait(smem, plan.k_ring, j + 1, "k_full")\n    stage = j % plan.stages\n')],
      [hopper("persistent")], True, "consumer waits on the next stage's full barrier"),
    M("hopper-missing-q-full-wait", HOPPER, [('hopper.mbarrier_wait(bar_at(smem, plan.q_full), k & 1, "q_full")', "pass")],
      [hopper("persistent")], True, "consumer never waits for Q"),
    M("hopper-early-k-release", HOPPER,
      [("    parts = hopper.wgmma_wait(0, parts)\n    release(smem, plan.k_ring, it, leader)\n",
        "    release(smem, plan.k_ring, it, leader)\n    parts = hopper.wgmma_wait(0, parts)\n")],
      [hopper("persistent")], True, "K stage of a work tile's first key tile released before its S wgmma is waited for"),
    M("hopper-early-v-release", HOPPER,
      [("        o, pa = wait_pv(sched, o, pa, p)\n        release(smem, plan.v_ring, it + j - 1, leader)\n",
        "        release(smem, plan.v_ring, it + j - 1, leader)\n        o, pa = wait_pv(sched, o, pa, p)\n")],
      [hopper("persistent")], True, "V stage released before the PV wgmma is waited for"),
    M("hopper-missing-last-v-release", HOPPER,
      [("    o, pa = hopper.wgmma_wait(0, o, pa)\n    release(smem, plan.v_ring, it + my_tiles - 1, leader)\n",
        "    o, pa = hopper.wgmma_wait(0, o, pa)\n")],
      [hopper("persistent")], True, "the last V stage of a tile is never released"),
    # (the producer's ring protocol lives in ty.hopper's ring_acquire: these edit the kernel's call of it)
    M("hopper-producer-skips-empty-wait", HOPPER,
      [("    stage, full_bar = hopper.ring_acquire(smem, ring, it, plan.tile_bytes)\n",
        "    stage = it % ring.stages\n    full_bar = bar_at(smem, ring.full + 8 * stage)\n"
        "    hopper.mbarrier_arrive_expect_tx(full_bar, plan.tile_bytes)\n")],
      [hopper("persistent")], True, "producer refills a stage without waiting for its release"),
    M("hopper-producer-empty-wrong-parity", HOPPER,
      [("hopper.ring_acquire(smem, ring, it, plan.tile_bytes)", "hopper.ring_acquire(smem, ring, it + ring.stages, plan.tile_bytes)")],
      [hopper("persistent")], True, "producer waits for the wrong parity of the empty barrier"),
    M("hopper-wrong-tx-bytes", HOPPER,
      [("hopper.ring_acquire(smem, ring, it, plan.tile_bytes)", "hopper.ring_acquire(smem, ring, it, plan.tile_bytes // 2)")],
      [hopper("persistent")], True, "expect_tx announces half a K/V tile"),
    M("hopper-wrong-q-tx-bytes", HOPPER,
      [("hopper.mbarrier_arrive_expect_tx(q_full, plan.q_bytes)", "hopper.mbarrier_arrive_expect_tx(q_full, plan.q_bytes + 1024)")],
      [hopper("persistent")], True, "expect_tx announces more bytes than the Q copies deliver"),
    M("hopper-empty-count-one", HOPPER,
      [("hopper.mbarrier_init(bar_at(smem, plan.k_empty + 8 * s), plan.consumers)",
        "hopper.mbarrier_init(bar_at(smem, plan.k_empty + 8 * s), 1)")],
      [hopper("persistent")], True, "K empty barriers expect one arrival instead of one per consumer"),
    M("hopper-full-count-two", HOPPER,
      [("hopper.mbarrier_init(bar_at(smem, plan.v_full + 8 * s), 1)", "hopper.mbarrier_init(bar_at(smem, plan.v_full + 8 * s), 2)")],
      [hopper("persistent")], True, "V full barriers expect two arrivals"),
    M("hopper-missing-init-fences", HOPPER,
      [("        hopper.fence_mbarrier_init()\n        hopper.fence_proxy_async()\n", "")],
      [hopper("persistent")], True, "mbarrier inits never made visible to the async proxy"),
    M("hopper-missing-sync-after-init", HOPPER,
      [("        hopper.fence_proxy_async()\n    ty.syncthreads()\n", "        hopper.fence_proxy_async()\n")],
      [hopper("persistent")], True, "no barrier between the mbarrier inits and their use"),
    M("hopper-wrong-turn-barrier", HOPPER, [("self.next = wg % consumers + 1", "self.next = wg")],
      [hopper("persistent")], True, "a consumer passes the tensor-core turn to itself"),
    M("hopper-dead-tile-skips-handoff", HOPPER,
      [("        ty.barrier_sync(turn.mine, TURN_THREADS)\n        ty.barrier_arrive(turn.next, TURN_THREADS)\n"
        "        release(smem, plan.k_ring, j, leader)\n",
        "        ty.barrier_sync(turn.mine, TURN_THREADS)\n        release(smem, plan.k_ring, j, leader)\n")],
      [hopper("c3-causal-520")], True, "a dead (causal) tile does not hand the turn on"),
    M("hopper-s-wait-too-loose", HOPPER,
      [("cur, o = hopper.wgmma_wait(1, cur, o)          # S_j is ready", "cur, o = hopper.wgmma_wait(2, cur, o)          # S_j is ready")],
      [hopper("persistent")], True, "wgmma_wait(2) does not cover S_j's group"),
    M("hopper-missing-q-empty-arrive", HOPPER,
      [("        hopper.mbarrier_arrive(bar_at(smem, plan.q_empty))\n", "        pass\n")],
      [hopper("persistent")], True, "a consumer never frees Q for the next work tile"),
    M("hopper-early-q-release", HOPPER,
      [("    if leader:  # every S GEMM of this tile has completed: the producer may load the next Q\n"
        "        hopper.mbarrier_arrive(bar_at(smem, plan.q_empty))\n", ""),
       ("    parts = hopper.wgmma_wait(0, parts)\n",
        "    parts = hopper.wgmma_wait(0, parts)\n    if leader:\n        hopper.mbarrier_arrive(bar_at(smem, plan.q_empty))\n")],
      [hopper("persistent")], True, "Q freed after the first key tile instead of the last"),
    M("hopper-tma-store-missing-fence", HOPPER,
      [("        ty.store(ty.ptr_cast(smem + addr, ty.b32), ty.pack2(vals[i], vals[i + 1], sched.dtype))\n"
        "    hopper.fence_proxy_async()\n",
        "        ty.store(ty.ptr_cast(smem + addr, ty.b32), ty.pack2(vals[i], vals[i + 1], sched.dtype))\n")],
      [hopper("tma-store")], True, "the O tile is TMA-stored without fence.proxy.async"),
    M("hopper-tma-store-exit-without-wait", HOPPER,
      [("            hopper.bulk_wait(0)\n", "            pass\n")],
      [hopper("tma-store")], True, "the CTA exits while its TMA stores may still read shared memory"),
    # -- the Hopper kernel: numerics -----------------------------------------------------------------------
    M("hopper-ignored-mask", HOPPER, [("            ok = ok & (flag != 0)\n", "            ok = ok\n")],
      [hopper("masked-gqa")], False, "the user mask is loaded but ignored"),
    M("hopper-causal-off-by-one", HOPPER, [("((prob.causal == 0) | (col <= shift(row, prob.diag)))",
                                          "((prob.causal == 0) | (col < shift(row, prob.diag)))")],
      [hopper("persistent-causal-lpt")], False, "causal masking drops the diagonal"),
    M("hopper-key-bound-off-by-one", HOPPER, [("ok = (col < prob.n_k)", "ok = (col <= prob.n_k)")],
      [hopper("c3-long")], False, "the key past n_k (TMA zero fill) is not masked"),
    M("hopper-ragged-tile-unmasked", HOPPER,
      [("    first = prob.n_k // prob.block_n\n", "    first = (prob.n_k + prob.block_n - 1) // prob.block_n\n")],
      [hopper("c3-long")], False, "the ragged last key tile is not masked"),
    M("hopper-no-rescale", HOPPER, [("        o = rescale_o(o, alpha, moved)\n", "        o = o\n")],
      [hopper("persistent")], False, "O is not rescaled when the row maximum moves"),
    M("hopper-exponent-sign", HOPPER,
      [("        x = ty.fma(s, c, neg_hi[row_of(i)])\n", "        x = ty.fma(s, c, -neg_hi[row_of(i)])\n")],
      [hopper("persistent")], False, "the exponent adds the row maximum instead of subtracting it"),
    # -- the Hopper backward and the packed (varlen) kernels: numerics ------------------------------------
    M("bwd-interior-ignores-causal", BACKWARD, [("((prob.causal != 0) & (low > 0))", "((prob.causal != 0) & (low > 16))")],
      [f"{BWD_T}::test_backward_matches_float64[d64-causal-interior-and-diagonal]"], False,
      "a tile crossing the causal diagonal counts as interior: its future scores are not masked"),
    M("bwd-sink-grad-sign", BACKWARD, [("ty.red_add(dsinks + h, -term)", "ty.red_add(dsinks + h, term)")],
      [f"{VARIANT_BWD_T}::test_sink_gradient_is_summed_by_the_conversion"], False,
      "the dQ conversion adds the sink gradient with the wrong sign"),
    M("bwd-sink-grad-one-warp", BACKWARD, [("if (tid == 0) | (tid == 32):", "if tid == 0:")],
      [f"{VARIANT_BWD_T}::test_sink_gradient_is_summed_by_the_conversion"], False,
      "only the first warp's 32 rows of a 64-row tile reach the sink gradient"),
    M("bwd-accum-zeroed-short", BACKWARD, [("    for j in range(2):\n        ty.store(dq_accum + (at + 512 * j)",
                                            "    for j in range(1):\n        ty.store(dq_accum + (at + 512 * j)")],
      [f"{BWD_T}::test_backward_matches_float64[d64-bf16]"], False,
      "the statistics kernel zeroes half of its share of the dQ accumulator"),
    M("varlen-bwd-uncovered-row-kept", BACKWARD, [("(end - start - n) * row_words", "(end - start - n - 1) * row_words")],
      [f"{VARLEN_BWD_T}::test_rows_no_document_computes_are_zeroed"], False,
      "the last gradient row no document computes is left as allocated"),
    M("varlen-fwd-v-tail-kept", VARLEN, [("if (word >> 5) >= valid_rows:", "if (word >> 5) > valid_rows:")],
      [f"{VARLEN_T}::test_varlen_forward_against_the_reference[D64-ragged]"], False,
      "the first V row past a document's end is not zeroed (0 * NaN poisons the row)"),
    M("skipped-tile-no-warpgroup-sync", HOPPER, [("                ty.barrier_sync(CONSUMER_BARRIER + wg, 128)\n", "")],
      [f"{VARLEN_T}::test_persistent_schedule_under_random_warp_orders[1]"], True,
      "a consumer's leader arrives on q_empty for a skipped tile before its other warps passed q_full"),
    # -- the portable kernel ---------------------------------------------------------------------------
    M("portable-missing-cp-async-wait", PORTABLE, [("            ty.cp_async_wait(0)\n", "            pass\n")],
      [portable("d64")], True, "the tile is read before its cp.async group is waited for"),
    M("portable-missing-syncthreads", PORTABLE,
      [("        ty.syncthreads()  # tile j is visible", "        pass  # tile j is visible")],
      [portable("d64")], True, "no barrier between the copies and the reads of other warps"),
    M("portable-wait-group-one", PORTABLE, [("ty.cp_async_wait(0)", "ty.cp_async_wait(1)")],
      [portable("d64")], True, "wait_group 1 leaves the current tile's group pending"),
    M("portable-missing-commit", PORTABLE, [("        ty.cp_async_commit()\n", "        pass\n")],
      [portable("d64")], True, "copies never committed, so no wait_group covers them"),
    M("portable-ignored-mask", PORTABLE, [("            ok = ok & (flag != 0)\n", "            ok = ok\n")],
      [portable("d16-masked")], False, "the user mask is loaded but ignored"),
    M("portable-copy-bound-off-by-one", PORTABLE, [("    ok = key < n_k\n", "    ok = key <= n_k\n")],
      [portable("d64")], False, "the copy reads the key row past n_k"),
    M("portable-causal-off-by-one", PORTABLE, [[("((causal == 0) | (col <= row))", "((causal == 0) | (col < row))"),
                                                ("(key <= query + causal_off))", "(key < query + causal_off))")]],
      [portable("d32-causal")], False, "causal masking drops the diagonal"),
    M("portable-no-rescale", PORTABLE, [("o = atoms_of(tiled(o) * upd.rescale)", "o = atoms_of(tiled(o))")],
      [portable("d64")], False, "O is not rescaled when the row maximum moves"),
    # -- the softmax kernels ---------------------------------------------------------------------------
    M("softmax-shift-sign", SOFTMAX, [("return ty.exp2(ty.fma(v, LOG2E, -shift))", "return ty.exp2(ty.fma(v, LOG2E, shift))")],
      [softmax("streaming-f32-vec4"), softmax("three-pass-f32")], False, "exp2(x log2e + shift): the shift's sign flipped"),
    M("softmax-row-shift-sign", SOFTMAX, [("ty.exp2(ty.fma(x_row[c], LOG2E, -shift)) * inv_l", "ty.exp2(ty.fma(x_row[c], LOG2E, shift)) * inv_l")],
      [softmax("row")], False, "the row kernel's output exponent adds the shift"),
    M("softmax-short-butterfly", SOFTMAX, [("    for offset in (16, 8, 4, 2, 1):  # a compile-time loop", "    for offset in (16, 8, 4, 2):  # a compile-time loop")],
      [softmax("row"), softmax("three-pass-f32")], False, "the warp maximum skips the last butterfly step"),
    M("softmax-full-row-missing-barrier", SOFTMAX, [("        ty.syncthreads()\n", "        pass\n")],
      [softmax("full-row-4-warps")], True, "warps read the shared partials without a barrier"),
    M("softmax-ragged-bound", SOFTMAX, [("in_row = [c < cols for c in col]", "in_row = [c <= cols for c in col]")],
      [softmax("streaming-f32-vec1"), softmax("full-row-f16-vec1")], False, "the ragged chunk reads one column past the row"),
    M("softmax-merge-rescale", SOFTMAX, [("l = l * ty.exp2(m - shift) + l_other * ty.exp2(m_other - shift)",
                                          "l = l + l_other * ty.exp2(m_other - shift)")],
      [softmax("streaming-f32-vec4")], False, "the lane merge forgets to rescale its own sum"),
]


def apply(mut: Mutation, files: dict) -> dict | None:
    """The mutated texts (relative path -> text), or None when an edit's text is not found. An edit is
    (old, new), or a list of such pairs tried in order (the kernel's text as it was and as it is)."""
    texts = {}
    for edit in mut.edits:
        for old, new in ([edit] if isinstance(edit, tuple) else edit):
            rel = next((r for r in mut.files if old in (texts.get(r) or files.get(r) or "")), None)
            if rel is not None:
                texts[rel] = texts.get(rel, files[rel]).replace(old, new, 1)
                mut.where.append(rel)
                break
        else:
            return None
    return texts


TREE = ("tylopy", "tylopy_kernels", "tests", "pyproject.toml")


def copy_package(dst: str, texts: dict):
    """The source tree copied into ``dst`` with ``texts`` (paths relative to tylopy_kernels/) written
    over; returns the copy's tylopy_kernels folder."""
    for name in TREE:
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dst, name), ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(src, dst)
    pkg = os.path.join(dst, "tylopy_kernels")
    for rel, text in texts.items():
        with open(os.path.join(pkg, rel), "w") as f:
            f.write(text)
    return pkg


SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$", re.M)


def classify(output: str, rc: int) -> tuple[str, str]:
    if rc == 0:
        return "not caught", ""
    m = SUMMARY.search(output)
    text = (m.group(3) or "") if m else output.strip().splitlines()[-1] if output.strip() else ""
    text = re.sub(r"/\S*?/tylopy_kernels/", "kernels/", text).replace("tylopy.emulate.errors.", "")
    if "ProtocolError" in text:
        kind = "protocol"
    elif "KernelSourceError" in text:
        kind = "trace"
    elif "MemoryAccessError" in text:
        kind = "memory"
    elif "AssertionError" in text:
        kind = "numbers"
    else:
        kind = "error"
    return kind, text


def run_tests(tests: list, tree: str, timeout: float) -> tuple[str, str]:
    env = dict(os.environ, COLUMNS="4000")
    env.setdefault("TYLOPY_CACHE_DIR", tempfile.mkdtemp(prefix="tylopy-mut-cache-"))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rfE",
           "--tb=no", *tests]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"no result within {timeout:.0f} s"
    return classify(proc.stdout + proc.stderr, proc.returncode)


def run_one(mut: Mutation, files: dict, timeout: float):
    t0 = time.perf_counter()
    texts = apply(mut, files)
    if texts is None:
        mut.result, mut.detail = "not applied", "the text to change is not in the current source"
        return mut
    with tempfile.TemporaryDirectory(prefix="tylopy-mut-") as tmp:
        copy_package(tmp, texts)
        mut.result, mut.detail = run_tests(mut.tests, tmp, timeout)
    mut.seconds = time.perf_counter() - t0
    return mut


def read_sources(muts) -> dict:
    files = {}
    for mut in muts:
        for rel in mut.files:
            path = os.path.join(KERNELS, rel)
            if rel not in files and os.path.exists(path):
                with open(path) as f:
                    files[rel] = f.read()
    return files


def baseline(muts, timeout) -> str | None:
    """Run every selected test on the unmutated copy; the reason it fails, or None."""
    tests = sorted({t for m in muts for t in m.tests})
    with tempfile.TemporaryDirectory(prefix="tylopy-mut-") as tmp:
        pkg = copy_package(tmp, {})
        where = subprocess.run([sys.executable, "-c", "import tylopy_kernels; print(tylopy_kernels.__file__)"],
                               cwd=tmp, capture_output=True, text=True).stdout.strip()
        if not where.startswith(pkg):
            return f"the temporary package does not shadow the installed one (imported {where or 'nothing'})"
        result, detail = run_tests(tests, tmp, timeout * max(1, len(tests)))
    return None if result == "not caught" else f"{result}: {detail}"


def table(muts) -> str:
    rows = [("mutation", "real", "result", "caught by / why", "s")]
    for m in muts:
        detail = re.sub(r"\s+", " ", m.detail)[:110]
        rows.append((m.id, "yes" if m.real else "no", m.result, detail, f"{m.seconds:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, r in enumerate(rows):
        lines.append(" | ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + f" | {r[4]}")
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths) + "-+--")
    return "\n".join(lines)


def summary(muts) -> tuple[str, bool]:
    applied = [m for m in muts if m.result != "not applied"]
    caught = [m for m in applied if m.result not in ("not caught", "timeout")]
    real = [m for m in applied if m.real]
    real_by_check = [m for m in real if m.result in ("protocol", "trace")]
    math_ = [m for m in applied if not m.real]
    n = max(len(applied), 1)
    text = (f"{len(caught)} of {len(applied)} applied mutations caught ({100 * len(caught) / n:.0f}%): "
            f"{sum(m.result == 'protocol' for m in applied)} by a protocol check, "
            f"{sum(m.result == 'trace' for m in applied)} by a check while tracing, "
            f"{sum(m.result == 'memory' for m in applied)} by a memory check, "
            f"{sum(m.result == 'numbers' for m in applied)} by wrong numbers, "
            f"{sum(m.result == 'error' for m in applied)} by another error; "
            f"real protocol bugs caught by a protocol check: {len(real_by_check)} of {len(real)}; "
            f"numeric bugs caught: {sum(m.result != 'not caught' for m in math_)} of {len(math_)}; "
            f"not applied: {len(muts) - len(applied)}")
    ok = len(caught) >= 0.9 * len(applied) and len(real_by_check) == len(real)
    return text, ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", default="", help="only mutations whose id contains this text")
    ap.add_argument("-j", type=int, default=1, help="mutations run at the same time")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutation's tests")
    ap.add_argument("--list", action="store_true", help="list the mutations and their tests")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run on the unmutated kernels")
    args = ap.parse_args(argv)
    muts = [m for m in MUTATIONS if args.k in m.id]
    if args.list:
        for m in muts:
            print(f"{m.id}{' (real protocol bug)' if m.real else ''}: {m.what}\n    " + "\n    ".join(m.tests))
        return 0
    if not args.no_baseline:
        why = baseline(muts, args.timeout)
        if why:
            print(f"the selected tests fail on the unmutated kernels, so mutations cannot be judged: {why}")
            return 2
    files = read_sources(muts)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
        for m in pool.map(lambda m: run_one(m, files, args.timeout), muts):
            print(f"{m.id}: {m.result} ({m.seconds:.0f} s)", flush=True)
    print()
    print(table(muts))
    text, ok = summary(muts)
    print(f"\n{text}\ntotal {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
