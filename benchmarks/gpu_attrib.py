"""For the next H200 visit (not yet run): two things the first visit (gpu_bench.md) left open, on 8B.

1. **TTFT above the engine's prefill** (0.12 s at 1K to 3.2 s at 32K, growing with the previous
   request's KV). Suspect: llama-server saving the finished slot to its host prompt cache
   (``--cache-ram``, 8 GiB by default) outside its prompt timing. Test: the depth suite on the
   same server settings with the default cache and with ``-cram 0``, side by side.
2. **Concurrency rounds two times apart** (N = 4 and 8 on 16 slots: one round's streams decode at
   12.8 ms per token, the next at 6 ms). Test: N = 4 and 8 over 4 measured rounds with the default
   cache, with ``-cram 0``, and (N = 4) on a server with exactly 4 slots; a thread polls
   llama-server's ``/slots`` every 50 ms during each run, so which slots each round used is
   recorded beside the per-round decode rates.

A CPU dry run of this script (the tiny shape, `--model tiny --depths 256 --ctx 2048 --prompt-tokens
256`) showed the /slots polling working: each round of N = 4 took the next four idle slots
(12-15, 8-11, 4-7, 0-3). The prompt-cache half is confirmed on the CPU (prompt_cache_ttft.md).

Every run lands in the device's store (raw per-request records, launch memory rows with NVML);
``--report`` turns the results into the tables of benchmarks/gpu_attrib.md.

    python3 benchmarks/gpu_attrib.py run --out DIR                      # (device, after gpu_bench.sh build)
    .venv/bin/python benchmarks/gpu_attrib.py --report benchmarks/data/gpu_attrib
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import gpu_bench as gb

MODEL = "8b"
DEPTHS = "1024,10240,32768"
VARIANTS_TTFT = {"default": (), "cram0": ("-cram", "0")}
VARIANTS_CONC = {"default": (16, ()), "cram0": (16, ("-cram", "0")), "slots4": (4, ())}


def _url() -> str | None:
    rc, data, _ = gb._cli("status", "--json")
    if rc != 0 or not isinstance(data, dict):
        return None
    state = data.get("state") or data
    port = state.get("port")
    return state.get("url") or (f"http://{state.get('host', '127.0.0.1')}:{port}" if port else None)


class SlotPoller:
    """GET /slots every ``every_s`` while a run goes; keeps (t, [(id, is_processing, n_past?)])."""

    def __init__(self, url: str, out: Path, every_s: float = 0.05) -> None:
        import httpx

        self.client = httpx.Client(base_url=url, timeout=2.0, trust_env=False)
        self.out, self.every_s = out, every_s
        self.stop = threading.Event()
        self.rows: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            t = time.time()
            try:
                slots = self.client.get("/slots").json()
                busy = [s.get("id") for s in slots if s.get("is_processing")]
                self.rows.append({"t": t, "busy": busy,
                                  "n_ctx_used": {s.get("id"): (s.get("next_token") or [{}])[0].get("n_decoded")
                                                 for s in slots if s.get("is_processing")}})
            except Exception as exc:      # noqa: BLE001 - a poll that fails is recorded, not fatal
                self.rows.append({"t": t, "error": str(exc)[:200]})
            self.stop.wait(self.every_s)

    def __enter__(self) -> SlotPoller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.client.close()
        self.out.write_text("\n".join(json.dumps(r) for r in self.rows) + "\n")


def run(out: Path, deadline_s: float, name: str = MODEL, depths: str = DEPTHS, ctx: int = 40960,
        prompt: int = 1024) -> None:
    deadline = time.time() + deadline_s
    model = gb.gguf_path(out, name)
    if not model.exists():
        gb.synth(out, [name])
    res_f = out / "attrib.json"
    res: dict[str, Any] = json.loads(res_f.read_text()) if res_f.exists() else {"ttft": {}, "concurrency": {}}
    polls = out / "slot_polls"
    polls.mkdir(exist_ok=True)
    for name, extra in VARIANTS_TTFT.items():
        if name in res["ttft"] or time.time() + 150 > deadline:
            continue
        if gb._up(model, "--ctx", str(ctx), "--parallel", "1", *(("--", *extra) if extra else ())):
            rc, data, err = gb._cli("bench", "depth", "--depths", depths, "--json", timeout=400)
            res["ttft"][name] = {"rc": rc, "result": data, "stderr": err if rc else "", "engine_args": list(extra)}
            gb._cli("down")
        res_f.write_text(json.dumps(res, indent=1))
    for name, (slots, extra) in VARIANTS_CONC.items():
        if name in res["concurrency"] or time.time() + 90 > deadline:
            continue
        args = ("--ctx", "4096", "--parallel", str(slots), *(("--", *extra) if extra else ()))
        if not gb._up(model, *args):
            continue
        url = _url()
        res["concurrency"][name] = {"slots": slots, "engine_args": list(extra), "runs": {}}
        for n in (4, 8):
            if n > slots:
                continue
            poll_f = polls / f"{name}-N{n}.jsonl"
            with SlotPoller(url, poll_f) if url else _Null():
                rc, data, err = gb._cli("bench", "concurrency", "--streams", str(n), "--prompt-tokens",
                                        str(prompt), "--max-tokens", "256", "--warmup", "1", "--runs", "4", "--json",
                                        timeout=300)
            res["concurrency"][name]["runs"][str(n)] = {"rc": rc, "result": data, "stderr": err if rc else "",
                                                        "slot_polls": poll_f.name if url else None}
        gb._cli("down")
        res_f.write_text(json.dumps(res, indent=1))


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ---------------------------------------------------------------- report (here) -------------
def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _gaps_ms(arrivals: list[int]) -> list[float]:
    return [a / 1000.0 for a in arrivals[2:]]        # arrivals_us are deltas; the first is TTFT


def _rounds(store: Path, run_id: int) -> dict[int, dict[str, Any]]:
    db = sqlite3.connect(store)
    rows = db.execute("select payload from records where run_id=? and kind='bench_request' order by seq",
                      (run_id,)).fetchall()
    out: dict[int, dict[str, Any]] = {}
    for (p,) in rows:
        d = json.loads(p)
        if d.get("warmup"):
            r = -1
        else:
            r = int(d.get("round") or 0)
        e = d.get("engine") or {}
        cell = out.setdefault(r, {"itl_ms": [], "engine_tps": [], "cached": [], "span": [float("inf"), 0.0]})
        t0 = float(d.get("sent_unix") or 0.0)
        cell["span"] = [min(cell["span"][0], t0), max(cell["span"][1], t0 + (d.get("end_us") or 0) / 1e6)]
        cell["itl_ms"].append(_median(_gaps_ms(d.get("arrivals_us") or [])))
        if e.get("decode_ms"):
            cell["engine_tps"].append(e["decode_tokens"] / e["decode_ms"] * 1000.0)
        cell["cached"].append(e.get("cached_tokens"))
    return out


def report(folder: Path) -> str:
    res = json.loads((folder / "attrib.json").read_text())
    store = next((p for p in (folder / "store.sqlite", folder / "home" / "data" / "results.sqlite") if p.exists()),
                 folder / "store.sqlite")
    lines = ["### TTFT against the engine's prefill, default prompt cache vs `-cram 0` (8b, 1 slot)", "",
             "| variant | depth | TTFT s | engine prefill s | TTFT − prefill s | decode tok/s |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, v in res.get("ttft", {}).items():
        s = (v.get("result") or {}).get("summary") or {}
        for g, row in (s.get("groups") or {}).items():
            ttft, pt, ep = gb._m(row, "ttft_s"), gb._m(row, "prompt_tokens"), gb._m(row, "engine_prompt_tps")
            pre = pt / ep if pt and ep else None
            gap = ttft - pre if ttft and pre else None
            lines.append(f"| {name} | {g.split()[1]} | {gb._f(ttft, '{:.3f}')} | {gb._f(pre, '{:.3f}')} | "
                         f"{gb._f(gap, '{:.3f}')} | {gb._f(gb._m(row, 'decode_tps'))} |")
    lines += ["", "### Concurrency rounds (8b, `--ctx 4096` per slot, 1,024-token prompts, 256 out)", "",
              "| variant | slots | N | round | median inter-token ms per stream | engine tok/s per stream | "
              "slots busy during the run |", "|---|---:|---:|---:|---|---|---|"]
    for name, v in res.get("concurrency", {}).items():
        for n, run in (v.get("runs") or {}).items():
            rid = ((run.get("result") or {}).get("run_id"))
            pf = folder / "slot_polls" / str(run.get("slot_polls") or "")
            polled = bool(run.get("slot_polls")) and pf.exists()
            polls = [json.loads(x) for x in pf.read_text().splitlines()] if polled else []
            if rid is None or not store.exists():
                lines.append(f"| {name} | {v['slots']} | {n} | — | not stored (rc {run.get('rc')}) | | |")
                continue
            for r, cell in sorted(_rounds(store, rid).items()):
                itl = ", ".join(gb._f(x) for x in cell["itl_ms"])
                tps = ", ".join(gb._f(x) for x in cell["engine_tps"])
                lo, hi = cell["span"]
                busy = sorted({i for p in polls if lo <= p["t"] <= hi for i in p.get("busy") or []})
                lines.append(f"| {name} | {v['slots']} | {n} | {'warm-up' if r < 0 else r} | {itl} | {tps} | "
                             f"{busy if polls else 'not polled'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", nargs="?", choices=("run",))
    ap.add_argument("--out", type=Path, default=Path("/tmp/gpu-bench"))
    ap.add_argument("--deadline-s", type=float, default=540)
    ap.add_argument("--report", type=Path)
    ap.add_argument("--model", default=MODEL, help="a gpu_bench shape (a CPU dry run: tiny)")
    ap.add_argument("--depths", default=DEPTHS)
    ap.add_argument("--ctx", type=int, default=40960)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    a = ap.parse_args()
    if a.report:
        print(report(a.report))
        return 0
    if a.stage != "run":
        ap.error("give the stage (run) or --report")
    a.out.mkdir(parents=True, exist_ok=True)
    run(a.out.resolve(), a.deadline_s, a.model, a.depths, a.ctx, a.prompt_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
