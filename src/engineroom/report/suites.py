"""Card sections for the longer bench suites and the A/B comparison, recomputed from records.

Everything printed comes from ``bench.suites.summary.summarize_suite`` over the run's raw
records (and ``bench.compare.compare_runs`` for ``engineroom compare``); nothing stored is trusted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engineroom.bench.suites.summary import summarize_suite
from engineroom.report.cells import integrity_lines

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
    if kind == "agentic":         # the per-turn curve is its table
        lines += _agentic_lines(s["agentic"], bench, cond.get("n_ctx"))
    elif kind == "sweep":
        lines += _sweep_lines(s["sweep"]) + ["Per cell:", ""]
    elif kind == "rate":
        lines += _rate_lines(s["rate"], bench)
    if kind in ("concurrency", "sweep"):
        lines += ["| streams | rounds kept | aggregate tok/s mean ± std (CV%) | all streams decoding tok/s | "
                  "per-stream decode median | "
                  "TTFT from schedule s p50 / p95 / p99 | inter-token ms p50 / p95 / p99 | send lag ms p50 / p99 | "
                  "errors / silent | roofline % |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, g in s["groups"].items():
            lag = g.get("scheduled_lag_ms") or {}
            lines.append(f"| {name} | {len(g.get('rounds') or [])} | {_ms(g.get('aggregate_tps'))} | "
                         f"{_ms(g.get('all_decoding_tps') or {})} | "
                         f"{_f(g.get('per_stream_decode_median'))} | {_pct(g.get('ttft_from_schedule_s'), 1, 3)} | "
                         f"{_pct(g['inter_token_ms'])} | {_f(lag.get('p50'), 1)} / {_f(lag.get('p99'), 1)} | "
                         f"{g.get('errors', 0)} / {g.get('silent', 0)} | {_roof(g['roofline'])} |")
    elif kind != "agentic":
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
    lines += integrity_lines(s["integrity"], s.get("failed_requests") or [])
    notes: list[str] = []
    for name, g in s["groups"].items():
        rz = g["reasoning"]
        if rz["requests_with_reasoning"]:
            notes.append(f"{name}: reasoning in {rz['requests_with_reasoning']} request(s): "
                         f"{rz['reasoning_chunks']} reasoning / {rz['content_chunks']} content token chunks; "
                         f"time to first token {_ms(rz['ttft_s'], 3)} s, to first content token "
                         f"{_ms(rz['first_content_s'], 3)} s; thinking used the whole budget in "
                         f"{rz['thinking_exhausted']} (left out of the figures)")
        if g.get("all_decoding_why"):
            missing = len(g.get("rounds") or []) - g["all_decoding_tps"]["n"]
            notes.append(f"{name}: all streams decoding n/a in {missing} round(s): {g['all_decoding_why']}")
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
                     f"{basis.get('weights_bytes', 0) / 2**20:,.1f} MiB/token, KV {basis.get('kv_dtype')}"
                     + (f" ({basis['kv_source']})" if basis.get("kv_source") else "") + "; bandwidth "
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
    body = bench.get("full_length_body")
    if isinstance(body, Mapping) and body:
        sent = ", ".join(f"{k}: on" if v is True else f"{k} = {v}" for k, v in body.items())
        notes.append(f"Full length: {sent} sent with every request, so each generates exactly max_tokens"
                     + (f" ({bench['full_length_reason']})" if bench.get("full_length_reason") else ""))
    elif "full_length_body" in bench:
        notes.append(f"Full length: off ({bench.get('full_length_reason') or 'the engine declares no way to ask'}); "
                     "a request may stop at end-of-sequence, and one under a quarter of max_tokens is left out")
    sampler = bench.get("sampler")
    if isinstance(sampler, Mapping):
        notes.append("Sampler sent on every request: " + ", ".join(f"{k} {v}" for k, v in sampler.items()))
    if bench.get("streams"):
        notes.append(f"Streams: {bench['streams']} ({bench.get('streams_source')})")
    lines += [f"- {n}." for n in notes] + [""]
    return lines


def _agentic_lines(a: Mapping[str, Any], bench: Mapping[str, Any], n_ctx: Any) -> list[str]:
    t = a["totals"]
    scale = bench.get("scale")
    lines = [f"Agentic replay: {t['sessions']} session(s) of up to {bench.get('turns')} turns "
             f"({len(bench.get('tools') or [])} tools offered, tool_choice {bench.get('tool_choice')}); tool outputs "
             f"scaled x{_f(scale, 3)} to fit {int(float(bench.get('context_fill') or 0) * 100)}% of the "
             f"{_f(n_ctx)}-token context per slot (toward {_f(bench.get('target_tokens'), 0)}).", "",
             "| turn | sessions | context tokens | cached tokens (of the previous prompt) | new tokens | TTFT s | "
             "prefill tok/s (new tokens) | engine prompt tok/s | decode tok/s | tool calls made |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in a["curve"]:
        reused = f" ({p['reused_pct']:.0f}%)" if p.get("reused_pct") is not None else ""
        lines.append(f"| {p['turn']} | {p['n']} | {_f(p['context_tokens'], 0)} | {_f(p['cached_tokens'], 0)}{reused} | "
                     f"{_f(p['new_tokens'], 0)} | {_f(p['ttft_s'], 3)} | {_f(p['prefill_new_tps'], 1)} | "
                     f"{_f(p['engine_prompt_tps'], 1)} | {_f(p['decode_tps'])} | {p['tool_calls']} / {p['n']} |")
    v = a["verdict"]
    lines += ["", f"Totals: {t['requests']} turns sent, {t['prompt_tokens']:,} prompt tokens of which "
                  f"{t['cached_tokens']:,} came from the prefix cache ({t['computed_tokens']:,} computed), "
                  f"{t['completion_tokens']:,} generated; TTFT {t['ttft_s']:.1f} s and wall {t['wall_s']:.1f} s in "
                  f"all; largest context {t['max_context_tokens']:,} tokens; the model called a tool on "
                  f"{t['tool_calls']} of {t['requests']} turns (the replay continues with the recorded call either "
                  "way).",
              f"TTFT growth: **{v.get('verdict') or 'n/a'}** ({v.get('why')}); prefix cache {v.get('cache')}."]
    for stop in a.get("stops") or []:
        lines.append(f"Session {int(stop.get('session', 0)) + 1} stopped before turn {stop.get('turn')}: "
                     f"{stop.get('why')} ({stop.get('previous_prompt_tokens')} + {stop.get('adding_tokens')} tokens, "
                     f"context {stop.get('n_ctx')}).")
    return lines + [""]


def _sweep_lines(w: Mapping[str, Any]) -> list[str]:
    lines = ["| prompt tokens | streams | rounds | aggregate tok/s (median) | per-stream decode tok/s | "
             "TTFT from schedule ms p50 / p95 | TPOT ms p95 | errors / silent |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in w["cells"]:
        lines.append(f"| {c['ctx']:,} | {c['streams']} | {c['rounds']} | {_f(c['aggregate_tps'])} | "
                     f"{_f(c['per_stream_tps'])} | {_f(c['ttft_p50_ms'], 0)} / {_f(c['ttft_p95_ms'], 0)} | "
                     f"{_f(c['tpot_p95_ms'], 1)} | {c['errors']} / {c['silent']} |")
    lines.append("")
    for ctx, k in w["knees"].items():
        lines.append(f"- Knee at {int(ctx):,}-token prompts: N={k.get('knee') or 'n/a'} ({k.get('reason')}).")
    rec = w["recommended"]
    lines.append(f"- **Recommended slot count: {rec.get('slots') or 'n/a'}** ({rec.get('reason')}).")
    lines.append(f"- Knee rule: an added stream must add {w['knee_gain_pct']:g}% of one stream's rate; SLOs TTFT p95 "
                 f"<= {_f(w.get('slo_ttft_ms'), 0)} ms, TPOT p95 <= {_f(w.get('slo_itl_ms'), 1)} ms.")
    budget = f"- Budget: {w['elapsed_s']:.0f} s of {w['budget_s']:g} s used"
    if w["skipped"]:
        cells = ", ".join(f"{int(d['ctx']):,} tokens N={d['streams']} (estimated {d['estimate_s']:.0f} s, "
                          f"{max(0.0, d['budget_s'] - d['elapsed_s']):.0f} s left)" for d in w["skipped"])
        budget += f"; stopped adding points where the budget would have been exceeded: {cells}"
    return lines + [budget + ".", ""]


def _rate_lines(g: Mapping[str, Any], bench: Mapping[str, Any]) -> list[str]:
    limit = (f"{bench.get('requests')} requests" if bench.get("requests") else "") + (
        " or " if bench.get("requests") and bench.get("duration_s") else "") + (
        f"{bench.get('duration_s'):g} s" if bench.get("duration_s") else "")
    return [f"Request rate: Poisson arrivals at {_f(g.get('offered_rate'))} req/s (seed {bench.get('arrival_seed')}, "
            f"{limit}; {bench.get('scheduled')} scheduled over {_f(bench.get('schedule_span_s'), 1)} s, sent at "
            f"{_f(g.get('sent_rate'))} req/s), {bench.get('prompt_tokens')}-token salted prompts, up to "
            f"{bench.get('max_inflight')} senders; every latency counted from the scheduled send.", "",
            "| requests | completed | good (all SLOs) | errors / silent | goodput req/s | throughput req/s | "
            "output tok/s | TTFT ms p50 / p95 / p99 | TPOT ms p50 / p95 / p99 | e2e s p50 / p95 / p99 | "
            "send lag ms p50 / p99 |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {g['requests']} | {g['completed']} | {g['good']} | {g['errors']} / {g['silent']} | "
            f"**{_f(g['goodput_rps'], 3)}** | {_f(g['throughput_rps'], 3)} | {_f(g['output_tps'])} | "
            f"{_pct(g['ttft_ms'], 1, 0)} | {_pct(g['tpot_ms'], 1, 1)} | {_pct(g['e2e_s'], 1, 2)} | "
            f"{_f(g['send_lag_ms'].get('p50'), 1)} / {_f(g['send_lag_ms'].get('p99'), 1)} |", "",
            f"SLOs: TTFT <= {_f(g['slo_ttft_ms'], 0)} ms (missed by {g['missed_ttft']}), TPOT <= "
            f"{_f(g['slo_itl_ms'], 1)} ms (missed by {g['missed_itl']}); goodput = requests meeting both / "
            f"{g['wall_s']:.1f} s (schedule start to the last end); per-request inter-token p95, ms p50 / p95: "
            f"{_f(g['itl_p95_ms'].get('p50'), 1)} / {_f(g['itl_p95_ms'].get('p95'), 1)}.", ""]


def compare_text(result: Mapping[str, Any]) -> str:
    lines = [f"# engineroom compare {result['run_a']} {result['run_b']}", "",
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
