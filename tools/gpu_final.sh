#!/usr/bin/env bash
# The measurement session, in two device calls made back to back (the machine stays warm ~30 s):
#   (either kind: on a two-GPU machine the GPU tests include the two-rank torchrun test and the
#   bench call ring attention over both)
#
#   call 1, carry [".wheels/a"]:  bash tools/gpu_final.sh tests
#       stashes the first half of the FA3-class wheels, runs every GPU test, an ncu look at the forward (D=64, 16k) and
#       the backward (D=128, 8k), the host-overhead bench and the TMA-store diagnosis
#   call 2, carry [".wheels/b"]:  bash tools/gpu_final.sh bench
#       installs the FA3-class kernel (flash-attn-4's CuTe sm90 path) and runs every benchmark:
#       attention forward, backward, GEMM (twice: the second process must not re-tune), decode,
#       the training step, and on a machine with two GPUs ring attention over both; each step
#       time-boxed so the call ends inside the device limit.
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

if [[ " $* " == *" tests "* ]]; then
  mkdir -p "$STASH" && cp .wheels/a/* "$STASH/" 2>/dev/null
  step pytest-gpu ${TEST_SECONDS:-280} python3 -m pytest -q -m gpu -p no:cacheprovider -n ${WORKERS:-8} \
    --timeout=240 --timeout-method=thread tests
  NCU="ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
       --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats"
  step ncu-forward ${NCU_SECONDS:-60} $NCU --launch-skip 3 --launch-count 1 -k regex:attention_fwd_sm90 \
    tylopy bench attention --once --d 64 --n 16384
  step ncu-backward ${NCU_SECONDS:-60} $NCU --launch-count 1 -k regex:attention_bwd_sm90 \
    tylopy bench attention_backward --once --d 128 --n 8192
  step host-overhead 60 python3 tools/bench_host_overhead.py --output "$LOG/host-overhead.json"
  step tma-store-variants 60 python3 tools/diagnose_tma_store.py
  tar czf "$OUT/final-tests.tgz" -C "$OUT" logs
  echo "=== tests"
  grep -E "^(FAILED|ERROR)" "$LOG/pytest-gpu.log" | cut -c1-180 | sort -u | head -40
  tail -2 "$LOG/pytest-gpu.log"
  tail -25 "$LOG/host-overhead.log"
  cat "$LOG/tma-store-variants.log"
  for f in ncu-forward ncu-backward; do
    echo "--- $f"; grep -E "^  [A-Z]|^    (Memory|DRAM|Duration|Compute|SM Busy|Registers|Achieved Occ|Theoretical Occ|Issue Slots|Executed Ipc|No Eligible|Warp Cycles Per Issued|Dynamic Shared|One or More)" "$LOG/$f.log" | head -40
  done
fi

if [[ " $* " == *" bench "* ]]; then
  if [ -f .wheels/b/cu13.name ] && [ -f "$STASH/cu13.part.aa" ]; then
    cat "$STASH/cu13.part.aa" .wheels/b/cu13.part.ab > "$STASH/$(cat .wheels/b/cu13.name)" \
      && cp .wheels/b/*.whl "$STASH/" \
      && python3 -m pip install -q --no-deps --target "$HOME/fa4" "$STASH"/*.whl > "$LOG/fa4-install.log" 2>&1
    export PYTHONPATH=$HOME/fa4:$HOME/fa4/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c "from flash_attn.cute import flash_attn_func; print('FA3-class kernel importable')" 2>&1 | tail -1
  step attention ${FWD_SECONDS:-170} tylopy bench attention --output "$LOG/attention.json" --plot "$LOG/attention.png"
  step backward ${BWD_SECONDS:-120} tylopy bench attention_backward --output "$LOG/backward.json" \
    --plot "$LOG/backward.png"
  TYLOPY_AUTOTUNE_VERBOSE=1 step gemm ${GEMM_SECONDS:-110} tylopy bench gemm --output "$LOG/gemm.json" \
    --plot "$LOG/gemm.png"
  TYLOPY_AUTOTUNE_VERBOSE=1 step gemm-again 50 tylopy bench gemm --shapes square --output "$LOG/gemm-again.json"
  step decode ${DECODE_SECONDS:-45} tylopy bench attention_decode --output "$LOG/decode.json"
  step training ${TRAIN_SECONDS:-80} tylopy bench attention_training --output "$LOG/training.json"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then  # ring attention over two GPUs (NVLink multicast off)
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 step ring ${RING_SECONDS:-100} \
      python3 -m torch.distributed.run --standalone --nproc_per_node 2 -m tylopy_kernels.attention.bench_ring \
      --output "$LOG/ring.json"
  fi
  tar czf "$OUT/final-bench.tgz" -C "$OUT" logs
  echo "=== bench"
  for f in attention backward gemm decode training; do
    echo "--- $f"; grep -E "^\|" "$LOG/$f.log" | tail -40
  done
  echo "--- gemm autotune: first process $(grep -c 'tylopy.autotune.* ms$' "$LOG/gemm.log") candidates timed, second" \
       "process $(grep -c 'tylopy.autotune.* ms$' "$LOG/gemm-again.log")"
  tail -6 "$LOG/training.log"
  [ -f "$LOG/ring.log" ] && { echo "--- ring"; grep -E "^N=|Error|error" "$LOG/ring.log" | tail -12; }
fi
