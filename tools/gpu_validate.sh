#!/usr/bin/env bash
# One device call that validates everything and picks schedules: every GPU test (in parallel),
# then short schedule sweeps of the attention forward and backward, the GEMM and the decode.
# Every step has its own time box so the call ends inside the device limit; logs and JSON are
# packed into $OUT/validate.tgz and a summary is printed last.
#   bash tools/gpu_validate.sh [tests] [sweeps]      (default: both)
set -u
OUT=${OUT:-/tmp/tylopy-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 TYLOPY_CACHE_DIR=${TYLOPY_CACHE_DIR:-/tmp/tylopy-cache}
steps=${*:-tests sweeps}
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | grep -v WARNING
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$LOG/device.txt"
start=$SECONDS

if [[ " $steps " == *" tests "* ]]; then
  timeout ${TEST_SECONDS:-300} python3 -m pytest -q -m gpu -p no:cacheprovider -n ${WORKERS:-8} \
    --timeout=240 --timeout-method=thread ${GPU_TESTS:-tests} > "$LOG/pytest-gpu.log" 2>&1
  echo "pytest exit $? after $((SECONDS - start)) s"
fi

sweep() {  # name seconds command...
  local name=$1 secs=$2; shift 2
  timeout "$secs" "$@" > "$LOG/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s"
}
if [[ " $steps " == *" sweeps "* ]]; then
  sweep attention-sweep ${FWD_SECONDS:-80} tylopy bench attention --sweep --output "$LOG/attention-sweep.json"
  sweep backward-sweep ${BWD_SECONDS:-80} tylopy bench attention_backward --sweep --output "$LOG/backward-sweep.json"
  sweep gemm-sweep ${GEMM_SECONDS:-80} tylopy bench gemm --sweep --output "$LOG/gemm-sweep.json"
  sweep decode-sweep ${DECODE_SECONDS:-40} tylopy bench attention_decode --sweep --output "$LOG/decode-sweep.json"
fi

tar czf "$OUT/validate.tgz" -C "$OUT" logs
echo "=== summary ($((SECONDS - start)) s)"
grep -E "^(FAILED|ERROR)" "$LOG/pytest-gpu.log" 2>/dev/null | cut -c1-200 | head -60
tail -3 "$LOG/pytest-gpu.log" 2>/dev/null
for f in attention-sweep backward-sweep gemm-sweep decode-sweep; do
  [ -f "$LOG/$f.log" ] && { echo "--- $f"; grep -iE "best|winner|^\|" "$LOG/$f.log" | tail -12; }
done
