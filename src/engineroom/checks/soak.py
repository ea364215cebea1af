"""``verify --suite soak``: a long session against the server, turn by turn, judged on what drifts.

Two modes (``--mode``):

- ``fresh``: sessions of five varied turns, each session a new conversation (salted, so no
  session is served from another's prefix cache): a short checklist (max 220 tokens), a repo
  question with tools (320), a 12K-char grep output fed back as the tool's result (700), a parser
  to write and test (900), arithmetic with thinking on (2000).
- ``continuous``: each session one growing debugging conversation with 3 tools; synthetic tool
  outputs (20K chars of code, 24K of code, 24K of grep, 32K of pytest log) are attached to the
  model's real tool-call ids (a call is inserted when the model made none), ~22-25K tokens by
  turn 5 (max 350 / 350 / 400 / 500 / 1500). The only detector of accumulated-context OOM.

Sizes scale from the context the server reports (never beyond 0.8 of it, outputs included),
with characters per token measured by the engine's tokenizer where it has one; ``--fast`` takes
small token budgets and a quarter of the attachments (CPU models). The run is bounded by
``--turns`` and/or ``--minutes`` (the default: the mode's sessions, at most 30 minutes).

Each turn is a record: status, wall, TTFT, prompt / completion tokens, the arrival of every text
chunk (``arrivals_us``, delta-encoded microseconds after the send, and ``end_us``: bench's raw
encoding, ``records.encoding``), the answer's check (``ok``, ``error``,
``silent_empty``, ``empty``, ``markup``, ``degenerate``, plus whether it holds what the turn asked
for), and memory from the ``MemoryProbe`` the caller hands in: VRAM through NVML on a GPU, else
the engine's process-tree USS (the managed engine's, or for a ``--url`` server on this machine the
process listening on its port), else the engine's own report; which one is recorded.

The verdict (``judge``), after the spec (validation.md section 3), thresholds in ``RULES``:

- FAIL: any turn with a non-200 answer or a stream error; memory growth > 200 MiB over the
  baseline (on a GPU, the engine's host USS as well when its pid is known: a prompt cache kept in
  RAM never shows in VRAM); median decode of the last (up to 5) sessions < 80% of the first;
  silent-empty turns (200, >= 1 s, no token) >= 50%.
- WARN: silent-empty turns 1-49%; median TTFT of the last sessions > 1.5x the first (and > 50 ms
  more: millisecond TTFTs are noise); any turn > 30 s; memory oscillation > 500 MiB after the
  baseline; memory climbing > 16 MiB a session over the (>= 3) session ends after the baseline (a
  leak still under the FAIL line); tool-call markup left in content; the share of good answers
  falling by >= 40 points from the first sessions to the last.
- INCONCLUSIVE (counted as failed, with its reason): no memory source, no error-free session to
  take the baseline from (baseline = memory at the end of the first error-free session), or no
  session after it.

Decode tokens/s is never stored: the verdict recomputes it from the arrivals (``turn_decode_tps``:
tokens / (wall - TTFT) by ``records.statistics.decode_rate``, only when that window is >= 100 ms);
a record stored before arrivals were kept is read by the ``decode_tps`` it holds.

Where it lives: ``soakrules`` (bounds, ``RULES``, ``SoakOptions``, ``MemoryProbe``), ``soakprompts``
(what is sent: tools, steps, synthetic attachments, each turn's expectation), ``soakdriver`` (the
plan, each turn's check and record, the sessions), ``soakverdict`` (``judge``, ``turn_decode_tps``);
this module runs it (``run_soak``) and re-exports them.

The suite returns one ``CheckResult`` (``soak_fresh`` / ``soak_continuous``): PASS for PASS and
WARN, FAIL for FAIL and INCONCLUSIVE; the reason starts with the verdict; ``details`` hold the
verdict, every rule's outcome and measure, the memory summary and every turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engineroom.checks.context import Ctx
from engineroom.checks.smoke import CheckResult, Status
from engineroom.checks.soakdriver import Plan, SoakRun, judge_turn, make_plan
from engineroom.checks.soakprompts import EXPECT, SOAK_TOOLS, code_text, grep_text, pytest_text
from engineroom.checks.soakrules import (
    BUDGETS,
    DEFAULT_MINUTES,
    FAST_BUDGETS,
    MIN_CTX,
    MODES,
    RULES,
    SESSIONS,
    STEPS,
    VERDICTS,
    MemoryProbe,
    SoakOptions,
    soak_options,
)
from engineroom.checks.soakverdict import judge, turn_decode_tps

__all__ = [
    "BUDGETS", "DEFAULT_MINUTES", "EXPECT", "FAST_BUDGETS", "MIN_CTX", "MODES", "RULES", "SESSIONS", "SOAK_TOOLS",
    "STEPS", "VERDICTS", "MemoryProbe", "Plan", "SoakOptions", "code_text", "grep_text", "judge", "judge_turn",
    "make_plan", "pytest_text", "run_soak", "soak_options", "turn_decode_tps",
]


def run_soak(ctx: Ctx, options: SoakOptions, *, memory: MemoryProbe | None = None, memory_note: str = "",
             on_turn: Callable[[dict[str, Any]], None] | None = None) -> CheckResult:
    """Run the soak (``options``) against ``ctx``'s server; one ``CheckResult`` with the verdict."""
    name = f"soak_{options.mode}"
    n_ctx = ctx.info.n_ctx
    if options.mode == "continuous" and not n_ctx:
        return CheckResult(name, "SKIP", "the server reports no context size to scale the growing conversation from",
                           details={"suite": "soak", "verdict": "SKIP"})
    if n_ctx and n_ctx < MIN_CTX:
        return CheckResult(name, "SKIP", f"needs >= {MIN_CTX:,} tokens of context; the server has {n_ctx:,}",
                           details={"suite": "soak", "verdict": "SKIP"})
    t0 = time.perf_counter()
    plan = make_plan(ctx, options)
    ctx.client.take()
    soak = SoakRun(ctx, plan, memory, on_turn)
    soak.run()
    if not soak.stopped_by:
        soak.stopped_by = plan.bound
    verdict = judge(soak.turns, memory.source if memory else None, memory_note=memory_note)
    status: Status = "PASS" if verdict["verdict"] in ("PASS", "WARN") else "FAIL"
    prompt_max = max((t["prompt_tokens"] or 0 for t in soak.turns if isinstance(t.get("prompt_tokens"), int)),
                     default=0)
    details: dict[str, Any] = {
        "suite": "soak", "mode": options.mode, **verdict, "stopped_by": soak.stopped_by, "plan": plan.as_dict(),
        "memory_source": memory.source if memory else None,
        "memory_description": memory.description if memory else (memory_note or "none"),
        "memory_errors": soak.memory_errors[:5], "max_prompt_tokens": prompt_max,
        "turn_records": soak.turns, "exchanges": soak.exchanges,
    }
    if n_ctx:
        details["max_prompt_share_of_ctx"] = round(prompt_max / n_ctx, 3)
    return CheckResult(name, status, f"{verdict['verdict']}: {verdict['reason']}", time.perf_counter() - t0, details)
