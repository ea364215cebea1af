"""Request-rate mode: a seeded Poisson arrival schedule, and goodput against SLOs from raw records.

``engineroom bench rate --rate R`` sends requests at the times of a Poisson process of rate R
(exponential inter-arrival gaps from ``random.Random(seed)``, the first at 0), for
``--duration-s`` seconds or ``--requests`` requests. Every record keeps its *scheduled* offset
(``scheduled_s``, seconds after the schedule's start) and ``scheduled_lag_us`` (actual send -
scheduled), so each latency here is counted from the scheduled send: a request the client sent
late (every sender busy) or the engine queued is late by that much, as a user would see it.

Per request (``request_latency``), on the client clock:

- ``ttft_s``: scheduled send -> first token chunk (``stats.latency_from_schedule_s``);
- ``tpot_s``: (last token - first token) / (tokens - 1), the mean time per output token after the
  first (``vllm bench serve``'s TPOT); ``itl_p95_s``: the 95th percentile of the request's own gaps;
- ``e2e_s``: scheduled send -> end of stream.

Goodput (``goodput``) = requests that succeeded, streamed at least one token, and met every SLO
(TTFT <= ``slo_ttft_ms``, TPOT <= ``slo_itl_ms``), divided by the run's wall time: the schedule's
start to the last request's end. Errors and silent-empty streams (HTTP 200, no token) are
counted apart and are never good.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from engineroom.bench.stats import is_silent, latency_from_schedule_s
from engineroom.records import statistics as st
from engineroom.records.encoding import arrivals_us, gaps_us, wall_s

__all__ = ["DEFAULT_SLO_ITL_MS", "DEFAULT_SLO_TTFT_MS", "goodput", "poisson_schedule", "request_latency"]

DEFAULT_SLO_TTFT_MS = 2000.0     # time to first token, from the scheduled send
DEFAULT_SLO_ITL_MS = 100.0       # TPOT: 10 tokens/s per request, a reading speed
MAX_SCHEDULED = 100_000          # a schedule longer than this is refused (a typo in --rate or --duration-s)


def poisson_schedule(rate: float, seed: int, *, duration_s: float | None = None,
                     count: int | None = None) -> list[float]:
    """Send offsets (seconds after the start) of a Poisson process of ``rate`` per second: the
    first at 0, then exponential gaps drawn from ``random.Random(seed)``. Stops after ``count``
    arrivals or before ``duration_s``, whichever comes first (one of them is required)."""
    from engineroom.errors import BadInput

    if not (rate > 0 and math.isfinite(rate)):
        raise BadInput(f"--rate must be a positive number of requests per second, not {rate}.")
    if duration_s is None and count is None:
        raise BadInput("a request-rate run needs --duration-s or --requests.")
    if duration_s is not None and not duration_s > 0:
        raise BadInput(f"--duration-s must be positive, not {duration_s}.")
    if count is not None and count < 1:
        raise BadInput(f"--requests must be at least 1, not {count}.")
    expected = count if count is not None else rate * float(duration_s or 0)
    if expected > MAX_SCHEDULED:
        raise BadInput(f"that schedule holds about {expected:,.0f} requests; at most {MAX_SCHEDULED:,} are sent "
                       "in one run.")
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    while count is None or len(out) < count:
        if duration_s is not None and t >= duration_s:
            break
        out.append(t)
        t += rng.expovariate(rate)
    return out


def request_latency(rec: Mapping[str, Any]) -> dict[str, float | None]:
    """One request's latencies from its scheduled send (seconds); None where undefined."""
    offsets = arrivals_us(rec) or []
    tokens = rec.get("completion_tokens") if isinstance(rec.get("completion_tokens"), int) else None
    lag = rec.get("scheduled_lag_us")
    lag_s = lag / 1e6 if isinstance(lag, (int, float)) else 0.0
    tpot = None
    if tokens and tokens >= 2 and len(offsets) >= 2 and offsets[-1] > offsets[0]:
        tpot = (offsets[-1] - offsets[0]) / 1e6 / (tokens - 1)
    gaps = sorted(g / 1e6 for g in (gaps_us(rec) or []))
    end = wall_s(rec)
    return {"ttft_s": latency_from_schedule_s(rec), "tpot_s": tpot, "itl_p95_s": st.percentile(gaps, 95),
            "e2e_s": (end + lag_s) if end is not None else None, "lag_s": lag_s}


def _meets(rec: Mapping[str, Any], lat: Mapping[str, float | None], slo_ttft_ms: float, slo_itl_ms: float) -> bool:
    if not st.is_ok(rec) or is_silent(rec) or lat["ttft_s"] is None:
        return False
    if lat["ttft_s"] * 1000.0 > slo_ttft_ms:
        return False
    return lat["tpot_s"] is None or lat["tpot_s"] * 1000.0 <= slo_itl_ms


def _pcts(values: Sequence[float | None], scale: float = 1.0) -> dict[str, float | None]:
    xs = sorted(float(v) * scale for v in values if v is not None)
    return {f"p{q}": st.percentile(xs, q) for q in (50, 95, 99)}


def goodput(recs: Sequence[Mapping[str, Any]], *, slo_ttft_ms: float, slo_itl_ms: float,
            rate: float | None = None) -> dict[str, Any]:
    """Goodput and the latency picture of a request-rate run's measured requests (no warm-ups)."""
    measured = [r for r in recs if not r.get("warmup")]
    lats = [request_latency(r) for r in measured]
    ok = [(r, x) for r, x in zip(measured, lats, strict=True) if st.is_ok(r) and not is_silent(r)]
    good = [r for r, x in ok if _meets(r, x, slo_ttft_ms, slo_itl_ms)]
    ends = [float(r.get("scheduled_s") or 0.0) + (x["e2e_s"] or 0.0) for r, x in zip(measured, lats, strict=True)]
    wall = max(ends) if ends else 0.0
    last_sched = max((float(r.get("scheduled_s") or 0.0) for r in measured), default=0.0)
    tokens = sum(int(r.get("completion_tokens") or 0) for r, _ in ok)
    miss_ttft = sum(1 for _, x in ok if x["ttft_s"] is not None and x["ttft_s"] * 1000.0 > slo_ttft_ms)
    miss_itl = sum(1 for _, x in ok if x["tpot_s"] is not None and x["tpot_s"] * 1000.0 > slo_itl_ms)
    return {
        "requests": len(measured), "completed": len(ok), "good": len(good),
        "errors": sum(1 for r in measured if not st.is_ok(r)), "silent": sum(1 for r in measured if is_silent(r)),
        "missed_ttft": miss_ttft, "missed_itl": miss_itl,
        "slo_ttft_ms": slo_ttft_ms, "slo_itl_ms": slo_itl_ms, "offered_rate": rate,
        "sent_rate": (len(measured) - 1) / last_sched if last_sched > 0 and len(measured) > 1 else None,
        "wall_s": wall, "goodput_rps": len(good) / wall if wall > 0 else None,
        "throughput_rps": len(ok) / wall if wall > 0 else None,
        "output_tps": tokens / wall if wall > 0 else None,
        "good_fraction": len(good) / len(measured) if measured else None,
        "ttft_ms": _pcts([x["ttft_s"] for _, x in ok], 1000.0),
        "tpot_ms": _pcts([x["tpot_s"] for _, x in ok], 1000.0),
        "itl_p95_ms": _pcts([x["itl_p95_s"] for _, x in ok], 1000.0),
        "e2e_s": _pcts([x["e2e_s"] for _, x in ok]),
        "send_lag_ms": _pcts([x["lag_s"] for x in lats], 1000.0),
    }
