"""Figures in the docs come from committed measurements: the README's forward and variants tables
are what ``tools/perf_tables.py`` makes of the JSON it names."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_tables_match_the_committed_results():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "perf_tables.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
