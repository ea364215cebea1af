"""Does llama-server's host prompt cache (``--cache-ram``) cost time-to-first-token outside its prefill?

The H200 visit (gpu_bench.md) saw TTFT exceed the engine's own prompt time by 0.12 s (1K) to 3.2 s
(32K), growing with the *previous* request's KV; the CPU soak (verify_soak.md) saw llama-server log
``srv update: - cache state: N prompts`` and its memory grow by that KV at the start of each new
conversation: before a slot takes a new prompt, the server saves the slot's old KV to host RAM.
That copy happens after the request arrived and before its prompt is timed.

Test, on the managed llama-server with SmolLM2 on this CPU, both variants in one run, interleaved:
a long salted prompt L (~3,900 tokens, 8 out), then a short salted prompt S (~365 tokens, 8 out),
six pairs per server; for every request, TTFT by the client's clock minus the engine's own
``prompt_ms``. With the cache on (the default) S pays for saving L's KV; with ``-cram 0`` it does not.

    .venv/bin/python benchmarks/prompt_cache_ttft.py --out-json benchmarks/data/prompt_cache_ttft.json
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

FILLER = ("The harbour master logged each ship, its cargo and the weather at the turn of the tide. ")
VARIANTS = {"default (--cache-ram 8192)": (), "-cram 0": ("--", "-cram", "0")}


def _cli(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "engineroom"), *args], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"engineroom {' '.join(args)}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}


def _prompt(tokens: int) -> str:
    # 3 chars a token asked; SmolLM2 reads this text at ~4.6, so a prompt is ~0.65 x its target
    body = FILLER * (tokens * 3 // len(FILLER) + 1)
    return f"SESSION-{secrets.token_hex(16)}\n{body[: tokens * 3]}\nSay OK."


def _one(client: Any, text: str) -> dict[str, Any]:
    r = client.stream_chat({"messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0.0},
                           timeout=600)
    t = r.timings or {}
    prompt_s = (t.get("prompt_ms") or 0.0) / 1000.0
    return {"ok": r.ok, "ttft_s": r.ttft, "engine_prompt_s": prompt_s, "prompt_n": t.get("prompt_n"),
            "cache_n": t.get("cache_n"), "gap_s": (r.ttft - prompt_s) if r.ttft is not None else None}


def run(pairs: int, long_tokens: int, short_tokens: int) -> dict[str, Any]:
    from engineroom.client import OpenAIClient

    out: dict[str, Any] = {"pairs": pairs, "long_tokens": long_tokens, "short_tokens": short_tokens, "variants": {}}
    work = Path(tempfile.mkdtemp(prefix="prompt-cache-"))
    env = {**os.environ, "ENGINEROOM_STATE_DIR": str(work / "state"), "ENGINEROOM_DATA_DIR": str(work / "data")}
    for rnd in range(2):                                   # each variant twice, A B B A: drift hits both
        for name in (list(VARIANTS) if rnd == 0 else list(reversed(VARIANTS))):
            state = _cli(env, "up", "smollm2-135m", "--ctx", "8192", "--parallel", "1", "--threads", "2",
                         "--port", "0", "--json", *VARIANTS[name])
            client = OpenAIClient(f"http://127.0.0.1:{state['port']}")
            try:
                _one(client, _prompt(64))                  # warm
                rows = []
                for _ in range(pairs):
                    long = _one(client, _prompt(long_tokens))
                    rows.append({"long": long, "short": _one(client, _prompt(short_tokens))})
            finally:
                client.close()
                _cli(env, "down")
            out["variants"].setdefault(name, []).extend(rows)
    out["load"] = os.getloadavg()
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return out


def report(data: dict[str, Any]) -> str:
    lines = ["| variant | request | n | median TTFT s | median engine prompt s | median TTFT − prompt s | "
             "cached tokens (median) |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, rows in data["variants"].items():
        for kind in ("long", "short"):
            xs = [r[kind] for r in rows if r[kind]["ok"] and r[kind]["gap_s"] is not None]

            def med(key: str, xs: list[dict[str, Any]] = xs) -> float:
                return statistics.median(x[key] for x in xs) if xs else float("nan")
            cached = statistics.median((x["cache_n"] or 0) for x in xs) if xs else float("nan")
            lines.append(f"| {name} | {kind} (~{data[f'{kind}_tokens']:,} tokens) | {len(xs)} | {med('ttft_s'):.3f} | "
                         f"{med('engine_prompt_s'):.3f} | {med('gap_s'):.3f} | {cached:.0f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--long-tokens", type=int, default=6000)
    ap.add_argument("--short-tokens", type=int, default=500)
    ap.add_argument("--out-json", type=Path)
    ap.add_argument("--report", type=Path)
    a = ap.parse_args()
    if a.report:
        print(report(json.loads(a.report.read_text())))
        return 0
    data = run(a.pairs, a.long_tokens, a.short_tokens)
    if a.out_json:
        a.out_json.write_text(json.dumps(data, indent=1))
    print(report(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
