"""Client clock vs the engine's own decode rate, by token budget, on the real llama-server.

Why this exists: `bench` cross-checks its client-clock figures against llama.cpp's
``timings.predicted_per_second`` and warns above 5%. Which client figure to compare, and
over how short a decode window a 5% check is meaningful, are measured here, not assumed:

- ``decode_tps`` = tokens / (wall - TTFT), the issue's per-stream figure;
- ``inter_token_tps`` = (tokens - 1) / (last token - first token), llama.cpp's own
  definition ("the first token is free", tools/server/server-common.h);
- ``steady_inter_token_tps`` = the same from the end of a held start (first chunks held back
  and flushed together), which ``statistics.agreement`` compares;
- ``late first chunk`` = how much shorter the client's first-to-last window is than the
  engine's ``predicted_ms`` (the first token reached the client late, so the client window
  shrank and its rate reads high).

It starts SmolLM2-135M (the embedded default) through ``flows.start`` on a free port, runs
``run_bench`` at each budget (ignore_eos, so every request is full length), stops the server,
and writes one row per request to ``--out-json`` and a summary table to stdout. Run:

    .venv/bin/python benchmarks/bench_agreement.py [--budgets 24 64 128 256] [--runs 8] \
        [--out-json benchmarks/data/bench_agreement.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from engineroom import flows, launch
from engineroom.bench import BenchPlan, Workload, run_bench
from engineroom.bench.workloads import NARRATIVE_PROMPT
from engineroom.client import OpenAIClient
from engineroom.records import encoding
from engineroom.records import statistics as st
from engineroom.records.statistics import AGREEMENT_MIN_WINDOW_S, inter_token_tps


def measure(budgets: list[int], runs: int) -> list[dict]:
    rows: list[dict] = []
    state = flows.start("smollm2-135m", port=launch.free_port(), ctx=4096)
    try:
        info = flows.connect(state.url)
        with OpenAIClient(info.url, timeout=300) as client:
            for n in budgets:
                plan = BenchPlan(workloads=(Workload("narrative", NARRATIVE_PROMPT, n),), warmup=2,
                                 measured=runs, full_length=True)
                for r in run_bench(client, info, plan).records:
                    if r["warmup"] or r["error"]:
                        continue
                    t = st.engine_timings(r)
                    window = encoding.last_token_s(r) - encoding.ttft_s(r)
                    rows.append({
                        "budget": n, "tokens": r["completion_tokens"], "client_window_s": window,
                        "engine_window_s": (t.decode_ms or 0) / 1000 if t else 0, "decode_tps": st.decode_tps(r),
                        "inter_token_tps": inter_token_tps(r), "engine_tps": st.engine_decode_tps(r),
                        "engine_n": t.decode_tokens if t else None,
                        "steady_inter_token_tps": st.steady_inter_token_tps(r)[0],
                        "held_start": st.steady_inter_token_tps(r)[1],
                    })
    finally:
        launch.down()
    return rows


def _pct(a: float, b: float) -> float:
    return (a - b) / b * 100.0


def summarize(rows: list[dict]) -> list[str]:
    out = ["| max_tokens | requests | mean client window s | decode_tps vs engine, mean (worst) | "
           "inter-token vs engine, mean (worst) | inter-token vs engine, median | "
           "requests with a first chunk > 5 ms late (by ms) | held starts | "
           "steady inter-token vs engine, mean (worst) | steady, median (what bench checks) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in sorted({r["budget"] for r in rows}):
        rs = [r for r in rows if r["budget"] == n and r["engine_tps"]]
        d = [_pct(r["decode_tps"], r["engine_tps"]) for r in rs]
        i = [_pct(r["inter_token_tps"], r["engine_tps"]) for r in rs]
        steady = [_pct(r.get("steady_inter_token_tps") or r["inter_token_tps"], r["engine_tps"]) for r in rs]
        held = sum(1 for r in rs if r.get("held_start"))
        late = [(r["engine_window_s"] - r["client_window_s"]) * 1000 for r in rs
                if r["engine_window_s"] - r["client_window_s"] > 0.005]
        out.append(
            f"| {n} | {len(rs)} | {statistics.fmean(r['client_window_s'] for r in rs):.3f} | "
            f"{statistics.fmean(d):+.2f}% ({max(d, key=abs):+.2f}%) | "
            f"{statistics.fmean(i):+.2f}% ({max(i, key=abs):+.2f}%) | {statistics.median(i):+.3f}% | "
            f"{len(late)}" + (f" ({', '.join(f'{x:.0f}' for x in late)})" if late else "") + " | "
            f"{held} | {statistics.fmean(steady):+.2f}% ({max(steady, key=abs):+.2f}%) | "
            f"{statistics.median(steady):+.3f}% |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[24, 64, 128, 256])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--out-json", type=Path)
    ap.add_argument("--report", type=Path, help="re-print the table from a stored --out-json file")
    args = ap.parse_args()
    if args.report:
        data = json.loads(args.report.read_text())
        print("\n".join(summarize(data["rows"])))
        return 0
    t0 = time.time()
    rows = measure(args.budgets, args.runs)
    meta = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "machine": platform.machine(),
            "cpu_count": __import__("os").cpu_count(), "min_window_s": AGREEMENT_MIN_WINDOW_S,
            "seconds": round(time.time() - t0, 1), "argv": sys.argv[1:]}
    if args.out_json:
        args.out_json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print("\n".join(summarize(rows)))
    print(f"({meta['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
