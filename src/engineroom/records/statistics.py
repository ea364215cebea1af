"""Bench figures, recomputed from raw request records only.

Input: the record dicts the runner emits (``BenchRequest.to_dict()``, shape in
``records.request``), or store records (``{"kind": "bench_request", "payload": {...}}``) —
both are accepted. Nothing here reads an engine, a clock or a stored figure; the same
records always give the same summary, and a better formula re-reads every old run.

Where each figure comes from:

- ``ttft_s``, ``wall_s``, ``decode_tps`` = tokens / (wall - TTFT), ``wall_tps`` = tokens /
  wall: the client clock (arrival offsets, ``time.perf_counter``) and
  ``usage.completion_tokens``;
- ``inter_token_ms`` p50 / p95 / p99: the gaps between consecutive token chunks of the
  usable measured requests, pooled per workload (linear interpolation between closest
  ranks, as numpy's default); "n/a" for records stored before arrival times were kept;
- ``engine_decode_tps`` / ``engine_prompt_tps``: the engine's own counts and windows as its
  adapter normalised them (``engines.base.EngineTimings``), turned into a rate by the
  engine's own definition of its window;
- the agreement check compares the engine's decode rate with the client's inter-token rate
  ``(tokens - 1) / (last token - first token)`` over the *same* requests (see
  ``inter_token_tps``), measured from the end of a *held start* when the transport held the
  first chunks back and flushed them together (``held_start``, ``steady_inter_token_tps``);
  the client figures are never replaced by or derived from the engine's.
"""

from __future__ import annotations

import math
import statistics as _st
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engineroom.engines.base import EngineTimings
from engineroom.records.encoding import first_last_us, gaps_us, ttft_s, wall_s
from engineroom.records.request import max_tokens

__all__ = [
    "AGREEMENT_MIN_WINDOW_S", "AGREEMENT_TOLERANCE_PCT", "BENCH_RECORD_KIND", "HELD_GAP_FRACTION", "ITL_PERCENTILES",
    "MIN_DECODE_TOKENS", "MIN_DECODE_WINDOW_FRACTION", "STATUS_NO_TOKENS", "STATUS_OK", "STATUS_REQ_ERRORS",
    "USABLE_FRACTION", "agreement", "decode_na_reason", "decode_rate", "decode_tps", "describe",
    "engine_decode_tps", "engine_prompt_tps", "engine_timings", "held_start", "inter_token_ms", "inter_token_tps",
    "is_ok", "is_usable", "payloads", "percentile", "run_status", "summarize",
    "steady_inter_token_tps", "summarize_workload", "wall_tps",
]

# Requests that stop before this fraction of max_tokens are not "usable": a few tokens
# are dominated by fixed per-request costs and would skew decode figures.
USABLE_FRACTION = 0.25
# Client decode and engine decode differing by more than this -> warning.
AGREEMENT_TOLERANCE_PCT = 5.0
# ...over requests whose first-to-last-token window is at least this long.
AGREEMENT_MIN_WINDOW_S = 0.25
# Decode TPS is reported only when the decode window (wall - TTFT) is at least this
# fraction of the wall time; below it the division amplifies clock noise into nonsense.
MIN_DECODE_WINDOW_FRACTION = 0.05
MIN_DECODE_TOKENS = 2
ITL_PERCENTILES = (50, 95, 99)

STATUS_OK = "OK"
STATUS_NO_TOKENS = "NO_TOKENS"
STATUS_REQ_ERRORS = "REQ_ERRORS"

BENCH_RECORD_KIND = "bench_request"


def payloads(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Bench request payloads out of runner dicts or store records (other kinds dropped)."""
    out: list[dict[str, Any]] = []
    for rec in records:
        if "payload" in rec and isinstance(rec.get("payload"), Mapping):
            if rec.get("kind", BENCH_RECORD_KIND) != BENCH_RECORD_KIND:
                continue
            out.append(dict(rec["payload"]))
        elif "workload" in rec:
            out.append(dict(rec))
    return out


def describe(values: Iterable[float | None]) -> dict[str, Any]:
    """n, mean, sample std, CV%, min, max of the non-missing values (None where undefined)."""
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "cv_pct": None, "min": None, "max": None}
    mean = _st.fmean(xs)
    std = _st.stdev(xs) if n >= 2 else None
    cv = (std / mean * 100.0) if (std is not None and mean) else None
    return {"n": n, "mean": mean, "std": std, "cv_pct": cv, "min": min(xs), "max": max(xs)}


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) of already sorted values, linear between closest ranks."""
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(position), math.ceil(position)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (position - lo)


# -- one request ------------------------------------------------------------------------


def is_ok(rec: Mapping[str, Any]) -> bool:
    return not rec.get("error") and rec.get("status") == 200


def is_usable(rec: Mapping[str, Any]) -> bool:
    """An error-free request that produced at least USABLE_FRACTION of its max_tokens."""
    if not is_ok(rec):
        return False
    tokens = rec.get("completion_tokens")
    if not tokens:
        return False
    limit = max_tokens(rec)
    if not limit:
        return True
    return bool(tokens >= USABLE_FRACTION * limit)


def decode_rate(tokens: int | None, wall_s: float | None,
                ttft_s: float | None) -> tuple[float | None, float | None, str | None]:
    """(decode_tps, window_s, reason_if_na) by the rule tokens / (wall - TTFT).

    Because the first token arrives at TTFT, this counts one token more than the window
    strictly generated, reading n / (n-1) high (+3% at 32 tokens, +0.1% at 1000); the
    cross-check therefore uses ``inter_token_tps``, not this. n/a when there is no first
    token, fewer than MIN_DECODE_TOKENS tokens, or a decode window under
    MIN_DECODE_WINDOW_FRACTION of the wall time.
    """
    wall, ttft = wall_s, ttft_s
    if ttft is None or wall is None:
        return None, None, "no token arrived"
    window = wall - ttft
    if not tokens or tokens < MIN_DECODE_TOKENS:
        return None, window, f"fewer than {MIN_DECODE_TOKENS} completion tokens"
    if wall <= 0 or window < MIN_DECODE_WINDOW_FRACTION * wall:
        return None, window, (
            f"decode window {window:.4f} s is under {MIN_DECODE_WINDOW_FRACTION:.0%} of wall {wall:.4f} s"
        )
    return tokens / window, window, None


def _tokens(rec: Mapping[str, Any]) -> int | None:
    tokens = rec.get("completion_tokens")
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def decode_tps(rec: Mapping[str, Any]) -> float | None:
    return decode_rate(_tokens(rec), wall_s(rec), ttft_s(rec))[0]


def decode_na_reason(rec: Mapping[str, Any]) -> str | None:
    return decode_rate(_tokens(rec), wall_s(rec), ttft_s(rec))[2]


def wall_tps(rec: Mapping[str, Any]) -> float | None:
    tokens, wall = _tokens(rec), wall_s(rec)
    return tokens / wall if (tokens and wall and wall > 0) else None


def _inter_token_window(rec: Mapping[str, Any]) -> float | None:
    """Last token - first token on the client clock (seconds), or None."""
    pair = first_last_us(rec)
    return None if pair is None else (pair[1] - pair[0]) / 1e6


def inter_token_tps(rec: Mapping[str, Any]) -> float | None:
    """(tokens - 1) / (last token - first token) on the client clock, or None.

    The client's counterpart of an engine's own decode rate: an engine measures its decode
    steps, and the first token reaches the client after the prompt, so the tokens after it
    are what the window between first and last arrival holds. Comparing this, not
    ``decode_tps``, keeps a definition gap of n/(n-1) (4.3% at 24 tokens) out of the
    cross-check.
    """
    tokens, window = _tokens(rec), _inter_token_window(rec)
    if tokens is None or tokens < 2 or window is None or window <= 0:
        return None
    return (tokens - 1) / window


# A leading gap shorter than this fraction of the request's median gap was a chunk held
# back and flushed with the next (benchmarks/bench_agreement.md: 35-60 ms late starts are
# 4-8 gaps of ~0 ms; no on-time gap of a steady stream comes near a quarter of the median).
HELD_GAP_FRACTION = 0.25


def held_start(gaps: Sequence[int]) -> int:
    """How many leading chunk gaps were a held start: each under a quarter of the median gap.

    0 when the stream started on time. Never more than half the gaps, so an engine that
    sends in bursts throughout (spec-decode, chunked streaming) is not trimmed.
    """
    if len(gaps) < 4:
        return 0
    limit = HELD_GAP_FRACTION * _st.median(gaps)
    m = 0
    while m < len(gaps) and gaps[m] < limit:
        m += 1
    return m if m <= len(gaps) // 2 else 0


def steady_inter_token_tps(rec: Mapping[str, Any]) -> tuple[float | None, int]:
    """The client inter-token rate measured from the end of a held start, and its length.

    When the first chunks reached the client late and together (TCP holding a small write
    for an ACK; the engine had already produced them on time), ``inter_token_tps`` over
    first-to-last reads high by that delay. Here the window starts at the chunk that ended
    the held start, and the tokens counted are the share of chunks after it; with no held
    start this is ``inter_token_tps``.
    """
    gaps = gaps_us(rec)
    tokens = _tokens(rec)
    m = held_start(gaps) if gaps else 0
    if not m or gaps is None or tokens is None or tokens < 2:
        return inter_token_tps(rec), 0
    window = sum(gaps[m:]) / 1e6
    if window <= 0:
        return inter_token_tps(rec), 0
    return (tokens - 1) * (len(gaps) - m) / len(gaps) / window, m


def engine_timings(rec: Mapping[str, Any]) -> EngineTimings | None:
    engine = rec.get("engine")
    return EngineTimings.from_dict(engine) if isinstance(engine, Mapping) else None


def engine_decode_tps(rec: Mapping[str, Any]) -> float | None:
    timings = engine_timings(rec)
    return None if timings is None else timings.decode_tps


def engine_prompt_tps(rec: Mapping[str, Any]) -> float | None:
    timings = engine_timings(rec)
    return None if timings is None else timings.prompt_tps


# -- several requests --------------------------------------------------------------------


def inter_token_ms(recs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Percentiles of the pooled token-chunk gaps (ms) of ``recs``; n/a where none were recorded."""
    gaps: list[float] = []
    with_arrivals = without = 0
    for rec in recs:
        rec_gaps = gaps_us(rec)
        if rec_gaps is None:
            without += 1
            continue
        with_arrivals += 1
        gaps.extend(g / 1000.0 for g in rec_gaps)
    gaps.sort()
    out: dict[str, Any] = {"n_gaps": len(gaps), "n_requests": with_arrivals, "n_without_arrivals": without}
    for q in ITL_PERCENTILES:
        out[f"p{q}"] = percentile(gaps, q)
    if gaps:
        out["not_available"] = None
    elif without and not with_arrivals:
        out["not_available"] = "recorded before arrival times were kept"
    else:
        out["not_available"] = "no usable request had two token chunks" if with_arrivals else "no usable request"
    return out


def agreement(recs: Sequence[Mapping[str, Any]], tolerance_pct: float = AGREEMENT_TOLERANCE_PCT,
              min_window_s: float = AGREEMENT_MIN_WINDOW_S) -> dict[str, Any]:
    """Client inter-token rate vs the engine's own decode rate, same requests.

    ``diff_pct`` is the *median* over requests of (engine - client) / client x 100, so a
    minority of requests whose first chunk reached the client late does not decide it
    (benchmarks/bench_agreement.md: 5 of 40 requests on this VM saw the first chunk 32-42 ms
    late and read up to +33%; every other request agreed within 0.1%, even at 24 tokens).
    An engine whose timings are off is off in every request and moves the median.
    The client rate is ``steady_inter_token_tps``: a request whose first chunks were held
    back and flushed together is measured from the end of that held start
    (``n_held_starts`` counts them; on this VM 2 of 60 requests, 35 and 60 ms late, which
    read +3.6% and +6.2% before and within 0.4% after).
    ``client_inter_token_tps`` / ``engine_decode_tps`` are the means, for display.
    ``warning`` is a sentence when |diff_pct| exceeds ``tolerance_pct``, else None.
    Requests whose client first-to-last token window is under ``min_window_s`` are left
    out (a few ms of delivery delay is a large share of a shorter window). ``n`` = 0 with
    ``not_checked`` saying why when nothing could be compared (the engine gave no timings,
    or every window was too short) -- not a warning, not a pass.
    """
    steady = [steady_inter_token_tps(r) for r in recs]
    both = [(c, engine_decode_tps(r), _inter_token_window(r), held)
            for r, (c, held) in zip(recs, steady, strict=True)]
    both = [b for b in both if b[0] is not None and b[1] is not None]
    checked = [(c, e, held) for c, e, w, held in both
               if c is not None and e is not None and w is not None and w >= min_window_s]
    pairs = [(c, e) for c, e, _ in checked]
    base = {"client_inter_token_tps": None, "engine_decode_tps": None, "diff_pct": None,
            "tolerance_pct": tolerance_pct, "min_window_s": min_window_s, "warning": None,
            "not_checked": None, "n_held_starts": 0}
    if not pairs:
        if both:
            longest = max(w for _, _, w, _ in both if w is not None)
            reason = (f"decode windows too short to cross-check at {tolerance_pct:g}% "
                      f"(longest {longest:.2f} s, need {min_window_s:g} s; raise max_tokens)")
        elif any(r.get("engine") is None and r.get("engine_raw") for r in recs):
            reason = "the engine sent timings that no adapter normalises"
        else:
            reason = "the engine reported no decode timings"
        return {**base, "n": 0, "not_checked": reason}
    client = _st.fmean(p[0] for p in pairs)
    engine = _st.fmean(p[1] for p in pairs)
    diff = _st.median((e - c) / c * 100.0 for c, e in pairs)
    warning = None
    if abs(diff) > tolerance_pct:
        warning = (
            f"engine-reported decode {engine:.2f} tok/s differs from the client-measured "
            f"inter-token rate {client:.2f} tok/s by {diff:+.1f}% (median over {len(pairs)} requests; "
            f"more than {tolerance_pct:g}%); trust the client figure"
        )
    return {**base, "n": len(pairs), "client_inter_token_tps": client, "engine_decode_tps": engine,
            "diff_pct": diff, "warning": warning, "n_held_starts": sum(1 for *_, held in checked if held)}


def summarize_workload(recs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Summary of the *measured* (non-warm-up) requests of one workload."""
    measured = [r for r in recs if not r.get("warmup")]
    ok = [r for r in measured if is_ok(r)]
    usable = [r for r in measured if is_usable(r)]
    limit = next((max_tokens(r) for r in measured if max_tokens(r)), None)
    sources = [t.source for t in (engine_timings(r) for r in measured) if t is not None and t.source]
    return {
        "n": len(measured),
        "n_ok": len(ok),
        "n_errors": len(measured) - len(ok),
        "n_usable": len(usable),
        "n_decode_na": sum(1 for r in usable if decode_tps(r) is None),
        "max_tokens": limit,
        "decode_tps": describe(decode_tps(r) for r in usable),
        "wall_tps": describe(wall_tps(r) for r in usable),
        "ttft_s": describe(ttft_s(r) for r in ok),
        "wall_s": describe(wall_s(r) for r in ok),
        "inter_token_ms": inter_token_ms(usable),
        "completion_tokens": describe(r.get("completion_tokens") for r in ok),
        "prompt_tokens": describe(r.get("prompt_tokens") for r in ok),
        "engine_decode_tps": describe(engine_decode_tps(r) for r in usable),
        "engine_prompt_tps": describe(engine_prompt_tps(r) for r in ok),
        "engine_source": sources[0] if sources else None,
        "agreement": agreement(usable),
    }


def run_status(recs: Sequence[Mapping[str, Any]]) -> str:
    """REQ_ERRORS if any request (warm-up included) failed; NO_TOKENS if no measured
    request produced a token; else OK."""
    if any(not is_ok(r) for r in recs):
        return STATUS_REQ_ERRORS
    measured = [r for r in recs if not r.get("warmup")]
    if not any((r.get("completion_tokens") or 0) > 0 for r in measured):
        return STATUS_NO_TOKENS
    return STATUS_OK


def summarize(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"status", "workloads": {name: summary}, "warnings": [sentences]}`` from records."""
    recs = payloads(records)
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_workload.setdefault(str(r.get("workload")), []).append(r)
    workloads = {name: summarize_workload(rs) for name, rs in by_workload.items()}
    warnings: list[str] = []
    for name, s in workloads.items():
        if s["agreement"]["warning"]:
            warnings.append(f"{name}: {s['agreement']['warning']}")
        if s["n_errors"]:
            warnings.append(f"{name}: {s['n_errors']} of {s['n']} measured requests failed")
        if s["n"] and s["n_ok"] and not s["n_usable"]:
            warnings.append(
                f"{name}: no request reached {USABLE_FRACTION:.0%} of max_tokens; decode figures omitted"
            )
        if s["n_decode_na"]:
            warnings.append(
                f"{name}: decode TPS n/a for {s['n_decode_na']} request(s) "
                f"(decode window under {MIN_DECODE_WINDOW_FRACTION:.0%} of wall time)"
            )
    warmup_errors = sum(1 for r in recs if r.get("warmup") and not is_ok(r))
    if warmup_errors:
        warnings.append(f"{warmup_errors} warm-up request(s) failed")
    return {"status": run_status(recs) if recs else STATUS_NO_TOKENS, "workloads": workloads, "warnings": warnings}


METRICS_RECORD_KIND = "engine_metrics"


def engine_counters(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What the engine's own counters (its /metrics, in neutral names) moved by over the run,
    beside what the stored requests add up to (warm-ups included: the engine counted them too).
    None when no before/after snapshot was stored."""
    snaps: dict[str, Mapping[str, float]] = {}
    for rec in records:
        if rec.get("kind") == METRICS_RECORD_KIND and isinstance(rec.get("payload"), Mapping):
            p = rec["payload"]
            if isinstance(p.get("counters"), Mapping):
                snaps[str(p.get("when"))] = p["counters"]
    if "before" not in snaps or "after" not in snaps:
        return None
    before, after = snaps["before"], snaps["after"]
    delta = {k: after[k] - before[k] for k in after if k in before and k.endswith("_total")}
    reqs = payloads(records)
    return {"delta": delta,
            "client_completion_tokens": sum(int(r.get("completion_tokens") or 0) for r in reqs),
            "client_prompt_tokens": sum(int(r.get("prompt_tokens") or 0) for r in reqs),
            "requests": len(reqs)}
