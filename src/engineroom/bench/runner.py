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

Decode TPS follows tokens / (wall - TTFT). Because the first token arrives at TTFT, this
counts one token more than the window strictly generated, reading n / (n-1) high: +3% at
32 tokens, +0.1% at 1000. llama.cpp's ``predicted_per_second`` is (n - 1) / window, so the
cross-check in ``statistics.agreement`` compares it with the client's inter-token rate
(n - 1) / (last - first token), not with decode TPS.

Sampler values are sent explicitly on every request because engine defaults differ
(llama.cpp, vLLM and SGLang each pick their own temperature / top_k / min_p).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Protocol

from engineroom.bench import statistics
from engineroom.bench.workloads import DEFAULT_SUITE, SUITES, Workload, default_workloads
from engineroom.engines.base import ServerInfo
from engineroom.errors import BadInput
from engineroom.values import int_or_none as _int

# Decode TPS is reported only when the decode window (wall - TTFT) is at least this
# fraction of the wall time; below it the division amplifies clock noise into nonsense.
MIN_DECODE_WINDOW_FRACTION = 0.05
MIN_DECODE_TOKENS = 2

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
    """What to run. ``full_length`` asks for ``ignore_eos`` where the server supports it,
    so every request generates exactly ``max_tokens`` and runs compare like for like."""

    workloads: tuple[Workload, ...] = field(default_factory=default_workloads)
    warmup: int = SUITES[DEFAULT_SUITE].warmup          # the quick suite's shape by default
    measured: int = SUITES[DEFAULT_SUITE].measured
    sampler: Sampler = field(default_factory=Sampler)
    full_length: bool = False
    timeout_s: float = 600.0
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


def ignore_eos_decision(server: ServerInfo, plan: BenchPlan) -> tuple[bool, str]:
    """Whether requests carry ``ignore_eos``, and why (the reason goes into the conditions)."""
    if not plan.full_length:
        return False, "full length not requested"
    supported = server.capabilities.ignore_eos
    if supported:
        where = server.capabilities.reasons.get("ignore_eos", "declared by the server")
        return True, f"full length requested; server supports ignore_eos ({where})"
    if supported is False:
        return False, "full length requested but the server declares no ignore_eos support"
    return False, "full length requested but the server does not say it supports ignore_eos"


def bench_conditions(server: ServerInfo, plan: BenchPlan) -> dict[str, Any]:
    """The bench part of a run's conditions (the caller adds host, model file, argv)."""
    use_eos, reason = ignore_eos_decision(server, plan)
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
            "ignore_eos": use_eos,
            "ignore_eos_reason": reason,
            "extra_body": dict(plan.extra_body),
            "timeout_s": plan.timeout_s,
            "min_decode_window_fraction": MIN_DECODE_WINDOW_FRACTION,
        },
    }


@dataclass
class BenchRequest:
    """One request's raw outcome. Client-clock times in seconds; TPS from usage tokens."""

    workload: str
    index: int                      # 0-based within its phase (warm-up or measured)
    warmup: bool
    max_tokens: int
    ignore_eos: bool
    status: int | None              # HTTP status (None: no answer)
    error: str | None
    ttft_s: float | None            # request sent -> first non-empty content/reasoning delta
    wall_s: float                   # request sent -> end of stream
    last_token_s: float | None      # request sent -> last content/reasoning delta
    completion_tokens: int | None   # usage.completion_tokens as the server reported it
    prompt_tokens: int | None
    wall_tps: float | None          # completion_tokens / wall_s
    decode_tps: float | None        # completion_tokens / (wall_s - ttft_s); None = n/a
    decode_window_s: float | None
    decode_na_reason: str | None
    finish_reason: str | None
    chunks: int
    content_chars: int
    reasoning_chars: int
    engine_timings: dict[str, Any] | None   # the engine's own timings block, raw
    started_unix: float             # wall-clock start (for ordering / drift), not for maths

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)




def decode_rate(tokens: int | None, wall_s: float, ttft_s: float | None) -> tuple[float | None, float | None, str | None]:
    """(decode_tps, window_s, reason_if_na) by the rule tokens / (wall - TTFT).

    n/a when there is no first token, fewer than MIN_DECODE_TOKENS tokens, or the
    decode window is under MIN_DECODE_WINDOW_FRACTION of the wall time.
    """
    if ttft_s is None:
        return None, None, "no token arrived"
    window = wall_s - ttft_s
    if not tokens or tokens < MIN_DECODE_TOKENS:
        return None, window, f"fewer than {MIN_DECODE_TOKENS} completion tokens"
    if wall_s <= 0 or window < MIN_DECODE_WINDOW_FRACTION * wall_s:
        return None, window, (
            f"decode window {window:.4f} s is under {MIN_DECODE_WINDOW_FRACTION:.0%} of wall {wall_s:.4f} s"
        )
    return tokens / window, window, None


def measure_request(result: Any, *, workload: Workload, index: int, warmup: bool,
                    ignore_eos: bool, started_unix: float) -> BenchRequest:
    """Turn a client ``StreamResult`` into a ``BenchRequest`` (pure; no I/O)."""
    wall = float(result.t_end - result.t_request)
    ttft = None if result.t_first_token is None else float(result.t_first_token - result.t_request)
    token_times = list(getattr(result, "token_times", []) or [])
    last = float(token_times[-1] - result.t_request) if token_times else None
    usage = result.usage if isinstance(result.usage, Mapping) else {}
    tokens = _int(usage.get("completion_tokens"))
    prompt_tokens = _int(usage.get("prompt_tokens"))
    error = result.error
    if error is None and result.status == 200 and tokens is None:
        error = "the stream carried no usage.completion_tokens; token count unknown"
    decode, window, na = decode_rate(tokens, wall, ttft)
    wall_tps = tokens / wall if (tokens and wall > 0) else None
    return BenchRequest(
        workload=workload.name,
        index=index,
        warmup=warmup,
        max_tokens=workload.max_tokens,
        ignore_eos=ignore_eos,
        status=result.status,
        error=error,
        ttft_s=ttft,
        wall_s=wall,
        last_token_s=last,
        completion_tokens=tokens,
        prompt_tokens=prompt_tokens,
        wall_tps=wall_tps,
        decode_tps=decode,
        decode_window_s=window,
        decode_na_reason=na,
        finish_reason=result.finish_reason,
        chunks=int(getattr(result, "chunks", 0) or 0),
        content_chars=len(result.content or ""),
        reasoning_chars=len(getattr(result, "reasoning", "") or ""),
        engine_timings=dict(result.timings) if isinstance(result.timings, Mapping) else None,
        started_unix=started_unix,
    )


def build_payload(server: ServerInfo, plan: BenchPlan, workload: Workload, ignore_eos: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": server.model_id or "default",
        "messages": workload.messages(),
        "max_tokens": workload.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **plan.sampler.as_payload(),
    }
    if ignore_eos:
        body["ignore_eos"] = True
    for key, value in plan.extra_body.items():
        body[key] = value
    return body


@dataclass
class BenchResult:
    conditions: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]

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
    use_eos, _ = ignore_eos_decision(server, plan)
    conditions = bench_conditions(server, plan)
    records: list[dict[str, Any]] = []
    total = len(plan.workloads) * (plan.warmup + plan.measured)
    done = 0
    if progress:
        progress(0, total, "starting")
    for workload in plan.workloads:
        payload = build_payload(server, plan, workload, use_eos)
        phases = [(True, i) for i in range(plan.warmup)] + [(False, i) for i in range(plan.measured)]
        for warmup, index in phases:
            started = time.time()
            t0 = time.perf_counter()
            try:
                result = client.stream_chat(payload, timeout=plan.timeout_s)
                record = measure_request(result, workload=workload, index=index, warmup=warmup,
                                         ignore_eos=use_eos, started_unix=started)
            except Exception as exc:  # a client bug or transport failure becomes a failed request
                record = BenchRequest(
                    workload=workload.name, index=index, warmup=warmup,
                    max_tokens=workload.max_tokens, ignore_eos=use_eos, status=None,
                    error=f"{type(exc).__name__}: {exc}", ttft_s=None, wall_s=time.perf_counter() - t0,
                    last_token_s=None, completion_tokens=None, prompt_tokens=None, wall_tps=None,
                    decode_tps=None, decode_window_s=None, decode_na_reason="request failed",
                    finish_reason=None, chunks=0, content_chars=0, reasoning_chars=0,
                    engine_timings=None, started_unix=started,
                )
            rec = record.to_dict()
            records.append(rec)
            if on_record:
                on_record(rec)
            done += 1
            if progress:
                phase = "warm-up" if warmup else "measured"
                progress(done, total, f"{workload.name} {phase} {index + 1}")
    return BenchResult(conditions=conditions, records=records, summary=statistics.summarize(records))

