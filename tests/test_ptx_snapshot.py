"""``tools/ptx_snapshot.py``: the same tree compares equal to its own snapshot; a changed instruction
is reported (exit 1) and a moved source line is not."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "ptx_snapshot.py")


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args, "--only", "bwd-dq"], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, TYLOPY_CACHE="0"))


def test_snapshot_round_trip_and_a_changed_instruction(tmp_path):
    folder = str(tmp_path / "snap")
    assert run("write", folder).returncode == 0
    same = run("compare", folder)
    assert same.returncode == 0 and "1 of 1 the same" in same.stdout, same.stdout + same.stderr
    path = os.path.join(folder, "bwd-dq-d128-mask.ptx")
    text = open(path).read()
    assert ".loc" not in text and "wgmma" in text
    open(path, "w").write(text.replace("wgmma.fence.sync.aligned;", "wgmma.fence.sync.aligned;\n\tbar.sync 0;", 1))
    changed = run("compare", folder)
    assert changed.returncode == 1 and "differ: bwd-dq-d128-mask" in changed.stdout, changed.stdout + changed.stderr
