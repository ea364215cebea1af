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
  scheduled), so latency is measured from the schedule and client-side queueing counts.

Records are ``runner.measure_request``'s, plus: ``suite``, ``group`` (what the figures are
grouped by), ``salt`` / ``sized_by`` / ``target_tokens`` for haystacks, ``round`` / ``stream``
/ ``scheduled_lag_us`` for concurrency, ``arrival_kinds`` (reasoning / content per token
chunk, run-length), ``counters_delta`` (the engine's counters around a sequential request) and
``discarded`` (why, or None). Around the whole run: ``engine_metrics`` before / after, and the
client's own load (``client_load``: its CPU time and wake-up lags) — all stored raw.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

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

__all__ = ["MAX_CACHE_RETRIES", "SuiteContext", "SuiteResult", "run_suite", "suite_conditions"]

MAX_CACHE_RETRIES = 3
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
    return out


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


def _payload(spec: SuiteSpec, ctx: SuiteContext, workload: Workload) -> tuple[dict[str, Any], dict[str, Any]]:
    body = dict(ctx.server.capabilities.full_length_body)
    payload: dict[str, Any] = {"model": ctx.server.model_id or "default", "messages": workload.messages(),
                               "max_tokens": workload.max_tokens, "stream": True,
                               "stream_options": {"include_usage": True}, **spec.sampler.as_payload(), **body}
    sent = {"max_tokens": workload.max_tokens, "sampler": spec.sampler.as_payload(), "body": body,
            "prompt_sha256": workload.prompt_sha256[:16]}
    return payload, sent


def _request(spec: SuiteSpec, ctx: SuiteContext, client: StreamingClient, workload: Workload, *, index: int,
             warmup: bool, extra: Mapping[str, Any], t_scheduled: float | None = None) -> dict[str, Any]:
    payload, sent = _payload(spec, ctx, workload)
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
                warmup: bool, extra: Mapping[str, Any]) -> dict[str, Any]:
    before = ctx.metrics() if ctx.metrics else None
    rec = _request(spec, ctx, client, workload, index=index, warmup=warmup, extra=extra)
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


def _run_concurrency(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    n = _streams(spec, ctx)
    tokens = _concurrency_prompt(spec, ctx.server)
    clients = [ctx.new_client() for _ in range(n)]
    rounds = [(True, i) for i in range(spec.warmup)] + [(False, i) for i in range(spec.rounds)]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="engineroom-stream") as pool:
        for round_no, (warmup, index) in enumerate(rounds):
            prompts = [haystack(ctx.salts(), tokens, ctx.count_tokens) for _ in range(n)]   # sized before the clock
            t_sched = time.perf_counter() + SCHEDULE_AHEAD_S
            futures = [pool.submit(_request, spec, ctx, clients[i],
                                   Workload(f"concurrency N={n}", prompts[i].text, spec.max_tokens),
                                   index=index, warmup=warmup, t_scheduled=t_sched,
                                   extra={"group": {"streams": n}, "round": round_no, "stream": i,
                                          "salt": prompts[i].salt, "target_tokens": tokens,
                                          "counted_tokens": prompts[i].counted_tokens,
                                          "sized_by": prompts[i].sized_by})
                       for i in range(n)]
            for fut in futures:
                ctx.store("bench_request", fut.result())
            tick(f"N={n} {'warm-up' if warmup else 'round'} {index + 1}")


def _total(spec: SuiteSpec, ctx: SuiteContext, depths: Sequence[int]) -> int:
    if spec.kind == "depth":
        return len(depths) * (spec.warmup + spec.measured)
    if spec.kind == "concurrency":
        return spec.warmup + spec.rounds
    return len(_workloads(spec, ctx)) * (spec.warmup + spec.measured)


def run_suite(spec: SuiteSpec, ctx: SuiteContext) -> SuiteResult:
    """Run ``spec``; records go to ``ctx.emit`` as they finish (an interrupted run keeps them)."""
    if spec.kind not in ("standard", "depth", "concurrency", "spec"):
        raise BadInput(f"unknown suite kind {spec.kind!r}.")
    conditions = suite_conditions(spec, ctx)
    depths = conditions["bench"].get("depths") or []
    total, done = _total(spec, ctx, depths), 0

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
            else:
                _run_standard(spec, ctx, tick)
    finally:
        ctx.store(CLIENT_LOAD_KIND, monitor.record())
        after = ctx.metrics() if ctx.metrics else None
        if after:
            ctx.store(METRICS_RECORD_KIND, {"when": "after", "counters": dict(after)})
    return SuiteResult(conditions, list(ctx.records), summarize_suite(ctx.records, conditions))
