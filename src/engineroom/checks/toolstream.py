"""``verify --suite toolstream``: does a streamed tool call survive, over N tries (validation.md section 5)?

Ten prompts (eight single-turn, two multi-turn with a tool result already fed back), four tools,
thinking on (the dialect's switch, where the model has one), ``tool_choice`` alternating
``required`` / ``auto``, temperature 0.6, max 512 tokens (``--fast``: 256), each try its own seed.
``--tries N`` runs N of them, cycling through the prompts (default 30: the spec's ten x3).

Each try is one of:

- ``PASS``: a tool call assembled from the streamed deltas, with the name of an offered tool,
  arguments that parse as a JSON object, ``finish_reason`` ``tool_calls`` and no tool-call markup
  left in content;
- ``DROP``: the call was lost on the way, with how: ``leaked`` (its markup left in content),
  ``in reasoning`` (written inside the reasoning, never parsed), ``broken`` (a name that is not
  an offered tool, or arguments that do not parse), ``finish_reason`` (the call arrived but the
  stream said ``stop``, so a client waiting for ``tool_calls`` never runs it), ``stream broke``
  (the stream ended mid-way), ``lost`` (no call and no markup: prose instead);
- ``ERROR``: the server refused the request (non-200), so nothing was streamed.

The check PASSes when every try passed; the reason gives the PASS / DROP counts and the drop rate.
With ``tool_choice: auto`` a model may answer in prose on purpose; such tries count as ``lost``
drops (the spec's rule), and each try's record says which ``tool_choice`` it ran under.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from engineroom.checks.context import Ctx
from engineroom.checks.full import TIME_TOOL, TOOL_MARKUP
from engineroom.checks.smoke import WEATHER_TOOL, CheckResult
from engineroom.client import StreamResult

DEFAULT_TRIES = 30
MAX_TRIES = 10_000
KEEP_EXCHANGES = 6            # exchanges kept: the first try's and the first drops'

SEARCH_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "search_files", "description": "Search the files of a project for a text.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "path": {"type": "string"}},
                   "required": ["query"]}}}
EMAIL_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "send_email", "description": "Send an email.",
    "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"},
                                                    "body": {"type": "string"}}, "required": ["to", "subject"]}}}
TOOLS = [WEATHER_TOOL, TIME_TOOL, SEARCH_TOOL, EMAIL_TOOL]
OFFERED = {t["function"]["name"] for t in TOOLS}


def _history(question: str, name: str, args: dict[str, Any], result: Any, follow_up: str) -> list[dict[str, Any]]:
    call_id = f"call_hist_{name}"
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
            {"role": "user", "content": follow_up}]


# (prompt id, messages, the tool a right answer calls)
PROMPTS: tuple[tuple[str, list[dict[str, Any]], str], ...] = (
    ("weather", [{"role": "user", "content": "What is the weather in Paris?"}], "get_weather"),
    ("time", [{"role": "user", "content": "What time is it in Tokyo right now?"}], "get_time"),
    ("search", [{"role": "user", "content": "Find where the function parse_config is defined in my project."}],
     "search_files"),
    ("email", [{"role": "user", "content": "Send an email to ana@example.com with the subject 'Lunch' saying I "
                                           "will be late."}], "send_email"),
    ("weather_de", [{"role": "user", "content": "Is it raining in Berlin at the moment?"}], "get_weather"),
    ("time_ny", [{"role": "user", "content": "Tell me the current local time in New York."}], "get_time"),
    ("search_todo", [{"role": "user", "content": "Search the src folder for TODO comments."}], "search_files"),
    ("weather_pack", [{"role": "user", "content": "I fly to Lisbon tonight: check the weather there so I know "
                                                  "what to pack."}], "get_weather"),
    ("multi_weather_time", _history("What is the weather in Paris?", "get_weather", {"city": "Paris"},
                                    {"city": "Paris", "temperature_c": 17, "sky": "light rain"},
                                    "Thanks. And what time is it in Paris now?"), "get_time"),
    ("multi_search_email", _history("Find the release notes file.", "search_files", {"query": "release notes"},
                                    {"matches": ["docs/RELEASE_NOTES.md"]},
                                    "Email ana@example.com the path of that file, subject 'Notes'."), "send_email"),
)


def classify(r: StreamResult) -> tuple[str, str]:
    """One try's (outcome, how): PASS / DROP (leaked, in reasoning, broken, finish_reason, stream broke,
    lost) / ERROR."""
    if r.status != 200:
        return "ERROR", r.error or f"HTTP {r.status}"
    leak = TOOL_MARKUP.search(r.content or "")
    if leak:
        return "DROP", f"leaked: {leak.group(0)!r} left in content at char {leak.start()}"
    if r.error:
        return "DROP", f"stream broke: {r.error}" + (f" (a partial call to {r.tool_calls[0].name!r} had arrived)"
                                                     if r.tool_calls else "")
    if not r.tool_calls:
        inside = TOOL_MARKUP.search(r.reasoning or "")
        if inside:
            return "DROP", f"in reasoning: {inside.group(0)!r} written inside the reasoning, never parsed"
        return "DROP", f"lost: no tool call (finish_reason={r.finish_reason}), {len(r.content)} chars of prose"
    for call in r.tool_calls:
        if call.name not in OFFERED:
            return "DROP", f"broken: the name {call.name!r} is not an offered tool"
        try:
            args = json.loads(call.arguments) if call.arguments.strip() else None
        except json.JSONDecodeError as exc:
            return "DROP", f"broken: arguments of {call.name} do not parse ({exc.msg} at char {exc.pos})"
        if not isinstance(args, dict):
            return "DROP", f"broken: arguments of {call.name} are not a JSON object ({call.arguments[:40]!r})"
    if r.finish_reason != "tool_calls":
        return "DROP", f"finish_reason: the call arrived but finish_reason is {r.finish_reason!r}, not 'tool_calls'"
    return "PASS", f"{r.tool_calls[0].name}({r.tool_calls[0].arguments})"


def run_toolstream(ctx: Ctx, tries: int = DEFAULT_TRIES) -> CheckResult:
    """``tries`` streamed tool-call requests; one ``CheckResult`` with the PASS / DROP counts."""
    name = "stream_tool_calls"
    t0 = time.perf_counter()
    caps = ctx.info.capabilities
    if caps.tools is False:
        source = caps.reasons.get("tools") or "the server's declared capabilities"
        return CheckResult(name, "SKIP", f"server declares no tools support (from {source})",
                           details={"suite": "toolstream"})
    ctx.client.take()
    records: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    budget = 256 if ctx.fast else 512
    for i in range(tries):
        pid, messages, expected = PROMPTS[i % len(PROMPTS)]
        choice = "required" if i % 2 == 0 else "auto"
        body = {**ctx.model, "messages": messages, "tools": TOOLS, "tool_choice": choice, "max_tokens": budget,
                "temperature": 0.6, "top_p": 0.95, "seed": 7000 + i, **ctx.dialect.thinking_on}
        r = ctx.client.stream_chat(body, timeout=ctx.timeout(120))
        exchanges = ctx.client.take()
        outcome, how = classify(r)
        records.append({"try": i + 1, "prompt": pid, "tool_choice": choice, "outcome": outcome,
                        "how": how.split(":")[0] if outcome != "PASS" else "", "reason": how,
                        "tools_called": [c.name for c in r.tool_calls], "expected_tool": expected,
                        "right_tool": bool(r.tool_calls) and r.tool_calls[0].name == expected,
                        "finish_reason": r.finish_reason, "chunks": r.chunks, "http": r.status,
                        "seconds": round(r.seconds, 3)})
        if len(kept) < KEEP_EXCHANGES and (i == 0 or outcome != "PASS"):
            kept += [{**e, "try": i + 1} for e in exchanges]
    counts = Counter(r["outcome"] for r in records)
    kinds = Counter(r["how"] for r in records if r["outcome"] == "DROP")
    passes, drops, errors = counts.get("PASS", 0), counts.get("DROP", 0), counts.get("ERROR", 0)
    rate = drops / tries if tries else 0.0
    details: dict[str, Any] = {
        "suite": "toolstream", "tries": tries, "pass": passes, "drop": drops, "error": errors,
        "drop_rate": round(rate, 4), "drop_kinds": dict(kinds),
        "right_tool": sum(1 for r in records if r["right_tool"]),
        "by_tool_choice": {c: {"tries": sum(1 for r in records if r["tool_choice"] == c),
                               "pass": sum(1 for r in records if r["tool_choice"] == c and r["outcome"] == "PASS")}
                           for c in ("required", "auto")},
        "try_records": records, "exchanges": kept, "passes": passes, "ran": tries,
        "thinking": "on: " + json.dumps(ctx.dialect.thinking_on) if ctx.dialect.thinking_on else
                    "no thinking switch (the model does not reason, or none was found)",
    }
    seconds = time.perf_counter() - t0
    kinds_text = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
    if drops or errors:
        first = next(r for r in records if r["outcome"] != "PASS")
        parts = [f"{passes}/{tries} PASS", f"{drops} DROP ({rate:.0%}{': ' + kinds_text if kinds_text else ''})"]
        if errors:
            parts.append(f"{errors} ERROR")
        return CheckResult(name, "FAIL", ", ".join(parts) + f"; first at try {first['try']} ({first['prompt']}, "
                                                            f"tool_choice {first['tool_choice']}): {first['reason']}",
                           seconds, details)
    return CheckResult(name, "PASS", f"{passes}/{tries} PASS, 0 DROP: every streamed tool call arrived whole "
                                     f"({details['right_tool']}/{tries} called the tool the prompt asks for)",
                       seconds, details)
