"""How long planning takes: every catalog model x every hardware class x every engine.

Each combination is one `plan()` call as the CLI makes it (default priority, top 5 plans,
fillable context for the first), on a one-device rig of that class (GPU classes: 1xCLASS;
Apple / CPU classes: CLASS:<default memory>GB). A combination with no fitting config
(e.g. the 27B on a CPU with 64 GB under vLLM) counts too: it is a NotFound answer, which the
CLI prints as one sentence. The budget is < 1 s for the whole sweep (catalog load excluded,
it is cached per process). Run:

    .venv/bin/python benchmarks/plan_speed.py [--repeat 5] [--cli 10]

``--cli N`` also times N whole `engineroom plan qwen3.6-27b --rig 2x3090` processes (the
how-to-choose table, cold: a new interpreter each), against a budget of 0.3 s wall.
"""

from __future__ import annotations

import argparse
import os
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


CLI_COMMAND = ("plan", "qwen3.6-27b", "--rig", "2x3090")   # one model's how-to-choose table
CLI_BUDGET_S = 0.3


def cli_runs(n: int) -> list[tuple[float, float]]:
    """(wall s, CPU s) of ``n`` whole `engineroom plan` processes, cold: a new interpreter each,
    imports and catalog load included (the validated catalog's cache file and the modules'
    bytecode are kept, as after any first run). CPU is the child's user + system time (os.wait4)."""
    import subprocess

    out = []
    cmd = [sys.executable, "-m", "engineroom.cli", *CLI_COMMAND]
    # warm-up: writes the catalog cache, and the bytecode of modules changed since it was last
    # written, as a first run does (an installed package ships it): with PYTHONDONTWRITEBYTECODE
    # set, as on the development VM, every timed run would compile each edited module again
    first = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, capture_output=True, check=True, env=first)
    for _ in range(n):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"engineroom {' '.join(CLI_COMMAND)} failed")
        out.append((wall, usage.ru_utime + usage.ru_stime))
    return out


def _mmm(xs: list[float]) -> str:
    return f"min {min(xs):.3f} s, median {statistics.median(xs):.3f} s, max {max(xs):.3f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cli", type=int, default=0, metavar="N",
                    help=f"also time N whole `engineroom {' '.join(CLI_COMMAND)}` processes")
    args = ap.parse_args()
    _print_load("before measuring")
    cli_ok = True
    if args.cli:
        runs = cli_runs(args.cli)
        wall, cpu = [w for w, _ in runs], [c for _, c in runs]
        print(f"engineroom {' '.join(CLI_COMMAND)} x {args.cli} whole processes: wall {_mmm(wall)}; "
              f"CPU {_mmm(cpu)}")
        cli_ok = statistics.median(wall) <= CLI_BUDGET_S
        print(f"budget {CLI_BUDGET_S:.1f} s wall: {'PASS' if cli_ok else 'FAIL'} (median)")
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
    _print_load("after measuring")
    return 0 if ok and cli_ok else 1


def _print_load(when: str) -> None:
    """The load average (other work on the machine inflates every figure: measure when it is low)."""
    try:
        load = os.getloadavg()
    except OSError:
        return
    print(f"load average {when}: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    sys.exit(main())
