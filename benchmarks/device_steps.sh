# Sourced by the GPU-visit scripts (h200_visit.sh, tune_gpu.sh, gpu_edge.sh): the two helpers each of them needs.
# The caller sets $start (the call's start, in epoch seconds) and defines left() (its seconds left) before `step`.

# step DIR NAME COMMAND...: run COMMAND in its own session until it ends or left()-20 s pass (then SIGINT, so
# engineroom stops what it launched, and SIGKILL 15 s later), its stdout to DIR/NAME.json, its stderr to
# DIR/NAME.err printed as it grows; one line per step in DIR/steps.txt; returns COMMAND's exit code (124: timed out)
step() {
  local dir=$1 name=$2; shift 2
  local limit=$(( $(left) - 20 ))
  [ "$limit" -gt 0 ] || { echo "$name: no time left"; return 124; }
  mkdir -p "$(dirname "$dir/$name")"
  setsid timeout -s INT -k 15 "$limit" "$@" > "$dir/$name.json" 2> "$dir/$name.err" &
  local pid=$! shown=0 n rc
  while kill -0 "$pid" 2> /dev/null; do
    sleep "${STEP_POLL_S:-10}"
    n=$(wc -l < "$dir/$name.err")
    [ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "$dir/$name.err" | cut -c1-300 && shown=$n
    echo "[$name: $(( $(date +%s) - start )) s]"
  done
  wait "$pid"; rc=$?
  sed -n "$((shown + 1)),\$p" "$dir/$name.err" | cut -c1-300
  echo "$name: rc $rc at $(( $(date +%s) - start )) s" | tee -a "$dir/steps.txt"
  return $rc
}

# server_path ENGINE: the path of ENGINE's server engineroom finds here (exit 1: none). `engines --json` lists
# every adapter, found or not, so the row must say found (a check without it skipped a build on a fresh machine)
server_path() {
  engineroom engines --json 2> /dev/null | python3 -c 'import json,sys;r=[r["path"] for r in json.load(sys.stdin) if r.get("engine")==sys.argv[1] and r.get("found")];print(*r[:1]);sys.exit(0 if r else 1)' "$1"
}
