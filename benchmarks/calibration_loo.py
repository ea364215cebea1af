"""Leave-one-out check of the plan's speed calibration (plan/calibration.py) on every recorded H200 point.

A point is one valid single-stream decode of a plan's pick on the H200 (llama.cpp b11434 CUDA, random-weight
Q4_K_M files) beside the middle of the plan's uncalibrated band for that launch as the plan printed it then:
- the four shapes of `benchmarks/gpu_edge.md` (the depth suite's decode at depth 1,024 of the balanced pick);
- every `engineroom try` on the H200 (`try_gpu.md`'s two visits, `h200_visit.md`), read from the tries' own
  JSON. The Qwen3.6-27B pick drafts with MTP, which try leaves off: the first visit's two 27B tries made no point
  then; their band without the drafter (76.0-121.6, middle 98.8: the band divided by the drafter's x1.471-2.059,
  as try sets it since 2026-12-05) is the one the later tries were set against, so they count here too.

Each shape's class is the plan's today (`plan.calibration.shape_class`: hybrid MoE a class of its own). For each
shape held out, every point of one other shape calibrates it, as `engineroom plan` would on that machine with that
one run stored (the factor: that run's measured / planned); the table gives the calibrated middle's error against
the held-out shape's own measurements (their mean). Issue 19's goal: within 10% after one run of another shape.

    .venv/bin/python benchmarks/calibration_loo.py            # prints the markdown tables
"""

from __future__ import annotations

import json
import statistics
import tarfile
from pathlib import Path

from engineroom.arch.config import arch_from_config
from engineroom.catalog import arch_from_catalog, load_catalog
from engineroom.plan import SpeedPoint, shape_class

DATA = Path(__file__).resolve().parent / "data"
GOAL_PCT = 10.0
DEPTH_GROUP = "depth 1024"
# gpu_edge.md's shapes: (name, the catalog id or config the class is read from, its results file)
EDGE = (("qwen36", "qwen3.6-27b", "lease5/results.json"),
        ("moe", "tests/fixtures/configs/qwen3-30b-a3b.json", "lease4/results.json"),
        ("dense32", "tests/fixtures/configs/qwen3-32b.json", "lease5/call3b/results.json"),
        ("swa", "swa", "lease6/call3/results.json"))
SHAPE_OF = {"qwen3.6-27b": "Qwen3.6-27B layout", "tests/fixtures/configs/qwen3-32b.json": "dense 32B",
            "tests/fixtures/configs/qwen3-30b-a3b.json": "30B-A3B MoE",
            "tests/fixtures/configs/qwen3.5-35b-a3b.json": "35B-A3B hybrid MoE",
            "swa": "Gemma-3-12B shape"}
CLASS_OF = {"swa": "tests/fixtures/configs/gemma-3-4b-it.json"}   # no fixture of the 12B: the 4B's layers alike
NO_DRAFTER_MID = (76.0 + 121.6) / 2        # the 27B pick's band without MTP's x1.471-2.059 (see the docstring)
ROOT = Path(__file__).resolve().parent.parent


def _class(model: str) -> str:
    model = CLASS_OF.get(model, model)
    arch = arch_from_config(ROOT / model) if model.endswith(".json") else arch_from_catalog(load_catalog().model(model))
    return shape_class(arch)


def _tar_json(archive: Path, member_suffix: str) -> dict:
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(member_suffix))
        f = tar.extractfile(member)
        assert f is not None
        return json.loads(f.read())


def points() -> list[tuple[str, SpeedPoint]]:
    """(where it was measured, the point) for every valid single-stream H200 measurement on record."""
    out: list[tuple[str, SpeedPoint]] = []

    def add(source: str, model: str, measured: float, planned: float) -> None:
        out.append((source, SpeedPoint(run_id=len(out) + 1, engine="llama.cpp", shape=_class(model), model=model,
                                       measured_tps=measured, planned_mid_tps=planned)))

    for shape, model, rel in EDGE:                      # gpu_edge.md: the depth suite at 1,024
        r = json.loads((DATA / "gpu_edge" / rel).read_text())[shape]
        summary = r["balanced"]["depth"]["result"]["summary"]
        assert summary["status"] == "OK", (rel, shape)
        low, high = r["balanced_plan_row"]["decode_tps"]
        add(f"gpu_edge {rel.split('/')[0]} (depth 1,024)", model, summary["groups"][DEPTH_GROUP]["decode_tps"]["mean"],
            (low + high) / 2)
    first = DATA / "vllm_gpu" / "2026-12-04-llamacpp" / "llamacpp_smollm2-try.tgz"   # try_gpu.md, first visit
    d = _tar_json(first, "try/try_35b_a3b.json")
    add("try, 2026-12-04 visit 1", d["calibrated_by"]["model"], d["decode_tps"], d["calibrated_by"]["planned_mid_tps"])
    for name in ("try_27b_4096.json", "try_27b_32768.json"):
        d = _tar_json(first, f"try/{name}")
        assert d["bench_status"] == "OK"
        add("try, 2026-12-04 visit 1 (no point then)", "qwen3.6-27b", d["decode_tps"], NO_DRAFTER_MID)
    second = DATA / "tune_gpu" / "2026-12-04-2" / "try"                              # try_gpu.md, second visit
    for name in ("A-try-qwen3.5-35b-a3b.json", "B-try-qwen3-30b-a3b.json"):
        d = json.loads((second / name).read_text())
        p = d["calibrated_by"]
        add("try, 2026-12-04 visit 2", p["model"], p["measured_tps"], p["planned_mid_tps"])
    visit = DATA / "h200_visit" / "2026-12-05" / "h200_try.tgz"                     # h200_visit.md
    for name in ("A-try-dense32.json", "A-try-27b-4096.json", "B-try-27b-32768.json", "A-try-27b-131072.json"):
        d = _tar_json(visit, f"try/{name}")
        p = d["calibrated_by"]
        add("try, 2026-12-05", p["model"], p["measured_tps"], p["planned_mid_tps"])
    return out


def _err(pred: float, measured: float) -> float:
    return (pred / measured - 1) * 100


def main() -> None:
    pts = points()
    print("Points:\n\n| # | shape | class | measured t/s | plan middle then | error | source |")
    print("|---:|---|---|---:|---:|---:|---|")
    for source, p in pts:
        print(f"| {p.run_id} | {SHAPE_OF[p.model]} | {p.shape} | {p.measured_tps:.1f} | {p.planned_mid_tps:.1f} | "
              f"{_err(p.planned_mid_tps, p.measured_tps):+.1f}% | {source} |")
    shapes = list(dict.fromkeys(p.model for _s, p in pts))
    by = {m: [p for _s, p in pts if p.model == m] for m in shapes}
    print("\nOne calibration run of one other shape (rows: the shape predicted, its measurements' mean; columns: the "
          "shape whose run calibrated it; each cell the mean error over that shape's runs):\n")
    print("| predicted \\ calibrated by | uncalibrated | " + " | ".join(SHAPE_OF[m] for m in shapes) + " |")
    print("|---|---:|" + "---:|" * len(shapes))
    hits = total = 0
    for m in shapes:
        measured = statistics.mean(p.measured_tps for p in by[m])
        planned = statistics.mean(p.planned_mid_tps for p in by[m])
        cells = [f"{_err(planned, measured):+.1f}%"]
        for other in shapes:
            if other == m:
                cells.append("-")
                continue
            errs = [_err(planned * q.ratio, measured) for q in by[other]]
            hits += sum(abs(e) <= GOAL_PCT for e in errs)
            total += len(errs)
            cells.append(f"{statistics.mean(errs):+.1f}%")
        print(f"| {SHAPE_OF[m]} ({by[m][0].shape}) | " + " | ".join(cells) + " |")
    print(f"\nwithin {GOAL_PCT:g}% after one run of another shape: {hits} of {total} (shape, run) pairs")


if __name__ == "__main__":
    main()
