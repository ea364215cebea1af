"""Card sections for the longer bench suites and the A/B comparison, recomputed from records.

Everything printed comes from ``bench.suitesummary.summarize_suite`` over the run's raw
records (and ``bench.compare.compare_runs`` for ``--compare``); nothing stored is trusted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engineroom.bench.suitesummary import summarize_suite

__all__ = ["compare_text", "suite_section"]


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _ms(d: Mapping[str, Any] | None, digits: int = 2) -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    text = _f(d["mean"], digits)
    if d.get("std") is not None:
        text += f" ± {_f(d['std'], digits)}"
    if d.get("cv_pct") is not None:
        text += f" ({d['cv_pct']:.1f}%)"
    return text


def _pct(d: Mapping[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if not d or d.get("p50") is None:
        return "n/a"
    values = [d.get(k) for k in ("p50", "p95", "p99")]
    return " / ".join(_f(float(v) * scale if v is not None else None, digits) for v in values)


def _roof(r: Mapping[str, Any]) -> str:
    return f"{r['pct']:.1f}%" if r.get("pct") is not None else "n/a"


def suite_section(records: Sequence[Mapping[str, Any]], cond: Mapping[str, Any],
                  run: Mapping[str, Any] | None = None) -> list[str]:
    s = summarize_suite(records, cond)
    bench = cond.get("bench") if isinstance(cond.get("bench"), Mapping) else {}
    assert isinstance(bench, Mapping)
    kind = s["kind"]
    valid = "all integrity checks passed" if s["valid"] else "a check below failed; the result is kept and marked"
    lines = [f"## Bench suite: {s['suite']}", "", f"Status: **{s['status']}** ({valid}).", ""]
    if bench.get("about"):
        lines += [f"_{bench['about']}_", ""]
    if kind == "concurrency":
        lines += ["| streams | rounds kept | aggregate tok/s mean ± std (CV%) | per-stream decode median | "
                  "TTFT from schedule s p50 / p95 / p99 | inter-token ms p50 / p95 / p99 | send lag ms p50 / p99 | "
                  "errors / silent | roofline % |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, g in s["groups"].items():
            lag = g.get("scheduled_lag_ms") or {}
            lines.append(f"| {name} | {len(g.get('rounds') or [])} | {_ms(g.get('aggregate_tps'))} | "
                         f"{_f(g.get('per_stream_decode_median'))} | {_pct(g.get('ttft_from_schedule_s'), 1, 3)} | "
                         f"{_pct(g['inter_token_ms'])} | {_f(lag.get('p50'), 1)} / {_f(lag.get('p99'), 1)} | "
                         f"{g.get('errors', 0)} / {g.get('silent', 0)} | {_roof(g['roofline'])} |")
    else:
        lines += ["| group | kept / requests (discarded) | prompt tokens | TTFT s | prefill tok/s (client) | "
                  "engine prompt tok/s | decode tok/s mean ± std (CV%) | inter-token ms p50 / p95 / p99 | "
                  "roofline % |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, g in s["groups"].items():
            lines.append(f"| {name} | {g['n_kept']} / {g['n_requests']} ({g['n_discarded']}) | "
                         f"{_f(g['prompt_tokens'].get('mean'), 0)} | {_ms(g['ttft_s'], 3)} | "
                         f"{_ms(g['prefill_tps'], 1)} | "
                         f"{_ms(g['engine_prompt_tps'], 1)} | {_ms(g['decode_tps'])} | {_pct(g['inter_token_ms'])} | "
                         f"{_roof(g['roofline'])} |")
    lines.append("")
    lines += ["Integrity checklist:", ""]
    for c in s["integrity"]:
        mark = {"PASS": "PASS", "FAIL": "⚠ FAIL", "SKIP": "SKIP"}.get(c["status"], c["status"])
        lines.append(f"- {mark} {c['name']}: {c['detail']}.")
    lines.append("")
    notes: list[str] = []
    for name, g in s["groups"].items():
        rz = g["reasoning"]
        if rz["requests_with_reasoning"]:
            notes.append(f"{name}: reasoning in {rz['requests_with_reasoning']} request(s): "
                         f"{rz['reasoning_chunks']} reasoning / {rz['content_chunks']} content token chunks; "
                         f"time to first token {_ms(rz['ttft_s'], 3)} s, to first content token "
                         f"{_ms(rz['first_content_s'], 3)} s; thinking used the whole budget in "
                         f"{rz['thinking_exhausted']} (left out of the figures)")
        roof = g["roofline"]
        if roof.get("pct") is not None:
            notes.append(f"{name}: roofline {roof['pct']:.1f}% of {roof['limit_tps']:,.0f} tok/s "
                         f"({roof['bytes_per_token'] / 2**20:,.1f} MiB read per token at depth {roof['depth']:,.0f}"
                         + (f", {roof['streams']} streams" if roof.get("streams", 1) > 1 else "") + ")")
    basis = cond.get("roofline") if isinstance(cond.get("roofline"), Mapping) else {}
    assert isinstance(basis, Mapping)
    if basis.get("not_available"):
        notes.append(f"Roofline n/a: {basis['not_available']}")
    elif basis:
        notes.append(f"Roofline: {basis.get('formula')}; {basis.get('quant')} weights "
                     f"{basis.get('weights_bytes', 0) / 2**20:,.1f} MiB/token, KV {basis.get('kv_dtype')}; bandwidth "
                     f"{basis.get('bandwidth_gbs')} GB/s ({basis.get('bandwidth_source')})")
    spec = s["speculative"]
    if spec.get("skip"):
        notes.append(f"Speculative decoding: SKIP: {spec['skip']}")
    else:
        notes.append(
            f"Speculative decoding: drafted {spec['drafted']}, accepted {spec['accepted']} "
            f"(acceptance {_f(spec['acceptance_rate'], 3)}, fire rate {_f(spec['fire_rate'], 2)}) from the responses; "
            f"engine counters drafted {_f(spec['counters_drafted'], 0)}, accepted {_f(spec['counters_accepted'], 0)}"
            f", mean acceptance length {_f(spec['mean_acceptance_length'], 2)}; "
            + ("records and counters agree" if spec["agrees"] else "records and counters differ"
               if spec["agrees"] is False else "not cross-checked"))
    sizes = sorted({x for g in s["groups"].values() for x in g["sized_by"]})
    if sizes:
        notes.append("Prompts sized by: " + ", ".join(sizes) + "; every haystack salted afresh")
    sampler = bench.get("sampler")
    if isinstance(sampler, Mapping):
        notes.append("Sampler sent on every request: " + ", ".join(f"{k} {v}" for k, v in sampler.items()))
    if bench.get("streams"):
        notes.append(f"Streams: {bench['streams']} ({bench.get('streams_source')})")
    lines += [f"- {n}." for n in notes] + [""]
    return lines


def compare_text(result: Mapping[str, Any]) -> str:
    lines = [f"# engineroom bench --compare {result['run_a']} {result['run_b']}", "",
             "| group | metric | A mean (n) | B mean (n) | delta | noise band (95%) | verdict |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        delta = f"{r['delta']:+.3f}" + (f" ({r['delta_pct']:+.1f}%)" if r["delta_pct"] is not None else "")
        band = "n/a" if r["band"] is None else (f"±{r['band']:.3f}" + (
            f" (±{r['band_pct']:.1f}%)" if r["band_pct"] is not None else ""))
        lines.append(f"| {r['group']} | {r['metric']} | {r['a_mean']:.3f} ({r['n_a']}) | "
                     f"{r['b_mean']:.3f} ({r['n_b']}) | {delta} | {band} | {r['verdict']} |")
    if not result["rows"]:
        lines.append("| (no group measured in both runs) | | | | | | |")
    lines += ["", f"_Noise band: {result['boots_note']}._"]
    if result["unmatched_groups"]:
        lines.append(f"_Measured in one run only: {', '.join(result['unmatched_groups'])}._")
    return "\n".join(lines) + "\n"
