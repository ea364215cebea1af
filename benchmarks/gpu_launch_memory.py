#!/usr/bin/env python3
"""The launch record on a GPU: fit's prediction beside llama-server's CUDA buffers and NVML.

`benchmarks/gpu_launch_memory.sh` ran `engineroom up` twice on the lent H200 (a tiny tied Q4_0
model, 4 unified slots x 4096 and x 32768 tokens); its raw output is in
benchmarks/data/gpu_launch_memory/ (server logs, the store's runs with the launch records,
nvidia-smi). This script recomputes the comparison from those raw files with the fit in this
tree (the measured side is parsed from the logs by the llama.cpp adapter, and NVML's
per-process figure is the one the launch recorded), so a change to fit shows here at once:

    .venv/bin/python benchmarks/gpu_launch_memory.py          # needs `engineroom models pull smollm2-135m`
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from engineroom import models  # noqa: E402 - importable only after the sys.path insert
from engineroom.arch import arch_from_gguf  # noqa: E402
from engineroom.engines import llamacpp  # noqa: E402
from engineroom.fit import FitRequest, fit  # noqa: E402
from engineroom.hardware import resolve_rig  # noqa: E402
from engineroom.memory import compare, rows_as_dicts  # noqa: E402
from engineroom.synth import write_synthetic_gguf  # noqa: E402
from engineroom.synthshapes import SHAPES  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "gpu_launch_memory"


def tiny_model(where: Path) -> Path:
    """The model the device ran, written again (same seed, same tokenizer: the same bytes)."""
    base = SHAPES["dense-s"]
    tiny = replace(base, name="tiny-gpu", n_layers=4, layer_kinds=base.layer_kinds[:4], hidden_size=128,
                   intermediate_size=384, n_heads=2, n_kv_heads=1, head_dim=64, tie_embeddings=True)
    _, tokenizer = models.local_model("smollm2-135m")
    return write_synthetic_gguf(tiny, "Q4_0", where / "tiny-gpu.gguf", tokenizer_gguf=tokenizer)


def cell(b: int | None) -> str:
    return "—" if b is None else f"{b / 2**20:.2f} MiB"


def main() -> None:
    runs = [r for r in json.loads((DATA / "runs.json").read_text()) if r["kind"] == "launch"]
    rig = resolve_rig("1xH200")
    with tempfile.TemporaryDirectory() as tmp:
        arch = arch_from_gguf(tiny_model(Path(tmp)))
    print("| ctx x slots | component | predicted | measured | error |\n|---|---|---:|---:|---:|")
    for run in sorted(runs, key=lambda r: r["conditions"]["fit_request"]["ctx"]):
        req_d = {k: v for k, v in run["conditions"]["fit_request"].items() if k != "basis"}
        req = FitRequest(**req_d)
        predicted = fit(arch, req, rig).bytes_by_component(per_gpu=True)
        log = (DATA / f"server-{req.ctx}.log").read_text()
        report = llamacpp.memory_report(log)
        assert report is not None
        measured = {c.name: c.bytes for c in report.components}
        nvml = next(r for r in run["summary"]["memory"] if r["component"] == "GPU0")["measured_bytes"]
        measured["GPU0"] = nvml
        for row in rows_as_dicts(compare(predicted, measured)):
            p, m, e = row["predicted_bytes"], row["measured_bytes"], row["error_pct"]
            print(f"| {req.ctx:,} x {req.parallel} | {row['component']} | {cell(p)} | {cell(m)} | "
                  f"{'—' if e is None else f'{e:+.2f}%'} |")


if __name__ == "__main__":
    main()
