#!/usr/bin/env bash
# On the lent GPU machine: receive the parts pack.py made, one a call, join them, check every
# sha256, install vLLM 0.26.0 (+ engineroom) into a venv over /opt/torch/.venv's PyTorch, smoke-test.
# ENGINE=sglang: SGLang 0.5.16's pack (pack.py --engine sglang) into /root/sglang_gpu, its import check.
#   bash benchmarks/vllm_gpu/device.sh recv K     # carry [".ci-work/vllm_gpu/partK"]: store part K
#   bash benchmarks/vllm_gpu/device.sh install    # join, check, install, smoke (after the last recv;
#                                                 # SMOKE=0: no smoke server)
#   bash benchmarks/vllm_gpu/device.sh status     # what is stored / installed
# State lives in $VLLM_GPU_STORE (/root/vllm_gpu): outside the repo copy, so it stays while the
# machine is warm (a machine is given back 30 s after a call: make the calls back to back).
# Every call leaves its log and findings under $OUT.
set -uo pipefail
ENGINE=${ENGINE:-vllm}
case "$ENGINE" in vllm|sglang) ;; *) echo "ENGINE is vllm or sglang, not $ENGINE"; exit 2 ;; esac
if [ "$ENGINE" = vllm ]; then STORE=${VLLM_GPU_STORE:-/root/vllm_gpu}; else STORE=/root/${ENGINE}_gpu; fi
OUT=${OUT:-/tmp/vllm-gpu-out}
W=.ci-work/${ENGINE}_gpu
VENV=$STORE/venv
mkdir -p "$STORE/parts" "$OUT"
exec > >(tee -a "$OUT/device.log") 2>&1
TORCH_PY=${TORCH_PY:-/opt/torch/.venv/bin/python3}
[ -x "$TORCH_PY" ] || TORCH_PY=$(command -v python3)
stage=${1:-status}
say() { echo "[device.sh $(date +%H:%M:%S)] $*"; }

missing_parts() {   # the parts parts.sha256 lists that the store lacks or holds damaged
  local listing=$STORE/parts/parts.sha256 miss=""
  [ -f "$listing" ] || { echo "all (no parts.sha256 yet)"; return; }
  while read -r sum name; do
    [ "$sum" = "#" ] && continue
    if [ ! -f "$STORE/parts/$name" ] || [ "$(sha256sum "$STORE/parts/$name" | cut -d' ' -f1)" != "$sum" ]; then
      miss="$miss $name"
    fi
  done < "$listing"
  echo "${miss# }"
}

probe() {   # what the machine has, once per lease (cheap): written to $OUT
  {
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
    echo "python: $TORCH_PY $("$TORCH_PY" -V 2>&1)"; ldd --version | head -1; nproc; free -g | head -2; df -h / /root | tail -2
    "$TORCH_PY" -c "import torch, triton, transformers; print('torch', torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-'); print('triton', triton.__version__, 'transformers', transformers.__version__)"
    command -v nvcc && nvcc --version | tail -2
  } > "$OUT/probe.txt" 2>&1
  "$TORCH_PY" -m pip list --format=json > "$OUT/pip_list.json" 2>/dev/null
  cat "$OUT/probe.txt"
}

case "$stage" in
  recv)
    k=${2:?recv K}
    src=$W/part$k
    [ -f "$src/part$k.bin" ] || { say "part $k was not carried ($src/part$k.bin missing): name $src in carry"; exit 2; }
    want=$(awk -v n="part$k.bin" '$2 == n {print $1}' "$src/parts.sha256")
    have=$(sha256sum "$src/part$k.bin" | cut -d' ' -f1)
    [ "$want" = "$have" ] || { say "part $k arrived damaged (sha256 $have, want $want)"; exit 3; }
    if [ -f "$STORE/parts/parts.sha256" ] && ! cmp -s "$src/parts.sha256" "$STORE/parts/parts.sha256"; then
      say "part $k belongs to another pack than the parts stored: starting over"; rm -f "$STORE"/parts/*
    fi
    cp "$src/part$k.bin" "$src/parts.sha256" "$STORE/parts/"
    [ -f "$OUT/probe.txt" ] || [ -f "$STORE/probed" ] || { probe; touch "$STORE/probed"; }
    miss=$(missing_parts)
    say "stored part $k (sha256 ok); still missing: ${miss:-none}"
    ;;
  install)
    start=$(date +%s)
    miss=$(missing_parts)
    [ -z "$miss" ] || { say "cannot install: parts missing or damaged: $miss (this machine is not the one that received them, or a recv failed)"; exit 4; }
    bundle_sum=$(awk '$1 == "#" && $2 == "bundle" {print $3}' "$STORE/parts/parts.sha256")
    rm -rf "$STORE/payload"
    cat $(awk '$1 != "#" {print "'"$STORE"'/parts/" $2}' "$STORE/parts/parts.sha256") > "$STORE/payload.tar"
    [ "$(sha256sum "$STORE/payload.tar" | cut -d' ' -f1)" = "$bundle_sum" ] || { say "joined bundle sha256 differs"; exit 5; }
    tar -xf "$STORE/payload.tar" -C "$STORE" && rm -f "$STORE/payload.tar"
    P=$STORE/payload
    (cd "$P" && sha256sum -c --quiet MANIFEST.sha256) || { say "a file's sha256 differs from MANIFEST.sha256"; exit 5; }
    say "bundle and its $(wc -l < "$P/MANIFEST.sha256") files: sha256 ok"
    mkdir -p "$STORE/models"
    gz=$(ls "$P"/models/*.gguf.gz 2>/dev/null | head -1)
    if [ -n "$gz" ]; then
      gguf=$STORE/models/$(basename "$gz" .gz)
      gunzip -c "$gz" > "$gguf"
      want=$("$TORCH_PY" -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['models/'+sys.argv[2]]['gguf_sha256'])" "$P/manifest.json" "$(basename "$gz")")
      [ "$(sha256sum "$gguf" | cut -d' ' -f1)" = "$want" ] || { say "$gguf: sha256 differs"; exit 5; }
      say "$(basename "$gguf"): sha256 ok"
    fi
    # the venv: its own site-packages first, then /opt/torch/.venv's (a .pth: `venv
    # --system-site-packages` made from a venv's Python would see the base Python's, not torch's)
    rm -rf "$VENV"
    "$TORCH_PY" -m venv --without-pip "$VENV" || exit 6
    SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$TORCH_PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$P"/wheels/*.whl || exit 7
    "$TORCH_PY" -c "import site, sys, torch, os; dirs = [os.path.dirname(os.path.dirname(torch.__file__))] + site.getsitepackages(); print('\n'.join(dict.fromkeys(dirs)))" > "$SITE/zz_device_torch.pth"
    fb=$("$VENV/bin/python" "$PWD/benchmarks/vllm_gpu/models.py" fallbacks "$P")
    cp "$P/checks_result.json" "$OUT/" 2>/dev/null
    if [ -n "$fb" ]; then
      say "fallback wheels (the device's version does not meet vLLM's or engineroom's specifier): $(echo $fb | xargs -n1 basename | tr '\n' ' ')"
      "$TORCH_PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --upgrade $fb || exit 7
      "$TORCH_PY" -c "import site, sys, torch, os; dirs = [os.path.dirname(os.path.dirname(torch.__file__))] + site.getsitepackages(); print('\n'.join(dict.fromkeys(dirs)))" > "$SITE/zz_device_torch.pth"
    fi
    # members that travelled zstd-compressed (pack.py ZST) back into place, each sha256 checked
    "$VENV/bin/python" - "$P" "$SITE" <<'ZST' || exit 8
import hashlib, json, sys, zstandard
from pathlib import Path
payload, site = Path(sys.argv[1]), Path(sys.argv[2])
for rel, e in json.loads((payload / "manifest.json").read_text()).items():
    if e["kind"] != "member.zst":
        continue
    dst = site / e["member"]
    with open(payload / rel, "rb") as src, open(dst, "wb") as out:
        zstandard.ZstdDecompressor(max_window_size=1 << 27).copy_stream(src, out, write_size=1 << 20)
    h = hashlib.sha256(dst.read_bytes()).hexdigest()
    if h != e["member_sha256"]:
        sys.exit(f"{dst}: sha256 {h} differs from the wheel's member")
    print(f"{e['member']}: {e['member_size'] / 2**20:.0f} MiB back in place, sha256 ok")
ZST
    cp "$P"/models/tiny-gpu.gguf "$STORE/models/" 2>/dev/null    # SGLang's pack: the tokenizer source
    ENGINE=$ENGINE bash benchmarks/vllm_gpu/device.sh engineroom || say "engineroom did not install (engines.json says why); the engine's checks go on"
    say "installed in $(( $(date +%s) - start )) s"
    if [ "$ENGINE" = sglang ]; then
      "$VENV/bin/python" - <<'IMPORTS' 2>&1 | tee "$OUT/import.txt"
import torch, sglang, sgl_kernel, flashinfer, transformers
from sgl_kernel import flash_ops  # noqa: F401  (FA3, put back from its .zst)
print("sglang", sglang.__version__, "sgl_kernel", sgl_kernel.__version__, "flashinfer", flashinfer.__version__,
      "transformers", transformers.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))
import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler  # noqa: E401
import sglang.srt.model_executor.model_runner, sglang.srt.models.qwen3_5, sglang.srt.layers.sampler  # noqa: E401
print("import ok")
IMPORTS
      [ "${PIPESTATUS[0]}" = 0 ] || exit 9
      touch "$STORE/installed"; exit 0
    fi
    "$VENV/bin/python" - <<'EOF' 2>&1 | tee "$OUT/import.txt"
import torch, vllm
from vllm.vllm_flash_attn import flash_attn_interface as fa
print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print("FA2", fa.FA2_AVAILABLE, fa.FA2_UNAVAILABLE_REASON, "| FA3", fa.FA3_AVAILABLE, fa.FA3_UNAVAILABLE_REASON)
import vllm._custom_ops, vllm.entrypoints.openai.api_server  # noqa: E401  (the CUDA extension and the server)
print("import ok")
EOF
    [ "${PIPESTATUS[0]}" = 0 ] || exit 9
    tok=$STORE/models/smollm2-tokenizer     # the random-weight folders' tokenizer (run_gpu.sh)
    [ -n "$gz" ] && { "$VENV/bin/python" benchmarks/vllm_gpu/models.py tokenizer "$gguf" "$tok" || exit 10; }
    touch "$STORE/installed"
    # SMOKE=0: no smoke server (the next step, run_gpu.sh, starts vLLM through engineroom anyway)
    [ "${SMOKE:-1}" = 0 ] && { say "installed; smoke test skipped (SMOKE=0)"; exit 0; }
    # smoke: a 2-layer random-weight Llama on SmolLM2's tokenizer, one completion
    "$VENV/bin/python" benchmarks/vllm_gpu/models.py folder tiny "$STORE/models/tiny" --tokenizer "$tok" || exit 10
    t0=$(date +%s)
    VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
      --model "$STORE/models/tiny" --load-format dummy --max-model-len 1024 --gpu-memory-utilization 0.3 \
      --host 127.0.0.1 --port 8011 > "$OUT/smoke_server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
      curl -sf http://127.0.0.1:8011/health >/dev/null && break
      kill -0 $pid 2>/dev/null || break
      sleep 1
    done
    ready=$(( $(date +%s) - t0 ))
    if curl -sf http://127.0.0.1:8011/v1/completions -H 'Content-Type: application/json' \
        -d '{"model": "'"$STORE/models/tiny"'", "prompt": "The capital of France is", "max_tokens": 8}' > "$OUT/smoke_completion.json"; then
      say "smoke: healthy after ${ready} s; completion: $(head -c 300 "$OUT/smoke_completion.json")"
    else
      say "smoke FAILED after ${ready} s: the server log's end:"; tail -30 "$OUT/smoke_server.log"
    fi
    kill -- -$pid 2>/dev/null || kill $pid 2>/dev/null; wait $pid 2>/dev/null
    "$VENV/bin/python" benchmarks/vllm_gpu/models.py figures "$OUT/smoke_server.log" > "$OUT/smoke_figures.json"
    touch "$STORE/installed"
    ;;
  engineroom)   # (re)install engineroom from this call's tree into the venv (its entry points register the engines)
    SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf "$SITE"/engineroom "$SITE"/engineroom-*.dist-info
    "$TORCH_PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$STORE/er-target" --upgrade . || exit 1
    cp -r "$STORE"/er-target/engineroom "$STORE"/er-target/engineroom-*.dist-info "$SITE/" && rm -rf "$STORE/er-target"
    printf '#!%s\nimport sys\nfrom engineroom.cli import main\nsys.exit(main())\n' "$VENV/bin/python" > "$VENV/bin/engineroom"
    chmod +x "$VENV/bin/engineroom"
    "$VENV/bin/engineroom" engines --json > "$OUT/engines.json" 2>&1 || { say "engineroom does not run:"; tail -5 "$OUT/engines.json"; exit 1; }
    ;;
  status)
    say "parts missing: $(missing_parts)"; ls -la "$STORE/parts" 2>/dev/null
    [ -f "$STORE/installed" ] && "$VENV/bin/python" -c "import $ENGINE; print('$ENGINE', $ENGINE.__version__)"
    ;;
  *) echo "usage: device.sh recv K | install | status"; exit 2 ;;
esac
