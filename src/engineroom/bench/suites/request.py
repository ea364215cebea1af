"""One request of a suite, sent and recorded: what every kind of suite shares, the sequential ones
(``suites.run``) and the multi-stream ones on one event loop (``suites.streams``).

``suite_payload`` builds the body (the engine's full-length fields, the suite's sampler, a turn's
messages and tools) and what the record keeps of it; ``request_record`` turns a client result (or the
error that replaced it) into the stored record: ``runner.measure_request``'s, plus ``arrival_kinds``,
``tool_calls``, ``suite``, ``discarded``, the caller's extra fields and, for a scheduled send,
``scheduled_lag_us``; ``sequential_request`` sends one request alone and keeps the engine's counters'
delta around it (``counters_delta``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from engineroom.bench.clientside import encode_kinds
from engineroom.bench.runner import StreamingClient, measure_request
from engineroom.bench.stats import counters_delta
from engineroom.bench.suites.context import SuiteContext
from engineroom.bench.suites.specs import SuiteSpec
from engineroom.bench.watchdog import stream
from engineroom.bench.workloads import Workload
from engineroom.records.request import BenchRequest

__all__ = ["ctx_stream", "request_record", "sequential_request", "suite_payload"]


def suite_payload(spec: SuiteSpec, ctx: SuiteContext, workload: Workload, messages: list[dict[str, Any]] | None = None,
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
    payload, sent = suite_payload(spec, ctx, workload, messages, request)
    if t_scheduled is not None:
        delay = t_scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    sent_unix = time.time()
    t0 = time.perf_counter()
    result, error = None, None
    chars = sum(len(str(m.get("content") or "")) for m in payload.get("messages") or [] if isinstance(m, Mapping))
    stall = ctx.stall_limit(chars // 4)
    try:
        result = ctx_stream(client, payload, ctx.timeout_s, stall)
    except Exception as exc:  # noqa: BLE001 - a transport failure becomes a failed request, as in the runner
        error = exc
    return request_record(spec, ctx, workload, index=index, warmup=warmup, extra=extra, sent=sent,
                          sent_unix=sent_unix, t0=t0, t_done=time.perf_counter(), result=result, error=error,
                          t_scheduled=t_scheduled)


def request_record(spec: SuiteSpec, ctx: SuiteContext, workload: Workload, *, index: int, warmup: bool,
                   extra: Mapping[str, Any], sent: dict[str, Any], sent_unix: float, t0: float, t_done: float,
                   result: Any, error: BaseException | None, t_scheduled: float | None) -> dict[str, Any]:
    """The stored record of one sent request (``suites.streams`` makes its records here too)."""
    rec: dict[str, Any] | None = None
    t_request = t0
    if error is None:
        try:
            rec = measure_request(result, workload=workload, index=index, warmup=warmup, sent=sent,
                                  sent_unix=sent_unix, server=ctx.server).to_dict()
            rec["arrival_kinds"] = encode_kinds(getattr(result, "token_kinds", None) or [])
            calls = getattr(result, "tool_calls", None) or []
            if calls:
                rec["tool_calls"] = [{"name": c.name, "arguments_chars": len(c.arguments or "")} for c in calls]
            t_request = float(result.t_request)
        except Exception as exc:  # noqa: BLE001 - a result that cannot be read becomes a failed request
            rec, error = None, exc
    if rec is None:
        rec = BenchRequest(workload=workload.name, index=index, warmup=warmup, sent=sent, sent_unix=sent_unix,
                           status=None, error=f"{type(error).__name__}: {error}",
                           end_us=round((t_done - t0) * 1e6), arrivals_us=[],
                           completion_tokens=None, prompt_tokens=None).to_dict()
        rec["arrival_kinds"] = []
    rec.update(suite=spec.name, discarded=None, **extra)
    if t_scheduled is not None:
        rec["scheduled_lag_us"] = round((t_request - t_scheduled) * 1e6)
    return rec


def phases(spec: SuiteSpec) -> list[tuple[bool, int]]:
    """(warm-up?, index) of each request a sequential suite sends per group: warm-ups, then measured."""
    return [(True, i) for i in range(spec.warmup)] + [(False, i) for i in range(spec.measured)]


def ctx_stream(client: StreamingClient, payload: dict[str, Any], timeout: float, stall_s: float | None = None) -> Any:
    return stream(client, payload, timeout, stall_s)


def sequential_request(spec: SuiteSpec, ctx: SuiteContext, client: StreamingClient, workload: Workload, *, index: int,
                       warmup: bool, extra: Mapping[str, Any], messages: list[dict[str, Any]] | None = None,
                       request: Mapping[str, Any] | None = None) -> dict[str, Any]:
    before = ctx.metrics() if ctx.metrics else None
    rec = _request(spec, ctx, client, workload, index=index, warmup=warmup, extra=extra, messages=messages,
                   request=request)
    after = ctx.metrics() if ctx.metrics else None
    if before and after:
        rec["counters_delta"] = counters_delta(before, after)
    return rec
