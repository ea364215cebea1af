#!/usr/bin/env bash
# On the lent GPU machine, after `ENGINE=sglang device.sh install` in the same lease (issue 19): `engineroom try`
# on SGLang 0.5.16's own random weights (--load-format dummy), from a config.json alone:
#   bash benchmarks/vllm_gpu/try_sglang.sh smollm2 [SECONDS]      # SmolLM2-135M's layout, bf16, 4K: the path
#   bash benchmarks/vllm_gpu/try_sglang.sh qwen36-27b [SECONDS]   # the Qwen3.6-27B layout at the plan's SGLang
#                                                                  # pick on this GPU (awq-int4, 32K)
#   QUANT=bf16 bash benchmarks/vllm_gpu/try_sglang.sh qwen36-27b  # another quant of that layout
# Steps: `plan` before, `try` (its own fit, launch, bench, memory rows and placement), `plan` after.
# `-- --sampling-backend pytorch`: SGLang samples with FlashInfer by default, whose kernels compile on first use
# (JIT, minutes of the lease); the engine args make the run no calibration point (try says so).
# The folders' tokenizer is SmolLM2's, from tiny-gpu.gguf (pack.py carries it). Everything lands in
# $OUT/sglang_try_<name>.tgz.
set -uo pipefail
name=${1:?smollm2 | qwen36-27b}
budget=${2:-540}
start=$(date +%s)
STORE=/root/sglang_gpu
OUT=${OUT:-/tmp/vllm-gpu-out}
VENV=$STORE/venv
R=$STORE/runs/try-$name
rm -rf "$R"
mkdir -p "$R" "$OUT" "$STORE/models"
exec > >(tee -a "$R/run.log") 2>&1
[ -f "$STORE/installed" ] || { echo "SGLang is not installed on this machine: run ENGINE=sglang device.sh install first, in the same lease"; exit 2; }
tok=$STORE/models/tiny-gpu.gguf
[ -f "$tok" ] || { echo "no tokenizer source $tok: the pack carries it"; exit 2; }
export ENGINEROOM_HOME=$STORE/home-try ENGINEROOM_SGLANG_PYTHON=$VENV/bin/python PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
       SGLANG_DISABLE_REQUEST_LOGGING=1 ENGINEROOM_TOKENIZER_GGUF=$tok
ER=$VENV/bin/engineroom
case "$name" in
  smollm2) model=tests/fixtures/configs/smollm2-135m.json; quant=${QUANT:-bf16}; ctx=4096 ;;
  qwen36-27b) model=tests/fixtures/configs/qwen3.6-27b.json; quant=${QUANT:-awq-int4}; ctx=32768 ;;
  *) echo "unknown model $name"; exit 2 ;;
esac
left() { echo $(( start + budget - $(date +%s) )); }
. benchmarks/vllm_gpu/collect.sh
trap 'collect_run "try-$name" "sglang_try_$name.tgz"' EXIT
ENGINE=sglang bash benchmarks/vllm_gpu/device.sh engineroom > /dev/null || exit 3     # this call's engineroom
plan() { "$ER" plan "$model" --engine sglang --priority balanced --quant "$quant" --ctx "$ctx" --json > "$R/plan-$1.json" 2> "$R/plan-$1.err"; echo "plan $1: rc $?"; }
plan before
# what SGLang compiles while it starts (its JIT kernels build with nvcc into ~/.cache/tvm-ffi, Triton's into
# ~/.triton): every 15 s the compilers running and the caches' sizes, to compile-watch.log
( while sleep 15; do
    echo "== $(date +%H:%M:%S)"; ps -eo etimes,pcpu,args --sort=-pcpu | grep -E 'nvcc|cicc|ptxas|ninja|g\+\+|c\+\+|sglang' \
      | grep -v grep | cut -c1-220 | head -8
    du -s ~/.cache/tvm-ffi ~/.triton ~/.cache/flashinfer 2>/dev/null
  done ) > "$R/compile-watch.log" 2>&1 &
watch=$!
t0=$(date +%s)
# the launch may wait until 90 s before the call's end (a 27B layout's start outlasted SGLang's old 300 s), leaving
# the bench and the collection their time
timeout "$(( $(left) - 25 ))" "$ER" try "$model" --engine sglang --quant "$quant" --ctx "$ctx" --folder "$STORE/files" \
    --timeout "$(( $(left) - 90 ))" --json -- --sampling-backend pytorch ${SGLANG_EXTRA:-} > "$R/try.json" 2> "$R/try.err"
echo "try $model $quant: rc $? in $(( $(date +%s) - t0 )) s"; tail -25 "$R/try.err"
kill "$watch" 2>/dev/null
ls ~/.cache/tvm-ffi > "$R/tvm-ffi-cache.txt" 2>&1
plan after
echo "== try-$name done in $(( $(date +%s) - start )) s"
