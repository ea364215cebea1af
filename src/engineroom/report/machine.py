"""The run card's sections on the machine under the run: the engine's own counters, memory
predicted vs measured, and the resources sampled during the run (``report.card`` assembles them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engineroom.report.cells import figure_cell, size_cell, text_cell


def counters_section(counted: Mapping[str, Any] | None) -> list[str]:
    """The engine's own counters over the run beside what the stored requests add up to."""
    if not counted:
        return []
    d = counted["delta"]
    parts = []
    if "generated_tokens_total" in d:
        parts.append(f"generated tokens {d['generated_tokens_total']:,.0f} (the requests' usage: "
                     f"{counted['client_completion_tokens']:,})")
    if "prompt_tokens_total" in d:
        cached = d.get("prompt_cached_tokens_total")
        parts.append(f"prompt tokens computed {d['prompt_tokens_total']:,.0f}"
                     + (f" + {cached:,.0f} taken from its prefix cache" if cached else "")
                     + f" (the requests' usage: {counted['client_prompt_tokens']:,})")
    if d.get("spec_drafted_tokens_total"):
        parts.append(f"speculative tokens drafted {d['spec_drafted_tokens_total']:,.0f}, accepted "
                     f"{d.get('spec_accepted_tokens_total', 0):,.0f}")
    if not parts:
        return []
    return [f"Engine counters over the run ({counted['requests']} requests, its /metrics before and after): "
            + "; ".join(parts) + ".", ""]


def memory_section(memory: Any) -> list[str]:
    """fit's prediction for the launched configuration beside what the engine reported."""
    if not isinstance(memory, Mapping) or not memory.get("rows"):
        return []
    lines = ["## Memory: predicted vs measured", "",
             f"Predicted by engineroom's fit for {memory.get('predicted_for') or 'this machine'}; measured: "
             f"{memory.get('measured_source') or 'nothing reported'}. Error = (predicted − measured) / measured.", "",
             "| component | predicted | measured | error |", "|---|---:|---:|---:|"]
    for r in memory["rows"]:
        err = r.get("error_pct")
        lines.append(f"| {text_cell(r.get('component', '?'))} | {size_cell(r.get('predicted_bytes')) or '—'} | "
                     f"{size_cell(r.get('measured_bytes')) or '—'} | {'—' if err is None else f'{err:+.2f}%'} |")
    return lines + [""]


_RESOURCE_ROWS = (("engine_uss_bytes", "engine memory, unique (USS)"),
                  ("engine_rss_bytes", "engine memory, resident (RSS)"),
                  ("host_ram_used_bytes", "host RAM used"), ("host_cpu_pct", "host CPU %"))


def resources_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """GPU memory per device, the engine's memory and the host's, idle / peak / after the run."""
    found = [r["payload"] for r in records if r.get("kind") == "resources" and isinstance(r.get("payload"), Mapping)]
    if not found:
        return []
    rec = found[-1]
    summary = rec.get("summary") or {}
    samples = rec.get("samples") or []
    gpu_keys = sorted(k for k in summary if k.startswith("gpu") and k.endswith("_used_bytes"))
    rows = [(f"GPU {k[3:-11]} memory used (NVML)", k) for k in gpu_keys]
    rows += [(label, key) for key, label in _RESOURCE_ROWS if key in summary]
    lines = ["## Resources during the run", "",
             f"{len(samples)} samples every {figure_cell(rec.get('interval_s'), 1)} s; "
             f"engine: {rec.get('engine_source') or '?'}; "
             + ("GPU: NVML." if gpu_keys else "GPU: not measured (no NVML here)."), "",
             "| quantity | idle (before) | peak | after |", "|---|---:|---:|---:|"]
    for label, key in rows:
        d = summary[key]
        show = (lambda v: f"{v:.0f}") if key.endswith("_pct") else size_cell
        lines.append(f"| {label} | {show(d.get('idle'))} | {show(d.get('peak'))} | {show(d.get('after'))} |")
    cpu = summary.get("engine_cpu_s")
    if isinstance(cpu, Mapping) and cpu.get("wall_s"):
        lines += ["", f"Engine CPU: {cpu['total']:.1f} s over {cpu['wall_s']:.1f} s "
                      f"({cpu['cores']:.2f} cores busy on average)."]
    return lines + [""]
