"""The integrity checklist every suite result carries: PASS / FAIL / SKIP with the reason.

A result that fails a check is still stored, and marked (its summary status is ``INVALID``,
the card says which check failed and why). The checks, each recomputed from raw records:

- ``requests``: no request failed and none answered 200 with nothing in it (silent-empty);
- ``client_vs_engine``: client inter-token rate vs the engine's own decode rate, median over
  the same requests, within ``agreement_tolerance_pct`` (1% by default) per group;
- ``cv``: the decode rate's coefficient of variation per group under ``cv_threshold_pct``
  (concurrency: the rounds' aggregate rate);
- ``full_length``: every kept measured request reached >= 25% of its max_tokens;
- ``prefix_cache``: no kept sample reused more of its prompt from the prefix cache than the
  template preamble (the depth and concurrency prompts are salted to be uncacheable; standard
  and spec repeat their prompts by design, so there it is SKIP);
- ``client_not_bottleneck``: the client's CPU share of one core under ``CLIENT_CPU_LIMIT`` and
  its wake-up lag p99 under ``CLIENT_LAG_LIMIT_MS``, the lag p99 of the event loop that reads the
  streams (concurrency, sweep, rate: ``suites.streams``) under ``CLIENT_LOOP_LAG_LIMIT_MS``, and its
  threads' mean run-queue wait per run under ``CLIENT_RUNQ_LIMIT_MS`` (``clientside.ClientMonitor``);
- ``no_cpu_fallback``: the engine placed the launch as its plan did (``placement.check_record`` on the
  check stored with the launch: no layer, weights or KV on the host that the plan put on a GPU; a
  smaller context or fewer slots only when accepted); no GPU and no check stored: PASS;
- ``thinking_budget``: no request spent all of max_tokens thinking with no content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engineroom.bench.stats import (
    CLIENT_CPU_LIMIT,
    CLIENT_LAG_LIMIT_MS,
    CLIENT_LOOP_LAG_LIMIT_MS,
    CLIENT_RUNQ_LIMIT_MS,
    cache_reuse,
    is_silent,
    reasoning,
)
from engineroom.placement import check_record as placement_verdict
from engineroom.records import statistics as st

__all__ = ["check_row", "checklist", "is_valid"]


def check_row(name: str, status: str, detail: str) -> dict[str, str]:
    """One checklist row: a check's name, PASS / FAIL / SKIP, and why (every bench check writes this shape)."""
    return {"name": name, "status": status, "detail": detail}


def checklist(groups: Mapping[str, Sequence[Mapping[str, Any]]], kept: Mapping[str, Sequence[Mapping[str, Any]]],
              figures: Mapping[str, Mapping[str, Any]], load: Mapping[str, Any], conditions: Mapping[str, Any],
              kind: str) -> list[dict[str, str]]:
    """The checks for one result: ``groups`` all records per group, ``kept`` the measured
    requests the figures use, ``figures`` each group's figures, ``load`` the client's load."""
    bench = conditions.get("bench") if isinstance(conditions.get("bench"), Mapping) else {}
    assert isinstance(bench, Mapping)
    tol = float(bench.get("agreement_tolerance_pct") or 1.0)
    cv_limit = float(bench.get("cv_threshold_pct") or 10.0)
    every = [r for rs in groups.values() for r in rs]
    out: list[dict[str, str]] = []

    failed = [r for r in every if not st.is_ok(r)]
    silent = [r for r in every if is_silent(r)]
    if failed or silent:
        first = f"; first error: {failed[0].get('error')}" if failed else ""
        claimed = sum(int(r.get("completion_tokens") or 0) for r in silent)
        said = f" (the engine counted {claimed:,} tokens for them; their streams carried no text)" if claimed else ""
        out.append(check_row("requests", "FAIL",
                          f"{len(failed)} failed, {len(silent)} silent-empty of {len(every)} requests{said}{first}"))
    else:
        out.append(check_row("requests", "PASS", f"{len(every)} requests, none failed or empty"))

    bad, checked, skipped = [], [], []
    for name, recs in kept.items():
        a = st.agreement([r for r in recs if st.is_usable(r)], tolerance_pct=tol)
        if not a["n"]:
            skipped.append(f"{name}: {a['not_checked']}")
        elif abs(a["diff_pct"]) > tol:
            bad.append(f"{name} {a['diff_pct']:+.2f}%")
        else:
            checked.append(f"{name} {a['diff_pct']:+.2f}%")
    if bad:
        out.append(check_row("client_vs_engine", "FAIL", f"beyond {tol:g}%: " + ", ".join(bad)
                          + (f" (within: {', '.join(checked)})" if checked else "")))
    elif checked:
        out.append(check_row("client_vs_engine", "PASS",
                             f"within {tol:g}% (median per request): " + ", ".join(checked)))
    else:
        out.append(check_row("client_vs_engine", "SKIP", "; ".join(skipped) or "no request to compare"))

    high, ok_cv, few = [], [], []
    for name, f in figures.items():
        cv = f.get("cv_pct")
        if cv is None:
            few.append(name)
        elif cv > cv_limit:
            high.append(f"{name} {cv:.1f}%")
        else:
            ok_cv.append(f"{name} {cv:.1f}%")
    if high:
        out.append(check_row("cv", "FAIL", f"decode CV over {cv_limit:g}%: " + ", ".join(high)))
    elif ok_cv:
        out.append(check_row("cv", "PASS", f"decode CV under {cv_limit:g}%: " + ", ".join(ok_cv)))
    else:
        out.append(check_row("cv", "SKIP", "fewer than 2 measured values per group: " + ", ".join(few)))

    measured = [r for rs in kept.values() for r in rs if st.is_ok(r)]
    short = [r for r in measured if not st.is_usable(r)]
    if not measured:
        out.append(check_row("full_length", "SKIP", "no measured request succeeded"))
    elif short:
        out.append(check_row("full_length", "FAIL", f"{len(short)} of {len(measured)} measured requests stopped before "
                                                 f"{st.USABLE_FRACTION:.0%} of max_tokens"))
    else:
        out.append(check_row("full_length", "PASS",
                             f"all {len(measured)} reached {st.USABLE_FRACTION:.0%} of max_tokens"))

    if kind in ("depth", "concurrency"):
        dirty = [r for r in measured if cache_reuse(r).contaminated]
        guarded = sum(1 for r in every if r.get("discarded"))
        unknown = [r for r in measured if cache_reuse(r).cached is None]
        if dirty:
            out.append(check_row("prefix_cache", "FAIL", f"{len(dirty)} kept sample(s) reused the prefix cache: "
                                                      f"{cache_reuse(dirty[0]).describe()}"))
        elif unknown and len(unknown) == len(measured):
            out.append(check_row("prefix_cache", "SKIP", "the engine reports no cached-token count"))
        else:
            out.append(check_row("prefix_cache", "PASS", "no kept sample reused more than the template preamble"
                                                      + (f"; {guarded} contaminated sample(s) discarded and re-run"
                                                         if guarded else "")))
    else:
        out.append(check_row("prefix_cache", "SKIP", "this suite repeats its prompts by design; it claims no "
                                                  "prefill figure"))

    if not load.get("recorded"):
        out.append(check_row("client_not_bottleneck", "SKIP", "the client's load was not recorded"))
    else:
        cpu, lag = load.get("cpu_fraction"), load.get("lag_ms_p99")
        runq, loop = load.get("runq_wait_ms_per_run"), load.get("loop_lag_ms_p99")
        text = (f"client CPU {cpu:.0%} of one core, wake-up lag p99 {lag:.1f} ms"
                + (f", event-loop lag p99 {loop:.1f} ms" if loop is not None else "")
                + (f", run-queue wait {runq:.2f} ms per run" if runq is not None else "")
                + f" (limits {CLIENT_CPU_LIMIT:.0%}, {CLIENT_LAG_LIMIT_MS:g} ms"
                + (f", {CLIENT_LOOP_LAG_LIMIT_MS:g} ms" if loop is not None else "")
                + (f", {CLIENT_RUNQ_LIMIT_MS:g} ms" if runq is not None else "") + ")") if (
            cpu is not None and lag is not None) else "client load incomplete"
        saturated = ((cpu is not None and cpu >= CLIENT_CPU_LIMIT) or (lag is not None and lag >= CLIENT_LAG_LIMIT_MS)
                     or (loop is not None and loop >= CLIENT_LOOP_LAG_LIMIT_MS)
                     or (runq is not None and runq >= CLIENT_RUNQ_LIMIT_MS))
        out.append(check_row("client_not_bottleneck", "FAIL" if saturated else "PASS", text))

    host = conditions.get("host") if isinstance(conditions.get("host"), Mapping) else {}
    gpus = host.get("gpus") if isinstance(host, Mapping) else None
    memory = conditions.get("memory") if isinstance(conditions.get("memory"), Mapping) else {}
    placed = memory.get("placement") if isinstance(memory, Mapping) else None
    if isinstance(placed, Mapping) and placed.get("status") not in (None, "unknown"):
        # the launch's placement against its plan (flows.serving.placement_check), stored with the launch
        out.append(check_row("no_cpu_fallback", *placement_verdict(placed)))
    elif isinstance(gpus, (list, tuple)) and not gpus:
        out.append(check_row("no_cpu_fallback", "PASS", "no GPU on this host: the CPU is what was meant to run"))
    else:
        why = (str(placed.get("detail")) if isinstance(placed, Mapping) and placed.get("detail") else
               "no placement check was stored with the launch (a server engineroom did not start?)")
        out.append(check_row("no_cpu_fallback", "SKIP", why))

    exhausted = [r for r in every if not r.get("warmup") and reasoning(r)["thinking_exhausted"]]
    if exhausted:
        out.append(check_row("thinking_budget", "FAIL", f"{len(exhausted)} request(s) spent all of max_tokens thinking "
                                                     "with no content (left out of the figures)"))
    else:
        out.append(check_row("thinking_budget", "PASS", "no request ran out of budget while thinking"))
    return out


def is_valid(checks: Sequence[Mapping[str, str]]) -> bool:
    return not any(c.get("status") == "FAIL" for c in checks)
