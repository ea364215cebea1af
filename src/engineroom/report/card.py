"""The run card: one markdown page per run, recomputed from the run's raw records.

The card never talks to an engine and never trusts a stored summary: bench figures are
recomputed with ``engineroom.records.statistics`` from the ``bench_request`` records, and
verify counts from the ``check`` records. The whole text goes through ``redact`` last.

Conditions keys it reads (all optional; missing ones are left out), exactly as
``flows.run_conditions`` and ``bench.bench_conditions`` write them, no aliases:
``engine``, ``engine_version``, ``model`` (the reference as given), ``model_path``,
``model_size_bytes``, ``model_sha256``, ``model_id``, ``argv`` (list or string),
``launch_changes``, ``cpu_probe``, ``host`` (``hardware.host_summary``: ``os``, ``arch``,
``cpu``, ``cpu_cores``, ``ram_bytes``, ``gpus`` as ``{name, vram_bytes}``), ``bench``.

Check record payload keys (``checks.CheckResult``): ``name``, ``status`` (PASS / FAIL /
SKIP), ``reason``, ``seconds``. Bench records are read only through ``records.statistics``,
which reads only the engine-neutral fields of ``records.request``.

The sections on the machine (engine counters, memory predicted vs measured, resources during
the run) are in ``report.machine``; the cell formatting in ``report.cells``.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engineroom.bench.guards import summarize_bench
from engineroom.bench.suites.summary import is_suite_run as _is_suite_run
from engineroom.bench.watchdog import ABORT_KIND
from engineroom.records import statistics
from engineroom.redaction import redact
from engineroom.report.cells import figure_cell, integrity_lines, size_cell, text_cell
from engineroom.report.machine import counters_section, memory_section, resources_section

CHECK_RECORD_KIND = "check"


# -- header -------------------------------------------------------------------------


def _host_summary(host: Any) -> str:
    if not isinstance(host, Mapping) or not host:
        return ""
    parts: list[str] = []
    for key in ("os", "arch"):
        if host.get(key):
            parts.append(str(host[key]))
    cpu, cores = host.get("cpu"), host.get("cpu_cores")
    if cpu or cores:
        parts.append(f"{cpu or 'CPU'}" + (f" ({cores} cores)" if cores else ""))
    ram = size_cell(host.get("ram_bytes"))
    if ram:
        parts.append(f"{ram} RAM")
    gpus = host.get("gpus")
    if isinstance(gpus, (list, tuple)):
        if not gpus:
            parts.append("no GPU")
        else:
            names = []
            for g in gpus:
                if isinstance(g, Mapping):
                    mem = size_cell(g.get("vram_bytes"))
                    names.append(f"{g.get('name', 'GPU')}" + (f" {mem}" if mem else ""))
            counts: dict[str, int] = {}
            for n in names:
                counts[n] = counts.get(n, 0) + 1
            parts.append(", ".join(f"{c}x {n}" if c > 1 else n for n, c in counts.items()))
    return ", ".join(parts)


def _argv_text(argv: Any) -> str:
    if not argv:
        return ""
    if isinstance(argv, str):
        return argv
    return shlex.join(str(a) for a in argv)


def _header(run: Mapping[str, Any], cond: Mapping[str, Any]) -> list[str]:
    status = run.get("status") or "unknown"
    finished = run.get("finished")
    if run.get("end_reason"):
        state = f"{status} ({run['end_reason']})"       # e.g. INTERRUPTED (process gone)
    elif finished:
        state = status
    elif status == "running":
        state = "running (unfinished: still running, or its process cannot be checked from here)"
    else:
        state = f"{status} (unfinished)"
    lines = [f"# engineroom {run.get('kind', 'run')} #{run.get('id', '?')}: {state}", ""]
    if run.get("label"):
        lines += [f"_{run['label']}_", ""]
    rows: list[tuple[str, str]] = []
    engine = " ".join(str(x) for x in (cond.get("engine"), cond.get("engine_version")) if x)
    if engine:
        rows.append(("Engine", engine))
    model_path = cond.get("model_path")
    model_name = os.path.basename(str(model_path).rstrip("/")) if model_path else cond.get("model")
    model_bits = []
    size = size_cell(cond.get("model_size_bytes"))
    if size:
        model_bits.append(size)
    if cond.get("model_sha256"):
        model_bits.append(f"sha256 {str(cond['model_sha256'])[:12]}")
    if cond.get("model_sha256_catalog"):   # the served file was changed after it was pulled
        model_bits.append(f"NOT the catalog's {str(cond['model_sha256_catalog'])[:12]}")
    if model_name or model_bits:
        rows.append(("Model", f"{model_name or '?'}" + (f" ({', '.join(model_bits)})" if model_bits else "")))
    if cond.get("model") and model_path and cond.get("model") != model_name:
        rows.append(("Model ref", str(cond["model"])))
    if cond.get("model_id"):
        rows.append(("Served as", str(cond["model_id"])))
    argv = _argv_text(cond.get("argv"))
    if argv:
        rows.append(("Command", f"`{argv}`"))
    for change in cond.get("launch_changes") or ():
        if isinstance(change, Mapping):
            added = " ".join(str(a) for a in change.get("args") or ())
            rows.append(("Changed by engineroom",
                         f"added `{added}` ({change.get('source', '?')}): {change.get('why', '')}"))
    probe = cond.get("cpu_probe")
    if isinstance(probe, Mapping) and isinstance(probe.get("results"), Mapping):
        forced = set(probe.get("forced") or ())
        rows.append(("CPU probe", ", ".join(f"{k} {v}" + (" (forced)" if k in forced else "")
                                            for k, v in probe["results"].items())))
    host = _host_summary(cond.get("host"))
    if host:
        rows.append(("Host", host))
    when = f"{run.get('created', '?')} → {finished or 'not finished'}"
    rows.append(("When", when))
    if run.get("fingerprint"):
        rows.append(("Conditions", f"fingerprint {str(run['fingerprint'])[:12]}"))
    lines += ["| | |", "|---|---|"] + [f"| {k} | {text_cell(v)} |" for k, v in rows] + [""]
    return lines


# -- verify -------------------------------------------------------------------------


def _check_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for rec in records:
        if rec.get("kind") != CHECK_RECORD_KIND:
            continue
        p = rec.get("payload") or {}
        rows.append({
            "name": p.get("name") or "?",
            "status": str(p.get("status") or "?").upper(),
            "reason": p.get("reason") or "",
            "seconds": p.get("seconds"),
            # verify --suite full/stress: pass k/K of --repeat, and a format a chat template forced
            "passes": (p.get("details") or {}).get("passes"),
            "ran": (p.get("details") or {}).get("ran"),
            "repeat": (p.get("details") or {}).get("repeat"),
            "forced": (p.get("details") or {}).get("forced"),
        })
    return rows


def _verify_section(rows: list[dict[str, Any]]) -> list[str]:
    passed = sum(1 for r in rows if r["status"] == "PASS")
    failed = sum(1 for r in rows if r["status"] == "FAIL")
    skipped = sum(1 for r in rows if r["status"] == "SKIP")
    other = len(rows) - passed - failed - skipped
    ran = passed + failed + other
    extra = [f"{failed} failed"] if failed else []
    if skipped:
        extra.append(f"{skipped} skipped")
    if other:
        extra.append(f"{other} with another status")
    lines = ["## Verify", "", f"**verify {passed}/{ran}** passed" + (f" ({', '.join(extra)})" if extra else ""), ""]
    repeated = any(isinstance(r.get("repeat"), int) and r["repeat"] > 1 for r in rows)
    if repeated:
        lines += ["| check | result | passed | seconds | reason |", "|---|---|---:|---:|---|"]
    else:
        lines += ["| check | result | seconds | reason |", "|---|---|---:|---|"]
    for r in rows:
        secs = r["seconds"]
        secs_txt = f"{secs:.2f}" if isinstance(secs, (int, float)) else "n/a"
        flaky = f" {r['passes']}/{r['ran']} |" if repeated and r.get("ran") else (" n/a |" if repeated else "")
        lines.append(f"| {text_cell(r['name'])} | {r['status']} |{flaky} {secs_txt} | {text_cell(r['reason'])} |")
    lines.append("")
    forced = sorted({r["forced"] for r in rows if r.get("forced")})
    for why in forced:
        names = ", ".join(r["name"] for r in rows if r.get("forced") == why)
        lines += [f"**Format forced, not the model's skill**: {why} (PASSes of {names}).", ""]
    return lines


def _baseline_section(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """``verify --baseline RUN``: the checks that regressed (or improved) since that run."""
    found = [r.get("payload") or {} for r in records if r.get("kind") == "check_baseline"]
    if not found:
        return []
    b = found[-1]
    regressed, improved = b.get("regressed") or [], b.get("improved") or []
    lines = [f"## Since run {b.get('baseline_run')}", "",
             f"{len(regressed)} regressed, {len(improved)} improved, "
             f"{len(b.get('newly_skipped') or [])} newly skipped.", ""]
    for r in regressed:
        lines.append(f"- regressed: {text_cell(r.get('name'))}: {r.get('was')} -> {r.get('now')} "
                     f"({text_cell(r.get('reason'))})")
    for r in improved:
        lines.append(f"- improved: {text_cell(r.get('name'))}: {r.get('was')} -> {r.get('now')}")
    for r in b.get("newly_skipped") or []:
        lines.append(f"- newly skipped: {text_cell(r.get('name'))} ({text_cell(r.get('reason'))})")
    return lines + ([""] if regressed or improved or b.get("newly_skipped") else [])


# -- bench --------------------------------------------------------------------------


def _mean_std(d: Mapping[str, Any], digits: int = 2) -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    text = figure_cell(d["mean"], digits)
    if d.get("std") is not None:
        text += f" ± {figure_cell(d['std'], digits)}"
        if d.get("cv_pct") is not None:
            text += f" ({d['cv_pct']:.1f}%)"
    return text


def _min_max(d: Mapping[str, Any], digits: int = 2) -> str:
    if not d or d.get("min") is None:
        return "n/a"
    return f"{figure_cell(d['min'], digits)}–{figure_cell(d['max'], digits)}"


def _planned(bench_cond: Mapping[str, Any]) -> tuple[list[str], int | None, int | None]:
    """(workload names, warm-ups, measured per workload) the run set out to do, from its conditions."""
    names = []
    for w in bench_cond.get("workloads") or []:
        name = w.get("name") if isinstance(w, Mapping) else w
        if name:
            names.append(str(name))
    warmup, measured = bench_cond.get("warmup"), bench_cond.get("measured")
    return (names, warmup if isinstance(warmup, int) else None,
            measured if isinstance(measured, int) else None)


def _what_ran(payloads: Sequence[Mapping[str, Any]], bench_cond: Mapping[str, Any]) -> dict[str, Any]:
    """Requests that finished per workload against what the run planned.

    ``complete`` is True when every planned workload got all its warm-ups and measured
    requests (or, for a run without a recorded plan, always)."""
    names, warmup, measured = _planned(bench_cond)
    ran: dict[str, list[int]] = {n: [0, 0] for n in names}
    for p in payloads:
        ran.setdefault(str(p.get("workload")), [0, 0])[0 if p.get("warmup") else 1] += 1
    if names and warmup is not None and measured is not None:
        known, planned_total = True, len(names) * (warmup + measured)
        complete = all(ran[n][0] >= warmup and ran[n][1] >= measured for n in names)
    else:
        known, planned_total, complete = False, None, True
    return {"ran": ran, "names": names, "warmup": warmup, "measured": measured, "known": known,
            "planned_total": planned_total, "done": len(payloads), "complete": complete}


def _ran_text(what: Mapping[str, Any]) -> str:
    parts = []
    for name, (w, m) in what["ran"].items():
        parts.append(f"{name} {w} warm-up + {m} measured" if w or m else f"{name} did not run")
    return ", ".join(parts)


def _itl(d: Mapping[str, Any]) -> str:
    """Inter-token p50 / p99 in ms, or n/a (records stored before arrival times were kept)."""
    if not d or d.get("p50") is None:
        return "n/a"
    return f"{d['p50']:.1f} / {d['p99']:.1f}"


def _body_text(body: Mapping[str, Any]) -> str:
    """Request fields as a reader scans them: ``name: on`` for a flag, ``name = value`` otherwise."""
    return ", ".join(f"{k}: on" if v is True else f"{k} = {json.dumps(v)}" for k, v in body.items())


def _bench_section(records: Sequence[Mapping[str, Any]], cond: Mapping[str, Any],
                   run: Mapping[str, Any] | None = None, summary: Mapping[str, Any] | None = None) -> list[str]:
    summary = summary if summary is not None else summarize_bench(records, cond)
    found = cond.get("bench")
    bench_cond: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    run = run or {}
    what = _what_ran(statistics.payloads(records), bench_cond)
    status_line = f"Status: **{summary['status']}**" + (
        "" if summary.get("valid", True) else " (a check of the integrity checklist failed; the result is kept and "
                                              "marked)")
    if not what["complete"]:
        # the requests that did run may all be fine, but the bench is not: say what ran
        run_status = str(run.get("status") or "")
        stopped = run_status if run_status in ("INTERRUPTED", "ERROR", "running") else "INCOMPLETE"
        if run.get("end_reason"):
            stopped += f" ({run['end_reason']})"
        aborts = [r.get("payload") or {} for r in records if r.get("kind") == ABORT_KIND]
        if aborts:
            stopped = f"STOPPED ({aborts[-1].get('reason') or 'bench stopped sending'})"
        status_line = (f"Status: **{stopped}**: {what['done']} of {what['planned_total']} planned requests ran "
                       f"({_ran_text(what)}); the figures below cover only those "
                       f"(those requests: {summary['status']}).")
    lines = ["## Bench", "", status_line, ""]
    lines += [
        "| workload | usable / measured | decode tok/s mean ± std (CV%) | decode min–max | "
        "TTFT s mean ± std | wall tok/s mean ± std | inter-token ms p50 / p99 | tokens mean | max_tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    planned_measured = what["measured"]
    for name, s in summary["workloads"].items():
        tokens = s["completion_tokens"].get("mean")
        counted = f"{s['n_usable']} / {s['n']}"
        if planned_measured is not None and s["n"] < planned_measured:
            counted += f" of {planned_measured} planned"
        lines.append(
            f"| {text_cell(name)} | {counted} | {_mean_std(s['decode_tps'])} | "
            f"{_min_max(s['decode_tps'])} | {_mean_std(s['ttft_s'], 3)} | {_mean_std(s['wall_tps'])} | "
            f"{_itl(s['inter_token_ms'])} | {figure_cell(tokens, 1)} | {figure_cell(s['max_tokens'])} |"
        )
    max_by_name = {str(w.get("name")): w.get("max_tokens") for w in bench_cond.get("workloads") or []
                   if isinstance(w, Mapping)}
    for name in what["names"]:
        if name not in summary["workloads"]:
            lines.append(f"| {text_cell(name)} | not run | n/a | n/a | n/a | n/a | n/a | n/a "
                         f"| {figure_cell(max_by_name.get(name))} |")
    lines.append("")
    lines += integrity_lines(summary.get("integrity") or [], summary.get("failed_requests") or [])
    lines.append("Client vs engine decode, same requests (client inter-token rate = "
                 "(tokens − 1) / (last token − first token), against the engine's rate over its own decode steps):")
    lines.append("")
    for name, s in summary["workloads"].items():
        a = s["agreement"]
        if not a["n"]:
            lines.append(f"- {name}: not cross-checked: {a['not_checked']}.")
        elif a["warning"]:
            lines.append(f"- ⚠ {name}: WARNING: {a['warning']}.")
        else:
            lines.append(
                f"- {name}: client inter-token {a['client_inter_token_tps']:.2f} tok/s "
                f"vs engine {a['engine_decode_tps']:.2f} tok/s "
                f"(median per-request {a['diff_pct']:+.1f}%, within {a['tolerance_pct']:g}%; n={a['n']})."
            )
    lines.append("")
    notes: list[str] = []
    body = bench_cond.get("full_length_body")
    reason = bench_cond.get("full_length_reason") or ""
    if isinstance(body, Mapping) and body:
        notes.append(f"Full length: {_body_text(body)} sent with every request, so each generates exactly "
                     f"max_tokens" + (f" ({reason})." if reason else "."))
    elif bench_cond.get("full_length"):
        notes.append(f"Full length: off ({reason or 'the engine declares no way to ask for it'}).")
    itl_na = {s["inter_token_ms"]["not_available"] for s in summary["workloads"].values()
              if s["n_usable"] and s["inter_token_ms"]["not_available"]}
    for why in sorted(itl_na):
        notes.append(f"Inter-token ms n/a: {why}.")
    sampler = bench_cond.get("sampler")
    if isinstance(sampler, Mapping) and sampler:
        notes.append("Sampler sent on every request: " + ", ".join(f"{k} {v}" for k, v in sampler.items()) + ".")
    if "warmup" in bench_cond and "measured" in bench_cond:
        if what["complete"]:
            notes.append(
                f"{bench_cond['warmup']} warm-up + {bench_cond['measured']} measured requests per workload; "
                "warm-ups are stored but excluded from the figures."
            )
        else:
            notes.append(
                f"Planned {bench_cond['warmup']} warm-up + {bench_cond['measured']} measured requests per "
                f"workload; ran {_ran_text(what)}. Warm-ups are stored but excluded from the figures."
            )
    notes.append(
        f"Decode and wall figures use usable requests only (≥ {statistics.USABLE_FRACTION:.0%} of max_tokens); "
        f"decode is n/a when the decode window is under {statistics.MIN_DECODE_WINDOW_FRACTION:.0%} of the wall time; "
        "inter-token ms pools the gaps between consecutive token chunks of those requests."
    )
    shown = {f"{name}: {s['agreement']['warning']}" for name, s in summary["workloads"].items()}
    for w in summary["warnings"]:
        if w not in shown:  # agreement warnings are already on their workload's line
            notes.append(f"⚠ {w}.")
    lines += [f"- {n}" for n in notes] + [""]
    return lines


def _provenance(n_bench: int, n_checks: int, run_id: Any, engine_sources: Iterable[str] = ()) -> str:
    parts = []
    if n_bench:
        sources = "; ".join(dict.fromkeys(engine_sources))
        parts.append(
            "TTFT, wall time, decode tok/s (tokens / (wall − TTFT)), wall tok/s and inter-token ms come from the "
            "client clock (time.perf_counter in engineroom; each content or reasoning chunk's arrival is stored), "
            "with token counts from the server's usage.completion_tokens; engine tok/s is the engine's own timing, "
            "as its adapter reads it" + (f" ({sources})" if sources else "") + ", shown only to cross-check"
        )
    if n_checks:
        parts.append("check seconds come from the client clock")
    body = "; ".join(parts) if parts else "no measurements were recorded"
    return (
        f"_Provenance: {body}. Every figure is recomputed from the {n_bench + n_checks} raw records "
        f"stored with run #{run_id}._"
    )



def render_card(run: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    """A markdown card for ``run`` (a ``Store.get_run`` dict) from its ``Store.records``."""
    cond = run.get("conditions") or {}
    if not isinstance(cond, Mapping):
        cond = {}
    checks = _check_rows(records)
    bench_payloads = statistics.payloads(records)
    lines = _header(run, cond)
    if checks:
        lines += _verify_section(checks)
        lines += _baseline_section(records)
        from engineroom.report.verifycard import soak_section, toolstream_section

        lines += soak_section(records) + toolstream_section(records)
    summary = summarize_bench(records, cond)
    if bench_payloads and _is_suite_run(cond):     # bench standard / depth / concurrency / spec
        from engineroom.report.suites import suite_section

        lines += suite_section(records, cond, run)
        lines += counters_section(statistics.engine_counters(records))
    elif bench_payloads:
        lines += _bench_section(records, cond, run, summary)
        lines += counters_section(statistics.engine_counters(records))
    elif isinstance(cond.get("bench"), Mapping) and cond["bench"].get("workloads") and run.get("kind") != "verify":
        status = run.get("status") or "unknown"
        if status == "running" and not run.get("finished"):
            said = "No bench request has finished yet."
        else:
            said = (f"Not run: the run ended ({status}" + (f", {run['end_reason']}" if run.get("end_reason") else "")
                    + ") before any bench request finished.")
        lines += ["## Bench", "", said, ""]
    tune = cond.get("tune")
    if isinstance(tune, Mapping):               # `engineroom tune`: its trials (each boot is a bench run of its own)
        from engineroom.report.tuning import tune_section

        lines += tune_section(tune, run.get("summary"), run.get("id"))
    lines += memory_section(cond.get("memory"))
    lines += resources_section(records)
    if not checks and not bench_payloads and not isinstance(tune, Mapping):
        lines += ["No checks or bench requests were recorded for this run.", ""]
    sources = [s["engine_source"] for s in summary["workloads"].values() if s["engine_source"]]
    lines.append(_provenance(len(bench_payloads), len(checks), run.get("id", "?"), sources))
    lines.append("")
    text = "\n".join(lines)
    model_path = cond.get("model_path")
    paths: dict[str, str] = {}
    if model_path:
        model_dir = os.path.dirname(str(model_path).rstrip("/"))
        if model_dir and model_dir not in ("/", "."):
            paths[model_dir] = "<model-dir>"
    return redact(text, paths=paths)
