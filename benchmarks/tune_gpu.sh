#!/usr/bin/env bash
# Issue 19 item 3 on the lent GPU machine (nvidia-h200): `engineroom tune` of the Qwen3.6-27B layout on
# llama.cpp's CUDA build, on random-weight Q4_K_M files `tune --random` writes and deletes itself.
# One device call per stage (10 minutes at most a call):
#   bash benchmarks/tune_gpu.sh balanced [SECONDS]     # one stream's decode from the balanced pick
#                                                      # (a fresh machine builds llama.cpp first, ~4 min)
#   bash benchmarks/tune_gpu.sh concurrent [SECONDS]   # every slot's decode from 32 slots: the slots knob
# The build, the venv and the store are gpu_edge.sh's (.ci-work/edge; the payload .ci-work/device
# carried on the first call). Each stage's JSON, stderr, `engineroom runs --json` and the gzipped store
# land in $OUT/tune_<stage>.tgz. tune stops starting trials past --budget-min; the step is killed 20 s
# before SECONDS so the results are packed whatever happens.
set -uo pipefail
stage=${1:?stage: balanced | concurrent}
budget=${2:-560}
start=$(date +%s)
W=.ci-work/device
G=.ci-work/edge
T=.ci-work/tune
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
trap 'engineroom down > /dev/null 2>&1; pack' EXIT
llama_server_path() {
  engineroom engines --json 2> /dev/null | python3 -c 'import json,sys;r=[r["path"] for r in json.load(sys.stdin) if r.get("engine")=="llama.cpp" and r.get("found")];print(*r[:1]);sys.exit(0 if r else 1)'
}
. benchmarks/device_venv.sh
device_venv "$G/venv" "$W/wheels" || exit 1
if ! llama_server_path > /dev/null; then
  echo "no llama.cpp build on this machine: building it first"
  bash benchmarks/gpu_edge.sh build || exit 1
  . "$G/venv/bin/activate"
fi
case "$stage" in
  balanced)
    args=(qwen3.6-27b --random --engine llama.cpp --priority balanced --quant Q4_K_M) ;;
  concurrent)
    args=(qwen3.6-27b --random --engine llama.cpp --priority concurrent-throughput --quant Q4_K_M --parallel 32
          --knob parallel --runs 2) ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
minutes=$(python3 -c "print(max(1, ($(left) - 150) / 60))")      # room for one trial past the last start
echo "tune ${args[*]} --budget-min $minutes ($(left) s left)"
setsid timeout "$(( $(left) - 20 ))" engineroom tune "${args[@]}" --folder "$T/files" --budget-min "$minutes" \
    --json > "$T/$stage.json" 2> "$T/$stage.err" &
pid=$! shown=0
while kill -0 "$pid" 2> /dev/null; do
  sleep 10
  n=$(wc -l < "$T/$stage.err")
  [ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "$T/$stage.err" | cut -c1-300 && shown=$n
  echo "[$stage: $(( $(date +%s) - start )) s]"
done
wait "$pid"; rc=$?
sed -n "$((shown + 1)),\$p" "$T/$stage.err" | cut -c1-300
echo "$stage: rc $rc in $(( $(date +%s) - start )) s" | tee -a "$T/steps.txt"
exit $rc
