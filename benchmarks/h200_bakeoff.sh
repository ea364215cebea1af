#!/usr/bin/env bash
# Issue 20's H200 bakeoff, ik_llama.cpp's half: the fork's CUDA build, then `engineroom bakeoff --resume ID
# --engines ik_llama.cpp` of the two bakeoffs h200_visit.sh stored on the lease of 2026-12-05 (llama.cpp's cells,
# its packed store carried back), so each page has both engines on the same random-weight file.
# The fork's build takes most of a lease, so the work runs as one pipeline that outlives the calls (processes
# do: h200_visit.md) and each call only carries, polls and packs:
#   bash benchmarks/h200_bakeoff.sh start [SECONDS]   # call 1, carrying .ci-work/device/wheels, the fork's
#                                                     # trimmed sdist and h200-store.sqlite: venv, pipeline
#   bash benchmarks/h200_bakeoff.sh poll [SECONDS]    # every later call (the first one carrying tiny-gpu.gguf,
#                                                     # the tokenizer the random file copies): polls, packs
# The pipeline: the CUDA build; the carried store as this lease's; the 27B bakeoff (run 1) resumed with the
# fork added, then the MoE's (run 8), each with a budget that ends before the lease (LEASE_S from call 1).
# Every call leaves $OUT/h200b_poll-<lease second>.tgz: logs, JSON and a consistent copy of the store; never a
# model file.
set -uo pipefail
stage=${1:?stage: start | poll | pipeline}
budget=${2:-570}
W=.ci-work/device
H=.ci-work/h200b
OUT=${OUT:-/tmp/h200b-out}
start=$(date +%s)
LEASE_S=${LEASE_S:-1560}        # from call 1's start: the lease's 1,800 s less its ~2 min start, less packing
mkdir -p "$OUT" "$H/files"
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
export ENGINEROOM_HOME="$PWD/$H/home" ENGINEROOM_TOKENIZER_GGUF="$PWD/$W/tiny-gpu.gguf"
left() { echo $(( start + budget - $(date +%s) )); }
. benchmarks/device_venv.sh
. benchmarks/device_steps.sh    # step DIR NAME CMD..., server_path ENGINE

pack() {     # the logs and a consistent copy of the store (sqlite's backup: the pipeline may be writing)
  local n; n=$(( $(date +%s) - $(cat "$H/lease_t0") ))      # the lease's second: one name per call
  python3 - "$H" <<'EOF' 2> /dev/null
import gzip, shutil, sqlite3, sys
from engineroom.paths import db_path
src = sqlite3.connect(f"file:{db_path()}?mode=ro", uri=True)    # never creates it (an empty file reads damaged)
dst = sqlite3.connect(sys.argv[1] + "/store.sqlite")
src.backup(dst); dst.close(); src.close()
with open(sys.argv[1] + "/store.sqlite", "rb") as f, gzip.open(sys.argv[1] + "/store.sqlite.gz", "wb") as g:
    shutil.copyfileobj(f, g)
EOF
  rm -f "$H/store.sqlite"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$H/nvidia-smi-$stage.csv" 2>&1
  tar -czf "$OUT/h200b_$stage-$n.tgz" -C "$H" --exclude='./home/data/engines' --exclude='./home/cache' \
      --exclude='./files' --exclude='*.gguf' --exclude='./venv' .
  echo "packed $OUT/h200b_$stage-$n.tgz ($(( $(date +%s) - start )) s)"
}

built() { [ -f "$H/install-$1.json" ] && grep -q '"bin_dir"' "$H/install-$1.json"; }
building() { [ -f "$H/build-$1.pid" ] && kill -0 "$(cat "$H/build-$1.pid")" 2> /dev/null; }
build() {    # build ENGINE KEY SOURCE [NICE]: start ENGINE's CUDA build once its source is there
  local eng=$1 key=$2 src=$3 nice=${4:-0}
  built "$key" || building "$key" || [ ! -f "$src" ] || {
    nice -n "$nice" engineroom engines install "$eng" --source "$src" --cuda --json \
        > "$H/install-$key.json" 2> "$H/install-$key.err" < /dev/null &
    echo $! > "$H/build-$key.pid"; echo "[$(( $(date +%s) - t0 )) s] $eng: build started"; }
}

case "$stage" in
  start)
    exec > >(tee -a "$H/calls.log") 2>&1
    python3 --version; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; nproc
    date +%s > "$H/lease_t0"
    device_venv "$H/venv" "$W/wheels" || exit 1
    engineroom hardware --json > "$H/hardware.json"
    cp "$0" "$H/pipeline.sh"    # the pipeline runs from its own copy: a later call's carry rewrites the tree
    setsid bash "$H/pipeline.sh" pipeline > "$H/pipeline.log" 2>&1 < /dev/null &
    echo "pipeline started (pid $!)"
    stage=poll; logged=1 ;&
  poll)
    [ -n "${logged:-}" ] || exec > >(tee -a "$H/calls.log") 2>&1
    device_venv "$H/venv" "$W/wheels" || exit 1
    shown=0
    while [ "$(left)" -gt 25 ]; do
      n=$(wc -l < "$H/pipeline.log")
      [ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "$H/pipeline.log" | cut -c1-240 && shown=$n
      for k in ik; do building $k && echo "  $k: $(tail -c 300 "$H/install-$k.err" | tr '\r' '\n' | grep . | tail -1 | cut -c1-100)"; done
      [ -f "$H/DONE" ] && break
      sleep 20
    done
    sed -n "$((shown + 1)),\$p" "$H/pipeline.log" | cut -c1-240
    echo "call: $(( $(date +%s) - start )) s; lease: $(( $(date +%s) - $(cat "$H/lease_t0") )) s"
    pack ;;
  pipeline)
    . "$H/venv/bin/activate"
    t0=$(cat "$H/lease_t0")
    build ik_llama.cpp ik "$W/ik_llama_cpp_python-0.1.5-trimmed.tar.gz"
    while building ik; do sleep 10; done
    built ik || { echo "ik_llama.cpp: the build failed: $(tail -c 600 "$H/install-ik.err")"; touch "$H/DONE"; exit 1; }
    echo "[$(( $(date +%s) - t0 )) s] ik: $(grep -o '"build_seconds": [0-9.]*' "$H/install-ik.json")"
    engineroom engines --json > "$H/engines.json"
    p=$(server_path ik_llama.cpp) && "$p" --version > "$H/version-ik_llama.cpp.txt" 2>&1
    db=$(python3 -c 'from engineroom.paths import db_path; print(db_path())')
    mkdir -p "$(dirname "$db")"; cp "$W/h200-store.sqlite" "$db"
    until [ -f "$W/tiny-gpu.gguf" ]; do sleep 5; done
    for run in 1 8; do
      start=$t0 budget=$LEASE_S
      minutes=$(python3 -c "print(round(($(left) - 180) / 60, 1))")       # no cell starts within ~180 s of the end
      [ "${minutes%.*}" -ge 1 ] || { echo "bakeoff-$run: no time left"; continue; }
      echo "[$(( $(date +%s) - t0 )) s] bakeoff --resume $run: --budget-min $minutes"
      step "$H" "bakeoff-$run" engineroom bakeoff --resume $run --engines ik_llama.cpp --folder "$H/files" \
          --budget-min "$minutes" --json
    done
    touch "$H/DONE"; echo "[$(( $(date +%s) - t0 )) s] pipeline done" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
