#!/usr/bin/env bash
# The measurement session, in two device calls made back to back (the machine stays warm ~30 s):
#   (either kind: on a two-GPU machine the GPU tests include the two-rank torchrun test and the
#   bench call ring attention over both)
#
#   call 1, carry [".wheels/a"]:  bash tools/gpu_final.sh tests
#       stashes the first half of the FA3-class wheels, runs the host-overhead bench, an ncu look at
#       the forward (D=64, 16k), every GPU test, an ncu look at the backward (D=128, 8k) and the
#       TMA-store diagnosis
#   call 2, carry [".wheels/b"]:  bash tools/gpu_final.sh bench
#       installs the FA3-class kernel (flash-attn-4's CuTe sm90 path) and runs every benchmark:
#       attention forward, backward, GEMM (twice: the second process must not re-tune), decode,
#       the training step, and on a machine with two GPUs ring attention over both; each step
#       time-boxed so the call ends inside the device limit.
#
# Knobs (environment): STEPS="host-overhead pytest-gpu ..." runs only those steps (names as in the
# step lines); VARIANTS="EXPONENT=shared ..." adds tylopy under those schedule changes to the
# attention comparison (same process) and an ncu look at each; FWD_SCHEDULE=K=V,... changes the
# schedule of the tests call's ncu look; *_SECONDS and WORKERS size the steps. On a fresh machine
# (no compiled kernels in TYLOPY_CACHE_DIR) the whole GPU suite takes longer than one call: split it,
# GPU_TESTS="tests/test_attention*" in one call and GPU_TESTS="tests --ignore-glob=*test_attention*"
# in the next (the second call finds the first one's compiled kernels while the machine stays warm).
#
# The wheels (flash-attn-4 4.0.0b36 and nvidia-cutlass-dsl 4.8.1 for Python 3.12, the large one split
# in two parts) are downloaded into .wheels/ and kept out of git.
# Logs, JSON and PNG are packed into $OUT/final-<step>.tgz; a summary is printed last.
set -u
OUT=${OUT:-/tmp/tylopy-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off
export PYTHONUNBUFFERED=1 TYLOPY_CACHE_DIR=${TYLOPY_CACHE_DIR:-/root/tylopy-cache}
STASH=$HOME/fa4-stash
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | grep -v WARNING
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$LOG/device.txt"
start=$SECONDS
step() {  # name seconds command...
  local name=$1 secs=$2; shift 2
  timeout "$secs" "$@" > "$LOG/$name.log" 2>&1
  echo "$name: exit $? at $((SECONDS - start)) s"
}

NCU="ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
     --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats"
want() { [[ " ${STEPS:-all} " == *" all "* || " ${STEPS:-all} " == *" $1 "* ]]; }  # STEPS="a b": only those
ncu_summary() {
  echo "--- $1"; grep -E "^  [A-Z]|^    (Memory|DRAM|Duration|Compute|SM Busy|Registers|Achieved Occ|Theoretical Occ|Issue Slots|Executed Ipc|No Eligible|Warp Cycles Per Issued|Dynamic Shared|One or More)" "$LOG/$1.log" | head -40
}

if [[ " $* " == *" tests "* ]]; then
  mkdir -p "$STASH" && cp .wheels/a/* "$STASH/" 2>/dev/null
  want host-overhead && step host-overhead 90 python3 tools/bench_host_overhead.py --output "$LOG/host-overhead.json"
  want ncu-forward && step ncu-forward ${NCU_SECONDS:-60} $NCU --launch-skip 3 --launch-count 1 \
    -k regex:attention_fwd_sm90 tylopy bench attention --once --d 64 --n 16384 ${FWD_SCHEDULE:+--schedule $FWD_SCHEDULE}
  want pytest-gpu && TYLOPY_REQUIRE_GPU=1 step pytest-gpu ${TEST_SECONDS:-280} python3 -m pytest -q -m "${GPU_MARK:-gpu}" -p no:cacheprovider \
    -n ${WORKERS:-8} --timeout=240 --timeout-method=thread ${GPU_TESTS:-tests}
  want ncu-backward && step ncu-backward ${NCU_SECONDS:-60} $NCU --launch-count 1 -k regex:attention_bwd_sm90 \
    tylopy bench attention_backward --once --d 128 --n 8192
  want tma-store-variants && step tma-store-variants 60 python3 tools/diagnose_tma_store.py
  tar czf "$OUT/final-tests.tgz" -C "$OUT" logs
  echo "=== tests"
  if [ -f "$LOG/pytest-gpu.log" ]; then
    grep -E "^(FAILED|ERROR)" "$LOG/pytest-gpu.log" | cut -c1-180 | sort -u | head -40
    tail -2 "$LOG/pytest-gpu.log"
  fi
  [ -f "$LOG/host-overhead.log" ] && tail -25 "$LOG/host-overhead.log"
  [ -f "$LOG/tma-store-variants.log" ] && cat "$LOG/tma-store-variants.log"
  for f in ncu-forward ncu-backward; do [ -f "$LOG/$f.log" ] && ncu_summary $f; done
fi

if [[ " $* " == *" bench "* ]]; then
  if [ -f .wheels/b/cu13.name ] && [ -f "$STASH/cu13.part.aa" ]; then
    cat "$STASH/cu13.part.aa" .wheels/b/cu13.part.ab > "$STASH/$(cat .wheels/b/cu13.name)" \
      && cp .wheels/b/*.whl "$STASH/" \
      && python3 -m pip install -q --no-deps --target "$HOME/fa4" "$STASH"/*.whl > "$LOG/fa4-install.log" 2>&1
    export PYTHONPATH=$HOME/fa4:$HOME/fa4/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c "from flash_attn.cute import flash_attn_func; print('FA3-class kernel importable')" 2>&1 | tail -1
  variants=(); for v in ${VARIANTS:-}; do variants+=(--variant "$v"); done  # VARIANTS="EXPONENT=shared ..."
  want attention && step attention ${FWD_SECONDS:-170} tylopy bench attention --output "$LOG/attention.json" \
    --plot "$LOG/attention.png" "${variants[@]}"
  for v in ${VARIANTS:-}; do
    want ncu-variant && step "ncu-forward-$v" ${NCU_SECONDS:-60} $NCU --launch-skip 3 --launch-count 1 \
      -k regex:attention_fwd_sm90 tylopy bench attention --once --d 64 --n 16384 --schedule "$v"
  done
  if want account; then  # the instruction-level account: ncu's per-instruction source page of each kernel
    SRC="ncu --set full --import-source no --page source --print-source sass --csv --launch-skip 3 --launch-count 1"
    for d in ${ACCOUNT_DIMS:-64 128}; do
      step account-tylopy-d$d ${NCU_SECONDS:-120} $SRC -k regex:attention_fwd_sm90 \
        tylopy bench attention --once --d $d --n 16384
      step account-fa3-d$d ${NCU_SECONDS:-120} $SRC -k 'regex:[Ff]lash|[Ff]wd|[Aa]ttn' \
        tylopy bench attention --once --only fa3_cute --d $d --n 16384
      python3 -m tylopy_kernels.attention.bench.account "$LOG/account-tylopy-d$d.log" "$LOG/account-fa3-d$d.log" \
        --names "tylopy D=$d" "FA3-class D=$d" > "$LOG/account-d$d.md" 2>&1
    done
  fi
  want backward && step backward ${BWD_SECONDS:-120} tylopy bench attention_backward --output "$LOG/backward.json" \
    --plot "$LOG/backward.png"
  want gemm && TYLOPY_AUTOTUNE_VERBOSE=1 step gemm ${GEMM_SECONDS:-110} tylopy bench gemm --output "$LOG/gemm.json" \
    --plot "$LOG/gemm.png"
  want gemm && TYLOPY_AUTOTUNE_VERBOSE=1 step gemm-again 50 tylopy bench gemm --shapes square --output "$LOG/gemm-again.json"
  want varlen && step varlen ${VARLEN_SECONDS:-120} tylopy bench attention_varlen --output "$LOG/varlen.json"
  want gemm-fp8 && step gemm-fp8 ${GEMM_FP8_SECONDS:-60} tylopy bench gemm_fp8
  want attention-fp8 && step attention-fp8 ${ATTN_FP8_SECONDS:-240} tylopy bench attention --fp8 --d 128 \
    --variant POLY_EXP2=2 --variant STAGES=3 --output "$LOG/attention-fp8.json"
  want gemm-cluster && step gemm-cluster ${GEMM_CLUSTER_SECONDS:-90} python3 -m tylopy_kernels.examples.gemm_cluster \
    --bench --release cta cluster --output "$LOG/gemm-cluster.json"
  want scaled-matmul && step scaled-matmul ${SCALED_MATMUL_SECONDS:-180} python3 -m tylopy_kernels.gemm.bench.fp8 \
    --output "$LOG/scaled-matmul.json"
  # the variant forward one tile per CTA against PERSISTENT, and the packed-window check alone
  want variants-diagnosis && step variants-diagnosis ${DIAGNOSIS_SECONDS:-120} python3 tools/diagnose_variants.py \
    --persistent --bench-check
  want decode && step decode ${DECODE_SECONDS:-45} tylopy bench attention_decode --output "$LOG/decode.json"
  want training && step training ${TRAIN_SECONDS:-80} tylopy bench attention_training --output "$LOG/training.json"
  # the variants bench only when STEPS names it (torch.compile's flex specializations take minutes)
  [[ " ${STEPS:-} " == *" attention-variants "* ]] && step attention-variants ${VARIANTS_BENCH_SECONDS:-540} \
    tylopy bench attention_variants ${VARIANTS_BENCH_ARGS:---quick} --output "$LOG/attention-variants.json" \
    --plot "$LOG/attention-variants.png"
  if want ring && [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then  # ring attention over two GPUs (NVLink multicast off)
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 step ring ${RING_SECONDS:-100} \
      python3 -m torch.distributed.run --standalone --nproc_per_node 2 -m tylopy_kernels.attention.bench.ring \
      --output "$LOG/ring.json"
  fi
  tar czf "$OUT/final-bench.tgz" -C "$OUT" logs
  echo "=== bench"
  [ -f "$LOG/gemm-fp8.log" ] && { echo "--- gemm-fp8"; tail -8 "$LOG/gemm-fp8.log"; }
  [ -f "$LOG/gemm-cluster.log" ] && { echo "--- gemm-cluster"; grep -E "\^3 bf16" "$LOG/gemm-cluster.log"; }
  [ -f "$LOG/scaled-matmul.log" ] && { echo "--- scaled-matmul"; grep -E "^\|" "$LOG/scaled-matmul.log"; }
  [ -f "$LOG/attention-fp8.log" ] && { echo "--- attention-fp8"; grep -E "^D=|^  D|^ptxas|^ratios" "$LOG/attention-fp8.log" | cut -c1-200 | tail -60; }
  for f in attention backward gemm varlen decode training attention-variants; do
    [ -f "$LOG/$f.log" ] && { echo "--- $f"; grep -E "^\||^variant|geometric" "$LOG/$f.log" | tail -${TABLE_LINES:-40}; }
  done
  for f in "$LOG"/account-d*.md; do [ -f "$f" ] && { echo "--- $(basename "$f")"; cat "$f"; }; done
  for f in "$LOG"/ncu-forward-*.log; do [ -f "$f" ] && ncu_summary "$(basename "$f" .log)"; done
  [ -f "$LOG/gemm.log" ] && echo "--- gemm autotune: first process $(grep -c 'tylopy.autotune.* ms$' "$LOG/gemm.log") candidates timed, second" \
       "process $(grep -c 'tylopy.autotune.* ms$' "$LOG/gemm-again.log")"
  [ -f "$LOG/training.log" ] && tail -6 "$LOG/training.log"
  [ -f "$LOG/variants-diagnosis.log" ] && { echo "--- variants-diagnosis"; grep -E "^variant fwd|^bench check" "$LOG/variants-diagnosis.log"; }
  for f in attention-variants attention; do
    [ -f "$LOG/$f.log" ] && grep -q "CHECK FAILED" "$LOG/$f.log" && { echo "--- $f: failed checks"; grep "CHECK FAILED" "$LOG/$f.log" | sort -u; }
  done
  [ -f "$LOG/ring.log" ] && { echo "--- ring"; grep -E "^N=|Error|error" "$LOG/ring.log" | tail -12; }
fi
