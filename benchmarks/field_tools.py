"""Same numbers as the field's tools: engineroom's depth suite vs llama-benchy and llama-bench.

Why this exists (issue 9, "Performance bars"): users check a bench against the tools they
already trust. This runs, on one real llama-server (the installed CPU build, SmolLM2-135M,
started here on 127.0.0.1 with ``-c`` 8192 ``-np 1`` ``-t`` THREADS and stopped at the end):

- **engineroom**: ``engineroom bench depth --url URL --depths D --json`` (1 warm-up + 3
  measured salted haystacks of D tokens sized by the server's ``/tokenize``, 64 tokens out,
  greedy, ``ignore_eos``); prefill = prompt tokens / TTFT on the client clock, decode = the
  steady inter-token rate, each beside the engine's own ``timings`` (``prompt_per_second``,
  ``predicted_per_second``), medians over the measured requests; with its own
  ``ENGINEROOM_STATE_DIR`` / ``ENGINEROOM_DATA_DIR`` (a temporary folder);
- **llama-benchy 0.4.0** (its own venv): ``--depth D-P --pp P --tg 64 --exact-tg --runs 3``, so its
  prompt (D-P tokens of context as a system message + P tokens of user prompt, its template
  overhead subtracted by its warm-up "adapt prompt" step) is the same size as engineroom's at
  depth D; its corpus is a local text (the hub and Project Gutenberg are unreachable: the text of
  Python's ``pydoc_data.topics``, seeded into its cache under a private ``HOME``), its tokenizer
  the local folder ``hf_tokenizer.py`` writes from the GGUF;
- **llama-bench** on the same GGUF and threads: ``-p D -n 0`` (prefill of D tokens from an
  empty context) and ``-p 0 -n 64 -d D`` (64-token decode with D tokens already in the KV
  cache), ``-r 3``, flash attention as the server's (``auto``).

Interleaved: per repetition, per depth, the three in a rotated order, waiting (bounded) for
the machine's other load to settle before each, and recording it (the machine is shared).

    python3.11 -m venv /tmp/benchy-venv && /tmp/benchy-venv/bin/pip install llama-benchy==0.4.0
    .venv/bin/python benchmarks/field_tools.py --depths 512 2048 --threads 1 --reps 2 \
        --out-json benchmarks/data/field_tools.json
    .venv/bin/python benchmarks/field_tools.py --report benchmarks/data/field_tools.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TG = 64
BOOK_URL = "local://pydoc_data.topics"      # a name only: llama-benchy finds the text in its cache


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def busy_cores(seconds: float = 1.0) -> float:
    def snap() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        return sum(v) - v[3] - v[4], sum(v)
    b0, t0 = snap()
    time.sleep(seconds)
    b1, t1 = snap()
    return (b1 - b0) / max(1, t1 - t0) * (os.cpu_count() or 1)


def wait_quiet(limit: float, max_wait_s: float) -> tuple[float, float]:
    """Wait at most max_wait_s for the machine's busy cores (all of it: the engine uses every core) to
    drop to ``limit``; the seconds waited and the last second's busy cores."""
    t0 = time.monotonic()
    while True:
        busy = busy_cores()
        if busy <= limit or time.monotonic() - t0 >= max_wait_s:
            return round(time.monotonic() - t0, 1), round(busy, 2)


# ------------------------------------------------------------------------------------------ the server
def binaries() -> tuple[Path, Path, dict[str, str]]:
    from engineroom.engines.llamacpp import find_binary, soname_env

    b = find_binary()
    return b.path, b.path.parent / "llama-bench", {**os.environ, **soname_env(b.path.parent)}


def start_server(server: Path, env: dict[str, str], gguf: Path, port: int, threads: int, ctx: int,
                 log: Path) -> subprocess.Popen:
    cmd = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx), "-np", "1",
           "-t", str(threads), "-tb", str(threads), "--metrics"]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama-server did not become healthy in 120 s")


# ------------------------------------------------------------------------------------------ the tools
def run_engineroom(url: str, depth: int, runs: int, state: Path) -> dict[str, Any]:
    env = {**os.environ, "ENGINEROOM_STATE_DIR": str(state / "state"), "ENGINEROOM_DATA_DIR": str(state / "data")}
    cmd = [str(ROOT / ".venv" / "bin" / "engineroom"), "bench", "depth", "--url", url,
           "--depths", str(depth), "--runs", str(runs), "--warmup", "1", "--max-tokens", str(TG), "--json"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out: dict[str, Any] = {"tool": "engineroom", "cmd": " ".join(cmd[1:]), "rc": p.returncode,
                           "seconds": round(time.monotonic() - t0, 1)}
    try:        # an INVALID run (a failed integrity check) still prints its summary, with a non-zero exit
        data = json.loads(p.stdout)
    except ValueError:
        out["error"] = f"stdout: {p.stdout[-1000:]}\nstderr: {p.stderr[-1000:]}"
        return out
    return with_summary(out, data.get("summary") or data)


def with_summary(out: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    out["raw"] = {"summary": summary}
    out["status"] = summary.get("status")
    out["integrity"] = [(c.get("name"), c.get("status"), c.get("detail")) for c in summary.get("integrity") or []]
    out["group"] = next(iter((summary.get("groups") or {}).values()), {})
    out["rc"] = 0
    return out


def recover_engineroom(results_db: Path) -> dict[str, Any]:
    """The summary of the one bench run stored in an engineroom results database (its own data folder)."""
    import sqlite3

    with sqlite3.connect(results_db) as db:
        summary = json.loads(db.execute("select summary from runs order by id desc limit 1").fetchone()[0])
    return with_summary({"tool": "engineroom", "recovered_from": str(results_db)}, summary)


def benchy_home(base: Path) -> Path:
    """A HOME for llama-benchy whose cache already holds the corpus under BOOK_URL's hash."""
    import pydoc_data.topics as topics

    home = base / "benchy-home"
    cache = home / ".cache" / "llama-benchy"
    cache.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    (cache / f"{hashlib.md5(BOOK_URL.encode()).hexdigest()}.txt").write_text(text)
    return home


def run_benchy(exe: str, url: str, depth: int, pp: int, runs: int, tokenizer: Path, home: Path, work: Path,
               extra_body: str | None = None) -> dict[str, Any]:
    result = work / f"benchy-{depth}-{time.monotonic_ns()}.json"
    cmd = [exe, "--base-url", f"{url}/v1", "--model", "smollm2", "--tokenizer", str(tokenizer), "--pp", str(pp),
           "--tg", str(TG), "--exact-tg", "--depth", str(depth - pp), "--runs", str(runs), "--latency-mode", "api",
           "--skip-coherence", "--book-url", BOOK_URL, "--format", "json", "--save-result", str(result)]
    if extra_body:
        cmd += ["--extra-body", extra_body]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HOME": str(home)}, timeout=600)
    out: dict[str, Any] = {"tool": "llama-benchy" + (" (greedy)" if extra_body else ""),
                           "cmd": " ".join(["llama-benchy", *cmd[1:]]), "rc": p.returncode,
                           "seconds": round(time.monotonic() - t0, 1), "log": p.stdout[-3000:]}
    if p.returncode != 0 or not result.exists():
        out["error"] = (p.stderr or p.stdout)[-1500:]
        return out
    out["raw"] = json.loads(result.read_text())
    return out


def run_llama_bench(bench: Path, env: dict[str, str], gguf: Path, depth: int, threads: int,
                    reps: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for args in (["-p", str(depth), "-n", "0"], ["-p", "0", "-n", str(TG), "-d", str(depth)]):
        cmd = [str(bench), "-m", str(gguf), "-t", str(threads), "-r", str(reps), "-o", "json", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if p.returncode != 0:
            return {"tool": "llama-bench", "rc": p.returncode, "error": p.stderr[-1500:]}
        rows += json.loads(p.stdout)
    cmd = f"llama-bench -m GGUF -t {threads} -r {reps} -o json {{-p {depth} -n 0 | -p 0 -n {TG} -d {depth}}}"
    return {"tool": "llama-bench", "rc": 0, "cmd": cmd, "seconds": round(time.monotonic() - t0, 1), "raw": rows}


# ------------------------------------------------------------------------------------------ figures
def _med(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """One tool's run at one depth -> prompt tokens, prefill t/s, decode t/s (and the engine's own)."""
    tool = run["tool"]
    if run.get("rc") != 0 or "raw" not in run:
        return {"tool": tool, "failed": True}
    if tool == "engineroom":
        g = run["group"]

        def val(key: str) -> float | None:
            v = g.get(key)
            if isinstance(v, dict):
                return v.get("median", v.get("mean"))
            return v

        agree = g.get("agreement") or {}
        # decode_tps: the card's per-stream figure, tokens / (wall - TTFT); inter_token_tps: the steady
        # inter-token rate (n - 1) / (last - first), median over requests (llama.cpp's and llama-benchy's definition)
        return {"tool": tool, "prompt_tokens": val("prompt_tokens"), "prefill_tps": val("prefill_tps"),
                "engine_prefill_tps": val("engine_prompt_tps"), "decode_tps": agree.get("client_inter_token_tps"),
                "card_decode_tps": val("decode_tps"),
                "engine_decode_tps": agree.get("engine_decode_tps") or val("engine_decode_tps"),
                "ttft_ms": (val("ttft_s") or 0) * 1000 or None, "depth_mid_decode": val("depth"),
                "n_kept": g.get("n_kept"), "n_discarded": g.get("n_discarded"), "sized_by": g.get("sized_by")}
    if tool.startswith("llama-benchy"):
        b = next(iter(run["raw"].get("benchmarks") or []), {})

        def mean(key: str) -> float | None:
            v = b.get(key)
            return v.get("mean") if isinstance(v, dict) else v

        # pp_throughput: usage prompt tokens / (time to the first chunk - the /models round trip);
        # tg_throughput: tokens after the first / (last token - first token), client clock
        return {"tool": tool, "prompt_tokens": (b.get("context_size") or 0) + (b.get("prompt_size") or 0) or None,
                "prefill_tps": mean("pp_throughput"), "decode_tps": mean("tg_throughput"),
                "ttft_ms": mean("e2e_ttft"), "est_ppt_ms": mean("est_ppt"), "latency_ms": run["raw"].get("latency_ms"),
                "context_size": b.get("context_size"), "prompt_size": b.get("prompt_size")}
    if tool == "llama-bench":
        pp = [r for r in run["raw"] if r.get("n_prompt") and not r.get("n_gen")]
        tg = [r for r in run["raw"] if r.get("n_gen")]
        return {"tool": tool, "prompt_tokens": pp[0]["n_prompt"] if pp else None,
                "prefill_tps": pp[0]["avg_ts"] if pp else None, "prefill_sd": pp[0]["stddev_ts"] if pp else None,
                "decode_tps": tg[0]["avg_ts"] if tg else None, "decode_sd": tg[0]["stddev_ts"] if tg else None,
                "flash_attn": (tg or pp or [{}])[0].get("flash_attn")}
    return {"tool": tool}


# ------------------------------------------------------------------------------------------ the run
def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from hf_tokenizer import write_tokenizer_folder

    from engineroom import models

    gguf = Path(args.gguf) if args.gguf else Path(models.pull("smollm2-135m"))
    work = Path(tempfile.mkdtemp(prefix="field-tools-"))
    tokenizer = write_tokenizer_folder(gguf, work / "tokenizer")
    home = benchy_home(work)
    server_bin, bench_bin, env = binaries()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(server_bin, env, gguf, port, args.threads, args.ctx, work / "llama-server.log")
    info: dict[str, Any] = {"server_cmd": f"llama-server -m GGUF --host 127.0.0.1 --port PORT -c {args.ctx} -np 1 "
                                          f"-t {args.threads} -tb {args.threads} --metrics", "gguf": gguf.name}
    try:
        with urllib.request.urlopen(f"{url}/props", timeout=10) as r:
            props = json.loads(r.read())
        info["build_info"] = props.get("build_info")
        info["n_ctx"] = (props.get("default_generation_settings") or {}).get("n_ctx")
        rows: list[dict[str, Any]] = []
        tools = ["engineroom", "llama-benchy", "llama-bench"]
        tools += ["llama-benchy (greedy)"] if args.benchy_greedy else []
        for rep in range(args.reps):
            for depth in args.depths:
                for tool in tools:
                    waited, busy = wait_quiet(args.quiet_load, args.quiet_wait_s)
                    before = busy_cores(0.5)
                    print(f"rep{rep} depth {depth} {tool} (waited {waited} s; busy {busy} cores) ...", flush=True)
                    if tool == "engineroom":
                        run = run_engineroom(url, depth, args.runs, work / f"er-{rep}-{depth}")
                    elif tool.startswith("llama-benchy"):
                        greedy = "temperature=0,top_k=1" if "greedy" in tool else None
                        run = run_benchy(args.benchy, url, depth, args.pp, args.runs, tokenizer, home, work, greedy)
                    else:
                        run = run_llama_bench(bench_bin, env, gguf, depth, args.threads, args.runs)
                    run.update(rep=rep, depth=depth, quiet_waited_s=waited, busy_before=busy,
                               busy_before_start=round(before, 2), loadavg=os.getloadavg())
                    fig = figures(run)
                    run["figures"] = fig
                    rows.append(run)
                    print("  " + json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in fig.items()}),
                          flush=True)
                tools = tools[1:] + tools[:1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        info["server_log_tail"] = (work / "llama-server.log").read_text()[-4000:]
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return rows, info


# ------------------------------------------------------------------------------------------ tables
def _f(x: Any, fmt: str = ",.1f") -> str:
    return "n/a" if x is None else format(x, fmt)


def tables(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| depth | tool | prompt tokens | TTFT ms | prefill t/s (client) | prefill t/s (engine's own) | "
           "decode t/s (client, inter-token) | decode t/s (engine's own) | engineroom card decode | runs |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    depths = sorted({r["depth"] for r in rows})
    tools = list(dict.fromkeys(r["tool"] for r in rows))
    for d in depths:
        for t in tools:
            figs = [r["figures"] for r in rows if r["depth"] == d and r["tool"] == t and not r["figures"].get("failed")]
            if not figs:
                out.append(f"| {d:,} | {t} | failed |" + " |" * 7)
                continue

            def m(key: str, figs: list[dict[str, Any]] = figs) -> float | None:
                return _med([f.get(key) for f in figs])

            out.append(f"| {d:,} | {t} | {_f(m('prompt_tokens'), ',.0f')} | {_f(m('ttft_ms'))} | "
                       f"{_f(m('prefill_tps'))} | {_f(m('engine_prefill_tps'))} | {_f(m('decode_tps'))} | "
                       f"{_f(m('engine_decode_tps'))} | {_f(m('card_decode_tps'))} | {len(figs)} |")
    out += ["", "Per repetition (the spread the shared machine gave):", "",
            "| rep | depth | tool | prefill t/s | decode t/s | other load before (busy cores) | engineroom's verdict |",
            "|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        f = r["figures"]
        summary = (r.get("raw") or {}).get("summary") if isinstance(r.get("raw"), dict) else None
        verdict = ""
        if r["tool"] == "engineroom" and summary:
            bad = [f"{c['name']} {c['status']}" for c in summary.get("integrity") or [] if c.get("status") == "FAIL"]
            verdict = str(summary.get("status")) + (f" ({', '.join(bad)})" if bad else "")
        out.append(f"| {r['rep']} | {r['depth']:,} | {r['tool']} | {_f(f.get('prefill_tps'))} | "
                   f"{_f(f.get('decode_tps'))} | {_f(r.get('busy_before_start'), '.2f')} | {verdict} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--pp", type=int, default=128, help="llama-benchy's user prompt; its depth is D - pp")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1,
                    help="server and llama-bench threads (1: on a shared 2-core machine -t 2 collapses, see the .md)")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--benchy", default="/tmp/benchy-venv/bin/llama-benchy")
    ap.add_argument("--benchy-greedy", action="store_true",
                    help="also run llama-benchy with engineroom's greedy sampler (temperature 0, top_k 1)")
    ap.add_argument("--quiet-load", type=float, default=0.3, help="wait for the machine's busy cores to drop to this")
    ap.add_argument("--quiet-wait-s", type=float, default=5)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out-json", type=Path)
    ap.add_argument("--report", type=Path)
    ap.add_argument("--repair", type=Path, metavar="JSON",
                    help="refill the engineroom rows of a stored --out-json whose run ended INVALID (an older "
                         "version of this script dropped their output) from the results databases kept under --from")
    ap.add_argument("--from", dest="from_dir", type=Path, help="a copy of the run's work folder's er-REP-DEPTH folders")
    args = ap.parse_args()
    if args.repair:
        data = json.loads(args.repair.read_text())
        for row in data["rows"]:
            db = args.from_dir / f"er-{row['rep']}-{row['depth']}" / "data" / "results.sqlite"
            if row["tool"] == "engineroom" and "raw" not in row and db.exists():
                keep = {k: row[k] for k in ("cmd", "seconds", "rep", "depth", "quiet_waited_s", "busy_before",
                                            "busy_before_start", "loadavg") if k in row}
                row.clear()
                row.update(recover_engineroom(db), **keep, exit_code_was=1)
                row["figures"] = figures(row)
        args.repair.write_text(json.dumps(data, indent=1) + "\n")
        print("\n".join(tables(data["rows"])))
        return 0
    if args.report:
        print("\n".join(tables(json.loads(args.report.read_text())["rows"])))
        return 0
    t0 = time.time()
    rows, info = measure(args)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "python": platform.python_version(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "seconds": round(time.time() - t0, 1), "argv": sys.argv[1:], **info}
    if args.out_json:
        args.out_json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print("\n".join(tables(rows)))
    print(f"({meta['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
