#!/usr/bin/env bash
# Gemma 3 270M at its trained 32K context: verify --suite stress --fast (a recorded run)
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/g32}; mkdir -p "$OUT"; cd "$OUT"
export ENGINEROOM_STATE_DIR=$OUT/state ENGINEROOM_DATA_DIR=$OUT/data
[ -f "$HERE/.venv/bin/activate" ] && source "$HERE/.venv/bin/activate"
start=$(date +%s)
engineroom up gemma-3-270m-pt --ctx 32768 --parallel 1 --threads 2 --port 0 --json > up.json 2> up.err || { echo up failed; exit 1; }
pid=$(python3 -c "import json;print(json.load(open('up.json'))['pid'])")
uptime > load_start.txt
engineroom verify --suite stress --fast --json > stress.json 2> stress.err
echo "verify rc $?" > rc.txt
awk '{print ($14+$15)/100}' /proc/$pid/stat > engine_cpu_s.txt
uptime > load_end.txt
engineroom down > /dev/null 2>&1
echo "wall $(( $(date +%s) - start )) s" > wall.txt
