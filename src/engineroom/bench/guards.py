"""The checks beside ``integrity``'s that read a run's other records, and the quick / long suites'
checklist. Each is PASS / FAIL / SKIP with the reason, recomputed from stored records only:

- ``host_contention``: what other processes took of the cores the engine and the client run on
  (the ``resources`` record's CPU readings, ``resources.contention``), and the hypervisor's steal,
  over the run and in its worst ``window_s`` window; the pre-flight reading (``preflight`` record)
  is shown beside it. FAIL above ``CONTENTION_MEAN_PCT`` over the run or ``CONTENTION_PEAK_PCT``
  in a window (or the same for steal): llama.cpp's threads spin-wait, so a shared core costs it
  far more than the share itself (decode fell ~50x on a busy 2-core VM);
- ``other_clients``: the engine's own counters over the run (``engine_metrics`` before / after, its
  ``/metrics`` in neutral names) against the requests' usage: tokens generated or prompt tokens
  evaluated beyond what bench's requests account for were another client's. A server without
  counters is judged on its slots instead where the engine lists them (``slot_samples``: busy
  slots sampled during a sequential run, which sends one request at a time, so two busy slots
  are another client's request);
- ``inter_token_outliers``: per group, the inter-token gap p99 over ``itl_p99_ratio`` times its
  p50 (sequential kinds; concurrent streams share the engine with each other's prefill by design);
- ``engine_stopped``: bench stopped sending (``watchdog``: a stalled engine, or failures in a row).

``summarize_bench`` is ``statistics.summarize`` plus ``integrity.checklist`` and these checks for
the quick and long suites (status INVALID when one fails); ``failed_requests`` groups the errors
behind failed requests for the card.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engineroom.bench.integrity import check_row, checklist, is_valid
from engineroom.bench.stats import CLIENT_LOAD_KIND, client_load, kept, records_of
from engineroom.bench.watchdog import ABORT_KIND
from engineroom.records import statistics as st
from engineroom.records.encoding import gaps_us

__all__ = ["CONTENTION_MEAN_PCT", "CONTENTION_PEAK_PCT", "ITL_P99_RATIO", "OTHER_CLIENT_SLACK_TOKENS",
           "PREFLIGHT_KIND", "SLOT_SAMPLES_KIND", "STATUS_INVALID", "extra_checks", "failed_requests",
           "summarize_bench"]

PREFLIGHT_KIND = "preflight"
SLOT_SAMPLES_KIND = "slot_samples"      # busy slots sampled during the run (flows.runs: servers without counters)
STATUS_INVALID = "INVALID"
# The limits, and how they were calibrated on the 2-core VM: benchmarks/bench_contention.md
CONTENTION_MEAN_PCT = 10.0
CONTENTION_PEAK_PCT = 25.0
STEAL_MEAN_PCT = 10.0
ITL_P99_RATIO = 5.0
OTHER_CLIENT_SLACK_TOKENS = 8           # the counters may differ from the usage by a token or two per request
SEQUENTIAL_KINDS = ("standard", "depth", "quick")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}%" if x >= 10 else f"{x:.1f}%"


def contention_check(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    found = [r for r in records_of(records, "resources") if isinstance(r.get("contention"), Mapping)]
    pre = records_of(records, PREFLIGHT_KIND)
    before = ""
    if pre and isinstance(pre[-1].get("reading"), Mapping):
        p = pre[-1]["reading"]
        before = f"; before the run {_pct(p.get('others_pct'))}" + (
            f" (waited {pre[-1].get('waited_s', 0):.0f} s)" if pre[-1].get("waited_s") else "")
    if not found:
        return check_row("host_contention", "SKIP", "no CPU readings were recorded for the run" + before)
    c = found[-1]["contention"]
    if not c.get("engine_known"):
        return check_row("host_contention", "SKIP", "the engine's process is not visible from here (a server on "
                                                 "another machine, or its pid unknown), so other processes' share "
                                                 f"of the cores cannot be told from the engine's{before}")
    cores = c.get("cores") or []
    where = f"core{'s' if len(cores) != 1 else ''} {','.join(str(x) for x in cores)}"
    mean, peak = float(c.get("others_pct") or 0.0), float(c.get("others_peak_pct") or 0.0)
    steal = float(c.get("steal_pct") or 0.0)
    load = c.get("load1_max")
    text = (f"other processes took {_pct(mean)} of the engine's and the client's {where} over the run (worst "
            f"{c.get('window_s', 2):g} s: {_pct(peak)}), steal {_pct(steal)}"
            + (f", load average up to {load:.2f}" if isinstance(load, (int, float)) else "") + before
            + f" (limits {CONTENTION_MEAN_PCT:g}% over the run, {CONTENTION_PEAK_PCT:g}% in a window, "
              f"steal {STEAL_MEAN_PCT:g}%)")
    busy = mean > CONTENTION_MEAN_PCT or peak > CONTENTION_PEAK_PCT or steal > STEAL_MEAN_PCT
    return check_row("host_contention", "FAIL" if busy else "PASS", text)


def _slots_check(records: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """``other_clients`` from the busy slots sampled during a sequential run, or None (none sampled)."""
    found = records_of(records, SLOT_SAMPLES_KIND)
    if not found or not found[-1].get("samples"):
        return None
    s = found[-1]
    said = (f"the engine's slots, sampled {s['samples']} times during the run (no counters to compare), were busy "
            f"{s.get('max_busy', 0)} at most while bench sends one request at a time")
    if s.get("overlapping"):
        return check_row("other_clients", "FAIL", f"{said}: {s['overlapping']} sample(s) found another request in "
                                                  "the engine, so these figures measured a shared engine")
    return check_row("other_clients", "PASS", f"{said}: no other client's request seen")


def other_clients_check(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    counters = st.engine_counters(records)
    if counters is None:
        return _slots_check(records) or check_row(
            "other_clients", "SKIP", "the engine's counters were not read before and after the run (no /metrics), "
                                     "and its slots were not sampled")
    delta = counters["delta"]
    reqs = st.payloads(records)
    failed = [r for r in reqs if not st.is_ok(r)]
    gen, prompt = delta.get("generated_tokens_total"), delta.get("prompt_tokens_total")
    ours_gen, ours_prompt = counters["client_completion_tokens"], counters["client_prompt_tokens"]
    if gen is None and prompt is None:
        return check_row("other_clients", "SKIP", "the engine's counters have no generated or prompt token totals")
    slack = OTHER_CLIENT_SLACK_TOKENS + 0.01 * max(ours_gen, 1)
    extra_gen = (gen - ours_gen) if gen is not None else 0.0
    extra_prompt = (prompt - ours_prompt) if prompt is not None else 0.0
    said = (f"the engine generated {gen:,.0f} tokens during the run, the requests' usage {ours_gen:,}"
            if gen is not None else "") + (
            f"; it evaluated {prompt:,.0f} prompt tokens, the requests sent {ours_prompt:,}" if prompt is not None
            else "")
    if extra_gen > slack or extra_prompt > OTHER_CLIENT_SLACK_TOKENS + 0.01 * max(ours_prompt, 1):
        if failed:
            return check_row("other_clients", "SKIP", f"{said}; {len(failed)} request(s) failed, and the engine may "
                                                   "have counted tokens their streams never reported, so another "
                                                   "client cannot be told apart")
        return check_row("other_clients", "FAIL", f"{said}: another client used the server during the run, so these "
                                               "figures measured a shared engine")
    return check_row("other_clients", "PASS", f"{said}: no other client's work in the engine's counters")


def outliers_check(kept_groups: Mapping[str, Sequence[Mapping[str, Any]]], kind: str, ratio: float) -> dict[str, str]:
    if kind not in SEQUENTIAL_KINDS:
        why = {"spec": "speculative decoding sends accepted drafts in bursts by design",
               "agentic": "a tool-call chunk carries several tokens, so its gap is not one token's"}.get(
            kind, "concurrent streams share the engine with each other's prefill by design; TTFT and TPOT "
                  "percentiles describe them")
        return check_row("inter_token_outliers", "SKIP", why)
    bad: list[str] = []
    good: list[str] = []
    for name, recs in kept_groups.items():
        gaps = sorted(g / 1000.0 for r in recs if st.is_usable(r) for g in (gaps_us(r) or []))
        if len(gaps) < 20:
            continue
        p50, p99 = st.percentile(gaps, 50), st.percentile(gaps, 99)
        if not p50 or p99 is None:
            continue
        text = f"{name} p99 {p99:,.1f} ms = {p99 / p50:.1f}x p50 {p50:,.1f} ms"
        (bad if p99 > ratio * p50 else good).append(text)
    if bad:
        return check_row("inter_token_outliers", "FAIL", f"inter-token p99 over {ratio:g}x p50 (the engine paused "
                                                      "mid-stream): " + ", ".join(bad))
    if good:
        return check_row("inter_token_outliers", "PASS", f"inter-token p99 within {ratio:g}x p50: " + ", ".join(good))
    return check_row("inter_token_outliers", "SKIP", "fewer than 20 token gaps per group to judge")


def stopped_check(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    aborts = records_of(records, ABORT_KIND)
    if aborts:
        return check_row("engine_stopped", "FAIL", str(aborts[-1].get("reason") or "bench stopped sending"))
    return check_row("engine_stopped", "PASS", "no stall, no run of failed requests")


def extra_checks(records: Sequence[Mapping[str, Any]], kept_groups: Mapping[str, Sequence[Mapping[str, Any]]],
                 kind: str, conditions: Mapping[str, Any]) -> list[dict[str, str]]:
    bench = conditions.get("bench") if isinstance(conditions.get("bench"), Mapping) else {}
    assert isinstance(bench, Mapping)
    ratio = float(bench.get("itl_p99_ratio") or ITL_P99_RATIO)
    return [contention_check(records), other_clients_check(records), outliers_check(kept_groups, kind, ratio),
            stopped_check(records)]


def failed_requests(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The errors behind failed requests: one row per distinct error, with its count and where it
    first happened (workload or group, warm-up or measured, index)."""
    rows: dict[str, dict[str, Any]] = {}
    for r in st.payloads(records):
        if st.is_ok(r):
            continue
        error = str(r.get("error") or f"HTTP {r.get('status')}")
        row = rows.setdefault(error, {"error": error, "count": 0, "first": None})
        row["count"] += 1
        if row["first"] is None:
            row["first"] = f"{r.get('workload')} {'warm-up' if r.get('warmup') else 'measured'} " \
                           f"{int(r.get('index') or 0) + 1}"
    return sorted(rows.values(), key=lambda x: -int(x["count"]))


def failed_checks(summary: Mapping[str, Any]) -> list[str]:
    """An INVALID bench's failed integrity checks, each "name: detail" (its warnings when none failed)."""
    failed = [f"{c.get('name')}: {c.get('detail')}" for c in summary.get("integrity") or []
              if c.get("status") == "FAIL"]
    return failed or [str(w) for w in summary.get("warnings") or []]


def summarize_bench(records: Sequence[Mapping[str, Any]], conditions: Mapping[str, Any]) -> dict[str, Any]:
    """The quick / long suites' summary (``statistics.summarize``) with their integrity checklist:
    ``integrity``, ``valid``, ``failed_requests``; an OK run that fails a check is INVALID."""
    records = list(records)
    summary = st.summarize(records)
    bench = conditions.get("bench") if isinstance(conditions.get("bench"), Mapping) else {}
    assert isinstance(bench, Mapping)
    cond = {**conditions, "bench": {"agreement_tolerance_pct": st.AGREEMENT_TOLERANCE_PCT, **bench}}
    reqs = st.payloads(records)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in reqs:
        groups.setdefault(str(r.get("workload")), []).append(r)
    keeps = {name: kept(rs) for name, rs in groups.items()}
    figures = {name: {"cv_pct": s["decode_tps"].get("cv_pct")} for name, s in summary["workloads"].items()}
    loads = records_of(records, CLIENT_LOAD_KIND)
    checks = checklist(groups, keeps, figures, client_load(loads[-1] if loads else None), cond, "standard")
    if not bench.get("full_length"):
        checks = [check_row("full_length", "SKIP", "--natural-stop: requests stop where the model stops; those under "
                                                f"{st.USABLE_FRACTION:.0%} of max_tokens are left out of the figures")
                  if c["name"] == "full_length" else c for c in checks]
    checks += extra_checks(records, keeps, "quick", conditions)
    valid = is_valid(checks)
    status = summary["status"]
    if status == st.STATUS_OK and not valid:
        status = STATUS_INVALID
    warnings = list(summary["warnings"]) + [f"{c['name']}: {c['detail']}" for c in checks if c["status"] == "FAIL"]
    return {**summary, "status": status, "integrity": checks, "valid": valid, "warnings": warnings,
            "failed_requests": failed_requests(records)}
