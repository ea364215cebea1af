#!/usr/bin/env bash
# The recorded soak (benchmarks/verify_soak.md): `engineroom verify --suite soak` against the
# managed llama-server + SmolLM2-135M on this machine's CPU, each run in a state folder and
# store of its own, raw results under benchmarks/data/verify_soak/.
#
#   bash benchmarks/verify_soak.sh continuous 10            # llama-server's defaults (prompt cache on)
#   bash benchmarks/verify_soak.sh continuous 10 nocache    # the same with `-- --cache-ram 0`
#
# Each run leaves <name>.json (verify --json: the verdict, every rule, every turn), <name>.md
# (the run's card), <name>.host.txt (load and CPU before/after) and <name>.server.log.
set -euo pipefail
mode=${1:-continuous}
minutes=${2:-10}
variant=${3:-default}
name="soak_${mode}_${minutes}min_${variant}"
out="benchmarks/data/verify_soak"
mkdir -p "$out"
work=$(mktemp -d /tmp/verify-soak-XXXX)
export ENGINEROOM_HOME="$work/home" ENGINEROOM_STATE_DIR="$work/state"
export ENGINEROOM_CACHE_DIR="${ENGINEROOM_CACHE_DIR:-$HOME/.cache/engineroom}"   # the model, pulled once
extra=()
[ "$variant" = nocache ] && extra=(-- --cache-ram 0)
bin=.venv/bin/engineroom
{ date -u +%FT%TZ; uptime; nproc; } > "$out/$name.host.txt"
$bin up smollm2-135m --ctx 8192 --parallel 1 --threads 2 --port 0 --json "${extra[@]}" > "$work/up.json"
trap '$bin down >/dev/null 2>&1 || true' EXIT
set +e
( time $bin verify --suite soak --mode "$mode" --minutes "$minutes" --fast --json > "$out/$name.json" ) \
    2>> "$out/$name.host.txt"
rc=$?
set -e
run=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$out/$name.json")
$bin report "$run" > "$out/$name.md"
cp "$work/state/server.log" "$out/$name.server.log"
{ echo "exit code: $rc"; date -u +%FT%TZ; uptime; } >> "$out/$name.host.txt"
echo "$name: exit $rc, run $run"
