"""The card's sections for the verify suites that are one long check: soak and toolstream.

Recomputed from the stored records: the soak's ``check`` record (verdict, rules, memory summary)
and its ``soak_turn`` records (one per turn, stored as each ended, so an interrupted soak still
shows its turns); the toolstream check's per-try records. The thresholds printed come from the
records, which copy them from ``checks.soak.RULES`` (the card cannot drift from the code).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engineroom import units
from engineroom.checks.soak import turn_decode_tps
from engineroom.report.cells import text_cell

MAX_TURN_ROWS = 120       # a 100-turn soak fits whole; a longer one shows its first and last turns
MAX_TRY_ROWS = 20


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def _threshold(t: Any) -> str:
    if not isinstance(t, Mapping):
        return ""
    parts = []
    for key, value in t.items():
        if isinstance(value, (int, float)) and key.endswith(("bytes", "bytes_per_session")):
            parts.append(f"{key}: {units.mib(value, 0)}")
        elif isinstance(value, float) and ("share" in key or "ratio" in key or "points" in key):
            parts.append(f"{key}: {value:g}")
        else:
            parts.append(f"{key}: {value}")
    return "; ".join(parts)


def _checks(records: Sequence[Mapping[str, Any]], suite: str) -> list[Mapping[str, Any]]:
    out = []
    for rec in records:
        p = rec.get("payload") or {}
        if rec.get("kind") == "check" and isinstance(p, Mapping) and (p.get("details") or {}).get("suite") == suite:
            out.append(p)
    return out


def _turn_rows(turns: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| turn | session | kind | prompt tok | completion tok | TTFT s | decode tok/s | wall s | check "
             "| memory |", "|---:|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    shown: Sequence[Mapping[str, Any]] = turns
    cut = 0
    if len(turns) > MAX_TURN_ROWS:
        half = MAX_TURN_ROWS // 2
        shown, cut = [*turns[:half], *turns[-half:]], len(turns) - MAX_TURN_ROWS
    for i, t in enumerate(shown):
        if cut and i == MAX_TURN_ROWS // 2:
            lines.append(f"| ... | | {cut} turns not shown (all in the run's soak_turn records) | | | | | | | |")
        check = t.get("check") or {}
        status = str(check.get("status") or "?")
        if status == "ok" and check.get("expected") is False:
            status = "ok (not what was asked)"
        elif status not in ("ok",) and check.get("reason"):
            status = f"{status}: {check['reason']}"
        mem = t.get("memory") or {}
        memory = units.mib(mem.get("bytes"), 1, "n/a")
        if isinstance(mem.get("peak_bytes"), int) and mem["peak_bytes"] > (mem.get("bytes") or 0):
            memory += f" (peak {units.mib(mem['peak_bytes'], 1)})"
        lines.append(f"| {t.get('turn')} | {t.get('session')} | {text_cell(t.get('kind'))} | "
                     f"{_num(t.get('prompt_tokens'), 'd')} | {_num(t.get('completion_tokens'), 'd')} | "
                     f"{_num(t.get('ttft_s'), '.3f')} | {_num(turn_decode_tps(t), '.1f')} | "
                     f"{_num(t.get('wall_s'), '.2f')} | {text_cell(status)[:120]} | {memory} |")
    return lines


def soak_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """``## Soak``: the verdict, every rule, the memory source and curve, and every turn."""
    checks = _checks(records, "soak")
    turns_by_run = [r.get("payload") or {} for r in records if r.get("kind") == "soak_turn"]
    if not checks:
        if not turns_by_run:
            return []
        # the run ended (Ctrl-C, a crash) before the verdict: the turns it stored, judged by nobody
        return ["## Soak (not finished)", "", f"The run ended after {len(turns_by_run)} turns, before the soak's "
                "verdict; the turns it stored:", "", *_turn_rows(turns_by_run), ""]
    lines: list[str] = []
    for p in checks:
        d = p.get("details") or {}
        verdict = d.get("verdict") or p.get("status")
        lines += [f"## Soak ({d.get('mode', '?')})", "",
                  f"**{verdict}**: {text_cell(str(p.get('reason') or '').removeprefix(f'{verdict}: '))}", ""]
        if verdict == "SKIP":
            continue
        plan = d.get("plan") or {}
        if verdict == "INCONCLUSIVE":
            lines += ["INCONCLUSIVE counts as failed: the soak could not judge what it exists to judge.", ""]
        scaled = (f"attachments {', '.join(f'{c:,}' for c in plan.get('attachment_chars') or [])} chars"
                  + (" (scaled to the context)" if plan.get("scaled") else ""))
        lines += [f"- Bound: {text_cell(plan.get('bound') or '?')}; "
                  f"stopped by: {text_cell(d.get('stopped_by') or '?')}.",
                  f"- Ran {d.get('turns', 0)} turns over {d.get('sessions', 0)} sessions "
                  f"({d.get('complete_sessions', 0)} complete); deepest prompt {d.get('max_prompt_tokens', 0):,} "
                  "tokens" + (f" ({d['max_prompt_share_of_ctx']:.0%} of the {plan.get('n_ctx'):,}-token context)"
                              if d.get("max_prompt_share_of_ctx") and plan.get("n_ctx") else "") + ".",
                  f"- Per-turn token budgets {plan.get('budgets')}; {scaled}; chars per token "
                  f"{plan.get('chars_per_token')} from {text_cell(plan.get('calibration') or '?')}.",
                  f"- Good answers (the check passed and held what the turn asked for): {d.get('good_answers', 0)}"
                  f"/{d.get('turns', 0)}."]
        mem = d.get("memory") or {}
        lines.append(f"- Memory: {text_cell(d.get('memory_description') or 'none')}"
                     + (f"; baseline {units.mib(mem.get('baseline_bytes'), 1)} at the end of session "
                        f"{mem.get('baseline_session')}, last {units.mib(mem.get('last_bytes'), 1)}, max "
                        f"{units.mib(mem.get('max_bytes'), 1)}, slope "
                        f"{units.mib(mem.get('slope_bytes_per_session'), 1)} a session"
                        if isinstance(mem.get("baseline_bytes"), int) else "") + ".")
        lines += ["", "| rule | outcome | measured | threshold |", "|---|---|---|---|"]
        for r in d.get("rules") or []:
            lines.append(f"| {text_cell(r.get('rule'))} | {r.get('outcome')} | {text_cell(r.get('reason'))} | "
                         f"{text_cell(_threshold(r.get('threshold')))} |")
        turns = [t for t in turns_by_run if t] or list(d.get("turn_records") or [])
        if turns:
            lines += ["", "Per turn (client clock; decode = completion tokens / (wall - TTFT), n/a when that window "
                          "is under 100 ms):", ""]
            lines += _turn_rows(turns)
        lines.append("")
    return lines


def toolstream_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """``## Stream tool-call probe``: PASS / DROP counts, how the drops happened, the tries that failed."""
    checks = _checks(records, "toolstream")
    lines: list[str] = []
    for p in checks:
        d = p.get("details") or {}
        if p.get("status") == "SKIP":
            lines += ["## Stream tool-call probe", "", f"SKIP: {text_cell(p.get('reason'))}", ""]
            continue
        tries = d.get("tries") or 0
        kinds = ", ".join(f"{n} {k}" for k, n in (d.get("drop_kinds") or {}).items())
        by = d.get("by_tool_choice") or {}
        lines += ["## Stream tool-call probe", "",
                  f"**{d.get('pass', 0)}/{tries} PASS, {d.get('drop', 0)} DROP** (drop rate "
                  f"{(d.get('drop_rate') or 0):.0%}{': ' + kinds if kinds else ''})"
                  + (f", {d['error']} ERROR (non-200)" if d.get("error") else "") + ".", "",
                  "- By tool_choice: " + ", ".join(f"{c} {v.get('pass', 0)}/{v.get('tries', 0)}"
                                                   for c, v in by.items()) + ".",
                  f"- Called the tool the prompt asks for: {d.get('right_tool', 0)}/{tries} (the model's choice; not "
                  "part of PASS).", f"- Thinking: {text_cell(d.get('thinking') or '?')}."]
        if d.get("forced"):
            lines.append(f"- **Format forced, not the model's skill**: {text_cell(d['forced'])}.")
        bad = [t for t in d.get("try_records") or [] if t.get("outcome") != "PASS"]
        if bad:
            lines += ["", "| try | prompt | tool_choice | outcome | reason |", "|---:|---|---|---|---|"]
            for t in bad[:MAX_TRY_ROWS]:
                lines.append(f"| {t.get('try')} | {text_cell(t.get('prompt'))} | {t.get('tool_choice')} | "
                             f"{t.get('outcome')} | {text_cell(t.get('reason'))[:160]} |")
            if len(bad) > MAX_TRY_ROWS:
                lines.append(f"| ... | {len(bad) - MAX_TRY_ROWS} more | | | |")
        lines.append("")
    return lines
