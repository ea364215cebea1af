"""``verify --suite full``: the smoke six plus the failures users hit, one check each.

Every check here follows smoke.py's rules (PASS only on evidence, FAIL with a one-line reason
naming what was wrong, SKIP only on a declared absence or when the check could not be exercised,
with the reason), and takes a ``Ctx`` (recording client, ServerInfo, Dialect). The prompts are
module constants so a test's stand-in server can answer them.

What each check catches (an engine tracker's report where one exists):

- ``stream_protocol``: every chunk JSON, finish_reason sent, ``[DONE]`` at the end, usage chunk.
- ``tool_call_auto`` / ``tool_call_in_reasoning``: tool calls left in content (vllm#46863), calls
  written inside the reasoning block and never parsed (llama.cpp#17932).
- ``parallel_tool_calls``: several calls in one turn crash or collapse to one (vllm#39584, #9451).
- ``tool_choice_named`` / ``tool_choice_none``: the named tool is called; "none" calls none.
- ``tool_round_trip``: the tool result fed back is what the answer uses.
- ``reasoning_split`` / ``thinking_off``: reasoning kept out of content; the switch really switches
  (thinking eating all of max_tokens, vllm#42548).
- ``usage``, ``stop_sequence``, ``max_tokens_length``, ``logprobs``, ``seed_reproducible``,
  ``json_schema_complex``, ``image_input``, ``responses_api``, ``long_prompt``, ``output_quality``,
  ``spec_decode``.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from collections.abc import Callable
from typing import Any

import jsonschema

from engineroom.checks import smoke
from engineroom.checks.context import Ctx, pretty
from engineroom.checks.smoke import WEATHER_TOOL, CheckResult, _chat_details, _stream_details
from engineroom.client import ToolCall

TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

# The prompts (constants, so a stand-in can recognise them).
WEATHER_PROMPT = "What is the weather in Paris?"
PARALLEL_PROMPT = "What is the weather in Paris and what is the weather in Tokyo? Call the tool once for each city."
NAMED_PROMPT = "What time is it in Paris?"
NONE_PROMPT = "In one sentence, what is a weather forecast?"
ROUND_TRIP_PROMPT = "What is the weather in Paris?"
ROUND_TRIP_RESULT = {"city": "Paris", "temperature_c": 17, "sky": "light rain", "station": "PX-4417"}
REASONING_PROMPT = "What is 2+2? Think it through, then give the number."
STOP_PROMPT = "Repeat these words exactly, nothing else: alpha beta gamma delta epsilon zeta"
LENGTH_PROMPT = "Write a long story about a lighthouse keeper."
LOGPROBS_PROMPT = "Name a colour."
SEED_PROMPT = "Write one sentence about a cat."
IMAGE_PROMPT = "What colour is this image? Answer with one word."
RESPONSES_PROMPT = "What is the capital of France? Answer in one sentence."
QUALITY_PROMPT = "Write an essay about the history of the bicycle, with several paragraphs."
SPEC_PROMPT = "Count from 1 to 80, separated by commas."
LONG_PROMPT_QUESTION = "\n\nIn one word: what colour is the sky in the text above?"
FILLER = ("The sky over the old harbour was blue that morning, and the fishermen mended their nets while gulls "
          "circled the masts. Carts rolled over the cobbles toward the market, where bread, cheese and apples "
          "were sold from wooden stalls under striped awnings. ")

COMPLEX_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "role": {"type": "string", "enum": ["admin", "editor", "viewer"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
        "projects": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"title": {"type": "string"},
                               "status": {"type": "string", "enum": ["active", "done"]}},
                "required": ["title", "status"],
                "additionalProperties": False,
            },
            "maxItems": 3,
        },
    },
    "required": ["name", "role", "age", "address", "tags", "projects"],
    "additionalProperties": False,
}
COMPLEX_PROMPT = ("Make up a user profile for an editor named Ana who lives in Lisbon, as JSON with name, role, age, "
                  "address (city, zip), tags and projects (title, status).")

# Markup that only appears in content (or reasoning) when the server failed to parse a tool call.
TOOL_MARKUP = re.compile(
    r"<tool_call>|</tool_call>|<\|tool_call|<tool_calls>|<function=|<\|python_tag\|>"
    r"|\[TOOL_CALLS\]|<｜tool▁call|<\|START_ACTION\|>|<\|channel\|>commentary"
    r"|\"name\"\s*:\s*\"get_(weather|time)\"",
)
REASONING_MARKUP = re.compile(r"<think>|</think>|<\|channel\|>analysis|\[THINK\]|\[/THINK\]|<\|begin_of_thought\|>"
                              r"|<seed:think>|</seed:think>")

# Seconds each check may take (all its requests), before ``timeout_scale``.
TIMEOUTS: dict[str, float] = {
    "stream_protocol": 45, "tool_call_auto": 60, "tool_call_in_reasoning": 120, "parallel_tool_calls": 60,
    "tool_choice_named": 60, "tool_choice_none": 60, "tool_round_trip": 60, "reasoning_split": 120,
    "thinking_off": 30, "json_schema_complex": 90, "usage": 45, "stop_sequence": 45, "max_tokens_length": 30,
    "logprobs": 30, "seed_reproducible": 60, "image_input": 60, "responses_api": 30, "long_prompt": 120,
    "output_quality": 180, "spec_decode": 60,
}


def _r(name: str, status: smoke.Status, reason: str, details: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult(name, status, reason, details=details or {})


def _base(ctx: Ctx, prompt: str | list[dict[str, Any]], max_tokens: int, *, thinking: str = "off",
          temperature: float = 0.0, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body: dict[str, Any] = {**ctx.model, "messages": messages, "max_tokens": max_tokens,
                            "temperature": temperature, "top_p": 1.0, "seed": 42}
    body.update(ctx.dialect.thinking_off if thinking == "off" else ctx.dialect.thinking_on if thinking == "on" else {})
    body.update(extra)
    return body


def _calls_detail(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]


def _tool_skip(ctx: Ctx, *features: str) -> CheckResult | None:
    return None if not (why := smoke._declared_absent(ctx.info, *features)) else _r("", "SKIP", why)


def _valid_call(call: ToolCall, tools: list[dict[str, Any]]) -> str | None:
    """Why ``call`` is not a valid call of one of ``tools`` (None when it is)."""
    offered = {t["function"]["name"]: t["function"] for t in tools}
    if call.name not in offered:
        return f"called unknown tool {call.name!r} (offered: {', '.join(offered)})"
    try:
        arguments = call.parsed_arguments()
    except ValueError as exc:
        return f"arguments of {call.name} are not JSON ({exc}): {pretty(call.arguments)}"
    try:
        jsonschema.validate(arguments, offered[call.name]["parameters"])
    except jsonschema.ValidationError as exc:
        return f"arguments of {call.name} break its parameter schema: {exc.message}"
    return None


# -- streaming protocol -------------------------------------------------------------------


def check_stream_protocol(ctx: Ctx) -> CheckResult:
    """The SSE stream itself: JSON chunks, a finish_reason, a usage chunk, and [DONE] last."""
    body = _base(ctx, "Write three short sentences about the sea.", 60)
    r = ctx.client.stream_chat(body, timeout=ctx.timeout(TIMEOUTS["stream_protocol"]))
    d = _stream_details(r)
    if r.error:
        return _r("stream_protocol", "FAIL", f"stream failed: {r.error}", d)
    if not r.done:
        return _r("stream_protocol", "FAIL",
                  f"the stream ended after {r.chunks} chunks without the [DONE] sentinel "
                  f"(finish_reason={r.finish_reason})", d)
    if r.finish_reason is None:
        return _r("stream_protocol", "FAIL", f"{r.chunks} chunks and [DONE] but no chunk carried a finish_reason", d)
    if not r.usage:
        return _r("stream_protocol", "FAIL",
                  "stream_options.include_usage was sent but no chunk carried usage", d)
    return _r("stream_protocol", "PASS",
              f"{r.chunks} JSON chunks, finish_reason={r.finish_reason}, usage chunk, [DONE] last", d)


# -- tool calls ------------------------------------------------------------------------


def _judge_calls(name: str, calls: list[ToolCall], content: str, reasoning: str, finish: str | None,
                 tools: list[dict[str, Any]], details: dict[str, Any], *, expect: str | None = None,
                 streamed: bool = False) -> CheckResult:
    details["tool_calls"] = _calls_detail(calls)
    leak = TOOL_MARKUP.search(content or "")
    if leak:
        return _r(name, "FAIL", f"tool-call markup leaked into content ({leak.group(0)!r} at char {leak.start()}): "
                                "the server did not parse the call", details)
    if not calls:
        inside = TOOL_MARKUP.search(reasoning or "")
        if inside:
            return _r(name, "FAIL", f"the tool call was written inside the reasoning ({inside.group(0)!r}) and "
                                    "never parsed into tool_calls", details)
        return _r(name, "FAIL", f"no tool call (finish_reason={finish}); content: {pretty(content)}", details)
    for call in calls:
        why = _valid_call(call, tools)
        if why:
            return _r(name, "FAIL", why, details)
    if expect and calls[0].name != expect:
        return _r(name, "FAIL", f"called {calls[0].name!r}, not the named tool {expect!r}", details)
    if streamed and finish != "tool_calls":
        return _r(name, "FAIL", f"the call arrived but finish_reason is {finish!r}, not 'tool_calls'", details)
    first = calls[0]
    return _r(name, "PASS", f"{first.name}({json.dumps(first.parsed_arguments())}) valid against its schema "
                            f"(finish_reason={finish})", details)


def check_tool_call_auto(ctx: Ctx) -> CheckResult:
    """tool_choice "auto" on a question the tool answers: a parsed call, no markup in content."""
    if skip := _tool_skip(ctx, "tools"):
        return _r("tool_call_auto", "SKIP", skip.reason)
    body = _base(ctx, WEATHER_PROMPT, 200, temperature=0.3, tools=[WEATHER_TOOL], tool_choice="auto")
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["tool_call_auto"]))
    d = _chat_details(r)
    if not r.ok:
        return _r("tool_call_auto", "FAIL", f"request failed: {r.error}", d)
    return _judge_calls("tool_call_auto", r.tool_calls, r.content, r.reasoning, r.finish_reason, [WEATHER_TOOL], d)


def check_tool_call_in_reasoning(ctx: Ctx) -> CheckResult:
    """Streamed, thinking ON, tool_choice auto: the call is parsed even when the model thinks first."""
    if skip := _tool_skip(ctx, "tools"):
        return _r("tool_call_in_reasoning", "SKIP", skip.reason)
    body = _base(ctx, WEATHER_PROMPT, 256, thinking="on", temperature=0.3, tools=[WEATHER_TOOL], tool_choice="auto")
    r = ctx.client.stream_chat(body, timeout=ctx.timeout(TIMEOUTS["tool_call_in_reasoning"]))
    d = _stream_details(r)
    if not r.ok:
        return _r("tool_call_in_reasoning", "FAIL", f"stream failed: {r.error}", d)
    return _judge_calls("tool_call_in_reasoning", r.tool_calls, r.content, r.reasoning, r.finish_reason,
                        [WEATHER_TOOL], d, streamed=True)


def check_parallel_tool_calls(ctx: Ctx) -> CheckResult:
    """Two cities, parallel_tool_calls true: two valid get_weather calls, one per city."""
    if skip := _tool_skip(ctx, "tools", "parallel_tool_calls"):
        return _r("parallel_tool_calls", "SKIP", skip.reason)
    body = _base(ctx, PARALLEL_PROMPT, 200, tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=True)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["parallel_tool_calls"]))
    d = _chat_details(r)
    d["tool_calls"] = _calls_detail(r.tool_calls)
    if not r.ok:
        return _r("parallel_tool_calls", "FAIL", f"request failed: {r.error}", d)
    leak = TOOL_MARKUP.search(r.content or "")
    if leak:
        return _r("parallel_tool_calls", "FAIL", f"tool-call markup leaked into content ({leak.group(0)!r})", d)
    for call in r.tool_calls:
        if why := _valid_call(call, [WEATHER_TOOL]):
            return _r("parallel_tool_calls", "FAIL", why, d)
    cities = {str(c.parsed_arguments().get("city", "")).strip().lower() for c in r.tool_calls}
    if len(r.tool_calls) < 2:
        return _r("parallel_tool_calls", "FAIL",
                  f"{len(r.tool_calls)} tool call(s) for two cities (finish_reason={r.finish_reason})", d)
    if not {"paris", "tokyo"} <= cities:
        return _r("parallel_tool_calls", "FAIL", f"{len(r.tool_calls)} calls, but for {sorted(cities)}, "
                                                 "not Paris and Tokyo", d)
    ids = [c.id for c in r.tool_calls]
    if any(ids) and len(set(ids)) != len(ids):
        return _r("parallel_tool_calls", "FAIL", f"parallel calls share an id ({ids})", d)
    return _r("parallel_tool_calls", "PASS", f"{len(r.tool_calls)} valid calls: {sorted(cities)}", d)


def check_tool_choice_named(ctx: Ctx) -> CheckResult:
    """tool_choice naming get_time, with get_weather also offered: get_time is what is called."""
    if skip := _tool_skip(ctx, "tools"):
        return _r("tool_choice_named", "SKIP", skip.reason)
    body = _base(ctx, NAMED_PROMPT, 120, tools=[WEATHER_TOOL, TIME_TOOL],
                 tool_choice={"type": "function", "function": {"name": "get_time"}})
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["tool_choice_named"]))
    d = _chat_details(r)
    if not r.ok:
        return _r("tool_choice_named", "FAIL", f"request failed: {r.error}", d)
    return _judge_calls("tool_choice_named", r.tool_calls, r.content, r.reasoning, r.finish_reason,
                        [WEATHER_TOOL, TIME_TOOL], d, expect="get_time")


def check_tool_choice_none(ctx: Ctx) -> CheckResult:
    """tool_choice "none" with tools offered: a prose answer, no call, no call markup."""
    if skip := _tool_skip(ctx, "tools"):
        return _r("tool_choice_none", "SKIP", skip.reason)
    body = _base(ctx, NONE_PROMPT, 80, tools=[WEATHER_TOOL], tool_choice="none")
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["tool_choice_none"]))
    d = _chat_details(r)
    d["tool_calls"] = _calls_detail(r.tool_calls)
    if not r.ok:
        return _r("tool_choice_none", "FAIL", f"request failed: {r.error}", d)
    if r.tool_calls:
        return _r("tool_choice_none", "FAIL", f"tool_choice=none was not honoured: the answer calls "
                                              f"{r.tool_calls[0].name!r}", d)
    leak = TOOL_MARKUP.search(r.content)
    if leak:
        return _r("tool_choice_none", "FAIL", f"tool_choice=none answered with tool-call markup in content "
                                              f"({leak.group(0)!r} at char {leak.start()})", d)
    if not r.content.strip():
        return _r("tool_choice_none", "FAIL", f"empty answer (finish_reason={r.finish_reason})", d)
    return _r("tool_choice_none", "PASS", f"prose, no call: {pretty(r.content, 60)}", d)


def check_tool_round_trip(ctx: Ctx) -> CheckResult:
    """A tool result fed back (assistant tool_calls + tool message): the answer uses its figure."""
    if skip := _tool_skip(ctx, "tools"):
        return _r("tool_round_trip", "SKIP", skip.reason)
    call_id = "call_er_0001"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": ROUND_TRIP_PROMPT},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(ROUND_TRIP_RESULT)},
    ]
    body = _base(ctx, messages, 120, tools=[WEATHER_TOOL], tool_choice="auto")
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["tool_round_trip"]))
    d = _chat_details(r)
    d["tool_calls"] = _calls_detail(r.tool_calls)
    if not r.ok:
        return _r("tool_round_trip", "FAIL", f"request with the tool result failed: {r.error}", d)
    text = r.content
    if "temperature_c" in text or "<tool_response>" in text:
        return _r("tool_round_trip", "FAIL", f"the answer echoes the raw tool result instead of using it: "
                                             f"{pretty(text, 60)}", d)
    if "17" in text:
        return _r("tool_round_trip", "PASS", f"the answer uses the tool's 17 °C: {pretty(text, 60)}", d)
    if r.tool_calls:
        return _r("tool_round_trip", "FAIL", f"called {r.tool_calls[0].name!r} again instead of answering from the "
                                             "tool result", d)
    return _r("tool_round_trip", "FAIL", f"the answer does not use the tool result's 17 °C "
                                         f"(finish_reason={r.finish_reason}): {pretty(text, 60)}", d)


# -- reasoning --------------------------------------------------------------------------


def check_reasoning_split(ctx: Ctx) -> CheckResult:
    """Thinking ON: reasoning arrives in its own field, none in content; content answers (or finish=length)."""
    # a template that shows no thinking block: 64 tokens are enough to see a <think> the model opens itself
    budget = 64 if ctx.dialect.reasons is False else 160 if ctx.fast else 4000
    body = _base(ctx, REASONING_PROMPT, budget, thinking="on")
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["reasoning_split"]))
    d = _chat_details(r)
    d["reasoning_chars"] = len(r.reasoning)
    if not r.ok:
        return _r("reasoning_split", "FAIL", f"request failed: {r.error}", d)
    leak = REASONING_MARKUP.search(r.content)
    if leak:
        return _r("reasoning_split", "FAIL", f"reasoning leaked into content ({leak.group(0)!r} at char "
                                             f"{leak.start()}): the server did not split it out", d)
    if not r.reasoning:
        if ctx.dialect.reasons:
            return _r("reasoning_split", "FAIL",
                      f"no reasoning came back although {ctx.dialect.sources.get('reasons', 'the model reasons')} "
                      f"(finish_reason={r.finish_reason})", d)
        return _r("reasoning_split", "SKIP",
                  f"the model does not reason: no reasoning field came back and "
                  f"{ctx.dialect.sources.get('reasons', 'nothing declares reasoning')}", d)
    if len(r.reasoning) < 50:
        return _r("reasoning_split", "FAIL", f"only {len(r.reasoning)} chars of reasoning (need >= 50)", d)
    if not r.content.strip():
        if r.finish_reason == "length":
            return _r("reasoning_split", "PASS", f"{len(r.reasoning)} chars of reasoning used all {budget} tokens "
                                                 "(finish_reason=length, content empty as it should be)",
                      {**d, **_forced_reasoning(ctx)})
        return _r("reasoning_split", "FAIL", f"{len(r.reasoning)} chars of reasoning but empty content "
                                             f"(finish_reason={r.finish_reason})", d)
    d.update(_forced_reasoning(ctx))
    return _r("reasoning_split", "PASS", f"{len(r.reasoning)} chars of reasoning, separate content "
                                         f"{pretty(r.content, 40)}", d)


def _forced_reasoning(ctx: Ctx) -> dict[str, str]:
    """A reasoning PASS's note that a template engineroom ships opened the block (``Dialect.forced_reasoning``)."""
    return {"forced": ctx.dialect.forced_reasoning} if ctx.dialect.forced_reasoning else {}


def check_thinking_off(ctx: Ctx) -> CheckResult:
    """The thinking switch found for this server really switches: no reasoning, the answer in content."""
    if not ctx.dialect.thinking_off:
        if ctx.dialect.reasons:
            return _r("thinking_off", "FAIL", "the model reasons but no thinking switch was found "
                                              f"({ctx.dialect.sources.get('thinking_off', 'none in the template')})")
        return _r("thinking_off", "SKIP", "no thinking switch to test: "
                                          f"{ctx.dialect.sources.get('reasons', 'the model is not known to reason')}")
    body = _base(ctx, "What is the capital of France? Answer in one sentence.", 30)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["thinking_off"]))
    d = _chat_details(r)
    if not r.ok:
        return _r("thinking_off", "FAIL", f"request failed: {r.error}", d)
    switch = json.dumps(ctx.dialect.thinking_off)
    if r.reasoning:
        return _r("thinking_off", "FAIL", f"{switch} was ignored: {len(r.reasoning)} chars of reasoning came back "
                                          f"(finish_reason={r.finish_reason}, content {len(r.content)} chars)", d)
    if REASONING_MARKUP.search(r.content):
        return _r("thinking_off", "FAIL", f"{switch} was ignored: reasoning markup in content", d)
    if not r.content.strip():
        return _r("thinking_off", "FAIL", f"empty answer with {switch} (finish_reason={r.finish_reason})", d)
    return _r("thinking_off", "PASS", f"{switch} switched reasoning off: {pretty(r.content, 50)}", d)


# -- structured output, sampling, limits -----------------------------------------------------


def check_json_schema_complex(ctx: Ctx) -> CheckResult:
    """response_format with a nested schema (enums, arrays of objects, bounds): the answer validates."""
    if why := smoke._declared_absent(ctx.info, "json_schema"):
        return _r("json_schema_complex", "SKIP", why)
    body = _base(ctx, COMPLEX_PROMPT, 300, response_format={
        "type": "json_schema", "json_schema": {"name": "profile", "strict": True, "schema": COMPLEX_SCHEMA}})
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["json_schema_complex"]))
    d = _chat_details(r)
    if not r.ok:
        return _r("json_schema_complex", "FAIL", f"request failed: {r.error}", d)
    try:
        value = json.loads(r.content)
    except ValueError:
        return _r("json_schema_complex", "FAIL", f"200 answer is not JSON (finish_reason={r.finish_reason}): "
                                                 f"{pretty(r.content)}", d)
    try:
        jsonschema.validate(value, COMPLEX_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        return _r("json_schema_complex", "FAIL", f"JSON breaks the nested schema at {where}: {exc.message}", d)
    d["value"] = value
    return _r("json_schema_complex", "PASS", f"valid against the nested schema: {pretty(value, 60)}", d)


def _usage_problem(usage: Any, max_tokens: int) -> str | None:
    if not isinstance(usage, dict):
        return "no usage object"
    try:
        prompt, completion = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
        total = int(usage["total_tokens"])
    except (KeyError, TypeError, ValueError):
        return f"usage lacks prompt/completion/total token counts: {pretty(usage)}"
    if prompt <= 0 or completion <= 0:
        return f"usage counts {prompt} prompt / {completion} completion tokens for a non-empty exchange"
    if total != prompt + completion:
        return f"usage total_tokens {total} != prompt {prompt} + completion {completion}"
    if completion > max_tokens:
        return f"usage completion_tokens {completion} > max_tokens {max_tokens}"
    return None


def check_usage(ctx: Ctx) -> CheckResult:
    """usage present and consistent, non-streamed and streamed (include_usage), and the two agree."""
    body = _base(ctx, "Write two sentences about rivers.", 40)
    limit = ctx.timeout(TIMEOUTS["usage"]) / 2
    r = ctx.client.chat(body, timeout=limit)
    d: dict[str, Any] = {"plain": _chat_details(r)}
    if not r.ok:
        return _r("usage", "FAIL", f"request failed: {r.error}", d)
    if why := _usage_problem(r.usage, 40):
        return _r("usage", "FAIL", f"non-streamed: {why}", d)
    if r.finish_reason == "length" and r.usage and r.usage["completion_tokens"] != 40:
        return _r("usage", "FAIL", f"finish_reason=length at max_tokens 40 but usage says "
                                   f"{r.usage['completion_tokens']} completion tokens", d)
    s = ctx.client.stream_chat(body, timeout=limit)
    d["stream"] = _stream_details(s)
    if not s.ok:
        return _r("usage", "FAIL", f"stream failed: {s.error}", d)
    if why := _usage_problem(s.usage, 40):
        return _r("usage", "FAIL", f"streamed (include_usage): {why}", d)
    assert r.usage is not None and s.usage is not None
    if r.usage["prompt_tokens"] != s.usage["prompt_tokens"]:
        return _r("usage", "FAIL", f"the same prompt counts {r.usage['prompt_tokens']} tokens plain and "
                                   f"{s.usage['prompt_tokens']} streamed", d)
    if len(s.token_times) > s.usage["completion_tokens"] + 1:
        return _r("usage", "FAIL", f"{len(s.token_times)} text chunks arrived but usage counts only "
                                   f"{s.usage['completion_tokens']} completion tokens", d)
    return _r("usage", "PASS", f"prompt {r.usage['prompt_tokens']}, completion {r.usage['completion_tokens']} / "
                               f"{s.usage['completion_tokens']} (plain / streamed), totals add up", d)


def _stop_word(text: str) -> str | None:
    """A word of ``text`` (4+ letters, from the 4th word on) whose first occurrence is where it stands."""
    words = text.split()
    for i, word in enumerate(words[3:], start=3):
        if len(word) >= 4 and word.isalpha() and word not in words[:i] and text.count(word) == 1:
            return word
    return None


def check_stop_sequence(ctx: Ctx) -> CheckResult:
    """stop=[a word the control answer writes]: the same request ends right before it, finish_reason stop.

    The stop word is taken from a control run of the same greedy request without ``stop``, so the
    check is exercised whatever the model writes.
    """
    limit = ctx.timeout(TIMEOUTS["stop_sequence"]) / 2
    control = ctx.client.chat(_base(ctx, STOP_PROMPT, 40), timeout=limit)
    d: dict[str, Any] = {"control": _chat_details(control)}
    if not control.ok:
        return _r("stop_sequence", "FAIL", f"control request failed: {control.error}", d)
    word = _stop_word(control.content)
    if word is None:
        return _r("stop_sequence", "SKIP", f"not exercised: the control answer has no word to stop at "
                                           f"({pretty(control.content, 50)})", d)
    d["stop"] = word
    r = ctx.client.chat(_base(ctx, STOP_PROMPT, 40, stop=[word]), timeout=limit)
    d["stopped"] = _chat_details(r)
    if not r.ok:
        return _r("stop_sequence", "FAIL", f"request with stop failed: {r.error}", d)
    if word in r.content:
        return _r("stop_sequence", "FAIL", f"the stop sequence {word!r} is in the answer at char "
                                           f"{r.content.index(word)}: stop was ignored", d)
    if r.finish_reason != "stop":
        return _r("stop_sequence", "FAIL", f"finish_reason is {r.finish_reason!r} after the stop sequence, not 'stop'",
                  d)
    expected = control.content[: control.content.index(word)]
    if r.content.strip() != expected.strip():
        return _r("stop_sequence", "FAIL", f"the answer does not end where {word!r} began in the control: "
                                           f"{pretty(r.content, 40)} vs {pretty(expected, 40)}", d)
    return _r("stop_sequence", "PASS", f"stopped right before {word!r}: {pretty(r.content, 40)}", d)


def check_max_tokens_length(ctx: Ctx) -> CheckResult:
    """max_tokens 8 on a long story: finish_reason "length" and no more than 8 tokens."""
    body = _base(ctx, LENGTH_PROMPT, 8)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["max_tokens_length"]))
    d = _chat_details(r)
    if not r.ok:
        return _r("max_tokens_length", "FAIL", f"request failed: {r.error}", d)
    used = (r.usage or {}).get("completion_tokens")
    if isinstance(used, int) and used > 8:
        return _r("max_tokens_length", "FAIL", f"max_tokens 8 was exceeded: {used} completion tokens", d)
    if r.finish_reason != "length":
        return _r("max_tokens_length", "FAIL", f"finish_reason is {r.finish_reason!r} at max_tokens 8 on a long "
                                               f"story, not 'length' ({used} tokens)", d)
    return _r("max_tokens_length", "PASS", f"finish_reason=length after {used} tokens", d)


def check_logprobs(ctx: Ctx) -> CheckResult:
    """logprobs + top_logprobs 3: one entry per token, logprob <= 0, three alternatives each."""
    body = _base(ctx, LOGPROBS_PROMPT, 8, logprobs=True, top_logprobs=3)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["logprobs"]))
    d = _chat_details(r)
    if not r.ok:
        return _r("logprobs", "FAIL", f"request failed: {r.error}", d)
    choice = (r.raw or {}).get("choices", [{}])[0]
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    entries = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(entries, list) or not entries:
        return _r("logprobs", "FAIL", "logprobs were requested but the answer has no choices[0].logprobs.content", d)
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("logprob"), (int, float)) or e["logprob"] > 1e-6:
            return _r("logprobs", "FAIL", f"token {i} has no valid logprob (<= 0): {pretty(e)}", d)
        tops = e.get("top_logprobs")
        if not isinstance(tops, list) or len(tops) < 3:
            return _r("logprobs", "FAIL", f"token {i} has {len(tops) if isinstance(tops, list) else 0} top_logprobs, "
                                          "3 were requested", d)
    d["logprobs"] = entries[:3]
    return _r("logprobs", "PASS", f"{len(entries)} tokens with logprobs and 3 alternatives each", d)


def check_seed_reproducible(ctx: Ctx) -> CheckResult:
    """The same seed at temperature 1.0 twice: the same text both times."""
    body = _base(ctx, SEED_PROMPT, 30, temperature=1.0, seed=1234)
    limit = ctx.timeout(TIMEOUTS["seed_reproducible"]) / 2
    a = ctx.client.chat(body, timeout=limit)
    b = ctx.client.chat(body, timeout=limit)
    d = {"first": _chat_details(a), "second": _chat_details(b), "texts": [a.content, b.content]}
    if not (a.ok and b.ok):
        return _r("seed_reproducible", "FAIL", f"request failed: {a.error or b.error}", d)
    if a.content != b.content:
        at = next((i for i, (x, y) in enumerate(zip(a.content, b.content, strict=False)) if x != y),
                  min(len(a.content), len(b.content)))
        return _r("seed_reproducible", "FAIL", f"seed 1234 at temperature 1.0 gave two different texts "
                                               f"(they part at char {at})", d)
    return _r("seed_reproducible", "PASS", f"seed 1234 gave the same {len(a.content)} chars twice", d)


def _png(rgb: tuple[int, int, int], size: int = 32) -> bytes:
    """A plain PNG of one colour (no imaging library needed)."""
    row = b"\x00" + bytes(rgb) * size
    raw = zlib.compress(row * size)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def check_image_input(ctx: Ctx) -> CheckResult:
    """An image_url part (a red PNG): the model names the colour. Only when the server declares vision."""
    caps = ctx.info.capabilities
    if caps.vision is not True:
        said = caps.reasons.get("vision") or ("declared absent" if caps.vision is False else "not declared")
        return _r("image_input", "SKIP", f"the server does not report vision ({said})")
    url = "data:image/png;base64," + base64.b64encode(_png((220, 20, 20))).decode()
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": IMAGE_PROMPT},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
    r = ctx.client.chat(_base(ctx, messages, 20), timeout=ctx.timeout(TIMEOUTS["image_input"]))
    d = _chat_details(r)
    if not r.ok:
        return _r("image_input", "FAIL", f"request with an image failed: {r.error}", d)
    if "red" in r.content.lower():
        return _r("image_input", "PASS", f"names the colour: {pretty(r.content, 40)}", d)
    return _r("image_input", "FAIL", f"a red image, but the answer does not say red: {pretty(r.content, 40)}", d)


def check_responses_api(ctx: Ctx) -> CheckResult:
    """POST /v1/responses (where served): an output message with text containing Paris."""
    body = {**ctx.model, "input": RESPONSES_PROMPT, "max_output_tokens": 40, "temperature": 0.0,
            **ctx.dialect.thinking_off}
    status, data, error = ctx.client.post_json("/v1/responses", body, timeout=ctx.timeout(TIMEOUTS["responses_api"]))
    d: dict[str, Any] = {"status": status, "error": error or None}
    if status in (404, 405, 501):
        return _r("responses_api", "SKIP", f"the server does not serve /v1/responses (HTTP {status})", d)
    if status is None:
        return _r("responses_api", "FAIL", f"request failed: {error}", d)
    if status != 200:
        return _r("responses_api", "FAIL", f"/v1/responses answered HTTP {status}", d)
    if not isinstance(data, dict):
        return _r("responses_api", "FAIL", "/v1/responses answered 200 with a body that is not a JSON object", d)
    texts = [part.get("text", "") for item in data.get("output") or [] if isinstance(item, dict)
             and item.get("type") == "message" for part in item.get("content") or [] if isinstance(part, dict)]
    text = "".join(t for t in texts if isinstance(t, str)) or str(data.get("output_text") or "")
    d["text"] = text
    if not text:
        return _r("responses_api", "FAIL", "/v1/responses answered 200 without an output message text", d)
    if "paris" not in text.lower():
        return _r("responses_api", "FAIL", f"the output text lacks Paris: {pretty(text, 50)}", d)
    return _r("responses_api", "PASS", f"output message: {pretty(text, 50)}", d)


def check_long_prompt(ctx: Ctx) -> CheckResult:
    """A prompt of about half the context (from the server; --fast: at most 1,024 tokens): 200, counted in full."""
    n_ctx = ctx.info.n_ctx
    if not n_ctx:
        return _r("long_prompt", "SKIP", "the server reports no context size to scale the prompt from")
    target = min(int(n_ctx * 0.5), 1024) if ctx.fast else int(n_ctx * 0.5)
    if target < 256:
        return _r("long_prompt", "SKIP", f"the context ({n_ctx} tokens) is below the 512-token minimum")
    filler = FILLER * max(1, (target * 4) // len(FILLER))        # ~4 chars a token: calibrated below
    body = _base(ctx, filler + LONG_PROMPT_QUESTION, 10)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["long_prompt"]))
    d = _chat_details(r)
    d["prompt_chars"] = len(filler)
    if not r.ok:
        return _r("long_prompt", "FAIL", f"a {len(filler):,}-char prompt (~{target:,} tokens of a {n_ctx:,}-token "
                                         f"context) failed: {r.error}", d)
    prompt_tokens = (r.usage or {}).get("prompt_tokens")
    if isinstance(prompt_tokens, int) and prompt_tokens < len(filler) / 12:
        return _r("long_prompt", "FAIL", f"only {prompt_tokens} prompt tokens counted for {len(filler):,} chars: "
                                         "the prompt was truncated", d)
    if not (r.content.strip() or r.reasoning.strip()):
        return _r("long_prompt", "FAIL", f"200 but an empty answer to a {prompt_tokens}-token prompt", d)
    return _r("long_prompt", "PASS", f"{prompt_tokens} prompt tokens ({len(filler):,} chars) of a {n_ctx:,}-token "
                                     "context answered", d)


def _repeated_run(lines: list[str], n: int = 5) -> str | None:
    run, prev = 0, None
    for line in lines:
        run = run + 1 if line == prev and line else 1
        prev = line
        if run >= n:
            return line
    return None


def check_output_quality(ctx: Ctx) -> CheckResult:
    """A long essay: non-empty, no tool markup, no line 5x in a row, distinct words >= 30% of the first 200."""
    budget = 200 if ctx.fast else 2000
    r = ctx.client.chat(_base(ctx, QUALITY_PROMPT, budget, temperature=0.6),
                        timeout=ctx.timeout(TIMEOUTS["output_quality"]))
    d = _chat_details(r)
    if not r.ok:
        return _r("output_quality", "FAIL", f"request failed: {r.error}", d)
    text = r.content
    if not text.strip():
        return _r("output_quality", "FAIL", f"empty essay (finish_reason={r.finish_reason})", d)
    if leak := TOOL_MARKUP.search(text):
        return _r("output_quality", "FAIL", f"tool-call markup in a plain essay ({leak.group(0)!r})", d)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if line := _repeated_run(lines):
        return _r("output_quality", "FAIL", f"the same line 5 times in a row: {pretty(line, 50)}", d)
    words = re.findall(r"\w+", text.lower())[:200]
    ratio = len(set(words)) / len(words) if words else 0.0
    d["distinct_ratio"] = round(ratio, 3)
    if len(words) >= 50 and ratio < 0.30:
        return _r("output_quality", "FAIL", f"degenerate text: {len(set(words))} distinct of the first {len(words)} "
                                            f"words ({ratio:.0%} < 30%)", d)
    return _r("output_quality", "PASS", f"{len(words)}+ words, {ratio:.0%} distinct, no repeated lines", d)


def check_spec_decode(ctx: Ctx, min_length: float = 2.0) -> CheckResult:
    """Speculative decoding, where the engine reports drafted tokens: tokens per step >= ``min_length``."""
    r = ctx.client.chat(_base(ctx, SPEC_PROMPT, 60 if ctx.fast else 200), timeout=ctx.timeout(TIMEOUTS["spec_decode"]))
    d = _chat_details(r)
    if not r.ok:
        return _r("spec_decode", "FAIL", f"request failed: {r.error}", d)
    norm = ctx.info.normalise_timings
    timings = norm(r.timings) if (norm is not None and r.timings) else None
    if timings is None or not timings.draft_tokens:
        return _r("spec_decode", "SKIP", "the engine reports no drafted tokens: no speculative decoding is running"
                  if timings is not None else "the engine reports no per-response timings to read drafting from", d)
    generated = timings.decode_tokens or (r.usage or {}).get("completion_tokens") or 0
    accepted = timings.draft_accepted or 0
    steps = max(1, generated - accepted)
    length = generated / steps
    d.update(draft_tokens=timings.draft_tokens, draft_accepted=accepted, acceptance_length=round(length, 3),
             acceptance_rate=round(accepted / timings.draft_tokens, 3))
    if length < min_length:
        return _r("spec_decode", "FAIL", f"mean acceptance length {length:.2f} tokens per step < {min_length:g} "
                                         f"({accepted}/{timings.draft_tokens} drafted tokens accepted)", d)
    return _r("spec_decode", "PASS", f"mean acceptance length {length:.2f} tokens per step "
                                     f"({accepted}/{timings.draft_tokens} drafted tokens accepted)", d)


# -- the suite --------------------------------------------------------------------------

FullCheck = Callable[[Ctx], CheckResult]


def _smoke(name: str, fn: smoke.CheckFn) -> FullCheck:
    def run(ctx: Ctx) -> CheckResult:
        return fn(ctx.client, ctx.answer_info(), ctx.timeout(smoke.TIMEOUTS[name]))

    run.__doc__ = fn.__doc__
    return run


FULL_CHECKS: tuple[tuple[str, FullCheck], ...] = (
    *((name, _smoke(name, fn)) for name, fn in smoke.SMOKE_CHECKS),
    ("stream_protocol", check_stream_protocol),
    ("tool_call_auto", check_tool_call_auto),
    ("tool_call_in_reasoning", check_tool_call_in_reasoning),
    ("parallel_tool_calls", check_parallel_tool_calls),
    ("tool_choice_named", check_tool_choice_named),
    ("tool_choice_none", check_tool_choice_none),
    ("tool_round_trip", check_tool_round_trip),
    ("reasoning_split", check_reasoning_split),
    ("thinking_off", check_thinking_off),
    ("json_schema_complex", check_json_schema_complex),
    ("usage", check_usage),
    ("stop_sequence", check_stop_sequence),
    ("max_tokens_length", check_max_tokens_length),
    ("logprobs", check_logprobs),
    ("seed_reproducible", check_seed_reproducible),
    ("image_input", check_image_input),
    ("responses_api", check_responses_api),
    ("long_prompt", check_long_prompt),
    ("output_quality", check_output_quality),
    ("spec_decode", check_spec_decode),
)

# Checks whose PASS a chat template that forces the tool-call format can produce by itself.
TOOL_CHECKS = frozenset({"tool_call", "tool_call_streamed", "tool_call_auto", "tool_call_in_reasoning",
                         "parallel_tool_calls", "tool_choice_named", "tool_choice_none", "tool_round_trip"})
