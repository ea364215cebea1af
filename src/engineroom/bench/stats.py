"""Per-request readers the longer suites add, recomputed from raw records only.

- ``cache_reuse``: how many prompt tokens the engine took from its prefix cache for one
  request: its own per-response count as the adapter normalised it (``engine.cached_tokens``),
  else the usage's ``cached_tokens``, else its counters' delta around the request
  (``counters_delta``: ``prompt_cached_tokens_total``). A request is *contaminated* when it
  reused more than ``CACHE_ALLOWANCE_TOKENS`` and ``CACHE_ALLOWANCE_FRACTION`` of its prompt:
  the chat template's preamble (tens of tokens, before the salt) is shared by design. The rule
  is ``engineroom.measures.cache_reuse``, which verify's stress ladder calls too.
- ``reasoning``: time to the first token chunk of any kind vs the first *content* chunk,
  reasoning and content chunk counts (``arrival_kinds``), and whether thinking used the whole
  budget with no content (``thinking_exhausted``: flagged and left out of the figures).
- ``client_load``: the client's CPU share and wake-up lag percentiles from its raw lags (and
  its event loop's lag percentiles, where the streams ran on one loop).
- ``latency_from_schedule``: a concurrency stream's TTFT counted from its scheduled send.
"""

from __future__ import annotations

import statistics as _st
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engineroom.bench.clientside import decode_kinds
from engineroom.measures import CACHE_ALLOWANCE_FRACTION, CACHE_ALLOWANCE_TOKENS, CacheReuse
from engineroom.measures import cache_reuse as measured_reuse
from engineroom.records.encoding import arrivals_us, ttft_s
from engineroom.records.request import max_tokens
from engineroom.records.statistics import engine_timings, is_ok, percentile

__all__ = ["CACHE_ALLOWANCE_FRACTION", "CACHE_ALLOWANCE_TOKENS", "CLIENT_LAG_LIMIT_MS", "CLIENT_CPU_LIMIT",
           "CLIENT_LOOP_LAG_LIMIT_MS", "CLIENT_RUNQ_LIMIT_MS", "CLIENT_LOAD_KIND", "CacheReuse", "cache_reuse",
           "client_load", "counters_delta",
           "group_label",
           "is_silent", "kept", "latency_from_schedule_s", "reasoning", "records_of"]

CLIENT_LOAD_KIND = "client_load"
# The client is the bottleneck when its process used this share of one core over the run, or
# its probe thread woke this late at the 99th percentile (its timestamps are then as late).
CLIENT_CPU_LIMIT = 0.9
CLIENT_LAG_LIMIT_MS = 20.0
# ... or the event loop that reads every stream (``suites.streams``) ran its probe this late at the 99th percentile
CLIENT_LOOP_LAG_LIMIT_MS = 20.0
# a client thread that was ready waited this long for a CPU, on average, each time it ran: its
# tokens were read that late (the probe thread alone can still wake on time)
CLIENT_RUNQ_LIMIT_MS = 10.0


def records_of(records: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    """Payloads of ``kind`` out of store records or ``{"kind", "payload"}`` dicts."""
    return [dict(r["payload"]) for r in records
            if r.get("kind") == kind and isinstance(r.get("payload"), Mapping)]


def counters_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {k: float(after[k]) - float(before[k]) for k in after if k in before and k.endswith("_total")}


def cache_reuse(rec: Mapping[str, Any]) -> CacheReuse:
    """A stored request's prefix-cache reuse (``engineroom.measures.cache_reuse``, the rule verify's
    stress ladder uses too)."""
    timings = engine_timings(rec)
    prompt = rec.get("prompt_tokens") if isinstance(rec.get("prompt_tokens"), int) else None
    usage = rec.get("cached_prompt_tokens")
    delta = rec.get("counters_delta")
    counter = delta.get("prompt_cached_tokens_total") if isinstance(delta, Mapping) else None
    return measured_reuse(prompt=prompt, engine_cached=timings.cached_tokens if timings is not None else None,
                          engine_prompt=timings.prompt_tokens if timings is not None else None,
                          usage_cached=usage if isinstance(usage, int) else None,
                          counter_cached=float(counter) if isinstance(counter, (int, float)) else None)


def is_silent(rec: Mapping[str, Any]) -> bool:
    """An answer that succeeded but streamed nothing to time (HTTP 200, no error, no token chunk),
    whatever the engine's own count says: an engine can report tokens generated whose text is
    empty (seen on the H200 with a random-weight model under greedy decoding: 1,024 "tokens", no
    text), and a request with no arrivals has no TTFT or decode rate to report."""
    return is_ok(rec) and not (arrivals_us(rec) or [])


def reasoning(rec: Mapping[str, Any]) -> dict[str, Any]:
    """Reasoning-aware timings of one request (chunk counts: one chunk is one token on
    llama-server; where an engine batches tokens, they are chunk counts)."""
    kinds = decode_kinds(rec.get("arrival_kinds"))
    offsets = arrivals_us(rec) or []
    first_content = None
    n_r = n_c = 0
    if kinds is not None and len(kinds) == len(offsets):
        for k, t in zip(kinds, offsets, strict=True):
            if k == "r":
                n_r += 1
            else:
                n_c += 1
                if first_content is None:
                    first_content = t / 1e6
    elif offsets:       # no kinds recorded: all chunks are content as far as anyone can tell
        n_c = len(offsets)
        first_content = offsets[0] / 1e6
    limit = max_tokens(rec)
    exhausted = bool(is_ok(rec) and n_r and not n_c and not rec.get("content_chars")
                     and (rec.get("finish_reason") == "length"
                          or (limit and (rec.get("completion_tokens") or 0) >= limit)))
    return {"ttft_s": ttft_s(rec), "first_content_s": first_content, "reasoning_chunks": n_r,
            "content_chunks": n_c, "thinking_exhausted": exhausted, "kinds_recorded": kinds is not None}


def kept(recs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The measured requests the figures use: not warm-ups, not discarded by the cache guard,
    not thinking that ran out of budget (those are flagged, never averaged in)."""
    return [r for r in recs if not r.get("warmup") and not r.get("discarded")
            and not reasoning(r)["thinking_exhausted"]]


def latency_from_schedule_s(rec: Mapping[str, Any]) -> float | None:
    """TTFT counted from the scheduled send time (client queueing included)."""
    t = ttft_s(rec)
    lag = rec.get("scheduled_lag_us")
    if t is None:
        return None
    return t + (lag / 1e6 if isinstance(lag, (int, float)) else 0.0)


def group_label(rec: Mapping[str, Any]) -> str:
    group = rec.get("group")
    if isinstance(group, Mapping):
        if "depth" in group:
            return f"depth {group['depth']}"
        if "ctx" in group and "streams" in group:      # a sweep cell
            return f"ctx {group['ctx']} N={group['streams']}"
        if "turn" in group:                            # an agentic turn, over sessions
            return f"turn {group['turn']}"
        if "rate" in group:
            return f"rate {float(group['rate']):g}/s"
        if "streams" in group:
            return f"N={group['streams']}"
        if "workload" in group:
            return str(group["workload"])
    return str(rec.get("workload"))


def client_load(payload: Mapping[str, Any] | None) -> dict[str, Any]:
    """The client's CPU share of one core and wake-up lag percentiles (ms) from its raw lags."""
    if not payload:
        return {"recorded": False}
    lags = sorted(float(x) / 1000.0 for x in payload.get("lags_us") or [])
    wall = float(payload.get("wall_s") or 0.0)
    cpu = float(payload.get("cpu_s") or 0.0)
    return {"recorded": True, "cpu_s": cpu, "wall_s": wall, "cpu_fraction": cpu / wall if wall > 0 else None,
            "lag_ms_p50": percentile(lags, 50), "lag_ms_p99": percentile(lags, 99),
            "lag_ms_max": lags[-1] if lags else None, "n_wakeups": len(lags),
            "interval_ms": (payload.get("interval_us") or 0) / 1000.0, **_runqueue(payload, wall),
            **_loop_lag(payload)}


def _loop_lag(payload: Mapping[str, Any]) -> dict[str, Any]:
    """How late the multi-stream event loop ran its probe callback (ms): every stream read waits as long."""
    lags = sorted(float(x) / 1000.0 for x in payload.get("loop_lags_us") or [])
    if not lags:
        return {"loop_lag_ms_p50": None, "loop_lag_ms_p99": None, "loop_lag_ms_max": None}
    return {"loop_lag_ms_p50": percentile(lags, 50), "loop_lag_ms_p99": percentile(lags, 99),
            "loop_lag_ms_max": lags[-1]}


def _runqueue(payload: Mapping[str, Any], wall: float) -> dict[str, Any]:
    """Run-queue wait of the client's threads: in all, per time a thread was run (how late a
    ready thread got the CPU, on average), and per wall second (threads ready but not running)."""
    waited, slices = payload.get("runq_wait_s"), payload.get("runq_slices")
    if not isinstance(waited, (int, float)) or not isinstance(slices, int):
        return {"runq_wait_s": None, "runq_wait_ms_per_run": None, "runq_waiting_threads": None}
    return {"runq_wait_s": float(waited), "runq_wait_ms_per_run": waited * 1000.0 / slices if slices else 0.0,
            "runq_waiting_threads": waited / wall if wall > 0 else None}


def median_or_none(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return _st.median(vals) if vals else None
