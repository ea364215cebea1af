"""The run card: one markdown page per run, recomputed from the run's raw records.

The card never talks to an engine and never trusts a stored summary: bench figures are
recomputed with ``engineroom.bench.statistics`` from the ``bench_request`` records, and
verify counts from the ``check`` records. The whole text goes through ``redact`` last.

Conditions keys it reads (all optional; missing ones are left out):
``engine``, ``engine_version``, ``model`` (the reference as given), ``model_path``,
``model_size_bytes`` (or ``model_size``), ``model_sha256``, ``model_id``, ``argv``
(list or string), ``host`` (dict: ``os``, ``kernel``, ``arch``, ``cpu``, ``cpu_cores``
/ ``cores``, ``cpu_ram_bytes`` / ``ram_bytes`` / ``ram_gb``, ``gpus`` (names or
dicts with ``name`` / ``vram_bytes``), ``driver`` — or a ready string), ``bench``
(from ``bench.bench_conditions``).

Check record payload keys: ``name`` (or ``check``), ``status`` (PASS / FAIL / SKIP;
or ``outcome``), ``reason`` (or ``detail`` / ``message``), ``seconds`` (or
``elapsed_s`` / ``duration_s``).
"""

from __future__ import annotations

import os
import shlex
from typing import Any, Iterable, Mapping

from engineroom import units
from engineroom.bench import statistics
from engineroom.report.redaction import redact

CHECK_RECORD_KIND = "check"


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _bytes(n: Any) -> str:
    """Sizes in binary units (units.py); empty when unknown, so the caller leaves it out."""
    if not isinstance(n, (int, float)) or n <= 0:
        return ""
    return units.mem(n)


def _first(mapping: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = mapping.get(key)
        if value not in (None, ""):
            return value
    return None


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# -- header -------------------------------------------------------------------------


def _host_summary(host: Any) -> str:
    if not host:
        return ""
    if not isinstance(host, Mapping):
        return str(host)
    parts: list[str] = []
    osname = " ".join(str(x) for x in (host.get("os"), host.get("kernel")) if x)
    if osname:
        parts.append(osname)
    if host.get("arch"):
        parts.append(str(host["arch"]))
    cpu = host.get("cpu")
    cores = _first(host, "cpu_cores", "cores")
    if cpu or cores:
        parts.append(f"{cpu or 'CPU'}" + (f" ({cores} cores)" if cores else ""))
    ram = _first(host, "cpu_ram_bytes", "ram_bytes")
    if ram:
        parts.append(f"{_bytes(ram)} RAM")
    elif host.get("ram_gb"):
        parts.append(f"{host['ram_gb']} GB RAM")
    gpus = host.get("gpus")
    if isinstance(gpus, (list, tuple)):
        if not gpus:
            parts.append("no GPU")
        else:
            names = []
            for g in gpus:
                if isinstance(g, Mapping):
                    mem = _bytes(g.get("vram_bytes"))
                    names.append(f"{g.get('name', 'GPU')}" + (f" {mem}" if mem else ""))
                else:
                    names.append(str(g))
            counts: dict[str, int] = {}
            for n in names:
                counts[n] = counts.get(n, 0) + 1
            parts.append(", ".join(f"{c}x {n}" if c > 1 else n for n, c in counts.items()))
    elif gpus:
        parts.append(str(gpus))
    if host.get("driver"):
        parts.append(f"driver {host['driver']}")
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
    size = _bytes(_first(cond, "model_size_bytes", "model_size"))
    if size:
        model_bits.append(size)
    if cond.get("model_sha256"):
        model_bits.append(f"sha256 {str(cond['model_sha256'])[:12]}")
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
            rows.append(("Changed by engineroom", f"added `{added}` ({change.get('source', '?')}): {change.get('why', '')}"))
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
    lines += ["| | |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in rows] + [""]
    return lines


# -- verify -------------------------------------------------------------------------


def _check_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for rec in records:
        if rec.get("kind") != CHECK_RECORD_KIND:
            continue
        p = rec.get("payload") or {}
        rows.append({
            "name": _first(p, "name", "check", "id") or "?",
            "status": str(_first(p, "status", "outcome", "result") or "?").upper(),
            "reason": _first(p, "reason", "detail", "message") or "",
            "seconds": _first(p, "seconds", "elapsed_s", "duration_s", "wall_s"),
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
    lines += ["| check | result | seconds | reason |", "|---|---|---:|---|"]
    for r in rows:
        secs = r["seconds"]
        secs_txt = f"{secs:.2f}" if isinstance(secs, (int, float)) else "n/a"
        lines.append(f"| {_cell(r['name'])} | {r['status']} | {secs_txt} | {_cell(r['reason'])} |")
    lines.append("")
    return lines


# -- bench --------------------------------------------------------------------------


def _mean_std(d: Mapping[str, Any], digits: int = 2) -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    text = _fmt(d["mean"], digits)
    if d.get("std") is not None:
        text += f" ± {_fmt(d['std'], digits)}"
        if d.get("cv_pct") is not None:
            text += f" ({d['cv_pct']:.1f}%)"
    return text


def _min_max(d: Mapping[str, Any], digits: int = 2) -> str:
    if not d or d.get("min") is None:
        return "n/a"
    return f"{_fmt(d['min'], digits)}–{_fmt(d['max'], digits)}"


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


def _what_ran(payloads: list[Mapping[str, Any]], bench_cond: Mapping[str, Any]) -> dict[str, Any]:
    """Requests that finished per workload against what the run planned.

    ``complete`` is True when every planned workload got all its warm-ups and measured
    requests (or, for a run without a recorded plan, always)."""
    names, warmup, measured = _planned(bench_cond)
    ran: dict[str, list[int]] = {n: [0, 0] for n in names}
    for p in payloads:
        ran.setdefault(str(p.get("workload")), [0, 0])[0 if p.get("warmup") else 1] += 1
    known = bool(names) and warmup is not None and measured is not None
    planned_total = len(names) * (warmup + measured) if known else None
    complete = not known or all(ran[n][0] >= warmup and ran[n][1] >= measured for n in names)
    return {"ran": ran, "names": names, "warmup": warmup, "measured": measured, "known": known,
            "planned_total": planned_total, "done": len(payloads), "complete": complete}


def _ran_text(what: Mapping[str, Any]) -> str:
    parts = []
    for name, (w, m) in what["ran"].items():
        parts.append(f"{name} {w} warm-up + {m} measured" if w or m else f"{name} did not run")
    return ", ".join(parts)


def _bench_section(records: list[Mapping[str, Any]], cond: Mapping[str, Any],
                   run: Mapping[str, Any] | None = None) -> list[str]:
    summary = statistics.summarize(records)
    bench_cond = cond.get("bench") if isinstance(cond.get("bench"), Mapping) else {}
    run = run or {}
    what = _what_ran(statistics.payloads(records), bench_cond)
    status_line = f"Status: **{summary['status']}**"
    if not what["complete"]:
        # the requests that did run may all be fine, but the bench is not: say what ran
        run_status = str(run.get("status") or "")
        stopped = run_status if run_status in ("INTERRUPTED", "ERROR", "running") else "INCOMPLETE"
        if run.get("end_reason"):
            stopped += f" ({run['end_reason']})"
        status_line = (f"Status: **{stopped}**: {what['done']} of {what['planned_total']} planned requests ran "
                       f"({_ran_text(what)}); the figures below cover only those "
                       f"(those requests: {summary['status']}).")
    lines = ["## Bench", "", status_line, ""]
    lines += [
        "| workload | usable / measured | decode tok/s mean ± std (CV%) | decode min–max | "
        "TTFT s mean ± std | wall tok/s mean ± std | tokens mean | max_tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    planned_measured = what["measured"]
    for name, s in summary["workloads"].items():
        tokens = s["completion_tokens"].get("mean")
        counted = f"{s['n_usable']} / {s['n']}"
        if planned_measured is not None and s["n"] < planned_measured:
            counted += f" of {planned_measured} planned"
        lines.append(
            f"| {_cell(name)} | {counted} | {_mean_std(s['decode_tps'])} | "
            f"{_min_max(s['decode_tps'])} | {_mean_std(s['ttft_s'], 3)} | {_mean_std(s['wall_tps'])} | "
            f"{_fmt(tokens, 1)} | {_fmt(s['max_tokens'])} |"
        )
    max_by_name = {str(w.get("name")): w.get("max_tokens") for w in bench_cond.get("workloads") or []
                   if isinstance(w, Mapping)}
    for name in what["names"]:
        if name not in summary["workloads"]:
            lines.append(f"| {_cell(name)} | not run | n/a | n/a | n/a | n/a | n/a | {_fmt(max_by_name.get(name))} |")
    lines.append("")
    lines.append("Client vs engine decode, same requests (client inter-token rate = "
                 "(tokens − 1) / (last token − first token), the engine's own definition):")
    lines.append("")
    for name, s in summary["workloads"].items():
        a = s["agreement"]
        if not a["n"]:
            lines.append(f"- {name}: not cross-checked: {a['not_checked']}.")
        elif a["warning"]:
            lines.append(f"- ⚠ {name}: WARNING: {a['warning']}.")
        else:
            lines.append(
                f"- {name}: client inter-token {a['client_inter_token_tps']:.2f} tok/s vs engine {a['engine_decode_tps']:.2f} tok/s "
                f"(median per-request {a['diff_pct']:+.1f}%, within {a['tolerance_pct']:g}%; n={a['n']})."
            )
    lines.append("")
    notes: list[str] = []
    used_eos = bench_cond.get("ignore_eos")
    if used_eos is None:
        used_eos = any(s.get("ignore_eos") for s in summary["workloads"].values())
    if used_eos:
        notes.append("ignore_eos: on (every request was asked to generate exactly max_tokens).")
    elif bench_cond.get("full_length"):
        notes.append(f"ignore_eos: off ({bench_cond.get('ignore_eos_reason', 'not supported')}).")
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
        "decode is n/a when the decode window is under 5% of the wall time."
    )
    shown = {f"{name}: {s['agreement']['warning']}" for name, s in summary["workloads"].items()}
    for w in summary["warnings"]:
        if w not in shown:  # agreement warnings are already on their workload's line
            notes.append(f"⚠ {w}.")
    lines += [f"- {n}" for n in notes] + [""]
    return lines


def _provenance(n_bench: int, n_checks: int, run_id: Any) -> str:
    parts = []
    if n_bench:
        parts.append(
            "TTFT, wall time, decode tok/s (tokens / (wall − TTFT)) and wall tok/s come from the client clock "
            "(time.perf_counter in engineroom; TTFT = first non-empty content or reasoning delta), with token counts "
            "from the server's usage.completion_tokens; engine tok/s is the engine's own timings.predicted_per_second, "
            "shown only to cross-check"
        )
    if n_checks:
        parts.append("check seconds come from the client clock")
    body = "; ".join(parts) if parts else "no measurements were recorded"
    return (
        f"_Provenance: {body}. Every figure is recomputed from the {n_bench + n_checks} raw records "
        f"stored with run #{run_id}._"
    )


def render_card(run: Mapping[str, Any], records: list[Mapping[str, Any]]) -> str:
    """A markdown card for ``run`` (a ``Store.get_run`` dict) from its ``Store.records``."""
    cond = run.get("conditions") or {}
    if not isinstance(cond, Mapping):
        cond = {}
    checks = _check_rows(records)
    bench_payloads = statistics.payloads(records)
    lines = _header(run, cond)
    if checks:
        lines += _verify_section(checks)
    if bench_payloads:
        lines += _bench_section(records, cond, run)
    elif isinstance(cond.get("bench"), Mapping) and cond["bench"].get("workloads") and run.get("kind") != "verify":
        status = run.get("status") or "unknown"
        if status == "running" and not run.get("finished"):
            said = "No bench request has finished yet."
        else:
            said = (f"Not run: the run ended ({status}" + (f", {run['end_reason']}" if run.get("end_reason") else "")
                    + ") before any bench request finished.")
        lines += ["## Bench", "", said, ""]
    if not checks and not bench_payloads:
        lines += ["No checks or bench requests were recorded for this run.", ""]
    lines.append(_provenance(len(bench_payloads), len(checks), run.get("id", "?")))
    lines.append("")
    text = "\n".join(lines)
    model_path = cond.get("model_path")
    paths: dict[str, str] = {}
    if model_path:
        model_dir = os.path.dirname(str(model_path).rstrip("/"))
        if model_dir and model_dir not in ("/", "."):
            paths[model_dir] = "<model-dir>"
    return redact(text, paths=paths)
