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

Records are ``runner.measure_request``'s, plus: ``suite``, ``group`` (what the figures are
grouped by), ``salt`` / ``sized_by`` / ``target_tokens`` for haystacks, ``round`` / ``stream``
/ ``scheduled_lag_us`` for concurrency and sweep, ``session`` / ``turn`` /
``previous_prompt_tokens`` / ``step`` for agentic, ``arrival`` / ``scheduled_s`` for rate,
``tool_calls`` (name and argument size of each call the model made), ``arrival_kinds`` (reasoning / content per token
chunk, run-length), ``counters_delta`` (the engine's counters around a sequential request) and
``discarded`` (why, or None). Around the whole run: ``engine_metrics`` before / after, and the
client's own load (``client_load``: its CPU time and wake-up lags) — all stored raw.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any

from engineroom.bench import agentic, sweep
from engineroom.bench.arrivals import poisson_schedule
from engineroom.bench.clientside import ClientMonitor, encode_kinds
from engineroom.bench.records import BenchRequest
from engineroom.bench.runner import StreamingClient, measure_request
from engineroom.bench.statistics import METRICS_RECORD_KIND
from engineroom.bench.suites import (
    DEPTH_HEADROOM,
    SuiteSpec,
    TokenCounter,
    fresh_salt,
    haystack,
    plan_depths,
)
from engineroom.bench.suitestats import CLIENT_LOAD_KIND, cache_reuse, counters_delta
from engineroom.bench.suitesummary import summarize_suite
from engineroom.bench.workloads import Workload
from engineroom.engines.base import ServerInfo
from engineroom.errors import BadInput

__all__ = ["AGENTIC_STOP_KIND", "MAX_CACHE_RETRIES", "SUITE_KINDS", "SuiteContext", "SuiteResult", "run_suite",
           "suite_conditions"]

MAX_CACHE_RETRIES = 3
SUITE_KINDS = ("standard", "depth", "concurrency", "spec", "agentic", "sweep", "rate")
AGENTIC_STOP_KIND = agentic.STOP_KIND
SCHEDULE_AHEAD_S = 0.05      # a round's streams are scheduled this far ahead, so every thread is waiting

Emit = Callable[[str, dict[str, Any]], Any]          # (record kind, payload) -> stored
Progress = Callable[[int, int, str], Any]


@dataclass
class SuiteContext:
    """What a suite run needs besides the spec; engine facts arrive as plain callables (flows
    passes the adapter's hooks through the Engine facade), so bench never touches an adapter."""

    server: ServerInfo
    new_client: Callable[[], StreamingClient]
    count_tokens: TokenCounter | None = None
    metrics: Callable[[], Mapping[str, float] | None] | None = None
    emit: Emit | None = None
    progress: Progress | None = None
    salts: Callable[[], str] = fresh_salt
    streams: int | None = None                 # concurrency: the caller's explicit N
    extra_workloads: tuple[Workload, ...] = ()  # standard: the user's prompt file
    timeout_s: float = 600.0
    records: list[dict[str, Any]] = field(default_factory=list)

    def store(self, kind: str, payload: dict[str, Any]) -> None:
        self.records.append({"kind": kind, "payload": payload})
        if self.emit:
            self.emit(kind, payload)


@dataclass
class SuiteResult:
    conditions: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.summary["status"])


def _streams(spec: SuiteSpec, ctx: SuiteContext) -> int:
    if ctx.streams is not None:
        if ctx.streams < 1:
            raise BadInput(f"--streams must be at least 1, not {ctx.streams}.")
        return ctx.streams
    if not ctx.server.total_slots:
        raise BadInput(f"the engine ({ctx.server.engine}) does not report how many sequences it serves at once; "
                       "give --streams N (engineroom will not guess it).")
    return int(ctx.server.total_slots)


def suite_conditions(spec: SuiteSpec, ctx: SuiteContext) -> dict[str, Any]:
    """The ``bench`` part of the run's conditions for a suite (sizes resolved for this server)."""
    server = ctx.server
    out: dict[str, Any] = {
        "engine": server.engine, "engine_version": server.engine_version, "model_id": server.model_id,
        "url": server.url, "n_ctx": server.n_ctx,
        "bench": {"suite": spec.name, "kind": spec.kind, "about": spec.about, "warmup": spec.warmup,
                  "measured": spec.measured, "max_tokens": spec.max_tokens, "sampler": asdict(spec.sampler),
                  "full_length_body": dict(server.capabilities.full_length_body),
                  "full_length_reason": server.capabilities.reasons.get("full_length", ""),
                  "cv_threshold_pct": spec.cv_threshold_pct,
                  "agreement_tolerance_pct": spec.agreement_tolerance_pct,
                  "tokenizer": "engine" if ctx.count_tokens else "none (sizes estimated)",
                  "timeout_s": ctx.timeout_s},
    }
    if spec.kind == "depth":
        out["bench"]["depths"] = plan_depths(spec.depths, server.n_ctx, spec.max_tokens, spec.near_end)
    if spec.kind == "concurrency":
        n = _streams(spec, ctx)
        out["bench"].update(streams=n, streams_source="--streams" if ctx.streams is not None else
                            "the engine's reported slot count", rounds=spec.rounds,
                            prompt_tokens=_concurrency_prompt(spec, server))
    if spec.kind in ("standard", "spec"):
        out["bench"]["workloads"] = [w.describe() for w in _workloads(spec, ctx)]
    if spec.kind == "agentic":
        turns, scale = agentic.plan_turns(server.n_ctx, spec.max_tokens, spec.turns, spec.prompt_tokens)
        out["bench"].update(sessions=spec.measured, turns=len(turns), turns_asked=spec.turns, scale=scale,
                            target_tokens=spec.prompt_tokens, context_fill=agentic.CONTEXT_FILL,
                            tool_choice=spec.tool_choice, tools=[t["function"]["name"] for t in agentic.TOOLS],
                            plan=[{"turn": t.turn, "tool": t.exchange.tool if t.exchange else None,
                                   "output_tokens": t.output_tokens, "context_tokens": t.context_tokens}
                                  for t in turns])
    if spec.kind == "sweep":
        n = _streams(spec, ctx)
        out["bench"].update(streams_max=n, streams_source="--streams" if ctx.streams is not None else
                            "the engine's reported slot count", stream_counts=sweep.stream_counts(n),
                            contexts=_sweep_contexts(spec, server), rounds=spec.rounds, budget_s=spec.budget_s,
                            knee_gain_pct=spec.knee_gain_pct, slo_ttft_ms=spec.slo_ttft_ms,
                            slo_itl_ms=spec.slo_itl_ms)
    if spec.kind == "rate":
        schedule = poisson_schedule(spec.rate, spec.arrival_seed, duration_s=spec.duration_s, count=spec.requests)
        out["bench"].update(rate=spec.rate, duration_s=spec.duration_s, requests=spec.requests,
                            arrival_seed=spec.arrival_seed, scheduled=len(schedule),
                            schedule_span_s=schedule[-1] if schedule else 0.0, max_inflight=spec.max_inflight,
                            prompt_tokens=_concurrency_prompt(spec, server), slo_ttft_ms=spec.slo_ttft_ms,
                            slo_itl_ms=spec.slo_itl_ms)
    return out


def _sweep_contexts(spec: SuiteSpec, server: ServerInfo) -> list[int]:
    room = _concurrency_prompt(spec.with_(prompt_tokens=10**9), server)
    asked = spec.contexts or (spec.prompt_tokens,)
    return sorted({min(int(c), room) for c in asked})


def _concurrency_prompt(spec: SuiteSpec, server: ServerInfo) -> int:
    room = (server.n_ctx or 0) - spec.max_tokens - DEPTH_HEADROOM
    if room < 64:
        raise BadInput(f"the engine's context per slot ({server.n_ctx} tokens) leaves no room for a prompt "
                       f"with {spec.max_tokens} tokens out.")
    return min(spec.prompt_tokens, room)


def _workloads(spec: SuiteSpec, ctx: SuiteContext) -> tuple[Workload, ...]:
    chosen = tuple(spec.workloads) + tuple(ctx.extra_workloads)
    if spec.max_tokens:
        chosen = tuple(w.with_max_tokens(spec.max_tokens) if w not in ctx.extra_workloads else w for w in chosen)
    n_ctx = ctx.server.n_ctx
    if n_ctx:   # scaled to the context the engine reports: room for the prompt and the template
        cap = max(16, n_ctx - DEPTH_HEADROOM - len(max((w.prompt for w in chosen), key=len, default="")) // 2)
        chosen = tuple(w.with_max_tokens(min(w.max_tokens, cap)) for w in chosen)
    return chosen


def _payload(spec: SuiteSpec, ctx: SuiteContext, workload: Workload, messages: list[dict[str, Any]] | None = None,
             request: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The body and what the record keeps of it; ``messages`` replace the workload's (agentic),
    ``request`` adds fields (its tools and tool_choice)."""
    body = dict(ctx.server.capabilities.full_length_body)
    payload: dict[str, Any] = {"model": ctx.server.model_id or "default",
                               "messages": messages if messages is not None else workload.messages(),
                               "max_tokens": workload.max_tokens, "stream": True,
                               "stream_options": {"include_usage": True}, **spec.sampler.as_payload(),
                               **(request or {}), **body}
    sent: dict[str, Any] = {"max_tokens": workload.max_tokens, "sampler": spec.sampler.as_payload(), "body": body,
                            "prompt_sha256": workload.prompt_sha256[:16]}
    if messages is not None:
        sent["messages"] = len(messages)
    if request:
        sent["request"] = {k: ([t.get("function", {}).get("name") for t in v] if k == "tools" else v)
                           for k, v in request.items()}
    return payload, sent


def _request(spec: SuiteSpec, ctx: SuiteContext, client: StreamingClient, workload: Workload, *, index: int,
             warmup: bool, extra: Mapping[str, Any], t_scheduled: float | None = None,
             messages: list[dict[str, Any]] | None = None, request: Mapping[str, Any] | None = None) -> dict[str, Any]:
    payload, sent = _payload(spec, ctx, workload, messages, request)
    if t_scheduled is not None:
        delay = t_scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    sent_unix = time.time()
    t0 = time.perf_counter()
    try:
        result = ctx_stream(client, payload, ctx.timeout_s)
        rec = measure_request(result, workload=workload, index=index, warmup=warmup, sent=sent,
                              sent_unix=sent_unix, server=ctx.server).to_dict()
        rec["arrival_kinds"] = encode_kinds(getattr(result, "token_kinds", None) or [])
        calls = getattr(result, "tool_calls", None) or []
        if calls:
            rec["tool_calls"] = [{"name": c.name, "arguments_chars": len(c.arguments or "")} for c in calls]
        t_request = float(result.t_request)
    except Exception as exc:  # noqa: BLE001 - a transport failure becomes a failed request, as in the runner
        rec = BenchRequest(workload=workload.name, index=index, warmup=warmup, sent=sent, sent_unix=sent_unix,
                           status=None, error=f"{type(exc).__name__}: {exc}",
                           end_us=round((time.perf_counter() - t0) * 1e6), arrivals_us=[],
                           completion_tokens=None, prompt_tokens=None).to_dict()
        rec["arrival_kinds"] = []
        t_request = t0
    rec.update(suite=spec.name, discarded=None, **extra)
    if t_scheduled is not None:
        rec["scheduled_lag_us"] = round((t_request - t_scheduled) * 1e6)
    return rec


def ctx_stream(client: StreamingClient, payload: dict[str, Any], timeout: float) -> Any:
    return client.stream_chat(payload, timeout=timeout)


def _phases(spec: SuiteSpec) -> list[tuple[bool, int]]:
    return [(True, i) for i in range(spec.warmup)] + [(False, i) for i in range(spec.measured)]


def _sequential(spec: SuiteSpec, ctx: SuiteContext, client: StreamingClient, workload: Workload, *, index: int,
                warmup: bool, extra: Mapping[str, Any], messages: list[dict[str, Any]] | None = None,
                request: Mapping[str, Any] | None = None) -> dict[str, Any]:
    before = ctx.metrics() if ctx.metrics else None
    rec = _request(spec, ctx, client, workload, index=index, warmup=warmup, extra=extra, messages=messages,
                   request=request)
    after = ctx.metrics() if ctx.metrics else None
    if before and after:
        rec["counters_delta"] = counters_delta(before, after)
    return rec


def _run_standard(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    client = ctx.new_client()
    for workload in _workloads(spec, ctx):
        for warmup, index in _phases(spec):
            rec = _sequential(spec, ctx, client, workload, index=index, warmup=warmup,
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
                rec = _sequential(spec, ctx, client, workload, index=index, warmup=warmup,
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


def _round(spec: SuiteSpec, ctx: SuiteContext, pool: ThreadPoolExecutor, clients: Sequence[StreamingClient], n: int,
           tokens: int, *, round_no: int, index: int, warmup: bool, group: Mapping[str, Any]) -> None:
    """One round of ``n`` simultaneous streams on salted ``tokens``-token prompts, one scheduled send."""
    prompts = [haystack(ctx.salts(), tokens, ctx.count_tokens) for _ in range(n)]   # sized before the clock
    t_sched = time.perf_counter() + SCHEDULE_AHEAD_S
    futures = [pool.submit(_request, spec, ctx, clients[i],
                           Workload(f"{spec.kind} N={n}", prompts[i].text, spec.max_tokens),
                           index=index, warmup=warmup, t_scheduled=t_sched,
                           extra={"group": dict(group), "round": round_no, "stream": i,
                                  "salt": prompts[i].salt, "target_tokens": tokens,
                                  "counted_tokens": prompts[i].counted_tokens,
                                  "sized_by": prompts[i].sized_by})
               for i in range(n)]
    for fut in futures:
        ctx.store("bench_request", fut.result())


def _run_concurrency(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    n = _streams(spec, ctx)
    tokens = _concurrency_prompt(spec, ctx.server)
    clients = [ctx.new_client() for _ in range(n)]
    rounds = [(True, i) for i in range(spec.warmup)] + [(False, i) for i in range(spec.rounds)]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="engineroom-stream") as pool:
        for round_no, (warmup, index) in enumerate(rounds):
            _round(spec, ctx, pool, clients, n, tokens, round_no=round_no, index=index, warmup=warmup,
                   group={"streams": n})
            tick(f"N={n} {'warm-up' if warmup else 'round'} {index + 1}")


def _run_agentic(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    """Warm-ups (turn 1 of a session of their own each), then ``measured`` sessions of the plan's turns."""
    plan, _ = agentic.plan_turns(ctx.server.n_ctx, spec.max_tokens, spec.turns, spec.prompt_tokens)
    request = {"tools": agentic.TOOLS, "tool_choice": spec.tool_choice}
    client = ctx.new_client()
    n_ctx = int(ctx.server.n_ctx or 0)
    for i in range(spec.warmup):
        session = agentic.SessionBuilder(ctx.salts(), ctx.count_tokens)
        workload = Workload("agentic turn 1", json.dumps(session.messages), spec.max_tokens)   # hashed, not sent
        rec = _sequential(spec, ctx, client, workload, index=i, warmup=True, messages=list(session.messages),
                          request=request, extra={"group": {"turn": 1}, "session": -1 - i, "turn": 1,
                                                  "salt": session.salt, "previous_prompt_tokens": None, "step": {}})
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
            rec = _sequential(spec, ctx, client, workload, index=s, warmup=False, messages=list(session.messages),
                              request=request, extra={"group": {"turn": turn.turn}, "session": s,
                                                      "turn": turn.turn, "salt": session.salt,
                                                      "previous_prompt_tokens": previous, "step": step,
                                                      "sized_by": agentic.sized_by(step)})
            ctx.store("bench_request", rec)
            previous = rec.get("prompt_tokens") if isinstance(rec.get("prompt_tokens"), int) else previous
            tick(f"session {s + 1} turn {turn.turn}")


def _run_sweep(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    """Cells (prompt size x N), each ``rounds`` rounds, none started that its estimate says would
    overrun ``budget_s``; warm-ups are single requests before the first cell."""
    max_n = _streams(spec, ctx)
    contexts = _sweep_contexts(spec, ctx.server)
    counts = sweep.stream_counts(max_n)
    clients = [ctx.new_client() for _ in range(max_n)]
    start = time.perf_counter()
    done: list[dict[str, Any]] = []
    round_no = 0
    with ThreadPoolExecutor(max_workers=max_n, thread_name_prefix="engineroom-stream") as pool:
        for i in range(spec.warmup):
            _round(spec, ctx, pool, clients, 1, contexts[0], round_no=round_no, index=i, warmup=True,
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
                    _round(spec, ctx, pool, clients, n, c, round_no=round_no, index=r, warmup=False,
                           group={"streams": n, "ctx": c})
                    round_no += 1
                    slowest = max(slowest, time.perf_counter() - t0)
                done.append({"ctx": c, "streams": n, "round_s": slowest})
                ctx.store(sweep.SWEEP_CELL_KIND, {**cell, "status": "run", "round_s": slowest,
                                                  "took_s": time.perf_counter() - start - elapsed})
                tick(f"ctx {c} N={n}")


def _run_rate(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    """Warm-ups one at a time, then every arrival of the schedule sent at its time by a free sender."""
    schedule = poisson_schedule(spec.rate, spec.arrival_seed, duration_s=spec.duration_s, count=spec.requests)
    tokens = _concurrency_prompt(spec, ctx.server)
    group = {"rate": spec.rate}
    client = ctx.new_client()
    for i in range(spec.warmup):
        prompt = haystack(ctx.salts(), tokens, ctx.count_tokens)
        rec = _sequential(spec, ctx, client, Workload(f"rate {spec.rate:g}/s", prompt.text, spec.max_tokens),
                          index=i, warmup=True, extra={"group": group, "salt": prompt.salt, "target_tokens": tokens,
                                                       "counted_tokens": prompt.counted_tokens,
                                                       "sized_by": prompt.sized_by})
        ctx.store("bench_request", rec)
        tick(f"warm-up {i + 1}")
    prompts = [haystack(ctx.salts(), tokens, ctx.count_tokens) for _ in schedule]     # sized before the clock
    workers = max(1, min(spec.max_inflight, len(schedule)))
    free: queue.SimpleQueue[StreamingClient] = queue.SimpleQueue()
    for c in [client] + [ctx.new_client() for _ in range(workers - 1)]:
        free.put(c)

    stop = threading.Event()            # Ctrl-C: arrivals not yet sent are dropped, not waited for

    def send(i: int, t_sched: float) -> dict[str, Any] | None:
        sender = free.get()
        try:
            if stop.wait(max(0.0, t_sched - time.perf_counter())):
                return None
            return _request(spec, ctx, sender, Workload(f"rate {spec.rate:g}/s", prompts[i].text, spec.max_tokens),
                            index=i, warmup=False, t_scheduled=t_sched,
                            extra={"group": group, "arrival": i, "scheduled_s": schedule[i],
                                   "salt": prompts[i].salt, "target_tokens": tokens,
                                   "counted_tokens": prompts[i].counted_tokens, "sized_by": prompts[i].sized_by})
        finally:
            free.put(sender)

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="engineroom-arrival")
    try:
        t0 = time.perf_counter() + SCHEDULE_AHEAD_S
        futures: list[Future[dict[str, Any] | None]] = [pool.submit(send, i, t0 + off)
                                                        for i, off in enumerate(schedule)]
        for n, fut in enumerate(as_completed(futures), 1):
            answered = fut.result()
            if answered is not None:
                ctx.store("bench_request", answered)
            tick(f"arrival {n} of {len(schedule)} answered")
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)


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
    return len(_workloads(spec, ctx)) * (spec.warmup + spec.measured)


_RUNNERS: dict[str, Callable[[SuiteSpec, SuiteContext, Callable[[str], None]], None]] = {
    "agentic": _run_agentic, "sweep": _run_sweep, "rate": _run_rate}


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
    try:
        with monitor:
            if spec.kind == "depth":
                _run_depth(spec, ctx, depths, tick)
            elif spec.kind == "concurrency":
                _run_concurrency(spec, ctx, tick)
            elif spec.kind in _RUNNERS:
                _RUNNERS[spec.kind](spec, ctx, tick)
            else:
                _run_standard(spec, ctx, tick)
    finally:
        ctx.store(CLIENT_LOAD_KIND, monitor.record())
        after = ctx.metrics() if ctx.metrics else None
        if after:
            ctx.store(METRICS_RECORD_KIND, {"when": "after", "counters": dict(after)})
    return SuiteResult(conditions, list(ctx.records), summarize_suite(ctx.records, conditions))
