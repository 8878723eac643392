#!/usr/bin/env bash
# Smoke test of an installed tylopy (a wheel or an sdist installed into some environment): run
# from a folder outside any checkout, so `import tylopy` can only find the installed copy.
#
#   tools/smoke_installed.sh /path/to/venv/bin/python
#
# Checks: the import and where it comes from, the typing marker, the version, `tylopy dump` of
# the example kernel shipped in the package (PTX and, where ptxas is found, its report), an
# emulated run of that kernel on the CPU (checked against numpy), and `tylopy bench`/`tylopy check`
# listing the registered names. Prints one line per check; exit status 1 at the first failure.
set -euo pipefail
PY=${1:-${PYTHON:-python3}}
BIN="$(dirname "$PY")"
TYLOPY="$BIN/tylopy"
HERE="$(mktemp -d "${TMPDIR:-/tmp}/tylopy-smoke.XXXXXX")"
trap 'rm -rf "$HERE"' EXIT
cd "$HERE"
export TYLOPY_CACHE_DIR="$HERE/cache"
fail() { echo "smoke: FAILED: $*" >&2; exit 1; }
ok() { echo "smoke: ok: $*"; }

[[ -x "$TYLOPY" ]] || fail "no tylopy console script next to $PY"
where=$("$PY" -c 'import os, tylopy, tylopy_kernels
for m in (tylopy, tylopy_kernels):
    d = os.path.dirname(m.__file__)
    assert os.path.isfile(os.path.join(d, "py.typed")), f"{d} has no py.typed"
print(os.path.dirname(os.path.dirname(tylopy.__file__)))') || fail "import tylopy"
case "$where" in
  */site-packages|*/dist-packages) ok "import tylopy from $where (py.typed in both packages)";;
  *) fail "tylopy imported from $where, not from an installed package";;
esac
version=$("$TYLOPY" --version) || fail "tylopy --version"
[[ "$version" == "tylopy $("$PY" -c 'import tylopy; print(tylopy.__version__)')" ]] || fail "version: $version"
ok "$version"

example=$("$PY" -c 'import tylopy_kernels.examples.vector_add as m; print(m.__file__)')
"$TYLOPY" dump "$example" > dump.txt 2> dump.err || { cat dump.err >&2; fail "tylopy dump $example"; }
grep -q "^.visible .entry vector_add" dump.txt || fail "tylopy dump printed no vector_add entry"
report=$(grep "^ptxas report" dump.txt) || fail "tylopy dump printed no ptxas report line"
ok "tylopy dump vector_add: $(grep -c . dump.txt) lines of PTX; $report"

"$TYLOPY" emulate "$example" > emulate.txt 2>&1 || { cat emulate.txt >&2; fail "tylopy emulate $example"; }
ok "tylopy emulate vector_add: $(tr '\n' ' ' < emulate.txt)"

for command in bench check; do
  "$TYLOPY" "$command" > names.txt 2>&1 || { cat names.txt >&2; fail "tylopy $command"; }
  grep -q "^available .*: .*attention" names.txt || { cat names.txt >&2; fail "tylopy $command lists no attention"; }
  ok "tylopy $command: $(head -1 names.txt)"
done
TYLOPY_LOG=info "$PY" -c 'import numpy as np
from tylopy_kernels.examples.vector_add import vector_add
x = np.random.rand(300).astype(np.float32); out = np.full(300, np.nan, np.float32)
vector_add.emulate(x, x, out, 300, grid=(2,))
assert np.array_equal(out, x + x)' 2> log.txt || { cat log.txt >&2; fail "emulated run from Python"; }
grep -q "^tylopy: emulated vector_add" log.txt || { cat log.txt >&2; fail "TYLOPY_LOG=info printed nothing"; }
ok "emulated run from Python, TYLOPY_LOG=info: $(tail -1 log.txt)"
echo "smoke: all checks passed ($where)"
