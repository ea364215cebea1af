#!/usr/bin/env bash
# On the lent GPU machine, after `device.sh install` in the same lease (issue 19): `engineroom try` of a
# Qwen3.6-27B 4-bit vLLM pick on the weights vLLM makes itself (--load-format dummy, packed int4 from the
# folder's quantization_config), one device call each:
#   bash benchmarks/vllm_gpu/try_int4.sh autoround [SECONDS]   # autoround-int4 (the quant of the H200's balanced pick)
#   bash benchmarks/vllm_gpu/try_int4.sh gptq [SECONDS]        # gptq-int4
# Both from the layout's config.json (tests/fixtures/configs/qwen3.6-27b.json), which the shape file carries whole
# (synth.HF_CONFIG_KEY): the catalog id's folder would be transformers' reading of a GGUF, Qwen3_5ForCausalLM, which
# vLLM 0.26 does not register (the first visit, 2026-12-05: "'Qwen3_5TextConfig' object has no attribute
# 'vision_config'").
# Steps: `plan` before, `try` (its own fit, launch, bench, memory rows and placement), `plan` after, vLLM's own
# memory lines from the server log (models.py figures). The shape file's tokenizer is SmolLM2's, copied from
# .ci-work/device/tiny-gpu.gguf (carried once; 5.5 MB) instead of the 93 MB GGUF.
# `-- --gdn-prefill-backend triton`: FlashInfer is not carried (README.md), and vLLM's SM90 default for the
# linear-attention prefill is FlashInfer's; the engine args make the run no calibration point (try says so).
# VLLM_EXTRA: more vLLM arguments (--enforce-eager: no torch.compile and no CUDA graphs, a cold start of about a
# minute instead of five; the decode is then not the pick's, which the engine args already say).
# Everything lands in $OUT/vllm_try_<q>.tgz.
set -uo pipefail
q=${1:?autoround | gptq}
budget=${2:-540}
start=$(date +%s)
STORE=${VLLM_GPU_STORE:-/root/vllm_gpu}
OUT=${OUT:-/tmp/vllm-gpu-out}
VENV=$STORE/venv
R=$STORE/runs/try-$q
rm -rf "$R"
mkdir -p "$R" "$OUT" "$STORE/models"
exec > >(tee -a "$R/run.log") 2>&1
[ -f "$STORE/installed" ] || { echo "vLLM is not installed on this machine: run device.sh install first, in the same lease"; exit 2; }
tok=$STORE/models/tiny-gpu.gguf
[ -f "$tok" ] || cp .ci-work/device/tiny-gpu.gguf "$tok" || { echo "no tokenizer source: carry .ci-work/device/tiny-gpu.gguf"; exit 2; }
export ENGINEROOM_HOME=$STORE/home-try ENGINEROOM_VLLM_PYTHON=$VENV/bin/python PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
       VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 ENGINEROOM_TOKENIZER_GGUF=$tok
ER=$VENV/bin/engineroom
case "$q" in
  autoround) model=tests/fixtures/configs/qwen3.6-27b.json; quant=autoround-int4 ;;
  gptq) model=tests/fixtures/configs/qwen3.6-27b.json; quant=gptq-int4 ;;
  *) echo "unknown quant $q"; exit 2 ;;
esac
left() { echo $(( start + budget - $(date +%s) )); }
. benchmarks/vllm_gpu/collect.sh
trap 'collect_run "try-$q" "vllm_try_$q.tgz"' EXIT
bash benchmarks/vllm_gpu/device.sh engineroom > /dev/null || exit 3     # this call's engineroom
plan() { "$ER" plan "$model" --engine vllm --priority balanced --quant "$quant" --ctx 32768 --json > "$R/plan-$1.json" 2> "$R/plan-$1.err"; echo "plan $1: rc $?"; }
plan before
t0=$(date +%s)
timeout "$(( $(left) - 25 ))" "$ER" try "$model" --engine vllm --quant "$quant" --ctx 32768 --folder "$STORE/files" \
    --json -- --gdn-prefill-backend triton ${VLLM_EXTRA:-} > "$R/try.json" 2> "$R/try.err"
echo "try $model $quant: rc $? in $(( $(date +%s) - t0 )) s"; tail -25 "$R/try.err"
plan after
echo "== try-$q done in $(( $(date +%s) - start )) s"
