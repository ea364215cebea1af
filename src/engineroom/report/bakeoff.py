"""The engine comparison page of a bakeoff (or of any stored runs), recomputed from their records.

``bakeoff_page(store, ID)`` reads a stored bakeoff (``flows.bakeoff``) and every run its cells point
at; ``runs_page(store, ids)`` makes the same page of stored runs grouped by engine and model. The
page is plain data (``report --json`` prints it): per cell the engine's status, its measured figures
(single-stream decode and TTFT, decode by depth, aggregate throughput and p95 TTFT by concurrency,
the context measured by the stress ladder, memory predicted vs measured, cold start, the soak's
verdict), what verify found of each feature (PASS / FAIL / SKIP with its reason), its exact launch
command; then "how to choose", computed from those cells, with the noise band between the top two
of each use case. ``page_markdown`` writes it for a README; ``report.bakeoffhtml`` as one HTML file.
Every figure names the run behind it.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engineroom.bench.compare import compare_runs, welch
from engineroom.redaction import redact, redact_argv
from engineroom.store import Store

__all__ = ["BAKEOFF_KIND", "CELL_KIND", "FEATURES", "MATRIX_HEAD", "bakeoff_page", "compare_pages", "machine_line",
           "matrix_rows", "page_markdown", "runs_page"]

BAKEOFF_KIND = "bakeoff"           # the stored run of a bakeoff (flows.bakeoff)
CELL_KIND = "bakeoff_cell"         # one record per cell that ended: done, failed, or could not run here
EVERY_STREAM, ROUND_WALL = "every stream decoding", "round wall time"   # the bases of an aggregate decode rate

# feature -> the verify checks that show it, by suite (full first)
FEATURES: dict[str, tuple[str, ...]] = {
    "tools": ("tool_call_auto", "tool_call"), "reasoning": ("reasoning_split",), "vision": ("image_input",),
    "JSON schema": ("json_schema_complex", "json_schema"), "spec-decode": ("spec_decode",),
}
_VERIFY_ORDER = ("full", "smoke")
_BENCH_ORDER = ("standard", "quick")


def _suite_of(run: Mapping[str, Any]) -> str:
    """The suite a stored run ran: verify's (full, smoke, stress, soak) or bench's (quick, depth ...)."""
    cond = run.get("conditions") or {}
    if run.get("kind") == "verify":
        return str((cond.get("verify") or {}).get("suite") or "smoke")
    bench = cond.get("bench") or {}
    return str(bench.get("suite") or ("quick" if run.get("kind") == "bench" else run.get("kind")))


def _fmt(v: Any, nd: int = 1) -> str:
    return "—" if v is None else f"{v:,.{nd}f}"


def _decode_groups(summary: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """A bench summary's groups (long suites) or workloads (quick): label -> figures."""
    groups = summary.get("groups") or summary.get("workloads") or {}
    return {str(k): v for k, v in groups.items() if isinstance(v, Mapping)}


def _single_stream(run: Mapping[str, Any]) -> dict[str, Any] | None:
    groups = _decode_groups(run.get("summary") or {})
    for label, g in groups.items():
        d = g.get("decode_tps") or {}
        if d.get("mean") is not None:
            t = g.get("ttft_s") or {}
            return {"mean": d["mean"], "std": d.get("std"), "n": d.get("n"), "group": label,
                    "ttft_s": t.get("mean"), "ttft_std": t.get("std"), "run": run["id"]}
    return None


def _depth_curve(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for label, g in _decode_groups(run.get("summary") or {}).items():
        d = g.get("decode_tps") or {}
        if label.startswith("depth ") and d.get("mean") is not None:
            out.append({"depth": g.get("depth") or int(label.split()[1]), "decode": d["mean"], "std": d.get("std"),
                        "ttft_s": (g.get("ttft_s") or {}).get("mean"), "run": run["id"], "status": run.get("status")})
    return sorted(out, key=lambda p: p["depth"])


def _concurrency_points(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each concurrency group's aggregate decode: the tokens per second while every stream decoded (the window
    the suite's own report and `tune` judge by); a run stored before it had that window, its round's tokens
    over the round's wall time, which counts the prompts' prefill too (the H200 page read 33.9 @ 1 beside a
    single-stream 78.1 so), said in ``basis``."""
    out = []
    for label, g in _decode_groups(run.get("summary") or {}).items():
        rounds = g.get("rounds") or []
        steady = g.get("all_decoding_tps") or {}
        key, fig = ("all_decoding_tps", steady) if steady.get("mean") is not None else \
            ("aggregate_tps", g.get("aggregate_tps") or {})
        if rounds and fig.get("mean") is not None:
            wall = g.get("aggregate_tps") or {}
            out.append({"streams": max(int(r.get("streams") or 1) for r in rounds), "aggregate": fig["mean"],
                        "std": fig.get("std"), "samples": [r[key] for r in rounds if r.get(key) is not None],
                        "basis": EVERY_STREAM if key == "all_decoding_tps" else ROUND_WALL,
                        "wall": {"aggregate": wall["mean"], "std": wall.get("std"), "basis": ROUND_WALL,
                                 "samples": [r["aggregate_tps"] for r in rounds if r.get("aggregate_tps") is not None]}
                        if wall.get("mean") is not None else None,
                        "ttft_p95_s": (g.get("ttft_from_schedule_s") or {}).get("p95"), "group": label,
                        "run": run["id"]})
    return sorted(out, key=lambda p: p["streams"])


def _one_basis(cells: Sequence[dict[str, Any]]) -> None:
    """Every cell's aggregate on one basis: where one cell's run predates the every-stream-decoding window, all
    of them on the round's wall time (which every run has), so the page never sets one basis against the other."""
    measured = [c for c in cells if c.get("status") == "done" and (c.get("figures") or {}).get("concurrency")]
    if all(p["basis"] == EVERY_STREAM for c in measured for p in c["figures"]["concurrency"]):
        return
    for c in measured:
        pts = [{**p, **p["wall"]} for p in c["figures"]["concurrency"] if p.get("wall")]
        c["figures"]["concurrency"] = pts
        c["figures"]["aggregate"] = max(pts, key=lambda p: p["aggregate"]) if pts else None


def _checks(store: Store, run_id: int) -> dict[str, dict[str, Any]]:
    return {r["payload"]["name"]: r["payload"] for r in store.records(run_id, "check")}


def _memory(store: Store, launch_run: int | None) -> dict[str, Any] | None:
    if launch_run is None:
        return None
    try:
        rows = [r["payload"] for r in store.records(launch_run, "memory_component")]
    except Exception:  # noqa: BLE001 - a launch record gone from the store: the cell says no memory
        return None
    total = next((r for r in rows if r.get("component") == "total"), None)
    return {"rows": rows, "run": launch_run,
            "predicted": total.get("predicted_bytes") if total else None,
            "measured": total.get("measured_bytes") if total else None,
            "error_pct": total.get("error_pct") if total else None}


def _memory_in(runs: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The launch's memory rows as a run's conditions keep them (a run given by id has no cell's launch run)."""
    for run in runs:
        rows = ((run.get("conditions") or {}).get("memory") or {}).get("rows") or []
        total = next((r for r in rows if r.get("component") == "total"), None)
        if total:
            return {"rows": rows, "run": run["id"], "predicted": total.get("predicted_bytes"),
                    "measured": total.get("measured_bytes"), "error_pct": total.get("error_pct")}
    return None


def _cell_figures(store: Store, cell: dict[str, Any], runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The cell's measured figures from its runs."""
    by_suite: dict[str, Mapping[str, Any]] = {}
    for run in runs:
        by_suite.setdefault(f"{run['kind']}:{_suite_of(run)}", run)
    fig: dict[str, Any] = {"suite_status": {k: r.get("status") for k, r in by_suite.items()}}
    for name in _BENCH_ORDER:
        if f"bench:{name}" in by_suite:
            fig["single_stream"] = _single_stream(by_suite[f"bench:{name}"])
            break
    if "bench:depth" in by_suite:
        fig["depth"] = _depth_curve(by_suite["bench:depth"])
    points = [p for k in ("bench:concurrency", "bench:sweep") if k in by_suite
              for p in _concurrency_points(by_suite[k])]
    if points:
        fig["concurrency"] = sorted(points, key=lambda p: p["streams"])
        fig["aggregate"] = max(points, key=lambda p: p["aggregate"])
    verify_run = next((by_suite[f"verify:{s}"] for s in _VERIFY_ORDER if f"verify:{s}" in by_suite), None)
    if verify_run is not None:
        checks = _checks(store, verify_run["id"])
        fig["features"] = {feature: _feature(checks, names, verify_run["id"]) for feature, names in FEATURES.items()}
        counted = [c for c in checks.values() if c.get("status") in ("PASS", "FAIL")]
        fig["api"] = {"pass": sum(c["status"] == "PASS" for c in counted), "of": len(counted),
                      "skip": sum(c.get("status") == "SKIP" for c in checks.values()), "run": verify_run["id"]}
    if "verify:stress" in by_suite:
        ceiling = _checks(store, by_suite["verify:stress"]["id"]).get("context_ceiling") or {}
        details = ceiling.get("details") or {}
        fig["max_ctx"] = {"tokens": details.get("memory_ceiling_tokens"), "n_ctx": details.get("n_ctx"),
                          "status": ceiling.get("status"), "reason": ceiling.get("reason"),
                          "run": by_suite["verify:stress"]["id"]}
    if "verify:soak" in by_suite:
        soak = by_suite["verify:soak"]
        fig["soak"] = {"status": soak.get("status"), "run": soak["id"]}
    fig["memory"] = _memory(store, cell.get("launch_run")) or _memory_in(runs)
    launch = next((s for s in cell.get("stages") or () if s.get("stage") == "launch"), None)
    fig["cold_start_s"] = launch.get("seconds") if launch else None
    return fig


def _feature(checks: Mapping[str, Mapping[str, Any]], names: Sequence[str], run_id: int) -> dict[str, Any]:
    for name in names:
        if name in checks:
            c = checks[name]
            return {"status": c.get("status"), "reason": c.get("reason") or "", "check": name, "run": run_id}
    return {"status": "—", "reason": "not in the suite run", "check": "", "run": run_id}


def _described(cell: dict[str, Any], runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The cell's engine version, files and command, from the first run that names them."""
    cond = next((r.get("conditions") or {} for r in runs if (r.get("conditions") or {}).get("argv")), {})
    argv = cell.get("argv") or cond.get("argv") or []
    path = str(cond.get("model_path") or "")
    return {"engine_version": cond.get("engine_version"), "model_file": path.rsplit("/", 1)[-1] if path else None,
            "model_sha256": str(cond.get("model_sha256") or "")[:12] or None,
            "command": redact(shlex.join(str(a) for a in redact_argv(argv))) if argv else None,
            "host": cond.get("host")}


def bakeoff_page(store: Store, bakeoff_id: int) -> dict[str, Any]:
    run = store.get_run(bakeoff_id)
    if run["kind"] != BAKEOFF_KIND:
        from engineroom.errors import BadInput

        raise BadInput(f"run {bakeoff_id} is a {run['kind']} run, not a bakeoff (`engineroom runs --kind bakeoff`).")
    cond = run["conditions"]
    latest = {(r["payload"]["engine"], r["payload"]["priority"]): r["payload"]     # a cell tried again: its last
              for r in store.records(bakeoff_id, CELL_KIND)}
    grid = [(e, p) for e in cond.get("engines") or () for p in cond.get("priorities") or ()]
    cells = []
    for key in sorted(latest, key=lambda k: grid.index(k) if k in grid else len(grid)):
        cell = dict(latest[key])
        runs = [store.get_run(i) for i in cell.get("runs", {}).values()]
        cell.update(_described(cell, runs), figures=_cell_figures(store, cell, runs))
        cells.append(cell)
    return _page(store, {"title": f"bakeoff {bakeoff_id}: {cond.get('model')}", "bakeoff": bakeoff_id,
                  "model": cond.get("model"), "status": run["status"], "created": run["created"],
                  "suites": cond.get("suites"), "short": cond.get("short"), "random": bool(cond.get("random")),
                  "left": [f"{e} / {p}" for e in cond.get("engines") or () for p in cond.get("priorities") or ()
                           if not any((c["engine"], c["priority"]) == (e, p) for c in cells)]}, cells)


def runs_page(store: Store, run_ids: Sequence[int]) -> dict[str, Any]:
    """The page of stored runs: one cell per engine x model (their launch records give the memory)."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for rid in run_ids:
        run = store.get_run(rid)
        cond = run.get("conditions") or {}
        groups.setdefault((str(cond.get("engine") or "?"), str(cond.get("model") or "?")), []).append(run)
    cells = []
    for (engine, model), runs in groups.items():
        cell: dict[str, Any] = {"engine": engine, "priority": model, "status": "done",
                                "runs": {_suite_of(r): r["id"] for r in runs}}
        cell.update(_described(cell, runs), figures=_cell_figures(store, cell, runs))
        cells.append(cell)
    models = sorted({m for _e, m in groups})
    suites = list(dict.fromkeys(s for c in cells for s in c["runs"]))
    return _page(store, {"title": f"runs {', '.join(map(str, run_ids))}", "runs": list(run_ids),
                         "model": ", ".join(models), "status": "OK", "suites": suites}, cells)


# --------------------------------------------------------------------------- how to choose
def _verdict(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    w = welch(a, b)
    if w["band"] is None:
        return {"verdict": "cannot tell (fewer than 2 samples each)", "band": None}
    return {"verdict": "real difference" if abs(w["delta"]) > w["band"] else "within noise", "band": w["band"]}


def _choose(store: Store, cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    done = [c for c in cells if c.get("status") == "done"]
    out = []

    def ranked(value: Any) -> list[tuple[float, dict[str, Any]]]:
        found = [(value(c), c) for c in done]
        return sorted([(v, c) for v, c in found if v is not None], key=lambda vc: -vc[0])

    single = ranked(lambda c: (c["figures"].get("single_stream") or {}).get("mean"))
    if single:
        row = _use_case("one user, fastest replies", "decode tok/s (one stream)", single)
        if len(single) > 1:
            a, b = single[0][1]["figures"]["single_stream"], single[1][1]["figures"]["single_stream"]
            cmp = compare_runs(store.get_run(b["run"]), store.records(b["run"]), store.get_run(a["run"]),
                               store.records(a["run"]))
            match = next((r for r in cmp["rows"] if r["metric"] == "decode_tps" and r["group"] == a["group"]),
                         None) or next((r for r in cmp["rows"] if r["metric"] == "decode_tps"), None)
            if match is not None:
                row.update(verdict={"real": "real difference", "not real": "within noise"}.get(match["verdict"],
                                                                                               match["verdict"]),
                           band_pct=match.get("band_pct"))
        out.append(row)
    agg = ranked(lambda c: (c["figures"].get("aggregate") or {}).get("aggregate"))   # one basis: _one_basis
    if agg:
        basis = agg[0][1]["figures"]["aggregate"]["basis"]
        row = _use_case("many users, most throughput", f"aggregate decode tok/s ({basis})", agg)
        if len(agg) > 1:
            va, vb = agg[0][1]["figures"]["aggregate"], agg[1][1]["figures"]["aggregate"]
            v = _verdict(vb["samples"], va["samples"])
            row.update(verdict=v["verdict"], band_pct=(v["band"] / vb["aggregate"] * 100) if v["band"] else None)
        out.append(row)
    ctx = ranked(lambda c: (c["figures"].get("max_ctx") or {}).get("tokens"))
    if ctx:
        out.append(_use_case("long documents", "context filled (stress ladder, tokens)", ctx, exact=True))
    feats = ranked(lambda c: float(sum((f.get("status") == "PASS") for f in (c["figures"].get("features") or {})
                                       .values())) if c["figures"].get("features") else None)
    if feats:
        out.append(_use_case("agents and tools", "features verify passed (of 5)", feats, exact=True))
    mem = ranked(lambda c: -float((c["figures"].get("memory") or {}).get("measured") or 0) or None)
    if mem:
        out.append(_use_case("least memory", "memory measured (GiB)", [(-v / 2**30, c) for v, c in mem], exact=True))
    return out


def _use_case(use: str, metric: str, ranked: Sequence[tuple[float, dict[str, Any]]], exact: bool = False
              ) -> dict[str, Any]:
    (v1, c1) = ranked[0]
    row: dict[str, Any] = {"use": use, "metric": metric, "pick": f"{c1['engine']} ({c1['priority']})", "value": v1,
                           "verdict": "only one engine measured" if len(ranked) < 2 else None, "band_pct": None}
    if len(ranked) > 1:
        v2, c2 = ranked[1]
        row.update(runner_up=f"{c2['engine']} ({c2['priority']})", runner_value=v2)
        if exact:
            row["verdict"] = "a count, no noise band" if v1 != v2 else "a tie"
    return row


def _page(store: Store, head: dict[str, Any], cells: list[dict[str, Any]]) -> dict[str, Any]:
    _one_basis(cells)
    host = next((c.get("host") for c in cells if c.get("host")), None)
    machines: dict[str | None, dict[str, Any]] = {}
    for c in cells:
        if c.get("host"):
            machines.setdefault(c.get("machine_key"), {"host": c["host"], "engines": []})["engines"].append(c["engine"])
    choose = [r for r in _choose(store, cells) if not (head.get("random") and r["use"] == "agents and tools")]
    return {**head, "machine": host, "machines": list(machines.values()), "cells": cells, "choose": choose,
            "files_note": _files_note(cells)}


def _files_note(cells: Sequence[Mapping[str, Any]]) -> str | None:
    """Cells that served files of one name, not the same bytes (a random file a resume wrote again): said."""
    by_name: dict[str, dict[str, list[str]]] = {}
    for c in cells:
        if c.get("status") == "done" and c.get("model_file") and c.get("model_sha256"):
            by_name.setdefault(str(c["model_file"]), {}).setdefault(str(c["model_sha256"]), []).append(c["engine"])
    differ = {name: shas for name, shas in by_name.items() if len(shas) > 1}
    if not differ:
        return None
    said = ["{} was {}".format(name, ", ".join(f"sha256 {sha} ({', '.join(e)})" for sha, e in shas.items()))
            for name, shas in differ.items()]
    return (f"Not one file: {'; '.join(said)}. The same name, not the same bytes: the figures compare different "
            "files.")


# --------------------------------------------------------------------------- compare two pages
def compare_pages(store: Store, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per cell both pages hold (engine x priority): each measured figure old -> new, with its noise band."""
    rows = []
    olds = {(c["engine"], c["priority"]): c for c in old["cells"] if c.get("status") == "done"}
    for c in new["cells"]:
        o = olds.get((c["engine"], c["priority"]))
        if o is None or c.get("status") != "done":
            continue
        cell = f"{c['engine']} ({c['priority']})"
        fa, fb = o["figures"], c["figures"]
        sa, sb = fa.get("single_stream"), fb.get("single_stream")
        if sa and sb:
            cmp = compare_runs(store.get_run(sa["run"]), store.records(sa["run"]), store.get_run(sb["run"]),
                               store.records(sb["run"]))
            for r in cmp["rows"]:
                if r["group"] in (sa["group"], sb["group"]):
                    rows.append({"cell": cell, "metric": f"{r['metric']} ({r['group']})", "old": r["a_mean"],
                                 "new": r["b_mean"], "delta_pct": r["delta_pct"], "band_pct": r["band_pct"],
                                 "verdict": {"real": "real difference", "not real": "within noise"}.get(
                                     r["verdict"], r["verdict"]), "runs": (sa["run"], sb["run"])})
        aa, ab = fa.get("aggregate"), fb.get("aggregate")
        if aa and ab:
            v = _verdict(aa["samples"], ab["samples"])
            rows.append({"cell": cell, "metric": "aggregate_tps", "old": aa["aggregate"], "new": ab["aggregate"],
                         "delta_pct": (ab["aggregate"] / aa["aggregate"] - 1) * 100 if aa["aggregate"] else None,
                         "band_pct": (v["band"] / aa["aggregate"] * 100) if v["band"] and aa["aggregate"] else None,
                         "verdict": v["verdict"], "runs": (aa["run"], ab["run"])})
        ma, mb = fa.get("memory") or {}, fb.get("memory") or {}
        if ma.get("measured") and mb.get("measured"):
            rows.append({"cell": cell, "metric": "memory_measured_bytes", "old": ma["measured"],
                         "new": mb["measured"], "delta_pct": (mb["measured"] / ma["measured"] - 1) * 100,
                         "band_pct": None, "verdict": "one launch each: no band", "runs": (ma["run"], mb["run"])})
    return rows


# --------------------------------------------------------------------------- markdown
def _status_cell(c: Mapping[str, Any], random: bool = False) -> str:
    if c.get("status") == "done":         # on random weights a verify verdict means nothing (RANDOM_NOTE)
        bad = [f"{k.split(':')[1]} {v}" for k, v in (c["figures"].get("suite_status") or {}).items()
               if v not in ("OK", None) and not (random and k.startswith("verify:"))]
        errors = [k for k, v in (c.get("suites") or {}).items() if str(v).startswith("ERROR")]
        return "ran" + (f" ({', '.join(bad + [f'{k} refused' for k in errors])})" if bad or errors else "")
    return f"{c.get('status')} (below)"


RANDOM_NOTE = ("Random weights (`--random`): the answers are noise, so tools, reasoning, JSON schema, the API checks "
               "and spec-decode acceptance mean nothing and are not shown (n/a); memory, placement and speed are real.")


def _features_cells(f: Mapping[str, Any], random: bool = False) -> list[str]:
    if random:
        return ["n/a"] * len(FEATURES)
    feats = f.get("features") or {}
    return [str((feats.get(name) or {}).get("status") or "—") for name in FEATURES]


def matrix_rows(page: Mapping[str, Any]) -> list[list[str]]:
    """The engine matrix as text cells (markdown and HTML both show these)."""
    rows = []
    for c in page["cells"]:
        f = c.get("figures") or {}
        pick = c.get("pick") or {}
        s, a, ctx, mem = (f.get("single_stream") or {}, f.get("aggregate") or {}, f.get("max_ctx") or {},
                          f.get("memory") or {})
        api = f.get("api")
        rows.append([
            c["engine"], str(c.get("priority")), _status_cell(c, bool(page.get("random"))),
            f"{pick.get('quant', '?')} · KV {pick.get('kv', '?')} · {pick.get('ctx') or 0:,} × {pick.get('parallel')}"
            if pick else "—",
            f"{_fmt(s.get('mean'))} ± {_fmt(s.get('std'))}" if s else "—",
            f"{_fmt(s.get('ttft_s'), 3)}" if s else "—",
            f"{_fmt(a.get('aggregate'))} @ {a.get('streams')}"
            + (f" ({a['basis']})" if a and a.get("basis") not in (None, EVERY_STREAM) else "") if a else "—",
            f"{ctx['tokens']:,}" if ctx.get("tokens") else ("—" if not ctx else str(ctx.get("status"))),
            *_features_cells(f, bool(page.get("random"))),
            "n/a" if page.get("random") else (f"{api['pass']}/{api['of']}" if api else "—"),
            (f"{_fmt((mem.get('predicted') or 0) / 2**30, 2)} / {_fmt((mem.get('measured') or 0) / 2**30, 2)} GiB"
             if mem.get("measured") else "—"),
            f"{_fmt(f.get('cold_start_s'))} s" if f.get("cold_start_s") is not None else "—",
            str((f.get("soak") or {}).get("status") or "—"),
            ", ".join(str(i) for i in (c.get("runs") or {}).values()) or "—",
        ])
    return rows


MATRIX_HEAD = ["engine", "priority", "status", "pick", "decode tok/s (1 stream)", "TTFT s",
               "aggregate decode tok/s @ N", "context filled", *FEATURES, "API checks", "memory predicted / measured",
               "cold start", "soak", "runs"]


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def machine_line(page: Mapping[str, Any]) -> str:
    """The machine the cells ran on; where they ran on several (a bakeoff resumed elsewhere), each with its
    engines: their figures compare across machines, even machines of one description."""
    def described(m: Mapping[str, Any]) -> str:
        gpus = ", ".join(g.get("name", "?") for g in m.get("gpus") or ()) or "no GPU"
        return f"{m.get('cpu', '?')}, {m.get('cpu_cores', '?')} cores, {(m.get('ram_bytes') or 0) / 2**30:.0f} GiB " \
               f"RAM, {gpus}"
    machines = page.get("machines") or []
    if len(machines) < 2:
        return described(page.get("machine") or {})
    return f"{len(machines)} machines, the figures compare across them: " + "; ".join(
        f"{described(m['host'])} ({', '.join(m['engines'])})" for m in machines)


def page_markdown(page: Mapping[str, Any], compared: Sequence[Mapping[str, Any]] | None = None) -> str:
    lines = [f"# Engine comparison: {page.get('model')} ({page['title']})", "",
             f"Machine: {machine_line(page)}. Suites: {', '.join(page.get('suites') or [])}"
             + (" (short sizes: a first look, not figures to publish)." if page.get("short") else "."), "",
             *([RANDOM_NOTE, ""] if page.get("random") else []),
             *([str(page["files_note"]), ""] if page.get("files_note") else []),
             *([f"Status {page.get('status')}: not run yet: {', '.join(page['left'])} "
                f"(`engineroom bakeoff --resume {page.get('bakeoff')}`).", ""] if page.get("left") else []),
             "## Engines", "", "| " + " | ".join(MATRIX_HEAD) + " |", "|" + "---|" * len(MATRIX_HEAD)]
    lines += ["| " + " | ".join(_md_cell(x) for x in row) + " |" for row in matrix_rows(page)]
    lines += ["", "Each figure is recomputed from the stored runs listed in its row (`engineroom report RUN`).", ""]
    if page.get("choose"):
        lines += ["## How to choose (from the measurements above)", "",
                  "| use | pick | measured | runner-up | between the two |", "|---|---|---:|---|---|"]
        for r in page["choose"]:
            band = f" (band ±{r['band_pct']:.1f}%)" if r.get("band_pct") else ""
            runner = f"{r['runner_up']} ({_fmt(r['runner_value'])})" if r.get("runner_up") else "—"
            lines.append(f"| {r['use']} | {r['pick']} | {_fmt(r['value'])} {r['metric']} | {runner} | "
                         f"{r.get('verdict') or '—'}{band} |")
        lines.append("")
    if compared is not None:
        lines += ["## What changed", "", "| cell | metric | before | after | change | band | verdict |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for r in compared:
            lines.append(f"| {r['cell']} | {r['metric']} | {_fmt(r['old'], 2)} | {_fmt(r['new'], 2)} | "
                         f"{_fmt(r['delta_pct'])}% | {('±' + _fmt(r['band_pct']) + '%') if r['band_pct'] else '—'} | "
                         f"{r['verdict']} |")
        lines.append("")
    lines += ["## Launch recipes", ""]
    for c in page["cells"]:
        if c.get("command"):
            digest = f"{c['model_sha256']}…" if c.get("model_sha256") else "—"
            lines += [f"**{c['engine']}** ({c['priority']}, {c.get('engine_version') or 'version unknown'}; "
                      f"file {c.get('model_file')}, sha256 {digest}):", "", "```sh", c["command"], "```", ""]
    for c in page["cells"]:
        errors = [f"{k}: {str(v)[7:]}" for k, v in (c.get("suites") or {}).items() if str(v).startswith("ERROR")]
        notes = (c.get("pick") or {}).get("notes") or []
        if errors or notes:
            lines += [f"Notes on **{c['engine']}** ({c['priority']}):", ""] + [f"- {x}" for x in notes + errors] + [""]
    missing = [c for c in page["cells"] if c.get("status") != "done"]
    if missing:
        lines += ["## Not measured", ""]
        lines += [f"- **{c['engine']}** ({c['priority']}): {c.get('why', '')}"
                  + (f" To run it: `{c['fix']}`." if c.get("fix") else "") for c in missing]
        lines.append("")
    return redact("\n".join(lines))
