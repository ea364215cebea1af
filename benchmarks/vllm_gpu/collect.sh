# Sourced by run_gpu.sh and try_int4.sh on the lent GPU machine (they set STORE, OUT, VENV, ER, ENGINEROOM_HOME, R):
#   collect_run NAME TGZ    # the server log, vLLM's own memory lines from it, nvidia-smi, the store, `down`; then
#                           # $STORE/runs/NAME packed as $OUT/TGZ
collect_run() {
  local log
  log=$(ls -t "$ENGINEROOM_HOME"/state/*.log "$ENGINEROOM_HOME"/*/*.log 2>/dev/null | head -1)
  [ -z "$log" ] && log=$(find "$ENGINEROOM_HOME" -name '*.log' -newer "$R/run.log" 2>/dev/null | head -1)
  [ -n "$log" ] && cp "$log" "$R/server.log" && "$VENV/bin/python" benchmarks/vllm_gpu/models.py figures "$R/server.log" > "$R/vllm_figures.json"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$R/nvidia-smi.csv" 2>&1
  [ -f "$ENGINEROOM_HOME/data/results.sqlite" ] && gzip -c "$ENGINEROOM_HOME/data/results.sqlite" > "$R/store.sqlite.gz"
  "$ER" down --json > "$R/down.json" 2>&1
  tar -czf "$OUT/$2" -C "$STORE/runs" "$1"
}
