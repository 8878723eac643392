#!/usr/bin/env bash
# Are the dependency floors in pyproject.toml true? Install exactly the oldest release each floor
# allows (llvmlite>=0.48 -> llvmlite==0.48, ...) into a fresh venv outside the checkout, install
# tylopy from a wheel built from this checkout, and run the tests that exercise each dependency.
#
#   tools/check_floors.sh                      # every floor from pyproject.toml
#   tools/check_floors.sh llvmlite==0.47.0     # override one pin (shows why the floor is where it is)
#   SKIP_TORCH=1 tools/check_floors.sh         # reuse the interpreter's torch (PyPI's old Linux torch
#                                              # wheels pull ~3 GB of CUDA libraries)
# Needs pip access to PyPI (or a mirror holding those releases). Exit status: 0 when every floor
# installed and its tests passed.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3}
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tylopy-floors.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# The floors: name==version for every `name>=version` in [project].dependencies.
mapfile -t PINS < <("$PY" - "$ROOT/pyproject.toml" "$@" <<'PYEOF'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
pins = {}
for dep in deps:
    m = re.match(r"^([A-Za-z0-9_.-]+)\s*(?:\[.*\])?\s*(.*)$", dep)
    floor = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", m.group(2))
    if floor is None:
        sys.exit(f"check_floors: dependency {dep!r} has no '>=' floor to check")
    pins[m.group(1).lower()] = f"{m.group(1)}=={floor.group(1)}"
for override in sys.argv[2:]:
    name = re.split(r"[=<>!~]", override, maxsplit=1)[0].lower()
    if name not in pins:
        sys.exit(f"check_floors: {override!r} names no dependency of tylopy (have: {', '.join(pins)})")
    pins[name] = override
print("\n".join(pins.values()))
PYEOF
)
VENV_ARGS=()
if [[ "${SKIP_TORCH:-0}" != 0 ]]; then
  PINS=("${PINS[@]/torch==*/}")
  VENV_ARGS=(--system-site-packages)  # the interpreter's torch; everything pinned below shadows the rest
fi
echo "check_floors: pins: ${PINS[*]}"

"$PY" -m venv "${VENV_ARGS[@]}" "$WORK/venv"
VPY="$WORK/venv/bin/python"
# Pins constrained by nothing else: the environment's pip constraints (if any) must not move them.
export PIP_CONSTRAINT=""
"$VPY" -m pip install -q --disable-pip-version-check --ignore-installed ${PINS[@]} pytest
"$VPY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$ROOT" 2>/dev/null \
  || "$VPY" -m pip wheel -q --no-deps -w "$WORK/dist" "$ROOT"
"$VPY" -m pip install -q --no-deps "$WORK"/dist/tylopy-*.whl
"$VPY" -m pip list 2>/dev/null | grep -i -E "^(llvmlite|numpy|torch|cuda-python|cuda-bindings) "

# Run the tests from a copy of tests/ outside the checkout, so `import tylopy` is the wheel.
cp -r "$ROOT/tests" "$WORK/tests"
cp "$ROOT/pyproject.toml" "$WORK/"
cd "$WORK"
export TYLOPY_CACHE_DIR="$WORK/cache"
"$VPY" -c "import tylopy, sys; assert tylopy.__file__.startswith('$WORK/venv'), tylopy.__file__"
# llvmlite: the Hopper kernels assemble without stack or spills; numpy/torch: launch checks,
# emulated kernels and the autograd wrapper on CPU tensors; cuda-python: imported by the runtime.
"$VPY" -m pytest -q -p no:cacheprovider -x \
  tests/test_attention_hopper.py tests/test_gemm.py tests/test_codegen.py tests/test_emulate_basic.py \
  tests/test_launch_checks.py tests/test_attention_autograd.py tests/test_tensor_args.py tests/test_cli.py \
  -k "not console_script"
echo "check_floors: every floor installed and passed: ${PINS[*]}"
