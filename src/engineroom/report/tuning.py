"""The tune table (``engineroom tune``): each knob's trial against the incumbent, and the result against the pick."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["tune_section", "tune_text"]

_OBJECTIVE = {"decode_tps": "single-stream decode", "aggregate_tps": "aggregate decode over every slot"}


def _value(v: Any) -> str:
    return " ".join(str(x) for x in v) if isinstance(v, list | tuple) else str(v)


def _pct(x: float | None, sign: bool = True) -> str:
    return "n/a" if x is None else (f"{x:+.1f}%" if sign else f"±{x:.1f}%")


def tune_text(result: Mapping[str, Any]) -> str:
    """``result``: TuneOutcome as a mapping (``dataclasses.asdict``)."""
    pick = result.get("pick") or {}
    objective = str(result.get("objective", ""))
    weights = " on random weights" if result.get("random_weights") else ""
    lines = [f"# engineroom tune {result.get('model', '')} --priority {result.get('priority', '')}{weights}", "",
             f"objective: {_OBJECTIVE.get(objective, objective)} (tok/s); a change is kept only when its gain is "
             "real: beyond the noise band, in every boot pairing, beyond the boot-to-boot variation",
             f"start: the plan's pick, {pick.get('engine')} {(pick.get('weights') or {}).get('quant')} KV "
             f"{pick.get('kv_dtype')}, {pick.get('ctx') or 0:,} tokens x {pick.get('parallel') or 1}", "",
             "| trial | setting | incumbent tok/s | trial tok/s | gain | noise band | outcome |",
             "|---:|---|---:|---:|---:|---:|---|"]
    for i, t in enumerate(result.get("trials") or [], 1):
        a = "n/a" if t.get("a_mean") is None else f"{t['a_mean']:.1f}"
        b = "n/a" if t.get("b_mean") is None else f"{t['b_mean']:.1f}"
        lines.append(f"| {i} | {t.get('knob')} = {_value(t.get('value'))} | {a} | {b} | {_pct(t.get('gain_pct'))} | "
                     f"{_pct(t.get('band_pct'), sign=False)} | {t.get('outcome')}: {t.get('why')} |")
    if not result.get("trials"):
        lines.append("| - | (no trial ran within the budget) | | | | | |")
    for left in result.get("untried") or []:
        lines.append(f"not tried (budget): {left}")
    for held in [*(result.get("held") or []), *(result.get("left_out") or [])]:
        lines.append(f"left out: {held}")
    lines.append("")
    changes = result.get("changes") or {}
    gain = result.get("gain")
    if not changes:
        lines.append("result: the plan's pick stays; no setting tried gave a real gain")
    else:
        lines.append("result: " + ", ".join(f"{k} = {_value(v)}" for k, v in changes.items()))
        if gain:
            lines.append(f"against the pick: {gain.get('b_mean') or 0:.1f} vs {gain.get('a_mean') or 0:.1f} tok/s, "
                         f"{_pct(gain.get('gain_pct'))} (noise band {_pct(gain.get('band_pct'), sign=False)}; "
                         f"{gain.get('measured')}, {gain.get('verdict')})")
        if result.get("plan_file"):
            lines.append(f"launch it: engineroom up --from-plan {result['plan_file']}")
    lines.append(f"run {result.get('run_id')}: {result.get('seconds', 0):.0f} s of a "
                 f"{result.get('budget_s', 0):.0f} s budget")
    if result.get("random_weights"):
        lines.append("random weights: speed and memory are the architecture's; answers are noise (not measured)")
    return "\n".join(lines) + "\n"


def tune_section(conditions: Mapping[str, Any], summary: Mapping[str, Any] | None, run_id: Any) -> list[str]:
    """The card's section for a stored ``tune`` run (``engineroom report RUN``): the same table as the
    command printed, from what the run stored (its conditions' ``tune`` and its summary)."""
    s = summary if isinstance(summary, Mapping) else {}
    result = {**conditions, **s, "run_id": run_id, "left_out": conditions.get("left_out") or [],
              "held": conditions.get("held") or [], "budget_s": conditions.get("budget_s", 0),
              "random_weights": conditions.get("random_weights", False)}
    body = tune_text(result).splitlines()[1:]          # the card has its own title
    if not s.get("trials") and not s:
        body.append("(the run stored no trials: it ended before its first)")
    return ["## Tune", *body, ""]
