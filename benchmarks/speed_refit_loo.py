"""The CUDA decode model's fixed costs, refitted on every single-stream H200 try on record, and left one shape out.

Points: every valid single-stream decode of llama.cpp b11434's CUDA build on the H200 through llama-server (random
weights, Q4_K_M as `engineroom.synth` writes it), per shape the mean of its measurements:
- the Qwen3.6-27B layout, the dense 32B, the 30B-A3B MoE and the 35B-A3B hybrid MoE of `calibration_loo.py`
  (gpu_edge.md and the tries of try_gpu.md and h200_visit.md);
- the tries of 2026-12-05 (`benchmarks/data/moe_shapes/2026-12-05/`, `benchmarks/vllm_gpu/moe_shapes.sh`): the
  30B-A3B again, the same MoE with 24 layers, its trunk with a dense FFN of the same active size (dense2048), the
  35B-A3B's trunk with a dense FFN (hybrid2048), and the 35B-A3B again.

Time per token is fitted as the plan computes it: bytes / (the catalog's efficiency x 4,800 GB/s), bytes as the plan
counts them (weights read + KV at depth 4,096), plus T0 + layers x a x width / 5,120 + linear-attention layers x g +
MoE layers x m (least squares on relative error; T0, a, g, m >= 0 by construction of the data, not forced). Printed:
the fit; each shape's in-sample error; and issue 19's test, leave one shape out: the four constants fitted without
it, then its plan middle calibrated by one run of each other shape (`plan/calibration.py`: x measured / planned) and
set against its measurements. The model the catalog had before (0.25 ms + layers x 0.0975 ms) is scored the same way.

    .venv/bin/python benchmarks/speed_refit_loo.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from engineroom.catalog import arch_from_catalog, load_catalog
from engineroom.hardware import parse_rig
from engineroom.plan import DecodeShape, plan, resolve_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_loo import points  # the older points and where each comes from

DATA = Path(__file__).resolve().parent / "data"
SHAPES_TGZ = DATA / "moe_shapes" / "2026-12-05" / "moe_shapes_try.tgz"
RIG = parse_rig("h200")
WIDTH = 5120              # the width the per-layer cost is quoted at (the catalog's per_layer_width)
OLD = {"T0": 0.25, "a": 0.0975, "width_scaled": False, "g": 0.0, "m": 0.0}    # the catalog before 2026-12-05
GOAL_PCT = 10.0


def measurements(folder: Path) -> dict[str, tuple[str, list[float]]]:
    """Shape -> (the model the plan reads, its measured tok/s): the older points and the 2026-12-05 tries."""
    names = {"qwen3.6-27b": "27B layout", "tests/fixtures/configs/qwen3-32b.json": "dense 32B",
             "tests/fixtures/configs/qwen3-30b-a3b.json": "30B-A3B MoE",
             "tests/fixtures/configs/qwen3.5-35b-a3b.json": "35B-A3B hybrid MoE"}
    out: dict[str, tuple[str, list[float]]] = {}
    for _source, p in points():
        if p.model in names:
            out.setdefault(names[p.model], (p.model, []))[1].append(p.measured_tps)
    with tarfile.open(SHAPES_TGZ) as tar:
        tar.extractall(folder, filter="data")
    new = {"moe30": "30B-A3B MoE", "moe35": "35B-A3B hybrid MoE", "moe30-24": "30B-A3B MoE, 24 layers",
           "dense2048": "dense trunk of the 30B-A3B (2048 wide)",
           "hybrid2048": "hybrid trunk of the 35B-A3B (2048 wide)"}
    for key, name in new.items():
        d = json.loads((folder / "shapes" / f"try-{key}.json").read_text())
        assert d["bench_status"] == "OK" and d["placement"]["status"] == "as_planned", key
        config = str(folder / "shapes" / "configs" / f"{key}.json")
        out.setdefault(name, (config, []))[1].append(d["decode_tps"])
    return out


def rows(measured: dict[str, tuple[str, list[float]]]) -> list[dict]:
    out = []
    for name, (model, tps) in measured.items():
        p = next(p for p in plan(model, RIG, "balanced", engine="llama.cpp", quant="Q4_K_M", ctx=4096, limit=40)
                 if not p.spec and p.kv_dtype == "f16" and p.parallel == 1)
        assert p.decode is not None
        subject = resolve_model(model)
        shape = DecodeShape.of(subject.arch or arch_from_catalog(subject.model))
        out.append({"name": name, "gb": p.decode.bytes_per_token / 1e9, "shape": shape, "tps": statistics.mean(tps),
                    "n": len(tps)})
    return out


def _eff() -> float:
    dm = load_catalog().engine("llama.cpp").decode
    return (dm.bandwidth_efficiency.low + dm.bandwidth_efficiency.high) / 2


def predict_ms(c: dict, r: dict) -> float:
    s = r["shape"]
    per_layer = c["a"] * (s.width / WIDTH if c["width_scaled"] else 1.0)
    return r["gb"] / (_eff() * 4.8) + c["T0"] + s.layers * per_layer + s.linear * c["g"] + s.moe * c["m"]


def fit(rs: list[dict]) -> dict:
    eff = _eff()
    a, y = [], []
    for r in rs:
        t = 1000 / r["tps"]
        s = r["shape"]
        a.append([1 / t, s.layers * s.width / WIDTH / t, s.linear / t, s.moe / t])
        y.append((t - r["gb"] / (eff * 4.8)) / t)
    sol, *_ = np.linalg.lstsq(np.array(a), np.array(y), rcond=None)
    return {"T0": sol[0], "a": sol[1], "width_scaled": True, "g": sol[2], "m": sol[3]}


def loo(rs: list[dict], model: dict | None) -> tuple[list[str], int, int, list[float]]:
    """Each shape held out: the constants fitted on the others (or ``model`` as given), its middle calibrated by one
    run of each other shape; the lines of the table, how many within the goal, of how many, every error."""
    lines, hits, total, errs = [], 0, 0, []
    for i, r in enumerate(rs):
        c = model or fit([x for j, x in enumerate(rs) if j != i])
        pred = 1000 / predict_ms(c, r)
        cells = []
        for j, k in enumerate(rs):
            if j == i:
                cells.append("-")
                continue
            factor = k["tps"] / (1000 / predict_ms(c, k))
            e = (pred * factor / r["tps"] - 1) * 100
            errs.append(e)
            hits += abs(e) <= GOAL_PCT
            total += 1
            cells.append(f"{e:+.0f}%")
        lines.append(f"| {r['name']} | {r['tps']:.1f} ({r['n']}) | {(pred / r['tps'] - 1) * 100:+.1f}% | "
                     + " | ".join(cells) + " |")
    return lines, hits, total, errs


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rs = rows(measurements(Path(tmp)))
    c = fit(rs)
    print(f"Fit on all {len(rs)} shapes (efficiency {_eff():.3f} of 4,800 GB/s, the catalog's): per token "
          f"{c['T0']:.3f} ms; per layer {c['a']:.4f} ms at width {WIDTH:,} (in proportion to width); per linear-"
          f"attention layer {c['g']:.4f} ms more; per MoE layer {c['m']:.4f} ms more.\n")
    print("| shape | layers / width / linear / MoE | GB read a token | measured t/s (n) | fit | before |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rs:
        s = r["shape"]
        fitted, before = 1000 / predict_ms(c, r), 1000 / predict_ms(OLD, r)
        print(f"| {r['name']} | {s.layers} / {s.width:,} / {s.linear} / {s.moe} | {r['gb']:.2f} | {r['tps']:.1f} "
              f"({r['n']}) | {fitted:.1f} ({fitted / r['tps'] - 1:+.1%}) | {before:.1f} "
              f"({before / r['tps'] - 1:+.1%}) |")
    head = "| held out | measured t/s (n) | uncalibrated | " + " | ".join(r["name"] for r in rs) + " |"
    rule = "|---|---:|---:|" + "---:|" * len(rs)
    for label, model in (("refitted without the held-out shape", None), ("the model before", OLD)):
        lines, hits, total, errs = loo(rs, model)
        print(f"\nLeave one out, {label}; columns: the shape whose one run calibrated it:\n\n{head}\n{rule}")
        print("\n".join(lines))
        print(f"\nwithin {GOAL_PCT:g}%: {hits} of {total} (held-out shape, calibrating shape) pairs; median |error| "
              f"{statistics.median(abs(e) for e in errs):.1f}%")


if __name__ == "__main__":
    main()
