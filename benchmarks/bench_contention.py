"""Calibrate bench's host checks on this machine: quick benches of SmolLM2-135M on a quiet machine
and with CPU hogs pinned to the engine's cores, each run's host contention (what other processes
took of the engine's and the client's cores), steal, decode CV and inter-token p99 / p50.

    python benchmarks/bench_contention.py --url http://127.0.0.1:PORT [--quiet 5] [--busy 2]
        [--max-tokens 64] [--runs 3] [--busy-max-tokens 16]

Run it under the shared lock on an otherwise idle machine (the quiet rows are the baseline).
Prints one JSON line per run and a markdown table at the end (benchmarks/bench_contention.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import psutil


def _engine_pid(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    return next(c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid)


def _run(url: str, max_tokens: int, runs: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "engineroom.cli", "bench", "--url", url, "--max-tokens",
                           str(max_tokens), "--runs", str(runs), "--warmup", "1", "--busy-ok", "--json"],
                          capture_output=True, text=True, timeout=900)
    if not proc.stdout.strip():
        raise SystemExit(f"bench said nothing on stdout (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    summary = json.loads(proc.stdout)["summary"]
    checks = {c["name"]: c for c in summary["integrity"]}
    out = {"status": summary["status"], "host_contention": checks["host_contention"]["detail"],
           "outliers": checks["inter_token_outliers"]["detail"]}
    for name, w in summary["workloads"].items():
        itl = w["inter_token_ms"]
        out[name] = {"decode_mean": w["decode_tps"]["mean"], "cv_pct": w["decode_tps"]["cv_pct"],
                     "itl_p50_ms": itl["p50"], "itl_p99_ms": itl["p99"],
                     "ratio": (itl["p99"] / itl["p50"]) if itl["p50"] else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--quiet", type=int, default=5)
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--busy-max-tokens", type=int, default=16, help="a hog slows decode ~50x: keep it short")
    a = ap.parse_args()
    rows = []
    for i in range(a.quiet):
        r = {"case": "quiet", "n": i + 1, **_run(a.url, a.max_tokens, a.runs)}
        print(json.dumps(r), flush=True)
        rows.append(r)
    cores = sorted(psutil.Process(_engine_pid(a.url)).cpu_affinity())
    for i in range(a.busy):
        hogs = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{c}}})\n"
                                                        "while True: pass"]) for c in cores[:1]]
        time.sleep(0.5)
        try:
            r = {"case": "one hog pinned to core " + str(cores[0]), "n": i + 1,
                 **_run(a.url, a.busy_max_tokens, a.runs)}
        finally:
            for h in hogs:
                h.kill()
        print(json.dumps(r), flush=True)
        rows.append(r)
    print("\n| case | status | host contention | narrative decode tok/s (CV%) | ITL p99/p50 narrative, code |")
    print("|---|---|---|---:|---:|")
    for r in rows:
        n, c = r.get("narrative", {}), r.get("code", {})
        ratio = " / ".join(f"{x['ratio']:.1f}" if x.get("ratio") else "n/a" for x in (n, c))
        print(f"| {r['case']} {r['n']} | {r['status']} | {r['host_contention'][:90]} | "
              f"{n.get('decode_mean') or 0:.1f} ({n.get('cv_pct') or 0:.1f}%) | {ratio} |")


if __name__ == "__main__":
    main()
