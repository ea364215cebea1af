"""Run a longer suite (``suites.SuiteSpec``) against a live server; every request a raw record.

What each kind does (the sizes come from ``suites``; the figures from ``suitestats``):

- ``standard`` / ``spec``: each workload's warm-ups then measured requests, one at a time;
- ``depth``: for every depth that fits the engine's context per slot, warm-ups then measured
  requests on a freshly salted haystack of that many tokens (sized by the engine's tokenizer
  where it has one). After each request the prefix-cache guard (``suitestats.cache_reuse``:
  the engine's cached-token count through its adapter, or its counters' delta) decides: a
  sample that reused more than the chat template's shared preamble is stored, marked
  ``discarded``, and re-run with a fresh salt (up to ``MAX_CACHE_RETRIES`` times);
- ``concurrency``: N streams at once, N = the slot count the engine reports
  (``ServerInfo.total_slots``) or the one the caller gives; never guessed. Every stream of a
  round has one *scheduled* send time; each record keeps ``scheduled_lag_us`` (actual send -
  scheduled), so latency is measured from the schedule and client-side queueing counts;
- ``agentic``: sessions of a recorded coding-agent conversation (``agentic``), one turn at a
  time, each turn the whole conversation so far with the ten tools; a session stops early when
  its next turn would not fit the context with the reply and headroom (an ``agentic_stop``
  record says so);
- ``sweep``: concurrency cells over N and prompt size (``sweep``), a cell skipped when its
  estimate would overrun the budget (each decision a ``sweep_cell`` record);
- ``rate``: a seeded Poisson schedule (``arrivals``); each request is sent at its scheduled
  time by the first free sender, and keeps ``scheduled_s`` and ``scheduled_lag_us``.

Records (made by ``suiterequest``) are ``runner.measure_request``'s, plus: ``suite``, ``group`` (what the
figures are grouped by), ``salt`` / ``sized_by`` / ``target_tokens`` for haystacks, ``round`` / ``stream``
/ ``scheduled_lag_us`` for concurrency and sweep, ``session`` / ``turn`` /
``previous_prompt_tokens`` / ``step`` for agentic, ``arrival`` / ``scheduled_s`` for rate,
``tool_calls`` (name and argument size of each call the model made), ``arrival_kinds`` (reasoning / content per token
chunk, run-length), ``counters_delta`` (the engine's counters around a sequential request) and
``discarded`` (why, or None). Around the whole run: ``engine_metrics`` before / after, and the
client's own load (``client_load``: its CPU time and wake-up lags) — all stored raw.

What a run is given and resolves before its first request (``SuiteContext``, ``SuiteResult``,
``suite_conditions`` and the sizes) is in ``suiteplan``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engineroom.bench import agentic
from engineroom.bench.clientside import ClientMonitor
from engineroom.bench.suiteplan import (
    SuiteContext,
    SuiteResult,
    suite_conditions,
    suite_workloads,
)
from engineroom.bench.suiterequest import sequential_request
from engineroom.bench.suites import (
    DEPTH_HEADROOM,
    SuiteSpec,
    haystack,
)
from engineroom.bench.suitestats import CLIENT_LOAD_KIND, cache_reuse
from engineroom.bench.suitesummary import summarize_suite
from engineroom.bench.watchdog import ABORT_KIND, BenchAborted, Watchdog
from engineroom.bench.workloads import Workload
from engineroom.errors import BadInput
from engineroom.records.statistics import METRICS_RECORD_KIND

__all__ = ["AGENTIC_STOP_KIND", "MAX_CACHE_RETRIES", "SUITE_KINDS", "run_suite"]

MAX_CACHE_RETRIES = 3
SUITE_KINDS = ("standard", "depth", "concurrency", "spec", "agentic", "sweep", "rate")
AGENTIC_STOP_KIND = agentic.STOP_KIND


def _phases(spec: SuiteSpec) -> list[tuple[bool, int]]:
    return [(True, i) for i in range(spec.warmup)] + [(False, i) for i in range(spec.measured)]


def _run_standard(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    client = ctx.new_client()
    for workload in suite_workloads(spec, ctx):
        for warmup, index in _phases(spec):
            rec = sequential_request(spec, ctx, client, workload, index=index, warmup=warmup,
                                     extra={"group": {"workload": workload.name}})
            ctx.store("bench_request", rec)
            tick(f"{workload.name} {'warm-up' if warmup else 'measured'} {index + 1}")


def _run_depth(spec: SuiteSpec, ctx: SuiteContext, depths: Sequence[int], tick: Callable[[str], None]) -> None:
    client = ctx.new_client()
    for depth in depths:
        for warmup, index in _phases(spec):
            for attempt in range(MAX_CACHE_RETRIES + 1):
                prompt = haystack(ctx.salts(), depth, ctx.count_tokens)
                workload = Workload(f"depth {depth}", prompt.text, spec.max_tokens)
                rec = sequential_request(spec, ctx, client, workload, index=index, warmup=warmup,
                                         extra={"group": {"depth": depth}, "salt": prompt.salt, "attempt": attempt,
                                                "target_tokens": prompt.target_tokens,
                                                "counted_tokens": prompt.counted_tokens, "sized_by": prompt.sized_by})
                reuse = cache_reuse(rec)
                if reuse.contaminated and attempt < MAX_CACHE_RETRIES:
                    rec["discarded"] = f"prefix cache: {reuse.describe()}; re-run with a fresh salt"
                    ctx.store("bench_request", rec)
                    continue
                ctx.store("bench_request", rec)
                break
            tick(f"depth {depth} {'warm-up' if warmup else 'measured'} {index + 1}")


def _run_agentic(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    """Warm-ups (turn 1 of a session of their own each), then ``measured`` sessions of the plan's turns."""
    plan, _ = agentic.plan_turns(ctx.server.n_ctx, spec.max_tokens, spec.turns, spec.prompt_tokens)
    request = {"tools": agentic.TOOLS, "tool_choice": spec.tool_choice}
    client = ctx.new_client()
    n_ctx = int(ctx.server.n_ctx or 0)
    for i in range(spec.warmup):
        session = agentic.SessionBuilder(ctx.salts(), ctx.count_tokens)
        workload = Workload("agentic turn 1", json.dumps(session.messages), spec.max_tokens)   # hashed, not sent
        rec = sequential_request(spec, ctx, client, workload, index=i, warmup=True, messages=list(session.messages),
                                 request=request, extra={"group": {"turn": 1}, "session": -1 - i, "turn": 1,
                                                         "salt": session.salt, "previous_prompt_tokens": None,
                                                         "step": {}})
        ctx.store("bench_request", rec)
        tick(f"warm-up {i + 1}")
    for s in range(spec.measured):
        session = agentic.SessionBuilder(ctx.salts(), ctx.count_tokens)
        previous: int | None = None
        for k, turn in enumerate(plan):
            step = session.add(turn)               # the recorded call and its output, sized before the clock
            grown = 0
            if turn.exchange is not None:
                grown = (step.get("output_counted_tokens") or turn.output_tokens) + agentic.call_tokens(turn.exchange)
            if previous is not None and previous + grown + spec.max_tokens + DEPTH_HEADROOM > n_ctx:
                ctx.store(AGENTIC_STOP_KIND, {"session": s, "turn": turn.turn, "previous_prompt_tokens": previous,
                                              "adding_tokens": grown, "n_ctx": n_ctx,
                                              "why": "the next turn would not fit the context with the reply and "
                                                     "headroom"})
                for later in plan[k:]:
                    tick(f"session {s + 1} turn {later.turn} not sent (context)")
                break
            workload = Workload(f"agentic turn {turn.turn}", json.dumps(session.messages), spec.max_tokens)
            rec = sequential_request(spec, ctx, client, workload, index=s, warmup=False,
                                     messages=list(session.messages), request=request,
                                     extra={"group": {"turn": turn.turn}, "session": s,
                                            "turn": turn.turn, "salt": session.salt,
                                            "previous_prompt_tokens": previous, "step": step,
                                            "sized_by": agentic.sized_by(step)})
            ctx.store("bench_request", rec)
            previous = rec.get("prompt_tokens") if isinstance(rec.get("prompt_tokens"), int) else previous
            tick(f"session {s + 1} turn {turn.turn}")


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


_RUNNERS: dict[str, Callable[[SuiteSpec, SuiteContext, Callable[[str], None]], None]] = {"agentic": _run_agentic}


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
                _run_depth(spec, ctx, depths, tick)
            elif spec.kind in ("concurrency", "sweep", "rate"):
                from engineroom.bench import aiostreams  # one event loop, every stream (it loads aiohttp)

                {"concurrency": aiostreams.run_concurrency, "sweep": aiostreams.run_sweep,
                 "rate": aiostreams.run_rate}[spec.kind](spec, ctx, tick, monitor)
            elif spec.kind in _RUNNERS:
                _RUNNERS[spec.kind](spec, ctx, tick)
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
