"""The bakeoff page as one self-contained HTML file: the matrix, "how to choose", the plots, the recipes.

Plots are drawn by matplotlib into SVG and put inline (no network, no script library at view time):
decode by depth, aggregate throughput and p95 TTFT by concurrency, memory predicted vs measured per
component; each cell (engine x priority) one colour, the error bars the measured standard deviation.
The page is written from a Jinja2 template with autoescaping, so no text from a run (a model name,
an engine's error) can become markup. A short script counts the plots the browser drew
(``data-plots-drawn`` on ``<body>``: what the headless-browser test reads).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from engineroom.redaction import redact
from engineroom.report.bakeoff import FEATURES, MATRIX_HEAD, RANDOM_NOTE, machine_line, matrix_rows

__all__ = ["page_html", "plots"]

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]          # inline: no XML prolog or doctype


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _label(c: Mapping[str, Any]) -> str:
    return f"{c['engine']} ({c['priority']})"


def plots(page: Mapping[str, Any]) -> dict[str, str]:
    """name -> inline SVG, for the plots the page's cells have data for."""
    import matplotlib

    matplotlib.use("svg", force=True)
    matplotlib.rcParams["svg.hashsalt"] = "engineroom"     # the same page twice: the same file
    cells = [c for c in page["cells"] if c.get("status") == "done"]
    colour = {_label(c): _COLOURS[i % len(_COLOURS)] for i, c in enumerate(cells)}
    out: dict[str, str] = {}
    depth = [(c, c["figures"]["depth"]) for c in cells if c["figures"].get("depth")]
    if depth:
        fig, ax = _figure("Decode speed by context depth", "context depth (tokens)", "decode tok/s (one stream)")
        for c, pts in depth:      # a run its checks marked INVALID is drawn dashed and says so
            bad = next((str(p["status"]) for p in pts if p.get("status") not in (None, "OK")), None)
            ax.errorbar([p["depth"] for p in pts], [p["decode"] for p in pts], yerr=[p["std"] or 0 for p in pts],
                        marker="o", capsize=3, color=colour[_label(c)], linestyle="--" if bad else "-",
                        label=_label(c) + (f": {bad} (run {pts[0]['run']})" if bad else ""))
        ax.legend(fontsize=8)
        out["depth"] = _svg(fig)
    conc = [(c, _with_single(c)) for c in cells if c["figures"].get("concurrency")]
    if conc:
        fig, ax = _figure("Aggregate decode by concurrency", "simultaneous streams",
                          "aggregate decode tok/s (all streams decoding)")
        for c, pts in conc:
            ax.errorbar([p["streams"] for p in pts], [p["aggregate"] for p in pts],
                        yerr=[p.get("std") or 0 for p in pts], marker="o", capsize=3, label=_label(c),
                        color=colour[_label(c)])
        ax.legend(fontsize=8)
        out["throughput"] = _svg(fig)
        ttft = [(c, [p for p in pts if p.get("ttft_p95_s") is not None]) for c, pts in conc]
        if any(pts for _c, pts in ttft):
            fig, ax = _figure("p95 time to first token by concurrency", "simultaneous streams",
                              "p95 TTFT from the scheduled send (s)")
            for c, pts in ttft:
                ax.plot([p["streams"] for p in pts], [p["ttft_p95_s"] for p in pts], marker="o", label=_label(c),
                        color=colour[_label(c)])
            ax.legend(fontsize=8)
            out["ttft"] = _svg(fig)
    mem = [(c, [r for r in c["figures"]["memory"]["rows"] if r.get("predicted_bytes") and r.get("measured_bytes")])
           for c in cells if (c["figures"].get("memory") or {}).get("rows")]
    mem = [(c, rows) for c, rows in mem if rows]
    if mem:
        fig, ax = _figure("Memory: predicted (hollow) vs measured (filled)", "", "MiB")
        names = list(dict.fromkeys(r["component"] for _c, rows in mem for r in rows))
        width = 0.8 / len(mem)
        for i, (c, rows) in enumerate(mem):
            by = {r["component"]: r for r in rows}
            xs = [j + i * width for j, n in enumerate(names) if n in by]
            got = [n for n in names if n in by]
            ax.bar(xs, [by[n]["measured_bytes"] / 2**20 for n in got], width * 0.9, color=colour[_label(c)],
                   label=f"{_label(c)} measured")
            ax.bar(xs, [by[n]["predicted_bytes"] / 2**20 for n in got], width * 0.9, fill=False,
                   edgecolor="black", linestyle="--")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        out["memory"] = _svg(fig)
    return out


def _with_single(c: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The concurrency points, with one stream's decode as the point at N = 1 where no suite measured N = 1."""
    pts = list(c["figures"]["concurrency"])
    single = c["figures"].get("single_stream")
    if single and all(p["streams"] != 1 for p in pts):
        pts.insert(0, {"streams": 1, "aggregate": single["mean"], "std": single.get("std"),
                       "ttft_p95_s": None})
    return pts


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ page.title }}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 4px 6px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.PASS { background: #e6f4e6; } td.FAIL { background: #fbe3e3; }
td.SKIP { background: #f6f1dc; } .plots { display: flex; flex-wrap: wrap; gap: 1em; }
.plot svg { max-width: 580px; height: auto; } pre { background: #f6f6f6; padding: .6em; overflow-x: auto; }
.note { color: #666; }
</style></head>
<body data-plots-drawn="0">
<h1>Engine comparison: {{ page.model }}</h1>
<p class="note">{{ page.title }} · {{ machine }} · suites: {{ (page.suites or [])|join(", ") }}
{% if page.short %}(short sizes: a first look, not figures to publish){% endif %}</p>
{% if page.random %}<p id="random">{{ random_note }}</p>{% endif %}
{% if page.files_note %}<p id="files">{{ page.files_note }}</p>{% endif %}
{% if page.left %}<p id="left">Status {{ page.status }}: not run yet: {{ page.left|join(", ") }}
(<code>engineroom bakeoff --resume {{ page.bakeoff }}</code>).</p>{% endif %}
<h2>Engines</h2>
<table id="matrix"><thead><tr>{% for h in head %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for row in rows %}<tr>{% for x in row %}<td class="{{ x if x in ('PASS', 'FAIL', 'SKIP') else '' }}"
{% if loop.index0 in features %}title="{{ reasons[loop.index0 ~ '/' ~ row[0] ~ '/' ~ row[1]] }}"{% endif %}>
{{ x }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
<p class="note">Each figure is recomputed from the stored runs in its row (<code>engineroom report RUN</code>).</p>
{% if page.choose %}<h2>How to choose</h2>
<table id="choose"><tr><th>use</th><th>pick</th><th>measured</th><th>runner-up</th><th>between the two</th></tr>
{% for r in page.choose %}<tr><td>{{ r.use }}</td><td>{{ r.pick }}</td><td>{{ "%.1f"|format(r.value) }}
{{ r.metric }}</td><td>{{ r.runner_up or "—" }}{% if r.runner_up %} ({{ "%.1f"|format(r.runner_value) }})
{% endif %}</td><td>{{ r.verdict or "—" }}{% if r.band_pct %} (band ±{{ "%.1f"|format(r.band_pct) }}%)
{% endif %}</td></tr>{% endfor %}</table>{% endif %}
{% if compared %}<h2>What changed</h2><table id="compare"><tr><th>cell</th><th>metric</th><th>before</th>
<th>after</th><th>change</th><th>band</th><th>verdict</th></tr>{% for r in compared %}<tr><td>{{ r.cell }}</td>
<td>{{ r.metric }}</td><td>{{ "%.2f"|format(r.old) }}</td><td>{{ "%.2f"|format(r.new) }}</td>
<td>{{ "%+.1f"|format(r.delta_pct or 0) }}%</td><td>{% if r.band_pct %}±{{ "%.1f"|format(r.band_pct) }}%
{% else %}—{% endif %}</td><td>{{ r.verdict }}</td></tr>{% endfor %}</table>{% endif %}
<h2>Plots</h2><div class="plots">{% for name, svg in plots.items() %}
<div class="plot" id="plot-{{ name }}">{{ svg|safe }}</div>{% endfor %}</div>
{% if not plots %}<p class="note">No cell measured depth, concurrency or memory: nothing to plot.</p>{% endif %}
<h2>Launch recipes</h2>{% for c in page.cells if c.command %}
<p><b>{{ c.engine }}</b> ({{ c.priority }}, {{ c.engine_version or "version unknown" }}; file {{ c.model_file }},
sha256 {{ (c.model_sha256 ~ '…') if c.model_sha256 else '—' }};
runs {{ (c.runs or {}).values()|join(", ") }})</p><pre>{{ c.command }}</pre>
{% endfor %}
{% set missing = page.cells|rejectattr("status", "equalto", "done")|list %}{% if missing %}<h2>Not measured</h2><ul>
{% for c in missing %}<li><b>{{ c.engine }}</b> ({{ c.priority }}): {{ c.why }}{% if c.fix %} To run it:
<code>{{ c.fix }}</code>.{% endif %}</li>{% endfor %}</ul>{% endif %}
<script>
window.addEventListener("load", function () {
  var drawn = 0;
  document.querySelectorAll(".plot svg").forEach(function (svg) {
    var box = svg.getBBox();
    if (box.width > 0 && box.height > 0 && svg.querySelectorAll("path, line, rect").length > 0) { drawn += 1; }
  });
  document.body.setAttribute("data-plots-drawn", String(drawn));
});
</script>
</body></html>
"""


def page_html(page: Mapping[str, Any], compared: Sequence[Mapping[str, Any]] | None = None) -> str:
    import jinja2

    machine = machine_line(page)
    rows = matrix_rows(page)
    first = MATRIX_HEAD.index(next(iter(FEATURES)))
    features = set(range(first, first + len(FEATURES)))
    reasons = {}
    for c, row in zip(page["cells"], rows, strict=True):
        feats = (c.get("figures") or {}).get("features") or {}
        for i, name in zip(sorted(features), FEATURES, strict=True):
            reasons[f"{i}/{row[0]}/{row[1]}"] = (feats.get(name) or {}).get("reason", "")
    env = jinja2.Environment(autoescape=True)
    html = env.from_string(_TEMPLATE).render(page=page, machine=machine, head=MATRIX_HEAD, rows=rows,
                                             features=features, reasons=reasons, plots=plots(page),
                                             compared=compared or [], random_note=RANDOM_NOTE)
    return redact(html)
