"""The rate suite's run: a seeded Poisson schedule (``rate.arrivals``), each request sent at its
scheduled time by the first free sender; every record keeps ``scheduled_s`` and ``scheduled_lag_us``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import as_completed

from engineroom.bench.clientside import ClientMonitor
from engineroom.bench.rate.arrivals import poisson_schedule
from engineroom.bench.suites.context import SuiteContext, concurrency_prompt_tokens
from engineroom.bench.suites.haystack import haystack
from engineroom.bench.suites.request import sequential_request
from engineroom.bench.suites.specs import SuiteSpec
from engineroom.bench.suites.streams import SCHEDULE_AHEAD_S, StreamDriver, submit
from engineroom.bench.workloads import Workload

__all__ = ["run_rate"]


def run_rate(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None],
             monitor: ClientMonitor | None = None) -> None:
    """Warm-ups one at a time, then every arrival of the schedule sent at its time once one of
    ``max_inflight`` streams is free (a later send counts in its ``scheduled_lag_us``)."""
    schedule = poisson_schedule(spec.rate, spec.arrival_seed, duration_s=spec.duration_s, count=spec.requests)
    tokens = concurrency_prompt_tokens(spec, ctx.server)
    group = {"rate": spec.rate}
    client = ctx.new_client()
    for i in range(spec.warmup):
        prompt = haystack(ctx.salts(), tokens, ctx.count_tokens)
        rec = sequential_request(spec, ctx, client, Workload(f"rate {spec.rate:g}/s", prompt.text, spec.max_tokens),
                                 index=i, warmup=True,
                                 extra={"group": group, "salt": prompt.salt, "target_tokens": tokens,
                                        "counted_tokens": prompt.counted_tokens, "sized_by": prompt.sized_by})
        ctx.store("bench_request", rec)
        tick(f"warm-up {i + 1}")
    prompts = [haystack(ctx.salts(), tokens, ctx.count_tokens) for _ in schedule]     # sized before the clock
    workers = max(1, min(spec.max_inflight, len(schedule)))
    with StreamDriver(ctx.new_client, workers, ctx.timeout_s, monitor) as driver:   # Ctrl-C: the rest is dropped
        driver.stall_s = ctx.stall_limit(tokens * workers)
        t0 = time.perf_counter() + SCHEDULE_AHEAD_S
        waits = dict(submit(spec, ctx, driver, Workload(f"rate {spec.rate:g}/s", prompts[i].text, spec.max_tokens),
                             index=i, warmup=False, t_scheduled=t0 + off,
                             extra={"group": group, "arrival": i, "scheduled_s": off, "salt": prompts[i].salt,
                                    "target_tokens": tokens, "counted_tokens": prompts[i].counted_tokens,
                                    "sized_by": prompts[i].sized_by})
                     for i, off in enumerate(schedule))
        for n, fut in enumerate(as_completed(waits), 1):
            ctx.store("bench_request", waits[fut]())
            tick(f"arrival {n} of {len(schedule)} answered")
