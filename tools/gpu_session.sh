#!/usr/bin/env bash
# One device call: install, GPU tests, smoke checks, benchmarks. Logs and JSON land in $OUT.
# Usage: bash tools/gpu_session.sh [tests|host|primitives|matrix|training|training_bench|checks|sanitize|smoke|bench|bench_streaming|softmax|gemm|gemm_bench|gemm_bench_again|gemm_sweep|all ...]
set -u
OUT=${OUT:-/tmp/tylopy-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TYLOPY_CACHE_DIR=${TYLOPY_CACHE_DIR:-/tmp/tylopy-cache}
python3 -m pip install -e . --no-deps --no-build-isolation -q 2>&1 | grep -v WARNING
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
steps=${*:-all}
want() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
TESTS=${GPU_TESTS:-tests}
if want tests; then
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout=120 --timeout-method=thread $TESTS \
    2>&1 | tee "$OUT/pytest-gpu.log" | tail -25
fi
if [[ " $steps " == *" primitives "* ]]; then  # warp, atomic and debug primitives and their examples (not in all)
  timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_primitives_gpu.py tests/test_examples_reduce.py \
    2>&1 | tee "$OUT/pytest-primitives.log" | tail -25
fi
if [[ " $steps " == *" matrix "* ]]; then  # matrix/async-copy/rounding primitives and the mma.sync GEMM (not in all)
  timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_primitives_matrix_gpu.py \
    tests/test_primitives_rounding.py tests/test_examples_gemm.py tests/test_streaming_attention_gpu.py \
    2>&1 | tee "$OUT/pytest-matrix.log" | tail -25
fi
if want checks; then
  timeout 300 tylopy check attention 2>&1 | tee "$OUT/check-attention.log" | tail -3
  timeout 300 tylopy check streaming_attention 2>&1 | tee "$OUT/check-streaming.log" | tail -3
fi
if want sanitize; then
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool --print-limit 20 python3 tools/sanitize_attention.py \
      > "$OUT/sanitize-$tool.log" 2>&1; echo "compute-sanitizer $tool: exit $?"; tail -3 "$OUT/sanitize-$tool.log"
  done
fi
if want smoke; then
  timeout 240 python3 tools/gpu_smoke.py --timeout 200 2>&1 | tee "$OUT/smoke.log"
fi
if want bench; then
  timeout 400 python3 tools/bench_attention.py --output "$OUT/attention.json" --plot "$OUT/attention.png" \
    2>&1 | tee "$OUT/bench-attention.log"
fi
if want bench_streaming; then
  timeout 300 python3 tools/bench_streaming_attention.py --output "$OUT/streaming_attention.json" 2>&1 \
    | tee "$OUT/bench-streaming.log" | tail -40
fi
if [[ " $steps " == *" gemm "* ]]; then  # the GEMM's GPU tests (not in all)
  timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout=300 --timeout-method=thread \
    tests/test_gemm_gpu.py 2>&1 | tee "$OUT/pytest-gemm.log" | tail -25
fi
# gemm_bench tunes (first process); gemm_bench_again, run later on the same machine (same
# TYLOPY_CACHE_DIR), should time no candidate: it reads the stored choices.
for run in gemm_bench gemm_bench_again; do
  if [[ " $steps " == *" $run "* ]]; then
    TYLOPY_AUTOTUNE_VERBOSE=1 timeout 560 tylopy bench gemm --output "$OUT/$run.json" --plot "$OUT/$run.png" \
      > "$OUT/$run.log" 2>&1
    echo "$run: $(grep -c 'tylopy.autotune.* ms$' "$OUT/$run.log") candidates timed," \
         "$(grep -c 'stored in' "$OUT/$run.log") choices read or stored"
    grep '^|' "$OUT/$run.log" | tail -90
  fi
done
if [[ " $steps " == *" gemm_sweep "* ]]; then  # every schedule on a few shapes, to pick defaults
  timeout 560 tylopy bench gemm --sweep --output "$OUT/gemm-sweep.json" 2>&1 | tee "$OUT/bench-gemm-sweep.log" \
    | grep -E '^(##|best)'
fi
if want softmax; then
  timeout 200 python3 tools/bench_softmax.py --output "$OUT/softmax.json" 2>&1 | tee "$OUT/bench-softmax.log" | tail -20
fi
if [[ " $steps " == *" training "* ]]; then  # attention gradients, autograd, varlen, compile (not in all)
  timeout 580 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_autograd_gpu.py \
    tests/test_attention_varlen_gpu.py tests/test_attention_api_gpu.py 2>&1 | tee "$OUT/pytest-training.log" | tail -25
fi
if [[ " $steps " == *" training_bench "* ]]; then  # a block's compiled training step, tylopy against SDPA (not in all)
  timeout 580 tylopy bench attention_training --eager --output "$OUT/attention-training.json" 2>&1 \
    | tee "$OUT/bench-training.log" | tail -20
fi
if [[ " $steps " == *" host "* ]]; then  # launch and attention host overhead against the floors (not in all)
  timeout 300 python3 tools/bench_host_overhead.py --output "$OUT/host-overhead.json" 2>&1 | tee "$OUT/host-overhead.log"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch_host.py tests/test_tensor_args.py \
    tests/test_hostile_semantics.py 2>&1 | tee "$OUT/pytest-host.log" | tail -5
fi
