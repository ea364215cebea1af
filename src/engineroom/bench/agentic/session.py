"""Multi-turn agentic replay, as data: a coding agent's conversation whose tool outputs grow.

``engineroom bench agentic`` replays a recorded shape of coding-agent session: a system
prompt, a task, then turn after turn the assistant's (recorded) tool call and the tool's output —
a directory listing, source files read, grep hits, test logs, a git log and a diff — with ten
tools offered on every request. Each turn sends the whole conversation so far; the model's own
reply is measured (TTFT, prefill, decode) and then set aside: the next turn continues with the
*recorded* assistant message, so every session sends the same shape whatever the model says
(a missed tool call is counted, not followed).

Why it is honest about the prefix cache:

- every session starts with a fresh salt at the very beginning of its system prompt (and the
  salt seeds every identifier, path and number of its tool outputs), so nothing carries over
  between sessions or runs beyond the chat template's first few tokens; turn 1 of a session
  that reused more is contamination, and the checklist fails it;
- within a session each turn's prompt extends the previous one, so reusing it from the cache is
  the point: each record keeps the engine's cached-token count (``stats.cache_reuse``) and
  the card sets it beside the previous turn's prompt.

Sizes: ``SCRIPT``'s outputs add up to about 48K tokens by turn 12 (about 50K with the system
prompt and tool schemas), the spec's "tool outputs of realistic sizes growing to ~50K tokens".
``plan_turns`` scales every output down (never up) so the last turn fits ``CONTEXT_FILL`` of the
context per slot the engine reports, with room for the reply; each output is then sized in real
tokens through the engine's tokenizer where it has one (``size_text``).

The client: tool-call deltas arrive as chunks with no content text, so ``ToolKindClient`` times
them too (kind ``"t"``); one such chunk may carry several tokens (an engine streams a call's
arguments as JSON diffs, and its tool-call parser holds back text that might open a call), so
only the turns streamed one token per chunk enter the client-vs-engine cross-check
(``content_only``), which compares per-token rates.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engineroom.bench.clientside import KindClient
from engineroom.client import StreamResult
from engineroom.records.encoding import arrivals_us

__all__ = ["CONTEXT_FILL", "MIN_OUTPUT_TOKENS", "SCRIPT", "STOP_KIND", "TOOLS", "Exchange", "PlannedTurn",
           "SessionBuilder", "ToolKindClient", "call_tokens", "content_only", "plan_turns", "size_text", "sized_by",
           "ttft_verdict"]

STOP_KIND = "agentic_stop"    # the record of a session stopped before its planned last turn
CONTEXT_FILL = 0.8            # the last turn's prompt + reply stay within this share of the context per slot
MIN_OUTPUT_TOKENS = 48        # a scaled-down tool output is never smaller than this
MESSAGE_OVERHEAD_TOKENS = 12  # the template's tokens around one message (role tags, separators)
CHARS_PER_TOKEN_CODE = 3.2    # the first guess for code-like text, before the tokenizer corrects it

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": list(req)}}}
    for name, desc, props, req in (
        ("list_dir", "List the files under a directory, with sizes.",
         {"path": {"type": "string"}, "depth": {"type": "integer"}}, ("path",)),
        ("read_file", "Read a text file; optionally a range of lines.",
         {"path": {"type": "string"}, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
         ("path",)),
        ("grep", "Search files for a regular expression; prints path:line: text.",
         {"pattern": {"type": "string"}, "path": {"type": "string"}, "glob": {"type": "string"}}, ("pattern",)),
        ("glob", "Find files whose path matches a glob pattern.", {"pattern": {"type": "string"}}, ("pattern",)),
        ("run_tests", "Run the test suite (pytest) with optional arguments; prints its log.",
         {"args": {"type": "string"}}, ()),
        ("run_command", "Run a shell command in the repository; prints stdout and stderr.",
         {"command": {"type": "string"}, "timeout_s": {"type": "integer"}}, ("command",)),
        ("git_diff", "Show the working tree's changes as a unified diff.", {"path": {"type": "string"}}, ()),
        ("git_log", "Show recent commits.", {"max_count": {"type": "integer"}, "path": {"type": "string"}}, ()),
        ("edit_file", "Replace one exact snippet of a file with another.",
         {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}, ("path", "old", "new")),
        ("write_file", "Write a whole file.", {"path": {"type": "string"}, "content": {"type": "string"}},
         ("path", "content")),
    )
]

SYSTEM_PROMPT = (
    "You are a coding agent working in a Python repository. You can read and search files, run the "
    "tests and shell commands, and edit files through the tools offered. Work step by step: look before "
    "you change anything, keep edits minimal, run the tests after every change, and stop when they pass. "
    "Answer with one tool call at a time; explain your reasoning in one short sentence before each call."
)
TASK = ("The test suite fails since the last merge: tests/test_ingest.py reports a KeyError in the "
        "batch loader and two timeouts in the scheduler tests. Find the cause and fix it.")


@dataclass(frozen=True)
class Exchange:
    """One recorded step: the assistant's note and tool call, and the kind and size of the output."""

    tool: str
    args: Mapping[str, Any]
    note: str
    output: str          # the generator: listing | source | grep | pytest | git_log | diff | edit
    tokens: int          # the output's size in the full-size script


SCRIPT: tuple[Exchange, ...] = (
    Exchange("list_dir", {"path": ".", "depth": 3}, "Let me see how the repository is laid out.", "listing", 300),
    Exchange("read_file", {"path": "src/{pkg}/ingest/batch.py"}, "The KeyError is in the batch loader; reading it.",
             "source", 2500),
    Exchange("grep", {"pattern": "def load_batch|BatchKey", "path": "src"}, "Where else is the batch key built?",
             "grep", 900),
    Exchange("read_file", {"path": "src/{pkg}/ingest/schema.py"}, "The key comes from the schema module.",
             "source", 6000),
    Exchange("run_tests", {"args": "tests/test_ingest.py -x -q"}, "Reproducing the failure first.", "pytest", 3500),
    Exchange("read_file", {"path": "src/{pkg}/scheduler/core.py"}, "Now the scheduler timeouts.", "source", 8000),
    Exchange("grep", {"pattern": "timeout|deadline", "path": "src/{pkg}/scheduler"},
             "Which code paths set the deadline?", "grep", 1500),
    Exchange("git_log", {"max_count": 30, "path": "src/{pkg}/scheduler"}, "What changed in the merge?",
             "git_log", 1200),
    Exchange("read_file", {"path": "src/{pkg}/scheduler/queue.py"}, "The queue was rewritten in that merge.",
             "source", 9000),
    Exchange("run_tests", {"args": "tests/ -q -k 'scheduler or ingest'"}, "Running both groups again.",
             "pytest", 6000),
    Exchange("git_diff", {}, "Comparing the merge's changes with what the tests expect.", "diff", 9000),
    Exchange("edit_file", {"path": "src/{pkg}/ingest/batch.py", "old": "key = row['id']",
                           "new": "key = row.get('batch_id', row['id'])"},
             "The loader still reads the old column; fixing it.", "edit", 150),
    Exchange("run_tests", {"args": "tests/test_ingest.py -q"}, "Checking the loader fix.", "pytest", 5000),
    Exchange("read_file", {"path": "tests/test_scheduler.py"}, "The timeouts: what do the tests wait for?",
             "source", 4000),
    Exchange("run_tests", {"args": "tests/ -q"}, "The whole suite once more.", "pytest", 3000),
)
DEFAULT_TURNS = 12            # turn k sends exchanges 1..k-1: 12 turns use 11, ~48K tokens of output


# -- realistic text, salted -------------------------------------------------------------------

_WORDS = ("batch", "record", "schema", "queue", "worker", "deadline", "retry", "window", "cursor", "shard",
          "ledger", "payload", "token", "offset", "bucket", "lease", "snapshot", "channel", "span", "budget")
_TYPES = ("int", "str", "bytes", "float", "bool", "list[str]", "dict[str, int]", "Path", "datetime")
_MODULES = ("ingest", "scheduler", "storage", "api", "metrics", "cli", "config", "util")


def _ident(rng: random.Random, parts: int = 2) -> str:
    return "_".join(rng.choice(_WORDS) for _ in range(parts))


def _lines_listing(rng: random.Random, salt: str) -> Iterator[str]:
    pkg = f"proj_{salt[:6]}"
    yield "."
    while True:
        mod = rng.choice(_MODULES)
        for _ in range(rng.randint(3, 7)):
            yield f"./src/{pkg}/{mod}/{_ident(rng)}.py  {rng.randint(1, 40)}.{rng.randint(0, 9)}K"
        yield f"./tests/test_{mod}_{_ident(rng, 1)}.py  {rng.randint(1, 20)}.{rng.randint(0, 9)}K"


def _lines_source(rng: random.Random, salt: str) -> Iterator[str]:
    pkg = f"proj_{salt[:6]}"
    yield f'"""{rng.choice(_WORDS).title()} handling for {pkg} (generated {salt})."""'
    yield "from __future__ import annotations"
    yield ""
    for _ in range(rng.randint(3, 6)):
        yield f"from {pkg}.{rng.choice(_MODULES)} import {_ident(rng)}"
    yield ""
    line = 1
    while True:
        cls = "".join(w.title() for w in (_ident(rng)).split("_"))
        yield ""
        yield f"class {cls}:"
        yield f'    """Keeps the {rng.choice(_WORDS)} state of one {rng.choice(_WORDS)} ({salt[:4]}-{line})."""'
        yield ""
        for _ in range(rng.randint(2, 5)):
            name, arg, ret = _ident(rng), _ident(rng, 1), rng.choice(_TYPES)
            yield f"    def {name}(self, {arg}: {rng.choice(_TYPES)}, *, limit: int = {rng.randint(1, 512)}) -> {ret}:"
            yield f'        """Return the {rng.choice(_WORDS)} for ``{arg}``; raises KeyError when it is missing."""'
            var = _ident(rng, 1)
            for _ in range(rng.randint(2, 6)):
                yield rng.choice((
                    f"        {var} = self._{_ident(rng, 1)}.get({arg}, {rng.randint(0, 99)})",
                    f"        if {var} is None or {var} > limit:",
                    f"            raise KeyError(f\"{{{arg}!r}} not in {rng.choice(_WORDS)} table\")",
                    f"        for {var} in sorted(self.{_ident(rng, 1)}):",
                    f"        # {rng.choice(_WORDS)} before {rng.choice(_WORDS)}: see issue {rng.randint(100, 999)}",
                ))
            yield f"        return {var}"
            yield ""
            line += 1


def _lines_grep(rng: random.Random, salt: str) -> Iterator[str]:
    pkg = f"proj_{salt[:6]}"
    while True:
        path = f"src/{pkg}/{rng.choice(_MODULES)}/{_ident(rng)}.py"
        for _ in range(rng.randint(1, 4)):
            yield (f"{path}:{rng.randint(1, 900)}:    {rng.choice(('deadline', 'timeout', 'key'))} = "
                   f"{_ident(rng)}({_ident(rng, 1)}, timeout={rng.randint(1, 60)}.0)")


def _lines_pytest(rng: random.Random, salt: str) -> Iterator[str]:
    pkg = f"proj_{salt[:6]}"
    yield "============================= test session starts =============================="
    yield f"platform linux -- Python 3.12.{rng.randint(1, 9)}, pytest-8.3.{rng.randint(1, 5)}, pluggy-1.5.0"
    yield f"rootdir: /work/{pkg}"
    yield f"collected {rng.randint(80, 900)} items"
    yield ""
    while True:
        mod = rng.choice(_MODULES)
        test = f"tests/test_{mod}.py::test_{_ident(rng)}"
        if rng.random() < 0.8:
            yield f"{test} PASSED{' ' * rng.randint(1, 20)}[{rng.randint(1, 99):3d}%]"
            continue
        yield f"{test} FAILED{' ' * rng.randint(1, 20)}[{rng.randint(1, 99):3d}%]"
        yield f"_________________________ test_{_ident(rng)} _________________________"
        yield ""
        for _ in range(rng.randint(3, 7)):
            yield (f"src/{pkg}/{mod}/{_ident(rng)}.py:{rng.randint(10, 900)}: in {_ident(rng)}\n"
                   f"    {_ident(rng, 1)} = self.{_ident(rng)}[{_ident(rng, 1)}]")
        yield f"E   KeyError: '{_ident(rng)}_{rng.randint(0, 9999)}'"
        yield f"E   assert {rng.randint(0, 9)} == {rng.randint(10, 99)} (timeout after {rng.randint(1, 30)}.0 s)"
        yield ""


def _lines_git_log(rng: random.Random, salt: str) -> Iterator[str]:
    while True:
        sha = "".join(rng.choice("0123456789abcdef") for _ in range(40))
        yield f"commit {sha}"
        yield f"Author: dev{rng.randint(1, 30)} <dev{rng.randint(1, 30)}@example.org>"
        yield f"Date:   Mon Nov {rng.randint(1, 28)} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00 2026 +0000"
        yield ""
        yield f"    {rng.choice(_WORDS)}: {rng.choice(('fix', 'rework', 'speed up', 'test'))} the {_ident(rng)} path"
        yield ""


def _lines_diff(rng: random.Random, salt: str) -> Iterator[str]:
    pkg = f"proj_{salt[:6]}"
    while True:
        path = f"src/{pkg}/{rng.choice(_MODULES)}/{_ident(rng)}.py"
        yield f"diff --git a/{path} b/{path}"
        yield f"index {rng.randint(10**6, 10**7 - 1):x}..{rng.randint(10**6, 10**7 - 1):x} 100644"
        yield f"--- a/{path}"
        yield f"+++ b/{path}"
        for _ in range(rng.randint(1, 3)):
            start = rng.randint(1, 800)
            yield f"@@ -{start},{rng.randint(4, 12)} +{start},{rng.randint(4, 12)} @@ def {_ident(rng)}(self):"
            for _ in range(rng.randint(4, 10)):
                mark = rng.choice((" ", " ", "-", "+"))
                var, attr, key = _ident(rng, 1), _ident(rng), _ident(rng, 1)
                yield f"{mark}        {var} = self.{attr}.get({key!r}, {rng.randint(0, 60)})"


def _lines_edit(rng: random.Random, salt: str) -> Iterator[str]:
    yield f"Edited src/proj_{salt[:6]}/ingest/batch.py: 1 replacement at line {rng.randint(40, 400)}."
    while True:
        yield f"  {rng.randint(1, 900):4d} |         {_ident(rng, 1)} = row.get({_ident(rng, 1)!r})"


_GENERATORS: dict[str, Callable[[random.Random, str], Iterator[str]]] = {
    "listing": _lines_listing, "source": _lines_source, "grep": _lines_grep, "pytest": _lines_pytest,
    "git_log": _lines_git_log, "diff": _lines_diff, "edit": _lines_edit}


def _text(kind: str, salt: str, n_chars: int) -> str:
    rng = random.Random(f"{salt}:{kind}")     # resizing cuts or extends the same text
    out: list[str] = []
    size = 0
    for line in _GENERATORS[kind](rng, salt):
        if size + len(line) + 1 > n_chars and out:
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


def size_text(kind: str, salt: str, tokens: int, count: Callable[[str], int | None] | None) -> tuple[str, int | None]:
    """Text of ``kind`` sized to about ``tokens`` tokens: the engine's count when ``count`` gives
    one (grown or cut until within 3% below the target), else an estimate. Returns (text, count)."""
    text = _text(kind, salt, int(tokens * CHARS_PER_TOKEN_CODE))
    if count is None:
        return text, None
    counted = count(text)
    for _ in range(4):
        if counted is None or 0.97 * tokens <= counted <= tokens:
            break
        text = _text(kind, salt, int(len(text) * tokens / max(counted, 1) * 0.99))
        counted = count(text)
    return text, counted


# -- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedTurn:
    turn: int               # 1-based; turn 1 sends the system prompt and the task only
    exchange: Exchange | None   # the step added before this turn (None for turn 1)
    output_tokens: int      # that step's output size (0 for turn 1)
    context_tokens: int     # the prompt this turn sends, estimated


def _overhead_tokens() -> int:
    fixed = len(json.dumps(TOOLS)) + len(SYSTEM_PROMPT) + len(TASK) + 40
    return int(fixed / CHARS_PER_TOKEN_CODE) + 3 * MESSAGE_OVERHEAD_TOKENS


def call_tokens(ex: Exchange) -> int:
    return int((len(ex.note) + len(json.dumps(ex.args)) + len(ex.tool) + 40) / CHARS_PER_TOKEN_CODE) \
        + 2 * MESSAGE_OVERHEAD_TOKENS


def plan_turns(n_ctx: int | None, max_tokens: int, turns: int = DEFAULT_TURNS,
               target_tokens: int | None = None) -> tuple[list[PlannedTurn], float]:
    """The turns to replay and the scale applied to the script's output sizes.

    The last turn's prompt is held to ``CONTEXT_FILL`` of ``n_ctx`` (the context per slot the
    engine reports) less the reply, or to ``target_tokens`` when that is smaller; the script's
    outputs are scaled down by one factor to fit (never below ``MIN_OUTPUT_TOKENS``), and where
    even that does not fit, the last turns are dropped. ``n_ctx`` unknown: BadInput.
    """
    from engineroom.errors import BadInput

    if not n_ctx:
        raise BadInput("the engine does not report its context size, so the agentic replay cannot be sized; "
                       "engineroom will not guess it.")
    if turns < 1:
        raise BadInput(f"--turns must be at least 1, not {turns}.")
    steps = SCRIPT[:max(0, min(turns, len(SCRIPT) + 1) - 1)]
    room = int(n_ctx * CONTEXT_FILL) - max_tokens
    if target_tokens is not None:
        room = min(room, target_tokens)
    def base_of(chosen: Sequence[Exchange]) -> int:
        return _overhead_tokens() + sum(call_tokens(e) + MIN_OUTPUT_TOKENS for e in chosen)

    while steps and base_of(steps) > room:       # a small context: fewer turns, each at its floor
        steps = steps[:-1]
    base = _overhead_tokens() + sum(call_tokens(e) for e in steps)
    full = sum(e.tokens for e in steps)
    if _overhead_tokens() > room:
        raise BadInput(f"the engine's context per slot ({n_ctx} tokens) leaves no room for an agentic turn with "
                       f"{max_tokens} tokens out (the tool schemas and system prompt alone take about "
                       f"{_overhead_tokens()}).")

    def sizes_at(s: float) -> list[int]:
        return [max(MIN_OUTPUT_TOKENS, round(e.tokens * s)) for e in steps]

    scale = 1.0
    if full and sum(sizes_at(1.0)) > room - base:     # the largest scale whose sizes (floors included) fit
        lo, hi = 0.0, 1.0
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if sum(sizes_at(mid)) <= room - base else (lo, mid)
        scale = lo
    sizes = sizes_at(scale)
    planned = [PlannedTurn(1, None, 0, _overhead_tokens())]
    context = _overhead_tokens()
    for i, (ex, size) in enumerate(zip(steps, sizes, strict=True), start=2):
        context += call_tokens(ex) + size
        if context > room:
            break
        planned.append(PlannedTurn(i, ex, size, context))
    return planned, scale


class SessionBuilder:
    """The messages of one salted session, turn by turn (texts sized before the clock starts)."""

    def __init__(self, salt: str, count: Callable[[str], int | None] | None = None) -> None:
        self.salt = salt
        self.count = count
        self.pkg = f"proj_{salt[:6]}"
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": f"[session {salt}] {SYSTEM_PROMPT}\nRepository: /work/{self.pkg}"},
            {"role": "user", "content": TASK}]

    def add(self, turn: PlannedTurn) -> dict[str, Any]:
        """Append the recorded step before ``turn``; returns what the record keeps about it."""
        ex = turn.exchange
        if ex is None:
            return {}
        args = {k: (v.format(pkg=self.pkg) if isinstance(v, str) else v) for k, v in ex.args.items()}
        call_id = f"call_{self.salt[:6]}_{turn.turn - 1}"
        text, counted = size_text(ex.output, f"{self.salt}-{turn.turn}", turn.output_tokens, self.count)
        self.messages.append({"role": "assistant", "content": ex.note, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": ex.tool, "arguments": json.dumps(args)}}]})
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        return {"tool": ex.tool, "output_kind": ex.output, "output_target_tokens": turn.output_tokens,
                "output_counted_tokens": counted, "output_chars": len(text)}


def sized_by(step: Mapping[str, Any]) -> str | None:
    """How a step's tool output was sized, for the record (None: turn 1 adds no output)."""
    if not step:
        return None
    if step.get("output_counted_tokens") is not None:
        return "engine tokenizer"
    return f"estimate ({CHARS_PER_TOKEN_CODE:g} chars/token)"


# -- the client ---------------------------------------------------------------------------------


class ToolKindClient(KindClient):
    """KindClient that also times tool-call delta chunks (kind ``"t"``), so a turn answered with a
    tool call has a first-token time and arrivals; such a chunk may carry several tokens."""

    @staticmethod
    def _absorb(result: StreamResult, tools: Any, event: str, data: str, now: float) -> None:
        before = len(result.token_times)
        KindClient._absorb(result, tools, event, data, now)
        if len(result.token_times) > before:
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            return
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if any(isinstance(c, dict) and isinstance(c.get("delta"), dict) and c["delta"].get("tool_calls")
               for c in (choices if isinstance(choices, list) else [])):
            result.token_times.append(now)
            result.__dict__.setdefault("token_kinds", []).append("t")
            if result.t_first_token is None:
                result.t_first_token = now


def content_only(rec: Mapping[str, Any]) -> bool:
    """True when the reply streamed one token per timed chunk: no tool-call delta, and as many
    text chunks as tokens (less one). A tool-call parser holds back text that might open a call
    and then flushes it in one chunk, so a text-only turn can fail this too."""
    kinds = rec.get("arrival_kinds")
    if any(isinstance(k, (list, tuple)) and k and k[0] == "t" for k in (kinds or [])):
        return False
    offsets = arrivals_us(rec) or []
    tokens = rec.get("completion_tokens")
    return isinstance(tokens, int) and len(offsets) >= tokens - 1


def ttft_verdict(points: Sequence[tuple[int, float, float]], reused_pct: float | None = None) -> dict[str, Any]:
    """How TTFT grew with the context from turn 2 on (``points``: (turn, context tokens, TTFT s)).

    The spec's scale on TTFT(last) / TTFT(turn 2): at most 1.5x = stable; at most 2.5x = rising;
    more, but under half the context's own growth = sub-linear; else linear in the context.
    ``reused_pct`` (the share of each previous turn's prompt the engine served from its cache)
    says why: under 50% the prefix cache is not doing its job; above, a TTFT that still grows
    follows the turns' new tokens (tool outputs of different sizes), not a cache failure."""
    pts = sorted((turn, c, t) for turn, c, t in points if turn >= 2 and c and t)
    cache = ("not reported by the engine" if reused_pct is None else
             f"working: later turns took {reused_pct:.0f}% of their previous turn's prompt from the cache"
             if reused_pct >= 50.0 else
             f"not working: later turns took only {reused_pct:.0f}% of their previous turn's prompt from the cache")
    if len(pts) < 2:
        return {"verdict": None, "ttft_growth": None, "context_growth": None, "cache": cache,
                "why": "fewer than two measured turns from turn 2 on"}
    (_, c0, t0), (_, c1, t1) = pts[0], pts[-1]
    g, c = t1 / t0, c1 / c0
    if g <= 1.5:
        verdict = "stable"
    elif g <= 2.5:
        verdict = "rising"
    elif c > 1 and (g - 1) < 0.5 * (c - 1):
        verdict = "sub-linear"
    else:
        verdict = "linear in context" + (" (prefix cache not working)" if reused_pct is not None
                                         and reused_pct < 50.0 else "")
    return {"verdict": verdict, "ttft_growth": g, "context_growth": c, "cache": cache,
            "why": f"TTFT x{g:.2f} from turn 2 to turn {pts[-1][0]} while the context grew x{c:.2f}"}
