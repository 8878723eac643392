"""ty.autotune on the CPU with a fake timer: tuning once per key, the disk record a second
process reads, the environment switches, skipped candidates, pruning, and corrupt records."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest

import tylopy as ty
from tylopy.jit import cachefs
from tylopy.jit.autotune import AutotuneError

CONFIGS = [ty.Config(BLOCK=64), ty.Config(BLOCK=128), ty.Config(BLOCK=256)]
SPEED = {64: 3.0, 128: 1.0, 256: 2.0}  # fake milliseconds per config: 128 wins


class Recorder:
    """A fake launcher and timer: records every call, times from SPEED (or from ``speed``)."""

    def __init__(self, speed=None, fail=()):
        self.calls, self.timed = [], []
        self.speed = dict(speed or SPEED)
        self.fail = set(fail)

    def launch(self, x, n, BLOCK=0):
        if BLOCK in self.fail:
            raise ty.ResourceLimitError(f"BLOCK={BLOCK} needs 300000 bytes of shared memory")
        self.calls.append((n, BLOCK))
        return BLOCK

    def timer(self, fn):
        block = fn.keywords["BLOCK"]
        self.timed.append(block)
        return self.speed[block]


def make(rec, name="tests.fake_launch", configs=CONFIGS, **kw):
    return ty.autotune(configs=configs, key=["n"], timer=rec.timer, name=name,
                       device=lambda args: "fake-gpu", **kw)(rec.launch)


def read_record(path) -> dict:
    with open(path, "rb") as f:
        return json.loads(cachefs.unseal(os.path.basename(path), f.read()))


def records(cache_dir):
    return sorted(glob.glob(os.path.join(str(cache_dir), "autotune", "**", "*.json"), recursive=True))


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("TYLOPY_AUTOTUNE", raising=False)
    monkeypatch.delenv("TYLOPY_AUTOTUNE_VERBOSE", raising=False)


def test_first_call_tunes_and_runs_the_winner(cache_dir):
    rec = Recorder()
    tuned = make(rec)
    assert tuned("x", 10) == 128
    assert rec.timed == [64, 128, 256]
    assert rec.calls[-1] == (10, 128)
    assert len(records(cache_dir)) == 1


def test_same_key_is_not_tuned_again(cache_dir):
    rec = Recorder()
    tuned = make(rec)
    tuned("x", 10)
    tuned("x", 10)
    assert rec.timed == [64, 128, 256]


def test_new_key_is_tuned(cache_dir):
    rec = Recorder()
    tuned = make(rec)
    tuned("x", 10)
    rec.speed = {64: 0.5, 128: 1.0, 256: 2.0}
    assert tuned("x", 11) == 64
    assert rec.timed == [64, 128, 256] * 2
    assert len(records(cache_dir)) == 2


def test_a_fresh_tuner_reads_the_disk_record(cache_dir):
    make(Recorder())("x", 10)
    rec = Recorder(speed={64: 0.1, 128: 1.0, 256: 2.0})
    assert make(rec)("x", 10) == 128  # the stored winner, not re-timed
    assert rec.timed == []


def test_device_is_part_of_the_key(cache_dir):
    make(Recorder())("x", 10)
    rec = Recorder()
    other = ty.autotune(configs=CONFIGS, key=["n"], timer=rec.timer, name="tests.fake_launch",
                        device=lambda args: "other-gpu")(rec.launch)
    other("x", 10)
    assert rec.timed == [64, 128, 256]


def test_changed_configs_tune_again(cache_dir):
    make(Recorder())("x", 10)
    rec = Recorder()
    make(rec, configs=CONFIGS[:2])("x", 10)
    assert rec.timed == [64, 128]


def test_off_uses_the_first_config_without_timing_or_disk(cache_dir, monkeypatch):
    monkeypatch.setenv("TYLOPY_AUTOTUNE", "0")
    rec = Recorder()
    assert make(rec)("x", 10) == 64
    assert rec.timed == [] and records(cache_dir) == []


def test_off_ignores_a_stored_choice(cache_dir, monkeypatch):
    make(Recorder())("x", 10)
    monkeypatch.setenv("TYLOPY_AUTOTUNE", "0")
    assert make(Recorder())("x", 10) == 64


def test_force_tunes_again_once_and_overwrites(cache_dir, monkeypatch):
    make(Recorder())("x", 10)
    monkeypatch.setenv("TYLOPY_AUTOTUNE", "force")
    rec = Recorder(speed={64: 1.0, 128: 2.0, 256: 0.5})
    tuned = make(rec)
    assert tuned("x", 10) == 256
    assert tuned("x", 10) == 256
    assert rec.timed == [64, 128, 256]
    monkeypatch.delenv("TYLOPY_AUTOTUNE")
    assert make(Recorder())("x", 10) == 256  # the rewritten record


def test_verbose_prints_one_line_per_candidate(cache_dir, monkeypatch, capsys):
    monkeypatch.setenv("TYLOPY_AUTOTUNE_VERBOSE", "1")
    make(Recorder(fail={256}))("x", 10)
    err = capsys.readouterr().err.splitlines()
    lines = [l for l in err if "/3 " in l]
    assert len(lines) == 3
    assert "1.0000 ms" in lines[1] and "skipped: ResourceLimitError" in lines[2]
    assert any("best Config(BLOCK=128)" in l for l in err)
    make(Recorder())("x", 10)
    assert "stored in" in capsys.readouterr().err


def test_failing_candidates_are_skipped_with_a_note(cache_dir):
    rec = Recorder(fail={128})
    assert make(rec)("x", 10) == 256
    (path,) = records(cache_dir)
    record = read_record(path)
    assert record["timings_ms"][1]["ms"] is None
    assert "300000 bytes" in record["timings_ms"][1]["skipped"]
    assert record["config"] == {"BLOCK": 256}


def test_every_candidate_failing_raises_with_the_notes(cache_dir):
    with pytest.raises(AutotuneError, match="every config failed") as e:
        make(Recorder(fail={64, 128, 256}))("x", 10)
    assert str(e.value).count("ResourceLimitError") == 3
    assert isinstance(e.value.__cause__, ty.ResourceLimitError)


@pytest.mark.parametrize("garbage", ["{not json", '{"format": 1, "best": 7}', "[]",
                                     '{"format": 1, "best": 0, "config": {"BLOCK": 999}}'])
def test_corrupt_or_foreign_records_are_ignored_and_rewritten(cache_dir, garbage):
    make(Recorder())("x", 10)
    (path,) = records(cache_dir)
    with open(path, "wb") as f:
        f.write(cachefs.seal(os.path.basename(path), garbage.encode()))  # signed: the schema check must catch it
    rec = Recorder()
    assert make(rec)("x", 10) == 128
    assert rec.timed == [64, 128, 256]
    assert read_record(path)["config"] == {"BLOCK": 128}


def test_unsigned_record_is_ignored(cache_dir):
    make(Recorder())("x", 10)
    (path,) = records(cache_dir)
    planted = dict(read_record(path), best=0, config={"BLOCK": 64})
    with open(path, "w") as f:
        json.dump(planted, f)  # a valid record without this user's MAC
    rec = Recorder()
    assert make(rec)("x", 10) == 128 and rec.timed == [64, 128, 256]


def test_writes_leave_no_temporary_files(cache_dir):
    make(Recorder())("x", 10)
    leftovers = [p for p in glob.glob(os.path.join(str(cache_dir), "autotune", "**", "*"), recursive=True)
                 if os.path.basename(p).startswith(".tmp")]
    assert leftovers == []


def test_cache_off_keeps_choices_in_memory(cache_dir, monkeypatch):
    monkeypatch.setenv("TYLOPY_CACHE", "0")
    rec = Recorder()
    tuned = make(rec)
    tuned("x", 10)
    tuned("x", 10)
    assert rec.timed == [64, 128, 256] and records(cache_dir) == []


def test_prune_narrows_candidates_and_sets_the_default(cache_dir, monkeypatch):
    rec = Recorder()
    tuned = make(rec, prune=lambda args, cfgs: [c for c in cfgs if c.kwargs["BLOCK"] >= args["n"]])
    assert tuned("x", 100) == 128
    assert rec.timed == [128, 256]
    monkeypatch.setenv("TYLOPY_AUTOTUNE", "0")
    assert tuned("x", 200) == 256


def test_dict_configs_and_callable_keys(cache_dir):
    rec = Recorder()
    tuned = ty.autotune(configs=[{"BLOCK": 64}, {"BLOCK": 128}], key=[lambda a: a["n"] // 10], timer=rec.timer,
                        name="tests.callable_key", device=lambda a: "fake")(rec.launch)
    tuned("x", 10)
    tuned("x", 19)  # same bucket
    assert rec.timed == [64, 128]


@pytest.mark.parametrize("kw, match", [
    (dict(configs=[], key=["n"]), "at least one Config"),
    (dict(configs=CONFIGS, key=["m"]), "has no such parameter"),
    (dict(configs=CONFIGS, key="n"), "list of argument names"),
])
def test_setup_errors_name_the_argument(kw, match):
    with pytest.raises(AutotuneError, match=match):
        ty.autotune(**kw)(Recorder().launch)


SCRIPT = textwrap.dedent("""
    import sys, tylopy as ty
    timed = []
    def launch(n, BLOCK=0):
        return BLOCK
    def timer(fn):
        timed.append(fn.keywords["BLOCK"])
        return {64: 3.0, 128: 1.0}[fn.keywords["BLOCK"]]
    tuned = ty.autotune(configs=[ty.Config(BLOCK=64), ty.Config(BLOCK=128)], key=["n"], timer=timer,
                        name="tests.two_processes", device=lambda a: "fake-gpu")(launch)
    print(tuned(5), len(timed))
""")


def test_second_process_does_not_tune_again(cache_dir):
    env = dict(os.environ, TYLOPY_CACHE_DIR=str(cache_dir))
    env.pop("TYLOPY_AUTOTUNE", None)
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout.split() == ["128", "2"]
    assert runs[1].stdout.split() == ["128", "0"]


def _double(x):
    return 2 * x


def test_function_keys_follow_code_and_arguments():
    import functools
    from tylopy.jit.autotune import _key_part

    def scaled(x, alpha):
        return x * alpha

    assert _key_part(functools.partial(scaled, alpha=0.5)) == _key_part(functools.partial(scaled, alpha=0.5))
    assert _key_part(functools.partial(scaled, alpha=0.5)) != _key_part(functools.partial(scaled, alpha=0.25))
    assert _key_part(_double) != _key_part(lambda x: 2 * x)
    assert _key_part(torch_like()) == ["tensor", [2, 3], "bf16", [3, 1]]


class torch_like:
    shape, dtype = (2, 3), "bf16"

    def stride(self):
        return (3, 1)


# -- what a stored choice belongs to ------------------------------------------------------------------

def test_an_upgrade_tunes_again(cache_dir, monkeypatch):
    from tylopy.jit import autotune as at
    assert make(Recorder())("x", 10) == 128
    rec = Recorder()
    assert make(rec)("x", 10) == 128 and rec.timed == []  # read back
    for tool in ("tylopy", "ptxas", "llvmlite"):
        versions = dict(at.tool_versions(), **{tool: "99.0"})
        monkeypatch.setattr(at, "tool_versions", lambda v=versions: v)
        rec = Recorder()
        make(rec)("x", 10)
        assert rec.timed == [64, 128, 256], f"a new {tool} reused the old choice"
    stored = []
    for path in records(cache_dir):
        with open(path, "rb") as f:  # a sealed record: a MAC line, then the JSON
            stored.append(json.loads(f.read().split(b"\n", 1)[1])["code"]["versions"]["llvmlite"])
    assert "99.0" in stored, stored


def test_an_edited_kernel_file_tunes_again(cache_dir, tmp_path, monkeypatch):
    """The digest covers the launcher's file and the files of the kernels its module holds."""
    from tylopy.jit.autotune import source_digest
    (tmp_path / "tuned_kernels.py").write_text(textwrap.dedent("""\
        import tylopy as ty

        @ty.kernel(threads=32)
        def fill(out: ty.ptr(ty.f32)):
            out[ty.thread_idx()] = 1.0
    """))
    (tmp_path / "tuned_launch.py").write_text(textwrap.dedent("""\
        from tuned_kernels import fill

        def launch(out, BLOCK=0):
            return BLOCK
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import tuned_launch
    before = source_digest(tuned_launch.launch)
    assert source_digest(tuned_launch.launch) == before
    kernel_file = tmp_path / "tuned_kernels.py"
    kernel_file.write_text(kernel_file.read_text().replace("1.0", "2.0"))
    assert source_digest(tuned_launch.launch) != before


def test_a_function_without_a_file_counts_by_its_code():
    from tylopy.jit.autotune import source_digest
    one, two = {}, {}
    exec("def f(x, BLOCK=0):\n    return x + 1\n", one)
    exec("def f(x, BLOCK=0):\n    return x + 2\n", two)
    assert source_digest(one["f"]) != source_digest(two["f"])
