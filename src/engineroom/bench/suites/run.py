"""Run a longer suite (``suites.specs.SuiteSpec``) against a live server; every request a raw record.

This is the frame every kind shares: the run's conditions (``suites.context``), the progress ticks,
the engine's counters before and after, the client's own load (``clientside.ClientMonitor``), the
watchdog's stop (an ``abort`` record), and the summary (``suites.summary``). What each kind sends is
in its own folder under ``bench/`` (the sizes come from ``suites.specs``; the figures from
``stats`` and ``suites.summary``):

- ``standard`` / ``spec``: each workload's warm-ups then measured requests, one at a time (here);
- ``depth``: ``depth.run``; ``agentic``: ``agentic.run``;
- ``concurrency``, ``sweep``, ``rate``: ``concurrency.run``, ``sweep.run``, ``rate.run``, every
  stream on one event loop (``suites.streams``).

Records (made by ``suites.request``) are ``runner.measure_request``'s, plus: ``suite``, ``group`` (what the
figures are grouped by), ``salt`` / ``sized_by`` / ``target_tokens`` for haystacks, ``round`` / ``stream``
/ ``scheduled_lag_us`` for concurrency and sweep, ``session`` / ``turn`` /
``previous_prompt_tokens`` / ``step`` for agentic, ``arrival`` / ``scheduled_s`` for rate,
``tool_calls`` (name and argument size of each call the model made), ``arrival_kinds`` (reasoning / content per token
chunk, run-length), ``counters_delta`` (the engine's counters around a sequential request) and
``discarded`` (why, or None). Around the whole run: ``engine_metrics`` before / after, and the
client's own load (``client_load``: its CPU time and wake-up lags) — all stored raw.

What a run is given and resolves before its first request (``SuiteContext``, ``SuiteResult``,
``suite_conditions`` and the sizes) is in ``suites.context``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engineroom.bench.agentic.run import run_agentic
from engineroom.bench.clientside import ClientMonitor
from engineroom.bench.depth.run import run_depth
from engineroom.bench.stats import CLIENT_LOAD_KIND
from engineroom.bench.suites.context import (
    SuiteContext,
    SuiteResult,
    suite_conditions,
    suite_workloads,
)
from engineroom.bench.suites.request import phases, sequential_request
from engineroom.bench.suites.specs import SuiteSpec
from engineroom.bench.suites.summary import summarize_suite
from engineroom.bench.watchdog import ABORT_KIND, BenchAborted, Watchdog
from engineroom.errors import BadInput
from engineroom.records.statistics import METRICS_RECORD_KIND

__all__ = ["SUITE_KINDS", "run_suite"]

SUITE_KINDS = ("standard", "depth", "concurrency", "spec", "agentic", "sweep", "rate")


def _run_standard(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    client = ctx.new_client()
    for workload in suite_workloads(spec, ctx):
        for warmup, index in phases(spec):
            rec = sequential_request(spec, ctx, client, workload, index=index, warmup=warmup,
                                     extra={"group": {"workload": workload.name}})
            ctx.store("bench_request", rec)
            tick(f"{workload.name} {'warm-up' if warmup else 'measured'} {index + 1}")


def _total(spec: SuiteSpec, ctx: SuiteContext, depths: Sequence[int], bench: Mapping[str, Any]) -> int:
    if spec.kind == "depth":
        return len(depths) * (spec.warmup + spec.measured)
    if spec.kind == "concurrency":
        return spec.warmup + spec.rounds
    if spec.kind == "agentic":
        return spec.warmup + spec.measured * int(bench.get("turns") or 0)
    if spec.kind == "sweep":
        return spec.warmup + len(bench.get("contexts") or []) * len(bench.get("stream_counts") or [])
    if spec.kind == "rate":
        return spec.warmup + int(bench.get("scheduled") or 0)
    return len(suite_workloads(spec, ctx)) * (spec.warmup + spec.measured)


def _multi_stream(kind: str) -> Callable[[SuiteSpec, SuiteContext, Callable[[str], None], ClientMonitor], None]:
    """The run of a multi-stream kind, imported when it is run: one event loop, every stream (it loads aiohttp)."""
    if kind == "concurrency":
        from engineroom.bench.concurrency.run import run_concurrency
        return run_concurrency
    if kind == "sweep":
        from engineroom.bench.sweep.run import run_sweep
        return run_sweep
    from engineroom.bench.rate.run import run_rate
    return run_rate


def run_suite(spec: SuiteSpec, ctx: SuiteContext) -> SuiteResult:
    """Run ``spec``; records go to ``ctx.emit`` as they finish (an interrupted run keeps them)."""
    if spec.kind not in SUITE_KINDS:
        raise BadInput(f"unknown suite kind {spec.kind!r}.")
    conditions = suite_conditions(spec, ctx)
    depths = conditions["bench"].get("depths") or []
    total, done = _total(spec, ctx, depths, conditions["bench"]), 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if ctx.progress:
            ctx.progress(done, total, label)

    if ctx.progress:
        ctx.progress(0, total, "starting")
    before = ctx.metrics() if ctx.metrics else None
    if before:
        ctx.store(METRICS_RECORD_KIND, {"when": "before", "counters": dict(before)})
    monitor = ClientMonitor()
    ctx.watchdog = ctx.watchdog or Watchdog(floor_s=ctx.stall_floor_s, timeout_s=ctx.timeout_s)
    try:
        with monitor:
            if spec.kind == "depth":
                run_depth(spec, ctx, depths, tick)
            elif spec.kind == "agentic":
                run_agentic(spec, ctx, tick)
            elif spec.kind in ("concurrency", "sweep", "rate"):
                _multi_stream(spec.kind)(spec, ctx, tick, monitor)
            else:
                _run_standard(spec, ctx, tick)
    except BenchAborted as stop:
        ctx.store(ABORT_KIND, stop.record)
        if ctx.progress:
            ctx.progress(done, total, f"stopped: {stop.reason}")
    finally:
        ctx.store(CLIENT_LOAD_KIND, monitor.record())
        after = ctx.metrics() if ctx.metrics else None
        if after:
            ctx.store(METRICS_RECORD_KIND, {"when": "after", "counters": dict(after)})
    return SuiteResult(conditions, list(ctx.records), summarize_suite(ctx.records, conditions))
