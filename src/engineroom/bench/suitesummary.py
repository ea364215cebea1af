"""A suite result's figures, recomputed from its raw records (and the run's conditions) only.

``summarize_suite(records, conditions)`` -> ``{"status", "suite", "kind", "groups": {label:
figures}, "speculative", "client_load", "integrity": [checks], "valid", "warnings"}``. A group
is one depth, one stream count, or one workload. Per group:

- ``decode_tps`` / ``ttft_s`` / ``inter_token_ms`` / ``agreement``: ``statistics``' own rules
  over the kept measured requests (``suitestats.kept``: no warm-ups, no sample the prefix-cache
  guard discarded, no request whose thinking used the whole budget);
- ``prefill_tps``: prompt tokens / TTFT on the client clock; ``engine_prompt_tps`` the engine's;
- ``depth``: the measured context at mid-decode (prompt tokens + half the generated ones);
- concurrency: per round ``aggregate_tps`` = tokens of all streams / (last end - the scheduled
  send), TTFT *from the scheduled send* p50 / p95 / p99, per-stream decode median, errors and
  silent-empty streams;
- ``reasoning``: time to first token vs first content token, reasoning / content chunks,
  requests whose thinking ran out of budget;
- ``roofline``: the share of the bandwidth limit (``roofline``) at that depth.
"""

from __future__ import annotations

import statistics as _st
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engineroom.bench import statistics as st
from engineroom.bench.integrity import checklist, is_valid
from engineroom.bench.records import gaps_us
from engineroom.bench.roofline import roofline
from engineroom.bench.speculative import acceptance
from engineroom.bench.suitestats import (
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

__all__ = ["STATUS_INVALID", "is_suite_run", "round_figures", "summarize_suite"]

STATUS_INVALID = "INVALID"


def is_suite_run(conditions: Mapping[str, Any]) -> bool:
    bench = conditions.get("bench")
    return isinstance(bench, Mapping) and bool(bench.get("suite")) and bool(bench.get("kind"))


def _pcts(values: Iterable[float | None], scale: float = 1.0) -> dict[str, float | None]:
    xs = sorted(float(v) * scale for v in values if v is not None)
    return {f"p{q}": st.percentile(xs, q) for q in (50, 95, 99)}


def _prefill(rec: Mapping[str, Any]) -> float | None:
    t, n = st.ttft_s(rec), rec.get("prompt_tokens")
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
        out.append({"round": no, "streams": len(rs), "tokens": tokens, "wall_s": wall,
                    "aggregate_tps": tokens / wall if wall > 0 else None,
                    "errors": sum(1 for r in rs if not st.is_ok(r)), "silent": sum(1 for r in rs if is_silent(r))})
    return out


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
    if kind == "concurrency":
        rounds = round_figures(keep)
        agg = st.describe(r["aggregate_tps"] for r in rounds)
        streams = max((r["streams"] for r in rounds), default=1)
        f.update(rounds=rounds, aggregate_tps=agg, cv_pct=agg.get("cv_pct"),
                 per_stream_decode_median=_st.median([x for x in (st.decode_tps(r) for r in usable) if x is not None])
                 if usable else None,
                 ttft_from_schedule_s=_pcts(latency_from_schedule_s(r) for r in keep if st.is_ok(r)),
                 scheduled_lag_ms=_pcts((r.get("scheduled_lag_us") or 0) / 1000.0 for r in keep),
                 errors=sum(x["errors"] for x in rounds), silent=sum(x["silent"] for x in rounds))
        rate = agg.get("mean")
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
    checks = checklist(groups, keeps, figures, load, conditions, kind)
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
    return {"status": status, "suite": bench.get("suite"), "kind": kind, "groups": figures,
            "speculative": spec, "client_load": load, "integrity": checks, "valid": valid, "warnings": warnings,
            "counters": st.engine_counters(records)}
