"""How long planning takes: every catalog model x every hardware class x every engine.

Each combination is one `plan()` call as the CLI makes it (default priority, top 5 plans,
fillable context for the first), on a one-device rig of that class (GPU classes: 1xCLASS;
Apple / CPU classes: CLASS:<default memory>GB). A combination with no fitting config
(e.g. the 27B on a CPU with 64 GB under vLLM) counts too: it is a NotFound answer, which the
CLI prints as one sentence. The budget is < 1 s for the whole sweep (catalog load excluded,
it is cached per process). Run:

    .venv/bin/python benchmarks/plan_speed.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

from engineroom.catalog import load_catalog
from engineroom.errors import EngineroomError
from engineroom.hardware import parse_rig
from engineroom.plan import plan

BUDGET_S = 1.0


def sweep(cat) -> tuple[int, int, int]:
    calls = answered = no_fit = 0
    for model in cat.models:
        for hw in cat.hardware:
            spec = f"1x{hw.id}" if hw.kind == "gpu" else f"{hw.id}:{int(hw.default_memory_gb)}GB"
            rig = parse_rig(spec, cat)
            for engine in cat.engines:
                calls += 1
                try:
                    plan(model.id, rig, None, engine=engine.id, catalog=cat, limit=5)
                    answered += 1
                except EngineroomError:
                    no_fit += 1
    return calls, answered, no_fit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cat = load_catalog()
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        calls, answered, no_fit = sweep(cat)
        times.append(time.perf_counter() - t0)
    best, med = min(times), statistics.median(times)
    print(f"{len(cat.models)} models x {len(cat.hardware)} hardware classes x {len(cat.engines)} engines "
          f"= {calls} plan() calls "
          f"({answered} with plans, {no_fit} with no fitting config)")
    print(f"sweep time over {args.repeat} runs: best {best:.3f} s, median {med:.3f} s, worst {max(times):.3f} s "
          f"(python {platform.python_version()}, {platform.machine()})")
    ok = med < BUDGET_S
    print(f"budget {BUDGET_S:.1f} s: {'PASS' if ok else 'FAIL'} (median)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
