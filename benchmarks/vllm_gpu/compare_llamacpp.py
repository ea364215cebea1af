#!/usr/bin/env python3
"""vLLM against llama.cpp on the H200, the same three models through engineroom (issue 21 item 3).

    .venv/bin/python benchmarks/vllm_gpu/compare_llamacpp.py          # the tables of README.md section 5

Reads the raw results both visits brought back, nothing else: vLLM 0.26.0's
(benchmarks/data/vllm_gpu/2026-12-04/vllm_gpu_<model>.tgz, `run_gpu.sh`) and llama.cpp b11434 CUDA's
(benchmarks/data/vllm_gpu/2026-12-04-llamacpp/llamacpp_smollm2-try.tgz, `run_llamacpp.sh`: its folder
holds the three models' runs, the 27B and 35B-A3B layouts' from the call before it on the same machine).
Each figure is read from the JSON engineroom wrote on the device: `bench --json` summaries (the same
keys for both engines), `verify --suite full --json` results and `up --json`'s memory rows.
"""

from __future__ import annotations

import json
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data" / "vllm_gpu"
VLLM = DATA / "2026-12-04"
LLAMA = DATA / "2026-12-04-llamacpp" / "llamacpp_smollm2-try.tgz"
MODELS = {"smollm2": "SmolLM2-135M", "qwen36-27b": "Qwen3.6-27B layout", "qwen36-35b-a3b": "Qwen3.6-35B-A3B layout"}
WEIGHTS = {
    "vllm": {"smollm2": "float16 (from the Q4_1 GGUF)", "qwen36-27b": "bf16, dummy", "qwen36-35b-a3b": "bf16, dummy"},
    "llama.cpp": {"smollm2": "Q4_1 (real)", "qwen36-27b": "Q4_K_M, random", "qwen36-35b-a3b": "Q4_K_M, random"},
}
GIB = 1 << 30


def _read(tgz: Path, suffix: str) -> Any:
    with tarfile.open(tgz) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith(suffix)), None)
        if member is None:
            return None
        fh = tar.extractfile(member)
        assert fh is not None
        return json.loads(fh.read())


def runs(engine: str, model: str) -> dict[str, Any]:
    if engine == "vllm":
        tgz, prefix = VLLM / f"vllm_gpu_{model}.tgz", f"{model}/"
    else:
        tgz, prefix = LLAMA, f"runs/{model}/"
    return {name: _read(tgz, prefix + f"{name}.json") for name in ("up", "verify", "bench_depth", "bench_concurrency")}


def _mean(group: dict[str, Any], key: str) -> float | None:
    v = group.get(key)
    return v.get("mean") if isinstance(v, dict) else None


def _cv(group: dict[str, Any], key: str) -> float | None:
    v = group.get(key)
    return v.get("cv_pct") if isinstance(v, dict) else None


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def speed_rows() -> list[str]:
    out = ["| model | engine, weights | decode tok/s d1,024 (CV) | d8,192 (CV) | TTFT s d1,024 / d8,192 | "
           "4 streams: per stream | aggregate | all decoding | TTFT s | bench | verify PASS / FAIL / SKIP |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for model, label in MODELS.items():
        for engine in ("vllm", "llama.cpp"):
            r = runs(engine, model)
            depth = r["bench_depth"]["summary"]
            conc = r["bench_concurrency"]["summary"]
            g1 = depth["groups"].get("depth 1024", {})
            g8 = depth["groups"].get("depth 8192", {})
            gc = next(iter(conc["groups"].values()))
            verify = Counter(x["status"] for x in r["verify"]["results"])
            status = depth["status"] if depth["status"] == conc["status"] else f"{depth['status']} / {conc['status']}"
            if status != "OK":
                status += " (" + ", ".join(c["name"] for s in (depth, conc) for c in s["integrity"]
                                           if c["status"] == "FAIL") + ")"
            d1 = f"{_f(_mean(g1, 'decode_tps'))} ({_f(_cv(g1, 'decode_tps'))}%)"
            d8 = f"{_f(_mean(g8, 'decode_tps'))} ({_f(_cv(g8, 'decode_tps'))}%)" if g8 else "-"
            out.append(
                f"| {label} | {engine}, {WEIGHTS[engine][model]} | {d1} | {d8} "
                f"| {_f(_mean(g1, 'ttft_s'), 3)} / {_f(_mean(g8, 'ttft_s'), 3)} "
                f"| {_f(_mean(gc, 'decode_tps'))} | {_f(_mean(gc, 'aggregate_tps'))} "
                f"| {_f(_mean(gc, 'all_decoding_tps'))} "
                f"| {_f(_mean(gc, 'ttft_s'), 3)} | {status} | {verify['PASS']} / {verify['FAIL']} / {verify['SKIP']} |")
    return out


def verify_rows() -> list[str]:
    out = ["| model | engine | FAIL | SKIP |", "|---|---|---|---|"]
    for model, label in MODELS.items():
        for engine in ("vllm", "llama.cpp"):
            res = runs(engine, model)["verify"]["results"]
            fails = ", ".join(x["name"] for x in res if x["status"] == "FAIL")
            skips = ", ".join(x["name"] for x in res if x["status"] == "SKIP")
            out.append(f"| {label} | {engine} | {fails or '-'} | {skips or '-'} |")
    return out


def memory_rows() -> list[str]:
    out = ["| model | engine | component | fit GiB | engine's GiB | error | engine's source |",
           "|---|---|---|---:|---:|---:|---|"]
    for model, label in MODELS.items():
        for engine in ("vllm", "llama.cpp"):
            mem = (runs(engine, model)["up"] or {}).get("memory") or {}
            for row in mem.get("rows") or []:
                p, m = row.get("predicted_bytes"), row.get("measured_bytes")
                err = row.get("error_pct")
                out.append(f"| {label} | {engine} | {row['component']} | {_f(p / GIB if p else None, 3)} "
                           f"| {_f(m / GIB if m else None, 3)} | {'-' if err is None else f'{err:+.2f}%'} "
                           f"| {row.get('source') or '-'} |")
            placement = mem.get("placement") or {}
            out.append(f"| {label} | {engine} | placement | | | | {placement.get('detail', '-')} |")
    return out


def main() -> int:
    print("\n".join(speed_rows()))
    print()
    print("\n".join(verify_rows()))
    print()
    print("\n".join(memory_rows()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
