#!/usr/bin/env bash
# Issue 21 item 3 on the lent GPU machine: the three models of vLLM's visit (README.md section 4)
# through llama.cpp's CUDA build, driven by engineroom the same way (README.md section 5 says what
# came out), and issue 19's `engineroom try` on the GPU. One device call each, at most 10 minutes:
#   bash benchmarks/vllm_gpu/run_llamacpp.sh smollm2,qwen36-27b,qwen36-35b-a3b [SECONDS]
#   bash benchmarks/vllm_gpu/run_llamacpp.sh try [SECONDS]
# Per model: `engineroom fit`, `up FILE --engine llama.cpp --ctx C --parallel 4` (C as vLLM's: 4,096 for
# SmolLM2, 32,768 for the others), `verify --suite full`, `bench --suite depth` (1,024 and 8,192; SmolLM2
# 1,024) and `--suite concurrency --streams 4 --prompt-tokens 1024` at vLLM's settings, `down`.
# SmolLM2 is the real Q4_1 GGUF, carried in two parts (.ci-work/smol1/part1, .ci-work/smol2/part2, on two
# calls: one call's carry is 64 MiB) and joined here (sha256 checked); the two Qwen3.6 layouts are
# random-weight Q4_K_M files written here by engineroom.synth from the catalog's architecture, as
# `engineroom try` writes them (models.py gguf), and deleted after their run.
# `try`: `engineroom try` of the 27B at ctx 4,096 and 32,768 and of the 35B-A3B layout (its config.json:
# the catalog names no public GGUF of it, so its plan has no llama.cpp pick), then `plan qwen3.6-27b`.
# The llama.cpp CUDA build and the venv are gpu_edge.sh's (.ci-work/edge, the same ENGINEROOM_HOME, so
# the store holds the whole lease); a fresh machine builds first (the payload .ci-work/device carried).
# A step that would not end before SECONDS (default 560) is skipped and says so. Everything lands in
# $OUT/llamacpp_<stage>.tgz (each command's JSON and stderr, the server logs, runs.json, the store).
# Dry run on a CPU (no venv, no build, small settings): DRY=1 CTX_SMOL=2048 DEPTHS_SMOL=256 \
#   BENCH_EXTRA=--busy-ok bash benchmarks/vllm_gpu/run_llamacpp.sh smollm2 400
set -uo pipefail
models=${1:?models: smollm2,qwen36-27b,qwen36-35b-a3b | try}
budget=${2:-560}
start=$(date +%s)
W=.ci-work/device
G=.ci-work/edge
L=.ci-work/llamacpp
OUT=${OUT:-/tmp/llamacpp-out}
tag=${models//,/-}
mkdir -p "$OUT" "$L/runs" "$L/models" "$L/parts"
exec > >(tee -a "$L/run.log") 2>&1
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
if [ -z "${DRY:-}" ]; then
  export ENGINEROOM_HOME="$PWD/$G/home" ENGINEROOM_TOKENIZER_GGUF="$PWD/$W/tiny-gpu.gguf"
fi
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
SMOL=$L/models/SmolLM2-135M-Instruct.Q4_1.gguf
read -r -a BENCH_EXTRA <<< "${BENCH_EXTRA:-}"
left() { echo $(( start + budget - $(date +%s) )); }
pack() {
  engineroom runs --json > "$L/runs.json" 2> /dev/null
  db=$(python3 -c 'from engineroom.paths import db_path; print(db_path())' 2>/dev/null)
  [ -n "$db" ] && [ -f "$db" ] && gzip -c "$db" > "$L/store.sqlite.gz"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$L/nvidia-smi-end.csv" 2>&1
  tar -czf "$OUT/llamacpp_$tag.tgz" -C "$L" --exclude='*.gguf' --exclude='./parts' --exclude='./models' \
      --exclude='./tryfiles' .
  echo "packed $OUT/llamacpp_$tag.tgz ($(( $(date +%s) - start )) s)"
}
trap 'engineroom down > /dev/null 2>&1; pack' EXIT
# step NAME NEED_S DIR CMD...: CMD's stdout -> DIR/NAME.json, stderr -> DIR/NAME.err, in its own session,
# its stderr shown as it grows; skipped when fewer than NEED_S seconds are left; killed 15 s before the end
step() {
  local name=$1 need=$2 dir=$3; shift 3
  if [ "$(left)" -lt "$need" ]; then
    echo "SKIP $name: $(left) s left, it needs about $need" | tee -a "$dir/skipped.txt"; return 99
  fi
  local t0 shown=0 n; t0=$(date +%s)
  setsid timeout "$(( $(left) - 15 ))" "$@" > "$dir/$name.json" 2> "$dir/$name.err" &
  local pid=$!
  local ticks=0
  while kill -0 "$pid" 2> /dev/null; do
    sleep 1; ticks=$((ticks + 1))
    [ $((ticks % 10)) -ne 0 ] && continue
    n=$(wc -l < "$dir/$name.err")
    [ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "$dir/$name.err" | cut -c1-300 && shown=$n
    echo "[$name: $(( $(date +%s) - t0 )) s]"
  done
  wait "$pid"; local rc=$?
  sed -n "$((shown + 1)),\$p" "$dir/$name.err" | tail -5 | cut -c1-300
  echo "$name: rc $rc in $(( $(date +%s) - t0 )) s" | tee -a "$dir/steps.txt"
  return $rc
}
llama_server_path() {
  engineroom engines --json | python3 -c 'import json,sys;r=[r["path"] for r in json.load(sys.stdin) if r.get("engine")=="llama.cpp" and r.get("found")];print(*r[:1]);sys.exit(0 if r else 1)'
}
# the SmolLM2 parts carried so far, kept outside the carried folders; joined once both are here
for p in .ci-work/smol1/part1 .ci-work/smol2/part2; do [ -f "$p" ] && cp "$p" "$L/parts/"; done
if [ ! -f "$SMOL" ] && [ -f "$L/parts/part1" ] && [ -f "$L/parts/part2" ]; then
  cat "$L/parts/part1" "$L/parts/part2" > "$SMOL.tmp"
  got=$(sha256sum "$SMOL.tmp" | cut -d' ' -f1)
  if [ "$got" = "$SMOL_SHA" ]; then mv "$SMOL.tmp" "$SMOL"; echo "SmolLM2 joined, sha256 ok"
  else echo "SmolLM2 joined with sha256 $got, not $SMOL_SHA: not used"; rm -f "$SMOL.tmp"; fi
fi
ls "$L/parts" | tr '\n' ' ' | sed 's/^/parts here: /'; echo
if [ -z "${DRY:-}" ]; then
  . benchmarks/device_venv.sh
  device_venv "$G/venv" "$W/wheels" || exit 1
  if ! llama_server_path > /dev/null; then
    echo "no llama.cpp build on this machine: building it first (gpu_edge.sh build)"
    bash benchmarks/gpu_edge.sh build || exit 1
  fi
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$L/nvidia-smi.csv"
fi
echo "llama-server: $(llama_server_path)"

one() {   # one MODEL: fit, up, verify, bench depth and concurrency, down
  local model=$1 R="$L/runs/$1" ref quant ctx depths up_need
  mkdir -p "$R"
  case "$model" in
    smollm2)
      [ -f "$SMOL" ] || { echo "SKIP smollm2: the GGUF is not here (both parts not carried yet)" | tee -a "$R/skipped.txt"; return 0; }
      ref=$SMOL; quant=Q4_1; ctx=${CTX_SMOL:-4096}; depths=${DEPTHS_SMOL:-1024}; up_need=60 ;;
    qwen36-27b|qwen36-35b-a3b)
      ref=$L/models/$model-Q4_K_M-random.gguf; quant=Q4_K_M; ctx=32768; depths=1024,8192; up_need=120
      if [ ! -f "$ref" ]; then
        step write 150 "$R" python3 benchmarks/vllm_gpu/models.py gguf "$model" "$ref" Q4_K_M || return 1
        df -h "$L" | tee "$R/df.txt"
      fi ;;
    *) echo "unknown model $model"; return 2 ;;
  esac
  echo "== $model: $ref, ctx $ctx x 4 slots ($(left) s left)"
  step fit 20 "$R" engineroom fit "$ref" --engine llama.cpp --quant "$quant" --kv f16 --ctx "$ctx" --parallel 4 --rig auto --json
  # --accept-placement as vLLM's visit: a placement other than planned is recorded in up.json (and read by
  # bench's no_cpu_fallback check) instead of stopping the server, so verify and bench still run
  step up "$up_need" "$R" engineroom up "$ref" --engine llama.cpp --ctx "$ctx" --parallel 4 --port 0 \
       --timeout $(( up_need + 60 )) --accept-placement --json
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    local log; log=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1])).get("log_path") or "")' "$R/up.json" 2>/dev/null)
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$R/nvidia-smi-up.csv" 2>&1
    step verify 90 "$R" engineroom verify --suite full --json
    step bench_depth 60 "$R" engineroom bench --suite depth --depths "$depths" --max-tokens 64 --warmup 1 --runs 2 \
         "${BENCH_EXTRA[@]}" --json
    step bench_concurrency 60 "$R" engineroom bench --suite concurrency --streams 4 --prompt-tokens 1024 \
         --max-tokens 128 --warmup 1 --runs 2 "${BENCH_EXTRA[@]}" --json
    [ -n "$log" ] && [ -f "$log" ] && cp "$log" "$R/server.log"
  else
    echo "up failed (rc $rc): $(tail -3 "$R/up.err" | cut -c1-400)"
  fi
  engineroom down --json > "$R/down.json" 2>&1
  [ "$model" != smollm2 ] && rm -f "$ref"
  echo "== $model done ($(left) s left)"
}

trial() {   # issue 19: `engineroom try` on the GPU, then the plan that its runs calibrate
  local R="$L/runs/try"
  mkdir -p "$R" "$L/tryfiles"
  step plan_27b_before 20 "$R" engineroom plan qwen3.6-27b --engine llama.cpp --json
  step try_27b_4096 150 "$R" engineroom try qwen3.6-27b --engine llama.cpp --ctx 4096 --folder "$L/tryfiles" --json
  step try_27b_32768 150 "$R" engineroom try qwen3.6-27b --engine llama.cpp --ctx 32768 --folder "$L/tryfiles" --json
  step try_35b_a3b 150 "$R" engineroom try tests/fixtures/configs/qwen3.5-35b-a3b.json --engine llama.cpp --ctx 32768 \
       --folder "$L/tryfiles" --json
  rm -rf "$L/tryfiles"
  step plan_27b 20 "$R" engineroom plan qwen3.6-27b --json
  step plan_27b_llamacpp 20 "$R" engineroom plan qwen3.6-27b --engine llama.cpp --json
  step plan_35b_a3b_config 20 "$R" engineroom plan tests/fixtures/configs/qwen3.5-35b-a3b.json --engine llama.cpp --json
}

for m in ${models//,/ }; do
  if [ "$m" = try ]; then trial; else one "$m"; fi
done
echo "done in $(( $(date +%s) - start )) s"
