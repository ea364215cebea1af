"""Run the bench against a live OpenAI-compatible server, one streamed request at a time.

For each workload: ``warmup`` unscored requests, then ``measured`` scored ones. Every
request (warm-ups too, flagged) becomes one ``BenchRequest`` record, handed to
``on_record`` the moment it finishes so the caller can store it at once; an interrupted
bench therefore keeps everything it measured. Summaries are *not* computed here beyond a
convenience call to ``statistics.summarize`` over the same records.

Typical use (the caller owns the store; the bench never imports it)::

    plan = BenchPlan(workloads=default_workloads(max_tokens=128))
    conditions = {**bench_conditions(server, plan), **host_and_model_conditions}
    run_id = store.start_run("bench", conditions)
    result = run_bench(client, server, plan,
                       on_record=lambda rec: store.add_record(run_id, "bench_request", rec))
    store.finish_run(run_id, result.status, result.summary)

On Ctrl-C ``run_bench`` re-raises ``KeyboardInterrupt`` after the finished requests have
gone to ``on_record``; the caller may then ``finish_run(run_id, "INTERRUPTED")`` (or leave
the run open: its records are kept either way).

Records are raw (``records.request``): what was sent, the client-clock arrival of every
token chunk, usage counts, and the engine's timings as its adapter normalised them
(``ServerInfo.normalise_timings``). Every rate is recomputed by ``statistics``; nothing
here divides anything.

What a request needs to run to full length is the adapter's to say
(``Capabilities.full_length_body``, e.g. llama.cpp's sampling field); the runner merges it
into the body and records why in the conditions. bench/ never names an engine's field.

Sampler values are sent explicitly on every request because engine defaults differ
(llama.cpp, vLLM and SGLang each pick their own temperature / top_k / min_p).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from engineroom.bench.watchdog import STALL_FLOOR_S, BenchAborted, Watchdog, stream
from engineroom.bench.workloads import (
    DEFAULT_SUITE,
    SUITES,
    Workload,
    default_workloads,
)
from engineroom.engines.base import ServerInfo
from engineroom.errors import BadInput
from engineroom.records import statistics
from engineroom.records.encoding import encode_arrivals
from engineroom.records.request import BenchRequest
from engineroom.records.statistics import MIN_DECODE_WINDOW_FRACTION
from engineroom.values import int_or_none as _int

__all__ = ["BenchPlan", "BenchResult", "Sampler", "bench_conditions", "build_payload", "full_length_decision",
           "measure_request", "run_bench"]

RecordCallback = Callable[[dict[str, Any]], Any]
ProgressCallback = Callable[[int, int, str], Any]


class StreamingClient(Protocol):  # what the runner needs from engineroom.client.OpenAIClient
    def stream_chat(self, payload: dict[str, Any], timeout: float | None = None) -> Any: ...


@dataclass(frozen=True)
class Sampler:
    """Sampler values sent on every request (never left to the engine's defaults)."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0
    seed: int | None = 1234

    def as_payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        return body


@dataclass(frozen=True)
class BenchPlan:
    """What to run. ``full_length`` asks the engine (through what its adapter declares) to
    generate exactly ``max_tokens`` on every request, so runs compare like for like."""

    workloads: tuple[Workload, ...] = field(default_factory=default_workloads)
    warmup: int = SUITES[DEFAULT_SUITE].warmup          # the quick suite's shape by default
    measured: int = SUITES[DEFAULT_SUITE].measured
    sampler: Sampler = field(default_factory=Sampler)
    full_length: bool = False
    timeout_s: float = 600.0
    stall_floor_s: float = STALL_FLOOR_S      # the watchdog's floor (``bench.watchdog``)
    # Merged into every request body, e.g. {"chat_template_kwargs": {"enable_thinking": False}}
    # from the thinking-switch detection; recorded in the conditions.
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.measured < 1:
            raise BadInput(
                f"A bench needs at least 1 measured request and no negative warm-ups "
                f"(got warmup={self.warmup}, measured={self.measured})."
            )
        if not self.workloads:
            raise BadInput("A bench needs at least one workload.")


def full_length_decision(server: ServerInfo, plan: BenchPlan) -> tuple[dict[str, Any], str]:
    """The fields every request carries to run to full length, and why (for the conditions)."""
    if not plan.full_length:
        return {}, "full length not requested"
    body = dict(server.capabilities.full_length_body)
    if body:
        return body, server.capabilities.reasons.get("full_length", "declared by the engine's adapter")
    return {}, (f"full length requested but the engine ({server.engine}) declares no way to ask for it; "
                "requests stop where the model stops")


def bench_conditions(server: ServerInfo, plan: BenchPlan) -> dict[str, Any]:
    """The bench part of a run's conditions (the caller adds host, model file, argv)."""
    body, reason = full_length_decision(server, plan)
    return {
        "engine": server.engine,
        "engine_version": server.engine_version,
        "model_id": server.model_id,
        "url": server.url,
        "n_ctx": server.n_ctx,
        "bench": {
            "workloads": [w.describe() for w in plan.workloads],
            "warmup": plan.warmup,
            "measured": plan.measured,
            "sampler": asdict(plan.sampler),
            "full_length": plan.full_length,
            "full_length_body": body,
            "full_length_reason": reason,
            "extra_body": dict(plan.extra_body),
            "timeout_s": plan.timeout_s,
            "stall_floor_s": plan.stall_floor_s,
            "min_decode_window_fraction": MIN_DECODE_WINDOW_FRACTION,
        },
    }


def _sent(plan: BenchPlan, workload: Workload, body: Mapping[str, Any]) -> dict[str, Any]:
    return {"max_tokens": workload.max_tokens, "sampler": plan.sampler.as_payload(), "body": dict(body),
            "prompt_sha256": workload.prompt_sha256[:16]}


def _usage_int(usage: Mapping[str, Any], *path: str) -> int | None:
    value: Any = usage
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return _int(value)


def measure_request(result: Any, *, workload: Workload, index: int, warmup: bool, sent: Mapping[str, Any],
                    sent_unix: float, server: ServerInfo | None = None) -> BenchRequest:
    """Turn a client ``StreamResult`` into a raw ``BenchRequest`` (pure; no I/O).

    ``server.normalise_timings`` (the adapter's) turns the engine's timings block into
    neutral fields; without it the block is kept raw only.
    """
    usage = result.usage if isinstance(result.usage, Mapping) else {}
    tokens = _usage_int(usage, "completion_tokens")
    error = result.error
    if error is None and result.status == 200 and tokens is None:
        error = "the stream carried no usage.completion_tokens; token count unknown"
    raw = dict(result.timings) if isinstance(result.timings, Mapping) else None
    normalise = server.normalise_timings if server is not None else None
    timings = normalise(raw) if (raw and normalise) else None
    return BenchRequest(
        workload=workload.name,
        index=index,
        warmup=warmup,
        sent=dict(sent),
        sent_unix=sent_unix,
        status=result.status,
        error=error,
        end_us=round((result.t_end - result.t_request) * 1_000_000),
        arrivals_us=encode_arrivals(result.t_request, list(getattr(result, "token_times", None) or [])),
        completion_tokens=tokens,
        prompt_tokens=_usage_int(usage, "prompt_tokens"),
        cached_prompt_tokens=_usage_int(usage, "prompt_tokens_details", "cached_tokens"),
        finish_reason=result.finish_reason,
        chunks=int(getattr(result, "chunks", 0) or 0),
        content_chars=len(result.content or ""),
        reasoning_chars=len(getattr(result, "reasoning", "") or ""),
        engine=None if timings is None else timings.as_dict(),
        engine_raw=raw,
    )


def build_payload(server: ServerInfo, plan: BenchPlan, workload: Workload,
                  body: Mapping[str, Any]) -> dict[str, Any]:
    """The request body: messages, length, sampler, then ``body`` (full-length fields, extra body)."""
    payload: dict[str, Any] = {
        "model": server.model_id or "default",
        "messages": workload.messages(),
        "max_tokens": workload.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **plan.sampler.as_payload(),
    }
    payload.update(body)
    return payload


@dataclass
class BenchResult:
    conditions: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    aborted: dict[str, Any] | None = None     # why bench stopped sending (``watchdog.BenchAborted``), or None

    @property
    def status(self) -> str:
        return self.summary["status"]


def run_bench(
    client: StreamingClient,
    server: ServerInfo,
    plan: BenchPlan | None = None,
    *,
    on_record: RecordCallback | None = None,
    progress: ProgressCallback | None = None,
) -> BenchResult:
    """Run ``plan`` against ``server`` through ``client``; see the module docstring.

    ``on_record(record_dict)`` is called as each request finishes (warm-ups included,
    flagged ``warmup=True``); ``progress(done, total, label)`` after each request.
    A client exception is recorded as a failed request, not raised (KeyboardInterrupt
    is raised: what was measured has already gone to ``on_record``).
    """
    plan = plan or BenchPlan()
    full_body, _ = full_length_decision(server, plan)
    body = {**full_body, **plan.extra_body}
    conditions = bench_conditions(server, plan)
    records: list[dict[str, Any]] = []
    total = len(plan.workloads) * (plan.warmup + plan.measured)
    done = 0
    watchdog = Watchdog(floor_s=plan.stall_floor_s, timeout_s=plan.timeout_s)
    aborted: dict[str, Any] | None = None
    if progress:
        progress(0, total, "starting")
    try:
        for workload in plan.workloads:
            payload = build_payload(server, plan, workload, body)
            sent = _sent(plan, workload, body)
            prompt_estimate = len(workload.prompt + (workload.system or "")) // 4
            phases = [(True, i) for i in range(plan.warmup)] + [(False, i) for i in range(plan.measured)]
            for warmup, index in phases:
                sent_unix = time.time()
                t0 = time.perf_counter()
                stall = watchdog.limit(prompt_estimate)
                try:
                    result = stream(client, payload, plan.timeout_s, stall)
                    record = measure_request(result, workload=workload, index=index, warmup=warmup,
                                             sent=sent, sent_unix=sent_unix, server=server)
                except Exception as exc:  # noqa: BLE001 - a client bug or transport failure becomes a failed request
                    record = BenchRequest(
                        workload=workload.name, index=index, warmup=warmup, sent=dict(sent), sent_unix=sent_unix,
                        status=None, error=f"{type(exc).__name__}: {exc}",
                        end_us=round((time.perf_counter() - t0) * 1_000_000), arrivals_us=[],
                        completion_tokens=None, prompt_tokens=None,
                    )
                rec = record.to_dict()
                records.append(rec)
                if on_record:
                    on_record(rec)
                done += 1
                if progress:
                    phase = "warm-up" if warmup else "measured"
                    progress(done, total, f"{workload.name} {phase} {index + 1}")
                watchdog.observe(rec, stall_s=stall)
    except BenchAborted as stop:
        aborted = stop.record
        if progress:
            progress(done, total, f"stopped: {stop.reason}")
    return BenchResult(conditions=conditions, records=records, summary=statistics.summarize(records),
                       aborted=aborted)
