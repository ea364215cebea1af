"""Leave-one-out check of the plan's speed calibration (plan/calibration.py) on recorded GPU runs.

Each point is one valid single-stream measurement on the H200 (llama.cpp b11434 CUDA, random-weight
Q4_K_M files of four held-out shapes, `benchmarks/gpu_edge.md`): the depth suite's decode at
depth 1,024 of the balanced pick (1 slot), beside the middle of the band the plan printed for that
launch (the recorded plan row: no calibration existed then). For each point the others calibrate
the plan as `engineroom plan` would on that machine (the median of their measured / planned ratios:
the same engine, other shape classes) and the calibrated middle is set against what was measured.
Also: each single other shape as the one calibration run (the issue's "one run of a different shape").

    .venv/bin/python benchmarks/calibration_loo.py            # prints the markdown tables
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from engineroom.plan import Calibration, SpeedPoint

DATA = Path(__file__).resolve().parent / "data" / "gpu_edge"
# (shape, its class, the recorded results file whose balanced depth suite is valid)
SOURCES = (("qwen36", "hybrid", "lease5/results.json"), ("moe", "moe", "lease4/results.json"),
           ("dense32", "dense", "lease5/call3b/results.json"), ("swa", "sliding", "lease6/call3/results.json"))
DEPTH_GROUP = "depth 1024"
GOAL_PCT = 10.0


def points() -> list[SpeedPoint]:
    out = []
    for n, (shape, klass, rel) in enumerate(SOURCES, 1):
        r = json.loads((DATA / rel).read_text())[shape]
        summary = r["balanced"]["depth"]["result"]["summary"]
        assert summary["status"] == "OK", (rel, shape, summary["status"])
        measured = summary["groups"][DEPTH_GROUP]["decode_tps"]["mean"]
        low, high = r["balanced_plan_row"]["decode_tps"]
        out.append(SpeedPoint(run_id=n, engine="llama.cpp", shape=klass, model=shape, measured_tps=measured,
                              planned_mid_tps=(low + high) / 2))
    return out


def _err(pred: float, measured: float) -> float:
    return (pred / measured - 1) * 100


def main() -> None:
    pts = points()
    print("| shape | class | measured t/s | plan middle | error | calibrated by the other 3 | error | "
          "within 10% |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    unc, cal = [], []
    for p in pts:
        others = Calibration.of("1 x NVIDIA H200", [q for q in pts if q is not p])
        f = others.factor(p.engine, p.shape)
        assert f is not None and not f.same_shape
        pred = p.planned_mid_tps * f.factor
        unc.append(abs(_err(p.planned_mid_tps, p.measured_tps)))
        cal.append(abs(_err(pred, p.measured_tps)))
        err = _err(pred, p.measured_tps)
        print(f"| {p.model} | {p.shape} | {p.measured_tps:.1f} | {p.planned_mid_tps:.1f} | "
              f"{_err(p.planned_mid_tps, p.measured_tps):+.1f}% | {pred:.1f} (x{f.factor:.3f}) | "
              f"{err:+.1f}% | {'yes' if abs(err) <= GOAL_PCT else 'no'} |")
    print(f"\nmean |error|: uncalibrated {statistics.mean(unc):.1f}%, calibrated (leave one out) "
          f"{statistics.mean(cal):.1f}%\n")
    print("One calibration run of one other shape (rows: the shape predicted; columns: the run that calibrated):\n")
    print("| predicted \\ calibrated by | " + " | ".join(p.model for p in pts) + " |")
    print("|---|" + "---:|" * len(pts))
    hits = total = 0
    for p in pts:
        cells = []
        for q in pts:
            if q is p:
                cells.append("-")
                continue
            e = _err(p.planned_mid_tps * q.ratio, p.measured_tps)
            hits, total = hits + (abs(e) <= GOAL_PCT), total + 1
            cells.append(f"{e:+.1f}%")
        print(f"| {p.model} | " + " | ".join(cells) + " |")
    print(f"\nwithin {GOAL_PCT:g}%: {hits} of {total} pairs")


if __name__ == "__main__":
    main()
