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

Each turn is a record: status, wall, TTFT, prompt / completion tokens, decode tokens/s (tokens /
(wall - TTFT), only when that window is >= 100 ms), the answer's check (``ok``, ``error``,
``silent_empty``, ``empty``, ``markup``, ``degenerate``, plus whether it holds what the turn asked
for), and memory from the ``MemoryProbe`` the caller hands in: VRAM through NVML on a GPU, else
the managed engine's process-tree USS, else the engine's own report; which one is recorded.

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

The suite returns one ``CheckResult`` (``soak_fresh`` / ``soak_continuous``): PASS for PASS and
WARN, FAIL for FAIL and INCONCLUSIVE; the reason starts with the verdict; ``details`` hold the
verdict, every rule's outcome and measure, the memory summary and every turn.
"""

from __future__ import annotations

import json
import math
import random
import re
import secrets
import statistics
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engineroom import units
from engineroom.checks.context import Ctx
from engineroom.checks.full import TOOL_MARKUP, _repeated_run
from engineroom.checks.smoke import CheckResult, Status
from engineroom.client import StreamResult
from engineroom.errors import BadInput

MODES = ("fresh", "continuous")
STEPS = 5                                     # turns per session
SESSIONS = {"fresh": 20, "continuous": 5}     # the spec's plan
FAST_SESSIONS = {"fresh": 3, "continuous": 3}
DEFAULT_MINUTES = 30.0                        # the spec's 1,800 s limit
REQUEST_SECONDS = 600.0                       # per request, before timeout_scale
MIN_CTX = 2048
BUDGETS = {"fresh": (220, 320, 700, 900, 2000), "continuous": (350, 350, 400, 500, 1500)}
FAST_BUDGETS = {"fresh": (48, 64, 96, 128, 128), "continuous": (64, 64, 64, 96, 128)}
FRESH_GREP_CHARS = 12_000
CONTINUOUS_CHARS = (20_000, 24_000, 24_000, 32_000)    # code, code, grep, pytest log: ~22-25K tokens by turn 5
FAST_DIVISOR = 4                              # --fast: attachments a quarter of the spec's (then scaled to the context)
MiB = 1024 * 1024

# The verdict's thresholds (the card prints them from here, so the docs cannot drift from the code).
RULES: dict[str, dict[str, Any]] = {
    "errors": {"fail": "any turn with a non-200 answer or a stream error"},
    "silent_empty": {"fail_share": 0.5, "warn_share": 0.0, "min_wall_s": 1.0},
    "memory_growth": {"fail_bytes": 200 * MiB},
    "memory_slope": {"warn_bytes_per_session": 16 * MiB, "min_sessions_after_baseline": 3},
    "memory_oscillation": {"warn_bytes": 500 * MiB},
    # on a GPU with the engine's pid known, its host memory too: a prompt cache kept in RAM never shows in VRAM
    "host_memory_growth": {"fail_bytes": 200 * MiB},
    "decode_drift": {"fail_ratio": 0.8, "window_sessions": 5},
    "ttft_growth": {"warn_ratio": 1.5, "min_delta_s": 0.05, "window_sessions": 5},   # ms-scale TTFTs are noise
    "slow_turn": {"warn_wall_s": 30.0},
    "markup_in_content": {"warn": "any turn with tool-call markup left in content"},
    "quality_drift": {"warn_points": 0.4, "min_sessions": 4, "window_sessions": 5},
}
VERDICTS = ("PASS", "WARN", "FAIL", "INCONCLUSIVE")


@dataclass(frozen=True)
class SoakOptions:
    """What ``--mode``, ``--minutes`` and ``--turns`` asked for (validated by ``soak_options``)."""

    mode: str = "fresh"
    minutes: float | None = None
    turns: int | None = None


def soak_options(mode: str | None, minutes: float | None, turns: int | None) -> SoakOptions:
    """``SoakOptions`` from the command's values; ``BadInput`` with one sentence for a bad one."""
    chosen = (mode or "fresh").strip().lower()
    if chosen not in MODES:
        raise BadInput(f"--mode must be one of {', '.join(MODES)}, not {mode!r}.")
    if minutes is not None and not (isinstance(minutes, (int, float)) and math.isfinite(minutes) and minutes > 0):
        raise BadInput(f"--minutes must be a positive number of minutes, not {minutes}.")
    if turns is not None and turns < 1:
        raise BadInput(f"--turns must be at least 1, not {turns}.")
    return SoakOptions(chosen, None if minutes is None else float(minutes), turns)


@dataclass
class MemoryProbe:
    """How the caller reads the engine's memory: ``read()`` -> ``{"bytes": int, ...}`` or None.

    ``source``: ``nvml`` (total VRAM used, per GPU too), ``uss`` (the managed engine's process
    tree), ``engine_report`` (what the engine's /metrics says); ``description`` is the card's
    sentence. ``peak(t0, t1)``, when given, is the highest reading a background sampler took
    between two ``time.perf_counter()`` values (a prefill's peak)."""

    source: str
    description: str
    read: Callable[[], dict[str, Any] | None]
    peak: Callable[[float, float], int | None] | None = None


# -- what is sent ------------------------------------------------------------------------

SOAK_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "grep", "description": "Search the repository for a pattern; prints file:line:text.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                       "required": ["pattern"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run pytest on a path and print its log.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]

FRESH_SYSTEM = "You are a helpful coding assistant working in a Python repository."
CONTINUOUS_SYSTEM = ("You are a coding agent debugging a failing test in a Python repository. Use the tools to read "
                     "code, search and run tests, then explain the cause and the fix.")
FRESH_STEPS: tuple[tuple[str, str], ...] = (
    ("checklist", "Give me a short checklist, five items, for reviewing a pull request."),
    ("repo_question", "Where is the command-line entry point of this repository defined? Use the tools to look."),
    ("grep_output", ""),           # the grep output comes back as the tool's result
    ("write_parser", "Write a Python function parse_kv(text) that parses key=value lines into a dict, and a pytest "
                     "test for it."),
    ("arithmetic", "What is 17 * 23 + 9? Think it through, then give the number."),
)
CONTINUOUS_STEPS: tuple[tuple[str, str], ...] = (
    ("bug_report", "tests/test_parser.py::test_roundtrip fails since yesterday's merge. Find out why: start by "
                   "reading src/parser/core.py."),
    ("code_core", "read_file"), ("code_tokens", "read_file"), ("grep_roundtrip", "grep"), ("pytest_log", "run_tests"),
)
CONTINUOUS_CALLS = {"code_core": ("read_file", {"path": "src/parser/core.py"}),
                    "code_tokens": ("read_file", {"path": "src/parser/tokens.py"}),
                    "grep_roundtrip": ("grep", {"pattern": "roundtrip", "path": "src"}),
                    "pytest_log": ("run_tests", {"path": "tests/test_parser.py"})}
FRESH_CALL = ("grep", {"pattern": "def main", "path": "."})
ENTRY_POINT = "src/app/cli/main.py"


def _salt() -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32))


_WORDS = ("parse", "token", "buffer", "state", "value", "index", "line", "record", "field", "sep", "chunk", "offset",
          "reader", "writer", "cache", "limit", "scope", "node", "entry", "table")


def _ident(rng: random.Random) -> str:
    return "_".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))


def code_text(chars: int, rng: random.Random, module: str) -> str:
    """Python-looking source of about ``chars`` characters (varied, so it tokenizes like code)."""
    out = [f"# {module}\n\"\"\"Parser internals.\"\"\"\n\nfrom __future__ import annotations\n\n"]
    size = len(out[0])
    n = 0
    while size < chars:
        n += 1
        name, arg, other = _ident(rng), _ident(rng), _ident(rng)
        block = (f"def {name}_{n}({arg}: str, {other}: int = {rng.randint(0, 99)}) -> dict:\n"
                 f"    \"\"\"Return the {arg.replace('_', ' ')} split by {other.replace('_', ' ')}.\"\"\"\n"
                 f"    result = {{}}\n"
                 f"    for i, part in enumerate({arg}.split({rng.choice(['sep', repr('='), repr(':')])})):\n"
                 f"        if i > {other}:\n"
                 f"            break\n"
                 f"        result[part.strip()] = {rng.choice(['i', 'len(part)', 'part.lower()'])}\n"
                 f"    return result\n\n\n")
        out.append(block)
        size += len(block)
    return "".join(out)[:chars]


def grep_text(chars: int, rng: random.Random, pattern: str, hit: str | None = None) -> str:
    """``grep -rn`` output of about ``chars`` characters; ``hit`` is one line placed in the middle."""
    lines, size = [], 0
    while size < chars:
        path = f"src/{rng.choice(['app', 'parser', 'util', 'io'])}/{_ident(rng)}.py"
        line = f"{path}:{rng.randint(1, 900)}:    {_ident(rng)} = {pattern}({_ident(rng)}, {rng.randint(0, 9)})"
        lines.append(line)
        size += len(line) + 1
    if hit:
        lines.insert(len(lines) // 2, hit)
    return "\n".join(lines)[:chars]


def pytest_text(chars: int, rng: random.Random) -> str:
    """A pytest log of about ``chars`` characters, ending in the failing test's KeyError."""
    head = "============================= test session starts ==============================\n"
    lines, size = [head], len(head)
    tail = ("_________________________________ test_roundtrip _________________________________\n"
            "    def test_roundtrip():\n>       assert parse(dump(RECORD)) == RECORD\n"
            "src/parser/core.py:211: in parse\n    sep = options['sep']\nE   KeyError: 'sep'\n"
            "=========================== 1 failed, 212 passed ============================\n")
    while size < chars - len(tail):
        line = f"tests/test_{_ident(rng)}.py::test_{_ident(rng)}_{rng.randint(1, 99)} PASSED" \
               f"{' ' * rng.randint(1, 20)}[{rng.randint(1, 99):3d}%]\n"
        lines.append(line)
        size += len(line)
    return ("".join(lines) + tail)[-chars:] if chars > len(tail) else tail


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
    if line := _repeated_run(lines):
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


EXPECT: dict[str, Callable[[str], bool]] = {
    "checklist": lambda t: sum(1 for line in t.splitlines() if re.match(r"\s*([-*•]|\d+[.)])\s+\S", line)) >= 3,
    "repo_question": lambda t: "cli" in t.lower() or "main" in t.lower(),
    "grep_output": lambda t: "cli" in t.lower() or "main.py" in t.lower(),
    "write_parser": lambda t: "def parse_kv" in t and "assert" in t,
    "arithmetic": lambda t: "400" in t,
    "bug_report": lambda t: bool(t.strip()),
    "code_core": lambda t: bool(t.strip()),
    "code_tokens": lambda t: bool(t.strip()),
    "grep_roundtrip": lambda t: bool(t.strip()),
    "pytest_log": lambda t: "sep" in t.lower() or "keyerror" in t.lower(),
}


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


class _Soak:
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
        if self.plan.mode == "continuous" or kind in ("repo_question", "grep_output"):
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
        window = r.seconds - ttft if ttft is not None else None
        if not isinstance(tokens, int):
            tokens = len(r.token_times) if r.token_times else None
        decode = (tokens / window) if (isinstance(tokens, int) and tokens > 1 and window and window >= 0.1) else None
        details = usage.get("prompt_tokens_details")
        record = {
            "turn": len(self.turns) + 1, "session": s.index, "step": step + 1, "kind": kind,
            "t_s": round(t_start - self.t0, 3), "http": r.status, "error": r.error,
            "wall_s": round(r.seconds, 4), "ttft_s": None if ttft is None else round(ttft, 4),
            "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": tokens,
            "cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else None,
            "decode_tps": None if decode is None else round(decode, 2), "finish_reason": r.finish_reason,
            "tool_calls": [c.name for c in r.tool_calls], "max_tokens": body["max_tokens"],
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
        s = _Session(index, _salt(), rng=random.Random(index))
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


# -- the verdict -------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (x, y) points; None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    num = sum((x - mx) * (y - my) for x, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return num / den if den else None


def _mib(n: float | None) -> str:
    return units.mib(n, 1, "n/a")


def _rule(name: str, outcome: str, reason: str, **measured: Any) -> dict[str, Any]:
    return {"rule": name, "outcome": outcome, "reason": reason, "threshold": RULES[name], "measured": measured}


def _memory_bytes(turn: dict[str, Any]) -> int | None:
    mem = turn.get("memory") or {}
    value = mem.get("bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def judge(turns: Sequence[dict[str, Any]], memory_source: str | None, *, steps: int = STEPS,
          memory_note: str = "") -> dict[str, Any]:
    """The verdict over the per-turn records: ``{verdict, reason, rules, memory, sessions}``.

    Pure (no server): every rule can be shown to FAIL / WARN from constructed records."""
    rules: list[dict[str, Any]] = []
    sessions: dict[int, list[dict[str, Any]]] = {}
    for t in turns:
        sessions.setdefault(int(t["session"]), []).append(t)
    order = sorted(sessions)
    complete = [i for i in order if len(sessions[i]) >= steps]
    n = len(turns)

    # errors
    errored = [t for t in turns if (t.get("check") or {}).get("status") == "error"]
    if errored:
        first = errored[0]
        before = [t for t in turns if t["session"] == first["session"] and t["turn"] < first["turn"]
                  and isinstance(t.get("prompt_tokens"), int)]
        if isinstance(first.get("prompt_tokens"), int):
            depth = f"{first['prompt_tokens']:,} prompt tokens"
        elif isinstance(first.get("request_chars"), int):
            depth = f"{first['request_chars']:,} chars of conversation" + (
                f", {before[-1]['prompt_tokens']:,} prompt tokens the turn before" if before else "")
        else:
            depth = "depth unknown"
        rules.append(_rule("errors", "FAIL", f"{len(errored)} of {n} turns failed; the first at turn {first['turn']} "
                                             f"(session {first['session']}, {depth}): {first['check']['reason']}",
                           failed=len(errored)))
    else:
        rules.append(_rule("errors", "PASS", f"all {n} turns answered 200 with a whole stream", failed=0))

    # silent-empty turns
    silent = [t for t in turns if (t.get("check") or {}).get("status") == "silent_empty"]
    share = len(silent) / n if n else 0.0
    if n and share >= RULES["silent_empty"]["fail_share"]:
        rules.append(_rule("silent_empty", "FAIL", f"{len(silent)} of {n} turns ({share:.0%}) came back 200 after "
                                                   ">= 1 s with no token", share=round(share, 3)))
    elif silent:
        rules.append(_rule("silent_empty", "WARN", f"{len(silent)} of {n} turns ({share:.0%}) came back 200 after "
                                                   f">= 1 s with no token (first: turn {silent[0]['turn']})",
                           share=round(share, 3)))
    else:
        rules.append(_rule("silent_empty", "PASS", "no silent-empty turn", share=0.0))

    # memory
    inconclusive: list[str] = []
    clean = [i for i in order if all((t.get("check") or {}).get("status") != "error" for t in sessions[i])]
    base_session = clean[0] if clean else None
    baseline = _memory_bytes(sessions[base_session][-1]) if base_session is not None else None
    after = [t for t in turns if base_session is not None and int(t["session"]) > base_session]
    after_readings = [b for b in (_memory_bytes(t) for t in after) if b is not None]
    readings = [b for b in (_memory_bytes(t) for t in turns) if b is not None]
    mem: dict[str, Any] = {"source": memory_source, "baseline_bytes": baseline, "baseline_session": base_session,
                           "first_bytes": readings[0] if readings else None,
                           "last_bytes": readings[-1] if readings else None,
                           "max_bytes": max(readings) if readings else None, "readings": len(readings)}
    # the slope is taken over the session ends AFTER the baseline: a one-off step right after it (an
    # allocator growing to the largest batch once, a cache's first entry) is growth, not a slope
    ends = [(float(i), float(b)) for i in order if (b := _memory_bytes(sessions[i][-1])) is not None
            and base_session is not None and i > base_session]
    per_turn = [(float(t["turn"]), float(b)) for t in turns if (b := _memory_bytes(t)) is not None]
    mem["slope_bytes_per_session"] = None if (s := _slope(ends)) is None else round(s)
    mem["slope_bytes_per_turn"] = None if (s := _slope(per_turn)) is None else round(s)
    memory_rules = ("memory_growth", "memory_slope", "memory_oscillation")
    if memory_source is None or not readings:
        why = (memory_note or "no memory source: NVML finds no GPU, no engine pid is known and the engine reports "
               "none") if memory_source is None else f"no memory reading came back from the {memory_source} source"
        inconclusive.append(why)
        rules += [_rule(r, "not judged", why) for r in memory_rules]
    elif base_session is None:
        why = "no error-free session to take the memory baseline from"
        inconclusive.append(why)
        rules += [_rule(r, "not judged", why) for r in memory_rules]
    elif baseline is None:
        why = f"no memory reading at the end of session {base_session} (the baseline)"
        inconclusive.append(why)
        rules += [_rule(r, "not judged", why) for r in memory_rules]
    elif not after_readings:
        why = (f"no session ran after the baseline (the end of session {base_session}): memory growth needs at "
               "least one more")
        inconclusive.append(why)
        rules += [_rule(r, "not judged", why) for r in memory_rules]
    else:
        growth = after_readings[-1] - baseline
        mem["growth_bytes"] = growth
        limit = RULES["memory_growth"]["fail_bytes"]
        rules.append(_rule("memory_growth", "FAIL" if growth > limit else "PASS",
                           f"{_mib(growth)} from the baseline ({_mib(baseline)} at the end of session {base_session}) "
                           f"to the last turn ({_mib(after_readings[-1])}); limit {_mib(limit)}",
                           growth_bytes=growth))
        slope = mem["slope_bytes_per_session"]
        post = len(ends)
        warn_slope = RULES["memory_slope"]["warn_bytes_per_session"]
        if slope is not None and post >= RULES["memory_slope"]["min_sessions_after_baseline"]:
            rules.append(_rule("memory_slope", "WARN" if slope > warn_slope else "PASS",
                               f"{_mib(slope)} a session over the {post} session ends after the baseline"
                               + (f" (> {_mib(warn_slope)}: a slow leak)" if slope > warn_slope else ""),
                               slope_bytes_per_session=slope))
        else:
            least = RULES["memory_slope"]["min_sessions_after_baseline"]
            rules.append(_rule("memory_slope", "not judged", f"needs >= {least} sessions after the baseline; "
                                                             f"{post} ran"))
        swing = max(after_readings) - min(after_readings)
        mem["oscillation_bytes"] = swing
        wl = RULES["memory_oscillation"]["warn_bytes"]
        rules.append(_rule("memory_oscillation", "WARN" if swing > wl else "PASS",
                           f"readings after the baseline swing by {_mib(swing)} (limit {_mib(wl)})",
                           oscillation_bytes=swing))

    # host memory beside VRAM (the NVML source with the engine's pid known): growth over the same baseline
    host = [(int(t["session"]), h) for t in turns if isinstance(h := (t.get("memory") or {}).get("host_bytes"), int)]
    if host and base_session is not None:
        base_h = next((h for si, h in reversed(host) if si == base_session), None)
        after_h = [h for si, h in host if si > base_session]
        if base_h is not None and after_h:
            grown = after_h[-1] - base_h
            mem["host_growth_bytes"] = grown
            limit = RULES["host_memory_growth"]["fail_bytes"]
            rules.append(_rule("host_memory_growth", "FAIL" if grown > limit else "PASS",
                               f"the engine's host memory (USS) {_mib(grown)} from {_mib(base_h)} at the end of "
                               f"session {base_session} to {_mib(after_h[-1])}; limit {_mib(limit)}",
                               growth_bytes=grown))
        else:
            rules.append(_rule("host_memory_growth", "not judged", "no host reading after the baseline"))

    # latency drift: the first and last (up to 5) complete sessions
    k = min(RULES["decode_drift"]["window_sessions"], len(complete) // 2)

    def window(sel: Sequence[int], key: str) -> list[float]:
        return [float(t[key]) for i in sel for t in sessions[i] if isinstance(t.get(key), (int, float))]

    if k >= 1:
        head, tail = complete[:k], complete[-k:]
        d0, d1 = _median(window(head, "decode_tps")), _median(window(tail, "decode_tps"))
        if d0 and d1 is not None:
            ratio = d1 / d0
            fr = RULES["decode_drift"]["fail_ratio"]
            rules.append(_rule("decode_drift", "FAIL" if ratio < fr else "PASS",
                               f"median decode {d1:.1f} tok/s in the last {k} session(s) vs {d0:.1f} in the first "
                               f"{k} ({ratio:.0%}; FAIL below {fr:.0%})", ratio=round(ratio, 3), first=d0, last=d1))
        else:
            rules.append(_rule("decode_drift", "not judged", "no turn had a decode window of >= 100 ms"))
        f0, f1 = _median(window(head, "ttft_s")), _median(window(tail, "ttft_s"))
        if f0 and f1 is not None:
            ratio = f1 / f0
            wr = RULES["ttft_growth"]["warn_ratio"]
            grew = ratio > wr and f1 - f0 > RULES["ttft_growth"]["min_delta_s"]
            rules.append(_rule("ttft_growth", "WARN" if grew else "PASS",
                               f"median TTFT {f1:.3f} s in the last {k} session(s) vs {f0:.3f} s in the first {k} "
                               f"({ratio:.2f}x; WARN above {wr:g}x and +{RULES['ttft_growth']['min_delta_s']:g} s)",
                               ratio=round(ratio, 3), first=f0, last=f1))
        else:
            rules.append(_rule("ttft_growth", "not judged", "no TTFT was measured"))
    else:
        why = f"needs >= 2 complete sessions to compare the first with the last; {len(complete)} ran"
        rules += [_rule("decode_drift", "not judged", why), _rule("ttft_growth", "not judged", why)]

    # slow turns
    wall = RULES["slow_turn"]["warn_wall_s"]
    slow = [t for t in turns if isinstance(t.get("wall_s"), (int, float)) and t["wall_s"] > wall]
    slowest = max(turns, key=lambda t: t.get("wall_s") or 0.0) if turns else None
    if slow and slowest is not None:
        rules.append(_rule("slow_turn", "WARN", f"{len(slow)} turn(s) took > {wall:g} s; the slowest, turn "
                                                f"{slowest['turn']}, {slowest['wall_s']:.1f} s", slow=len(slow)))
    else:
        rules.append(_rule("slow_turn", "PASS", f"every turn within {wall:g} s"
                           + (f" (slowest {slowest['wall_s']:.1f} s)" if slowest else ""), slow=0))

    # answer quality
    leaked = [t for t in turns if (t.get("check") or {}).get("status") == "markup"]
    if leaked:
        rules.append(_rule("markup_in_content", "WARN", f"{len(leaked)} turn(s) left tool-call markup in content "
                                                        f"(first: turn {leaked[0]['turn']}: "
                                                        f"{leaked[0]['check']['reason']})", turns=len(leaked)))
    else:
        rules.append(_rule("markup_in_content", "PASS", "no tool-call markup in any answer's content", turns=0))

    def good(t: dict[str, Any]) -> bool:
        c = t.get("check") or {}
        return c.get("status") == "ok" and c.get("expected") is not False

    kq = min(RULES["quality_drift"]["window_sessions"], len(complete) // 2)
    if len(complete) >= RULES["quality_drift"]["min_sessions"] and kq >= 1:
        head_t = [t for i in complete[:kq] for t in sessions[i]]
        tail_t = [t for i in complete[-kq:] for t in sessions[i]]
        g0 = sum(map(good, head_t)) / len(head_t)
        g1 = sum(map(good, tail_t)) / len(tail_t)
        drop = g0 - g1
        pts = RULES["quality_drift"]["warn_points"]
        rules.append(_rule("quality_drift", "WARN" if drop >= pts else "PASS",
                           f"good answers {g1:.0%} in the last {kq} session(s) vs {g0:.0%} in the first {kq}"
                           + (f" (fell >= {pts:.0%} points)" if drop >= pts else ""), first=round(g0, 3),
                           last=round(g1, 3)))
    else:
        rules.append(_rule("quality_drift", "not judged", f"needs >= {RULES['quality_drift']['min_sessions']} "
                                                          f"complete sessions; {len(complete)} ran"))

    fails = [r for r in rules if r["outcome"] == "FAIL"]
    warns = [r for r in rules if r["outcome"] == "WARN"]
    if fails:
        verdict = "FAIL"
        reason = "; ".join(f"{r['rule']}: {r['reason']}" for r in fails)
    elif inconclusive:
        verdict = "INCONCLUSIVE"
        reason = inconclusive[0]
    elif warns:
        verdict = "WARN"
        reason = "; ".join(f"{r['rule']}: {r['reason']}" for r in warns)
    else:
        verdict = "PASS"
        growth_text = _mib(mem.get("growth_bytes"))
        reason = (f"{n} turns over {len(order)} sessions, no error, memory {growth_text} from the baseline "
                  f"({memory_source})")
    good_turns = sum(map(good, turns))
    return {"verdict": verdict, "reason": reason, "rules": rules, "memory": mem, "sessions": len(order),
            "complete_sessions": len(complete), "turns": n, "good_answers": good_turns}


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
    soak = _Soak(ctx, plan, memory, on_turn)
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
