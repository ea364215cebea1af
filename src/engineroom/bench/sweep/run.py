"""The sweep suite's run: cells of N simultaneous streams x prompt size within a time budget.

Before each cell the run estimates its cost from the cells already measured (``sweep.knee``) and
skips it when it would overrun ``--budget-s``; each decision is stored (a ``sweep_cell`` record).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engineroom.bench.clientside import ClientMonitor
from engineroom.bench.suites.context import SuiteContext, stream_count, sweep_contexts
from engineroom.bench.suites.specs import SuiteSpec
from engineroom.bench.suites.streams import StreamDriver, run_round
from engineroom.bench.sweep import knee as sweep

__all__ = ["run_sweep"]


def run_sweep(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None],
              monitor: ClientMonitor | None = None) -> None:
    """Cells (prompt size x N), each ``rounds`` rounds, none started that its estimate says would
    overrun ``budget_s``; warm-ups are single requests before the first cell."""
    max_n = stream_count(spec, ctx)
    contexts = sweep_contexts(spec, ctx.server)
    counts = sweep.stream_counts(max_n)
    start = time.perf_counter()
    done: list[dict[str, Any]] = []
    round_no = 0
    with StreamDriver(ctx.new_client, max_n, ctx.timeout_s, monitor) as driver:
        for i in range(spec.warmup):
            run_round(spec, ctx, driver, 1, contexts[0], round_no=round_no, index=i, warmup=True,
                   group={"streams": 1, "ctx": contexts[0]})
            round_no += 1
            tick(f"warm-up {i + 1}")
        for c in contexts:
            for n in counts:
                elapsed = time.perf_counter() - start
                estimate = sweep.estimate_cell_s(c, n, spec.rounds, done)
                cell = {"ctx": c, "streams": n, "estimate_s": estimate, "elapsed_s": elapsed,
                        "budget_s": spec.budget_s}
                if estimate is not None and elapsed + estimate > spec.budget_s:
                    ctx.store(sweep.SWEEP_CELL_KIND, {**cell, "status": "skipped"})
                    tick(f"ctx {c} N={n} skipped (budget)")
                    continue
                slowest = 0.0
                for r in range(spec.rounds):
                    t0 = time.perf_counter()
                    run_round(spec, ctx, driver, n, c, round_no=round_no, index=r, warmup=False,
                           group={"streams": n, "ctx": c})
                    round_no += 1
                    slowest = max(slowest, time.perf_counter() - t0)
                done.append({"ctx": c, "streams": n, "round_s": slowest})
                ctx.store(sweep.SWEEP_CELL_KIND, {**cell, "status": "run", "round_s": slowest,
                                                  "took_s": time.perf_counter() - start - elapsed})
                tick(f"ctx {c} N={n}")
