"""engineroom's bench on a CUDA llama-server next to llama-bench, and where the server path loses speed.

Run on the lent GPU machine through ``benchmarks/gpu_bench.sh`` (it builds llama.cpp for sm_90 and
calls this script); ``--report`` turns the raw results into benchmarks/gpu_bench.md's tables here.

Per model (random-weight Q4_0 GGUFs written by engineroom.synth with SmolLM2's tokenizer):

1. llama-bench: decode of N tokens from an empty context (the number the server is compared
   with), and pp512 / tg64 at depths 0, 1K, 10K and 32K;
2. llama-server, 1 slot: the same N tokens through engineroom's bench with four request shapes,
   so the gap to llama-bench is split by cause rather than guessed:
   - greedy, not streamed (the engine's own timing): the server's decode loop with the least
     sampling and no per-token HTTP event;
   - greedy, streamed: + one SSE event per token (detokenised, sent);
   - engineroom's default sampler (temperature 0.6, top-p 0.95, top-k 20) and llama.cpp's own
     default chain (0.8 / 0.95 / 40, min-p 0.05), streamed: + CPU sampling over the full vocabulary;
   - the same default sampler on a server started with ``-bs`` (backend sampling: the sampler on
     the GPU), where the build has it;
   each with the client's clock beside the engine's (HTTP and the client's parsing);
3. ``engineroom bench depth`` at 1K, 10K, 32K (integrity checklist, roofline share, NVML);
4. llama-server with 16 slots: ``engineroom bench concurrency`` at N = 1, 2, 4, 8, 16.

Commands:
    python3 benchmarks/gpu_bench.py synth --out DIR                  # (device) write the GGUFs
    python3 benchmarks/gpu_bench.py run --out DIR --models 1b,8b     # (device) measure
    .venv/bin/python benchmarks/gpu_bench.py --report benchmarks/data/gpu_bench   # (here) tables
    .venv/bin/python benchmarks/gpu_bench.py run --out /tmp/gb --models tiny --cpu  # (here) a dry run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

QUANT = "Q4_0"
# decode tokens per request in the server-path comparison (and llama-bench's -n)
DECODE = {"tiny": 256, "1b": 1024, "8b": 1024, "27b": 512}
DEPTHS = {"tiny": "256,1024", "1b": "1024,10240,32768", "8b": "1024,10240,32768", "27b": "1024,10240,32768"}
STREAMS = (1, 2, 4, 8, 16)


def _arch(name: str):
    from engineroom.arch import LayerKind
    from engineroom.catalog.convert import arch_from_block
    from engineroom.catalog.load import find_model, load_catalog
    from engineroom.synthshapes import SHAPES, qwen36_27b

    if name == "27b":
        return qwen36_27b(64)
    if name == "tiny":
        return SHAPES["dense-s"]
    a8 = arch_from_block(find_model(load_catalog(), "llama-3.1-8b").architecture, "llama-3.1-8b")
    if name == "8b":
        return a8
    if name == "1b":   # Llama-3.2-1B's shape: 16 layers, 2048 wide, 32 q / 8 kv heads of 64, ff 8192
        return replace(a8, name="llama-1b-shape", n_layers=16, hidden_size=2048, n_heads=32, n_kv_heads=8,
                       head_dim=64, intermediate_size=8192, layer_kinds=(LayerKind.FULL,) * 16,
                       param_count=None)
    raise SystemExit(f"unknown model {name!r} (tiny, 1b, 8b, 27b)")


def gguf_path(out: Path, name: str) -> Path:
    return out / f"{name}-{QUANT}.gguf"


def _write(args: tuple[str, str]) -> tuple[str, float, int]:
    from engineroom.synth import write_synthetic_gguf

    name, out = args
    t = time.time()
    path = write_synthetic_gguf(_arch(name), QUANT, gguf_path(Path(out), name))
    return name, time.time() - t, path.stat().st_size


def synth(out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    todo = [(n, str(out)) for n in names if not gguf_path(out, n).exists()]
    with ProcessPoolExecutor(max_workers=max(1, len(todo))) as pool:
        rows = list(pool.map(_write, todo))
    info = {n: {"seconds": round(s, 1), "bytes": b} for n, s, b in rows}
    (out / "synth.json").write_text(json.dumps(info, indent=1))
    print("synth:", info, flush=True)


# ---------------------------------------------------------------------------------------------
def _cli(*args: str, timeout: float = 600) -> tuple[int, Any, str]:
    t = time.time()
    proc = subprocess.run(["engineroom", *args], capture_output=True, text=True, timeout=timeout)
    took = time.time() - t
    print(f"engineroom {' '.join(args)}: rc {proc.returncode} in {took:.0f} s", flush=True)
    try:
        data = json.loads(proc.stdout) if proc.stdout.strip().startswith(("{", "[")) else None
    except ValueError:
        data = None
    return proc.returncode, data, proc.stderr[-3000:]


def _bindir() -> Path:
    rc, data, err = _cli("engines", "--json")
    for row in data or []:
        if row.get("engine") == "llama.cpp" and row.get("path"):
            return Path(row["path"]).parent
    raise SystemExit(f"no llama.cpp build found: {err}")


def llama_bench(bindir: Path, model: Path, args: list[str], log: Path, gpu: bool) -> list[dict]:
    from cpu_speed import llama_bench_beside  # beside this script: builds it where the install did not

    bench = llama_bench_beside(bindir / "llama-server")
    cmd = [str(bench), "-m", str(model), *(["-ngl", "99", "-fa", "1"] if gpu else ["-t", "2"]), *args, "-o", "json"]
    t = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "LD_LIBRARY_PATH": f"{bindir}:{os.environ.get('LD_LIBRARY_PATH', '')}"})
    log.write_text(" ".join(cmd) + "\n" + proc.stderr[-20000:] + "\n---\n" + proc.stdout)
    print(f"llama-bench {' '.join(args)}: rc {proc.returncode} in {time.time() - t:.0f} s", flush=True)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return [{"error": proc.stderr[-2000:]}]


def _bench_in_process(tokens: int, sampler: Any, runs: int = 3) -> dict:
    """flows.bench with one workload (the narrative essay), ``tokens`` out, full length."""
    from engineroom import flows
    from engineroom.bench import BenchPlan
    from engineroom.bench.workloads import NARRATIVE
    from engineroom.store import Store

    info = flows.connect(None)
    plan = BenchPlan(workloads=(NARRATIVE.with_max_tokens(tokens),), warmup=1, measured=runs, sampler=sampler,
                     full_length=True)
    with Store() as store:
        outcome = flows.bench(info, store, plan)
    w = outcome.summary["workloads"]["narrative"]
    return {"run_id": outcome.run_id, "status": outcome.summary.get("status"),
            "client_decode_tps": w["decode_tps"]["mean"],
            "engine_decode_tps": (w.get("engine_decode_tps") or {}).get("mean"),
            "client_inter_token_tps": (w.get("agreement") or {}).get("client_inter_token_tps"),
            "agreement_pct": (w.get("agreement") or {}).get("diff_pct"), "ttft_s": w["ttft_s"]["mean"],
            "completion_tokens": w["completion_tokens"]["mean"], "cv_pct": w["decode_tps"]["cv_pct"]}


def _non_streamed(tokens: int, runs: int = 3) -> dict:
    """Greedy, ``stream: false``: the engine's own decode timing with no per-token HTTP event."""
    import httpx

    from engineroom import launch
    from engineroom.bench.workloads import NARRATIVE

    url = launch.managed_url()
    out = []
    for i in range(runs + 1):
        body = {"messages": NARRATIVE.with_max_tokens(tokens).messages(), "max_tokens": tokens, "stream": False,
                "temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "seed": 1234, "ignore_eos": True}
        t = time.perf_counter()
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
        wall = time.perf_counter() - t
        if i == 0:
            continue        # warm-up
        timings = r.get("timings") or {}
        out.append({"engine_decode_tps": timings.get("predicted_per_second"), "predicted_n": timings.get("predicted_n"),
                    "wall_s": wall, "completion_tokens": (r.get("usage") or {}).get("completion_tokens")})
    tps = [o["engine_decode_tps"] for o in out if o["engine_decode_tps"]]
    return {"requests": out, "engine_decode_tps": sum(tps) / len(tps) if tps else None}


def _up(model: Path, *args: str) -> bool:
    ours, engine_args = (args[:args.index("--")], args[args.index("--"):]) if "--" in args else (args, ())
    rc, data, err = _cli("up", str(model), "--port", "0", *ours, "--json", *engine_args, timeout=600)
    if rc != 0:
        print("up failed:", err[-1500:], flush=True)
    return rc == 0


def run_model(name: str, out: Path, deadline: float, gpu: bool) -> dict:
    from engineroom.bench.runner import Sampler
    from engineroom.bench.suites.specs import GREEDY

    model = gguf_path(out, name)
    res: dict[str, Any] = {"model": name, "file_bytes": model.stat().st_size, "skipped": []}
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    n = DECODE[name]
    bindir = _bindir()

    def left(need: float, what: str) -> bool:
        if time.time() + need > deadline:
            res["skipped"].append(f"{what}: {deadline - time.time():.0f} s left, needs about {need:.0f}")
            print("deadline: skip", what, flush=True)
            return False
        return True

    if os.environ.get("GPU_BENCH_ONLY") == "bs":      # a later call: backend sampling alone
        res["server_path"] = {}
        if _up(model, "--ctx", "40960", "--parallel", "1", "--", "-bs"):
            res["server_path"]["engineroom default (0.6 / 0.95 / 20), streamed, -bs (backend sampling)"] = \
                _bench_in_process(n, Sampler())
            _cli("down")
        return res
    res["llama_bench_tg"] = llama_bench(bindir, model, ["-p", "0", "-n", str(n), "-r", "3"],
                                        logs / f"{name}-lb-tg.log", gpu)
    if left(60, "llama-bench at depth"):
        res["llama_bench_depth"] = llama_bench(bindir, model,
                                               ["-p", "512", "-n", "64", "-d", f"0,{DEPTHS[name]}", "-r", "2"],
                                               logs / f"{name}-lb-depth.log", gpu)
    threads = [] if gpu else ["--threads", "2"]
    if _up(model, "--ctx", "40960" if gpu else "4096", "--parallel", "1", *threads):
        paths = {"engineroom default (0.6 / 0.95 / 20)": Sampler(),
                 "llama.cpp default chain (0.8 / 0.95 / 40, min-p 0.05)": Sampler(temperature=0.8, top_p=0.95, top_k=40,
                                                                                    min_p=0.05),
                 "greedy (top-k 1)": GREEDY}
        res["server_path"] = {}
        res["server_path"]["greedy, not streamed"] = _non_streamed(n)
        for label, sampler in paths.items():
            if left(45, f"bench {label}"):
                res["server_path"][f"{label}, streamed"] = _bench_in_process(n, sampler)
        if left(120, "depth suite"):
            rc, data, err = _cli("bench", "depth", "--depths", DEPTHS[name], "--json",
                                 timeout=max(60, deadline - time.time()))
            res["depth_suite"] = {"rc": rc, "result": data, "stderr": err if rc else ""}
        _cli("down")
    if gpu and left(60, "backend sampling") and _up(model, "--ctx", "40960", "--parallel", "1", "--", "-bs"):
        res["server_path"]["engineroom default (0.6 / 0.95 / 20), streamed, -bs (backend sampling)"] = \
            _bench_in_process(n, Sampler())
        _cli("down")
    slots = 16 if gpu else 4
    per_slot = "4096" if gpu else "1024"
    if left(90, "concurrency") and _up(model, "--ctx", per_slot, "--parallel", str(slots), *threads):
        res["concurrency"] = {}
        for streams in STREAMS:
            if streams > slots or not left(40, f"concurrency N={streams}"):
                continue
            rc, data, err = _cli("bench", "concurrency", "--streams", str(streams),
                                 "--prompt-tokens", "1024" if gpu else "512", "--max-tokens", "256",
                                 "--warmup", "1", "--runs", "2", "--json", timeout=300)
            res["concurrency"][str(streams)] = {"rc": rc, "result": data, "stderr": err if rc else ""}
        _cli("down")
    return res


def run(out: Path, names: list[str], deadline_s: float, gpu: bool) -> None:
    deadline = time.time() + deadline_s
    results_f = out / "results.json"
    results = json.loads(results_f.read_text()) if results_f.exists() else {}
    for name in names:
        if not gguf_path(out, name).exists():
            synth(out, [name])
        t = time.time()
        try:
            got = run_model(name, out, deadline, gpu)
            if os.environ.get("GPU_BENCH_ONLY") and name in results:
                results[name].setdefault("server_path", {}).update(got.get("server_path") or {})
            else:
                results[name] = got
        finally:
            _cli("down")
        results[name]["seconds"] = round(time.time() - t, 1)
        results_f.write_text(json.dumps(results, indent=1))
    from engineroom import paths

    rc, data, _ = _cli("runs", "--json", "-n", "500")
    (out / "runs.json").write_text(json.dumps(data, indent=1))
    if paths.db_path().exists():
        shutil.copy(paths.db_path(), out / "store.sqlite")


# ---------------------------------------------------------------------------------------------
def _lb(rows: list[dict], *, n_gen: int | None = None, n_prompt: int | None = None, depth: int = 0) -> float | None:
    for r in rows or []:
        if (n_gen is None or r.get("n_gen") == n_gen) and (n_prompt is None or r.get("n_prompt") == n_prompt) \
                and int(r.get("n_depth", 0)) == depth and "avg_ts" in r:
            return float(r["avg_ts"])
    return None


def _m(d: Any, key: str) -> float | None:
    v = (d or {}).get(key)
    return v.get("mean") if isinstance(v, dict) else v


def _f(v: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def _server_path(name: str, r: dict) -> list[str]:
    n = DECODE.get(name, 0)
    lb = _lb(r.get("llama_bench_tg"), n_gen=n, n_prompt=0)
    lines = [f"llama-bench tg{n} (`-ngl 99 -fa 1 -p 0 -n {n} -r 3`): **{_f(lb)} tok/s**", "",
             "| request shape (1 slot, narrative prompt, full length) | engine decode tok/s | client tok/s "
             "| client vs engine | engine vs llama-bench |", "|---|---:|---:|---:|---:|"]
    for label, p in (r.get("server_path") or {}).items():
        eng = p.get("engine_decode_tps")
        cli = p.get("client_inter_token_tps")
        agree = p.get("agreement_pct")
        lines.append(f"| {label} | {_f(eng)} | {_f(cli)} | {_f(agree, '{:+.2f}%')} | "
                     f"{_f((eng / lb - 1) * 100 if eng and lb else None, '{:+.1f}%')} |")
    return lines + [""]


def _depth(name: str, r: dict) -> list[str]:
    s = ((r.get("depth_suite") or {}).get("result") or {}).get("summary") or {}
    lb = r.get("llama_bench_depth") or []
    lines = ["| depth | TTFT s | engine prefill s | TTFT − engine prefill s | prefill tok/s engine "
             "| llama-bench pp512 @ depth | decode tok/s client / engine | llama-bench tg64 @ depth "
             "| roofline % | client vs engine |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for g, v in (s.get("groups") or {}).items():
        d = int(g.split()[1])
        ttft, pt, ep = _m(v, "ttft_s"), _m(v, "prompt_tokens"), _m(v, "engine_prompt_tps")
        pre = pt / ep if pt and ep else None
        lines.append(f"| {d:,} | {_f(ttft, '{:.3f}')} | {_f(pre, '{:.3f}')} | "
                     f"{_f(ttft - pre if ttft and pre else None, '{:.3f}')} | {_f(ep, '{:,.0f}')} | "
                     f"{_f(_lb(lb, n_prompt=512, n_gen=0, depth=d), '{:,.0f}')} | "
                     f"{_f(_m(v, 'decode_tps'))} / {_f(_m(v, 'engine_decode_tps'))} | "
                     f"{_f(_lb(lb, n_prompt=0, n_gen=64, depth=d))} | {_f((v.get('roofline') or {}).get('pct'))} | "
                     f"{_f((v.get('agreement') or {}).get('diff_pct'), '{:+.2f}%')} |")
    bad = [f"{c['name']} {c['status']}: {c['detail']}" for c in s.get("integrity") or [] if c["status"] != "PASS"]
    said = f" ({'; '.join(bad)})" if bad else ", every check PASS"
    return lines + ["", f"Integrity: {s.get('status', '—')}{said}", ""]


def _concurrency(name: str, r: dict) -> list[str]:
    lines = ["| N | per-stream decode tok/s (CV) | aggregate tok/s | TTFT p50 / p95 s (from the schedule) "
             "| inter-token p50 / p99 ms | client vs engine | status |", "|---:|---:|---:|---:|---:|---:|---|"]
    for n, v in (r.get("concurrency") or {}).items():
        s = (v.get("result") or {}).get("summary") or {}
        g = (s.get("groups") or {}).get(f"N={n}") or {}
        if not g:
            lines.append(f"| {n} | — | — | — | — | — | not summarised (rc {v.get('rc')}) |")
            continue
        dec = g.get("decode_tps") or {}
        ttft = g.get("ttft_from_schedule_s") or {}
        itl = g.get("inter_token_ms") or {}
        bad = [f"{c['name']}: {c['detail']}" for c in s.get("integrity") or [] if c["status"] == "FAIL"]
        lines.append(f"| {n} | {_f(dec.get('mean'))} ({_f(dec.get('cv_pct'), '{:.0f}%')}) | "
                     f"{_f(_m(g, 'aggregate_tps'), '{:,.0f}')} | {_f(ttft.get('p50'), '{:.2f}')} / "
                     f"{_f(ttft.get('p95'), '{:.2f}')} | {_f(itl.get('p50'))} / {_f(itl.get('p99'))} | "
                     f"{_f((g.get('agreement') or {}).get('diff_pct'), '{:+.2f}%')} | "
                     f"{s.get('status')}{' (' + '; '.join(bad) + ')' if bad else ''} |")
    return lines + [""]


def report(folder: Path) -> str:
    res = json.loads((folder / "results.json").read_text())
    lines: list[str] = []
    for name, r in res.items():
        lines += [f"### {name}: {r['file_bytes'] / 1e9:.2f} GB Q4_0", "", "Server path:", ""]
        lines += _server_path(name, r)
        lines += ["`engineroom bench depth` (1 slot, `--ctx 40960`) beside llama-bench at the same depths:", ""]
        lines += _depth(name, r)
        lines += ["`engineroom bench concurrency --streams N --prompt-tokens 1024 --max-tokens 256` "
                  "(16 slots, `--ctx 4096` each, unified KV):", ""]
        lines += _concurrency(name, r)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", nargs="?", choices=("synth", "run"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/gpu-bench"))
    ap.add_argument("--models", default="1b,8b,27b")
    ap.add_argument("--deadline-s", type=float, default=540)
    ap.add_argument("--cpu", action="store_true", help="a dry run on this machine's CPU build")
    ap.add_argument("--report", type=Path, help="a folder holding results.json: print the tables")
    a = ap.parse_args()
    if a.report:
        print(report(a.report))
        return 0
    names = [m.strip() for m in a.models.split(",") if m.strip()]
    if a.stage == "synth":
        synth(a.out, names)
    elif a.stage == "run":
        a.out.mkdir(parents=True, exist_ok=True)
        run(a.out.resolve(), names, a.deadline_s, gpu=not a.cpu)
    else:
        ap.error("give a stage (synth, run) or --report")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
