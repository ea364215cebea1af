#!/usr/bin/env bash
# Issue 19 on the lent GPU machine (nvidia-h200): `engineroom tune` (item 3) of the Qwen3.6-27B layout and of
# a Qwen3-30B-A3B-shaped MoE (tests/fixtures/configs/qwen3-30b-a3b.json) on llama.cpp's CUDA build, on
# random-weight Q4_K_M files `tune --random` writes and deletes itself; and `try` of two MoE shapes, each
# planned before and after a calibration from the other's try (the "Done when" of issue 19).
# One device call per stage (10 minutes at most a call); a fresh machine builds llama.cpp first (~4.6 min):
#   bash benchmarks/tune_gpu.sh balanced [SECONDS [MARGIN]]        # 27B: one stream's decode from the balanced pick
#   bash benchmarks/tune_gpu.sh concurrent [SECONDS [MARGIN]]      # 27B: every slot's decode from 32 slots, KV type
#   bash benchmarks/tune_gpu.sh moe-balanced [SECONDS [MARGIN]]    # MoE: one stream's decode
#   bash benchmarks/tune_gpu.sh moe-concurrent [SECONDS [MARGIN]]  # MoE: every slot's decode from 32 slots, slots, KV
#   bash benchmarks/tune_gpu.sh try [SECONDS]                      # try + plan before/after, two fresh stores
# (tune_gpu.md says why each stage's settings are what they are.) The build, the venv and the store are
# gpu_edge.sh's (.ci-work/edge; the payload .ci-work/device carried on the first call). When a snapshot of
# the committed src was carried (.ci-work/snap/src: `git archive HEAD src`), engineroom runs from it, so
# edits in flight in the working tree do not run on the device. Each stage's JSON, stderr, `engineroom runs
# --json` and the gzipped store land in $OUT/tune_<stage>.tgz. tune stops starting trials past --budget-min:
# SECONDS less MARGIN (the room kept for a trial longer than the longest before it); the step is killed 20 s
# before SECONDS so the results are packed whatever happens.
set -uo pipefail
stage=${1:?stage: balanced | concurrent | moe-balanced | moe-concurrent | try}
budget=${2:-560}
margin=${3:-150}
start=$(date +%s)
W=.ci-work/device
G=.ci-work/edge
T=.ci-work/tune
MOE=tests/fixtures/configs/qwen3-30b-a3b.json
MOE35=tests/fixtures/configs/qwen3.5-35b-a3b.json
OUT=${OUT:-/tmp/tune-out}
mkdir -p "$OUT" "$T/files"
exec > >(tee -a "$T/run.log") 2>&1
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
export ENGINEROOM_HOME="$PWD/$G/home" ENGINEROOM_TOKENIZER_GGUF="$PWD/$W/tiny-gpu.gguf"
left() { echo $(( start + budget - $(date +%s) )); }
pack() {
  engineroom runs --json > "$T/runs.json" 2> /dev/null
  db=$(python3 -c 'from engineroom.paths import db_path; print(db_path())' 2> /dev/null)
  [ -n "$db" ] && [ -f "$db" ] && gzip -c "$db" > "$T/store.sqlite.gz"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$T/nvidia-smi-$stage.csv" 2>&1
  rm -rf "$T/files"
  tar -czf "$OUT/tune_$stage.tgz" -C "$T" .
  echo "packed $OUT/tune_$stage.tgz ($(( $(date +%s) - start )) s)"
}
trap 'unset ENGINEROOM_DATA_DIR ENGINEROOM_STATE_DIR; engineroom down > /dev/null 2>&1; pack' EXIT
. benchmarks/device_steps.sh    # step DIR NAME CMD..., server_path ENGINE
. benchmarks/device_venv.sh
device_venv "$G/venv" "$W/wheels" || exit 1
[ -d .ci-work/snap/src ] && export PYTHONPATH="$PWD/.ci-work/snap/src"
python3 -c 'import engineroom; print("engineroom from", engineroom.__file__)'
if ! server_path llama.cpp > /dev/null; then
  echo "no llama.cpp build on this machine: building it first"
  bash benchmarks/gpu_edge.sh build || exit 1
  . "$G/venv/bin/activate"
fi
tried() {    # one store (DATA and STATE under $T/try/$1): try $2, with the plan of $3 before and after it
  local s=$1 one=$2 other=$3 n o
  n=$(basename "$one" .json) o=$(basename "$other" .json)
  export ENGINEROOM_DATA_DIR="$PWD/$T/try/$s/data" ENGINEROOM_STATE_DIR="$PWD/$T/try/$s/state"
  mkdir -p "$T/try"
  engineroom plan "$other" --engine llama.cpp --priority balanced --json > "$T/try/$s-plan-$o-before.json" 2>&1
  step "$T" "try/$s-try-$n" engineroom try "$one" --engine llama.cpp --folder "$T/files" --json
  engineroom plan "$other" --engine llama.cpp --priority balanced --json > "$T/try/$s-plan-$o-after.json" 2>&1
  engineroom plan "$one" --engine llama.cpp --priority balanced --json > "$T/try/$s-plan-$n-after.json" 2>&1
}
case "$stage" in
  balanced)
    args=(qwen3.6-27b --random --engine llama.cpp --priority balanced --quant Q4_K_M) ;;
  concurrent)
    args=(qwen3.6-27b --random --engine llama.cpp --priority concurrent-throughput --quant Q4_K_M --parallel 32
          --knob kv_dtype --runs 2 --max-tokens 128) ;;
  moe-balanced)
    args=("$MOE" --random --engine llama.cpp --priority balanced --quant Q4_K_M) ;;
  moe-concurrent)
    args=("$MOE" --random --engine llama.cpp --priority concurrent-throughput --quant Q4_K_M --parallel 32
          --knob parallel --knob kv_dtype --runs 2 --max-tokens 128) ;;
  try)
    # store A: the 35B-A3B layout tried, the 30B-A3B shape planned before and after (calibrated from it alone);
    # store B: the other way round
    export ENGINEROOM_LLAMA_SERVER; ENGINEROOM_LLAMA_SERVER=$(server_path llama.cpp) || exit 1
    tried A "$MOE35" "$MOE"
    [ "$(left)" -gt 80 ] && tried B "$MOE" "$MOE35"
    exit 0 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
minutes=$(python3 -c "print(max(1, ($(left) - $margin) / 60))")
echo "tune ${args[*]} --budget-min $minutes ($(left) s left)"
step "$T" "$stage" engineroom tune "${args[@]}" --folder "$T/files" --budget-min "$minutes" --json
