#!/usr/bin/env bash
# On the lent GPU machine, after `device.sh install` in the same lease: engineroom drives vLLM
# 0.26.0's CUDA build for one model (one device call each, at most 10 minutes):
#   bash benchmarks/vllm_gpu/run_gpu.sh smollm2 [SECONDS]          # SmolLM2-135M, real weights (GGUF -> f16 folder)
#   bash benchmarks/vllm_gpu/run_gpu.sh qwen36-27b [SECONDS]       # Qwen3.6-27B layout, random weights (dummy)
#   bash benchmarks/vllm_gpu/run_gpu.sh qwen36-35b-a3b [SECONDS]   # Qwen3.6-35B-A3B MoE layout, random weights
# Steps: `engineroom fit` for the launch (on the free GPU), `engineroom up` (vLLM's own memory lines
# read from its log), `verify --suite full`, `bench --suite depth` and `--suite concurrency` (short),
# `down`. A step that would not end before SECONDS (default 540) is skipped and says so.
# Everything lands in $OUT/vllm_gpu_<model>.tgz (JSON of each command, the server log, figures).
set -uo pipefail
model=${1:?model: smollm2 | qwen36-27b | qwen36-35b-a3b}
budget=${2:-540}
start=$(date +%s)
STORE=${VLLM_GPU_STORE:-/root/vllm_gpu}
OUT=${OUT:-/tmp/vllm-gpu-out}
VENV=$STORE/venv
R=$STORE/runs/$model
mkdir -p "$R" "$OUT"
exec > >(tee -a "$R/run.log") 2>&1
[ -f "$STORE/installed" ] || { echo "vLLM is not installed on this machine: run device.sh install first, in the same lease"; exit 2; }
export ENGINEROOM_HOME=$STORE/home ENGINEROOM_VLLM_PYTHON=$VENV/bin/python PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
       VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0   # flashinfer is not carried (README.md)
ER=$VENV/bin/engineroom
left() { echo $(( start + budget - $(date +%s) )); }
step() {   # step NAME NEED_S CMD...: run CMD (its stdout -> NAME.json) when NEED_S seconds remain
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "SKIP $name: $(left) s left, it needs about $need"; return 0; fi
  local t0; t0=$(date +%s)
  timeout "$(( $(left) - 15 ))" "$@" > "$R/$name.json" 2> "$R/$name.err"
  local rc=$?
  echo "$name: rc $rc in $(( $(date +%s) - t0 )) s"; tail -3 "$R/$name.err"
  return $rc
}
. benchmarks/vllm_gpu/collect.sh
trap 'collect_run "$model" "vllm_gpu_$model.tgz"' EXIT
bash benchmarks/vllm_gpu/device.sh engineroom > /dev/null || exit 3     # this call's engineroom
tok=$STORE/models/smollm2-tokenizer
case "$model" in
  smollm2)
    ref=$STORE/models/SmolLM2-135M-Instruct.Q4_1.gguf; quant=f16; ctx=4096; par=4; extra=(); up_need=300 ;;
  qwen36-27b|qwen36-35b-a3b)
    ref=$STORE/models/$model
    "$VENV/bin/python" benchmarks/vllm_gpu/models.py folder "$model" "$ref" --tokenizer "$tok" || exit 4
    # random weights (config.json + tokenizer only); FlashInfer's GDN prefill (vLLM's SM90 default) is not
    # carried; text only (the folder has no image processor, and fit sizes the text model)
    quant=bf16; ctx=32768; par=4; extra=(--load-format dummy --gdn-prefill-backend triton --language-model-only); up_need=420 ;;
  *) echo "unknown model $model"; exit 2 ;;
esac
[ -n "${VLLM_EXTRA:-}" ] && read -r -a more <<< "$VLLM_EXTRA" && extra+=("${more[@]}")   # e.g. VLLM_EXTRA=--enforce-eager
# fit first, while the GPU is free (vLLM sizes from the device's total but refuses to start on less
# free memory than it asks for, and fit says so): SmolLM2 from its GGUF (vLLM serves a float16 copy)
step fit 30 "$ER" fit "$ref" --engine vllm --quant "$quant" --kv auto --ctx "$ctx" --parallel "$par" --rig auto --json
echo "== $model: up (ctx $ctx, parallel $par, extra ${extra[*]:-none})"
# --accept-placement: a placement other than planned is recorded in up.json (the verdict this
# visit is for) instead of stopping the server, so verify and bench still run on this call
step up "$up_need" "$ER" up "$ref" --engine vllm --ctx "$ctx" --parallel "$par" --timeout $(( up_need - 20 )) \
     --accept-placement --json -- "${extra[@]}" || { echo "up failed: $(tail -5 "$R/up.err")"; exit 5; }
step verify 120 "$ER" verify --suite full --json
step bench_depth 90 "$ER" bench --suite depth --depths 1024,8192 --max-tokens 64 --warmup 1 --runs 2 --json
step bench_concurrency 90 "$ER" bench --suite concurrency --streams 4 --prompt-tokens 1024 --max-tokens 128 \
     --warmup 1 --runs 2 --json
echo "== $model done in $(( $(date +%s) - start )) s"
