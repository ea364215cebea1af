"""The concurrency suite's run: N streams at once, round after round, on one event loop.

N = the slot count the engine reports (``ServerInfo.total_slots``) or the one the caller gives
(``suites.context.stream_count``); never guessed. Every stream of a round has one *scheduled* send
time; each record keeps ``scheduled_lag_us`` (actual send - scheduled), so latency is measured from
the schedule and client-side queueing counts (``suites.streams``).
"""

from __future__ import annotations

from collections.abc import Callable

from engineroom.bench.clientside import ClientMonitor
from engineroom.bench.suites.context import SuiteContext, concurrency_prompt_tokens, stream_count
from engineroom.bench.suites.specs import SuiteSpec
from engineroom.bench.suites.streams import StreamDriver, run_round

__all__ = ["run_concurrency"]


def run_concurrency(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None],
                    monitor: ClientMonitor | None = None) -> None:
    n = stream_count(spec, ctx)
    tokens = concurrency_prompt_tokens(spec, ctx.server)
    rounds = [(True, i) for i in range(spec.warmup)] + [(False, i) for i in range(spec.rounds)]
    with StreamDriver(ctx.new_client, n, ctx.timeout_s, monitor) as driver:
        for round_no, (warmup, index) in enumerate(rounds):
            run_round(spec, ctx, driver, n, tokens, round_no=round_no, index=index, warmup=warmup,
                   group={"streams": n})
            tick(f"N={n} {'warm-up' if warmup else 'round'} {index + 1}")
