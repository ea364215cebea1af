"""A suite result's figures, recomputed from its raw records (and the run's conditions) only.

``summarize_suite(records, conditions)`` -> ``{"status", "suite", "kind", "groups": {label:
figures}, "speculative", "client_load", "integrity": [checks], "valid", "warnings"}``. A group
is one depth, one stream count, or one workload. Per group:

- ``decode_tps`` / ``ttft_s`` / ``inter_token_ms`` / ``agreement``: ``statistics``' own rules
  over the kept measured requests (``stats.kept``: no warm-ups, no sample the prefix-cache
  guard discarded, no request whose thinking used the whole budget);
- ``prefill_tps``: prompt tokens / TTFT on the client clock; ``engine_prompt_tps`` the engine's;
- ``depth``: the measured context at mid-decode (prompt tokens + half the generated ones);
- concurrency: per round ``aggregate_tps`` = tokens of all streams / (last end - the scheduled
  send), TTFT *from the scheduled send* p50 / p95 / p99, per-stream decode median, errors and
  silent-empty streams; and ``all_decoding_tps`` (``all_decoding``): the tokens that arrived while
  every stream of the round was decoding (after the last first token, before the first stream
  ended) over that window, the pure-decode rate a plan's aggregate figure predicts, where the
  aggregate mixes decode with the other streams' prefill; None (with ``all_decoding_why``) when the
  window is empty;
- ``reasoning``: time to first token vs first content token, reasoning / content chunks,
  requests whose thinking ran out of budget;
- ``roofline``: the share of the bandwidth limit (``roofline``) at that depth.

The newer kinds add a block of their own beside the groups (a group is then one agentic turn
over the sessions, one sweep cell, or the one request rate):

- ``agentic`` (``agentic_figures``): the per-turn curve (context tokens, cached tokens and
  their share of the previous turn's prompt, new tokens, TTFT, prefill of the new tokens,
  decode), totals, tool calls made, sessions stopped short of the context, and the TTFT-growth
  verdict; its checklist replaces two checks: ``prefix_cache`` judges turn 1 of each session
  only (later turns reuse their own session's prompt by design) and ``client_vs_engine``
  compares the turns streamed one token per chunk (``agentic.session.content_only``);
- ``sweep`` (``sweep_figures``): per cell the rounds' median aggregate rate, per-stream decode,
  TTFT from the schedule p50 / p95, TPOT p95; the knee per prompt size and the recommended slot
  count (``bench.sweep``); the cells the budget skipped;
- ``rate`` (``rate.arrivals.goodput``): goodput, throughput, TTFT / TPOT / e2e percentiles from the
  scheduled send, errors and silent-empty streams.
"""

from __future__ import annotations

import statistics as _st
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engineroom.bench.agentic.session import STOP_KIND as AGENTIC_STOP_KIND
from engineroom.bench.agentic.session import content_only, ttft_verdict
from engineroom.bench.guards import STATUS_INVALID, extra_checks, failed_requests
from engineroom.bench.integrity import check_row, checklist, is_valid
from engineroom.bench.rate.arrivals import goodput, request_latency
from engineroom.bench.roofline import roofline
from engineroom.bench.speculative.acceptance import acceptance
from engineroom.bench.stats import (
    CLIENT_LOAD_KIND,
    cache_reuse,
    client_load,
    group_label,
    is_silent,
    kept,
    latency_from_schedule_s,
    reasoning,
    records_of,
)
from engineroom.bench.sweep.knee import SWEEP_CELL_KIND, knee, recommend
from engineroom.records import statistics as st
from engineroom.records.encoding import arrivals_us, gaps_us, ttft_s, wall_s

__all__ = ["STATUS_INVALID", "agentic_figures", "all_decoding", "is_suite_run", "round_figures", "summarize_suite",
           "sweep_figures"]

# the checklist's cache rule per kind: sweep and rate send salted prompts, like concurrency
_CHECKED_AS = {"sweep": "concurrency", "rate": "concurrency"}


def is_suite_run(conditions: Mapping[str, Any]) -> bool:
    bench = conditions.get("bench")
    return isinstance(bench, Mapping) and bool(bench.get("suite")) and bool(bench.get("kind"))


def _pcts(values: Iterable[float | None], scale: float = 1.0) -> dict[str, float | None]:
    xs = sorted(float(v) * scale for v in values if v is not None)
    return {f"p{q}": st.percentile(xs, q) for q in (50, 95, 99)}


def _prefill(rec: Mapping[str, Any]) -> float | None:
    t, n = ttft_s(rec), rec.get("prompt_tokens")
    return n / t if (isinstance(n, int) and n > 0 and t and t > 0) else None


def _reasoning_block(recs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    measured = [r for r in recs if not r.get("warmup") and not r.get("discarded")]
    rs = [reasoning(r) for r in measured]
    with_r = [x for x in rs if x["reasoning_chunks"]]
    return {"requests_with_reasoning": len(with_r),
            "thinking_exhausted": sum(1 for x in rs if x["thinking_exhausted"]),
            "reasoning_chunks": sum(x["reasoning_chunks"] for x in rs),
            "content_chunks": sum(x["content_chunks"] for x in rs),
            "ttft_s": st.describe(x["ttft_s"] for x in rs),
            "first_content_s": st.describe(x["first_content_s"] for x in rs)}


# the fewest tokens a stream must deliver inside the all-decoding window for its rate to be timed: a
# window's ends cut each stream's chunks at +-1, so at 8 a stream the edges move the rate by ~1/8
# (the H200's 64-token suite had a 0.12 s window of ~4 tokens a stream: 1,170 tok/s against ~290 of
# the whole round, not a measurement)
MIN_WINDOW_TOKENS_PER_STREAM = 8


def all_decoding(rs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One round's streams while every one of them was decoding: on the round's clock (each token's
    arrival after its request's send, plus the send's lag behind the round's schedule), the window
    from the last stream's first token to the first stream's last token, and the tokens of all
    streams that arrived in it (a chunk counts as its stream's tokens per chunk) over its length.
    ``{"tps", "window_s", "tokens", "why"}``; ``tps`` None with ``why`` where there is no window. A round of one
    stream: that stream's own decode (from its first token to its last), as ``tune`` counts one slot."""
    none: dict[str, Any] = {"tps": None, "window_s": None, "tokens": None}
    ok = [r for r in rs if st.is_ok(r)]
    if not ok or len(ok) < len(rs):
        return {**none, "why": "a round with a failed stream"}
    streams: list[tuple[list[float], float]] = []        # (arrivals on the round clock, tokens per chunk)
    for r in ok:
        offsets, tokens = arrivals_us(r), r.get("completion_tokens")
        if not offsets or len(offsets) < 2 or not isinstance(tokens, int) or tokens < 2:
            return {**none, "why": "a stream without two timed token chunks"}
        lag = r.get("scheduled_lag_us") or 0
        streams.append(([(lag + o) / 1e6 for o in offsets], tokens / len(offsets)))
    start = max(times[0] for times, _ in streams)         # every stream has its first token
    end = min(times[-1] for times, _ in streams)          # no stream has ended yet
    if end <= start:
        return {**none, "why": "the streams never all decoded at once (one ended before the last one's first "
                               "token)"}
    tokens = sum(per * sum(1 for t in times if start < t <= end) for times, per in streams)
    if tokens < MIN_WINDOW_TOKENS_PER_STREAM * len(streams):
        return {**none, "window_s": end - start, "tokens": tokens,
                "why": f"the window where every stream decoded ({(end - start) * 1000:.0f} ms) held "
                       f"{tokens / len(streams):.1f} tokens a stream, under {MIN_WINDOW_TOKENS_PER_STREAM}: too short "
                       "to time (more --max-tokens widens it)"}
    return {"tps": tokens / (end - start), "window_s": end - start, "tokens": tokens, "why": None}


def round_figures(recs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    by: dict[int, list[Mapping[str, Any]]] = {}
    for r in recs:
        if isinstance(r.get("round"), int):
            by.setdefault(int(r["round"]), []).append(r)
    out = []
    for no, rs in sorted(by.items()):
        ends = [(r.get("scheduled_lag_us") or 0) + (r.get("end_us") or 0) for r in rs]
        tokens = sum(int(r.get("completion_tokens") or 0) for r in rs if st.is_ok(r))
        wall = max(ends) / 1e6 if ends else 0.0
        steady = all_decoding(rs)
        out.append({"round": no, "streams": len(rs), "tokens": tokens, "wall_s": wall,
                    "aggregate_tps": tokens / wall if wall > 0 else None,
                    "all_decoding_tps": steady["tps"], "all_decoding_window_s": steady["window_s"],
                    "all_decoding_why": steady["why"],
                    "errors": sum(1 for r in rs if not st.is_ok(r)), "silent": sum(1 for r in rs if is_silent(r))})
    return out


def _median(values: list[float]) -> float | None:
    """The median, or None when nothing could be timed (never a crash on an empty group)."""
    return _st.median(values) if values else None


def _group(name: str, recs: Sequence[Mapping[str, Any]], keep: Sequence[Mapping[str, Any]], kind: str,
           basis: Mapping[str, Any] | None, tol: float) -> dict[str, Any]:
    usable = [r for r in keep if st.is_usable(r)]
    base = st.summarize_workload(list(keep))
    decode = base["decode_tps"]
    prompt = st.describe(r.get("prompt_tokens") for r in keep if st.is_ok(r))
    gen = st.describe(r.get("completion_tokens") for r in usable)
    depth = (prompt["mean"] or 0) + (gen["mean"] or 0) / 2 if prompt["mean"] is not None else None
    f: dict[str, Any] = {
        "n_requests": len(recs), "n_kept": len(keep), "n_usable": len(usable),
        "n_discarded": sum(1 for r in recs if r.get("discarded")),
        "max_tokens": base["max_tokens"], "decode_tps": decode, "ttft_s": base["ttft_s"],
        "prefill_tps": st.describe(_prefill(r) for r in keep if st.is_ok(r)),
        "engine_prompt_tps": base["engine_prompt_tps"], "engine_decode_tps": base["engine_decode_tps"],
        "prompt_tokens": prompt, "completion_tokens": gen, "depth": depth,
        "inter_token_ms": {**base["inter_token_ms"],
                           **_pcts(g / 1000.0 for r in usable for g in (gaps_us(r) or []))},
        "agreement": st.agreement(usable, tolerance_pct=tol),
        "sized_by": sorted({str(r.get("sized_by")) for r in recs if r.get("sized_by")}),
        "cache_reuse_max": max((cache_reuse(r).cached or 0 for r in keep), default=0),
        "reasoning": _reasoning_block(recs),
        "engine_source": base["engine_source"],
        "cv_pct": decode.get("cv_pct"),
    }
    streams = 1
    rate = decode.get("mean")
    if kind in ("concurrency", "sweep"):
        rounds = round_figures(keep)
        agg = st.describe(r["aggregate_tps"] for r in rounds)
        streams = max((r["streams"] for r in rounds), default=1)
        whys = sorted({str(r["all_decoding_why"]) for r in rounds if r["all_decoding_tps"] is None})
        f.update(rounds=rounds, aggregate_tps=agg, cv_pct=agg.get("cv_pct"),
                 all_decoding_tps=st.describe(r["all_decoding_tps"] for r in rounds),
                 all_decoding_why="; ".join(whys) or None,
                 per_stream_decode_median=_median([x for x in (st.decode_tps(r) for r in usable) if x is not None]),
                 ttft_from_schedule_s=_pcts(latency_from_schedule_s(r) for r in keep if st.is_ok(r)),
                 scheduled_lag_ms=_pcts((r.get("scheduled_lag_us") or 0) / 1000.0 for r in keep),
                 errors=sum(x["errors"] for x in rounds), silent=sum(x["silent"] for x in rounds))
        rate = agg.get("mean")
        tpots = [request_latency(r)["tpot_s"] for r in usable]
        f["tpot_ms"] = _pcts(tpots, 1000.0)
    if kind == "rate":       # per-request decode varies with the offered load by design: no CV claim
        f["cv_pct"] = None
    f["roofline"] = roofline(basis, depth, rate, streams=streams)
    return f


def summarize_suite(records: Iterable[Mapping[str, Any]], conditions: Mapping[str, Any]) -> dict[str, Any]:
    records = list(records)
    bench = conditions.get("bench") if isinstance(conditions.get("bench"), Mapping) else {}
    assert isinstance(bench, Mapping)
    kind = str(bench.get("kind") or "standard")
    tol = float(bench.get("agreement_tolerance_pct") or 1.0)
    reqs = st.payloads(records)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in reqs:
        groups.setdefault(group_label(r), []).append(r)
    keeps = {name: kept(rs) for name, rs in groups.items()}
    basis = conditions.get("roofline") if isinstance(conditions.get("roofline"), Mapping) else None
    figures = {name: _group(name, rs, keeps[name], kind, basis, tol) for name, rs in groups.items()}
    loads = records_of(records, CLIENT_LOAD_KIND)
    load = client_load(loads[-1] if loads else None)
    checks = checklist(groups, keeps, figures, load, conditions, _CHECKED_AS.get(kind, kind))
    extra: dict[str, Any] = {}
    if kind == "agentic":
        checks = _agentic_checks(checks, keeps, tol)
        extra["agentic"] = agentic_figures(figures, reqs, records)
    elif kind == "sweep":
        extra["sweep"] = sweep_figures(figures, keeps, records, bench)
    elif kind == "rate":
        checks = [check_row("cv", "SKIP", "request-rate mode: each request's decode rate follows the load at its "
                                       "arrival by design; goodput and percentiles describe it") if c["name"] == "cv"
                  else c for c in checks]
        measured = [r for rs in groups.values() for r in rs if not r.get("warmup")]
        extra["rate"] = goodput(measured, slo_ttft_ms=float(bench.get("slo_ttft_ms") or 0.0),
                                slo_itl_ms=float(bench.get("slo_itl_ms") or 0.0),
                                rate=float(bench["rate"]) if bench.get("rate") else None)
    checks += extra_checks(records, keeps, kind, conditions)
    valid = is_valid(checks)
    status = st.run_status(reqs) if reqs else st.STATUS_NO_TOKENS
    if status == st.STATUS_OK and not valid:
        status = STATUS_INVALID
    warnings = [f"{c['name']}: {c['detail']}" for c in checks if c["status"] == "FAIL"]
    spec = acceptance(records)
    if spec.get("warning"):
        warnings.append(f"speculative: {spec['warning']}")
    if spec.get("agrees") is False:
        warnings.append("speculative: the records' draft counts differ from the engine's counters")
    if kind == "sweep" and extra["sweep"]["skipped"]:
        warnings.append(f"sweep: {len(extra['sweep']['skipped'])} cell(s) not run: the time budget "
                        f"({extra['sweep']['budget_s']:g} s) would have been exceeded")
    if kind == "agentic" and extra["agentic"]["stops"]:
        warnings.append(f"agentic: {len(extra['agentic']['stops'])} session(s) stopped before the planned last turn "
                        "(the next turn would not have fitted the context)")
    return {"status": status, "suite": bench.get("suite"), "kind": kind, "groups": figures,
            "speculative": spec, "client_load": load, "integrity": checks, "valid": valid, "warnings": warnings,
            "counters": st.engine_counters(records), "failed_requests": failed_requests(records), **extra}


def _mean(xs: Iterable[float | int | None]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return _st.fmean(vals) if vals else None


def _turn(rec: Mapping[str, Any]) -> int:
    t = rec.get("turn")
    return int(t) if isinstance(t, int) else 0


def _agentic_checks(checks: list[dict[str, str]], keeps: Mapping[str, Sequence[Mapping[str, Any]]],
                    tol: float) -> list[dict[str, str]]:
    """The agentic replay's own cache and cross-check rules in place of the generic ones."""
    measured = [r for rs in keeps.values() for r in rs if st.is_ok(r)]
    firsts = [r for r in measured if _turn(r) == 1]
    dirty = [r for r in firsts if cache_reuse(r).contaminated]
    known = [r for r in measured if cache_reuse(r).cached is not None]
    if dirty:
        cache = check_row("prefix_cache", "FAIL", f"{len(dirty)} session(s) reused the cache on turn 1, before their "
                                               f"own conversation existed: {cache_reuse(dirty[0]).describe()}")
    elif not known:
        cache = check_row("prefix_cache", "SKIP", "the engine reports no cached-token count")
    else:
        later = [r for r in known if _turn(r) > 1 and isinstance(r.get("previous_prompt_tokens"), int)]
        reused = sum(min(cache_reuse(r).cached or 0, int(r["previous_prompt_tokens"])) for r in later)
        offered = sum(int(r["previous_prompt_tokens"]) for r in later)
        share = f"; later turns reused {reused / offered:.0%} of their previous turn's prompt (by design)" \
            if offered else ""
        most = max((cache_reuse(r).cached or 0 for r in firsts), default=0)
        cache = check_row("prefix_cache", "PASS", f"turn 1 of {len(firsts)} session(s) reused at most the template "
                                               f"preamble (max {most} tokens){share}")
    bad, good, skipped = [], [], []
    for name, recs in keeps.items():
        text = [r for r in recs if st.is_usable(r) and content_only(r)]
        a = st.agreement(text, tolerance_pct=tol)
        if not a["n"]:
            skipped.append(name)
        elif abs(a["diff_pct"]) > tol:
            bad.append(f"{name} {a['diff_pct']:+.2f}%")
        else:
            good.append(f"{name} {a['diff_pct']:+.2f}%")
    which = "on the turns streamed one token per chunk"
    if bad:
        cross = check_row("client_vs_engine", "FAIL", f"beyond {tol:g}% {which}: " + ", ".join(bad))
    elif good:
        cross = check_row("client_vs_engine", "PASS", f"within {tol:g}% {which}: " + ", ".join(good)
                       + (f" (not compared: {', '.join(skipped)})" if skipped else ""))
    else:
        cross = check_row("client_vs_engine", "SKIP", "no turn streamed one token per chunk with a long enough decode "
                                                   "window (a tool-call chunk, or text a tool-call parser held back, "
                                                   "carries several tokens, so those turns are not compared per "
                                                   "token)")
    swap = {"prefix_cache": cache, "client_vs_engine": cross}
    return [swap.get(c["name"], c) for c in checks]


def agentic_figures(figures: Mapping[str, Mapping[str, Any]], reqs: Sequence[Mapping[str, Any]],
                    records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-turn curve, totals and the TTFT-growth verdict of an agentic replay."""
    measured = [r for r in kept(reqs) if st.is_ok(r)]
    by: dict[int, list[Mapping[str, Any]]] = {}
    for r in measured:
        by.setdefault(_turn(r), []).append(r)
    curve = []
    for turn, rs in sorted(by.items()):
        cached = [cache_reuse(r).cached for r in rs]
        new = [(r.get("prompt_tokens") or 0) - (c or 0) for r, c in zip(rs, cached, strict=True)]
        ttft = [ttft_s(r) for r in rs]
        prev = [int(r["previous_prompt_tokens"]) for r in rs if isinstance(r.get("previous_prompt_tokens"), int)]
        # the previous prompt's share served from the cache (a few more cached tokens can come from its reply)
        reused = [min(c or 0, int(r["previous_prompt_tokens"])) for r, c in zip(rs, cached, strict=True)
                  if isinstance(r.get("previous_prompt_tokens"), int)]
        curve.append({
            "turn": turn, "n": len(rs), "context_tokens": _mean(r.get("prompt_tokens") for r in rs),
            "cached_tokens": _mean(cached), "new_tokens": _mean(new),
            "reused_pct": (sum(reused) / sum(prev) * 100.0) if prev and sum(prev) else None,
            "ttft_s": _mean(ttft),
            "prefill_new_tps": _mean(n / t for n, t in zip(new, ttft, strict=True) if t and n > 0),
            "engine_prompt_tps": _mean(st.engine_prompt_tps(r) for r in rs),
            "decode_tps": _mean(st.decode_tps(r) for r in rs if st.is_usable(r)),
            "tool_calls": sum(1 for r in rs if r.get("tool_calls")),
            "output_tokens": _mean((r.get("step") or {}).get("output_counted_tokens")
                                   or (r.get("step") or {}).get("output_target_tokens") for r in rs if r.get("step"))})
    stops = records_of(records, AGENTIC_STOP_KIND)
    sessions = sorted({int(r["session"]) for r in measured if isinstance(r.get("session"), int)})
    prompt = sum(int(r.get("prompt_tokens") or 0) for r in measured)
    cached_all = sum(cache_reuse(r).cached or 0 for r in measured)
    points = [(int(p["turn"] or 0), float(p["context_tokens"]), float(p["ttft_s"])) for p in curve
              if p["context_tokens"] is not None and p["ttft_s"] is not None]
    later = [r for r in measured if isinstance(r.get("previous_prompt_tokens"), int)
             and cache_reuse(r).cached is not None]
    offered = sum(int(r["previous_prompt_tokens"]) for r in later)
    reused_all = sum(min(cache_reuse(r).cached or 0, int(r["previous_prompt_tokens"])) for r in later)
    return {"curve": curve, "verdict": ttft_verdict(points, reused_all / offered * 100.0 if offered else None),
            "stops": stops,
            "totals": {"sessions": len(sessions), "turns": max(by, default=0), "requests": len(measured),
                       "prompt_tokens": prompt, "cached_tokens": cached_all, "computed_tokens": prompt - cached_all,
                       "completion_tokens": sum(int(r.get("completion_tokens") or 0) for r in measured),
                       "ttft_s": sum(ttft_s(r) or 0.0 for r in measured),
                       "wall_s": sum(wall_s(r) or 0.0 for r in measured),
                       "tool_calls": sum(1 for r in measured if r.get("tool_calls")),
                       "max_context_tokens": max((int(r.get("prompt_tokens") or 0) for r in measured), default=0)}}


def sweep_figures(figures: Mapping[str, Mapping[str, Any]], keeps: Mapping[str, Sequence[Mapping[str, Any]]],
                  records: Sequence[Mapping[str, Any]], bench: Mapping[str, Any]) -> dict[str, Any]:
    """The sweep's cells (medians over rounds), the knee per prompt size and the slot count to launch with."""
    slo_ttft = float(bench.get("slo_ttft_ms") or 0.0) or None
    slo_itl = float(bench.get("slo_itl_ms") or 0.0) or None
    cells: list[dict[str, Any]] = []
    for name, rs in keeps.items():
        measured = [r for r in rs if isinstance(r.get("group"), Mapping) and "ctx" in r["group"]]
        if not measured:
            continue
        g, f = measured[0]["group"], figures[name]
        aggs = [x["aggregate_tps"] for x in f.get("rounds") or [] if x["aggregate_tps"] is not None]
        ttft = f.get("ttft_from_schedule_s") or {}
        cells.append({"ctx": int(g["ctx"]), "streams": int(g["streams"]), "rounds": len(f.get("rounds") or []),
                      "aggregate_tps": _st.median(aggs) if aggs else None,
                      "per_stream_tps": f.get("per_stream_decode_median"),
                      "ttft_p50_ms": ttft["p50"] * 1000.0 if ttft.get("p50") is not None else None,
                      "ttft_p95_ms": ttft["p95"] * 1000.0 if ttft.get("p95") is not None else None,
                      "tpot_p95_ms": (f.get("tpot_ms") or {}).get("p95"),
                      "errors": f.get("errors", 0), "silent": f.get("silent", 0)})
    cells.sort(key=lambda c: (c["ctx"], c["streams"]))
    gain = float(bench.get("knee_gain_pct") or 15.0)
    knees = {ctx: knee([c for c in cells if c["ctx"] == ctx], gain_pct=gain, slo_ttft_ms=slo_ttft,
                       slo_itl_ms=slo_itl) for ctx in sorted({c["ctx"] for c in cells})}
    decisions = records_of(records, SWEEP_CELL_KIND)
    skipped = [d for d in decisions if d.get("status") == "skipped"]
    ran = [d for d in decisions if d.get("status") == "run"]
    elapsed = max((float(d.get("elapsed_s") or 0) + float(d.get("took_s") or 0) for d in ran), default=0.0)
    max_n = int(bench.get("streams_max") or max((c["streams"] for c in cells), default=1))
    return {"cells": cells, "knees": {str(k): v for k, v in knees.items()},
            "recommended": recommend(knees, max_n, str(bench.get("streams_source") or "the most tried")),
            "skipped": skipped, "budget_s": float(bench.get("budget_s") or 0.0), "elapsed_s": elapsed,
            "knee_gain_pct": gain, "slo_ttft_ms": slo_ttft, "slo_itl_ms": slo_itl}
