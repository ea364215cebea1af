"""The soak's driver (``checks.soak``): the plan (turns, budgets, attachment sizes), each turn's check, the sessions."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engineroom.checks.context import Ctx
from engineroom.checks.fullbase import TOOL_MARKUP, repeated_run
from engineroom.checks.soakprompts import (
    CONTINUOUS_CALLS,
    CONTINUOUS_STEPS,
    CONTINUOUS_SYSTEM,
    ENTRY_POINT,
    EXPECT,
    FRESH_CALL,
    FRESH_STEPS,
    FRESH_SYSTEM,
    SOAK_TOOLS,
    code_text,
    grep_text,
    pytest_text,
    random_salt,
)
from engineroom.checks.soakrules import (
    BUDGETS,
    CONTINUOUS_CHARS,
    DEFAULT_MINUTES,
    FAST_BUDGETS,
    FAST_DIVISOR,
    FAST_SESSIONS,
    FRESH_GREP_CHARS,
    REQUEST_SECONDS,
    RULES,
    SESSIONS,
    STEPS,
    MemoryProbe,
    SoakOptions,
)
from engineroom.client import StreamResult
from engineroom.records.encoding import encode_arrivals

# -- sizes -------------------------------------------------------------------------------


@dataclass
class Plan:
    """The soak's shape: turns, budgets, attachment sizes, and where each figure came from."""

    mode: str
    max_turns: int | None
    deadline_s: float | None
    budgets: tuple[int, ...]
    attachment_chars: tuple[int, ...]
    chars_per_token: float
    calibration: str
    n_ctx: int | None
    bound: str                           # the sentence saying what bounds the run
    scaled: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "max_turns": self.max_turns, "deadline_s": self.deadline_s,
                "budgets": list(self.budgets), "attachment_chars": list(self.attachment_chars),
                "chars_per_token": round(self.chars_per_token, 3), "calibration": self.calibration,
                "n_ctx": self.n_ctx, "bound": self.bound, "scaled": self.scaled, "steps_per_session": STEPS}


def make_plan(ctx: Ctx, options: SoakOptions) -> Plan:
    """Turns, budgets and attachment sizes for this server (its context), this mode and these bounds."""
    mode = options.mode
    budgets = FAST_BUDGETS[mode] if ctx.fast else BUDGETS[mode]
    sessions = (FAST_SESSIONS if ctx.fast else SESSIONS)[mode]
    if options.turns is None and options.minutes is None:
        max_turns: int | None = sessions * STEPS
        minutes: float | None = DEFAULT_MINUTES
        bound = (f"the {mode} plan: {sessions} sessions x {STEPS} turns{' (--fast)' if ctx.fast else ''}, "
                 f"at most {DEFAULT_MINUTES:g} minutes")
    else:
        max_turns, minutes = options.turns, options.minutes
        bound = " or ".join(p for p in (f"{max_turns} turns" if max_turns else "",
                                         f"{minutes:g} minutes" if minutes else "") if p) + ", whichever comes first"
        if not (max_turns and minutes):
            bound = bound.replace(", whichever comes first", "")
    base: tuple[int, ...] = (FRESH_GREP_CHARS,) if mode == "fresh" else CONTINUOUS_CHARS
    if ctx.fast:
        base = tuple(c // FAST_DIVISOR for c in base)
    rng = random.Random(0)
    sample = code_text(3000, rng, "sample.py") + "\n" + grep_text(2000, rng, "parse")
    counted = ctx.count_tokens(sample) if ctx.count_tokens else None
    if counted:
        cpt, calibration = len(sample) / counted, "the engine's tokenizer on a sample of the attachments"
    else:
        cpt, calibration = 3.0, "an assumed 3 chars a token (code; the engine has no tokenizer endpoint)"
    n_ctx = ctx.info.n_ctx
    chars = base
    scaled = False
    if n_ctx:
        overhead = 700                       # system prompt, tool schemas, user turns, chat template
        room = int(n_ctx * 0.8) - sum(budgets) - overhead     # a session's whole conversation stays in history
        room_chars = max(400, int(room * cpt))
        if sum(base) > room_chars:
            factor = room_chars / sum(base)
            chars = tuple(max(200, int(c * factor)) for c in base)
            scaled = True
    return Plan(mode=mode, max_turns=max_turns, deadline_s=None if minutes is None else minutes * 60.0,
                budgets=budgets, attachment_chars=chars, chars_per_token=cpt, calibration=calibration, n_ctx=n_ctx,
                bound=bound, scaled=scaled)


# -- one turn ----------------------------------------------------------------------------


def _degenerate(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if line := repeated_run(lines):
        return f"the same line 5 times in a row: {line[:40]!r}"
    words = re.findall(r"\w+", text.lower())[:200]
    if len(words) >= 50 and len(set(words)) / len(words) < 0.30:
        return f"{len(set(words))} distinct of the first {len(words)} words"
    return None


def judge_turn(r: StreamResult, expect: Callable[[str], bool] | None) -> dict[str, Any]:
    """The answer's check: ``status`` (ok / error / silent_empty / empty / markup / degenerate), ``reason``,
    and ``expected``: whether the answer holds what the turn asked for (a tool call counts; None: not judged)."""
    tokens = (r.usage or {}).get("completion_tokens")
    text = r.content
    if not r.ok:
        return {"status": "error", "reason": r.error or f"HTTP {r.status}", "expected": None}
    if not text.strip() and not r.reasoning.strip() and not r.tool_calls:
        if not tokens:
            status = "silent_empty" if r.seconds >= RULES["silent_empty"]["min_wall_s"] else "empty"
            return {"status": status, "reason": f"200 after {r.seconds:.1f} s with no token "
                                                f"(finish_reason={r.finish_reason})", "expected": False}
        return {"status": "empty", "reason": f"{tokens} tokens but no text nor tool call "
                                             f"(finish_reason={r.finish_reason})", "expected": False}
    if leak := TOOL_MARKUP.search(text):
        return {"status": "markup", "reason": f"tool-call markup in content ({leak.group(0)!r} at char "
                                              f"{leak.start()})", "expected": False}
    if why := _degenerate(text or r.reasoning):
        return {"status": "degenerate", "reason": why, "expected": False}
    expected = True if r.tool_calls else (expect(text or r.reasoning) if expect is not None else None)
    return {"status": "ok", "reason": "", "expected": expected}



@dataclass
class _Session:
    index: int
    salt: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)
    calls: int = 0


def _assistant(r: StreamResult) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": r.content}
    if r.tool_calls:
        msg["tool_calls"] = [{"id": c.id or f"call_soak_{i}", "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                             for i, c in enumerate(r.tool_calls)]
    return msg


def _attach(s: _Session, answer: dict[str, Any], name: str, args: dict[str, Any], output: str) -> None:
    """Append the model's answer, with ``output`` as the result of its first call (one is inserted when
    it made none); its other calls get a short result, so every call id is answered."""
    calls = answer.get("tool_calls") or []
    if not calls:
        s.calls += 1
        calls = [{"id": f"call_soak_{s.index}_{s.calls}", "type": "function",
                  "function": {"name": name, "arguments": json.dumps(args)}}]
        answer = {**answer, "tool_calls": calls, "inserted_call": True}
    s.messages.append({k: v for k, v in answer.items() if k != "inserted_call"})
    for i, call in enumerate(calls):
        s.messages.append({"role": "tool", "tool_call_id": call["id"], "content": output if i == 0 else "(no output)"})


def _close_calls(s: _Session, answer: dict[str, Any]) -> None:
    """Append the model's answer; calls it made (nothing planned for them) get a short result each."""
    s.messages.append(answer)
    for call in answer.get("tool_calls") or []:
        s.messages.append({"role": "tool", "tool_call_id": call["id"], "content": "(no output)"})


class SoakRun:
    def __init__(self, ctx: Ctx, plan: Plan, memory: MemoryProbe | None,
                 on_turn: Callable[[dict[str, Any]], None] | None):
        self.ctx, self.plan, self.memory, self.on_turn = ctx, plan, memory, on_turn
        self.turns: list[dict[str, Any]] = []
        self.exchanges: list[dict[str, Any]] = []
        self.t0 = time.perf_counter()
        self.stopped_by = ""
        self.memory_errors: list[str] = []

    def body(self, s: _Session, step: int, kind: str) -> dict[str, Any]:
        ctx = self.ctx
        thinking = ctx.dialect.thinking_on if kind == "arithmetic" else ctx.dialect.thinking_off
        body: dict[str, Any] = {**ctx.model, "messages": list(s.messages), "max_tokens": self.plan.budgets[step],
                                "temperature": 0.6, "top_p": 0.95, "seed": 1000 * s.index + step, **thinking}
        # a server that declares it calls no tools (vLLM without a tool parser answers a tools list
        # with HTTP 400) gets the same conversation, tool results included, without the tools list
        if (self.plan.mode == "continuous" or kind in ("repo_question", "grep_output")) \
                and ctx.info.capabilities.tools is not False:
            body["tools"] = SOAK_TOOLS
            body["tool_choice"] = "auto"
        return body

    def read_memory(self, t_start: float, t_end: float) -> dict[str, Any] | None:
        if self.memory is None:
            return None
        try:
            found = self.memory.read()
        except Exception as exc:  # noqa: BLE001 - a failed reading is recorded, never ends the soak
            self.memory_errors.append(f"{type(exc).__name__}: {exc}")
            found = None
        if not found or not isinstance(found.get("bytes"), int):
            return {"source": self.memory.source, "bytes": None}
        out = {"source": self.memory.source, **found}
        if self.memory.peak is not None:
            peak = self.memory.peak(t_start, t_end)
            if isinstance(peak, int):
                out["peak_bytes"] = max(peak, found["bytes"])
        return out

    def turn(self, s: _Session, step: int, kind: str) -> tuple[dict[str, Any], StreamResult]:
        body = self.body(s, step, kind)
        t_start = time.perf_counter()
        r = self.ctx.client.stream_chat(body, timeout=self.ctx.timeout(REQUEST_SECONDS))
        exchanges = self.ctx.client.take()  # a soak keeps per-turn records; the exchanges of the first turn
        check = judge_turn(r, EXPECT.get(kind))   # and of the first few turns that went wrong
        if not self.turns or (check["status"] != "ok" and len(self.exchanges) < 4):
            self.exchanges += [{**e, "turn": len(self.turns) + 1} for e in exchanges]
        usage = r.usage or {}
        tokens = usage.get("completion_tokens")
        first = r.t_first_token if r.t_first_token is not None else r.t_first_delta
        ttft = None if first is None else first - r.t_request
        if not isinstance(tokens, int):
            tokens = len(r.token_times) if r.token_times else None
        details = usage.get("prompt_tokens_details")
        record = {
            "turn": len(self.turns) + 1, "session": s.index, "step": step + 1, "kind": kind,
            "t_s": round(t_start - self.t0, 3), "http": r.status, "error": r.error,
            "wall_s": round(r.seconds, 4), "ttft_s": None if ttft is None else round(ttft, 4),
            "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": tokens,
            "cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else None,
            # raw, as bench requests keep them (records.encoding): every text chunk's arrival, delta-encoded
            # microseconds after the send, and the end of the stream; the verdict recomputes decode from them
            "arrivals_us": encode_arrivals(r.t_request, r.token_times),
            "end_us": round((r.t_end - r.t_request) * 1_000_000), "finish_reason": r.finish_reason,
            "tool_calls": [c.name for c in r.tool_calls], "tools_offered": "tools" in body,
            "max_tokens": body["max_tokens"],
            "messages": len(body["messages"]), "request_chars": sum(len(str(m.get("content") or ""))
                                                                    for m in body["messages"]),
            "check": check,
            "memory": self.read_memory(t_start, time.perf_counter()),
            "answer": (r.content or r.reasoning)[:200],
        }
        self.turns.append(record)
        if self.on_turn is not None:
            self.on_turn(record)
        return record, r

    def out_of_bounds(self) -> bool:
        if self.plan.max_turns is not None and len(self.turns) >= self.plan.max_turns:
            self.stopped_by = f"the turn bound ({len(self.turns)} turns)"
            return True
        if self.plan.deadline_s is not None and time.perf_counter() - self.t0 >= self.plan.deadline_s:
            self.stopped_by = f"the time bound ({self.plan.deadline_s / 60:g} minutes, after {len(self.turns)} turns)"
            return True
        return False

    def session(self, index: int) -> str:
        """Run one session; '' when it ran to its end (or was cut by a bound), else why it stopped."""
        s = _Session(index, random_salt(), rng=random.Random(index))
        system = FRESH_SYSTEM if self.plan.mode == "fresh" else CONTINUOUS_SYSTEM
        s.messages.append({"role": "system", "content": f"{system}\nSession {s.salt}."})
        steps = FRESH_STEPS if self.plan.mode == "fresh" else CONTINUOUS_STEPS
        chars = self.plan.attachment_chars
        for step, (kind, prompt) in enumerate(steps):
            if self.out_of_bounds():
                return "bound"
            if self.plan.mode == "fresh":
                if kind != "grep_output":
                    s.messages.append({"role": "user", "content": prompt})
            record, r = self.turn(s, step, kind)
            if record["check"]["status"] == "error":
                return "dead" if r.status is None else "error"
            answer = _assistant(r)
            if self.plan.mode == "fresh" and kind == "repo_question":
                hit = f"{ENTRY_POINT}:12:def main(argv: list[str] | None = None) -> int:"
                _attach(s, answer, *FRESH_CALL, grep_text(chars[0], s.rng, "main", hit))
            elif self.plan.mode == "continuous" and step + 1 < len(steps):
                nxt = steps[step + 1][0]
                name, args = CONTINUOUS_CALLS[nxt]
                size = chars[step]
                output = (code_text(size, s.rng, args.get("path", "")) if name == "read_file"
                          else grep_text(size, s.rng, "roundtrip") if name == "grep" else pytest_text(size, s.rng))
                _attach(s, answer, name, args, output)
            else:
                _close_calls(s, answer)
        return ""

    def run(self) -> None:
        index = failed_in_a_row = 0
        while True:
            index += 1
            why = self.session(index)
            if why == "bound":
                return
            if why == "dead":
                self.stopped_by = "the engine stopped answering"
                return
            failed_in_a_row = failed_in_a_row + 1 if why == "error" else 0
            if failed_in_a_row >= 5:
                self.stopped_by = "5 sessions in a row ended in an error"
                return
            if self.out_of_bounds():
                return

