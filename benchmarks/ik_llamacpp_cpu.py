"""ik_llama.cpp vs llama.cpp on this CPU, through engineroom's own CLI: build, cold start,
verify, bench, and fit's memory prediction against what each server logged.

    .venv/bin/python benchmarks/ik_llamacpp_cpu.py [--out benchmarks/data/ik_llamacpp/run.json]

Both engines serve the same model file with the same settings, one after the other, in a state
folder of this script's own (a managed server of the user's is left alone). The memory shapes
launch the fork at a few context / slot / KV-type settings and keep fit's rows for each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
SHAPES = [  # (ctx per slot, slots, kv type)
    (512, 1, "f16"), (2048, 2, "f16"), (4096, 1, "f16"), (2048, 1, "q8_0"), (2048, 1, "q6_0"),
]


def cli(*args: str, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engineroom.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200", **env})


def up(engine: str, env: dict, ctx: int, slots: int, kv: str = "f16") -> tuple[dict, float]:
    t0 = time.monotonic()
    proc = cli("up", MODEL, "--engine", engine, "--ctx", str(ctx), "--parallel", str(slots), "--threads", "2",
               "--kv", kv, "--port", "0", "--json", env=env, timeout=600)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"up {engine} failed: {proc.stderr[-800:]}")
    return json.loads(proc.stdout), took


def rows(state: dict) -> list[dict]:
    return [{k: r.get(k) for k in ("component", "predicted_bytes", "measured_bytes", "error_pct")}
            for r in state["memory"]["rows"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "data" / "ik_llamacpp" / "run.json"))
    ap.add_argument("--runs", default="5")
    ap.add_argument("--max-tokens", default="64")
    a = ap.parse_args()
    from engineroom.engines import ikllamacpp, llamacpp

    env = {"ENGINEROOM_STATE_DIR": tempfile.mkdtemp(prefix="ik-bench-state-")}
    builds = ikllamacpp.installed()
    out: dict = {"model": MODEL, "host": os.uname().nodename, "cpus": os.cpu_count(),
                 "ik_build": {k: builds[0].get(k) for k in ("tag", "build_seconds", "first_build_seconds", "jobs",
                                                            "cmake_options", "built_at")} if builds else None,
                 "engines": {}, "shapes": []}
    for engine, mod in (("ik_llama.cpp", ikllamacpp), ("llama.cpp", llamacpp)):
        binary = mod.find_binary()
        state, cold = up(engine, env, 2048, 1)
        try:
            ver = cli("verify", "--json", env=env)
            checks = {r["name"]: r["status"] for r in json.loads(ver.stdout)["results"]}
            bench = cli("bench", "--warmup", "1", "--runs", a.runs, "--max-tokens", a.max_tokens, "--json",
                        env=env)
            bench_out = json.loads(bench.stdout) if bench.returncode == 0 else {"error": bench.stderr[-800:]}
        finally:
            cli("down", env=env)
        out["engines"][engine] = {"version": mod.binary_version(binary), "argv": state["argv"][1:],
                                  "cold_start_s": round(cold, 2), "verify": checks, "bench": bench_out,
                                  "memory": rows(state)}
        print(engine, "cold", round(cold, 1), "s;", checks, flush=True)
    for ctx, slots, kv in SHAPES:
        state, cold = up("ik_llama.cpp", env, ctx, slots, kv)
        cli("down", env=env)
        out["shapes"].append({"ctx": ctx, "slots": slots, "kv": kv, "cold_start_s": round(cold, 2),
                              "memory": rows(state)})
        print("shape", ctx, slots, kv, rows(state), flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
