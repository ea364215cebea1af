"""What a suite run is given (``SuiteContext``), what it returns (``SuiteResult``), and what it
resolves for this server before any request: the stream count, the prompt and context sizes, the
workloads, and the run's ``bench`` conditions (``suite_conditions``). ``suites.run`` runs them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engineroom.bench.agentic import session as agentic
from engineroom.bench.depth.sizes import DEPTH_HEADROOM, plan_depths
from engineroom.bench.rate.arrivals import poisson_schedule
from engineroom.bench.runner import StreamingClient
from engineroom.bench.suites.haystack import TokenCounter, fresh_salt
from engineroom.bench.suites.specs import SuiteSpec
from engineroom.bench.sweep import knee as sweep
from engineroom.bench.watchdog import STALL_FLOOR_S, Watchdog
from engineroom.bench.workloads import Workload
from engineroom.engines.base import ServerInfo
from engineroom.errors import BadInput

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
    stall_floor_s: float = STALL_FLOOR_S        # the watchdog's floor (``bench.watchdog``)
    records: list[dict[str, Any]] = field(default_factory=list)
    watchdog: Watchdog | None = None            # made by ``suites.run.run_suite`` from the two above

    def store(self, kind: str, payload: dict[str, Any]) -> None:
        """Keep one record (and emit it); a finished request then goes to the watchdog, which may
        stop the run (``watchdog.BenchAborted``) once the record is safe."""
        self.records.append({"kind": kind, "payload": payload})
        if self.emit:
            self.emit(kind, payload)
        if kind == "bench_request" and self.watchdog is not None:
            self.watchdog.observe(payload)

    def stall_limit(self, prompt_tokens: int | None) -> float | None:
        return self.watchdog.limit(prompt_tokens) if self.watchdog is not None else None


@dataclass
class SuiteResult:
    conditions: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.summary["status"])


def stream_count(spec: SuiteSpec, ctx: SuiteContext) -> int:
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
                  "full_length": True,
                  "full_length_reason": server.capabilities.reasons.get("full_length", "") if
                  server.capabilities.full_length_body else
                  f"the engine ({server.engine}) declares no way to ask for full length; requests stop where the "
                  "model stops",
                  "cv_threshold_pct": spec.cv_threshold_pct,
                  "agreement_tolerance_pct": spec.agreement_tolerance_pct,
                  "itl_p99_ratio": spec.itl_p99_ratio,
                  "tokenizer": "engine" if ctx.count_tokens else "none (sizes estimated)",
                  "timeout_s": ctx.timeout_s, "stall_floor_s": ctx.stall_floor_s},
    }
    if spec.kind == "depth":
        out["bench"]["depths"] = plan_depths(spec.depths, server.n_ctx, spec.max_tokens, spec.near_end)
    if spec.kind == "concurrency":
        n = stream_count(spec, ctx)
        out["bench"].update(streams=n, streams_source="--streams" if ctx.streams is not None else
                            "the engine's reported slot count", rounds=spec.rounds,
                            prompt_tokens=concurrency_prompt_tokens(spec, server))
    if spec.kind in ("standard", "spec"):
        out["bench"]["workloads"] = [w.describe() for w in suite_workloads(spec, ctx)]
    if spec.kind == "agentic":
        turns, scale = agentic.plan_turns(server.n_ctx, spec.max_tokens, spec.turns, spec.prompt_tokens)
        out["bench"].update(sessions=spec.measured, turns=len(turns), turns_asked=spec.turns, scale=scale,
                            target_tokens=spec.prompt_tokens, context_fill=agentic.CONTEXT_FILL,
                            tool_choice=spec.tool_choice, tools=[t["function"]["name"] for t in agentic.TOOLS],
                            plan=[{"turn": t.turn, "tool": t.exchange.tool if t.exchange else None,
                                   "output_tokens": t.output_tokens, "context_tokens": t.context_tokens}
                                  for t in turns])
    if spec.kind == "sweep":
        n = stream_count(spec, ctx)
        out["bench"].update(streams_max=n, streams_source="--streams" if ctx.streams is not None else
                            "the engine's reported slot count", stream_counts=sweep.stream_counts(n),
                            contexts=sweep_contexts(spec, server), rounds=spec.rounds, budget_s=spec.budget_s,
                            knee_gain_pct=spec.knee_gain_pct, slo_ttft_ms=spec.slo_ttft_ms,
                            slo_itl_ms=spec.slo_itl_ms)
    if spec.kind == "rate":
        schedule = poisson_schedule(spec.rate, spec.arrival_seed, duration_s=spec.duration_s, count=spec.requests)
        out["bench"].update(rate=spec.rate, duration_s=spec.duration_s, requests=spec.requests,
                            arrival_seed=spec.arrival_seed, scheduled=len(schedule),
                            schedule_span_s=schedule[-1] if schedule else 0.0, max_inflight=spec.max_inflight,
                            prompt_tokens=concurrency_prompt_tokens(spec, server), slo_ttft_ms=spec.slo_ttft_ms,
                            slo_itl_ms=spec.slo_itl_ms)
    return out


def sweep_contexts(spec: SuiteSpec, server: ServerInfo) -> list[int]:
    room = concurrency_prompt_tokens(spec.with_(prompt_tokens=10**9), server)
    asked = spec.contexts or (spec.prompt_tokens,)
    return sorted({min(int(c), room) for c in asked})


def concurrency_prompt_tokens(spec: SuiteSpec, server: ServerInfo) -> int:
    room = (server.n_ctx or 0) - spec.max_tokens - DEPTH_HEADROOM
    if room < 64:
        raise BadInput(f"the engine's context per slot ({server.n_ctx} tokens) leaves no room for a prompt "
                       f"with {spec.max_tokens} tokens out.")
    return min(spec.prompt_tokens, room)


def suite_workloads(spec: SuiteSpec, ctx: SuiteContext) -> tuple[Workload, ...]:
    chosen = tuple(spec.workloads) + tuple(ctx.extra_workloads)
    if spec.max_tokens:
        chosen = tuple(w.with_max_tokens(spec.max_tokens) if w not in ctx.extra_workloads else w for w in chosen)
    n_ctx = ctx.server.n_ctx
    if n_ctx:   # scaled to the context the engine reports: room for the prompt and the template
        cap = max(16, n_ctx - DEPTH_HEADROOM - len(max((w.prompt for w in chosen), key=len, default="")) // 2)
        chosen = tuple(w.with_max_tokens(min(w.max_tokens, cap)) for w in chosen)
    return chosen
